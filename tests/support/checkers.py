"""Shared invariant checkers and client/protocol helpers for the integration and fault tests.

Everything here talks to a real broker (no mocks): raw Kafka frames over a socket, the four clients
we support (kcat, confluent-kafka, kafka-python, aiokafka) consuming by partition assignment, and
direct reads of a partition's segment files. The checkers return *counts* of violations so a test
can report them and assert they are zero — and so the checkers themselves
can be fed a known violation to prove they would see it.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from kbroker.protocol import api
from kbroker.testing import LocalCluster, free_port, wait_until  # noqa: F401  (wait_until: used by the test modules)
from kbroker.protocol.errors import Errors

# Kafka API keys and error codes used by the tests.
PRODUCE, FETCH, LIST_OFFSETS, METADATA, API_VERSIONS = 0, 1, 2, 3, 18
CORRUPT_MESSAGE, MESSAGE_TOO_LARGE, INVALID_TOPIC_EXCEPTION, UNSUPPORTED_VERSION = (Errors.CORRUPT_MESSAGE, Errors.MESSAGE_TOO_LARGE, Errors.INVALID_TOPIC_EXCEPTION, Errors.UNSUPPORTED_VERSION)

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


# ---- records -------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Rec:
    """One record as produced or consumed; ``headers`` is a tuple of (str, bytes | None)."""
    key: bytes | None
    value: bytes | None
    headers: tuple = ()
    timestamp: int | None = None     # None: not checked (the producer did not set one)

    def content(self, with_ts: bool = True):
        return (self.key, self.value, self.headers, self.timestamp if with_ts else None)


@dataclass(frozen=True, slots=True)
class Consumed:
    partition: int
    offset: int
    rec: Rec


def norm_headers(headers) -> tuple:
    if not headers:
        return ()
    return tuple((k if isinstance(k, str) else k.decode(), None if v is None else bytes(v)) for k, v in headers)


# ---- invariant checkers --------------------------------------------------------------------------

@dataclass
class AckReport:
    """Violation counters for a produce-then-drain run."""
    acked: int = 0
    consumed: int = 0
    acked_lost: int = 0          # acknowledged (partition, offset, value) not found at that offset
    inconsistent: int = 0        # the acknowledged offset holds a different value
    duplicates: int = 0          # a value read more than once (extra copies)
    gaps: int = 0                # offsets missing inside [first, last] of a partition, or not starting at 0
    unacked_present: int = 0     # read but never acknowledged (allowed: acks lost with the crash)
    lost_samples: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.acked_lost == self.inconsistent == self.duplicates == self.gaps == 0

    def line(self) -> str:
        return (f"acked={self.acked} consumed={self.consumed} acked_lost={self.acked_lost} "
                f"inconsistent={self.inconsistent} dups={self.duplicates} gaps={self.gaps} "
                f"unacked_present={self.unacked_present}")


def offset_gaps(offsets_by_partition: dict[int, list[int]], start: int = 0) -> int:
    """Number of offsets missing from each partition's sequence start, start+1, ... (out-of-order or
    repeated offsets count too): 0 means every partition is contiguous from ``start``."""
    bad = 0
    for offsets in offsets_by_partition.values():
        expect = start
        for o in offsets:
            if o != expect:
                bad += abs(o - expect) if o > expect else 1
                expect = o + 1 if o > expect else expect
            else:
                expect += 1
    return bad


def check_acked(acked, consumed) -> AckReport:
    """acked: iterable of (partition, offset, value); consumed: iterable of (partition, offset, value)
    in read order. Values identify records (each producer writes unique values)."""
    acked = list(acked)
    consumed = list(consumed)
    r = AckReport(acked=len(acked), consumed=len(consumed))
    at = {}
    by_part: dict[int, list[int]] = {}
    for p, o, v in consumed:
        at[(p, o)] = v
        by_part.setdefault(p, []).append(o)
    r.gaps = offset_gaps(by_part)
    counts = Counter(v for _p, _o, v in consumed)
    r.duplicates = sum(c - 1 for c in counts.values() if c > 1)
    acked_values = set()
    for p, o, v in acked:
        acked_values.add(v)
        got = at.get((p, o), _MISSING)
        if got is _MISSING:
            r.acked_lost += 1
            if len(r.lost_samples) < 10:
                r.lost_samples.append((p, o, v))
        elif got != v:
            r.inconsistent += 1
    r.unacked_present = sum(1 for v in counts if v not in acked_values)
    return r


_MISSING = object()


@dataclass
class ContentReport:
    expected: int = 0
    consumed: int = 0
    missing: int = 0             # expected content never read
    unexpected: int = 0          # read content that was never produced (or extra copies)
    gaps: int = 0
    misplaced: int = 0           # keyed record not in the partition the producer's partitioner picks
    order: int = 0               # per-partition order differs from the producer's acknowledged order
    samples: list = field(default_factory=list)

    @property
    def ok(self):
        return self.missing == self.unexpected == self.gaps == self.misplaced == self.order == 0

    def line(self):
        return (f"expected={self.expected} consumed={self.consumed} missing={self.missing} "
                f"unexpected={self.unexpected} gaps={self.gaps} misplaced={self.misplaced} order={self.order}")


def check_content(expected: list[Rec], consumed: list[Consumed], *, partitioner=None, n_partitions=None,
                  acked_at: dict | None = None, with_ts: bool = True) -> ContentReport:
    """Byte-identical multiset comparison, offset contiguity from 0, key-hash placement
    (``partitioner(key, n) -> partition or None`` when it cannot tell) and, when the producer told us
    where each record went (``acked_at``: (partition, offset) -> Rec), exact placement."""
    r = ContentReport(expected=len(expected), consumed=len(consumed))
    want = Counter(x.content(with_ts) for x in expected)
    got = Counter(c.rec.content(with_ts) for c in consumed)
    r.missing = sum((want - got).values())
    r.unexpected = sum((got - want).values())
    if r.missing or r.unexpected:
        r.samples.append(("missing", list((want - got).elements())[:3]))
        r.samples.append(("unexpected", list((got - want).elements())[:3]))
    by_part: dict[int, list[int]] = {}
    for c in consumed:
        by_part.setdefault(c.partition, []).append(c.offset)
        if partitioner is not None and c.rec.key is not None:
            p = partitioner(c.rec.key, n_partitions)
            if p is not None and p != c.partition:
                r.misplaced += 1
    r.gaps = offset_gaps(by_part)
    if acked_at is not None:
        seen = {(c.partition, c.offset): c.rec.content(with_ts) for c in consumed}
        for po, rec in acked_at.items():
            if seen.get(po) != rec.content(with_ts):
                r.order += 1
                if len(r.samples) < 8:
                    r.samples.append(("at", po, seen.get(po), rec.content(with_ts)))
    return r


# ---- partitioners (what each client does with a key) ---------------------------------------------

def murmur2_partition(key: bytes, n: int):
    """Java client / kafka-python / aiokafka default: murmur2(key) & 0x7fffffff % n."""
    from kafka.partitioner.default import murmur2
    return (murmur2(key) & 0x7FFFFFFF) % n


def librdkafka_partition(key: bytes, n: int):
    """librdkafka's default ``consistent_random``: CRC32(key) % n; empty keys go to a random one."""
    if not key:
        return None
    return zlib.crc32(key) % n


