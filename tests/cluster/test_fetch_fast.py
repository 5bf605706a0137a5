"""The consumer's small one-partition Fetch served without a Python frame (ext/request.pyx
FastFetch, the leader slots of kbroker/replica/manager.py ``_fast_refresh``): real brokers, real clients
(confluent-kafka, kafka-python, aiokafka, kcat) and raw requests. The broker's
``kbroker_fetch_native_requests_total{path=fast|reference}`` counters show which path served each Fetch;
every reason the native path must leave a fetch to Python is shown to do so (and to give Python's
answer), and plain fetches to be served natively again afterwards.

Counter-checks (each broken on purpose, this file failed, then restored): the epoch check dropped
(``current_leader_epoch`` newer than the slot's served: the fencing test saw records instead of
UNKNOWN_LEADER_EPOCH); the high watermark cap replaced by the log end (the RF=3 lagging-follower test
saw batches at and past the HW); the disarm on leadership loss together with the per-request epoch
and leader guards dropped (the leadership test failed). Dropping the active-segment base check alone
changes nothing visible: the recent-batch list's and the read block's floors already refuse offsets
before the active segment (it stays as a guard). Several partitions per Fetch (each broken alone, the
named tests failed, restored): the fast path limited to one topic with one partition again (every
client of the six-partition topic served by the reference path: 0 fast for confluent-kafka, kafka-python, aiokafka;
the multi-partition differential 0 fast); a non-empty rack id refused (the rack-id fetches and
confluent-kafka with client.rack went to the reference path); every partition given a whole first batch (the max_bytes
budget test and the differential saw records where Python leaves the row empty); the HW cap replaced
by the log end (the RF=3 six-partition test saw batches past each HW). The budget left undecremented
is caught by tests/test_native_differential.py's multi-partition test alone.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import threading
import time
import types
import urllib.request
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from checkers import FETCH, RawConn, all_batches, create_topic, segment_files, wait_for_topic
from kbroker.testing import wait_until
from kbroker.protocol.errors import Errors
from test_produce_fast import (alter_topic, leader_conn, new_topic, one, produce_confluent, produce_raw,  # noqa: F401
                               rf3_topic, single, three)
from test_produce_fast import test_long_poll_woken_by_native_append as _produce_long_poll

OFFSET_OUT_OF_RANGE = Errors.OFFSET_OUT_OF_RANGE
UNKNOWN_TOPIC_OR_PARTITION = Errors.UNKNOWN_TOPIC_OR_PARTITION
NOT_LEADER_OR_FOLLOWER = Errors.NOT_LEADER_OR_FOLLOWER
FENCED_LEADER_EPOCH = Errors.FENCED_LEADER_EPOCH
UNKNOWN_LEADER_EPOCH = Errors.UNKNOWN_LEADER_EPOCH
_COUNTER = re.compile(r'^kbroker_fetch_native_requests_total\{path="(\w+)"\} (\S+)$', re.M)


_FOLLOWER = re.compile(r'^kbroker_fetch_native_follower_requests_total\{path="(\w+)"\} (\S+)$', re.M)


def fetch_counts(port: int) -> dict:
    """{path: count} of kbroker_fetch_native_requests_total, and of the followers' counter as
    follower_<path>."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {path: int(float(n)) for path, n in _COUNTER.findall(text)}
    out.update({"follower_" + path: int(float(n)) for path, n in _FOLLOWER.findall(text)})
    return out


@contextlib.contextmanager
def Fetches(port):
    """Fetch requests served while the block ran, once it left: ``d.fast``, ``d.reference`` and the
    followers' ``d.follower_fast``, ``d.follower_polled``, ``d.follower_reference``."""
    d = types.SimpleNamespace(before=fetch_counts(port))
    yield d
    after = fetch_counts(port)
    for key in ("fast", "reference", "follower_fast", "follower_polled", "follower_reference"):
        setattr(d, key, after.get(key, 0) - d.before.get(key, 0))


