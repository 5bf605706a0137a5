"""CreateAcls / DescribeAcls / DeleteAcls (29-31) with kafka-python's and confluent-kafka's admin
clients and ``kbroker acls`` (kafka-acls.sh flags), against a broker with the AclAuthorizer where
User:ANONYMOUS is a super user (so PLAINTEXT clients may administer ACLs); a broker without an
authorizer answers SECURITY_DISABLED. (A client without Describe / Alter on the cluster is refused:
tests/cluster/test_acl_matrix.py.)"""
from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest
from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient,
                                   ResourcePatternType, ResourceType)
from kafka.admin import (ACL, ACLFilter, ACLOperation, ACLPermissionType, ACLResourcePatternType,
                         KafkaAdminClient, ResourcePattern, ResourcePatternFilter)
from kafka.admin import ResourceType as KpResourceType
import kafka.errors as kerr
from kazoo.client import KazooClient

from kbroker.protocol.errors import Errors
from kbroker.testing import LocalCluster, wait_until
from checkers import RawConn


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    overrides = {"authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
                 "super.users": "User:ANONYMOUS", "allow.everyone.if.no.acl.found": "false"}
    with LocalCluster(tmp_path_factory.mktemp("aclapis"), brokers=1, overrides=overrides) as c:
        yield c


def _describe_all(bootstrap):
    with RawConn(bootstrap) as c:
        return c.request(29, 1, {"resource_type_filter": 1, "resource_name_filter": None, "pattern_type_filter": 1,
                                 "principal_filter": None, "host_filter": None, "operation": 1,
                                 "permission_type": 1})


def test_kafka_python_admin_round_trip(cluster):
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, client_id="acl-kp")
    try:
        topic = f"kp-{uuid.uuid4().hex[:6]}"
        read = ACL("User:alice", "*", ACLOperation.READ, ACLPermissionType.ALLOW,
                   ResourcePattern(KpResourceType.TOPIC, topic, ACLResourcePatternType.LITERAL))
        deny = ACL("User:bob", "10.0.0.1", ACLOperation.WRITE, ACLPermissionType.DENY,
                   ResourcePattern(KpResourceType.TOPIC, topic[:4], ACLResourcePatternType.PREFIXED))
        res = admin.create_acls([read, deny])
        assert len(res["succeeded"]) == 2 and not res["failed"], res
        acls, err = admin.describe_acls(ACLFilter(None, None, ACLOperation.ANY, ACLPermissionType.ANY,
                                                  ResourcePatternFilter(KpResourceType.TOPIC, topic,
                                                                        ACLResourcePatternType.MATCH)))
        got = {(a.principal, a.host, a.operation, a.permission_type, a.resource_pattern.pattern_type) for a in acls}
        assert got == {("User:alice", "*", ACLOperation.READ, ACLPermissionType.ALLOW,
                        ACLResourcePatternType.LITERAL),
                       ("User:bob", "10.0.0.1", ACLOperation.WRITE, ACLPermissionType.DENY,
                        ACLResourcePatternType.PREFIXED)}
        # Kafka's JSON in ZooKeeper
        zk = KazooClient(hosts=cluster.zk_connect)
        zk.start(10)
        try:
            stored = json.loads(zk.get(f"/kafka-acl/Topic/{topic}")[0])
            assert stored == {"version": 1, "acls": [{"principal": "User:alice", "permissionType": "Allow",
                                                      "operation": "Read", "host": "*"}]}
            assert zk.exists(f"/kafka-acl-extended/prefixed/Topic/{topic[:4]}")
        finally:
            zk.stop()
            zk.close()
        deleted = admin.delete_acls([ACLFilter("User:alice", None, ACLOperation.ANY, ACLPermissionType.ANY,
                                               ResourcePatternFilter(KpResourceType.ANY, None,
                                                                     ACLResourcePatternType.ANY))])
        assert [a.principal for a in deleted[0][1]] == ["User:alice"] and deleted[0][2] is kerr.NoError
        acls, err = admin.describe_acls(ACLFilter(None, None, ACLOperation.ANY, ACLPermissionType.ANY,
                                                  ResourcePatternFilter(KpResourceType.TOPIC, topic,
                                                                        ACLResourcePatternType.MATCH)))
        assert [a.principal for a in acls] == ["User:bob"]
    finally:
        admin.close()


def test_confluent_admin_round_trip(cluster):
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    group = f"cg-{uuid.uuid4().hex[:6]}"
    binding = AclBinding(ResourceType.GROUP, group, ResourcePatternType.LITERAL, "User:carol", "*",
                         AclOperation.READ, AclPermissionType.ALLOW)
    for f in admin.create_acls([binding], request_timeout=20).values():
        assert f.result(20) is None
    flt = AclBindingFilter(ResourceType.GROUP, group, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                           AclPermissionType.ANY)
    found = admin.describe_acls(flt, request_timeout=20).result(20)
    assert [(b.name, b.principal, b.operation) for b in found] == [(group, "User:carol", AclOperation.READ)]
    # an invalid binding (Read is not a cluster operation... and a cluster named otherwise) is refused
    bad = AclBinding(ResourceType.BROKER, "other", ResourcePatternType.LITERAL, "User:x", "*",
                     AclOperation.ALTER, AclPermissionType.ALLOW)
    with pytest.raises(Exception):
        for f in admin.create_acls([bad], request_timeout=20).values():
            f.result(20)
    deleted = list(admin.delete_acls([flt], request_timeout=20).values())[0].result(20)
    assert [b.principal for b in deleted] == ["User:carol"]
    assert admin.describe_acls(flt, request_timeout=20).result(20) == []


