"""Authorized operations (KIP-430) as Kafka fills them: confluent-kafka's admin, authenticated as
User:alice over SASL_PLAINTEXT (SCRAM-SHA-256), asks for them in DescribeCluster, Metadata
(describe_topics) and DescribeGroups (describe_consumer_groups) and gets exactly the operations its ACLs
allow, implied ones included (READ and WRITE imply DESCRIBE); a resource without ACLs under
``allow.everyone.if.no.acl.found`` gives every operation the type supports; not asked for, the field is
INT32_MIN."""
from __future__ import annotations

import pytest
from confluent_kafka import Consumer, TopicCollection
from confluent_kafka.admin import AclOperation as A, AdminClient

from kbroker.security.acl import CLUSTER_NAME, Operation as Op, PatternType, ResourceType as T
from kbroker.security.sasl.scram import ScramCredential
from kbroker.testing import wait_until
from kbroker.zk.credentials import alter_user_config
from checkers import RawConn, create_topic
from test_acl_matrix import SCRAM, Acls, with_scram_listener

PASSWORD = "alice-pw"
TOPIC, OPEN_TOPIC, GROUP = "ops-t", "ops-open", "ops-g"
NOT_REQUESTED = -2**31


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    overrides = {"authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
                 "allow.everyone.if.no.acl.found": "true"}
    with with_scram_listener(tmp_path_factory.mktemp("aclops"), overrides) as c:
        create_topic(c.bootstrap, TOPIC, 1)
        create_topic(c.bootstrap, OPEN_TOPIC, 1)
        acls = Acls(c.zk_connect)
        try:
            alter_user_config(acls.zk, "alice", {SCRAM: ScramCredential.from_password(SCRAM, PASSWORD, 4096).encode()})
            acls.grant(T.CLUSTER, CLUSTER_NAME, Op.CLUSTER_ACTION, "127.0.0.1")    # the broker itself
            for rtype, name, op in ((T.CLUSTER, CLUSTER_NAME, Op.DESCRIBE), (T.CLUSTER, CLUSTER_NAME, Op.ALTER),
                                    (T.TOPIC, TOPIC, Op.READ), (T.TOPIC, TOPIC, Op.WRITE),
                                    (T.GROUP, GROUP, Op.READ)):
                acls.grant(rtype, name, op, "*", principal="User:alice")
            admin = AdminClient(_conf(c))
            wait_until(lambda: _cluster_ops(admin) == {A.DESCRIBE, A.ALTER}, 10, "ACLs applied")
            c.admin = admin
            yield c
        finally:
            acls.close()


def _conf(c, **extra):
    return {"bootstrap.servers": f"127.0.0.1:{c.sasl_port}", "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": SCRAM, "sasl.username": "alice", "sasl.password": PASSWORD, **extra}


def _cluster_ops(admin):
    return set(admin.describe_cluster(include_authorized_operations=True).result(10).authorized_operations)


def test_cluster_and_topics(cluster):
    admin = cluster.admin
    assert _cluster_ops(admin) == {A.DESCRIBE, A.ALTER}
    got = admin.describe_topics(TopicCollection([TOPIC, OPEN_TOPIC]), include_authorized_operations=True)
    ops = {name: set(f.result(10).authorized_operations) for name, f in got.items()}
    assert ops[TOPIC] == {A.READ, A.WRITE, A.DESCRIBE}
    assert ops[OPEN_TOPIC] == {A.READ, A.WRITE, A.CREATE, A.DESCRIBE, A.DELETE, A.ALTER, A.DESCRIBE_CONFIGS,
                               A.ALTER_CONFIGS}
    # not asked for: INT32_MIN (raw Metadata v8, User:ANONYMOUS on the PLAINTEXT listener)
    with RawConn(cluster.bootstrap) as c:
        r = c.request(3, 8, {"topics": [{"name": OPEN_TOPIC}], "allow_auto_topic_creation": False,
                             "include_cluster_authorized_operations": False,
                             "include_topic_authorized_operations": False})
        assert r["cluster_authorized_operations"] == NOT_REQUESTED
        assert r["topics"][0]["error_code"] == 0 and r["topics"][0]["topic_authorized_operations"] == NOT_REQUESTED
        r = c.request(3, 8, {"topics": [{"name": OPEN_TOPIC}], "allow_auto_topic_creation": False,
                             "include_cluster_authorized_operations": True,
                             "include_topic_authorized_operations": True})
        assert r["cluster_authorized_operations"] == 1 << int(Op.CLUSTER_ACTION)   # its ACL is for 127.0.0.1
        assert r["topics"][0]["topic_authorized_operations"] == sum(
            1 << int(o) for o in (Op.READ, Op.WRITE, Op.CREATE, Op.DESCRIBE, Op.DELETE, Op.ALTER,
                                  Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS))


def test_consumer_group(cluster):
    consumer = Consumer(_conf(cluster, **{"group.id": GROUP, "session.timeout.ms": 6000}))
    try:
        assigned = []
        consumer.subscribe([TOPIC], on_assign=lambda _c, parts: assigned.extend(parts))
        wait_until(lambda: consumer.poll(0.2) is None and assigned, 30, "consumer joined")
        got = cluster.admin.describe_consumer_groups([GROUP], include_authorized_operations=True)[GROUP].result(10)
        assert set(got.authorized_operations) == {A.READ, A.DESCRIBE}
        plain = cluster.admin.describe_consumer_groups([GROUP])[GROUP].result(10)
        assert plain.authorized_operations is None
    finally:
        consumer.close()
