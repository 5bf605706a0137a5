"""Dynamic broker configs through the API, as Kafka's ZooKeeper mode keeps them (kafka-configs.sh
--entity-type brokers): DescribeConfigs / AlterConfigs / IncrementalAlterConfigs of BROKER resources
("<id>" or "" = the cluster-wide default) on two real brokers (LocalCluster, real ZooKeeper), driven by
confluent-kafka's AdminClient, kafka-python's KafkaAdminClient and raw requests for the details the
clients hide; the values land in /config/brokers/<id|<default>> with a change notification, and a
follower rate set through the API throttles a real reassignment while a DELETE lifts it.

Also the throttled replica lists (Kafka's ThrottledReplicaListValidator): a malformed
leader/follower.replication.throttled.replicas is refused with INVALID_CONFIG naming the key at
CreateTopics, AlterConfigs and IncrementalAlterConfigs."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource,
                                   NewTopic)
from kafka.admin import ConfigResource as KpConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient
from kazoo.client import KazooClient

from checkers import RawConn, fill_partition, partition_dir
from kbroker.testing import LocalCluster, wait_until
from kbroker.zk import layout as L
from kbroker.protocol.errors import Errors
from kbroker.security.tlsreload import RELOADABLE

LEADER_RATE = "leader.replication.throttled.rate"
FOLLOWER_RATE = "follower.replication.throttled.rate"
STATIC_LEADER_RATE = "900000000"      # server.properties value: the STATIC_BROKER_CONFIG synonym
RATE = 1_000_000                      # B/s for the throttle test
RECORDS, VALUE = 5000, 1000           # ~5 MB to move


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    overrides = {"replica.lag.time.max.ms": 3000, "replication.quota.window.num": 2,
                 "replication.quota.window.size.seconds": 1, LEADER_RATE: STATIC_LEADER_RATE}
    with LocalCluster(tmp_path_factory.mktemp("cfgb"), brokers=2, overrides=overrides) as c:
        yield c


@pytest.fixture(scope="module")
def zk(cluster):
    z = KazooClient(hosts=cluster.zk_connect)
    z.start(timeout=10)
    yield z
    z.stop()
    z.close()


@pytest.fixture(scope="module")
def admin(cluster):
    return AdminClient({"bootstrap.servers": cluster.bootstrap})


@pytest.fixture(scope="module")
def kp_admin(cluster):
    client = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=20000)
    yield client
    client.close()


def broker_addr(c, b):
    return f"127.0.0.1:{c.brokers[b].port}"


def describe(admin, name):
    r = ConfigResource("broker", name)
    return admin.describe_configs([r])[r].result(timeout=30)


def incr(admin, name, *entries, validate_only=False):
    r = ConfigResource("broker", name, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=op) for k, op, v in entries])
    return admin.incremental_alter_configs([r], validate_only=validate_only)[r]


def describe_default(c, b: int) -> dict[str, tuple]:
    """The cluster-default resource ("") described by broker ``b``: {name: (value, source, read_only)}.
    Raw request: both clients refuse an empty broker name (kafka-configs.sh --entity-default sends it)."""
    resp = raw(c, b, 32, 1, {"resources": [{"resource_type": 4, "resource_name": "", "configuration_keys": None}],
                             "include_synonyms": True})
    res = resp["results"][0]
    assert res["error_code"] == 0, res
    return {e["name"]: (e["value"], e["config_source"], e["read_only"]) for e in res["configs"]}


def alter_default(c, b: int, *entries, validate_only=False) -> tuple[int, str | None]:
    """IncrementalAlterConfigs v1 of the cluster-default resource sent to broker ``b``."""
    resp = raw(c, b, 44, 1, {"resources": [{"resource_type": 4, "resource_name": "", "configs": [
        {"name": k, "config_operation": int(op.value), "value": v} for k, op, v in entries]}],
        "validate_only": validate_only})
    r = resp["responses"][0]
    return r["error_code"], r["error_message"]


def kp_synonyms(kp_admin, broker_id: str, key: str) -> list[tuple]:
    """(name, value, source) of a broker key's synonyms, through kafka-python (DescribeConfigs v1+;
    confluent-kafka keys synonyms by name, which folds a key's own sources into one)."""
    res = kp_admin.describe_configs([KpConfigResource(ConfigResourceType.BROKER, broker_id)],
                                    include_synonyms=True, config_filter="all")["broker"][broker_id]
    return [(s["name"], s["value"], s["source"]) for s in res[key]["synonyms"]]