def fetch_raw(conn, topic, offset, version=11, partition_max=1 << 20, epoch=-1, max_wait_ms=0, min_bytes=1,
              timeout=30):
    """-> the partition's answer dict (records as bytes)."""
    body = {"replica_id": -1, "max_wait_ms": max_wait_ms, "min_bytes": min_bytes, "max_bytes": 1 << 20,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [],
            "rack_id": "", "topics": [{"topic": topic, "partitions": [
                {"partition": 0, "current_leader_epoch": epoch, "fetch_offset": offset, "log_start_offset": -1,
                 "partition_max_bytes": partition_max}]}]}
    part = conn.request(FETCH, version, body, timeout=timeout)["responses"][0]["partitions"][0]
    part["records"] = bytes(part["records"] or b"")
    return part


def log_bytes(c, topic, bid=0) -> bytes:
    return b"".join(p.read_bytes() for p in segment_files(c.brokers[bid].data_dir, topic, 0))


def read_all(conn, topic, end, partition_max=1):
    """Every batch from offset 0 to ``end`` by one-batch fetches -> the concatenated record bytes."""
    out, offset = [], 0
    while offset < end:
        part = fetch_raw(conn, topic, offset, partition_max=partition_max)
        assert part["error_code"] == 0, part
        data = part["records"]
        assert data, (offset, part)
        out.append(data)
        offset = int.from_bytes(data[:8], "big") + int.from_bytes(data[23:27], "big") + 1   # last offset + 1
    return b"".join(out)


# ---- RF=1 -------------------------------------------------------------------------------------------
def test_consumers_read_everything_natively(single):
    """One-record batches read back batch by batch byte for byte as the log holds them, and by
    confluent-kafka, kafka-python, aiokafka and kcat in order; nearly every fetch native."""
    c, port = single
    topic = new_topic(c)
    assert produce_confluent(c.bootstrap, topic, 300) == []
    with Fetches(port) as d, RawConn(c.bootstrap, timeout=30) as conn:
        got = read_all(conn, topic, 301)
    assert got == log_bytes(c, topic)
    # Python: the first fetch (no read block yet), and one each time the reader walks past a block
    assert d.fast >= 290 and d.reference <= 5, (d.fast, d.reference)
    want = [b"v"] + [b"value-%d" % i for i in range(300)]

    cons = Consumer({"bootstrap.servers": c.bootstrap, "group.id": "ff-" + uuid.uuid4().hex[:6],
                     "enable.auto.commit": False, "max.partition.fetch.bytes": 512})
    values = []
    with Fetches(port) as d:
        try:
            cons.assign([TopicPartition(topic, 0, 0)])
            deadline = time.monotonic() + 60
            while len(values) < 301 and time.monotonic() < deadline:
                for m in cons.consume(500, timeout=0.5):
                    assert not m.error(), m.error()
                    values.append(m.value())
        finally:
            cons.close()
    assert values == want
    assert d.fast > 10, (d.fast, d.reference)

    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP
    kc = KafkaConsumer(bootstrap_servers=c.bootstrap, enable_auto_commit=False, max_partition_fetch_bytes=512,
                       fetch_max_bytes=4096, consumer_timeout_ms=5000)
    try:
        kc.assign([KTP(topic, 0)])
        kc.seek(KTP(topic, 0), 0)
        kvalues = []
        for m in kc:
            kvalues.append(m.value)
            if len(kvalues) == 301:
                break
    finally:
        kc.close()
    assert kvalues == want

    async def aio():
        from aiokafka import AIOKafkaConsumer
        from aiokafka.structs import TopicPartition as ATP
        ac = AIOKafkaConsumer(bootstrap_servers=c.bootstrap, enable_auto_commit=False,
                              max_partition_fetch_bytes=512, fetch_max_bytes=4096)
        await ac.start()
        try:
            ac.assign([ATP(topic, 0)])
            ac.seek(ATP(topic, 0), 0)
            out = []
            while len(out) < 301:
                batch = await asyncio.wait_for(ac.getmany(timeout_ms=500), 30)
                for msgs in batch.values():
                    out.extend(m.value for m in msgs)
            return out
        finally:
            await ac.stop()
    assert asyncio.run(aio()) == want

    kcat = subprocess.run(["kcat", "-C", "-b", c.bootstrap, "-t", topic, "-p", "0", "-o", "beginning", "-e",
                           "-f", "%s\\n", "-X", "fetch.message.max.bytes=512"],
                          capture_output=True, timeout=60, check=True)
    assert kcat.stdout.split(b"\n")[:301] == want


