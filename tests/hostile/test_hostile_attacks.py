"""Attacks by hostile or careless clients against a real broker, with real clients beside them.

Every attack runs while ``Steady`` keeps a confluent-kafka producer (acks=all) and consumer on their own
connections and opens a brand-new raw client every second. For each attack the test states and checks:
- the steady producer's longest gap between acknowledgements and the consumer's longest gap between
  records stay within GAP_BOUND (see ``gap_bound``);
- every new client that connected during the attack was answered (ApiVersions and Metadata) in time;
- the attacking connections are closed or answered as the attack specifies;
- the broker's RSS stays below its RSS before the attack plus the request pool plus RSS_SLACK_MIB.
"""
from __future__ import annotations

import socket
import struct
import tempfile
import threading
import time
import uuid

import pytest

from checkers import (API_VERSIONS, METADATA, PRODUCE, RawConn, create_topic, host_port, log_end_offset, rss_kib,
                      wait_for_topic, wait_until)
from kbroker._native.crc import crc32c
from kbroker.protocol import api
from kbroker.protocol.types import varint_bytes
from kbroker.record.compression import compress
from kbroker.testing import LocalCluster
from kbroker.protocol.errors import Errors

MAX_REQUEST = 8 << 20          # socket.request.max.bytes
POOL = 32 << 20                # queued.max.request.bytes
FRAME_TIMEOUT_MS = 3000        # kbroker.socket.request.frame.timeout.ms
RSS_SLACK_MIB = 48             # interpreter heap growth, per-connection objects and receive chunks (~250 x 32 KiB)
RSS_KEPT_MIB = 12              # RSS above the pre-attack level 2 s after the attackers left
NEWCOMER_TIMEOUT = 5.0         # a new client not answered within this counts as unanswered
CORRUPT_MESSAGE, INVALID_RECORD = Errors.CORRUPT_MESSAGE, Errors.INVALID_RECORD
FETCH_MAX_BYTES = 4 << 20      # fetch.max.bytes here (Kafka's default 57671680 would need > 55 MB of data)


def gap_bound(baseline: float) -> float:
    """The issue's bound is 1 s. The machine is shared by several test runs at once, so a quiet window
    measured just before the attack sets the floor: the bound is max(1 s, 2 x the quiet gap). The
    failures this guards against were 22-28 s stalls, so the bound stays decisive."""
    return max(1.0, 2.0 * baseline)


def _max_gap(times, t0, t1):
    pts = [t0] + [t for t in times if t0 <= t <= t1] + [t1]
    return max(b - a for a, b in zip(pts, pts[1:]))


class Steady:
    """A steady producer and consumer (confluent-kafka) and a new raw client every second."""

    def __init__(self, bootstrap, topic):
        import confluent_kafka as ck

        self.bootstrap, self.topic = bootstrap, topic
        self.producer = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 2, "acks": "all",
                                     "message.timeout.ms": 60000})
        self.consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"steady-{topic}",
                                     "enable.auto.commit": False, "fetch.wait.max.ms": 100})
        self.consumer.assign([ck.TopicPartition(topic, 0, ck.OFFSET_END)])
        self.acks, self.received, self.errors = [], [], []
        self.newcomers = []          # (started, latency or None, error)
        self.stop_flag = threading.Event()
        self.threads = [threading.Thread(target=f, daemon=True) for f in (self._produce, self._consume, self._newcomers)]

    def _cb(self, err, _msg):
        if err is not None:
            self.errors.append(str(err))
        else:
            self.acks.append(time.monotonic())

    def _produce(self):
        n = 0
        while not self.stop_flag.is_set():
            try:
                self.producer.produce(self.topic, value=b"steady-%d" % n, on_delivery=self._cb)
                n += 1
            except BufferError:
                pass
            self.producer.poll(0.005)
        self.producer.flush(30)

    def _consume(self):
        while not self.stop_flag.is_set():
            m = self.consumer.poll(0.1)
            if m is not None and not m.error():
                self.received.append(time.monotonic())
        self.consumer.close()

    def _newcomers(self):
        while not self.stop_flag.wait(1.0):
            t0 = time.monotonic()
            try:
                with RawConn(self.bootstrap, timeout=NEWCOMER_TIMEOUT) as c:
                    assert c.request(API_VERSIONS, 0, {}, timeout=NEWCOMER_TIMEOUT)["error_code"] == 0
                    md = c.request(METADATA, 1, {"topics": [{"name": self.topic}]}, timeout=NEWCOMER_TIMEOUT)
                    assert md["topics"][0]["error_code"] == 0
                self.newcomers.append((t0, time.monotonic() - t0, None))
            except Exception as e:       # noqa: BLE001  (counted, reported, asserted on)
                self.newcomers.append((t0, None, repr(e)))

    def start(self):
        for t in self.threads:
            t.start()
        wait_until(lambda: len(self.received) > 50 and len(self.acks) > 50, 60, "steady clients to get going")
        return self

    def stop(self):
        self.stop_flag.set()
        for t in self.threads:
            t.join(60)

    def gaps(self, t0, t1):
        return _max_gap(self.acks, t0, t1), _max_gap(self.received, t0, t1)

    def quiet_baseline(self, seconds=3.0):
        t0 = time.monotonic()
        time.sleep(seconds)
        return max(self.gaps(t0, time.monotonic()))

    def check(self, name, t0, t1, baseline):
        """Assert the steady invariants over [t0, t1]; return the report line."""
        bound = gap_bound(baseline)
        p_gap, c_gap = self.gaps(t0, t1)
        new = [n for n in self.newcomers if t0 <= n[0] <= t1]
        unanswered = [n for n in new if n[1] is None]
        line = (f"{name}: producer_max_gap={p_gap:.2f}s consumer_max_gap={c_gap:.2f}s bound={bound:.2f}s "
                f"(quiet {baseline:.2f}s) newcomers={len(new)} unanswered={len(unanswered)} "
                f"newcomer_max_latency={max((n[1] for n in new if n[1] is not None), default=0):.2f}s")
        print(line)
        assert self.errors == [], self.errors[:5]
        assert len(new) >= int(t1 - t0) - 2, f"too few newcomers ran: {line}"
        assert not unanswered, f"{line}: {unanswered[:3]}"
        assert p_gap <= bound, line
        assert c_gap <= bound, line
        return line