def error_of(future) -> KafkaError:
    with pytest.raises(KafkaException) as ei:
        future.result(timeout=30)
    return ei.value.args[0]


def stored(zk, entity):
    try:
        return L.decode_config(zk.get(L.broker_config_path(entity))[0])
    except Exception:   # NoNodeError: nothing stored
        return {}


def last_change(zk):
    children = sorted(zk.get_children(L.CONFIG_CHANGES))
    return L.decode_config_change(zk.get(f"{L.CONFIG_CHANGES}/{children[-1]}")[0])


def raw(c, b, api_key, version, body):
    with RawConn(broker_addr(c, b)) as conn:
        return conn.request(api_key, version, body)


def test_describe_broker_sources_and_flags(cluster, admin, kp_admin):
    cfg = describe(admin, "0")
    assert cfg[LEADER_RATE].value == STATIC_LEADER_RATE
    assert cfg[LEADER_RATE].source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert not cfg[LEADER_RATE].is_read_only                      # dynamically updatable
    assert cfg[FOLLOWER_RATE].source == ConfigSource.DEFAULT_CONFIG.value
    assert cfg[FOLLOWER_RATE].value == str(2**63 - 1)
    assert cfg["log.retention.hours"].is_read_only                # static only in kbroker
    assert kp_synonyms(kp_admin, "0", LEADER_RATE) == [(LEADER_RATE, STATIC_LEADER_RATE, "STATIC_BROKER_CONFIG"),
                                                       (LEADER_RATE, str(2**63 - 1), "DEFAULT_CONFIG")]
    # The cluster default resource lists only what /config/brokers/<default> holds: nothing yet.
    assert describe_default(cluster, 0) == {}
    # Another broker's id sent to this broker: INVALID_REQUEST naming both ids (Kafka's ZooKeeper mode).
    resp = raw(cluster, 0, 32, 1, {"resources": [{"resource_type": 4, "resource_name": "1",
                                                  "configuration_keys": None}], "include_synonyms": False})
    res = resp["results"][0]
    assert res["error_code"] == Errors.INVALID_REQUEST and "expected 0" in res["error_message"] and "received 1" in res["error_message"]