def test_offsets_at_and_past_the_high_watermark(single):
    """HW-1 native; at the HW with max_wait_ms 0 (nothing to read: an empty answer at once) native,
    with max_wait_ms > 0 a long poll (Python), past it (OFFSET_OUT_OF_RANGE) Python; a limit below the
    batch size still gets one whole batch (KIP-74), natively."""
    c, port = single
    topic = new_topic(c)
    with RawConn(c.bootstrap, timeout=30) as conn:
        for i in range(5):
            assert produce_raw(conn, topic, one(b"x%d" % i))["error_code"] == 0
        with Fetches(port) as d:
            last = fetch_raw(conn, topic, 5, partition_max=1)
        assert (d.fast, d.reference) == (1, 0)
        assert last["error_code"] == 0 and last["high_watermark"] == 6 and b"x4" in last["records"]
        with Fetches(port) as d:
            at = fetch_raw(conn, topic, 6)
            past = fetch_raw(conn, topic, 7)
        assert (d.fast, d.reference) == (1, 1)
        assert at["error_code"] == 0 and at["records"] == b"" and at["high_watermark"] == 6
        with Fetches(port) as d:
            polled = fetch_raw(conn, topic, 6, max_wait_ms=20)
        assert (d.fast, d.reference) == (0, 1)
        assert polled["error_code"] == 0 and polled["records"] == b"" and polled["high_watermark"] == 6
        assert past["error_code"] == OFFSET_OUT_OF_RANGE
        with Fetches(port) as d:
            every = fetch_raw(conn, topic, 0)
        assert (d.fast, d.reference) == (1, 0)
        assert every["records"] == log_bytes(c, topic)


def test_epoch_fencing(single):
    """current_leader_epoch newer than the leader's: UNKNOWN_LEADER_EPOCH by Python; the current one
    (and -1) native."""
    c, port = single
    topic = new_topic(c)
    with RawConn(c.bootstrap, timeout=30) as conn:
        with Fetches(port) as d:
            newer = fetch_raw(conn, topic, 0, epoch=1)
            current = fetch_raw(conn, topic, 0, epoch=0)
            anyone = fetch_raw(conn, topic, 0, epoch=-1)
        assert newer["error_code"] == UNKNOWN_LEADER_EPOCH and newer["records"] == b""
        assert current["error_code"] == 0 and current["records"] == anyone["records"] != b""
        assert (d.fast, d.reference) == (2, 1), (d.fast, d.reference)


