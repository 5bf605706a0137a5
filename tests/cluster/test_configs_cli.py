"""``kbroker configs`` (kafka-configs.sh) as a subprocess against one real broker (LocalCluster, real
ZooKeeper): broker entity, cluster default and topic entity; describe output in Kafka's layout; alter
refusals exit 1 naming the key; the values land in ZooKeeper's /config/brokers znodes."""
from __future__ import annotations

import subprocess
import sys

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kazoo.client import KazooClient

from kbroker.testing import LocalCluster
from kbroker.zk import layout as L

RATE = "follower.replication.throttled.rate"
LONG_MAX = str(2**63 - 1)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("cfgcli"), brokers=1) as c:
        yield c


def configs(c, *args):
    p = subprocess.run([sys.executable, "-m", "kbroker", "configs", "--bootstrap-server", c.bootstrap, *args],
                       capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def stored(c, entity):
    zk = KazooClient(hosts=c.zk_connect)
    zk.start(timeout=10)
    try:
        node = zk.exists(L.broker_config_path(entity))
        return L.decode_config(zk.get(L.broker_config_path(entity))[0]) if node else {}
    finally:
        zk.stop()
        zk.close()


def test_broker_entity_and_default(cluster):
    c = cluster
    rc, out, err = configs(c, "--entity-type", "brokers", "--entity-name", "0", "--alter", "--add-config",
                           f"{RATE}=5000000")
    assert (rc, out.strip()) == (0, "Completed updating config for broker 0."), err
    assert stored(c, "0") == {RATE: "5000000"}
    rc, out, err = configs(c, "--entity-type", "brokers", "--entity-name", "0", "--describe")
    assert rc == 0, err
    assert out.splitlines() == [
        "Dynamic configs for broker 0 are:",
        f"  {RATE}=5000000 sensitive=false synonyms={{DYNAMIC_BROKER_CONFIG:{RATE}=5000000, "
        f"DEFAULT_CONFIG:{RATE}={LONG_MAX}}}"]
    rc, out, _ = configs(c, "--entity-type", "brokers", "--entity-name", "0", "--describe", "--all")
    assert out.splitlines()[0] == "All configs for broker 0 are:"
    assert any(line.startswith("  num.partitions=1 ") for line in out.splitlines())

    rc, out, err = configs(c, "--entity-type", "brokers", "--entity-default", "--alter", "--add-config",
                           "leader.replication.throttled.rate=7000000")
    assert (rc, out.strip()) == (0, "Completed updating default config for brokers in the cluster."), err
    assert stored(c, L.DEFAULT_BROKER_ENTITY) == {"leader.replication.throttled.rate": "7000000"}
    rc, out, err = configs(c, "--entity-type", "brokers", "--entity-default", "--describe")
    assert out.splitlines() == [
        "Default configs for brokers in the cluster are:",
        "  leader.replication.throttled.rate=7000000 sensitive=false synonyms={DYNAMIC_DEFAULT_BROKER_CONFIG:"
        f"leader.replication.throttled.rate=7000000, DEFAULT_CONFIG:leader.replication.throttled.rate={LONG_MAX}}}"]

    # Refused: a static key, a bad value; nothing written.
    rc, out, err = configs(c, "--entity-type", "brokers", "--entity-name", "0", "--alter", "--add-config",
                           "log.retention.hours=1")
    assert rc == 1 and "log.retention.hours" in err and "INVALID_REQUEST" in err, (out, err)
    rc, out, err = configs(c, "--entity-type", "brokers", "--entity-name", "0", "--alter", "--add-config",
                           f"{RATE}=-1")
    assert rc == 1 and RATE in err, (out, err)
    assert stored(c, "0") == {RATE: "5000000"}

    rc, out, err = configs(c, "--entity-type", "brokers", "--entity-name", "0", "--alter", "--delete-config", RATE)
    assert rc == 0, err
    rc, out, err = configs(c, "--entity-type", "brokers", "--entity-default", "--alter", "--delete-config",
                           "leader.replication.throttled.rate")
    assert rc == 0, err
    assert stored(c, "0") == {} and stored(c, L.DEFAULT_BROKER_ENTITY) == {}
    rc, out, err = configs(c, "--entity-type", "brokers", "--entity-name", "0", "--describe")
    assert out.splitlines() == ["Dynamic configs for broker 0 are:"]


def test_topic_entity_with_a_list_value(cluster):
    c = cluster
    admin = AdminClient({"bootstrap.servers": c.bootstrap})   # kept: a dropped client cancels its futures
    admin.create_topics([NewTopic("cli-t", 1, 1)])["cli-t"].result(30)
    key = "follower.replication.throttled.replicas"
    rc, out, err = configs(c, "--entity-type", "topics", "--entity-name", "cli-t", "--alter", "--add-config",
                           f"{key}=[0:0,1:0],retention.ms=60000")
    assert (rc, out.strip()) == (0, "Completed updating config for topic cli-t."), err
    rc, out, err = configs(c, "--entity-type", "topics", "--entity-name", "cli-t", "--describe")
    lines = out.splitlines()
    assert lines[0] == "Dynamic configs for topic cli-t are:"
    assert any(line.startswith(f"  {key}=0:0,1:0 sensitive=false synonyms={{DYNAMIC_TOPIC_CONFIG:{key}=0:0,1:0")
               for line in lines), lines
    rc, out, err = configs(c, "--entity-type", "topics", "--entity-name", "cli-t", "--alter", "--add-config",
                           f"{key}=[0-0]")
    assert rc == 1 and key in err and "INVALID_CONFIG" in err, (out, err)
