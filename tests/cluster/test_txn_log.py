"""Transactions on the partition side, on 3 real brokers (RF=3), driven by our own wire requests as the
transaction coordinator would send them: transactional Produce, WriteTxnMarkers (27) answered per
partition as Kafka does, a client-written control batch refused, the aborted-transaction index written by
the leader and by followers from the batches they copy, and rebuilt by recovery after kill -9."""
from __future__ import annotations

import os
import struct
import time
import urllib.request

import pytest

from kbroker.log import txn_index
from kbroker.testing import LocalCluster, free_port
import builders
from checkers import RawConn, wait_for_topic

TOPIC = "txn-log"
PRODUCE, INIT_PRODUCER_ID, WRITE_TXN_MARKERS = 0, 22, 27
NONE, NOT_LEADER_OR_FOLLOWER, INVALID_PRODUCER_EPOCH, INVALID_RECORD = 0, 6, 47, 87


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # The test plays the transaction coordinator with its own requests: no coordinator knows these
    # transactions, so the leaders must not ask one (KIP-890 verification off).
    c = LocalCluster(tmp_path_factory.mktemp("txnlog"), brokers=3,
                     overrides={"transaction.partition.verification.enable": False})
    for b in c.brokers.values():
        b.extra = {"kbroker.metrics.port": free_port()}
    with c:
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


# ---- reading: read_committed stops at the LSO and skips aborted data -------------------------------

READ_TOPIC = "txn-read"
FETCH, LIST_OFFSETS = 1, 2


def fetch(c, offset, isolation, min_bytes=1, max_wait_ms=0, version=11, topic=READ_TOPIC):
    r = c.request(FETCH, version, {
        "replica_id": -1, "max_wait_ms": max_wait_ms, "min_bytes": min_bytes, "max_bytes": 1 << 20,
        "isolation_level": isolation, "session_id": 0, "session_epoch": -1, "rack_id": "",
        "topics": [{"topic": topic, "partitions": [{"partition": 0, "current_leader_epoch": -1,
                                                    "fetch_offset": offset, "log_start_offset": -1,
                                                    "partition_max_bytes": 1 << 20}]}],
        "forgotten_topics_data": []})
    p = r["responses"][0]["partitions"][0]
    assert p["error_code"] == NONE, p
    return p


def latest(c, isolation, topic=READ_TOPIC):
    r = c.request(LIST_OFFSETS, 2, {"replica_id": -1, "isolation_level": isolation, "topics": [
        {"name": topic, "partitions": [{"partition_index": 0, "timestamp": -1}]}]})
    p = r["topics"][0]["partitions"][0]
    assert p["error_code"] == NONE
    return p["offset"]


# Current timestamps: the markers carry the broker's clock, and a segment rolls when record time jumps
# past segment.ms (a fetch reads one segment).
TS = int(time.time() * 1000)


def vbatch(vals, pid=-1, epoch=-1, seq=-1):
    from kafka.record.default_records import DefaultRecordBatchBuilder
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=pid >= 0 and seq >= 0,
                                  producer_id=pid, producer_epoch=epoch, base_sequence=seq, batch_size=1 << 20)
    for i, v in enumerate(vals):
        b.append(i, timestamp=TS, key=None, value=v, headers=[])
    return bytearray(b.build())