def test_segment_rolls_and_old_segments(single):
    """Small segments: fetches of closed segments go to Python, of the active one natively; a reader
    following the appends across rolls gets every batch byte for byte; versions 4-11 alike."""
    c, port = single
    topic = new_topic(c, {"segment.bytes": "600"})
    with RawConn(c.bootstrap, timeout=30) as conn:
        for i in range(40):
            assert produce_raw(conn, topic, one(b"s%d" % i))["error_code"] == 0
        files = segment_files(c.brokers[0].data_dir, topic, 0)
        assert len(files) >= 4, files
        active_base = int(files[-1].name.split(".")[0])
        with Fetches(port) as d:
            old = fetch_raw(conn, topic, 0, partition_max=1)
            new = fetch_raw(conn, topic, active_base, partition_max=1)
        assert (d.fast, d.reference) == (1, 1), (d.fast, d.reference)
        assert old["error_code"] == new["error_code"] == 0
        assert int.from_bytes(new["records"][:8], "big") == active_base
        with Fetches(port) as d:
            assert read_all(conn, topic, 41) == log_bytes(c, topic)
        assert d.fast >= 1 and d.reference >= 30, (d.fast, d.reference)
        # a reader at the tail while the log rolls under it
        offset, seen = 41, []
        with Fetches(port) as d:
            for i in range(30):
                assert produce_raw(conn, topic, one(b"t%d" % i))["error_code"] == 0
                part = fetch_raw(conn, topic, offset, version=4 + i % 8, partition_max=1)
                assert part["error_code"] == 0, part
                seen.append(part["records"])
                offset += 1
        stored = [path.read_bytes()[b.position:b.position + b.length + 12]
                  for path, b in all_batches(c.brokers[0].data_dir, topic, 0)[-30:]]
        assert seen == stored
        assert [int.from_bytes(r[:8], "big") for r in seen] == list(range(41, 71))
        assert d.fast >= 20, (d.fast, d.reference)


def test_retention_moves_log_start(tmp_path):
    """Retention deletes old segments and moves the log start: below it OFFSET_OUT_OF_RANGE (Python),
    in the active segment native, with the new log start in the answer."""
    from kbroker.testing import LocalCluster, free_port
    port = free_port()
    with LocalCluster(tmp_path / "ret", overrides={"kbroker.metrics.port": port,
                                                   "log.retention.check.interval.ms": 300}) as c:
        topic = new_topic(c, {"segment.bytes": "600"})
        with RawConn(c.bootstrap, timeout=30) as conn:
            for i in range(20):
                assert produce_raw(conn, topic, one(b"r%d" % i))["error_code"] == 0
            alter_topic(c.bootstrap, topic, retention_bytes=700)
            wait_until(lambda: fetch_raw(conn, topic, 0)["error_code"] == OFFSET_OUT_OF_RANGE, 30,
                       "old segments deleted")
            fetch_raw(conn, topic, 20, partition_max=1)     # reads the block
            with Fetches(port) as d:
                below = fetch_raw(conn, topic, 0)
                last = fetch_raw(conn, topic, 20, partition_max=1)
        assert below["error_code"] == OFFSET_OUT_OF_RANGE
        start = int(segment_files(c.brokers[0].data_dir, topic, 0)[0].name.split(".")[0])
        assert last["error_code"] == 0 and last["log_start_offset"] == start > 0, (last, start)
        assert int.from_bytes(last["records"][:8], "big") == 20
        assert (d.fast, d.reference) == (1, 1), (d.fast, d.reference)


def test_long_poll_woken_by_append(single):
    """A fetch at the HW long-polls (the reference path) and is woken by a native append: test_produce_fast's
    long-poll test, run here with the Fetch fast path on, the fetch counted as Python's."""
    c, port = single
    with Fetches(port) as d:
        _produce_long_poll(single)
    assert (d.fast, d.reference) == (0, 1)


def test_large_answer_goes_by_sendfile(single):
    """An answer of the sendfile threshold or more (64 KiB) leaves the native path; a small one of
    the same log stays native."""
    c, port = single
    topic = new_topic(c)
    with RawConn(c.bootstrap, timeout=30) as conn:
        for i in range(12):
            assert produce_raw(conn, topic, one(b"L" * 8000))["error_code"] == 0
        with Fetches(port) as d:
            big = fetch_raw(conn, topic, 0)
            small = fetch_raw(conn, topic, 3, partition_max=1)
        assert (d.fast, d.reference) == (1, 1), (d.fast, d.reference)     # the small one reads its block natively
        assert big["records"] == log_bytes(c, topic)
        assert len(big["records"]) > 64 * 1024
        assert int.from_bytes(small["records"][:8], "big") == 3