def test_incremental_alter_per_broker_and_default(cluster, admin, kp_admin, zk):
    # SET on broker 1 (confluent sends a broker resource to that broker).
    assert incr(admin, "1", (FOLLOWER_RATE, AlterConfigOpType.SET, "5000000")).result(timeout=30) is None
    assert stored(zk, "1") == {FOLLOWER_RATE: "5000000"}
    assert last_change(zk) == ("brokers", "1")
    cfg = describe(admin, "1")
    assert cfg[FOLLOWER_RATE].value == "5000000"
    assert cfg[FOLLOWER_RATE].source == ConfigSource.DYNAMIC_BROKER_CONFIG.value

    # The cluster-wide default: written to /config/brokers/<default>, seen by both brokers below the
    # per-broker value (broker 1 keeps its own; broker 0 takes the default).
    assert alter_default(cluster, 1, (FOLLOWER_RATE, AlterConfigOpType.SET, "7000000"),
                         (LEADER_RATE, AlterConfigOpType.SET, "8000000")) == (0, None)
    assert stored(zk, L.DEFAULT_BROKER_ENTITY) == {FOLLOWER_RATE: "7000000", LEADER_RATE: "8000000"}
    assert last_change(zk) == ("brokers", L.DEFAULT_BROKER_ENTITY)
    assert describe_default(cluster, 1) == {FOLLOWER_RATE: ("7000000", 3, False), LEADER_RATE: ("8000000", 3, False)}
    code, msg = alter_default(cluster, 0, ("num.io.threads", AlterConfigOpType.SET, "2"))
    assert code == 42 and "num.io.threads" in msg
    wait_until(lambda: describe(admin, "0")[FOLLOWER_RATE].value == "7000000", 20, "broker 0 to apply the default")
    assert describe(admin, "0")[LEADER_RATE].source == ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value
    assert [s[2] for s in kp_synonyms(kp_admin, "0", LEADER_RATE)] == [
        "DYNAMIC_DEFAULT_BROKER_CONFIG", "STATIC_BROKER_CONFIG", "DEFAULT_CONFIG"]
    wait_until(lambda: describe(admin, "1")[LEADER_RATE].value == "8000000", 20, "broker 1 to apply the default")
    assert describe(admin, "1")[FOLLOWER_RATE].value == "5000000"   # per-broker wins over the default
    assert kp_synonyms(kp_admin, "1", FOLLOWER_RATE) == [
        (FOLLOWER_RATE, "5000000", "DYNAMIC_BROKER_CONFIG"), (FOLLOWER_RATE, "7000000", "DYNAMIC_DEFAULT_BROKER_CONFIG"),
        (FOLLOWER_RATE, str(2**63 - 1), "DEFAULT_CONFIG")]

    # validate_only: answered, nothing written.
    assert incr(admin, "1", (FOLLOWER_RATE, AlterConfigOpType.SET, "1"), validate_only=True).result(30) is None
    assert stored(zk, "1") == {FOLLOWER_RATE: "5000000"}

    # Refusals name the key; nothing is written.
    err = error_of(incr(admin, "1", ("log.retention.hours", AlterConfigOpType.SET, "1")))
    assert err.code() == KafkaError.INVALID_REQUEST and "log.retention.hours" in err.str()
    err = error_of(incr(admin, "1", ("no.such.broker.key", AlterConfigOpType.SET, "1")))
    assert err.code() == KafkaError.INVALID_REQUEST and "no.such.broker.key" in err.str()
    err = error_of(incr(admin, "1", (FOLLOWER_RATE, AlterConfigOpType.SET, "-3")))
    assert err.code() == KafkaError.INVALID_REQUEST and FOLLOWER_RATE in err.str()
    err = error_of(incr(admin, "1", (FOLLOWER_RATE, AlterConfigOpType.SET, "fast")))
    assert err.code() == KafkaError.INVALID_REQUEST and FOLLOWER_RATE in err.str()
    err = error_of(incr(admin, "1", (FOLLOWER_RATE, AlterConfigOpType.APPEND, "1")))
    assert err.code() == KafkaError.INVALID_CONFIG and FOLLOWER_RATE in err.str()
    assert stored(zk, "1") == {FOLLOWER_RATE: "5000000"}

    # Broker 1's id sent to broker 0: refused there (raw request, the clients route it to broker 1).
    resp = raw(cluster, 0, 44, 0, {"resources": [{"resource_type": 4, "resource_name": "1", "configs": [
        {"name": FOLLOWER_RATE, "config_operation": 0, "value": "1"}]}], "validate_only": False})
    r = resp["responses"][0]
    assert r["error_code"] == Errors.INVALID_REQUEST and "expected 0" in r["error_message"] and "received 1" in r["error_message"]
    assert stored(zk, "1") == {FOLLOWER_RATE: "5000000"}

    # DELETE: back to the default's value, then the default removed as well.
    assert incr(admin, "1", (FOLLOWER_RATE, AlterConfigOpType.DELETE, None)).result(timeout=30) is None
    assert stored(zk, "1") == {}
    assert describe(admin, "1")[FOLLOWER_RATE].source == ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value
    assert alter_default(cluster, 0, (FOLLOWER_RATE, AlterConfigOpType.DELETE, None),
                         (LEADER_RATE, AlterConfigOpType.DELETE, None)) == (0, None)
    assert stored(zk, L.DEFAULT_BROKER_ENTITY) == {}
    for b in ("0", "1"):
        wait_until(lambda: describe(admin, b)[LEADER_RATE].source == ConfigSource.STATIC_BROKER_CONFIG.value,
                   20, f"broker {b} to drop the default")
        assert describe(admin, b)[FOLLOWER_RATE].source == ConfigSource.DEFAULT_CONFIG.value