# ---- raw protocol --------------------------------------------------------------------------------

def host_port(bootstrap: str):
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    return host, int(port)


def tcp_ports(pid: int, state: str, remote: bool = False) -> set[int]:
    """Ports of the TCP sockets process ``pid`` holds in ``state`` (/proc/net/tcp's code: "0A" LISTEN,
    "01" ESTABLISHED): their local ports, or with ``remote`` their peers' (socket inodes of its
    descriptors matched in /proc/net/tcp and tcp6)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                cols = line.split()
                if cols[3] == state and cols[9] in inodes:
                    ports.add(int(cols[2 if remote else 1].rsplit(":", 1)[1], 16))
    return ports


class RawConn:
    """A plain socket speaking Kafka frames; for hostile input and exact request control."""

    def __init__(self, bootstrap: str, timeout: float = 10.0, source: str | None = None):
        # ``source``: a loopback address to connect from (127.0.0.2...), a client host of its own
        self.sock = socket.create_connection(host_port(bootstrap), timeout=timeout,
                                             source_address=(source, 0) if source else None)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.correlation = 0

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send(self, data: bytes):
        self.sock.sendall(data)

    def recv_exact(self, n: int, deadline: float) -> bytes:
        out = bytearray()
        while len(out) < n:
            self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError(f"closed after {len(out)} of {n} bytes")
            out += chunk
        return bytes(out)

    def recv_frame(self, timeout: float = 10.0) -> bytes:
        deadline = time.monotonic() + timeout
        size = struct.unpack(">i", self.recv_exact(4, deadline))[0]
        return self.recv_exact(size, deadline)

    def request(self, api_key: int, version: int, body: dict, timeout: float = 10.0) -> dict:
        self.correlation += 1
        self.send(api.encode_request(api_key, version, self.correlation, "checkers", body))
        cid, resp = api.decode_response(api_key, version, self.recv_frame(timeout))
        assert cid == self.correlation, (cid, self.correlation)
        return resp

    def closed_by_peer(self, timeout: float) -> bool:
        """True when the broker closes the connection (EOF or reset) within ``timeout`` seconds,
        discarding anything it sends first; False if it is still open at the deadline."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            r, _, _ = select.select([self.sock], [], [], left)
            if not r:
                return False
            try:
                if self.sock.recv(65536) == b"":
                    return True
            except (ConnectionResetError, BrokenPipeError):
                return True