@pytest.fixture(scope="module")
def read_topic(cluster):
    """A: a0-a2 (0-2) | plain p0 p1 (3-4) | B: b0 b1 (5-6) | A: a3 a4 (7-8) | COMMIT A (9) | ABORT B (10) |
    C: c0 (11, ongoing)."""
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(READ_TOPIC, 1, 3)], operation_timeout=30)[READ_TOPIC].result(30)
    wait_for_topic(cluster.bootstrap, READ_TOPIC, 1)
    leader = leader_of(cluster, READ_TOPIC)
    with RawConn(addr(cluster, leader)) as c:
        (a, ea), (b, eb), (cc, ec) = init_pid(c), init_pid(c), init_pid(c)

        def send(vals, pid=-1, epoch=-1, seq=-1):
            r = c.request(PRODUCE, 7, {"transactional_id": "tx" if seq >= 0 else None, "acks": -1,
                                       "timeout_ms": 10000, "topic_data": [{"name": READ_TOPIC, "partition_data": [
                                           {"index": 0, "records": bytes(vbatch(vals, pid, epoch, seq))}]}]})
            p = r["responses"][0]["partition_responses"][0]
            assert p["error_code"] == NONE
            return p["base_offset"]
        assert send([b"a0", b"a1", b"a2"], a, ea, 0) == 0
        assert send([b"p0", b"p1"]) == 3
        assert send([b"b0", b"b1"], b, eb, 0) == 5
        assert send([b"a3", b"a4"], a, ea, 3) == 7
        # Before any marker: read_committed sees nothing (A's transaction starts at 0).
        assert latest(c, 1) == 0 and latest(c, 0) == 9
        p = fetch(c, 0, 1)
        assert p["last_stable_offset"] == 0 and p["high_watermark"] == 9 and not p["records"]
        r = c.request(WRITE_TXN_MARKERS, 1, {"markers": [
            {"producer_id": a, "producer_epoch": ea, "transaction_result": True, "coordinator_epoch": 0,
             "topics": [{"name": READ_TOPIC, "partition_indexes": [0]}]},
            {"producer_id": b, "producer_epoch": eb, "transaction_result": False, "coordinator_epoch": 0,
             "topics": [{"name": READ_TOPIC, "partition_indexes": [0]}]}]})
        assert [m["topics"][0]["partitions"][0]["error_code"] for m in r["markers"]] == [NONE, NONE]
        assert send([b"c0"], cc, ec, 0) == 11
    return {"leader": leader, "a": a, "b": b, "c": cc}


COMMITTED = [(0, b"a0"), (1, b"a1"), (2, b"a2"), (3, b"p0"), (4, b"p1"), (7, b"a3"), (8, b"a4")]
UNCOMMITTED = COMMITTED[:5] + [(5, b"b0"), (6, b"b1")] + COMMITTED[5:] + [(11, b"c0")]


def fetch_paths(cluster, broker_id):
    port = cluster.brokers[broker_id].extra["kbroker.metrics.port"]
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    prefix = "kbroker_fetch_native_requests_total{"
    return {line.split('path="', 1)[1].split('"', 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith(prefix)}


def test_fetch_and_list_offsets_stop_at_the_lso(cluster, read_topic):
    leader = read_topic["leader"]
    with RawConn(addr(cluster, leader)) as c:
        assert latest(c, 1) == 11 and latest(c, 0) == 12
        # Answered at once by the native path, and after a long poll by the reference path's read: the same row.
        before = fetch_paths(cluster, leader)
        rows = [fetch(c, 0, 1)]
        after = fetch_paths(cluster, leader)
        assert after.get("fast", 0) == before.get("fast", 0) + 1, (before, after)
        rows.append(fetch(c, 0, 1, min_bytes=1 << 20, max_wait_ms=50))
        assert fetch_paths(cluster, leader).get("reference", 0) == after.get("reference", 0) + 1
        for p in rows:
            assert p["last_stable_offset"] == 11 and p["high_watermark"] == 12
            assert [(t["producer_id"], t["first_offset"]) for t in p["aborted_transactions"]] == [
                (read_topic["b"], 5)]
        assert bytes(rows[0]["records"]) == bytes(rows[1]["records"])
        # read_uncommitted: up to the HW, no aborted transactions
        p = fetch(c, 0, 0)
        assert p["last_stable_offset"] == 12 and p["aborted_transactions"] is None
        assert len(bytes(p["records"])) > len(bytes(rows[0]["records"]))
        # from the commit marker: B's abort marker (10) is still in the range; at the LSO nothing is
        assert [t["first_offset"] for t in fetch(c, 9, 1)["aborted_transactions"]] == [5]
        assert fetch(c, 11, 1)["aborted_transactions"] == []


def _consume_kafka_python(bootstrap, isolation, until):
    from kafka import KafkaConsumer, TopicPartition
    c = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation, enable_auto_commit=False,
                      group_id=None, fetch_max_wait_ms=100)
    tp = TopicPartition(READ_TOPIC, 0)
    c.assign([tp])
    c.seek(tp, 0)
    out = []
    deadline = time.monotonic() + 30
    try:
        while not out or out[-1][0] < until:
            assert time.monotonic() < deadline, out
            for recs in c.poll(200).values():
                out += [(r.offset, r.value) for r in recs]
    finally:
        c.close()
    return out


