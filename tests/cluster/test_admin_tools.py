"""Operator admin APIs and tools against a real 3-broker cluster (real ZooKeeper, ``kbroker serve``
processes), driven by confluent-kafka's and kafka-python's admin clients, our own client, and the
``kbroker`` CLI, whose output is compared with the Kafka tools' formats (written out in each test).

One cluster for the module; each test uses its own topics.
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic
from kafka import TopicPartition as KpTopicPartition
from kafka.admin import KafkaAdminClient
from kazoo.client import KazooClient

from kbroker.client.admin import Admin
from kbroker.client.admin import NewTopic as NewKbTopic
from kbroker.client.group import GroupClient
from kbroker.protocol import api
from kbroker.protocol.errors import Errors
from kbroker.testing import LocalCluster, controller_known, wait_until
from kbroker.zk import layout as L

TIMEOUT_S = 30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("admin-tools"), brokers=3)
    for b in c.brokers.values():
        b.extra["broker.rack"] = f"rack-{b.broker_id}"
    with c:
        yield c


def _topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _create(cluster, name: str, partitions: int = 1, rf: int = 3, config: dict | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(name, partitions, rf, config=config or {})])[name].result(TIMEOUT_S)


def _produce(cluster, name: str, count: int, partition: int = 0) -> None:
    p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": False,
                  "linger.ms": 0})
    failed = []
    for i in range(count):
        p.produce(name, value=f"v{i}".encode(), partition=partition,
                  on_delivery=lambda err, msg: err is not None and failed.append(err))
        p.flush(TIMEOUT_S)    # one batch per record: offsets 0..count-1 in as many batches
    assert p.flush(TIMEOUT_S) == 0 and not failed, failed


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kbroker", *args], capture_output=True, text=True,
                          timeout=120)


async def _with_admin(cluster, fn):
    async with Admin(cluster.bootstrap) as admin:
        return await fn(admin)


def _leader_and_follower(cluster, name: str, partition: int = 0) -> tuple[int, int]:
    async def look(admin):
        desc = await admin.describe_topics([name])
        pm = desc[name].partitions[partition]
        return pm.leader, next(r for r in pm.replicas if r != pm.leader)
    return asyncio.run(_with_admin(cluster, look))


def _first_offset(cluster, name: str, partition: int = 0) -> int:
    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        # From the beginning, not from a committed offset: no group coordinator involved (the
        # __consumer_offsets partitions of a stopped broker have no other replica here).
        c.assign([TopicPartition(name, partition, OFFSET_BEGINNING)])
        msg = wait_until(lambda: (m := c.poll(0.5)) is not None and m.error() is None and m, TIMEOUT_S,
                         "a record from the beginning")
        return msg.offset()
    finally:
        c.close()


# ---- DeleteRecords (21) -----------------------------------------------------------------------------

def test_delete_records_moves_the_log_start_everywhere(cluster):
    name = _topic("dr")
    _create(cluster, name)
    _produce(cluster, name, 10)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    fut = admin.delete_records([TopicPartition(name, 0, 3)], request_timeout=TIMEOUT_S)
    deleted = fut[TopicPartition(name, 0, 3)].result(TIMEOUT_S)
    assert deleted.low_watermark == 3

    # Consumers start at the new log start; ListOffsets EARLIEST names it.
    assert _first_offset(cluster, name) == 3
    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "wm"})
    try:
        assert c.get_watermark_offsets(TopicPartition(name, 0), timeout=TIMEOUT_S) == (3, 10)
    finally:
        c.close()

    leader, follower = _leader_and_follower(cluster, name)
    # Durable on the leader before the answer: the checkpoint file already holds it.
    lines = (cluster.brokers[leader].data_dir / "log-start-offset-checkpoint").read_text().splitlines()
    assert f"{name} 0 3" in lines

    # A fetch below the log start is out of range.
    async def fetch_at(admin, offset):
        conn = await admin.cluster.connection(leader)
        _, resp = await conn.send(1, {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20,
                                      "isolation_level": 0, "session_id": 0, "session_epoch": -1,
                                      "topics": [{"topic": name, "partitions": [{
                                          "partition": 0, "current_leader_epoch": -1, "fetch_offset": offset,
                                          "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
                                      "forgotten_topics_data": [], "rack_id": ""}, 11)
        p = resp["responses"][0]["partitions"][0]
        return p["error_code"], p["log_start_offset"]
    assert asyncio.run(_with_admin(cluster, lambda a: fetch_at(a, 2))) == (Errors.OFFSET_OUT_OF_RANGE, 3)
    assert asyncio.run(_with_admin(cluster, lambda a: fetch_at(a, 3))) == (0, 3)

    # Followers learn the log start from their fetch answers: once an acks=all record is in, every
    # follower has applied an answer sent after the deletion. Then the leader goes: the new leader
    # (a former follower) still starts at 3.
    _produce(cluster, name, 1)
    cluster.stop_broker(leader)
    try:
        def new_leader():
            new, _ = _leader_and_follower(cluster, name)
            return new not in (leader, -1)
        wait_until(new_leader, TIMEOUT_S, "a new leader")
        assert _first_offset(cluster, name) == 3
    finally:
        cluster.start_broker(leader)


def test_offset_for_timestamp_skips_records_below_the_log_start(tmp_path):
    from kafka.record.default_records import DefaultRecordBatchBuilder
    from kbroker.log import Log, LogConfig
    t0 = 1_700_000_000_000
    lg = Log(str(tmp_path / "t-0"), "t", 0, LogConfig({"index.interval.bytes": 100}))
    try:
        for i in range(6):      # batch i: offsets 2i, 2i+1 at t0 + 10i, t0 + 10i + 1
            b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                          producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
            for j in range(2):
                b.append(j, timestamp=t0 + 10 * i + j, key=b"k", value=b"v" * 100, headers=[])
            lg.append_as_leader(memoryview(bytearray(b.build())), 0, t0)
        lg.high_watermark = lg.log_end_offset
        assert lg.offset_for_timestamp(0) == (0, t0)
        lg.delete_records(5)    # inside batch 2: offsets 0-4 are gone
        assert lg.offset_for_timestamp(0) == (5, t0 + 21)
        assert lg.offset_for_timestamp(t0 + 10) == (5, t0 + 21)
        assert lg.offset_for_timestamp(t0 + 30) == (6, t0 + 30)
        lg.delete_records(12)
        assert lg.offset_for_timestamp(0) is None
    finally:
        lg.close()


def test_delete_records_high_watermark_and_errors(cluster):
    name, compacted = _topic("drhw"), _topic("drc")
    _create(cluster, name)
    _create(cluster, compacted, config={"cleanup.policy": "compact"})
    _produce(cluster, name, 5)
    leader, follower = _leader_and_follower(cluster, name)

    async def go(admin):
        # -1 means the high watermark; offsets beyond it are refused.
        got = await admin.delete_records({(name, 0): -1})
        beyond = await admin.delete_records({(name, 0): 6})
        policy = await admin.delete_records({(compacted, 0): 0})
        negative = await admin.delete_records({(name, 0): -2})
        # Sent straight to brokers: a follower and an unknown partition.
        body = {"topics": [{"name": name, "partitions": [{"partition_index": 0, "offset": 5}]},
                           {"name": "no-such-topic", "partitions": [{"partition_index": 0, "offset": 0}]}],
                "timeout_ms": 1000}
        _, resp = await (await admin.cluster.connection(follower)).send(21, body)
        raw = {(t["name"], r["partition_index"]): (r["error_code"], r["low_watermark"])
               for t in resp["topics"] for r in t["partitions"]}
        return got, beyond, policy, negative, raw

    got, beyond, policy, negative, raw = asyncio.run(_with_admin(cluster, go))
    assert got == {(name, 0): 5}
    assert beyond[(name, 0)].code == Errors.OFFSET_OUT_OF_RANGE
    assert policy[(compacted, 0)].code == Errors.POLICY_VIOLATION
    assert negative[(name, 0)].code == Errors.OFFSET_OUT_OF_RANGE
    assert raw == {(name, 0): (Errors.NOT_LEADER_OR_FOLLOWER, -1),
                   ("no-such-topic", 0): (Errors.UNKNOWN_TOPIC_OR_PARTITION, -1)}


def test_delete_records_cli_output(cluster, tmp_path):
    name = _topic("drcli")
    _create(cluster, name, partitions=2)
    _produce(cluster, name, 4, partition=0)
    _produce(cluster, name, 2, partition=1)
    spec = tmp_path / "offsets.json"
    spec.write_text(json.dumps({"partitions": [{"topic": name, "partition": 0, "offset": 2},
                                               {"topic": name, "partition": 1, "offset": 7}], "version": 1}))
    r = _cli("delete-records", "--bootstrap-server", cluster.bootstrap, "--offset-json-file", str(spec))
    assert r.returncode == 0, r.stderr
    # kafka-delete-records.sh: two header lines, then one line per partition, tab-separated.
    lines = r.stdout.splitlines()
    assert lines[:2] == ["Executing records delete operation", "Records delete operation completed:"]
    assert sorted(lines[2:]) == [
        f"partition: {name}-0\tlow_watermark: 2",
        f"partition: {name}-1\terror: org.apache.kafka.common.errors.OffsetOutOfRangeException: "
        "The requested offset is not within the range of offsets maintained by the server.",
    ]

    spec.write_text(json.dumps({"partitions": [{"topic": name, "partition": 0, "offset": 1},
                                               {"topic": name, "partition": 0, "offset": 2}], "version": 1}))
    r = _cli("delete-records", "--bootstrap-server", cluster.bootstrap, "--offset-json-file", str(spec))
    assert r.returncode == 1
    assert f"Offset json file contains duplicate topic partitions: {name}-0" in r.stderr


# ---- DescribeCluster (60) ---------------------------------------------------------------------------

def _cluster_id(cluster) -> str:
    zk = KazooClient(hosts=cluster.zk_connect)
    zk.start(timeout=10)
    try:
        return json.loads(zk.get("/cluster/id")[0])["id"]
    finally:
        zk.stop()
        zk.close()


def test_describe_cluster(cluster):
    expected_nodes = [(b.broker_id, "127.0.0.1", b.port, f"rack-{b.broker_id}") for b in cluster.brokers.values()]
    controller = controller_known(cluster.brokers[0].port)
    # kafka-python sends DescribeCluster (60) itself.
    kp = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=TIMEOUT_S * 1000)
    try:
        got = kp.describe_cluster()
    finally:
        kp.close()
    assert got["cluster_id"] == _cluster_id(cluster)
    assert got["controller_id"] == controller
    assert sorted((b["broker_id"], b["host"], b["port"], b["rack"]) for b in got["brokers"]) == expected_nodes
    # No authorizer: every operation Kafka defines on the cluster resource.
    assert set(got["authorized_operations"]) == {
        "CREATE", "ALTER", "DESCRIBE", "CLUSTER_ACTION", "DESCRIBE_CONFIGS", "ALTER_CONFIGS", "IDEMPOTENT_WRITE"}

    # confluent-kafka's describe_cluster reads the same facts through Metadata (librdkafka does not
    # send DescribeCluster); both must agree.
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    desc = admin.describe_cluster(request_timeout=TIMEOUT_S).result(TIMEOUT_S)
    assert (desc.cluster_id, desc.controller.id) == (got["cluster_id"], controller)
    assert sorted((n.id, n.host, n.port, n.rack) for n in desc.nodes) == expected_nodes


def test_describe_cluster_endpoint_types(cluster):
    async def ask(admin, version, endpoint_type):
        conn = await admin.cluster.any_connection()
        _, resp = await conn.send(60, {"include_cluster_authorized_operations": False,
                                       "endpoint_type": endpoint_type}, version)
        return resp["error_code"], resp["error_message"], len(resp["brokers"])
    brokers = asyncio.run(_with_admin(cluster, lambda a: ask(a, 1, 1)))
    controllers = asyncio.run(_with_admin(cluster, lambda a: ask(a, 1, 2)))
    unknown = asyncio.run(_with_admin(cluster, lambda a: ask(a, 1, 7)))
    assert brokers == (0, None, 3)
    assert controllers == (Errors.MISMATCHED_ENDPOINT_TYPE, "The request was sent to an endpoint of type "
                           "CONTROLLER, but we wanted an endpoint of type BROKER", 0)
    assert unknown == (Errors.UNSUPPORTED_ENDPOINT_TYPE, "Unsupported endpoint type 7", 0)


# ---- DescribeLogDirs (35) ---------------------------------------------------------------------------

def test_describe_log_dirs_with_kafka_python(cluster):
    name = _topic("ld")
    _create(cluster, name, partitions=2)
    _produce(cluster, name, 3, partition=1)
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=TIMEOUT_S * 1000)
    try:
        everything = admin.describe_log_dirs()
        only = admin.describe_log_dirs({name: [1]}, brokers=[0])
    finally:
        admin.close()
    assert sorted(r["broker"] for r in everything) == [0, 1, 2]
    for r in everything:
        b = cluster.brokers[r["broker"]]
        (d,) = r["log_dirs"]
        assert d["error_code"] == 0 and d["log_dir"] == str(b.data_dir)
        assert 0 < d["usable_bytes"] <= d["total_bytes"]
        mine = {p["partition_index"]: p for t in d["topics"] if t["name"] == name for p in t["partitions"]}
        assert sorted(mine) == [0, 1]      # RF=3 on 3 brokers: every broker holds both
        on_disk = sum(f.stat().st_size for f in (b.data_dir / f"{name}-1").glob("*.log"))
        assert on_disk > 0
        wait_until(lambda: mine[1]["partition_size"] == on_disk or None, 1, "size of the log files")
        assert mine[0]["partition_size"] == 0
        assert all(p["offset_lag"] == 0 and p["is_future_key"] is False for p in mine.values())
    (d,) = only[0]["log_dirs"]
    assert [(t["name"], [p["partition_index"] for p in t["partitions"]]) for t in d["topics"]] == [(name, [1])]


def test_log_dirs_cli_output(cluster):
    name = _topic("ldcli")
    _create(cluster, name, partitions=3)
    _produce(cluster, name, 2, partition=2)
    r = _cli("log-dirs", "--bootstrap-server", cluster.bootstrap, "--describe", "--topic-list", name,
             "--broker-list", "2,0")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    # kafka-log-dirs.sh: two lines, then one compact JSON document whose keys come in the Java tool's
    # HashMap order: brokers before version, partitions/error/logDir, partition/size/offsetLag/isFuture.
    assert lines[:2] == ["Querying brokers for log directories information",
                         "Received log directory information from brokers 0,2"]
    assert len(lines) == 3
    doc = json.loads(lines[2])
    assert list(doc) == ["brokers", "version"] and doc["version"] == 1
    assert [b["broker"] for b in doc["brokers"]] == [0, 2]
    for b in doc["brokers"]:
        assert list(b) == ["broker", "logDirs"]
        (d,) = b["logDirs"]
        assert list(d) == ["partitions", "error", "logDir"]
        assert d["error"] is None and d["logDir"] == str(cluster.brokers[b["broker"]].data_dir)
        assert all(list(p) == ["partition", "size", "offsetLag", "isFuture"] for p in d["partitions"])
        # Only the listed topic, in the order of Java's HashMap of TopicPartition (buckets of a
        # 16-slot table by TopicPartition.hashCode).
        assert sorted(p["partition"] for p in d["partitions"]) == [f"{name}-{i}" for i in range(3)]
        size = {p["partition"]: p["size"] for p in d["partitions"]}
        assert size[f"{name}-2"] > 0 and size[f"{name}-0"] == size[f"{name}-1"] == 0
    assert lines[2] == json.dumps(doc, separators=(",", ":"))

    r = _cli("log-dirs", "--bootstrap-server", cluster.bootstrap, "--describe", "--broker-list", "0,7")
    assert r.returncode == 0, r.stderr
    assert r.stdout == ("ERROR: The given brokers do not exist from --broker-list: 7. "
                        "Current existent brokers: 0,1,2\n")


def test_java_hashmap_order():
    # Orders a java.util.HashMap iterates in (String and TopicPartition hash codes, 16-slot table,
    # growing to 32 past 12 entries).
    from kbroker.cli.log_dirs import java_hashmap_order, java_string_hash, topic_partition_hash
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("\U0001F600") == 1772899           # two UTF-16 code units
    assert java_hashmap_order(["version", "brokers"], java_string_hash) == ["brokers", "version"]
    assert java_hashmap_order(["logDir", "error", "partitions"], java_string_hash) == ["partitions", "error", "logDir"]
    tps = [("t", p) for p in range(20)]
    # TopicPartition("t", p).hashCode() = 31 * (31 + p) + 116: buckets of a 32-slot table.
    expect = sorted(tps, key=lambda tp: ((31 * (31 + tp[1]) + 116) ^ 0) & 31)
    assert java_hashmap_order(tps, lambda tp: topic_partition_hash(*tp)) == expect


# ---- AlterPartitionReassignments (45) / ListPartitionReassignments (46) --------------------------------

def _assignment(cluster, name: str) -> tuple[list[int], dict, dict]:
    zk = KazooClient(hosts=cluster.zk_connect)
    zk.start(timeout=10)
    try:
        a = L.decode_topic(zk.get(L.topic_path(name))[0])
        rates = {b: L.decode_config(zk.get(L.broker_config_path(str(b)))[0])
                 if zk.exists(L.broker_config_path(str(b))) else {} for b in cluster.brokers}
        return a.partitions[0], a.adding_replicas, rates
    finally:
        zk.stop()
        zk.close()


def test_partition_reassignments_through_the_apis(cluster, tmp_path):
    name = _topic("ra")
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(name, 1, replica_assignment=[[0, 1]])])[name].result(TIMEOUT_S)
    p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 20})
    for i in range(3000):
        p.produce(name, value=b"x" * 1000, partition=0)
        if i % 500 == 0:
            p.poll(0)
    assert p.flush(TIMEOUT_S) == 0
    # Broker 2 copies the 3 MB at 50 kB/s at most: the move stays in progress for the whole test.
    fs = admin.incremental_alter_configs([
        ConfigResource("BROKER", "2", incremental_configs=[
            ConfigEntry("follower.replication.throttled.rate", "50000", incremental_operation=AlterConfigOpType.SET)]),
        ConfigResource("TOPIC", name, incremental_configs=[
            ConfigEntry("follower.replication.throttled.replicas", "0:2",
                        incremental_operation=AlterConfigOpType.SET)])])
    for f in fs.values():
        f.result(TIMEOUT_S)

    kp = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=TIMEOUT_S * 1000)
    try:
        tp = KpTopicPartition(name, 0)
        assert kp.alter_partition_reassignments({tp: [1, 2]}) == {tp: None}
        listed = kp.list_partition_reassignments()
        assert listed == {tp: {"replicas": [1, 2, 0], "adding_replicas": [2], "removing_replicas": [0]}}
        assert kp.list_partition_reassignments({name: [0]}) == listed
    finally:
        kp.close()
    assert _assignment(cluster, name)[:2] == ([1, 2, 0], {0: [2]})

    # kafka-reassign-partitions.sh --list
    r = _cli("reassign-partitions", "--bootstrap-server", cluster.bootstrap, "--list")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"Current partition reassignments:\n{name}-0: replicas: 1,2,0. adding: 2. removing: 0.\n"

    # Refusals, each as Kafka's ZooKeeper-mode controller words them.
    async def refusals(a):
        other = await a.alter_partition_reassignments({(name, 0): [], ("nope", 0): [0, 1]})
        dup = await a.alter_partition_reassignments({(name, 0): [1, 1]})
        dead = await a.alter_partition_reassignments({(name, 0): [1, 7]})
        idle = _topic("idle")
        await a.create_topics([NewKbTopic(idle, 1, 1)])
        cancel_idle = await a.alter_partition_reassignments({(idle, 0): None})
        # A broker that is not the controller refuses at the top level.
        ctl = a.cluster.controller_id
        conn = await a.cluster.connection(next(b for b in cluster.brokers if b != ctl))
        _, resp = await conn.send(46, {"timeout_ms": 1000, "topics": None})
        return other, dup, dead, cancel_idle, (resp["error_code"], resp["error_message"])
    other, dup, dead, cancel_idle, top = asyncio.run(_with_admin(cluster, refusals))
    assert other[(name, 0)].code == Errors.INVALID_REPLICA_ASSIGNMENT
    assert other[(name, 0)].message == "Empty replica list specified in partition reassignment."
    assert other[("nope", 0)].code == Errors.UNKNOWN_TOPIC_OR_PARTITION
    assert dup[(name, 0)].message == "Duplicate replica ids in partition reassignment replica list: List(1, 1)"
    assert dead[(name, 0)].message == ("Replica assignment has brokers that are not alive. Replica list: List(7), "
                                       "live broker list: Set(0, 1, 2)")
    assert [e.code for e in cancel_idle.values()] == [Errors.NO_REASSIGNMENT_IN_PROGRESS]
    assert top == (Errors.NOT_CONTROLLER, "This is not the correct controller for this cluster.")
    assert _assignment(cluster, name)[:2] == ([1, 2, 0], {0: [2]})      # the move goes on

    # kafka-reassign-partitions.sh --cancel: back to the original replicas, throttles removed.
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [{"topic": name, "partition": 0, "replicas": [1, 2]}]}))
    r = _cli("reassign-partitions", "--bootstrap-server", cluster.bootstrap, "--cancel",
             "--reassignment-json-file", str(plan))
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"Successfully cancelled partition reassignments for: {name}-0\n"
    wait_until(lambda: _assignment(cluster, name)[:2] == ([1, 0], {}), TIMEOUT_S, "the original replicas back")
    assert all("follower.replication.throttled.rate" not in c for c in _assignment(cluster, name)[2].values())
    r = _cli("reassign-partitions", "--bootstrap-server", cluster.bootstrap, "--list")
    assert r.stdout == "No partition reassignments found.\n"
    r = _cli("reassign-partitions", "--bootstrap-server", cluster.bootstrap, "--cancel",
             "--reassignment-json-file", str(plan))
    assert r.returncode == 0 and r.stdout == "None of the specified partition reassignments are active.\n"


# ---- get-offsets, broker-api-versions ----------------------------------------------------------------

def test_get_offsets_cli_output(cluster):
    name = _topic("go")
    _create(cluster, name, partitions=2)
    _produce(cluster, name, 4, partition=0)
    _produce(cluster, name, 2, partition=1)
    asyncio.run(_with_admin(cluster, lambda a: a.delete_records({(name, 0): 1})))
    # kafka-get-offsets.sh: topic:partition:offset, sorted by topic then partition.
    for time_arg, expect in (("-1", [4, 2]), ("latest", [4, 2]), ("-2", [1, 0]), ("earliest", [1, 0]),
                             ("0", [1, 0])):
        r = _cli("get-offsets", "--bootstrap-server", cluster.bootstrap, "--topic", name, "--time", time_arg)
        assert r.returncode == 0, r.stderr
        assert r.stdout == f"{name}:0:{expect[0]}\n{name}:1:{expect[1]}\n", time_arg
    r = _cli("get-offsets", "--bootstrap-server", cluster.bootstrap, "--topic", name.replace("go-", "g.-"),
             "--partitions", "1")
    assert r.returncode == 0 and r.stdout == f"{name}:1:2\n"                 # --topic is a regular expression
    r = _cli("get-offsets", "--bootstrap-server", cluster.bootstrap, "--topic", "no-such-topic-.*")
    assert r.returncode == 1 and "Could not match any topic-partitions with the specified filters" in r.stderr


def test_broker_api_versions_cli_output(cluster):
    r = _cli("broker-api-versions", "--bootstrap-server", cluster.bootstrap)
    assert r.returncode == 0, r.stderr
    # kafka-broker-api-versions.sh: per broker "host:port (id: N rack: R) -> (", one tab-led line per
    # API key in ascending order ("Name(key): min to max [usable: v]", or one number when min == max,
    # or "Name(key): UNSUPPORTED"), comma-separated, then ")".
    blocks = r.stdout.split(")\n")
    assert blocks[-1] == "" and len(blocks) == 4
    for b, block in zip(cluster.brokers.values(), blocks):
        lines = block.split("\n")
        assert lines[0] == f"127.0.0.1:{b.port} (id: {b.broker_id} rack: rack-{b.broker_id}) -> ("
        assert lines[-1] == ""
        body = lines[1:-1]
        assert all(line.startswith("\t") for line in body)
        assert all(line.endswith(",") for line in body[:-1]) and not body[-1].endswith(",")
        keys = [int(line.split("(")[1].split(")")[0]) for line in body]
        assert keys == sorted(keys)
        assert "\tProduce(0): 0 to 11 [usable: 11]," in body
        assert "\tFetch(1): 0 to 17 [usable: 17]," in body
        assert "\tDeleteRecords(21): 0 to 2 [usable: 2]," in body
        assert "\tOffsetDelete(47): 0 [usable: 0]," in body
        assert "\tDescribeCluster(60): 0 to 2 [usable: 2]," in body
    # an API the broker does not advertise
    from kbroker.cli.broker_api_versions import api_versions_text
    text = api_versions_text({k: v for k, v in api.SUPPORTED.items() if k != 17})
    assert "\tSaslHandshake(17): UNSUPPORTED," in text.split("\n")


# ---- consumer-groups --delete-offsets ------------------------------------------------------------------

def test_consumer_groups_delete_offsets_cli_output(cluster):
    name, group = _topic("do"), f"g-{uuid.uuid4().hex[:8]}"
    _create(cluster, name, partitions=2)
    _produce(cluster, name, 2, partition=0)

    async def commit_and_read(commit: bool):
        async with GroupClient(cluster.bootstrap) as gc:
            if commit:
                codes = await gc.commit_offsets(group, {(name, 0): 1, (name, 1): 0})
                assert set(codes.values()) == {0}
            return await gc.fetch_offsets(group, [(name, 0), (name, 1)])
    before = asyncio.run(commit_and_read(True))
    assert {tp: v[0] for tp, v in before.items()} == {(name, 0): 1, (name, 1): 0}

    r = _cli("consumer-groups", "--bootstrap-server", cluster.bootstrap, "--delete-offsets", "--group", group,
             "--topic", name)
    assert r.returncode == 0, r.stderr
    # kafka-consumer-groups.sh --delete-offsets: a success line, then the table, each row led by a
    # line break and padded as %-30s %-15s %-15s.
    row = "\n{:<30} {:<15} {:<15}".format
    assert r.stdout == (f"Request succeed for deleting offsets with topic {name} group {group}\n"
                        + row("TOPIC", "PARTITION", "STATUS") + row(name, 0, "Successful")
                        + row(name, 1, "Successful") + "\n")
    after = asyncio.run(commit_and_read(False))
    assert after == {}

    r = _cli("consumer-groups", "--bootstrap-server", cluster.bootstrap, "--delete-offsets", "--group",
             "no-such-group", "--topic", f"{name}:1", "--topic", "no-such-topic")
    assert r.returncode == 0, r.stderr
    assert r.stderr.endswith("\nError: 'no-such-group' does not exist.\n")
    assert r.stdout == (row("TOPIC", "PARTITION", "STATUS")
                        + row(name, 1, "Error: :org.apache.kafka.common.errors.GroupIdNotFoundException: "
                                       "The group id does not exist.")
                        + row("no-such-topic", "Not Provided",
                              "Error: :org.apache.kafka.common.errors.UnknownTopicOrPartitionException: "
                              "This server does not host this topic-partition.") + "\n")