def log_end_offset(bootstrap: str, topic: str, partition: int, timestamp: int = -1) -> int:
    """ListOffsets v1 (latest by default; -2 for earliest) on a fresh raw connection."""
    with RawConn(bootstrap) as c:
        resp = c.request(LIST_OFFSETS, 1, {"replica_id": -1, "topics": [
            {"name": topic, "partitions": [{"partition_index": partition, "timestamp": timestamp}]}]})
    p = resp["topics"][0]["partitions"][0]
    if p["error_code"] != 0:
        raise RuntimeError(f"ListOffsets {topic}-{partition}: error {p['error_code']}")
    return p["offset"]


def end_offsets(bootstrap: str, topic: str, n_partitions: int) -> dict[int, int]:
    return {p: log_end_offset(bootstrap, topic, p) for p in range(n_partitions)}


def wait_for_topic(bootstrap: str, topic: str, n_partitions: int, timeout: float = 30.0):
    """Poll Metadata (auto-creating) until the topic has n partitions, each with a leader."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            with RawConn(bootstrap) as c:
                resp = c.request(METADATA, 4, {"topics": [{"name": topic}], "allow_auto_topic_creation": True})
            t = resp["topics"][0]
            last = t
            if t["error_code"] == 0 and len(t["partitions"]) == n_partitions and all(
                    p["error_code"] == 0 and p["leader_id"] >= 0 for p in t["partitions"]):
                return t
        except OSError as e:
            last = e
        time.sleep(0.1)
    raise TimeoutError(f"topic {topic} not ready with {n_partitions} partitions: {last}")


def create_topic(bootstrap: str, topic: str, partitions: int, config: dict | None = None, timeout: float = 30.0):
    """CreateTopics through confluent-kafka's AdminClient, then wait for leaders."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    fut = admin.create_topics([NewTopic(topic, partitions, 1, config={k: str(v) for k, v in (config or {}).items()})],
                              operation_timeout=timeout)[topic]
    fut.result(timeout)
    return wait_for_topic(bootstrap, topic, partitions, timeout)