def _consume_confluent(bootstrap, isolation, until):
    import confluent_kafka as ck
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"txn-{time.monotonic_ns()}",
                     "isolation.level": isolation, "enable.auto.commit": False, "fetch.wait.max.ms": 100})
    c.assign([ck.TopicPartition(READ_TOPIC, 0, 0)])
    out = []
    deadline = time.monotonic() + 30
    try:
        while not out or out[-1][0] < until:
            assert time.monotonic() < deadline, out
            for m in c.consume(100, 0.2):
                assert not m.error(), m.error()
                out.append((m.offset(), m.value()))
    finally:
        c.close()
    return out


def _consume_aiokafka(bootstrap, isolation, until):
    import asyncio
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def run():
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation, enable_auto_commit=False,
                             fetch_max_wait_ms=100)
        await c.start()
        tp = TopicPartition(READ_TOPIC, 0)
        c.assign([tp])
        c.seek(tp, 0)
        out = []
        try:
            while not out or out[-1][0] < until:
                for recs in (await c.getmany(timeout_ms=200)).values():
                    out += [(r.offset, r.value) for r in recs]
        finally:
            await c.stop()
        return out
    return asyncio.run(asyncio.wait_for(run(), 30))


@pytest.mark.parametrize("client", ["kafka-python", "confluent-kafka", "aiokafka"])
def test_clients_read_committed_see_exactly_committed_data(cluster, read_topic, client):
    consume = {"kafka-python": _consume_kafka_python, "confluent-kafka": _consume_confluent,
               "aiokafka": _consume_aiokafka}[client]
    assert consume(cluster.bootstrap, "read_committed", 8) == COMMITTED
    assert consume(cluster.bootstrap, "read_uncommitted", 11) == UNCOMMITTED


# ---- DescribeProducers ----------------------------------------------------------------------------

DESCRIBE_PRODUCERS = 61
UNKNOWN_TOPIC_OR_PARTITION = 3


def test_describe_producers(cluster, read_topic):
    leader = read_topic["leader"]
    follower = next(b for b in cluster.brokers if b != leader)
    body = {"topics": [{"name": READ_TOPIC, "partition_indexes": [0, 7]}]}
    with RawConn(addr(cluster, leader)) as c:
        r = c.request(DESCRIBE_PRODUCERS, 0, body)
    p0, p7 = r["topics"][0]["partitions"]
    assert p0["error_code"] == NONE and p7["error_code"] == UNKNOWN_TOPIC_OR_PARTITION
    got = {p["producer_id"]: p for p in p0["active_producers"]}
    a, b, c_ = read_topic["a"], read_topic["b"], read_topic["c"]
    assert set(got) == {a, b, c_}
    assert (got[a]["last_sequence"], got[a]["current_txn_start_offset"]) == (4, -1)     # committed
    assert (got[b]["last_sequence"], got[b]["current_txn_start_offset"]) == (1, -1)     # aborted
    assert (got[c_]["last_sequence"], got[c_]["current_txn_start_offset"]) == (0, 11)   # ongoing: hanging
    assert got[c_]["last_timestamp"] == TS and got[a]["coordinator_epoch"] == 0
    with RawConn(addr(cluster, follower)) as c:
        r = c.request(DESCRIBE_PRODUCERS, 0, body)
    assert r["topics"][0]["partitions"][0]["error_code"] == NOT_LEADER_OR_FOLLOWER
