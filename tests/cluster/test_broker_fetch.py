"""Fetch and ListOffsets through a running broker: long-poll timing, per-connection isolation and
ordering, KIP-74 size semantics, timestamps lookups, read_committed end offsets.

Raw requests are built with ``kbroker.protocol.api.encode_request`` so timing and sizes are under the
test's control; real clients (confluent-kafka, kafka-python) check the same behaviour end to end.
The small raw-protocol helpers here are also used by test_broker_storage.py / test_broker_lifecycle.py.
"""
from __future__ import annotations

import socket
import struct
import time
import uuid

import pytest

from kbroker._native import batch as native_batch
from kbroker.protocol import api
from kbroker.testing import wait_until as wait_for
from kbroker.protocol.errors import Errors

PRODUCE, FETCH, LIST_OFFSETS, METADATA, API_VERSIONS = 0, 1, 2, 3, 18
FETCH_V, LIST_OFFSETS_V, PRODUCE_V, METADATA_V = 11, 5, 8, 8
NONE, OFFSET_OUT_OF_RANGE, UNKNOWN_TOPIC_OR_PARTITION, KAFKA_STORAGE_ERROR = (Errors.NONE, Errors.OFFSET_OUT_OF_RANGE, Errors.UNKNOWN_TOPIC_OR_PARTITION, Errors.KAFKA_STORAGE_ERROR)
LATEST, EARLIEST = -1, -2
QUIET_WINDOW_S = 2.0      # the probe alone, before a huge request: its worst answer sets a floor


# ---- raw protocol helpers ---------------------------------------------------------------------------