@pytest.fixture(scope="module")
def attacked():
    with tempfile.TemporaryDirectory(prefix="hostile-attacks-") as root:
        with LocalCluster(root, num_partitions=1, session_timeout_ms=6000, overrides={
                "socket.request.max.bytes": MAX_REQUEST, "queued.max.request.bytes": POOL,
                "kbroker.socket.request.frame.timeout.ms": FRAME_TIMEOUT_MS,
                "fetch.max.bytes": FETCH_MAX_BYTES}) as c:
            topic = f"steady-{uuid.uuid4().hex[:8]}"
            wait_for_topic(c.bootstrap, topic, 1)
            steady = Steady(c.bootstrap, topic).start()
            try:
                yield c, steady
            finally:
                steady.stop()
                assert steady.errors == [], steady.errors[:5]


def _open_attackers(c, n, frame_size, payload):
    host, port = host_port(c.bootstrap)
    socks = []
    for _ in range(n):
        s = socket.create_connection((host, port), timeout=5)
        s.settimeout(0.2)
        try:
            s.sendall(struct.pack(">i", frame_size) + payload)
        except (socket.timeout, BlockingIOError):
            pass          # the broker stopped reading from us (pool share used up): as it should
        socks.append(s)
    return socks


def _closed(s) -> bool:
    s.setblocking(False)
    try:
        return s.recv(65536) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


@pytest.mark.slow
@pytest.mark.parametrize("attack", ["announce-big-send-2k", "fill-pool-with-real-bytes"])
def test_stalled_frames_do_not_stall_others(attacked, attack):
    """213 connections each announce an 8 MiB frame and send 2 KB (memory must follow the bytes, not
    the announcement), or 40 connections each send 1 MiB of an 8 MiB frame (real bytes past the part of
    the pool partial frames may take). Attackers must be closed within the frame deadline + 2 s."""
    c, steady = attacked
    pid = c.brokers[0].pid
    baseline = steady.quiet_baseline()
    rss0 = rss_kib(pid)
    n, payload = (213, b"\x07" * 2000) if attack == "announce-big-send-2k" else (40, b"\x07" * (1 << 20))
    t0 = time.monotonic()
    socks = _open_attackers(c, n, MAX_REQUEST - 100, payload)
    peak = rss0
    try:
        while time.monotonic() - t0 < FRAME_TIMEOUT_MS / 1000 + 2.0:
            peak = max(peak, rss_kib(pid))
            time.sleep(0.1)
        t1 = time.monotonic()
        still_open = sum(1 for s in socks if not _closed(s))
    finally:
        for s in socks:
            s.close()
    time.sleep(2.0)
    after = rss_kib(pid)
    grown = (peak - rss0) / 1024
    kept = (after - rss0) / 1024
    print(f"{attack}: attackers={n} still_open_after_deadline={still_open} rss_before={rss0 / 1024:.0f}MiB "
          f"peak={peak / 1024:.0f}MiB grown={grown:.1f}MiB bound={(POOL >> 20) + RSS_SLACK_MIB}MiB "
          f"rss_2s_after={after / 1024:.0f}MiB kept={kept:.1f}MiB")
    steady.check(attack, t0, t1, baseline)
    assert still_open == 0, f"{still_open} of {n} stalled attackers not closed by the frame deadline"
    assert grown <= (POOL >> 20) + RSS_SLACK_MIB
    # partial frames live in anonymous mmaps, unmapped when their connection goes: the memory goes
    # back to the OS (what stays is interpreter heap: chunks and per-connection objects)
    assert kept <= RSS_KEPT_MIB, f"{kept:.1f} MiB of the attack's memory still held"


