"""Every API authorized as Kafka's request handlers do it, on a real broker with the AclAuthorizer.

Two ways clients differ. On the PLAINTEXT listener every client is User:ANONYMOUS, so hosts tell them
apart: the broker's own connections come from 127.0.0.1 (it holds ClusterAction there), the client
granted the ACLs connects from 127.0.0.2 and the one without any from 127.0.0.3. On the SASL_PLAINTEXT
listener (SCRAM-SHA-256) principals do: User:alice holds the same ACLs (any host), User:bob none.
``allow.everyone.if.no.acl.found`` is on, so the broker's start needs no ACL; every resource the matrix
uses has ACLs, so .3 and bob are refused on each. For each API: .3 and bob get Kafka's refusal, .2 and
alice anything else.
"""
from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from kazoo.client import KazooClient

from kbroker.client.sasl import scram_client
from kbroker.protocol.errors import Errors
from kbroker.security.acl import (CLUSTER_NAME, AclEntry, Operation as Op, PatternType, Permission, ResourcePattern,
                                  ResourceType as T)
from kbroker.security.authorizer import AclAuthorizer
from kbroker.security.sasl.scram import ScramCredential
from kbroker.testing import LocalCluster, free_port, wait_until
from kbroker.zk.acls import AclZk
from kbroker.zk.credentials import alter_user_config
from builders import batch
from checkers import RawConn, create_topic
from test_produce_fast import counts

WITH, WITHOUT = "127.0.0.2", "127.0.0.3"
TOPIC, GROUP = "acl-t", "acl-g"
TAF, GAF, CAF = (int(Errors.TOPIC_AUTHORIZATION_FAILED), int(Errors.GROUP_AUTHORIZATION_FAILED),
                 int(Errors.CLUSTER_AUTHORIZATION_FAILED))