# ---- consumers (by assignment, no groups) -> list[Consumed] ----------------------------------------

def consume_confluent(bootstrap, topic, ends: dict[int, int], timeout=60.0) -> list[Consumed]:
    import confluent_kafka as ck

    # group.id is required by the Python binding even for assign(); no group API is used.
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"unused-{os.getpid()}-{time.monotonic_ns()}",
                     "enable.auto.commit": False, "enable.auto.offset.store": False,
                     "enable.partition.eof": False, "fetch.wait.max.ms": 100})
    out = []
    pos = {p: 0 for p in ends}
    try:
        c.assign([ck.TopicPartition(topic, p, 0) for p, e in ends.items() if e > 0])
        deadline = time.monotonic() + timeout
        while any(pos[p] < ends[p] for p in ends):
            if time.monotonic() > deadline:
                raise TimeoutError(f"confluent consumer stuck at {pos}, ends {ends}")
            for m in c.consume(10000, 0.5):
                if m.error():
                    raise RuntimeError(f"confluent consumer error: {m.error()}")
                ts_type, ts = m.timestamp()
                out.append(Consumed(m.partition(), m.offset(),
                                    Rec(m.key(), m.value(), norm_headers(m.headers()), ts)))
                pos[m.partition()] = m.offset() + 1
    finally:
        c.close()
    return out


def consume_kafka_python(bootstrap, topic, ends: dict[int, int], timeout=60.0) -> list[Consumed]:
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                      auto_offset_reset="earliest", fetch_max_wait_ms=100)
    out = []
    pos = {p: 0 for p in ends}
    try:
        tps = [TopicPartition(topic, p) for p, e in ends.items() if e > 0]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        deadline = time.monotonic() + timeout
        while any(pos[p] < ends[p] for p in ends):
            if time.monotonic() > deadline:
                raise TimeoutError(f"kafka-python consumer stuck at {pos}, ends {ends}")
            for tp, msgs in c.poll(timeout_ms=500, max_records=10000).items():
                for m in msgs:
                    out.append(Consumed(m.partition, m.offset,
                                        Rec(m.key, m.value, norm_headers(m.headers), m.timestamp)))
                    pos[m.partition] = m.offset + 1
    finally:
        c.close()
    return out


def consume_aiokafka(bootstrap, topic, ends: dict[int, int], timeout=60.0) -> list[Consumed]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def run():
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest", fetch_max_wait_ms=100)
        await c.start()
        out = []
        pos = {p: 0 for p in ends}
        try:
            tps = [TopicPartition(topic, p) for p, e in ends.items() if e > 0]
            c.assign(tps)
            await c.seek_to_beginning(*tps)
            deadline = time.monotonic() + timeout
            while any(pos[p] < ends[p] for p in ends):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"aiokafka consumer stuck at {pos}, ends {ends}")
                batches = await c.getmany(timeout_ms=500, max_records=10000)
                for tp, msgs in batches.items():
                    for m in msgs:
                        out.append(Consumed(m.partition, m.offset,
                                            Rec(m.key, m.value, norm_headers(m.headers), m.timestamp)))
                        pos[m.partition] = m.offset + 1
        finally:
            await c.stop()
        return out

    return asyncio.run(run())


KCAT_FORMAT = "%p %o %T %K %S %h\n%k%s\n"