def test_topic_delete(single):
    c, port = single
    topic = new_topic(c)
    with RawConn(c.bootstrap, timeout=30) as conn:
        assert fetch_raw(conn, topic, 0)["error_code"] == 0
        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        admin.delete_topics([topic])[topic].result(30)
        wait_until(lambda: fetch_raw(conn, topic, 0)["error_code"] != 0, 30, "the topic gone")
        with Fetches(port) as d:
            gone = fetch_raw(conn, topic, 0)
        assert gone["error_code"] in (UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER_OR_FOLLOWER)
        assert (d.fast, d.reference) == (0, 1)
    create_topic(c.bootstrap, topic, 1)
    with RawConn(c.bootstrap, timeout=30) as conn:
        wait_until(lambda: produce_raw(conn, topic, one(b"again"))["error_code"] == 0, 30, "the topic back")
        with Fetches(port) as d:
            back = fetch_raw(conn, topic, 0)
        assert b"again" in back["records"] and (d.fast, d.reference) == (1, 0)


def test_switch_off(tmp_path):
    """KBROKER_FAST_FETCH=0: every Fetch by Python (the counter then absent), same answers."""
    from kbroker.testing import LocalCluster, free_port
    port = free_port()
    with LocalCluster(tmp_path / "off", overrides={"kbroker.metrics.port": port},
                      env={"KBROKER_FAST_FETCH": "0"}) as c:
        topic = new_topic(c)
        with RawConn(c.bootstrap, timeout=30) as conn:
            part = fetch_raw(conn, topic, 0)
        assert part["error_code"] == 0 and part["records"] == log_bytes(c, topic)
        assert fetch_counts(port) == {}
        assert "native Fetch fast path off" in c.brokers[0].log_path.read_text()


# ---- several partitions per Fetch ------------------------------------------------------------------
PARTS = 6


def spread_topic(c, parts=PARTS, per=60):
    """A ``parts``-partition topic, each partition holding b"v" then ``per`` one-record batches
    b"p<partition>-<i>" (confluent-kafka, one record per Produce). -> (name, {partition: values})."""
    name = f"fastm-{uuid.uuid4().hex[:8]}"
    create_topic(c.bootstrap, name, parts)
    with RawConn(c.bootstrap, timeout=30) as conn:
        for p in range(parts):
            wait_until(lambda p=p: produce_raw(conn, name, one(), index=p)["error_code"] == 0, 30, "the first append")
    prod = Producer({"bootstrap.servers": c.bootstrap, "linger.ms": 0, "batch.num.messages": 1, "acks": 1})
    for i in range(per):
        for p in range(parts):
            prod.produce(name, value=b"p%d-%d" % (p, i), partition=p)
        prod.poll(0)
    assert prod.flush(60) == 0
    return name, {p: [b"v"] + [b"p%d-%d" % (p, i) for i in range(per)] for p in range(parts)}


def fetch_parts(conn, topic, offsets, version=11, partition_max=1 << 20, max_bytes=1 << 20, rack=""):
    """One consumer Fetch naming every partition of ``offsets`` ({partition: offset}) in that order
    -> the answer's partition dicts (records as bytes)."""
    body = {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": max_bytes, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": rack,
            "topics": [{"topic": topic, "partitions": [
                {"partition": p, "current_leader_epoch": -1, "fetch_offset": o, "log_start_offset": -1,
                 "partition_max_bytes": partition_max} for p, o in offsets.items()]}]}
    parts = conn.request(FETCH, version, body, timeout=30)["responses"][0]["partitions"]
    for part in parts:
        part["records"] = bytes(part["records"] or b"")
    return parts


def part_bytes(c, topic, p, below=None, bid=0) -> bytes:
    """Partition ``p``'s stored batches (those whose last offset is below ``below``, when given)."""
    return b"".join(path.read_bytes()[b.position:b.position + b.length + 12]
                    for path, b in all_batches(c.brokers[bid].data_dir, topic, p)
                    if below is None or b.last_offset < below)


