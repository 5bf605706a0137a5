"""Admin APIs (CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs, AlterConfigs,
IncrementalAlterConfigs, Metadata auto-creation) against a real ZooKeeper and a real
``python -m kbroker serve`` process, driven by confluent-kafka's and kafka-python's admin clients
(plus a few raw requests for protocol details the clients hide).

Each broker gets its own ZooKeeper chroot and log dir under pytest's tmp dir, listens on a free
loopback port (``listeners=...:0``; the port is read back from its ZooKeeper registration) and is
stopped by PID in the fixture teardown.
"""
from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource,
                                   NewPartitions, NewTopic)
from kafka import KafkaProducer
from kafka.admin import ConfigResource as KpConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient
from kafka.admin import NewPartitions as KpNewPartitions
from kafka.admin import NewTopic as KpNewTopic
import kafka.errors as kerr
from kazoo.client import KazooClient

from kbroker.procutil import die_with_parent
from kbroker.protocol import api
from kbroker.testing import controller_known, wait_until
from kbroker.protocol.errors import Errors

HOUR_MS = 3_600_000
START_TIMEOUT_S = 60


class RunningBroker:
    def __init__(self, popen, port, data_dir, log_path):
        self.popen, self.port, self.data_dir, self.log_path = popen, port, data_dir, log_path
        self.bootstrap = f"127.0.0.1:{port}"

    def log_tail(self) -> str:
        try:
            return "\n".join(open(self.log_path, errors="replace").read().splitlines()[-40:])
        except OSError:
            return "(no log)"


def start_broker(zk_server, root, extra: dict[str, str]) -> RunningBroker:
    chroot = f"/admin-{uuid.uuid4().hex[:8]}"
    root.mkdir(parents=True, exist_ok=True)
    data = root / "data"
    props = {
        "broker.id": "0",
        "listeners": "PLAINTEXT://127.0.0.1:0",
        "log.dirs": str(data),
        "zookeeper.connect": zk_server.connect_string + chroot,
        "zookeeper.session.timeout.ms": "6000",
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        **extra,
    }
    cfg = root / "server.properties"
    cfg.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    log_path = root / "broker.log"
    with open(log_path, "ab") as out:
        # Dies with the test thread (PR_SET_PDEATHSIG): a killed test run leaves no broker behind.
        popen = subprocess.Popen([sys.executable, "-m", "kbroker", "serve", "--config", str(cfg)],
                                 stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True, preexec_fn=die_with_parent())
    try:
        port = _wait_registered(zk_server.connect_string + chroot, popen, log_path)
        running = RunningBroker(popen, port, data, log_path)
        # Registered is not yet ready: for a few ms the broker answers Metadata with no controller
        # (it elects itself just after registering), and librdkafka's admin client then waits its
        # whole operation timeout for one instead of asking again (a CreateTopics timed out so).
        # (LocalCluster waits the same way.)
        wait_until(lambda: controller_known(port) is not None, START_TIMEOUT_S, "the broker to know its controller")
    except BaseException:
        _stop(popen)
        raise
    return running


def _wait_registered(connect: str, popen, log_path) -> int:
    zk = KazooClient(hosts=connect, timeout=10)
    zk.start(timeout=10)
    try:
        changed = threading.Event()
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if popen.poll() is not None:
                raise AssertionError(f"broker exited with {popen.returncode}:\n{open(log_path).read()[-3000:]}")
            changed.clear()
            try:
                stat = zk.exists("/brokers/ids/0", watch=lambda e: changed.set())
            except Exception:
                stat = None   # the chroot's parents do not exist yet
            if stat is not None:
                data, _ = zk.get("/brokers/ids/0")
                return int(json.loads(data)["port"])
            if time.monotonic() > deadline:
                raise AssertionError(f"broker not registered in time:\n{open(log_path).read()[-3000:]}")
            changed.wait(0.1)
    finally:
        zk.stop()
        zk.close()


def _stop(popen) -> None:
    if popen.poll() is None:
        popen.terminate()   # SIGTERM to the broker we started, by its PID
        try:
            popen.wait(30)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait(10)