TIDAF = int(Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
SCRAM = "SCRAM-SHA-256"
USERS = {"alice": "alice-pw", "bob": "bob-pw"}      # alice holds the ACLs, bob none


class Acls:
    """ACL writes as another broker (or kafka-acls.sh on ZooKeeper) makes them."""

    def __init__(self, zk_connect):
        self.zk = KazooClient(hosts=zk_connect)
        self.zk.start(10)
        self.loop = asyncio.new_event_loop()
        self.auth = AclAuthorizer()
        self.auth.store, self.auth.loop = AclZk(self.zk), self.loop
        self.auth.store.ensure_paths()

    def grant(self, rtype, name, op, host, permission=Permission.ALLOW, pattern=PatternType.LITERAL,
              principal="User:ANONYMOUS"):
        entry = AclEntry(principal, host, op, permission)
        self.auth.update(ResourcePattern(rtype, name, pattern), lambda cur: cur | {entry})

    def revoke(self, rtype, name, op, host, permission=Permission.ALLOW, pattern=PatternType.LITERAL):
        entry = AclEntry("User:ANONYMOUS", host, op, permission)
        self.auth.update(ResourcePattern(rtype, name, pattern), lambda cur: cur - {entry})

    def close(self):
        self.zk.stop()
        self.zk.close()
        self.loop.close()


def with_scram_listener(root, overrides) -> LocalCluster:
    """One broker (not started) with a SASL_PLAINTEXT listener (SCRAM-SHA-256) on ``c.sasl_port`` beside
    its PLAINTEXT one, which stays the inter-broker listener."""
    overrides = dict(overrides, **{"listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
                                   "inter.broker.listener.name": "PLAINTEXT", "sasl.enabled.mechanisms": SCRAM})
    c = LocalCluster(root, brokers=1, overrides=overrides)
    c.sasl_port = free_port()
    for b in c.brokers.values():
        b.extra = {"listeners": f"PLAINTEXT://127.0.0.1:{b.port},SASL_PLAINTEXT://127.0.0.1:{c.sasl_port}"}
    return c


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    overrides = {"authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
                 "allow.everyone.if.no.acl.found": "true", "auto.create.topics.enable": "true",
                 "kbroker.metrics.port": free_port()}
    with with_scram_listener(tmp_path_factory.mktemp("aclmatrix"), overrides) as c:
        create_topic(c.bootstrap, TOPIC, 1)
        for name in ("acl-del", "acl-del2"):
            create_topic(c.bootstrap, name, 1)
        acls = Acls(c.zk_connect)
        for user, pw in USERS.items():
            alter_user_config(acls.zk, user, {SCRAM: ScramCredential.from_password(SCRAM, pw, 4096).encode()})
        # the broker's own controller requests, from 127.0.0.1
        acls.grant(T.CLUSTER, CLUSTER_NAME, Op.CLUSTER_ACTION, "127.0.0.1")
        for host, principal in ((WITH, "User:ANONYMOUS"), ("*", "User:alice")):
            def grant(rtype, name, op, pattern=PatternType.LITERAL):
                acls.grant(rtype, name, op, host, pattern=pattern, principal=principal)
            for op in (Op.READ, Op.WRITE, Op.DESCRIBE, Op.DELETE, Op.ALTER, Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS):
                grant(T.TOPIC, TOPIC, op)
            grant(T.TOPIC, "acl-del", Op.DELETE)
            grant(T.TOPIC, "acl-del2", Op.DELETE)
            grant(T.TOPIC, "acl-new", Op.CREATE, pattern=PatternType.PREFIXED)
            grant(T.TOPIC, "acl-auto", Op.CREATE, pattern=PatternType.PREFIXED)
            grant(T.TOPIC, "acl-auto", Op.DESCRIBE, pattern=PatternType.PREFIXED)
            for op in (Op.READ, Op.DELETE):
                grant(T.GROUP, GROUP, op, pattern=PatternType.PREFIXED)
            for op in (Op.ALTER, Op.DESCRIBE, Op.IDEMPOTENT_WRITE, Op.CLUSTER_ACTION, Op.DESCRIBE_CONFIGS,
                       Op.ALTER_CONFIGS):
                grant(T.CLUSTER, CLUSTER_NAME, op)
            grant(T.TRANSACTIONAL_ID, "tx", Op.ALL)
        # the broker applied the last one (a notification away)
        wait_until(lambda: _code_as(c, "alice", _list_reassignments) != CAF, 10)
        c.acls = acls
        yield c
        acls.close()


def _code_of(bootstrap, host, call):
    with RawConn(bootstrap, source=host) as conn:
        return call(conn)


def _code_as(cluster, user, call):
    """``call`` on a SASL_PLAINTEXT connection authenticated (SCRAM-SHA-256) as ``user``."""
    with RawConn(f"127.0.0.1:{cluster.sasl_port}") as conn:
        assert conn.request(17, 1, {"mechanism": SCRAM})["error_code"] == 0
        steps = scram_client(SCRAM, user, USERS[user])
        token = next(steps)
        while token is not None:
            r = conn.request(36, 1, {"auth_bytes": token})
            assert r["error_code"] == 0, r
            token = steps.send(bytes(r["auth_bytes"]))
        return call(conn)


def _codes(resp, key, sub):
    return {p["error_code"] for t in resp[key] for p in t[sub]}


# ---- one function per API: the request, and the error code its answer carries ------------------

def _metadata(c):
    r = c.request(3, 8, {"topics": [{"name": TOPIC}], "allow_auto_topic_creation": False})
    return r["topics"][0]["error_code"]


def _metadata_all(c):
    r = c.request(3, 8, {"topics": None})
    return 0 if any(t["name"] == TOPIC for t in r["topics"]) else TAF


def _metadata_auto_create(c):
    name = f"acl-auto-{uuid.uuid4().hex[:6]}"
    r = c.request(3, 8, {"topics": [{"name": name}], "allow_auto_topic_creation": True})
    return r["topics"][0]["error_code"]


def _produce(c):
    r = c.request(0, 8, {"transactional_id": None, "acks": 1, "timeout_ms": 5000, "topic_data": [
        {"name": TOPIC, "partition_data": [{"index": 0, "records": bytes(batch(1))}]}]})
    return r["responses"][0]["partition_responses"][0]["error_code"]


def _fetch(c, replica_id=-1):
    r = c.request(1, 11, {"replica_id": replica_id, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20,
                          "isolation_level": 0, "session_id": 0, "session_epoch": -1, "topics": [
                              {"topic": TOPIC, "partitions": [{"partition": 0, "current_leader_epoch": -1,
                                                               "fetch_offset": 0, "log_start_offset": -1,
                                                               "partition_max_bytes": 1 << 20}]}],
                          "forgotten_topics_data": [], "rack_id": ""})
    return r["responses"][0]["partitions"][0]["error_code"]


def _follower_fetch(c):
    return _fetch(c, replica_id=0)


def _list_offsets(c):
    r = c.request(2, 5, {"replica_id": -1, "isolation_level": 0, "topics": [
        {"name": TOPIC, "partitions": [{"partition_index": 0, "current_leader_epoch": -1, "timestamp": -1}]}]})
    return r["topics"][0]["partitions"][0]["error_code"]


def _offset_for_leader_epoch(c):
    r = c.request(23, 3, {"replica_id": -1, "topics": [
        {"topic": TOPIC, "partitions": [{"partition": 0, "current_leader_epoch": -1, "leader_epoch": 0}]}]})
    return r["topics"][0]["partitions"][0]["error_code"]


def _create_topics(c):
    r = c.request(19, 7, {"topics": [{"name": f"acl-new-{uuid.uuid4().hex[:6]}", "num_partitions": 1,
                                      "replication_factor": 1, "assignments": [], "configs": []}],
                          "timeout_ms": 10000, "validate_only": True})
    return r["topics"][0]["error_code"]


def _delete_topics(c):
    r = c.request(20, 4, {"topic_names": ["acl-del"], "timeout_ms": 10000})
    return r["responses"][0]["error_code"]


def _create_partitions(c):
    r = c.request(37, 1, {"topics": [{"name": TOPIC, "count": 2, "assignments": None}], "timeout_ms": 10000,
                          "validate_only": True})
    return r["results"][0]["error_code"]


def _describe_configs(c):
    r = c.request(32, 1, {"resources": [{"resource_type": 2, "resource_name": TOPIC, "configuration_keys": None}],
                          "include_synonyms": False})
    return r["results"][0]["error_code"]


def _describe_broker_configs(c):
    r = c.request(32, 1, {"resources": [{"resource_type": 4, "resource_name": "0", "configuration_keys": None}],
                          "include_synonyms": False})
    return r["results"][0]["error_code"]


def _alter_configs(c):
    r = c.request(44, 0, {"resources": [{"resource_type": 2, "resource_name": TOPIC, "configs": [
        {"name": "retention.ms", "config_operation": 0, "value": "3600000"}]}], "validate_only": True})
    return r["responses"][0]["error_code"]


def _delete_records(c):
    r = c.request(21, 1, {"topics": [{"name": TOPIC, "partitions": [{"partition_index": 0, "offset": 0}]}],
                          "timeout_ms": 5000})
    return r["topics"][0]["partitions"][0]["error_code"]


def _describe_log_dirs(c):
    return c.request(35, 3, {"topics": None})["error_code"]


def _alter_replica_log_dirs(c):
    r = c.request(34, 2, {"dirs": [{"path": "/not-a-log-dir", "topics": [{"name": TOPIC, "partitions": [0]}]}]})
    return r["results"][0]["partitions"][0]["error_code"]


def _elect_leaders(c):
    r = c.request(43, 1, {"election_type": 0, "topic_partitions": [{"topic": TOPIC, "partitions": [0]}],
                          "timeout_ms": 5000})
    return r["error_code"]


def _alter_reassignments(c):
    return c.request(45, 0, {"timeout_ms": 5000, "topics": []})["error_code"]


def _list_reassignments(c):
    return c.request(46, 0, {"timeout_ms": 5000, "topics": None})["error_code"]


def _leader_and_isr(c):
    return c.request(4, 5, {"controller_id": 0, "controller_epoch": 0, "broker_epoch": -1, "type": 0,
                            "topic_states": [], "live_leaders": []})["error_code"]


def _stop_replica(c):
    return c.request(5, 3, {"controller_id": 0, "controller_epoch": 0, "broker_epoch": -1,
                            "topic_states": []})["error_code"]


def _update_metadata(c):
    return c.request(6, 7, {"controller_id": 0, "controller_epoch": 0, "broker_epoch": -1, "topic_states": [],
                            "live_brokers": []})["error_code"]


def _controlled_shutdown(c):
    return c.request(7, 3, {"broker_id": 99, "broker_epoch": -1})["error_code"]


def _init_producer_id(c):
    return c.request(22, 2, {"transactional_id": None, "transaction_timeout_ms": 60000})["error_code"]


def _init_producer_id_txn(c):
    return c.request(22, 4, {"transactional_id": "tx", "transaction_timeout_ms": 60000, "producer_id": -1,
                             "producer_epoch": -1})["error_code"]


def _find_txn_coordinator(c):
    return c.request(10, 3, {"key": "tx", "key_type": 1})["error_code"]


def _add_partitions_to_txn(c):
    r = c.request(24, 3, {"v3_and_below_transactional_id": "tx", "v3_and_below_producer_id": 1,
                          "v3_and_below_producer_epoch": 0,
                          "v3_and_below_topics": [{"name": TOPIC, "partitions": [0]}]})
    return r["results_by_topic_v3_and_below"][0]["results_by_partition"][0]["partition_error_code"]


def _add_partitions_to_txn_v4(c):
    return c.request(24, 4, {"transactions": [{"transactional_id": "tx", "producer_id": 1, "producer_epoch": 0,
                                               "verify_only": True,
                                               "topics": [{"name": TOPIC, "partitions": [0]}]}]})["error_code"]


def _add_offsets_to_txn(c):
    return c.request(25, 3, {"transactional_id": "tx", "producer_id": 1, "producer_epoch": 0,
                             "group_id": GROUP})["error_code"]


def _end_txn(c):
    return c.request(26, 3, {"transactional_id": "tx", "producer_id": 1, "producer_epoch": 0,
                             "committed": True})["error_code"]


def _txn_offset_commit(c):
    r = c.request(28, 3, {"transactional_id": "tx", "group_id": GROUP, "producer_id": 1, "producer_epoch": 0,
                          "generation_id": -1, "member_id": "", "group_instance_id": None,
                          "topics": [{"name": TOPIC, "partitions": [{"partition_index": 0, "committed_offset": 1,
                                                                     "committed_leader_epoch": -1,
                                                                     "committed_metadata": ""}]}]})
    return r["topics"][0]["partitions"][0]["error_code"]


def _describe_transactions(c):
    return c.request(65, 0, {"transactional_ids": ["tx"]})["transaction_states"][0]["error_code"]


def _find_coordinator(c):
    return c.request(10, 2, {"key": GROUP, "key_type": 0})["error_code"]


def _join_group(c):
    r = c.request(11, 5, {"group_id": GROUP, "session_timeout_ms": 10000, "rebalance_timeout_ms": 10000,
                          "member_id": "", "group_instance_id": None, "protocol_type": "consumer",
                          "protocols": [{"name": "range", "metadata": b""}]})
    return r["error_code"]


def _heartbeat(c):
    return c.request(12, 3, {"group_id": GROUP, "generation_id": 1, "member_id": "m",
                             "group_instance_id": None})["error_code"]


def _offset_commit(c):
    r = c.request(8, 2, {"group_id": GROUP, "generation_id_or_member_epoch": -1, "member_id": "",
                         "retention_time_ms": -1, "topics": [{"name": TOPIC, "partitions": [
                             {"partition_index": 0, "committed_offset": 0, "committed_metadata": ""}]}]})
    return r["topics"][0]["partitions"][0]["error_code"]


def _offset_fetch(c):
    return c.request(9, 3, {"group_id": GROUP, "topics": None})["error_code"]


def _describe_groups(c):
    return c.request(15, 1, {"groups": [GROUP]})["groups"][0]["error_code"]


def _delete_groups(c):
    return c.request(42, 1, {"groups_names": [GROUP + "-gone"]})["results"][0]["error_code"]


def _describe_acls(c):
    return c.request(29, 1, {"resource_type_filter": 1, "resource_name_filter": None, "pattern_type_filter": 1,
                             "principal_filter": None, "host_filter": None, "operation": 1,
                             "permission_type": 1})["error_code"]


def _create_acls(c):
    r = c.request(30, 1, {"creations": [{"resource_type": 2, "resource_name": "acl-made", "resource_pattern_type": 3,
                                         "principal": "User:nobody", "host": "*", "operation": 3,
                                         "permission_type": 3}]})
    return r["results"][0]["error_code"]


def _delete_acls(c):
    r = c.request(31, 1, {"filters": [{"resource_type_filter": 2, "resource_name_filter": "acl-made",
                                       "pattern_type_filter": 3, "principal_filter": "User:nobody",
                                       "host_filter": None, "operation": 1, "permission_type": 1}]})
    return r["filter_results"][0]["error_code"]


def _write_txn_markers(c):
    r = c.request(27, 1, {"markers": [{"producer_id": 424242, "producer_epoch": 0, "transaction_result": False,
                                       "topics": [{"name": TOPIC, "partition_indexes": [0]}],
                                       "coordinator_epoch": 0}]})
    return r["markers"][0]["topics"][0]["partitions"][0]["error_code"]


def _describe_producers(c):
    r = c.request(61, 0, {"topics": [{"name": TOPIC, "partition_indexes": [0]}]})
    return r["topics"][0]["partitions"][0]["error_code"]


def _describe_client_quotas(c):
    return c.request(48, 1, {"components": [], "strict": False})["error_code"]


def _alter_client_quotas(c):
    r = c.request(49, 1, {"entries": [{"entity": [{"entity_type": "client-id", "entity_name": "acl-q"}],
                                       "ops": [{"key": "producer_byte_rate", "value": 1024.0, "remove": False}]}],
                          "validate_only": True})
    return r["entries"][0]["error_code"]


MATRIX = [
    # (API, call, Kafka's refusal)
    ("Metadata (named topic)", _metadata, TAF),
    ("Metadata (all topics: unauthorized hidden)", _metadata_all, TAF),
    ("Metadata (auto-create needs Create)", _metadata_auto_create, TAF),
    ("Produce", _produce, TAF),
    ("Fetch (consumer)", _fetch, TAF),
    ("Fetch (follower needs ClusterAction)", _follower_fetch, TAF),
    ("ListOffsets", _list_offsets, TAF),
    ("OffsetForLeaderEpoch", _offset_for_leader_epoch, TAF),
    ("CreateTopics", _create_topics, TAF),
    ("DeleteTopics", _delete_topics, TAF),
    ("CreatePartitions", _create_partitions, TAF),
    ("DescribeConfigs (topic)", _describe_configs, TAF),
    ("DescribeConfigs (broker)", _describe_broker_configs, CAF),
    ("IncrementalAlterConfigs", _alter_configs, TAF),
    ("DeleteRecords", _delete_records, TAF),
    ("DescribeLogDirs", _describe_log_dirs, CAF),
    ("AlterReplicaLogDirs", _alter_replica_log_dirs, CAF),
    ("ElectLeaders", _elect_leaders, CAF),
    ("AlterPartitionReassignments", _alter_reassignments, CAF),
    ("ListPartitionReassignments", _list_reassignments, CAF),
    ("LeaderAndIsr", _leader_and_isr, CAF),
    ("StopReplica", _stop_replica, CAF),
    ("UpdateMetadata", _update_metadata, CAF),
    ("ControlledShutdown", _controlled_shutdown, CAF),
    ("InitProducerId (idempotent)", _init_producer_id, CAF),
    ("FindCoordinator", _find_coordinator, GAF),
    ("JoinGroup", _join_group, GAF),
    ("Heartbeat", _heartbeat, GAF),
    ("OffsetCommit", _offset_commit, GAF),
    ("OffsetFetch", _offset_fetch, GAF),
    ("DescribeGroups", _describe_groups, GAF),
    ("DeleteGroups", _delete_groups, GAF),
    ("DescribeAcls", _describe_acls, CAF),
    ("CreateAcls", _create_acls, CAF),
    ("DeleteAcls", _delete_acls, CAF),
    ("WriteTxnMarkers (brokers only)", _write_txn_markers, CAF),
    ("DescribeProducers", _describe_producers, TAF),
    ("InitProducerId (transactional)", _init_producer_id_txn, TIDAF),
    ("FindCoordinator (transaction)", _find_txn_coordinator, TIDAF),
    ("AddPartitionsToTxn", _add_partitions_to_txn, TIDAF),
    ("AddPartitionsToTxn v4 (brokers only)", _add_partitions_to_txn_v4, CAF),
    ("AddOffsetsToTxn", _add_offsets_to_txn, TIDAF),
    ("EndTxn", _end_txn, TIDAF),
    ("TxnOffsetCommit", _txn_offset_commit, TIDAF),
    ("DescribeTransactions", _describe_transactions, TIDAF),
    ("DescribeClientQuotas", _describe_client_quotas, CAF),
    ("AlterClientQuotas", _alter_client_quotas, CAF),
]


@pytest.mark.parametrize("name, call, refusal", MATRIX, ids=[m[0] for m in MATRIX])
def test_matrix(cluster, name, call, refusal):
    assert _code_of(cluster.bootstrap, WITHOUT, call) == refusal
    assert _code_of(cluster.bootstrap, WITH, call) != refusal


@pytest.mark.parametrize("name, call, refusal", MATRIX, ids=[m[0] for m in MATRIX])
def test_matrix_sasl_principals(cluster, name, call, refusal):
    assert _code_as(cluster, "bob", call) == refusal
    assert _code_as(cluster, "alice", call) != refusal


def test_forged_leader_and_isr_changes_nothing(cluster):
    """A client without ClusterAction cannot make the broker drop its leadership."""
    with RawConn(cluster.bootstrap, source=WITHOUT) as c:
        r = c.request(4, 5, {"controller_id": 0, "controller_epoch": 99, "broker_epoch": -1, "type": 0,
                             "topic_states": [{"topic_name": TOPIC, "topic_id": bytes(16), "partition_states": [
                                 {"partition_index": 0, "controller_epoch": 99, "leader": 5, "leader_epoch": 99,
                                  "isr": [5], "partition_epoch": 99, "replicas": [5], "adding_replicas": [],
                                  "removing_replicas": [], "is_new": False}]}], "live_leaders": []})
        assert r["error_code"] == CAF
    assert _code_of(cluster.bootstrap, WITH, _produce) == 0       # still the leader


def test_offset_commit_needs_topic_read_too(cluster):
    """Group Read but not Topic Read: that partition's commit is TOPIC_AUTHORIZATION_FAILED."""
    def commit(c):
        r = c.request(8, 2, {"group_id": GROUP + "-x", "generation_id_or_member_epoch": -1, "member_id": "",
                             "retention_time_ms": -1, "topics": [{"name": "acl-del2", "partitions": [
                                 {"partition_index": 0, "committed_offset": 0, "committed_metadata": ""}]}]})
        return r["topics"][0]["partitions"][0]["error_code"]
    assert _code_of(cluster.bootstrap, WITH, commit) == TAF


def test_native_path_follows_acl_changes(cluster):
    """The per-connection decisions of the native Produce path are dropped when ACLs change: one
    connection is refused, allowed once the ACL arrives, refused again once it goes."""
    acls = cluster.acls
    with RawConn(cluster.bootstrap, source=WITHOUT) as c:
        assert _produce(c) == TAF
        acls.grant(T.TOPIC, TOPIC, Op.WRITE, WITHOUT)
        deadline = time.monotonic() + 1.0
        while _produce(c) != 0:
            assert time.monotonic() < deadline, "ACL not applied within 1 s"
        assert _produce(c) == 0             # (the partition's native slot may arm on this one)
        port = int(cluster.overrides["kbroker.metrics.port"])
        before = counts(port)
        for _ in range(20):                 # the native path, on the connection's kept decision
            assert _produce(c) == 0
        assert counts(port).get("fast", 0) - before.get("fast", 0) == 20
        acls.revoke(T.TOPIC, TOPIC, Op.WRITE, WITHOUT)
        deadline = time.monotonic() + 1.0
        while _produce(c) != TAF:
            assert time.monotonic() < deadline, "revoked ACL not applied within 1 s"


def test_deny_wins_for_the_granted_host(cluster):
    acls = cluster.acls
    acls.grant(T.TOPIC, TOPIC, Op.READ, WITH, permission=Permission.DENY)
    try:
        wait_until(lambda: _code_of(cluster.bootstrap, WITH, _fetch) == TAF, 5)
        assert _code_of(cluster.bootstrap, WITH, _produce) == 0
    finally:
        acls.revoke(T.TOPIC, TOPIC, Op.READ, WITH, permission=Permission.DENY)
    wait_until(lambda: _code_of(cluster.bootstrap, WITH, _fetch) == 0, 5)