class Raw:
    """One client connection speaking raw Kafka frames. Responses are decoded with the (key, version)
    remembered for their correlation id; ``order`` records correlation ids in arrival order."""

    def __init__(self, bootstrap: str, timeout: float = 15.0):
        host, port = bootstrap.split(",")[0].rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.cid = 0
        self.sent: dict[int, tuple[int, int]] = {}
        self.order: list[int] = []

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send(self, key: int, version: int, body: dict) -> int:
        self.cid += 1
        self.sock.sendall(api.encode_request(key, version, self.cid, "kbroker-tests", body))
        self.sent[self.cid] = (key, version)
        return self.cid

    def _read_exact(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("broker closed the connection")
            out += chunk
        return bytes(out)

    def recv(self, timeout: float | None = None) -> tuple[int, dict]:
        self.sock.settimeout(self.timeout if timeout is None else timeout)
        (size,) = struct.unpack(">i", self._read_exact(4))
        frame = self._read_exact(size)
        (cid,) = struct.unpack_from(">i", frame)
        key, version = self.sent.pop(cid)
        self.order.append(cid)
        return api.decode_response(key, version, memoryview(frame))

    def call(self, key: int, version: int, body: dict, timeout: float | None = None) -> dict:
        cid = self.send(key, version, body)
        got, resp = self.recv(timeout)
        assert got == cid, f"answer to correlation id {got} while waiting for {cid}"
        return resp


def make_batch(records) -> bytes:
    """One RecordBatch v2 (uncompressed) from ``[(timestamp_ms, key, value), ...]``."""
    b = native_batch.BatchBuilder(batch_size=64 << 20)
    for ts, key, value in records:
        assert b.append(ts, key, value)
    return b.build()


def produce_body(topic: str, partition: int, batch: bytes, acks: int = -1) -> dict:
    return {"transactional_id": None, "acks": acks, "timeout_ms": 10000,
            "topic_data": [{"name": topic, "partition_data": [{"index": partition, "records": batch}]}]}


def produce(raw: Raw, topic: str, partition: int, records) -> dict:
    """Produce one batch, acks=all; returns the partition's response."""
    resp = raw.call(PRODUCE, PRODUCE_V, produce_body(topic, partition, make_batch(records)))
    return resp["responses"][0]["partition_responses"][0]


def fetch_body(parts, max_wait_ms=0, min_bytes=1, max_bytes=0x7FFFFFFF, partition_max_bytes=1 << 20,
               isolation_level=0) -> dict:
    """``parts``: [(topic, partition, fetch_offset), ...] in request order (topics grouped in order)."""
    topics: list[dict] = []
    for topic, partition, offset in parts:
        if not topics or topics[-1]["topic"] != topic:
            topics.append({"topic": topic, "partitions": []})
        topics[-1]["partitions"].append({"partition": partition, "current_leader_epoch": -1,
                                         "fetch_offset": offset, "log_start_offset": -1,
                                         "partition_max_bytes": partition_max_bytes})
    return {"replica_id": -1, "max_wait_ms": max_wait_ms, "min_bytes": min_bytes, "max_bytes": max_bytes,
            "isolation_level": isolation_level, "session_id": 0, "session_epoch": -1, "topics": topics,
            "forgotten_topics_data": [], "rack_id": ""}


def fetch_partitions(resp: dict) -> dict:
    """{(topic, partition): partition response} of a Fetch response."""
    return {(t["topic"], p["partition_index"]): p for t in resp["responses"] for p in t["partitions"]}


def batches_of(records) -> list:
    """Whole batches in a records field, as (BatchInfo, [(offset, ts, key, value)])."""
    if not records:
        return []
    buf = bytes(records)
    out = []
    for info in native_batch.iter_batches(buf):
        raw = buf[info.position:info.position + info.size]
        recs = [r[:4] for r in native_batch.decode_records(raw, check_crc=True)]   # absolute offsets
        out.append((info, recs))
    return out


def fetch_records(raw: Raw, topic: str, partition: int, offset: int, **kw) -> tuple[dict, list]:
    """One Fetch of one partition -> (partition response, [(offset, ts, key, value), ...])."""
    p = fetch_partitions(raw.call(FETCH, FETCH_V, fetch_body([(topic, partition, offset)], **kw)))[(topic, partition)]
    return p, [r for _info, recs in batches_of(p["records"]) for r in recs]


def read_all(raw: Raw, topic: str, partition: int, start: int = 0) -> list:
    """Every record from ``start`` up to the high watermark (bounded loop)."""
    out = []
    offset = start
    for _ in range(10_000):
        p, recs = fetch_records(raw, topic, partition, offset)
        assert p["error_code"] == NONE, p
        recs = [r for r in recs if r[0] >= offset]
        out.extend(recs)
        if recs:
            offset = recs[-1][0] + 1
        if offset >= p["high_watermark"]:
            return out
    raise AssertionError("read_all did not reach the high watermark")


def list_offset(raw: Raw, topic: str, partition: int, timestamp: int, isolation_level: int = 0) -> dict:
    body = {"replica_id": -1, "isolation_level": isolation_level,
            "topics": [{"name": topic, "partitions": [{"partition_index": partition, "current_leader_epoch": -1,
                                                       "timestamp": timestamp}]}]}
    return raw.call(LIST_OFFSETS, LIST_OFFSETS_V, body)["topics"][0]["partitions"][0]


def metadata_body(topics=None, auto_create=False) -> dict:
    return {"topics": None if topics is None else [{"name": t} for t in topics],
            "allow_auto_topic_creation": auto_create, "include_cluster_authorized_operations": False,
            "include_topic_authorized_operations": False}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def create_topic(bootstrap: str, name: str, partitions: int = 1, config: dict | None = None) -> str:
    """Create a topic with confluent-kafka's AdminClient and wait until every partition has a log."""
    import confluent_kafka.admin as cka

    admin = cka.AdminClient({"bootstrap.servers": bootstrap})
    fut = admin.create_topics([cka.NewTopic(name, partitions, 1, config=config or {})])[name]
    fut.result(timeout=30)
    with Raw(bootstrap) as raw:
        def ready():
            return all(list_offset(raw, name, p, LATEST)["error_code"] == NONE for p in range(partitions))
        wait_for(ready, 30, f"topic {name} to be served")
    return name


# ---- long poll ----------------------------------------------------------------------------------------

def test_long_poll_waits_max_wait_then_wakes_on_append(bootstrap):
    """Invariant: with min_bytes=1 on an empty partition the Fetch is answered after ≈max_wait_ms
    (not at once, not much later); when a record arrives during the wait the answer comes promptly
    and carries it."""
    topic = create_topic(bootstrap, unique("longpoll"))
    with Raw(bootstrap) as a, Raw(bootstrap) as b:
        t0 = time.monotonic()
        p, recs = fetch_records(a, topic, 0, 0, max_wait_ms=2000, min_bytes=1)
        waited = time.monotonic() - t0
        assert p["error_code"] == NONE and recs == [] and p["high_watermark"] == 0
        assert 1.6 <= waited < 4.5, f"empty long-poll answered after {waited:.2f}s (max_wait 2.0s)"

        a.send(FETCH, FETCH_V, fetch_body([(topic, 0, 0)], max_wait_ms=2000, min_bytes=1))
        # The fetch is parked; proving it did not answer early is part of the invariant.
        a.sock.settimeout(0.3)
        with pytest.raises(socket.timeout):
            a.sock.recv(1, socket.MSG_PEEK)
        ack = produce(b, topic, 0, [(1_700_000_000_000, b"k", b"wake-up")])
        produced_at = time.monotonic()
        assert ack["error_code"] == NONE and ack["base_offset"] == 0
        _cid, resp = a.recv(timeout=5)
        latency = time.monotonic() - produced_at
        p = fetch_partitions(resp)[(topic, 0)]
        got = [r for _i, rs in batches_of(p["records"]) for r in rs]
        assert got == [(0, 1_700_000_000_000, b"k", b"wake-up")]
        assert latency < 0.5, f"long-poll answered {latency:.2f}s after the append (should wake at once)"


def test_long_poll_confluent_consumer_wakes_on_append(bootstrap):
    """Invariant: a confluent-kafka consumer with fetch.wait.max.ms=2000 that sits at the end of a
    partition receives a new record well under the max wait after it was produced (the broker wakes
    the parked fetch instead of letting it time out)."""
    import confluent_kafka as ck

    topic = create_topic(bootstrap, unique("longpoll-ck"))
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": unique("g"), "enable.auto.commit": False,
                     "enable.partition.eof": True, "fetch.wait.max.ms": 2000, "fetch.min.bytes": 1,
                     "log_level": 0})
    p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    try:
        c.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
        deadline = time.monotonic() + 30

        def poll_until(pred):
            while time.monotonic() < deadline:
                m = c.poll(0.05)
                if m is not None and pred(m):
                    return m
            raise AssertionError("consumer timed out")

        poll_until(lambda m: m.error() is not None and m.error().code() == ck.KafkaError._PARTITION_EOF)
        latencies = []
        for i in range(3):
            # Let the consumer's next fetch park in the broker, then produce into it.
            t_idle = time.monotonic() + 0.6
            while time.monotonic() < t_idle:
                assert c.poll(0.05) is None
            p.produce(topic, value=b"v%d" % i, partition=0)
            assert p.flush(10) == 0
            acked = time.monotonic()
            m = poll_until(lambda m: m.error() is None)
            latencies.append(time.monotonic() - acked)
            assert (m.offset(), m.value()) == (i, b"v%d" % i)
        assert max(latencies) < 1.0, f"records arrived {latencies} s after the ack (fetch.wait.max.ms 2 s)"
    finally:
        c.close()