def _cli(cluster, *args, stdin=None):
    return subprocess.run([sys.executable, "-m", "kbroker", "acls", "--bootstrap-server", cluster.bootstrap, *args],
                          capture_output=True, text=True, timeout=60, input=stdin)


def test_cli_add_list_remove(cluster):
    topic = f"cli-{uuid.uuid4().hex[:6]}"
    r = _cli(cluster, "--add", "--allow-principal", "User:dave", "--allow-host", "127.0.0.9", "--operation", "Read",
             "--operation", "Describe", "--topic", topic)
    assert r.returncode == 0, r.stderr
    assert f"Adding ACLs for resource `ResourcePattern(resourceType=TOPIC, name={topic}, patternType=LITERAL)`:" \
        in r.stdout
    assert "(principal=User:dave, host=127.0.0.9, operation=READ, permissionType=ALLOW)" in r.stdout
    r = _cli(cluster, "--add", "--producer", "--idempotent", "--allow-principal", "User:erin", "--topic", topic,
             "--resource-pattern-type", "prefixed")
    assert r.returncode == 0, r.stderr
    r = _cli(cluster, "--add", "--consumer", "--allow-principal", "User:erin", "--topic", topic, "--group", "g1")
    assert r.returncode == 0, r.stderr
    r = _cli(cluster, "--list", "--topic", topic, "--resource-pattern-type", "match")
    assert r.returncode == 0, r.stderr
    for op in ("READ", "DESCRIBE"):
        assert f"(principal=User:dave, host=127.0.0.9, operation={op}, permissionType=ALLOW)" in r.stdout
    for op in ("WRITE", "DESCRIBE", "CREATE", "READ"):
        assert f"(principal=User:erin, host=*, operation={op}, permissionType=ALLOW)" in r.stdout
    assert "patternType=PREFIXED" in r.stdout
    r = _cli(cluster, "--list", "--cluster")
    assert "(principal=User:erin, host=*, operation=IDEMPOTENT_WRITE, permissionType=ALLOW)" in r.stdout
    r = _cli(cluster, "--list", "--group", "g1")
    assert "(principal=User:erin, host=*, operation=READ, permissionType=ALLOW)" in r.stdout
    # --remove asks first: "n" keeps them
    r = _cli(cluster, "--remove", "--topic", topic, stdin="n\n")
    assert r.returncode == 0 and "Are you sure" in r.stdout
    assert "User:dave" in _cli(cluster, "--list", "--topic", topic).stdout
    r = _cli(cluster, "--remove", "--force", "--topic", topic, "--deny-principal", "User:nobody")
    assert r.returncode == 0, r.stderr
    assert "User:dave" in _cli(cluster, "--list", "--topic", topic).stdout
    r = _cli(cluster, "--remove", "--force", "--topic", topic)
    assert r.returncode == 0, r.stderr
    assert "User:dave" not in _cli(cluster, "--list", "--topic", topic).stdout
    assert "User:erin" in _cli(cluster, "--list", "--topic", topic, "--resource-pattern-type", "prefixed").stdout
    r = _cli(cluster, "--add", "--allow-principal", "User:x", "--topic", topic, "--resource-pattern-type", "match")
    assert r.returncode == 1 and "not valid when adding acls" in r.stderr


def test_refusals_and_invalid_filters(cluster):
    with RawConn(cluster.bootstrap) as c:
        r = c.request(29, 1, {"resource_type_filter": 0, "resource_name_filter": None, "pattern_type_filter": 1,
                              "principal_filter": None, "host_filter": None, "operation": 1, "permission_type": 1})
        assert r["error_code"] == Errors.INVALID_REQUEST
        r = c.request(30, 1, {"creations": [
            {"resource_type": 2, "resource_name": "t", "resource_pattern_type": 2, "principal": "User:a",
             "host": "*", "operation": 3, "permission_type": 3},       # MATCH cannot be created
            {"resource_type": 2, "resource_name": "t", "resource_pattern_type": 3, "principal": "nocolon",
             "host": "*", "operation": 3, "permission_type": 3},
            {"resource_type": 3, "resource_name": "g", "resource_pattern_type": 3, "principal": "User:a",
             "host": "*", "operation": 4, "permission_type": 3},       # Write is no group operation
        ]})
        assert [x["error_code"] for x in r["results"]] == [Errors.INVALID_REQUEST] * 3
    assert _describe_all(cluster.bootstrap)["error_code"] == 0


def test_security_disabled_without_authorizer(kafka_cluster):
    r = _describe_all(kafka_cluster.bootstrap)
    assert r["error_code"] == Errors.SECURITY_DISABLED
    with RawConn(kafka_cluster.bootstrap) as c:
        r = c.request(30, 1, {"creations": [{"resource_type": 2, "resource_name": "t", "resource_pattern_type": 3,
                                             "principal": "User:a", "host": "*", "operation": 3,
                                             "permission_type": 3}]})
        assert r["results"][0]["error_code"] == Errors.SECURITY_DISABLED
