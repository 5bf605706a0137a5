"""Every version Kafka 3.9 serves of the group and admin APIs, sent through our codec over a real
socket to a real broker: old clients (ZooKeeper-era) send v0/v1, new ones flexible versions. Also a
kafka-python consumer group pinned to an old broker version that commits and resumes at its commit."""
import time

import pytest

from kbroker.protocol.api import ApiKey
from kbroker.protocol.errors import Errors
from kbroker.server import apis
from kbroker.testing import LocalCluster, wait_until

from checkers import RawConn, create_topic

K = ApiKey
ZERO_ID = bytes(16)
DYNAMIC_TOPIC_CONFIG = 1   # DescribeConfigs config_source of a topic override


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("old-versions"), brokers=1,
                      overrides={"offsets.topic.num.partitions": 1, "group.initial.rebalance.delay.ms": 0,
                                 "offsets.retention.check.interval.ms": 300}) as c:
        with RawConn(c.bootstrap) as raw:
            _wait_coordinator(raw)
            _wait_loaded(raw)
        create_topic(c.bootstrap, "old-t", 2)
        yield c


def _wait_coordinator(raw, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        r = raw.request(K.FIND_COORDINATOR, 0, {"key": "any"})
        if r["error_code"] == 0:
            return r
        assert r["error_code"] == Errors.COORDINATOR_NOT_AVAILABLE, r
        assert time.monotonic() < deadline, r
        time.sleep(0.1)


def _wait_loaded(raw, timeout=30.0):
    """Until the coordinator has loaded its __consumer_offsets partition (clients retry meanwhile)."""
    deadline = time.monotonic() + timeout
    while True:
        r = raw.request(K.OFFSET_FETCH, 2, {"group_id": "probe", "topics": None})
        if r["error_code"] == 0:
            return
        assert r["error_code"] in (Errors.COORDINATOR_LOAD_IN_PROGRESS, Errors.NOT_COORDINATOR), r
        assert time.monotonic() < deadline, r
        time.sleep(0.1)


def _range(key):
    return next((row.min_version, row.max_version) for row in apis.TABLE if row.key == key)


def test_group_and_admin_ranges_are_kafka_39s():
    assert {k: _range(k) for k in (K.OFFSET_COMMIT, K.OFFSET_FETCH, K.FIND_COORDINATOR, K.JOIN_GROUP,
                                   K.SYNC_GROUP, K.HEARTBEAT, K.LEAVE_GROUP, K.DESCRIBE_GROUPS, K.LIST_GROUPS,
                                   K.CREATE_TOPICS, K.DELETE_TOPICS, K.CREATE_PARTITIONS, K.DELETE_GROUPS)} == {
        K.OFFSET_COMMIT: (0, 9), K.OFFSET_FETCH: (0, 9), K.FIND_COORDINATOR: (0, 6), K.JOIN_GROUP: (0, 9),
        K.SYNC_GROUP: (0, 5), K.HEARTBEAT: (0, 4), K.LEAVE_GROUP: (0, 5), K.DESCRIBE_GROUPS: (0, 5),
        K.LIST_GROUPS: (0, 5), K.CREATE_TOPICS: (0, 7), K.DELETE_TOPICS: (0, 6), K.CREATE_PARTITIONS: (0, 3),
        K.DELETE_GROUPS: (0, 2)}


@pytest.mark.parametrize("version", range(7))
def test_find_coordinator(cluster, version):
    port = cluster.brokers[0].port
    with RawConn(cluster.bootstrap) as raw:
        if version < 4:
            r = raw.request(K.FIND_COORDINATOR, version, {"key": "g1", "key_type": 0})
            assert (r["error_code"], r["node_id"], r["port"]) == (0, 0, port)
            # a transactional id (v1+): the leader of its __transaction_state partition, created on first use
            if version >= 1:
                wait_until(lambda: raw.request(K.FIND_COORDINATOR, version, {"key": "tx", "key_type": 1})
                           ["error_code"] == 0, 30, "transaction coordinator")
                r = raw.request(K.FIND_COORDINATOR, version, {"key": "tx", "key_type": 1})
                assert (r["node_id"], r["port"]) == (0, port)
        else:
            r = raw.request(K.FIND_COORDINATOR, version, {"key_type": 0, "coordinator_keys": ["g1", "g2", "g3"]})
            assert [(c["key"], c["error_code"], c["node_id"], c["port"]) for c in r["coordinators"]] == [
                ("g1", 0, 0, port), ("g2", 0, 0, port), ("g3", 0, 0, port)]


PROTOCOLS = [{"name": "range", "metadata": b"sub"}]


def _join(raw, version, group, member_id="", instance_id=None):
    body = {"group_id": group, "session_timeout_ms": 10000, "rebalance_timeout_ms": 10000,
            "member_id": member_id, "group_instance_id": instance_id, "protocol_type": "consumer",
            "protocols": PROTOCOLS, "reason": "test"}
    return raw.request(K.JOIN_GROUP, version, body, timeout=30)


def test_a_member_between_its_two_joins_outlives_the_expiry_check(cluster):
    """KIP-394: a new group whose only member holds the id from its first JoinGroup has no members and no
    offsets yet; the offsets-expiry check (every 300 ms here) must not drop it before the second join."""
    with RawConn(cluster.bootstrap) as raw:
        r = _join(raw, 4, "between-joins")
        assert r["error_code"] == Errors.MEMBER_ID_REQUIRED and r["member_id"]
        time.sleep(1.5)             # the condition is time itself: five expiry checks run meanwhile
        r = _join(raw, 4, "between-joins", r["member_id"])
        assert r["error_code"] == 0, r


@pytest.mark.parametrize("version", range(10))
def test_group_lifecycle(cluster, version):
    """JoinGroup v<version> then SyncGroup, Heartbeat and LeaveGroup at the matching versions (their
    own maxima past theirs), so each version of each is sent once at least."""
    group = f"life-{version}"
    sync_v, hb_v, leave_v = min(version, 5), min(version, 4), min(version, 5)
    with RawConn(cluster.bootstrap) as raw:
        r = _join(raw, version, group)
        if version >= 4:   # KIP-394: the first join of an unknown member is sent back with its id
            assert r["error_code"] == Errors.MEMBER_ID_REQUIRED and r["member_id"]
            r = _join(raw, version, group, r["member_id"])
        assert r["error_code"] == 0, r
        me = r["member_id"]
        assert (r["generation_id"], r["leader"], r["protocol_name"]) == (1, me, "range")
        assert [m["member_id"] for m in r["members"]] == [me]
        if version >= 7:
            assert r["protocol_type"] == "consumer"
        if version >= 9:
            assert r["skip_assignment"] is False
        s = raw.request(K.SYNC_GROUP, sync_v, {
            "group_id": group, "generation_id": 1, "member_id": me, "protocol_type": "consumer",
            "protocol_name": "range", "assignments": [{"member_id": me, "assignment": b"mine"}]}, timeout=30)
        assert (s["error_code"], s["assignment"]) == (0, b"mine")
        if sync_v >= 5:
            assert (s["protocol_type"], s["protocol_name"]) == ("consumer", "range")
        h = raw.request(K.HEARTBEAT, hb_v, {"group_id": group, "generation_id": 1, "member_id": me})
        assert h["error_code"] == 0
        h = raw.request(K.HEARTBEAT, hb_v, {"group_id": group, "generation_id": 7, "member_id": me})
        assert h["error_code"] == Errors.ILLEGAL_GENERATION
        if leave_v < 3:
            lv = raw.request(K.LEAVE_GROUP, leave_v, {"group_id": group, "member_id": me})
            assert lv["error_code"] == 0
        else:
            lv = raw.request(K.LEAVE_GROUP, leave_v, {"group_id": group, "members": [
                {"member_id": me, "reason": "done"}, {"member_id": "stranger"}]})
            assert lv["error_code"] == 0
            assert [(m["member_id"], m["error_code"]) for m in lv["members"]] == [
                (me, 0), ("stranger", Errors.UNKNOWN_MEMBER_ID)]
        d = raw.request(K.DESCRIBE_GROUPS, min(version, 5), {"groups": [group]})
        # The member is gone: the group is Empty, or already Dead when this fixture's 300 ms expiry
        # check ran in between (an empty group that holds no offsets is removed, as Kafka removes it).
        g = d["groups"][0]
        assert (g["error_code"], g["members"]) == (0, []) and g["group_state"] in ("Empty", "Dead"), g


def test_static_member_join_v5(cluster):
    with RawConn(cluster.bootstrap) as raw:
        r = _join(raw, 5, "static-5", instance_id="inst-1")
        assert r["error_code"] == 0, r
        assert r["members"][0]["group_instance_id"] == "inst-1"


def _commit_body(version, group, offset, *, retention=-1, commit_ts=-1, generation=-1, member=""):
    return {"group_id": group, "generation_id_or_member_epoch": generation, "member_id": member,
            "retention_time_ms": retention, "topics": [{"name": "old-t", "partitions": [
                {"partition_index": 0, "committed_offset": offset, "commit_timestamp": commit_ts,
                 "committed_metadata": f"m{version}"},
                {"partition_index": 1, "committed_offset": offset + 1, "commit_timestamp": commit_ts,
                 "committed_metadata": None}]}]}


def _fetch(raw, version, group, partitions=(0, 1)):
    """-> {partition: (offset, metadata, error)} of ``group`` on old-t, asked at ``version``."""
    topics = [{"name": "old-t", "partition_indexes": list(partitions)}]
    if version >= 8:
        r = raw.request(K.OFFSET_FETCH, version, {"groups": [{"group_id": group, "topics": topics}]})
        assert [g["group_id"] for g in r["groups"]] == [group]
        assert r["groups"][0]["error_code"] == 0
        got = r["groups"][0]["topics"]
    else:
        r = raw.request(K.OFFSET_FETCH, version, {"group_id": group, "topics": topics})
        if version >= 2:
            assert r["error_code"] == 0
        got = r["topics"]
    return {p["partition_index"]: (p["committed_offset"], p["metadata"], p["error_code"])
            for t in got for p in t["partitions"]}


@pytest.mark.parametrize("version", range(10))
def test_offset_commit_then_fetch_every_version(cluster, version):
    group = f"commit-{version}"
    with RawConn(cluster.bootstrap) as raw:
        r = raw.request(K.OFFSET_COMMIT, version, _commit_body(version, group, 10 * version + 5,
                                                               retention=3_600_000 if 2 <= version <= 4 else -1))
        assert [(p["partition_index"], p["error_code"]) for t in r["topics"] for p in t["partitions"]] == [
            (0, 0), (1, 0)]
        for fetch_v in range(10):
            assert _fetch(raw, fetch_v, group) == {
                0: (10 * version + 5, f"m{version}", 0), 1: (10 * version + 6, "", 0)}, fetch_v


def test_offset_commit_unknown_partition_and_generation(cluster):
    with RawConn(cluster.bootstrap) as raw:
        body = _commit_body(0, "bad-commit", 1)
        body["topics"][0]["partitions"][1]["partition_index"] = 9
        r = raw.request(K.OFFSET_COMMIT, 0, body)
        assert [p["error_code"] for p in r["topics"][0]["partitions"]] == [0, Errors.UNKNOWN_TOPIC_OR_PARTITION]
        # v1+ with a generation of a group that does not exist
        r = raw.request(K.OFFSET_COMMIT, 1, _commit_body(1, "no-such-group", 1, generation=3, member="m"))
        assert {p["error_code"] for p in r["topics"][0]["partitions"]} == {Errors.ILLEGAL_GENERATION}


def test_group_commits_v0_v1_fetched_at_v1_and_v8(cluster):
    """A group that commits at v0 and v1 reads its commits back at v1 and, batched with another group
    and asking for all partitions (topics null), at v8."""
    with RawConn(cluster.bootstrap) as raw:
        raw.request(K.OFFSET_COMMIT, 0, _commit_body(0, "old-a", 100))
        raw.request(K.OFFSET_COMMIT, 1, _commit_body(1, "old-b", 200))
        assert _fetch(raw, 1, "old-a") == {0: (100, "m0", 0), 1: (101, "", 0)}
        assert _fetch(raw, 1, "old-b") == {0: (200, "m1", 0), 1: (201, "", 0)}
        assert _fetch(raw, 1, "old-a", partitions=(0, 1)) == _fetch(raw, 0, "old-a")
        r = raw.request(K.OFFSET_FETCH, 8, {"groups": [{"group_id": "old-a", "topics": None},
                                                       {"group_id": "old-b", "topics": None},
                                                       {"group_id": "never-committed", "topics": None}]})
        got = {g["group_id"]: (g["error_code"], sorted((t["name"], p["partition_index"], p["committed_offset"])
                                                       for t in g["topics"] for p in t["partitions"]))
               for g in r["groups"]}
        assert got == {"old-a": (0, [("old-t", 0, 100), ("old-t", 1, 101)]),
                       "old-b": (0, [("old-t", 0, 200), ("old-t", 1, 201)]),
                       "never-committed": (0, [])}


def test_commit_retention_and_timestamp_decide_expiry(cluster):
    """v2 retention_time_ms fixes the offset's expiry; v1's commit timestamp is the commit time the
    broker's retention counts from (ancient: expired at the next check); neither given: kept."""
    with RawConn(cluster.bootstrap) as raw:
        raw.request(K.OFFSET_COMMIT, 2, _commit_body(2, "short-lived", 7, retention=1))
        raw.request(K.OFFSET_COMMIT, 1, _commit_body(1, "ancient", 8, commit_ts=1))
        raw.request(K.OFFSET_COMMIT, 2, _commit_body(2, "kept", 9))
        raw.request(K.OFFSET_COMMIT, 1, _commit_body(1, "kept-v1", 10))
        deadline = time.monotonic() + 30
        while True:
            gone = [g for g in ("short-lived", "ancient") if _fetch(raw, 1, g)[0][0] == -1]
            if len(gone) == 2:
                break
            assert time.monotonic() < deadline, gone
            time.sleep(0.2)
        assert _fetch(raw, 1, "kept")[0][0] == 9
        assert _fetch(raw, 1, "kept-v1")[0][0] == 10


@pytest.mark.parametrize("version", range(6))
def test_list_groups(cluster, version):
    with RawConn(cluster.bootstrap) as raw:
        raw.request(K.OFFSET_COMMIT, 2, _commit_body(2, "listed", 1))
        r = raw.request(K.LIST_GROUPS, version, {"states_filter": [], "types_filter": []})
        assert r["error_code"] == 0
        assert "listed" in {g["group_id"] for g in r["groups"]}
        if version >= 5:
            assert {g["group_type"] for g in r["groups"]} == {"classic"}
            r = raw.request(K.LIST_GROUPS, version, {"types_filter": ["consumer"]})
            assert (r["error_code"], r["groups"]) == (0, [])
            r = raw.request(K.LIST_GROUPS, version, {"types_filter": ["Classic"]})
            assert "listed" in {g["group_id"] for g in r["groups"]}


@pytest.mark.parametrize("version", range(3))
def test_delete_groups(cluster, version):
    group = f"deleted-{version}"
    with RawConn(cluster.bootstrap) as raw:
        raw.request(K.OFFSET_COMMIT, 3, _commit_body(3, group, 1))
        r = raw.request(K.DELETE_GROUPS, version, {"groups_names": [group, f"absent-{version}"]})
        assert [(x["group_id"], x["error_code"]) for x in r["results"]] == [
            (group, 0), (f"absent-{version}", Errors.GROUP_ID_NOT_FOUND)]


def _create(raw, version, name, partitions=1, configs=(("retention.ms", "1000000"),), validate_only=False):
    return raw.request(K.CREATE_TOPICS, version, {
        "topics": [{"name": name, "num_partitions": partitions, "replication_factor": 1, "assignments": [],
                    "configs": [{"name": k, "value": v} for k, v in configs]}],
        "timeout_ms": 20000, "validate_only": validate_only}, timeout=30)["topics"][0]


@pytest.mark.parametrize("version", range(8))
def test_create_topics(cluster, version):
    name = f"created-{version}"
    with RawConn(cluster.bootstrap) as raw:
        if version >= 1:
            v = _create(raw, version, name, partitions=3, validate_only=True)
            assert v["error_code"] == 0
            if version >= 5:
                assert (v["num_partitions"], v["replication_factor"]) == (3, 1)
            if version >= 7:
                assert v["topic_id"] == ZERO_ID   # nothing was created
        t = _create(raw, version, name, partitions=2)
        assert (t["name"], t["error_code"]) == (name, 0), t
        if version >= 5:
            assert (t["num_partitions"], t["replication_factor"]) == (2, 1)
            configs = {c["name"]: (c["value"], c["config_source"]) for c in t["configs"]}
            assert configs["retention.ms"] == ("1000000", DYNAMIC_TOPIC_CONFIG)
            assert "cleanup.policy" in configs
        if version >= 7:
            assert t["topic_id"] != ZERO_ID
        again = _create(raw, version, name)
        assert again["error_code"] == Errors.TOPIC_ALREADY_EXISTS
        if version >= 5:
            assert (again["num_partitions"], again["replication_factor"], again["configs"]) == (-1, -1, None)


@pytest.mark.parametrize("version", range(7))
def test_delete_topics(cluster, version):
    name = f"doomed-{version}"
    with RawConn(cluster.bootstrap) as raw:
        created = _create(raw, 7, name)
        assert created["error_code"] == 0
        if version < 6:
            r = raw.request(K.DELETE_TOPICS, version, {"topic_names": [name, "never-was"], "timeout_ms": 20000},
                            timeout=30)
            assert [(x["name"], x["error_code"]) for x in r["responses"]] == [
                (name, 0), ("never-was", Errors.UNKNOWN_TOPIC_OR_PARTITION)]
        else:
            tid, unknown = created["topic_id"], b"\x01" * 16
            r = raw.request(K.DELETE_TOPICS, version, {"topics": [
                {"name": None, "topic_id": tid}, {"name": None, "topic_id": unknown},
                {"name": "never-was", "topic_id": ZERO_ID}], "timeout_ms": 20000}, timeout=30)
            got = {(x["name"], x["topic_id"]): x["error_code"] for x in r["responses"]}
            assert got == {(name, tid): 0, (None, unknown): Errors.UNKNOWN_TOPIC_ID,
                           ("never-was", ZERO_ID): Errors.UNKNOWN_TOPIC_OR_PARTITION}
        m = raw.request(K.METADATA, 4, {"topics": [{"name": name}], "allow_auto_topic_creation": False})
        assert m["topics"][0]["error_code"] == Errors.UNKNOWN_TOPIC_OR_PARTITION


@pytest.mark.parametrize("version", range(4))
def test_create_partitions(cluster, version):
    name = f"grown-{version}"
    with RawConn(cluster.bootstrap) as raw:
        assert _create(raw, 4, name)["error_code"] == 0
        r = raw.request(K.CREATE_PARTITIONS, version, {"topics": [{"name": name, "count": 3, "assignments": None}],
                                                       "timeout_ms": 20000, "validate_only": False}, timeout=30)
        assert [(x["name"], x["error_code"]) for x in r["results"]] == [(name, 0)]


def test_kafka_python_old_api_version_group_resumes_at_commit(cluster):
    """kafka-python pinned to broker version 0.11 (the oldest whose Fetch, v5, we serve: 0.10.x
    consumers fetch at v3) runs a group: FindCoordinator v1, JoinGroup v2, SyncGroup/Heartbeat/
    LeaveGroup v1, OffsetCommit/OffsetFetch v3. A restarted member resumes at the commit."""
    from kafka import KafkaConsumer, KafkaProducer

    topic = "old-kp"
    create_topic(cluster.bootstrap, topic, 1)
    producer = KafkaProducer(bootstrap_servers=cluster.bootstrap, api_version=(0, 11))
    try:
        for i in range(10):
            producer.send(topic, f"v{i}".encode(), partition=0)
        producer.flush(30)
    finally:
        producer.close()

    def consumer():
        return KafkaConsumer(topic, bootstrap_servers=cluster.bootstrap, group_id="old-kp-group",
                             api_version=(0, 11), enable_auto_commit=False, auto_offset_reset="earliest",
                             session_timeout_ms=10000, consumer_timeout_ms=20000)

    def take(c, n):
        got = []
        deadline = time.monotonic() + 60
        while len(got) < n and time.monotonic() < deadline:
            for recs in c.poll(timeout_ms=1000, max_records=n - len(got)).values():
                got += [r.value for r in recs]
        return got

    c = consumer()
    try:
        assert take(c, 4) == [b"v0", b"v1", b"v2", b"v3"]
        c.commit()
    finally:
        c.close(autocommit=False)
    c = consumer()
    try:
        assert take(c, 6) == [f"v{i}".encode() for i in range(4, 10)]
    finally:
        c.close(autocommit=False)
    with RawConn(cluster.bootstrap) as raw:
        r = raw.request(K.OFFSET_FETCH, 0, {"group_id": "old-kp-group",
                                            "topics": [{"name": topic, "partition_indexes": [0]}]})
        assert r["topics"][0]["partitions"][0]["committed_offset"] == 4


def test_offset_value_with_expiry_is_written_as_v1():
    """A commit with its own retention is stored as offset value v1 (the version with an expire
    timestamp); without, as v3 (the leader epoch kept)."""
    from kbroker.coordinator import records as R

    with_expiry = R.offset_value(R.OffsetValue(42, 5, "md", 1000, 5000))
    assert with_expiry[:2] == b"\x00\x01"
    assert R.decode_offset_value(with_expiry) == R.OffsetValue(42, -1, "md", 1000, 5000)
    plain = R.offset_value(R.OffsetValue(42, 5, "md", 1000))
    assert plain[:2] == b"\x00\x03"
    assert R.decode_offset_value(plain) == R.OffsetValue(42, 5, "md", 1000, -1)