def test_long_poll_blocks_only_its_own_connection_and_keeps_order(bootstrap):
    """Invariant: while connection A long-polls (max_wait 3 s), connection B's Metadata, ListOffsets
    and Produce are answered at once; on one connection, requests pipelined behind a long-poll are
    answered after it, in request order (correlation ids FIFO)."""
    parked = create_topic(bootstrap, unique("parked"))
    other = create_topic(bootstrap, unique("other"))
    with Raw(bootstrap) as a, Raw(bootstrap) as b:
        t0 = time.monotonic()
        a.send(FETCH, FETCH_V, fetch_body([(parked, 0, 0)], max_wait_ms=3000, min_bytes=1))
        timings = {}
        s = time.monotonic()
        md = b.call(METADATA, METADATA_V, metadata_body([other]))
        timings["metadata"] = time.monotonic() - s
        assert md["topics"][0]["error_code"] == NONE
        s = time.monotonic()
        lo = list_offset(b, other, 0, LATEST)
        timings["list_offsets"] = time.monotonic() - s
        assert lo["error_code"] == NONE
        s = time.monotonic()
        ack = produce(b, other, 0, [(None, None, b"x")])
        timings["produce"] = time.monotonic() - s
        assert ack["error_code"] == NONE
        assert max(timings.values()) < 0.5, timings
        _cid, resp = a.recv(timeout=10)
        waited = time.monotonic() - t0
        assert 2.4 <= waited < 6.0, f"parked fetch answered after {waited:.2f}s (max_wait 3 s)"
        assert fetch_partitions(resp)[(parked, 0)]["error_code"] == NONE

        # Pipelined on one connection: Fetch (parks 2 s), ApiVersions, Metadata, Fetch (answers at once).
        a.order.clear()
        t0 = time.monotonic()
        cids = [a.send(FETCH, FETCH_V, fetch_body([(parked, 0, 0)], max_wait_ms=2000, min_bytes=1)),
                a.send(API_VERSIONS, 0, {}),
                a.send(METADATA, METADATA_V, metadata_body([parked])),
                a.send(FETCH, FETCH_V, fetch_body([(other, 0, 0)], max_wait_ms=0))]
        bodies = [a.recv(timeout=10)[1] for _ in cids]
        first_after = time.monotonic() - t0
        assert a.order == cids, f"responses in order {a.order}, requests were {cids}"
        assert first_after >= 1.6, "the answers behind the parked fetch cannot precede it"
        assert bodies[1]["error_code"] == NONE and bodies[2]["topics"][0]["name"] == parked
        assert [r[3] for _i, rs in batches_of(fetch_partitions(bodies[3])[(other, 0)]["records"]) for r in rs] == [b"x"]