@pytest.mark.slow
def test_huge_metadata_request_does_not_hold_the_loop(attacked):
    """Three Metadata requests naming 100,000 topics each (none exist, no auto-creation): each is
    answered in full (every topic UNKNOWN_TOPIC_OR_PARTITION) while the steady clients keep their bound
    (its decode/encode run off the loop, its answer is built 2,000 topics per loop turn)."""
    c, steady = attacked
    baseline = steady.quiet_baseline()
    names = [{"name": f"nope-{i:06d}"} for i in range(100_000)]
    t0 = time.monotonic()
    with RawConn(c.bootstrap, timeout=60) as conn:
        for _ in range(3):
            t = time.monotonic()
            resp = conn.request(METADATA, 4, {"topics": names, "allow_auto_topic_creation": False}, timeout=60)
            assert len(resp["topics"]) == 100_000
            assert {x["error_code"] for x in resp["topics"]} == {3}
            print(f"metadata-100k answered in {time.monotonic() - t:.2f}s")
    steady.check("metadata-100k-topics", t0, time.monotonic(), baseline)


@pytest.mark.slow
def test_fetch_max_bytes_over_1000_partitions(attacked):
    """A Fetch asking for max_bytes = partition_max_bytes = 2^31-1 over 1,000 partitions holding ~10 MB
    is answered, and its answer stays within the broker's fetch.max.bytes (plus per-partition headers);
    every partition is listed (sessionless clients need that)."""
    import confluent_kafka as ck

    c, steady = attacked
    topic = f"wide-{uuid.uuid4().hex[:6]}"
    create_topic(c.bootstrap, topic, 1000, timeout=120)
    p = ck.Producer({"bootstrap.servers": c.bootstrap, "linger.ms": 50, "acks": 1})
    for i in range(10_000):
        while True:
            try:
                p.produce(topic, b"v" * 1000, partition=i % 1000)
                break
            except BufferError:
                p.poll(0.1)
    assert p.flush(60) == 0
    baseline = steady.quiet_baseline(2.0)
    big = 0x7FFFFFFF
    body = {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": big, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
            "topics": [{"topic": topic, "partitions": [
                {"partition": i, "current_leader_epoch": -1, "fetch_offset": 0, "log_start_offset": -1,
                 "partition_max_bytes": big} for i in range(1000)]}]}
    t0 = time.monotonic()
    with RawConn(c.bootstrap, timeout=60) as conn:
        for _ in range(3):
            conn.correlation += 1
            conn.send(api.encode_request(1, 11, conn.correlation, "hostile", body))
            frame = conn.recv_frame(60)
            _cid, resp = api.decode_response(1, 11, frame)
            parts = resp["responses"][0]["partitions"]
            data = sum(len(x["records"] or b"") for x in parts)
            print(f"fetch-2^31-1: response {len(frame)} bytes, record data {data} bytes, "
                  f"partitions {len(parts)}, fetch.max.bytes {FETCH_MAX_BYTES}")
            assert len(parts) == 1000 and all(x["error_code"] == 0 for x in parts)
            assert 0 < data <= FETCH_MAX_BYTES + 65536    # + at most part of one batch (~10 KB each here)
            assert len(frame) <= data + 1000 * 100
    steady.check("fetch-2^31-1", t0, time.monotonic(), baseline)


# ---- compressed batches: lies and bombs ---------------------------------------------------------------

def _record(i: int, key: bytes | None, value: bytes) -> bytes:
    key_field = varint_bytes(-1) if key is None else varint_bytes(len(key)) + key
    body = b"\0" + varint_bytes(0) + varint_bytes(i) + key_field + varint_bytes(len(value)) + value + varint_bytes(0)
    return varint_bytes(len(body)) + body