def parse_kcat(out: bytes) -> list[Consumed]:
    """Parse kcat -C -f KCAT_FORMAT output: lengths (-1 = NULL) make keys and values byte-exact.
    Header values must be plain ASCII without ',' or '='; kcat prints NULL ones as ``NULL``."""
    res = []
    i = 0
    n = len(out)
    while i < n:
        nl = out.index(b"\n", i)
        fields = out[i:nl].split(b" ", 5)
        p, o, ts, klen, vlen = (int(x) for x in fields[:5])
        hdr = fields[5] if len(fields) > 5 else b""
        i = nl + 1
        key = None if klen < 0 else out[i:i + klen]
        i += max(klen, 0)
        value = None if vlen < 0 else out[i:i + vlen]
        i += max(vlen, 0)
        if out[i:i + 1] != b"\n":
            raise ValueError(f"kcat output out of step at byte {i}")
        i += 1
        headers = []
        if hdr:
            for kv in hdr.split(b","):
                k, _, v = kv.partition(b"=")
                headers.append((k.decode(), None if v == b"NULL" else v))
        res.append(Consumed(p, o, Rec(key, value, tuple(headers), ts)))
    return res


def consume_kcat(bootstrap, topic, ends: dict[int, int], timeout=60.0) -> list[Consumed]:
    out = []
    for p, e in ends.items():
        if e == 0:
            continue
        r = subprocess.run(["kcat", "-b", bootstrap, "-C", "-t", topic, "-p", str(p), "-o", "beginning",
                            "-c", str(e), "-q", "-f", KCAT_FORMAT],
                           capture_output=True, timeout=timeout, check=False)
        if r.returncode != 0:
            raise RuntimeError(f"kcat consume {topic}-{p} failed: {r.stderr[-2000:]!r}")
        out.extend(parse_kcat(r.stdout))
    return out


CONSUMERS = {
    "kcat": consume_kcat,
    "confluent": consume_confluent,
    "kafka-python": consume_kafka_python,
    "aiokafka": consume_aiokafka,
}


# ---- segment files -------------------------------------------------------------------------------

_BATCH_HEAD = struct.Struct(">qiibIhiqqqhii")   # 61 bytes: the RecordBatch v2 header


@dataclass(frozen=True)
class StoredBatch:
    position: int
    base_offset: int
    length: int          # batchLength (bytes after the length field)
    leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    record_count: int

    @property
    def last_offset(self):
        return self.base_offset + self.last_offset_delta

    @property
    def size(self):
        return self.length + 12

    @property
    def codec(self):
        return self.attributes & 0x7


def partition_dir(data_dir, topic: str, partition: int) -> Path:
    return Path(data_dir) / f"{topic}-{partition}"


def segment_files(data_dir, topic, partition, suffix=".log") -> list[Path]:
    return sorted(partition_dir(data_dir, topic, partition).glob(f"*{suffix}"))


def scan_log(path) -> tuple[list[StoredBatch], int]:
    """Walk a .log file's batch headers (no CRC check) -> (batches, bytes left over at the tail)."""
    data = Path(path).read_bytes()
    batches = []
    pos = 0
    while pos + _BATCH_HEAD.size <= len(data):
        f = _BATCH_HEAD.unpack_from(data, pos)
        base, length, epoch, magic, crc, attrs, lod, bts, mts, pid, _pe, _bseq, count = f
        if length < _BATCH_HEAD.size - 12 or pos + 12 + length > len(data):
            break
        batches.append(StoredBatch(pos, base, length, epoch, magic, crc, attrs, lod, bts, mts, pid, count))
        pos += 12 + length
    return batches, len(data) - pos


def crc_ok(path, batch: StoredBatch) -> bool:
    from kbroker._native import crc

    with open(path, "rb") as f:
        f.seek(batch.position + 21)
        body = f.read(batch.size - 21)
    return crc.crc32c(body) == batch.crc


def all_batches(data_dir, topic, partition) -> list[tuple[Path, StoredBatch]]:
    out = []
    for path in segment_files(data_dir, topic, partition):
        batches, tail = scan_log(path)
        if tail:
            raise AssertionError(f"{path}: {tail} bytes after the last whole batch")
        out.extend((path, b) for b in batches)
    return out