def test_eight_pipelined_fetches_on_one_connection_answered_in_order(bootstrap):
    """Invariant: 8 Fetch requests written at once on one connection are all in flight together (two
    long polls overlap instead of running one after the other) and get 8 answers in request order,
    each holding the batch its offset asked for, whether the records were copied into the response
    (small) or sent with sendfile (a 64 KiB batch), before or behind a parked fetch."""
    topic = create_topic(bootstrap, unique("pipelined"))
    empty = create_topic(bootstrap, unique("pipelined-empty"))
    with Raw(bootstrap) as raw:
        for i in range(6):
            value = bytes([65 + i]) * (64 * 1024 if i == 3 else 100)
            assert produce(raw, topic, 0, [(None, None, value)])["error_code"] == NONE
        # offsets 0..5 (3 is the 64 KiB batch), two long polls on the empty topic (600 ms each)
        plan = [(topic, 0), (topic, 1), (empty, None), (topic, 3), (topic, 2), (empty, None), (topic, 5),
                (topic, 4)]
        frames, cids = [], []
        for name, offset in plan:
            raw.cid += 1
            body = (fetch_body([(empty, 0, 0)], max_wait_ms=600, min_bytes=1) if offset is None
                    else fetch_body([(name, 0, offset)], partition_max_bytes=1 << 20))
            frames.append(api.encode_request(FETCH, FETCH_V, raw.cid, "kbroker-tests", body))
            raw.sent[raw.cid] = (FETCH, FETCH_V)
            cids.append(raw.cid)
        raw.order.clear()
        t0 = time.monotonic()
        raw.sock.sendall(b"".join(frames))         # one write: the broker reads them together
        answers = [raw.recv(timeout=10)[1] for _ in plan]
        elapsed = time.monotonic() - t0
    assert raw.order == cids, f"answers in order {raw.order}, requests were {cids}"
    # Served one at a time the two parked fetches would take >= 1.2 s; in flight together ~0.6 s.
    assert 0.5 <= elapsed < 1.15, f"8 pipelined fetches took {elapsed:.2f} s"
    for (name, offset), resp in zip(plan, answers):
        part = fetch_partitions(resp)[(name, 0)]
        assert part["error_code"] == NONE, part
        recs = [r for _i, rs in batches_of(part["records"]) for r in rs]
        if offset is None:
            assert recs == []
            continue
        assert recs and recs[0][0] == offset, (offset, [r[0] for r in recs])
        assert recs[0][3] == bytes([65 + offset]) * (64 * 1024 if offset == 3 else 100)


# ---- KIP-74 and the partition set -----------------------------------------------------------------------