def test_kafka_python_describe_and_alter(cluster, kp_admin, zk):
    res = kp_admin.describe_configs([KpConfigResource(ConfigResourceType.BROKER, "1")],
                                    config_filter="dynamic")["broker"]["1"]
    # what AlterConfigs may change: the throttle rates, the connection creation rate and the TLS keystore /
    # truststore keys
    assert set(res) == {LEADER_RATE, FOLLOWER_RATE, "max.connection.creation.rate"} | RELOADABLE
    # Non-incremental AlterConfigs: the request is the whole per-broker set.
    out = kp_admin.alter_configs([KpConfigResource(ConfigResourceType.BROKER, "1",
                                                   configs={LEADER_RATE: "3000000"})], incremental=False)
    assert out == {"broker": {"1": "OK"}}
    assert stored(zk, "1") == {LEADER_RATE: "3000000"}
    res = kp_admin.describe_configs([KpConfigResource(ConfigResourceType.BROKER, "1")],
                                    include_synonyms=True)["broker"]["1"]   # 'modified' filter
    assert set(res) == {LEADER_RATE}
    assert res[LEADER_RATE]["value"] == "3000000" and res[LEADER_RATE]["config_source"] == "DYNAMIC_BROKER_CONFIG"
    out = kp_admin.alter_configs([KpConfigResource(ConfigResourceType.BROKER, "1",
                                                   configs={FOLLOWER_RATE: "4000000"})], incremental=False)
    assert out == {"broker": {"1": "OK"}}
    # kafka-python re-sends the other modified keys, so the leader rate stays.
    assert stored(zk, "1") == {LEADER_RATE: "3000000", FOLLOWER_RATE: "4000000"}
    out = kp_admin.alter_configs([KpConfigResource(ConfigResourceType.BROKER, "1",
                                                   configs={"num.io.threads": "4"})],
                                 incremental=False, raise_on_unknown=False)
    assert "InvalidRequest" in out["broker"]["1"] and "num.io.threads" in out["broker"]["1"]
    # Incremental DELETE through kafka-python (its default on a broker that has API 44).
    out = kp_admin.alter_configs([KpConfigResource(ConfigResourceType.BROKER, "1", configs={
        LEADER_RATE: ("DELETE", None), FOLLOWER_RATE: ("DELETE", None)})])
    assert out == {"broker": {"1": "OK"}}
    assert stored(zk, "1") == {}


BAD_LISTS = ["0-1", "*,0:1", "0:x", "1"]


