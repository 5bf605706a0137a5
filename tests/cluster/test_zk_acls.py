"""zookeeper.set.acl: every znode a broker creates carries ZooKeeper ACLs (all for the brokers'
digest identity, read for everyone else, nothing for others on /config/users and /config/brokers),
so a raw kazoo client without credentials cannot change /brokers, /config, /kafka-acl or /controller.
The cluster runs under a chroot, as Kafka advises with secured ZooKeeper: the chroot's own znode is
then the brokers' too (ZooKeeper's "/" stays open to anyone)."""
from __future__ import annotations

import uuid

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE

from kbroker.testing import LocalCluster
from checkers import create_topic

CREDENTIALS = "kbroker:s3cret"


@pytest.fixture(scope="module")
def secured(tmp_path_factory, zk_server):
    chroot = f"/secure-{uuid.uuid4().hex[:8]}"
    overrides = {"zookeeper.set.acl": "true", "kbroker.zookeeper.digest.credentials": CREDENTIALS,
                 "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
                 "allow.everyone.if.no.acl.found": "true"}
    with LocalCluster(tmp_path_factory.mktemp("zkacl"), brokers=1, overrides=overrides,
                      zookeeper_connect=zk_server.connect_string + chroot) as c:
        create_topic(c.bootstrap, "secured-t", 1)
        c.chroot = chroot
        yield c


def _client(zk_server, chroot, auth=None):
    zk = KazooClient(hosts=zk_server.connect_string + chroot, auth_data=auth)
    zk.start(10)
    return zk


def test_anonymous_client_cannot_change_the_brokers_znodes(secured, zk_server):
    zk = _client(zk_server, secured.chroot)
    try:
        assert zk.get_children("/brokers/ids") == ["0"]          # reading stays open
        assert zk.exists("/controller")
        attempts = [
            lambda: zk.set("/brokers/ids/0", b"{}"),
            lambda: zk.delete("/brokers/ids/0"),
            lambda: zk.create("/brokers/ids/7", b"{}"),
            lambda: zk.set("/brokers/topics/secured-t", b"{}"),
            lambda: zk.create("/brokers/topics/evil", b"{}"),
            lambda: zk.create("/config/topics/evil", b"{}"),
            lambda: zk.set("/config/topics/secured-t", b"{}"),
            lambda: zk.create("/config/changes/config_change_", b"{}", sequence=True),
            lambda: zk.create("/kafka-acl/Topic", b""),
            lambda: zk.create("/kafka-acl-changes/acl_changes_", b"Topic:secured-t", sequence=True),
            lambda: zk.set("/controller", b"{}"),
            lambda: zk.delete("/controller"),
            lambda: zk.set("/controller_epoch", b"99"),
            lambda: zk.create("/admin/delete_topics/secured-t", b""),
            lambda: zk.set_acls("/brokers", OPEN_ACL_UNSAFE),
        ]
        for attempt in attempts:
            with pytest.raises(NoAuthError):
                attempt()
        with pytest.raises(NoAuthError):
            zk.get_children("/config/users")                        # secrets: no world read
    finally:
        zk.stop()
        zk.close()


def test_brokers_identity_may_change_them(secured, zk_server):
    zk = _client(zk_server, secured.chroot, auth=[("digest", CREDENTIALS)])
    try:
        zk.create("/config/topics/allowed", b"{}")
        zk.delete("/config/topics/allowed")
        assert zk.get_children("/config/users") == []
        acls, _ = zk.get_acls("/brokers/topics/secured-t")
        assert {(a.id.scheme, a.perms) for a in acls} == {("digest", 31), ("world", 1)}
    finally:
        zk.stop()
        zk.close()


def test_set_acl_needs_credentials(tmp_path, zk_server):
    c = LocalCluster(tmp_path, brokers=1, overrides={"zookeeper.set.acl": "true"},
                     zookeeper_connect=zk_server.connect_string + f"/nocred-{uuid.uuid4().hex[:6]}")
    with pytest.raises(RuntimeError, match="kbroker.zookeeper.digest.credentials"):
        c.start()
    c.stop()


def test_acl_znodes_written_through_the_broker_are_protected(secured, zk_server):
    from checkers import RawConn
    with RawConn(secured.bootstrap) as c:
        r = c.request(30, 1, {"creations": [{"resource_type": 3, "resource_name": "zk-g", "resource_pattern_type": 3,
                                             "principal": "User:a", "host": "*", "operation": 3,
                                             "permission_type": 3}]})
        assert r["results"][0]["error_code"] == 0
    zk = _client(zk_server, secured.chroot)
    try:
        acls, _ = zk.get_acls("/kafka-acl/Group/zk-g")
        assert {a.id.scheme for a in acls} == {"digest", "world"}
        with pytest.raises(NoAuthError):
            zk.set("/kafka-acl/Group/zk-g", b'{"version":1,"acls":[]}')
        with pytest.raises(NoAuthError):
            zk.delete("/kafka-acl/Group/zk-g")
    finally:
        zk.stop()
        zk.close()