# ---- producers / misc ------------------------------------------------------------------------------

def kcat_produce(bootstrap, topic, lines: list[bytes], *, codec=None, null_empty=False, headers=(),
                 partition=None, timeout=120.0, extra=()):
    """kcat -P with key delimiter TAB, one message per line. Raises on failure."""
    cmd = ["kcat", "-b", bootstrap, "-P", "-t", topic, "-K", "\t", "-X", "message.timeout.ms=30000"]
    if codec:
        cmd += ["-z", codec]
    if null_empty:
        cmd.append("-Z")
    if partition is not None:
        cmd += ["-p", str(partition)]
    for h in headers:
        cmd += ["-H", h]
    cmd += list(extra)
    data = b"".join(line + b"\n" for line in lines)
    r = subprocess.run(cmd, input=data, capture_output=True, timeout=timeout)
    if r.returncode != 0 or b"ERROR" in r.stderr:
        raise RuntimeError(f"kcat produce failed ({r.returncode}): {r.stderr[-2000:]!r}")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")



# ---- history checker for fault tests -------------------------------------------------------------

@dataclass
class HistoryReport:
    sent: int
    acked: int
    acked_lost: int             # acknowledged, then missing from the log
    unseen: int                 # sent, not acknowledged, not in the log (allowed: never confirmed)
    duplicates: int             # one sent value stored at more than one offset
    inconsistent_offsets: int   # acked at one offset, read at another; or two reads of one offset differ
    examples: list = field(default_factory=list)
    aborted_visible: int = 0    # read at an offset written by an aborted transaction
    not_once: int = 0           # sent values read at no offset or at more than one (exactly-once runs)

    def line(self) -> str:
        return (f"sent {self.sent}, acked {self.acked}: acked-but-lost {self.acked_lost} of {self.acked}, "
                f"unseen {self.unseen}, duplicates {self.duplicates}, "
                f"inconsistent offsets {self.inconsistent_offsets}, aborted visible {self.aborted_visible}, "
                f"not exactly once {self.not_once} of {self.sent}"
                + (f"; e.g. {self.examples[:5]}" if self.examples else ""))


class History:
    """Every send, acknowledgement, failure and poll of a fault test, keyed by a unique value per
    send. Thread-safe enough for one producer thread and one consumer thread (list/dict appends
    under the GIL).

    Transactional runs: ``ack`` only what a committed transaction wrote, ``abort`` what an aborted
    one wrote; ``sent`` are then the inputs that must each be read exactly once (``not_once``)."""

    def __init__(self):
        self.sent: list = []                    # values in send order
        self.acked: dict = {}                   # value -> (partition, offset)
        self.failed: dict = {}                  # value -> error text
        self.aborted: dict = {}                 # (partition, offset) -> value, written by aborted transactions
        self.polls: list = []                   # (partition, offset, value) in poll order

    def send(self, value: bytes) -> None:
        self.sent.append(value)

    def ack(self, value: bytes, partition: int, offset: int) -> None:
        self.acked[value] = (partition, offset)

    def fail(self, value: bytes, error) -> None:
        self.failed[value] = str(error)

    def abort(self, value: bytes, partition: int, offset: int) -> None:
        self.aborted[(partition, offset)] = value

    def poll(self, partition: int, offset: int, value: bytes) -> None:
        self.polls.append((partition, offset, value))

    def check(self) -> HistoryReport:
        at: dict = {}                           # (partition, offset) -> value
        where: dict = {}                        # value -> {(partition, offset)}
        inconsistent = 0
        examples = []
        for part, off, value in self.polls:
            prev = at.setdefault((part, off), value)
            if prev != value:
                inconsistent += 1
                examples.append(("offset read twice with different values", part, off))
            where.setdefault(value, set()).add((part, off))
        lost = 0
        for value, pos in self.acked.items():
            seen = where.get(value)
            if not seen:
                lost += 1
                examples.append(("acked but lost", value, pos))
            elif pos not in seen:
                inconsistent += 1
                examples.append(("acked at one offset, read at another", value, pos, sorted(seen)))
        dups = sum(1 for s in where.values() if len(s) > 1)
        unseen = sum(1 for v in self.sent if v not in self.acked and v not in where)
        aborted_visible = 0
        for part, off, value in self.polls:
            if (part, off) in self.aborted:
                aborted_visible += 1
                examples.append(("aborted but visible", value, part, off))
        not_once = sum(1 for v in self.sent if len(where.get(v, ())) != 1)
        return HistoryReport(len(self.sent), len(self.acked), lost, unseen, dups, inconsistent, examples,
                             aborted_visible, not_once)