def test_several_partitions_in_one_fetch(single):
    """One Fetch of six partitions (and of the same six in another order, with a rack id, v4-11):
    native, every partition's whole log in request order; at the HW an empty row; a budget (max_bytes)
    smaller than the data: the first partition with data gets one whole batch (KIP-74), the later ones
    nothing, still natively; a partition of a closed segment or out of range: Python for the whole
    request."""
    c, port = single
    topic, _want = spread_topic(c, per=10)
    order = [3, 0, 5, 1, 4, 2]
    with RawConn(c.bootstrap, timeout=30) as conn:
        with Fetches(port) as d:
            whole = fetch_parts(conn, topic, {p: 0 for p in range(PARTS)})
            shuffled = [fetch_parts(conn, topic, {p: 0 for p in order}, version=v, rack="rack-1") for v in range(4, 12)]
            at_hw = fetch_parts(conn, topic, {p: 11 for p in range(PARTS)})
            budget = fetch_parts(conn, topic, {p: 0 for p in order}, max_bytes=1)
        assert (d.fast, d.reference) == (11, 0), (d.fast, d.reference)
        assert [r["partition_index"] for r in whole] == list(range(PARTS))
        assert [r["records"] for r in whole] == [part_bytes(c, topic, p) for p in range(PARTS)]
        for rows in shuffled:
            assert [(r["partition_index"], r["records"]) for r in rows] == [(p, part_bytes(c, topic, p)) for p in order]
        assert [(r["error_code"], r["high_watermark"], r["records"]) for r in at_hw] == [(0, 11, b"")] * PARTS
        first = part_bytes(c, topic, order[0], below=1)
        assert [r["records"] for r in budget] == [first] + [b""] * (PARTS - 1)
        with Fetches(port) as d:
            out_of_range = fetch_parts(conn, topic, {0: 0, 1: 99})
        assert (d.fast, d.reference) == (0, 1)
        assert out_of_range[0]["records"] == part_bytes(c, topic, 0)
        assert out_of_range[1]["error_code"] == OFFSET_OUT_OF_RANGE


def _consume_all(c, port, topic, want):
    """confluent-kafka, kafka-python, aiokafka and kcat each read every partition of ``topic`` from the
    start (all partitions assigned: one Fetch names them all), in order per partition.
    -> {client: (fast, reference)} fetches served while it read."""
    counts = {}
    total = sum(len(v) for v in want.values())

    def by_partition(pairs):
        got = {p: [] for p in want}
        for p, v in pairs:
            got[p].append(v)
        return got

    cons = Consumer({"bootstrap.servers": c.bootstrap, "group.id": "ffm-" + uuid.uuid4().hex[:6],
                     "enable.auto.commit": False, "max.partition.fetch.bytes": 256, "client.rack": "rack-a"})
    pairs = []
    with Fetches(port) as d:
        try:
            cons.assign([TopicPartition(topic, p, 0) for p in want])
            deadline = time.monotonic() + 60
            while len(pairs) < total and time.monotonic() < deadline:
                for m in cons.consume(500, timeout=0.5):
                    assert not m.error(), m.error()
                    pairs.append((m.partition(), m.value()))
        finally:
            cons.close()
    assert by_partition(pairs) == want
    counts["confluent-kafka"] = (d.fast, d.reference)

    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP
    # sessionless: a fetch session's fetches are Python's (tests/cluster/test_fetch_sessions.py)
    kc = KafkaConsumer(bootstrap_servers=c.bootstrap, enable_auto_commit=False, max_partition_fetch_bytes=256,
                       consumer_timeout_ms=5000, enable_incremental_fetch_sessions=False)
    pairs = []
    with Fetches(port) as d:
        try:
            kc.assign([KTP(topic, p) for p in want])
            for p in want:
                kc.seek(KTP(topic, p), 0)
            for m in kc:
                pairs.append((m.partition, m.value))
                if len(pairs) == total:
                    break
        finally:
            kc.close()
    assert by_partition(pairs) == want
    counts["kafka-python"] = (d.fast, d.reference)

    async def aio():
        from aiokafka import AIOKafkaConsumer
        from aiokafka.structs import TopicPartition as ATP
        ac = AIOKafkaConsumer(bootstrap_servers=c.bootstrap, enable_auto_commit=False,
                              max_partition_fetch_bytes=256)
        await ac.start()
        try:
            ac.assign([ATP(topic, p) for p in want])
            for p in want:
                ac.seek(ATP(topic, p), 0)
            out = []
            deadline = time.monotonic() + 60
            while len(out) < total and time.monotonic() < deadline:
                batch = await asyncio.wait_for(ac.getmany(timeout_ms=500), 30)
                for msgs in batch.values():
                    out.extend((m.partition, m.value) for m in msgs)
            return out
        finally:
            await ac.stop()
    with Fetches(port) as d:
        pairs = asyncio.run(aio())
    assert by_partition(pairs) == want
    counts["aiokafka"] = (d.fast, d.reference)

    with Fetches(port) as d:
        kcat = subprocess.run(["kcat", "-C", "-b", c.bootstrap, "-t", topic, "-o", "beginning", "-e",
                               "-f", "%p %s\\n", "-X", "fetch.message.max.bytes=256"],
                              capture_output=True, timeout=60, check=True)
    pairs = [(int(p), v) for p, v in (line.split(b" ", 1) for line in kcat.stdout.split(b"\n") if line)]
    assert by_partition(pairs) == want
    counts["kcat"] = (d.fast, d.reference)
    return counts