def test_kip74_first_batch_whole_and_every_partition_listed(bootstrap):
    """Invariant (KIP-74): a batch larger than max_bytes and partition_max_bytes is still returned
    whole when it is the first data of the response; once the response budget is spent later
    partitions get no data but are still listed (no error, their high watermark); every requested
    partition appears in the answer, unknown ones with UNKNOWN_TOPIC_OR_PARTITION."""
    topic = create_topic(bootstrap, unique("kip74"), partitions=2)
    big_value = bytes(range(256)) * 400                     # ~100 KiB, one record, one batch
    with Raw(bootstrap) as raw:
        for i in range(3):
            assert produce(raw, topic, 0, [(1000 + i, b"big%d" % i, big_value)])["error_code"] == NONE
        assert produce(raw, topic, 1, [(2000, b"small", b"s")])["error_code"] == NONE

        # p0 first: its whole first batch (100 KiB > 1000) and nothing more; p1 gets no data.
        resp = raw.call(FETCH, FETCH_V, fetch_body([(topic, 0, 0), (topic, 1, 0)], max_bytes=1000,
                                                   partition_max_bytes=1000))
        parts = fetch_partitions(resp)
        assert set(parts) == {(topic, 0), (topic, 1)}
        p0, p1 = parts[(topic, 0)], parts[(topic, 1)]
        got0 = batches_of(p0["records"])
        assert len(got0) == 1 and len(bytes(p0["records"])) == got0[0][0].size > 1000
        assert got0[0][1] == [(0, 1000, b"big0", big_value)]
        assert (p0["error_code"], p0["high_watermark"]) == (NONE, 3)
        assert p1["error_code"] == NONE and p1["high_watermark"] == 1 and not p1["records"]

        # p1 first: its small batch fits; p0's big batch is over the rest of the budget -> no data.
        parts = fetch_partitions(raw.call(FETCH, FETCH_V, fetch_body([(topic, 1, 0), (topic, 0, 0)],
                                                                     max_bytes=1000, partition_max_bytes=1000)))
        assert [r for _i, rs in batches_of(parts[(topic, 1)]["records"]) for r in rs] == [(0, 2000, b"small", b"s")]
        assert parts[(topic, 0)]["error_code"] == NONE and not parts[(topic, 0)]["records"]

        # partition_max_bytes alone is soft for the first batch only: one batch, not three.
        parts = fetch_partitions(raw.call(FETCH, FETCH_V, fetch_body([(topic, 0, 1)], partition_max_bytes=50_000)))
        assert [r[0] for _i, rs in batches_of(parts[(topic, 0)]["records"]) for r in rs] == [1]

        # Unknown topic and unknown partition are listed with their error next to the good ones.
        ghost = unique("ghost")
        resp = raw.call(FETCH, FETCH_V, fetch_body([(topic, 0, 0), (topic, 7, 0), (ghost, 0, 0), (topic, 1, 0)]))
        parts = fetch_partitions(resp)
        assert set(parts) == {(topic, 0), (topic, 7), (ghost, 0), (topic, 1)}
        assert parts[(topic, 7)]["error_code"] == UNKNOWN_TOPIC_OR_PARTITION
        assert parts[(ghost, 0)]["error_code"] == UNKNOWN_TOPIC_OR_PARTITION
        # An error partition carries empty records, never null: librdkafka fails the whole response
        # on a negative MessageSetSize, so one bad partition would starve all the others.
        assert parts[(topic, 7)]["records"] is not None and parts[(ghost, 0)]["records"] is not None
        assert parts[(topic, 0)]["error_code"] == NONE and parts[(topic, 1)]["error_code"] == NONE


def test_every_answer_carries_the_partition_offsets(bootstrap):
    """A partition's high watermark, last stable offset (= HW: no transactions) and log start offset
    are in its answer whether it carries records, none (a fetch at the high watermark, answered at
    once with max_wait_ms=0) or OFFSET_OUT_OF_RANGE (a fetch past the log end)."""
    topic = create_topic(bootstrap, unique("offsets"), partitions=1)
    with Raw(bootstrap) as raw:
        for i in range(3):
            assert produce(raw, topic, 0, [(1000 + i, None, b"v%d" % i)])["error_code"] == NONE
        for offset, error, n in ((1, NONE, 2), (3, NONE, 0), (10, OFFSET_OUT_OF_RANGE, 0)):
            p, recs = fetch_records(raw, topic, 0, offset)
            got = (p["error_code"], p["high_watermark"], p["last_stable_offset"], p["log_start_offset"])
            assert got == (error, 3, 3, 0), (offset, p)
            assert [r[0] for r in recs] == list(range(offset, offset + n))


# ---- ListOffsets by time ----------------------------------------------------------------------------------

TS0 = 1_650_000_000_000


