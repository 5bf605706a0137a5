"""Transactions on the partition side, on 3 real brokers (RF=3), driven by our own wire requests as the
transaction coordinator would send them: transactional Produce, WriteTxnMarkers (27) answered per
partition as Kafka does, a client-written control batch refused, the aborted-transaction index written by
the leader and by followers from the batches they copy, and rebuilt by recovery after kill -9."""
from __future__ import annotations

import os
import struct
import time

import pytest

from kbroker.log import txn_index
from kbroker.testing import LocalCluster
import builders
from checkers import RawConn, wait_for_topic

TOPIC = "txn-log"
PRODUCE, INIT_PRODUCER_ID, WRITE_TXN_MARKERS = 0, 22, 27
NONE, NOT_LEADER_OR_FOLLOWER, INVALID_PRODUCER_EPOCH, INVALID_RECORD = 0, 6, 47, 87


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("txnlog"), brokers=3) as c:
        from confluent_kafka.admin import AdminClient, NewTopic
        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        admin.create_topics([NewTopic(TOPIC, 1, 3)], operation_timeout=30)[TOPIC].result(30)
        wait_for_topic(c.bootstrap, TOPIC, 1)
        yield c


def addr(cluster, broker_id):
    return f"127.0.0.1:{cluster.brokers[broker_id].port}"


def leader_of(cluster, topic=TOPIC, partition=0, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        t = wait_for_topic(cluster.bootstrap, topic, partition + 1)
        p = t["partitions"][partition]
        if p["leader_id"] >= 0 and len(p["isr_nodes"]) == len(p["replica_nodes"]):
            return p["leader_id"]
        if time.monotonic() > deadline:
            raise TimeoutError(f"{topic}-{partition}: {p}")
        time.sleep(0.1)


def init_pid(c):
    r = c.request(INIT_PRODUCER_ID, 1, {"transactional_id": None, "transaction_timeout_ms": 60000})
    assert r["error_code"] == NONE
    return r["producer_id"], r["producer_epoch"]


def produce(c, records, txn_id="tx", partition=0):
    r = c.request(PRODUCE, 7, {"transactional_id": txn_id, "acks": -1, "timeout_ms": 10000, "topic_data": [
        {"name": TOPIC, "partition_data": [{"index": partition, "records": bytes(records)}]}]})
    p = r["responses"][0]["partition_responses"][0]
    return p["error_code"], p["base_offset"]


def tx_batch(pid, epoch, seq, n):
    return builders.batch(n, 30, builders.T0, pid, epoch, seq, key=None, fill=b"t", ts_step=0, transactional=True)


def markers(c, *entries, partition=0, version=1):
    """entries: (producer_id, epoch, commit, coordinator_epoch) -> [error code per entry]."""
    r = c.request(WRITE_TXN_MARKERS, version, {"markers": [
        {"producer_id": pid, "producer_epoch": epoch, "transaction_result": commit, "coordinator_epoch": ce,
         "topics": [{"name": TOPIC, "partition_indexes": [partition]}]} for pid, epoch, commit, ce in entries]})
    return [m["topics"][0]["partitions"][0]["error_code"] for m in r["markers"]]


def txn_entries(cluster, broker_id, topic=TOPIC, partition=0):
    d = cluster.brokers[broker_id].data_dir / f"{topic}-{partition}"
    out = []
    for name in sorted(os.listdir(d)):
        if name.endswith(".txnindex"):
            data = (d / name).read_bytes()
            out += [e[1:4] for e in struct.iter_unpack(">hqqqq", data[:len(data) - len(data) % 34])]
    return out


def wait_until(pred, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.1)


def test_markers_end_transactions_on_every_replica(cluster):
    leader = leader_of(cluster)
    follower = next(b for b in cluster.brokers if b != leader)
    with RawConn(addr(cluster, leader)) as c:
        a, ea = init_pid(c)
        b, eb = init_pid(c)
        assert produce(c, tx_batch(a, ea, 0, 3)) == (NONE, 0)                   # 0-2
        assert produce(c, builders.batch(2, 30, key=None), txn_id=None) == (NONE, 3)   # 3-4, not transactional
        assert produce(c, tx_batch(b, eb, 0, 2)) == (NONE, 5)                   # 5-6
        assert produce(c, tx_batch(a, ea, 3, 2)) == (NONE, 7)                   # 7-8
        # A control batch written by a client is refused.
        bad = bytearray(txn_index.control_batch(a, ea, True, 0, 0, -1))
        assert produce(c, bad)[0] == INVALID_RECORD
        with RawConn(addr(cluster, follower)) as f:
            assert markers(f, (a, ea, True, 0)) == [NOT_LEADER_OR_FOLLOWER]
        # v0 and v1; two producers in one request: A commits (marker at 9), B aborts (at 10).
        assert markers(c, (a, ea, True, 0), (b, eb, False, 0), version=0) == [NONE, NONE]
        # The coordinator fencing A (bumped epoch): A's old epoch is refused afterwards.
        assert produce(c, tx_batch(a, ea, 5, 1)) == (NONE, 11)
        assert markers(c, (a, ea + 1, False, 0)) == [NONE]                      # marker at 12
        assert markers(c, (a, ea, True, 0)) == [INVALID_PRODUCER_EPOCH]
        assert produce(c, tx_batch(a, ea, 6, 1))[0] == INVALID_PRODUCER_EPOCH
    expected = [(b, 5, 10), (a, 11, 12)]
    for broker in cluster.brokers:         # the leader's own and the followers' rebuilt from the copies
        wait_until(lambda: txn_entries(cluster, broker) == expected,
                   f"broker {broker}: {txn_entries(cluster, broker)}")


def test_kill_9_rebuilds_the_index(cluster):
    leader = leader_of(cluster)
    victim = next(b for b in cluster.brokers if b != leader)
    before = txn_entries(cluster, victim)
    assert before
    cluster.kill(victim)
    cluster.brokers[victim].proc.wait(10)
    d = cluster.brokers[victim].data_dir / f"{TOPIC}-0"
    for name in os.listdir(d):
        if name.endswith((".txnindex", ".snapshot")):
            os.unlink(d / name)
    cluster.start_broker(victim)
    wait_until(lambda: txn_entries(cluster, victim) == before, f"after restart: {txn_entries(cluster, victim)}")
    leader_of(cluster)                      # back in the ISR