def test_malformed_throttled_replica_lists_refused(cluster, admin):
    for key in ("leader.replication.throttled.replicas", "follower.replication.throttled.replicas"):
        for bad in BAD_LISTS:
            name = f"bad-{key[0]}-{BAD_LISTS.index(bad)}"
            fut = admin.create_topics([NewTopic(name, 1, 1, config={key: bad})])[name]
            err = error_of(fut)
            assert err.code() == KafkaError.INVALID_CONFIG and key in err.str(), (key, bad, err)
    name = "throttled-lists"
    admin.create_topics([NewTopic(name, 1, 1, config={"leader.replication.throttled.replicas": "0:0,0:1"})])[
        name].result(timeout=30)
    r = ConfigResource("topic", name, incremental_configs=[
        ConfigEntry("follower.replication.throttled.replicas", "0:1 x", incremental_operation=AlterConfigOpType.SET)])
    err = error_of(admin.incremental_alter_configs([r])[r])
    assert err.code() == KafkaError.INVALID_CONFIG and "follower.replication.throttled.replicas" in err.str()
    r = ConfigResource("topic", name, set_config={"leader.replication.throttled.replicas": "all"})
    err = error_of(admin.alter_configs([r])[r])
    assert err.code() == KafkaError.INVALID_CONFIG and "leader.replication.throttled.replicas" in err.str()
    # Well-formed values pass: '*', and APPEND of a pair to the list.
    r = ConfigResource("topic", name, incremental_configs=[
        ConfigEntry("follower.replication.throttled.replicas", "*", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("leader.replication.throttled.replicas", "0:2", incremental_operation=AlterConfigOpType.APPEND)])
    assert admin.incremental_alter_configs([r])[r].result(timeout=30) is None
    t = ConfigResource("topic", name)
    cfg = admin.describe_configs([t])[t].result(timeout=30)
    assert cfg["leader.replication.throttled.replicas"].value == "0:0,0:1,0:2"
    assert cfg["follower.replication.throttled.replicas"].value == "*"


def fill(c, name):
    fill_partition(c.bootstrap, name, RECORDS, VALUE)


def move_to_both(c, zk, tmp_path, name) -> float:
    plan = tmp_path / f"{name}.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [{"topic": name, "partition": 0, "replicas": [0, 1]}]}))
    t0 = time.monotonic()
    ex = subprocess.run([sys.executable, "-m", "kbroker", "reassign-partitions", "--zookeeper", c.zk_connect,
                         "--execute", "--reassignment-json-file", str(plan)], capture_output=True, text=True,
                        timeout=60)
    assert ex.returncode == 0, ex.stdout + ex.stderr
    wait_until(lambda: zk.exists(L.REASSIGN_PARTITIONS) is None, 120, f"the move of {name}", interval=0.05)
    return time.monotonic() - t0


@pytest.mark.slow
def test_rate_set_through_the_api_throttles_a_follower_and_delete_lifts_it(cluster, admin, zk, tmp_path):
    """Broker 1's follower rate set by IncrementalAlterConfigs holds a new replica's copy to about the
    rate; after a DELETE of the rate the same move is far faster. (Without the watcher applying the
    znode, or with the API writing elsewhere, the first move is as fast as the second and this fails.)"""
    c = cluster
    for name in ("slow-move", "free-move"):
        admin.create_topics([NewTopic(name, 1, replica_assignment=[[0]], config={
            "follower.replication.throttled.replicas": "*"})])[name].result(timeout=30)
        fill(c, name)
    size = sum(f.stat().st_size for f in partition_dir(c.brokers[0].data_dir, "slow-move", 0).glob("*.log"))
    assert size >= RECORDS * VALUE
    assert incr(admin, "1", (FOLLOWER_RATE, AlterConfigOpType.SET, str(RATE))).result(timeout=30) is None
    assert describe(admin, "1")[FOLLOWER_RATE].value == str(RATE)   # applied on broker 1 before the answer
    slow_s = move_to_both(c, zk, tmp_path, "slow-move")
    assert incr(admin, "1", (FOLLOWER_RATE, AlterConfigOpType.DELETE, None)).result(timeout=30) is None
    assert describe(admin, "1")[FOLLOWER_RATE].source == ConfigSource.DEFAULT_CONFIG.value
    free_s = move_to_both(c, zk, tmp_path, "free-move")
    expected = size / RATE
    print(f"{size} B: follower-throttled to {RATE} B/s through the API in {slow_s:.1f}s "
          f"(size/rate {expected:.1f}s); after DELETE {free_s:.1f}s")
    assert slow_s >= 0.5 * expected, (slow_s, expected)
    assert free_s < 0.5 * expected and free_s < slow_s / 2, (free_s, slow_s)


def test_flexible_versions_describe_v4_and_alter_v2(cluster):
    """DescribeConfigs v4 and AlterConfigs v2 (the flexible versions Kafka 2.4+ advertises) answer as
    the older versions do: a broker's dynamic key set and read back through them."""
    resp = raw(cluster, 0, 33, 2, {"resources": [{"resource_type": 4, "resource_name": "0", "configs": [
        {"name": FOLLOWER_RATE, "value": "7340032"}]}], "validate_only": False})
    assert [(r["error_code"], r["resource_name"]) for r in resp["responses"]] == [(0, "0")], resp
    resp = raw(cluster, 0, 32, 4, {"resources": [{"resource_type": 4, "resource_name": "0",
                                                  "configuration_keys": [FOLLOWER_RATE]}],
                                   "include_synonyms": True, "include_documentation": False})
    res = resp["results"][0]
    assert res["error_code"] == 0, res
    [entry] = res["configs"]
    assert (entry["name"], entry["value"], entry["config_source"]) == (FOLLOWER_RATE, "7340032", 2)   # DYNAMIC_BROKER_CONFIG
    # AlterConfigs replaces the entity's whole set: an empty set removes the key again.
    resp = raw(cluster, 0, 33, 2, {"resources": [{"resource_type": 4, "resource_name": "0", "configs": []}],
                                   "validate_only": False})
    assert resp["responses"][0]["error_code"] == 0, resp
    res = raw(cluster, 0, 32, 4, {"resources": [{"resource_type": 4, "resource_name": "0",
                                                 "configuration_keys": [FOLLOWER_RATE]}],
                                  "include_synonyms": False, "include_documentation": False})["results"][0]
    assert res["configs"][0]["config_source"] == 5, res    # DEFAULT_CONFIG