def _produce_timed(bootstrap, topic, stamps, per_batch: bool):
    """Produce one record per stamp (value = its index) with confluent-kafka; per_batch flushes after
    each record so every record is its own batch."""
    import confluent_kafka as ck

    p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 0 if per_batch else 200})
    for i, ts in enumerate(stamps):
        p.produce(topic, value=b"%d" % i, partition=0, timestamp=ts)
        if per_batch:
            assert p.flush(10) == 0
    assert p.flush(10) == 0


def _offsets_for_times_both(bootstrap, topic, targets):
    """{target: offset or None} from confluent-kafka and from kafka-python (both must agree)."""
    import confluent_kafka as ck
    from kafka import KafkaConsumer, TopicPartition

    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": unique("g"), "log_level": 0})
    kc = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        out_ck, out_kp = {}, {}
        for target in targets:
            [tp] = c.offsets_for_times([ck.TopicPartition(topic, 0, target)], timeout=10)
            assert tp.error is None
            out_ck[target] = tp.offset if tp.offset >= 0 else None
            got = kc.offsets_for_times({TopicPartition(topic, 0): target})[TopicPartition(topic, 0)]
            out_kp[target] = None if got is None else got.offset
        return out_ck, out_kp
    finally:
        c.close()
        kc.close()


def test_offsets_for_times_one_record_per_batch(bootstrap):
    """Invariant: offsets_for_times(target) is the first offset whose timestamp >= target (confluent-kafka
    and kafka-python agree); a target past the last timestamp has no offset; ListOffsets earliest (-2)
    and latest (-1) are the log start and the end."""
    topic = create_topic(bootstrap, unique("times"))
    stamps = [TS0 + i * 1000 for i in range(10)]
    _produce_timed(bootstrap, topic, stamps, per_batch=True)
    targets = [TS0 - 5, TS0, TS0 + 1, TS0 + 4000, TS0 + 4500, TS0 + 9000, TS0 + 9001, TS0 + 10**9]
    expected = {t: next((i for i, ts in enumerate(stamps) if ts >= t), None) for t in targets}
    got_ck, got_kp = _offsets_for_times_both(bootstrap, topic, targets)
    assert got_ck == expected
    assert got_kp == expected
    with Raw(bootstrap) as raw:
        assert list_offset(raw, topic, 0, EARLIEST)["offset"] == 0
        assert list_offset(raw, topic, 0, LATEST)["offset"] == 10
        r = list_offset(raw, topic, 0, TS0 + 4500)
        assert (r["offset"], r["timestamp"]) == (5, TS0 + 5000)
        r = list_offset(raw, topic, 0, TS0 + 10**9)
        assert (r["error_code"], r["offset"], r["timestamp"]) == (NONE, -1, -1)


def test_offsets_for_times_inside_a_batch(bootstrap):
    """Invariant (Kafka's semantics): with several records per batch, offsets_for_times still names the
    first *record* whose timestamp >= target, not the start of its batch."""
    topic = create_topic(bootstrap, unique("times-batched"))
    stamps = [TS0 + i * 1000 for i in range(10)]
    _produce_timed(bootstrap, topic, stamps, per_batch=False)
    with Raw(bootstrap) as raw:
        assert list_offset(raw, topic, 0, LATEST)["offset"] == 10
        r = list_offset(raw, topic, 0, TS0 + 4500)
        assert (r["offset"], r["timestamp"]) == (5, TS0 + 5000)


# ---- read_committed ----------------------------------------------------------------------------------------

