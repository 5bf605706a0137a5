"""Replication under the AclAuthorizer: brokers hold ClusterAction (from their host, 127.0.0.1, as the
only principal PLAINTEXT has is User:ANONYMOUS), so their follower fetches, LeaderAndIsr and
UpdateMetadata keep working once the cluster resource has ACLs, and an acks=all produce from a
client granted Write completes (the follower fetched it); a client host without ClusterAction
fetching as a follower is refused and moves nothing."""
from __future__ import annotations

import asyncio

import pytest
from kazoo.client import KazooClient

from kbroker.protocol.errors import Errors
from kbroker.security.acl import CLUSTER_NAME, AclEntry, Operation as Op, PatternType, Permission, ResourcePattern, \
    ResourceType as T
from kbroker.security.authorizer import AclAuthorizer
from kbroker.testing import LocalCluster, wait_until
from kbroker.zk.acls import AclZk
from builders import batch
from checkers import RawConn

TOPIC = "acl-rep"


def _grant(zk_connect, grants):
    zk = KazooClient(hosts=zk_connect)
    zk.start(10)
    loop = asyncio.new_event_loop()
    try:
        auth = AclAuthorizer()
        auth.store, auth.loop = AclZk(zk), loop
        auth.store.ensure_paths()
        for resource, entry in grants:
            auth.update(resource, lambda cur, entry=entry: cur | {entry})
    finally:
        zk.stop()
        zk.close()
        loop.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    overrides = {"authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
                 "allow.everyone.if.no.acl.found": "true"}
    with LocalCluster(tmp_path_factory.mktemp("aclrep"), brokers=2, overrides=overrides) as c:
        from confluent_kafka.admin import AdminClient, NewTopic
        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        admin.create_topics([NewTopic(TOPIC, 1, replica_assignment=[[0, 1]])])[TOPIC].result(60)
        anon = "User:ANONYMOUS"
        _grant(c.zk_connect, [
            (ResourcePattern(T.CLUSTER, CLUSTER_NAME, PatternType.LITERAL),
             AclEntry(anon, "127.0.0.1", Op.CLUSTER_ACTION, Permission.ALLOW)),
            (ResourcePattern(T.TOPIC, TOPIC, PatternType.LITERAL), AclEntry(anon, "127.0.0.2", Op.ALL, Permission.ALLOW)),
        ])
        yield c


def _leader_bootstrap(c):
    def find():
        with RawConn(c.bootstrap, source="127.0.0.2") as conn:
            r = conn.request(3, 8, {"topics": [{"name": TOPIC}], "allow_auto_topic_creation": False})
        p = r["topics"][0]["partitions"]
        if not p or p[0]["leader_id"] < 0 or len(p[0]["isr_nodes"]) != 2:
            return None
        b = next(b for b in r["brokers"] if b["node_id"] == p[0]["leader_id"])
        return f"{b['host']}:{b['port']}"
    return wait_until(find, 30, "the partition's leader with both replicas in sync")


def _produce_all(bootstrap):
    with RawConn(bootstrap, source="127.0.0.2", timeout=30) as conn:
        r = conn.request(0, 8, {"transactional_id": None, "acks": -1, "timeout_ms": 20000, "topic_data": [
            {"name": TOPIC, "partition_data": [{"index": 0, "records": bytes(batch(1))}]}]}, timeout=30)
    return r["responses"][0]["partition_responses"][0]["error_code"]


def test_acks_all_completes_with_the_cluster_acl(cluster):
    leader = _leader_bootstrap(cluster)
    for _ in range(5):
        assert _produce_all(leader) == 0


def test_follower_fetch_from_another_host_is_refused(cluster):
    leader = _leader_bootstrap(cluster)
    with RawConn(leader, source="127.0.0.3") as conn:
        r = conn.request(1, 11, {"replica_id": 1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20,
                                 "isolation_level": 0, "session_id": 0, "session_epoch": -1, "topics": [
                                     {"topic": TOPIC, "partitions": [{"partition": 0, "current_leader_epoch": -1,
                                                                      "fetch_offset": 1 << 40, "log_start_offset": -1,
                                                                      "partition_max_bytes": 1 << 20}]}],
                                 "forgotten_topics_data": [], "rack_id": ""})
    assert r["responses"][0]["partitions"][0]["error_code"] == Errors.TOPIC_AUTHORIZATION_FAILED
    assert _produce_all(leader) == 0         # the forged follower position moved nothing