@pytest.fixture(scope="module")
def broker(zk_server, tmp_path_factory):
    # Static broker settings DescribeConfigs must report as STATIC_BROKER_CONFIG.
    b = start_broker(zk_server, tmp_path_factory.mktemp("admin-broker"),
                     {"num.partitions": "2", "log.retention.hours": "100", "offsets.topic.num.partitions": "3"})
    try:
        yield b
    finally:
        _stop(b.popen)


@pytest.fixture
def admin(broker):
    return AdminClient({"bootstrap.servers": broker.bootstrap})


@pytest.fixture
def kp_admin(broker):
    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=20000)
    try:
        yield client
    finally:
        client.close()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def result_error(future) -> KafkaError:
    with pytest.raises(KafkaException) as info:
        future.result(timeout=30)
    return info.value.args[0]


def topic_partitions(broker, name):
    """{partition: (leader, replicas)} from a Metadata request that never auto-creates, or None."""
    resp = raw_request(broker, 3, 4, {"topics": [{"name": name}], "allow_auto_topic_creation": False})
    t = resp["topics"][0]
    if t["error_code"] != 0:
        return None
    return {p["partition_index"]: (p["leader_id"], p["replica_nodes"]) for p in t["partitions"]}


def describe(admin, name, rtype="topic"):
    r = ConfigResource(rtype, name)
    return admin.describe_configs([r])[r].result(timeout=30)


def raw_request(broker, api_key, version, body):
    """One request over a fresh connection with kbroker's codec; returns the decoded body."""
    with socket.create_connection(("127.0.0.1", broker.port), timeout=30) as s:
        s.sendall(api.encode_request(api_key, version, 7, "admin-test", body))
        size = struct.unpack(">i", _recv(s, 4))[0]
        corr, resp = api.decode_response(api_key, version, memoryview(_recv(s, size)))
    assert corr == 7
    return resp