def read_all_confluent(bootstrap: str, topic: str, partitions: int, history: History, timeout: float = 60.0,
                       isolation: str = "read_uncommitted"):
    """Read every partition from the start to its current end (asked of the leader: the high watermark,
    or the last stable offset for read_committed) with a confluent-kafka consumer, logging each record
    as a poll. Returns {partition: end}."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    deadline = time.monotonic() + timeout
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"history-{time.monotonic_ns()}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest", "isolation.level": isolation,
                  # read_committed skips control records: the end may follow a marker, never a record
                  "enable.partition.eof": True})
    try:
        ends = {}
        while len(ends) < partitions:
            for p in range(partitions):
                if p not in ends:
                    try:
                        ends[p] = c.get_watermark_offsets(TopicPartition(topic, p), timeout=5)[1]
                    except KafkaException:
                        pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"no end offsets for {topic}: {ends}")
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        pos = {p: 0 for p in range(partitions)}
        while any(pos[p] < ends[p] for p in ends):
            if time.monotonic() > deadline:
                raise TimeoutError(f"read {pos} of {ends}")
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    pos[m.partition()] = max(pos[m.partition()], m.offset())
                continue
            history.poll(m.partition(), m.offset(), m.value())
            pos[m.partition()] = m.offset() + 1
    finally:
        c.close()
    return ends


def fill_partition(bootstrap: str, topic: str, records: int, value_size: int) -> None:
    """Produce ``records`` keyed records of ``value_size`` bytes to partition 0 with acks=all (confluent-kafka),
    waiting out a full local queue; every record acknowledged or the assert fails."""
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20, "batch.size": 1 << 20})
    value = b"x" * value_size
    for i in range(records):
        while True:
            try:
                p.produce(topic, value=value, key=b"%d" % i, partition=0)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0


@contextlib.contextmanager
def strace_attached(pid: int, trace: str, out: Path, *extra: str):
    """strace -f attached to ``pid`` (``-e trace=<trace>``, output in ``out``) for the block; yields the
    Popen. Fails the test if strace is missing. strace has no readiness signal: callers wait until a
    syscall they provoke shows up in ``out``. Detached with SIGINT on exit."""
    strace = shutil.which("strace")
    if strace is None:
        raise AssertionError("strace is not installed: this test observes the broker's syscalls with it")
    tracer = subprocess.Popen([strace, "-f", "-qq", *extra, "-e", f"trace={trace}", "-o", str(out), "-p", str(pid)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              # SIGINT detaches strace; a background CI run inherits it ignored
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        yield tracer
    finally:
        tracer.send_signal(signal.SIGINT)
        try:
            tracer.wait(timeout=20)
        except subprocess.TimeoutExpired:
            tracer.kill()
            tracer.wait(10)


@contextlib.contextmanager
def metered_cluster(tmp_path_factory, name: str):
    """A one-broker LocalCluster with its Prometheus endpoint on a free port -> (cluster, port)."""
    port = free_port()
    with LocalCluster(tmp_path_factory.mktemp(name), overrides={"kbroker.metrics.port": port}) as c:
        yield c, port