def test_read_committed_latest_consumer_starts_at_end_and_reaches_eof(bootstrap):
    """Invariant: without transactions last_stable_offset = high watermark (Fetch v4+ and ListOffsets
    with isolation_level=1), so librdkafka's default read_committed consumer positioned at 'latest'
    (explicitly, or via auto.offset.reset=latest after an out-of-range offset) starts at the end,
    reports EOF there and then receives exactly the new records."""
    import confluent_kafka as ck

    topic = create_topic(bootstrap, unique("rc"))
    with Raw(bootstrap) as raw:
        for i in range(5):
            assert produce(raw, topic, 0, [(None, None, b"old%d" % i)])["error_code"] == NONE
        p, _ = fetch_records(raw, topic, 0, 0, isolation_level=1)
        assert (p["high_watermark"], p["last_stable_offset"], p["log_start_offset"]) == (5, 5, 0)
        assert p["aborted_transactions"] in (None, [])
        assert list_offset(raw, topic, 0, LATEST, isolation_level=1)["offset"] == 5

    prod = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for start in (ck.OFFSET_END, 1000):          # 1000: out of range -> auto.offset.reset=latest
        c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": unique("g"), "enable.auto.commit": False,
                         "auto.offset.reset": "latest", "enable.partition.eof": True, "log_level": 0})
        assert c.list_topics(topic, timeout=10).topics[topic].error is None
        try:
            c.assign([ck.TopicPartition(topic, 0, start)])
            deadline = time.monotonic() + 20
            eof = None
            while eof is None and time.monotonic() < deadline:
                m = c.poll(0.1)
                if m is None:
                    continue
                assert m.error() is not None, f"read an old record {m.offset()} {m.value()!r}"
                if m.error().code() == ck.KafkaError._PARTITION_EOF:
                    eof = m.offset()
            end = 5 if start == ck.OFFSET_END else 6
            assert eof == end, f"EOF at {eof}, expected the end {end}"
            prod.produce(topic, value=b"new-%d" % start, partition=0)
            assert prod.flush(10) == 0
            m = None
            while time.monotonic() < deadline:
                m = c.poll(0.1)
                if m is not None and m.error() is None:
                    break
            assert m is not None and m.error() is None and (m.offset(), m.value()) == (end, b"new-%d" % start)
            lo, hi = c.get_watermark_offsets(ck.TopicPartition(topic, 0), timeout=10)
            assert (lo, hi) == (0, end + 1)
        finally:
            c.close()


def test_list_offsets_names_a_partition_twice(bootstrap):
    """Invariant (Kafka's handleListOffsetRequest): a partition named twice in one ListOffsets request
    gets INVALID_REQUEST for each mention, even across two entries of the same topic; the other
    partitions are answered normally."""
    topic = create_topic(bootstrap, unique("dup-lo"), partitions=2)
    def part(i, ts):
        return {"partition_index": i, "current_leader_epoch": -1, "timestamp": ts}
    body = {"replica_id": -1, "isolation_level": 0,
            "topics": [{"name": topic, "partitions": [part(0, LATEST), part(1, LATEST)]},
                       {"name": topic, "partitions": [part(0, EARLIEST)]}]}
    with Raw(bootstrap) as raw:
        resp = raw.call(LIST_OFFSETS, LIST_OFFSETS_V, body)
    got = [(p["partition_index"], p["error_code"], p["offset"]) for t in resp["topics"] for p in t["partitions"]]
    assert got == [(0, 42, -1), (1, NONE, 0), (0, 42, -1)]


@pytest.mark.slow
def test_huge_list_offsets_does_not_hold_the_loop(bootstrap):
    """Invariant: a ListOffsets naming 200,000 partitions is answered in full (the
    real partition with its offset, every other one UNKNOWN_TOPIC_OR_PARTITION) while a steady
    producer and consumer keep their gap bound and a probe connection's ApiVersions requests keep being
    answered promptly: the answer is built 2,000 partitions per loop turn, not in one."""
    import threading

    from test_hostile_attacks import Steady, gap_bound

    topic = create_topic(bootstrap, unique("lo-huge"))
    steady = Steady(bootstrap, create_topic(bootstrap, unique("lo-steady"))).start()
    try:
        baseline = steady.quiet_baseline()
        with Raw(bootstrap) as raw:
            for i in range(3):
                assert produce(raw, topic, 0, [(None, None, b"r%d" % i)])["error_code"] == NONE
        probe_latency, stop = [], threading.Event()

        def probe():
            with Raw(bootstrap) as p:
                while not stop.is_set():
                    t = time.monotonic()
                    assert p.call(API_VERSIONS, 0, {}, timeout=30)["error_code"] == NONE
                    probe_latency.append((t, time.monotonic() - t))
                    time.sleep(0.01)

        n = 200_000
        body = {"replica_id": -1, "isolation_level": 0, "topics": [{"name": topic, "partitions": [
            {"partition_index": i, "current_leader_epoch": -1, "timestamp": LATEST} for i in range(n)]}]}
        th = threading.Thread(target=probe, daemon=True)
        th.start()
        try:
            wait_for(lambda: len(probe_latency) >= 5, 30, "the probe to get going")
            with Raw(bootstrap, timeout=120) as raw:
                t0 = time.monotonic()
                resp = raw.call(LIST_OFFSETS, LIST_OFFSETS_V, body, timeout=120)
                t1 = time.monotonic()
        finally:
            stop.set()
            th.join(60)
    finally:
        steady.stop()
    parts = resp["topics"][0]["partitions"]
    assert len(parts) == n and parts[0]["error_code"] == NONE and parts[0]["offset"] == 3
    assert {p["error_code"] for p in parts[1:]} == {UNKNOWN_TOPIC_OR_PARTITION}
    during = [lat for t, lat in probe_latency if t0 <= t <= t1]
    p_gap, c_gap = steady.gaps(t0, t1)
    bound = gap_bound(baseline)
    print(f"list-offsets-200k answered in {t1 - t0:.2f}s; probe answers during it {len(during)} "
          f"max {max(during, default=0):.3f}s; producer_max_gap={p_gap:.2f}s consumer_max_gap={c_gap:.2f}s "
          f"bound={bound:.2f}s")
    assert steady.errors == [], steady.errors[:5]
    assert p_gap <= bound and c_gap <= bound
    # Built in one turn, the answer held every other request for its whole build (0.33 s measured here
    # with the slicing switched off: this assertion failed); in
    # 2,000-partition turns a probe waits at most a few turns.
    assert during and max(during) < max(0.25, 0.12 * (t1 - t0)), during