def _recv(s, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        assert chunk, "connection closed"
        buf += chunk
    return bytes(buf)


# ---- CreateTopics --------------------------------------------------------------------------------

def test_create_topics_confluent(broker, admin):
    name, dflt, manual = unique("ct"), unique("ct-default"), unique("ct-manual")
    fs = admin.create_topics([
        NewTopic(name, 3, 1, config={"retention.ms": "3600000", "cleanup.policy": "compact,delete"}),
        NewTopic(dflt, -1, -1),
        NewTopic(manual, 4, replica_assignment=[[0], [0], [0], [0]]),
    ], operation_timeout=30)
    for f in fs.values():
        assert f.result(timeout=30) is None
    # Answered only after the metadata refresh: the partitions and their log dirs already exist.
    parts = topic_partitions(broker, name)
    assert parts == {0: (0, [0]), 1: (0, [0]), 2: (0, [0])}
    for p in range(3):
        assert (broker.data_dir / f"{name}-{p}").is_dir()
    assert len(topic_partitions(broker, dflt)) == 2      # num.partitions=2 from server.properties
    assert len(topic_partitions(broker, manual)) == 4

    err = result_error(admin.create_topics([NewTopic(name, 1, 1)])[name])
    assert err.code() == KafkaError.TOPIC_ALREADY_EXISTS and name in err.str()

    bad = "bad name!"
    err = result_error(admin.create_topics([NewTopic(bad, 1, 1)])[bad])
    assert err.code() == KafkaError.TOPIC_EXCEPTION and "illegal" in err.str()

    t = unique("ct-badkey")
    err = result_error(admin.create_topics([NewTopic(t, 1, 1, config={"retention.msx": "1"})])[t])
    assert err.code() == KafkaError.INVALID_CONFIG and "retention.msx" in err.str()
    err = result_error(admin.create_topics([NewTopic(t, 1, 1, config={"segment.bytes": "ten"})])[t])
    assert err.code() == KafkaError.INVALID_CONFIG and "segment.bytes" in err.str()
    err = result_error(admin.create_topics([NewTopic(t, 1, 1, config={"cleanup.policy": "shred"})])[t])
    assert err.code() == KafkaError.INVALID_CONFIG and "cleanup.policy" in err.str()

    err = result_error(admin.create_topics([NewTopic(t, 1, 3)])[t])
    assert err.code() == KafkaError.INVALID_REPLICATION_FACTOR and "larger than available brokers: 1" in err.str()
    err = result_error(admin.create_topics([NewTopic(t, 2, replica_assignment=[[0], [5]])])[t])
    assert err.code() == KafkaError.INVALID_REPLICA_ASSIGNMENT and "5" in err.str()

    # validate_only: a valid request succeeds but creates nothing.
    v = unique("ct-validate")
    assert admin.create_topics([NewTopic(v, 2, 1)], validate_only=True)[v].result(timeout=30) is None
    assert topic_partitions(broker, v) is None
    assert not (broker.data_dir / f"{v}-0").exists()
    err = result_error(admin.create_topics([NewTopic(v, 1, 1, config={"nope": "1"})], validate_only=True)[v])
    assert err.code() == KafkaError.INVALID_CONFIG
    assert topic_partitions(broker, t) is None   # none of the failed creations left a topic behind


def test_create_topics_kafka_python(broker, kp_admin):
    name = unique("kp")
    kp_admin.create_topics([KpNewTopic(name, 2, 1, topic_configs={"max.message.bytes": "20000"})],
                           validate_only=True)
    assert name not in kp_admin.list_topics()
    kp_admin.create_topics([KpNewTopic(name, 2, 1, topic_configs={"max.message.bytes": "20000"})])
    assert name in kp_admin.list_topics()
    with pytest.raises(kerr.TopicAlreadyExistsError):
        kp_admin.create_topics([KpNewTopic(name, 2, 1)])
    with pytest.raises(kerr.InvalidPartitionsError):
        kp_admin.create_topics([KpNewTopic(unique("kp-zero"), 0, 1)])
    with pytest.raises(kerr.InvalidReplicationFactorError):
        kp_admin.create_topics([KpNewTopic(unique("kp-rf"), 1, 2)])
    with pytest.raises(kerr.InvalidConfigurationError):
        kp_admin.create_topics([KpNewTopic(unique("kp-cfg"), 1, 1, topic_configs={"min.insync.replicas": "0"})])
    with pytest.raises(kerr.InvalidTopicError):
        kp_admin.create_topics([KpNewTopic("a" * 250, 1, 1)])


def test_create_topics_raw_versions(broker, admin):
    name = unique("raw")
    # v0 has no error_message and no validate_only; duplicates within one request are refused.
    resp = raw_request(broker, 19, 0, {"topics": [
        {"name": name, "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []}],
        "timeout_ms": 30000})
    assert [(t["name"], t["error_code"]) for t in resp["topics"]] == [(name, 0)]
    dup = unique("raw-dup")
    topic = {"name": dup, "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []}
    resp = raw_request(broker, 19, 4, {"topics": [topic, topic], "timeout_ms": 30000, "validate_only": False})
    assert [t["error_code"] for t in resp["topics"]] == [42]
    assert topic_partitions(broker, dup) is None
    # Both a partition count and an assignment: INVALID_REQUEST.
    resp = raw_request(broker, 19, 4, {"topics": [
        {"name": dup, "num_partitions": 2, "replication_factor": -1,
         "assignments": [{"partition_index": 0, "broker_ids": [0]}], "configs": []}],
        "timeout_ms": 30000, "validate_only": False})
    assert resp["topics"][0]["error_code"] == Errors.INVALID_REQUEST and "cannot be used at the same time" in resp["topics"][0]["error_message"]


# ---- DescribeConfigs -----------------------------------------------------------------------------

def test_describe_configs_sources(broker, admin, kp_admin):
    name = unique("dc")
    admin.create_topics([NewTopic(name, 1, 1, config={"segment.ms": "7200000"})])[name].result(timeout=30)
    cfg = describe(admin, name)
    assert cfg["segment.ms"].value == "7200000"
    assert cfg["segment.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    # log.retention.hours=100 in server.properties: the topic default derives from it.
    assert cfg["retention.ms"].value == str(100 * HOUR_MS)
    assert cfg["retention.ms"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert cfg["segment.bytes"].value == str(1 << 30)
    assert cfg["segment.bytes"].source == ConfigSource.DEFAULT_CONFIG.value
    assert cfg["cleanup.policy"].value == "delete"
    assert not cfg["retention.ms"].is_read_only

    # kafka-python, with synonyms: Kafka's order (topic override, static broker key, default).
    res = kp_admin.describe_configs([KpConfigResource(ConfigResourceType.TOPIC, name)], include_synonyms=True,
                                    config_filter="all")["topic"][name]
    syn = [(s["name"], s["value"], s["source"]) for s in res["retention.ms"]["synonyms"]]
    assert syn == [("log.retention.hours", "100", "STATIC_BROKER_CONFIG"),
                   ("log.retention.hours", "168", "DEFAULT_CONFIG")]
    syn = [(s["name"], s["source"]) for s in res["segment.ms"]["synonyms"]]
    assert syn == [("segment.ms", "DYNAMIC_TOPIC_CONFIG"), ("log.roll.hours", "DEFAULT_CONFIG")]
    modified = kp_admin.describe_configs([KpConfigResource(ConfigResourceType.TOPIC, name)])["topic"][name]
    assert set(modified) == {"segment.ms"}

    # Broker resource: our id as the name; static keys from server.properties, read-only.
    bcfg = describe(admin, "0", "broker")
    assert bcfg["num.partitions"].value == "2"
    assert bcfg["num.partitions"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert bcfg["num.partitions"].is_read_only
    assert bcfg["default.replication.factor"].source == ConfigSource.DEFAULT_CONFIG.value

    err = result_error(admin.describe_configs([ConfigResource("topic", "no-such-topic")])[
        ConfigResource("topic", "no-such-topic")])
    assert err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_describe_configs_raw_details(broker, admin):
    name = unique("dcraw")
    admin.create_topics([NewTopic(name, 1, 1, config={"retention.bytes": "1000"})])[name].result(timeout=30)
    body = {"resources": [{"resource_type": 2, "resource_name": name,
                           "configuration_keys": ["retention.bytes", "segment.bytes"]},
                          {"resource_type": 4, "resource_name": "9", "configuration_keys": None}]}
    # v0: is_default instead of config_source; the key filter applies; a foreign broker id errs.
    resp = raw_request(broker, 32, 0, body)
    topic, other = resp["results"]
    got = {c["name"]: (c["value"], c["is_default"]) for c in topic["configs"]}
    assert got == {"retention.bytes": ("1000", False), "segment.bytes": (str(1 << 30), True)}
    assert other["error_code"] == Errors.INVALID_REQUEST and "9" in other["error_message"]
    # v3: config_type (LONG = 5, INT = 3).
    resp = raw_request(broker, 32, 3, {**body, "include_synonyms": False, "include_documentation": False})
    types = {c["name"]: c["config_type"] for c in resp["results"][0]["configs"]}
    assert types == {"retention.bytes": 5, "segment.bytes": 3}


# ---- AlterConfigs / IncrementalAlterConfigs ------------------------------------------------------

def test_alter_configs_kafka_python(broker, admin, kp_admin):
    name = unique("ac")
    admin.create_topics([NewTopic(name, 1, 1, config={"segment.ms": "7200000"})])[name].result(timeout=30)
    res = kp_admin.alter_configs([KpConfigResource(ConfigResourceType.TOPIC, name,
                                                   configs={"retention.ms": "5000"})], incremental=False)
    assert res == {"topic": {name: "OK"}}
    cfg = describe(admin, name)
    assert cfg["retention.ms"].value == "5000"
    assert cfg["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    # kafka-python re-sends the other modified keys (AlterConfigs replaces the whole set).
    assert cfg["segment.ms"].value == "7200000"

    # Non-incremental through confluent: the request *is* the override set, segment.ms goes back.
    r = ConfigResource("topic", name, set_config={"retention.ms": "6000"})
    assert admin.alter_configs([r])[r].result(timeout=30) is None
    cfg = describe(admin, name)
    assert cfg["retention.ms"].value == "6000"
    assert cfg["segment.ms"].source == ConfigSource.DEFAULT_CONFIG.value

    res = kp_admin.alter_configs([KpConfigResource(ConfigResourceType.TOPIC, name,
                                                   configs={"retention.ms": "soon"})], incremental=False)
    assert "InvalidConfiguration" in res["topic"][name] and "retention.ms" in res["topic"][name]
    assert describe(admin, name)["retention.ms"].value == "6000"

    # validate_only: accepted, nothing changes.
    r = ConfigResource("topic", name, set_config={"retention.ms": "7000"})
    assert admin.alter_configs([r], validate_only=True)[r].result(timeout=30) is None
    assert describe(admin, name)["retention.ms"].value == "6000"


def test_incremental_alter_configs(broker, admin, kp_admin):
    name = unique("iac")
    admin.create_topics([NewTopic(name, 1, 1, config={"retention.ms": "5000"})])[name].result(timeout=30)

    def incr(*entries, validate_only=False):
        r = ConfigResource("topic", name, incremental_configs=[
            ConfigEntry(k, v, incremental_operation=op) for k, op, v in entries])
        return admin.incremental_alter_configs([r], validate_only=validate_only)[r]

    assert incr(("segment.ms", AlterConfigOpType.SET, "7200000"),
                ("retention.ms", AlterConfigOpType.DELETE, None),
                ("cleanup.policy", AlterConfigOpType.APPEND, "compact")).result(timeout=30) is None
    cfg = describe(admin, name)
    assert cfg["segment.ms"].value == "7200000"
    assert cfg["retention.ms"].source == ConfigSource.STATIC_BROKER_CONFIG.value   # override removed
    assert cfg["cleanup.policy"].value == "delete,compact"
    assert incr(("cleanup.policy", AlterConfigOpType.SUBTRACT, "delete")).result(timeout=30) is None
    assert describe(admin, name)["cleanup.policy"].value == "compact"

    assert incr(("segment.ms", AlterConfigOpType.SET, "1"), validate_only=True).result(timeout=30) is None
    assert describe(admin, name)["segment.ms"].value == "7200000"

    err = result_error(incr(("retention.ms", AlterConfigOpType.APPEND, "5")))
    assert err.code() == KafkaError.INVALID_CONFIG and "retention.ms" in err.str()
    err = result_error(incr(("flush.ms", AlterConfigOpType.SET, "-5")))
    assert err.code() == KafkaError.INVALID_CONFIG and "flush.ms" in err.str()
    err = result_error(incr(("no.such.key", AlterConfigOpType.SET, "1")))
    assert err.code() == KafkaError.INVALID_CONFIG and "no.such.key" in err.str()

    # kafka-python picks IncrementalAlterConfigs; DELETE through it too.
    res = kp_admin.alter_configs([KpConfigResource(ConfigResourceType.TOPIC, name,
                                                   configs={"segment.ms": ("DELETE", None)})])
    assert res == {"topic": {name: "OK"}}
    assert describe(admin, name)["segment.ms"].source == ConfigSource.DEFAULT_CONFIG.value

    # Broker configs are static in kbroker: refused with a clear message.
    r = ConfigResource("broker", "0", incremental_configs=[
        ConfigEntry("log.retention.hours", "1", incremental_operation=AlterConfigOpType.SET)])
    err = result_error(admin.incremental_alter_configs([r])[r])
    assert err.code() == KafkaError.INVALID_REQUEST and "server.properties" in err.str()


def test_altered_config_reaches_the_open_log(broker, admin):
    """max.message.bytes set through IncrementalAlterConfigs is enforced by the partition's log at once."""
    name = unique("live")
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(timeout=30)
    payload = os.urandom(5000)   # incompressible; the client's own limit is 1 MB

    def produce():
        p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "retries": 0})
        outcome = []
        p.produce(name, payload, on_delivery=lambda err, msg: outcome.append(err))
        p.flush(30)
        assert len(outcome) == 1
        return outcome[0]

    assert produce() is None
    r = ConfigResource("topic", name, incremental_configs=[
        ConfigEntry("max.message.bytes", "1000", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([r])[r].result(timeout=30)
    err = produce()
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE
    r = ConfigResource("topic", name, incremental_configs=[
        ConfigEntry("max.message.bytes", None, incremental_operation=AlterConfigOpType.DELETE)])
    admin.incremental_alter_configs([r])[r].result(timeout=30)
    assert produce() is None


# ---- CreatePartitions ----------------------------------------------------------------------------

def test_create_partitions(broker, admin, kp_admin):
    name = unique("cp")
    admin.create_topics([NewTopic(name, 2, 1)])[name].result(timeout=30)
    assert admin.create_partitions([NewPartitions(name, 4)])[name].result(timeout=30) is None
    assert sorted(topic_partitions(broker, name)) == [0, 1, 2, 3]
    assert (broker.data_dir / f"{name}-3").is_dir()

    # validate_only leaves the count alone.
    assert admin.create_partitions([NewPartitions(name, 6)], validate_only=True)[name].result(timeout=30) is None
    assert len(topic_partitions(broker, name)) == 4

    err = result_error(admin.create_partitions([NewPartitions(name, 3)])[name])
    assert err.code() == KafkaError.INVALID_PARTITIONS
    assert f"Topic {name} currently has 4 partitions, 3 would not be an increase" in err.str()
    err = result_error(admin.create_partitions([NewPartitions(name, 4)])[name])
    assert err.code() == KafkaError.INVALID_PARTITIONS and "already has 4 partitions" in err.str()
    err = result_error(admin.create_partitions([NewPartitions(name, 6, replica_assignment=[[0]])])[name])
    assert err.code() == KafkaError.INVALID_REPLICA_ASSIGNMENT

    kp_admin.create_partitions({name: KpNewPartitions(6, [[0], [0]])})
    assert len(topic_partitions(broker, name)) == 6
    with pytest.raises(kerr.InvalidPartitionsError):
        kp_admin.create_partitions({name: KpNewPartitions(5)})
    with pytest.raises(kerr.UnknownTopicOrPartitionError):
        kp_admin.create_partitions({unique("cp-none"): KpNewPartitions(5)})


def test_partition_counts_that_cannot_fit_in_zookeeper_are_refused_at_once(broker, admin):
    """Invariant: the assignment lives in one znode (jute.maxbuffer, 1 MiB), so a count that cannot fit
    gets INVALID_PARTITIONS before anything is planned (a fuzzed 134,217,729 once cost 4.5 GiB), for
    CreateTopics and CreatePartitions alike; a large count that fits still works."""
    name = unique("huge")
    started = time.monotonic()
    # Raw requests: librdkafka itself refuses counts above 100,000 before sending.
    resp = raw_request(broker, 19, 4, {"topics": [{"name": name, "num_partitions": 134_217_729,
                                                   "replication_factor": 1, "assignments": [], "configs": []}],
                                       "timeout_ms": 30000, "validate_only": False})
    res = resp["topics"][0]
    assert res["error_code"] == KafkaError.INVALID_PARTITIONS and "ZooKeeper znode" in res["error_message"]
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(timeout=30)
    resp = raw_request(broker, 37, 1, {"topics": [{"name": name, "count": 134_217_729, "assignments": None}],
                                       "timeout_ms": 30000, "validate_only": False})
    res = resp["results"][0]
    assert res["error_code"] == KafkaError.INVALID_PARTITIONS and "ZooKeeper znode" in res["error_message"]
    assert time.monotonic() - started < 20
    assert sorted(topic_partitions(broker, name)) == [0]
    assert admin.create_partitions([NewPartitions(name, 200)])[name].result(timeout=60) is None


# ---- DeleteTopics --------------------------------------------------------------------------------

def test_delete_topics(broker, admin, kp_admin):
    a, b = unique("del-a"), unique("del-b")
    for f in admin.create_topics([NewTopic(a, 2, 1), NewTopic(b, 1, 1)]).values():
        f.result(timeout=30)
    assert (broker.data_dir / f"{a}-1").is_dir()

    assert admin.delete_topics([a], operation_timeout=30)[a].result(timeout=30) is None
    assert topic_partitions(broker, a) is None
    assert a not in kp_admin.list_topics()
    # The log dirs are gone (renamed to -delete and removed, not left behind).
    assert not [d for d in os.listdir(broker.data_dir) if d.startswith(a)]

    kp_admin.delete_topics([b])
    assert b not in kp_admin.list_topics()
    assert not (broker.data_dir / f"{b}-0").exists()

    err = result_error(admin.delete_topics([a])[a])
    assert err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    with pytest.raises(kerr.UnknownTopicOrPartitionError):
        kp_admin.delete_topics([b])

    # A deleted name can be created again, starting empty.
    assert admin.create_topics([NewTopic(a, 1, 1)])[a].result(timeout=30) is None
    assert topic_partitions(broker, a) == {0: (0, [0])}


def test_delete_disabled_and_replication_default(zk_server, tmp_path):
    b = start_broker(zk_server, tmp_path / "nodelete",
                     {"delete.topic.enable": "false", "default.replication.factor": "3"})
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        name = unique("keep")
        admin.create_topics([NewTopic(name, 1, 1)])[name].result(timeout=30)
        # default.replication.factor=3 with one live broker: neither explicit nor auto-creation works.
        t = unique("rf3")
        err = result_error(admin.create_topics([NewTopic(t, 1, -1)])[t])
        assert err.code() == KafkaError.INVALID_REPLICATION_FACTOR
        resp = raw_request(b, 3, 4, {"topics": [{"name": t}], "allow_auto_topic_creation": True})
        assert resp["topics"][0]["error_code"] != 0
        assert topic_partitions(b, t) is None

        err = result_error(admin.delete_topics([name])[name])
        assert err.code() == KafkaError.TOPIC_DELETION_DISABLED
        # Before v3 Kafka had no code for it and answers INVALID_REQUEST.
        resp = raw_request(b, 20, 1, {"topic_names": [name], "timeout_ms": 30000})
        assert [(r["name"], r["error_code"]) for r in resp["responses"]] == [(name, 42)]
        assert topic_partitions(b, name) is not None
    finally:
        _stop(b.popen)


# ---- auto-creation -------------------------------------------------------------------------------

def test_auto_create_by_producers(broker, admin):
    name = unique("auto")
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    outcome = []
    p.produce(name, b"hello", on_delivery=lambda err, msg: outcome.append((err, msg.partition())))
    assert p.flush(30) == 0
    assert outcome and outcome[0][0] is None
    parts = wait_until(lambda: topic_partitions(broker, name), what=f"{name} in metadata")
    assert len(parts) == 2   # num.partitions
    assert describe(admin, name)["retention.ms"].source == ConfigSource.STATIC_BROKER_CONFIG.value

    kp_name = unique("auto-kp")
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    try:
        md = producer.send(kp_name, b"hi").get(timeout=30)
        assert md.topic == kp_name and md.offset == 0
    finally:
        producer.close()
    assert len(topic_partitions(broker, kp_name)) == 2

    # Invalid names are never auto-created; Metadata reports them as invalid.
    resp = raw_request(broker, 3, 4, {"topics": [{"name": "bad/name"}], "allow_auto_topic_creation": True})
    assert resp["topics"][0]["error_code"] == Errors.INVALID_TOPIC_EXCEPTION
    # allow_auto_topic_creation=false is honoured.
    other = unique("noauto")
    resp = raw_request(broker, 3, 4, {"topics": [{"name": other}], "allow_auto_topic_creation": False})
    assert resp["topics"][0]["error_code"] == Errors.UNKNOWN_TOPIC_OR_PARTITION
    assert topic_partitions(broker, other) is None


def test_auto_create_consumer_offsets(broker, admin):
    """__consumer_offsets gets Kafka's internal-topic settings, not the plain topic defaults."""
    resp = raw_request(broker, 3, 4, {"topics": [{"name": "__consumer_offsets"}], "allow_auto_topic_creation": True})
    assert resp["topics"][0]["error_code"] in (0, 5)
    parts = wait_until(lambda: topic_partitions(broker, "__consumer_offsets"), what="__consumer_offsets")
    assert len(parts) == 3   # offsets.topic.num.partitions
    assert describe(admin, "__consumer_offsets")["cleanup.policy"].value == "compact"


def test_unknown_topic_configs_describe_raw(broker):
    resp = raw_request(broker, 32, 1, {"resources": [{"resource_type": 2, "resource_name": "ghost",
                                                      "configuration_keys": None}], "include_synonyms": True})
    assert resp["results"][0]["error_code"] == Errors.UNKNOWN_TOPIC_OR_PARTITION and resp["results"][0]["configs"] == []