def _batch(codec: int, records: list[bytes], claimed_count: int | None = None) -> bytes:
    """A producer batch (baseOffset 0) with a valid CRC whose header claims ``claimed_count`` records."""
    count = len(records) if claimed_count is None else claimed_count
    section = compress(codec, b"".join(records))
    now = int(time.time() * 1000)
    after_crc = struct.pack(">hiqqqhii", codec, count - 1, now, now, -1, -1, -1, count) + section
    crc = crc32c(after_crc)
    head = struct.pack(">qiibI", 0, 4 + 1 + 4 + len(after_crc), -1, 2, crc)
    return head + after_crc


def _produce(conn, topic, batch):
    body = {"transactional_id": None, "acks": -1, "timeout_ms": 5000,
            "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}]}]}
    return conn.request(PRODUCE, 7, body, timeout=30)["responses"][0]["partition_responses"][0]


CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
BOMB_TOPIC_MAX = 8 << 20    # snappy expands at most ~21x: an 8 MB batch can exceed the 64 MiB cap
BOMB_BYTES = 70 << 20       # past the broker's 64 MiB decompression cap


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["delete", "compact"])
@pytest.mark.parametrize("codec", list(CODECS))
def test_compressed_lies_and_bombs_rejected(attacked, codec, policy):
    """Each lie gets its code and appends nothing (log end offset unchanged); an honest batch then appends."""
    c, steady = attacked
    baseline = steady.quiet_baseline(2.0)
    cid = CODECS[codec]
    topic = f"lies-{codec}-{policy}-{uuid.uuid4().hex[:6]}"
    create_topic(c.bootstrap, topic, 1, {"cleanup.policy": policy, "max.message.bytes": BOMB_TOPIC_MAX})
    one = [_record(0, b"k0", b"v" * 100)]
    three = [_record(i, b"k%d" % i, b"v" * 100) for i in range(3)]
    cases = {
        "claims 1,000,000 holds 1": (_batch(cid, one, 1_000_000), INVALID_RECORD),
        "claims 2 holds 3": (_batch(cid, three, 2), INVALID_RECORD),
        "offset deltas 0,0,0": (_batch(cid, [_record(0, b"k", b"v")] * 3), INVALID_RECORD),
        "bomb past the cap": (_batch(cid, [_record(0, b"k", b"\0" * BOMB_BYTES)]), CORRUPT_MESSAGE),
        "not the codec's format": (_batch(0, one)[:21] + struct.pack(">h", cid) + _batch(0, one)[23:],
                                   CORRUPT_MESSAGE),
    }
    # recompute the CRC of the relabelled batch (its records section is plain bytes claimed as compressed)
    raw = bytearray(cases["not the codec's format"][0])
    struct.pack_into(">I", raw, 17, crc32c(bytes(raw[21:])))
    cases["not the codec's format"] = (bytes(raw), CORRUPT_MESSAGE)
    if policy == "compact":
        cases["null key on a compacted topic"] = (_batch(cid, [_record(0, None, b"v")]), INVALID_RECORD)
    t0 = time.monotonic()
    with RawConn(c.bootstrap, timeout=30) as conn:
        leo = log_end_offset(c.bootstrap, topic, 0)
        for what, (batch, code) in cases.items():
            r = _produce(conn, topic, batch)
            # bytes that are not the codec's format may still decode (raw snappy has no magic) into
            # records that then fail the record checks: either refusal is right there
            expected = {code, INVALID_RECORD} if what == "not the codec's format" else {code}
            assert r["error_code"] in expected, f"{codec}/{policy} {what}: {r}"
            assert log_end_offset(c.bootstrap, topic, 0) == leo, f"{codec}/{policy} {what}: appended"
        r = _produce(conn, topic, _batch(cid, three))
        assert r["error_code"] == 0 and r["base_offset"] == leo, r
        assert log_end_offset(c.bootstrap, topic, 0) == leo + 3
    steady.check(f"compressed-{codec}-{policy}", t0, time.monotonic(), baseline)


def test_batch_builder_sanity():
    """The checker can see a violation: the honest batch this module builds is accepted natively, and
    the same batch with a lying count is refused (so the cases above test the broker, not the builder)."""
    from kbroker._native.batch import BatchError, validate_and_stamp

    good = bytearray(_batch(4, [_record(0, b"k", b"v")]))
    validate_and_stamp(good, 0, 0, 1 << 20, -1)
    with pytest.raises(BatchError) as e:
        validate_and_stamp(bytearray(_batch(4, [_record(0, b"k", b"v")], 5)), 0, 0, 1 << 20, -1)
    assert e.value.error_code == INVALID_RECORD


# keep linters quiet about helpers used only by some parametrizations
_ = api