def test_consumers_of_six_partitions_read_natively(single):
    """Each real client assigned all six partitions reads everything in order per partition, its
    multi-partition fetches served natively: more fast than reference for every client (before several
    partitions per Fetch were served, all of them took the reference path), confluent-kafka's with a rack id
    (client.rack). The counts are printed. kafka-python runs without fetch sessions here (the native path
    leaves a session's fetches to Python)."""
    c, port = single
    topic, want = spread_topic(c)
    counts = _consume_all(c, port, topic, want)
    print("fast/reference fetches per client:", counts)
    for client, (fast, reference) in counts.items():
        assert fast > reference and fast >= 5, (client, counts)


# ---- RF=3 -------------------------------------------------------------------------------------------
# The followers' own fetches count too (replica_id >= 0; fast when they carry records, tests/
# test_follower_fast.py): the windows below have the followers stopped or nothing appended.
@pytest.mark.slow
def test_rf3_consumer_never_sees_past_the_hw(three):
    """Followers stopped: appends (acks=1) stay above the HW until the ISR shrinks; a consumer's fetch
    (natively) ends below the HW, and one at the HW gets nothing."""
    c, ports = three
    topic = rf3_topic(c)
    with leader_conn(c, 0) as conn:
        wait_until(lambda: fetch_raw(conn, topic, 0)["high_watermark"] == 1, 30, "HW at the first record")
        for bid in (1, 2):
            os.kill(c.brokers[bid].pid, 19)       # SIGSTOP
        try:
            for i in range(5):
                assert produce_raw(conn, topic, one(b"h%d" % i))["error_code"] == 0
            with Fetches(ports[0]) as d:
                part = fetch_raw(conn, topic, 0)
                at = fetch_raw(conn, topic, 1)
            hw = part["high_watermark"]
            batches = all_batches(c.brokers[0].data_dir, topic, 0)
            if hw == 1:         # the ISR has not shrunk yet (replica.lag.time.max.ms: 3 s)
                assert part["records"] == log_bytes(c, topic)[:batches[1][1].position]
                assert at["records"] == b""
                assert d.fast == 2, (d.fast, d.reference)        # both: at the HW with max_wait_ms 0 too
        finally:
            for bid in (1, 2):
                os.kill(c.brokers[bid].pid, 18)   # SIGCONT
    assert hw == 1, "the ISR shrank before the read: rerun"