@pytest.mark.slow
@pytest.mark.parametrize("what", ["describe-configs-5k", "create-topics-validate-100k"])
def test_huge_admin_requests_do_not_hold_the_loop(bootstrap, what):
    """Invariant: DescribeConfigs naming 5,000 topics and a validate-only
    CreateTopics naming 100,000 are answered in full while a probe connection's ApiVersions requests keep
    being answered promptly: the answers are built in slices (20 resources, 500 topics) per loop turn."""
    import threading

    topic = create_topic(bootstrap, unique("cfg-huge"))
    if what.startswith("describe"):
        n = 5_000
        key, version = 32, 2
        body = {"resources": [{"resource_type": 2, "resource_name": topic, "configuration_keys": None}] * n,
                "include_synonyms": False}
    else:
        n = 100_000
        key, version = 19, 3
        body = {"topics": [{"name": f"huge-{i:06d}", "num_partitions": 1, "replication_factor": 1,
                            "assignments": [], "configs": []} for i in range(n)],
                "timeout_ms": 60000, "validate_only": True}
    probe_latency, stop = [], threading.Event()

    def probe():
        with Raw(bootstrap) as p:
            while not stop.is_set():
                t = time.monotonic()
                assert p.call(API_VERSIONS, 0, {}, timeout=60)["error_code"] == NONE
                probe_latency.append((t, time.monotonic() - t))
                time.sleep(0.01)

    th = threading.Thread(target=probe, daemon=True)
    th.start()
    try:
        wait_for(lambda: len(probe_latency) >= 5, 30, "the probe to get going")
        # The probe's worst answer with nothing else asked of the broker (as gap_bound's quiet window):
        # tells a loaded machine from a stall. Measured 0.009-0.080 s at load 10-13, so the bound
        # below stays at its floor there and a 1.2 s probe wait during the request is a real stall.
        q0 = time.monotonic()
        time.sleep(QUIET_WINDOW_S)
        quiet = max((lat for t, lat in probe_latency if t + lat >= q0), default=QUIET_WINDOW_S)
        with Raw(bootstrap, timeout=180) as raw:
            t0 = time.monotonic()
            resp = raw.call(key, version, body, timeout=180)
            t1 = time.monotonic()
    finally:
        stop.set()
        th.join(60)
    if what.startswith("describe"):
        assert len(resp["results"]) == n
        assert all(r["error_code"] == NONE and r["configs"] for r in resp["results"])
    else:
        assert len(resp["topics"]) == n and {t["error_code"] for t in resp["topics"]} == {NONE}
    during = [lat for t, lat in probe_latency if t0 <= t <= t1]
    bound = max(0.3, 0.1 * (t1 - t0), 2 * quiet)
    print(f"{what} answered in {t1 - t0:.2f}s; probe answers during it {len(during)} "
          f"max {max(during, default=0):.3f}s; quiet max {quiet:.3f}s; bound {bound:.3f}s")
    # Built in one turn, the answer holds the probe for its whole build (slicing switched off:
    # 1.1 s / 0.62 s, 3884b96); sliced, a probe waits a few turns.
    assert during and max(during) < bound, (bound, quiet, during)