@pytest.mark.slow
def test_rf3_leadership_move(three):
    """Leadership moves away: the old leader answers NOT_LEADER_OR_FOLLOWER to Fetch v10 and serves v11 as a
    follower (KIP-392; Python), the new leader serves natively with the new epoch and fences the old one.
    (The waits use v10, which only a leader answers.)"""
    from confluent_kafka import ElectionType
    c, ports = three
    topic = rf3_topic(c, leader=1)
    c.stop_broker(1)
    c.start_broker(1)
    with leader_conn(c, 0) as conn:
        wait_until(lambda: fetch_raw(conn, topic, 0, version=10)["error_code"] == 0, 30, "broker 0 leads")
        with Fetches(ports[0]) as d:
            assert fetch_raw(conn, topic, 0, epoch=1)["error_code"] == 0
        assert d.fast == 1
    admin = AdminClient({"bootstrap.servers": c.bootstrap})

    def elected():
        try:
            errors = admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic, 0)]).result(30)
        except Exception:
            time.sleep(0.5)
            return False
        if any(e is not None for e in errors.values()):
            time.sleep(0.5)
            return False
        return True
    wait_until(elected, 60, "the preferred leader elected")
    with leader_conn(c, 0) as conn:
        wait_until(lambda: fetch_raw(conn, topic, 0, version=10)["error_code"] == NOT_LEADER_OR_FOLLOWER, 30,
                   "the old leader refuses")
        with Fetches(ports[0]) as d:
            assert fetch_raw(conn, topic, 0, version=10)["error_code"] == NOT_LEADER_OR_FOLLOWER
            assert fetch_raw(conn, topic, 0)["error_code"] == 0
        assert d.fast == 0
    with leader_conn(c, 1) as conn:
        wait_until(lambda: fetch_raw(conn, topic, 0, version=10)["error_code"] == 0, 30, "the new leader")
        with Fetches(ports[1]) as d:
            fenced = fetch_raw(conn, topic, 0, epoch=1)
            ok = fetch_raw(conn, topic, 0, epoch=2)
        assert fenced["error_code"] == FENCED_LEADER_EPOCH
        assert ok["error_code"] == 0 and ok["records"]
        assert d.fast == 1, (d.fast, d.reference)


@pytest.mark.slow
def test_rf3_several_partitions_never_past_the_hw(three):
    """Six partitions led by broker 0, followers stopped: appends (acks=1) stay above each partition's
    HW until the ISR shrinks; one Fetch of all six (natively) ends below every partition's HW."""
    c, ports = three
    name = f"fast3m-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    admin.create_topics([NewTopic(name, PARTS, replica_assignment=[[0, 1, 2]] * PARTS)])[name].result(30)
    wait_for_topic(c.bootstrap, name, PARTS)
    with leader_conn(c, 0) as conn:
        for p in range(PARTS):
            wait_until(lambda p=p: produce_raw(conn, name, one(), index=p)["error_code"] == 0, 30, "the first append")
        wait_until(lambda: all(r["high_watermark"] == 1 for r in fetch_parts(conn, name, dict.fromkeys(range(PARTS), 0))),
                   30, "every HW at the first record")
        for bid in (1, 2):
            os.kill(c.brokers[bid].pid, 19)       # SIGSTOP
        try:
            for p in range(PARTS):
                for i in range(p + 1):
                    assert produce_raw(conn, name, one(b"h%d" % i), index=p)["error_code"] == 0
            with Fetches(ports[0]) as d:
                rows = fetch_parts(conn, name, dict.fromkeys(range(PARTS), 0))
        finally:
            for bid in (1, 2):
                os.kill(c.brokers[bid].pid, 18)   # SIGCONT
    assert [r["high_watermark"] for r in rows] == [1] * PARTS, "the ISR shrank before the read: rerun"
    assert d.fast == 1, (d.fast, d.reference)
    for p, r in enumerate(rows):
        assert r["records"] == part_bytes(c, name, p, below=1) != part_bytes(c, name, p), p
