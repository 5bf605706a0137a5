"""``kbroker producer-perf-test``: Kafka 3.9's ProducerPerformance, on kbroker's client.

Semantics kept from Kafka's tool:

* one record per loop iteration, no key, value from ``--record-size`` (fresh random uppercase
  letters), ``--payload-file`` (a random pick among the file's pieces) or ``--payload-monotonic``
  (the loop index in decimal);
* latency of a record = acknowledgement time - time of its send(), in whole milliseconds; only
  acknowledged records are counted; every 500k-th fraction of records is sampled for percentiles
  (``sampling = n // min(n, 500000)``, percentile p = ``sorted[int(p * size)]``);
* a window line every 5000 ms (printed when a completion crosses the interval), the summary line
  after the producer is closed; ``--throughput`` paces sends like Kafka's ThroughputThrottler
  (sleep once the deficit reaches 2 ms);
* producer defaults are the Java 3.9 producer's: acks=all, enable.idempotence=true (switched off
  silently, as Java does, when not set explicitly and acks/retries/in-flight conflict),
  linger.ms=0, batch.size=16384, compression.type=none, max.in.flight.requests.per.connection=5,
  client.id=perf-producer-client.

How it stays out of the way: records go straight into the client's native ``BatchBuilder`` (one
open batch at a time, sticky partition moving on when a batch closes, like Kafka's uniform sticky
partitioner), each closed batch is sent with ``Producer.produce_batch`` (leader lookup, retries,
idempotent producer id and per-partition sequence numbers), and per record Python keeps only a
``time.monotonic()`` float. Latencies are computed per batch when its acknowledgement arrives.
The loop hands control to the event loop when a batch closes and at least every millisecond, so
responses are read and linger.ms is honoured.
"""
from __future__ import annotations

import asyncio
import os
import random
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from itertools import cycle, islice

from kbroker._native.batch import BatchBuilder
from kbroker.client import Cluster, KafkaError, Producer
from kbroker.client.connection import raise_for_error
from kbroker.client.producer import BATCH_HEADER, COMPRESSION, RECORD_OVERHEAD_MAX
from kbroker.client.security import is_security_key, security_from
from kbroker.config import parse_properties
from kbroker.protocol.api import ApiKey
from kbroker.protocol.errors import Errors
from kbroker.protocol.messages import API_NAMES

from .java_format import java_format, mib

REPORTING_INTERVAL_MS = 5000
MAX_SAMPLES = 500_000
MIN_SLEEP_NS = 2_000_000          # ThroughputThrottler: sleep once the deficit reaches 2 ms
YIELD_EVERY_S = 0.001             # hand the loop to I/O at least this often

WINDOW_FMT = "%d records sent, %.1f records/sec (%.2f MB/sec), %.1f ms avg latency, %.1f ms max latency.%n"
# Kafka 3.9 prints the summary's records/sec with a bare %f (six places), the window's with %.1f.
TOTAL_FMT = ("%d records sent, %f records/sec (%.2f MB/sec), %.2f ms avg latency, %.2f ms max latency, "
             "%d ms 50th, %d ms 95th, %d ms 99th, %d ms 99.9th.%n")


class PerfError(Exception):
    """A refusal or setup failure: printed as one line, exit status 1."""


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


# ---- statistics -----------------------------------------------------------------------------------

class Stats:
    """Kafka's ProducerPerformance.Stats, fed a batch of completions at a time."""

    def __init__(self, num_records: int, reporting_interval_ms: int = REPORTING_INTERVAL_MS,
                 out=None, clock=_now_ms):
        self.clock = clock
        self.out = out if out is not None else sys.stdout
        self.start = self.window_start = clock()
        self.sampling = num_records // min(num_records, MAX_SAMPLES)
        self.samples: list[int] = []
        self.iteration = 0
        self.count = self.bytes = self.total_latency = self.max_latency = 0
        self.reporting_interval = reporting_interval_ms
        self._new_window(self.start)

    def _new_window(self, now: int) -> None:
        self.window_start = now
        self.window_count = self.window_bytes = self.window_total = self.window_max = 0

    def record_batch(self, latencies: list[int], first_bytes: int, total_bytes: int, now: int) -> None:
        """Count ``latencies`` (one per record, all completed at ``now``). As in Kafka, the record
        that crosses the reporting interval ends the window: it is counted in the line printed."""
        k = len(latencies)
        if not k:
            return
        s = self.sampling
        self.samples.extend(latencies[(-self.iteration) % s::s])
        self.iteration += k
        total, worst = sum(latencies), max(latencies)
        self.count += k
        self.bytes += total_bytes
        self.total_latency += total
        if worst > self.max_latency:
            self.max_latency = worst
        if now - self.window_start >= self.reporting_interval:
            first = latencies[0]
            self.window_count += 1
            self.window_bytes += first_bytes
            self.window_total += first
            self.window_max = max(self.window_max, first)
            self.print_window(now)
            self._new_window(now)
            if k > 1:
                rest = latencies[1:]
                self.window_count += k - 1
                self.window_bytes += total_bytes - first_bytes
                self.window_total += total - first
                self.window_max = max(rest)
        else:
            self.window_count += k
            self.window_bytes += total_bytes
            self.window_total += total
            if worst > self.window_max:
                self.window_max = worst

    def window_line(self, now: int) -> str:
        elapsed = now - self.window_start
        return java_format(WINDOW_FMT, self.window_count, _div(1000.0 * self.window_count, elapsed),
                           _div(1000.0 * mib(self.window_bytes), elapsed),
                           _div(self.window_total, self.window_count), float(self.window_max))

    def print_window(self, now: int) -> None:
        self.out.write(self.window_line(now))
        self.out.flush()

    def percentiles(self, *ps: float) -> list[int]:
        vals = sorted(self.samples) or [0]     # Kafka's array is zero-filled: 0 when nothing completed
        size = len(self.samples)
        return [vals[int(p * size)] for p in ps]

    def total_line(self, now: int | None = None) -> str:
        now = self.clock() if now is None else now
        elapsed = now - self.start
        p50, p95, p99, p999 = self.percentiles(0.5, 0.95, 0.99, 0.999)
        return java_format(TOTAL_FMT, self.count, _div(1000.0 * self.count, elapsed),
                           _div(1000.0 * mib(self.bytes), elapsed), _div(self.total_latency, self.count),
                           float(self.max_latency), p50, p95, p99, p999)


def _div(a: float, b: float) -> float:
    """Java double division: x/0 is ±Infinity, 0/0 is NaN."""
    if b:
        return a / b
    if a != a or a == 0:
        return float("nan")
    return float("inf") if a > 0 else float("-inf")


# ---- throttle -------------------------------------------------------------------------------------

class Throttler:
    """Kafka's ThroughputThrottler: behind the target rate? no wait; ahead of it? add 1/target s of
    deficit per record and sleep once it reaches 2 ms. A target of 0 never sends after the first."""

    def __init__(self, target: float, start_s: float):
        self.target = target
        self.start = start_s
        self.sleep_ns = int(1e9 / target) if target > 0 else None
        self.deficit_ns = 0

    def should_throttle(self, sent_so_far: int, now_s: float) -> bool:
        if self.target < 0:
            return False
        elapsed = now_s - self.start
        return elapsed > 0 and sent_so_far / elapsed > self.target

    def next_sleep(self) -> float | None:
        """Seconds to sleep now (0 = not yet), None = forever (target 0)."""
        if self.sleep_ns is None:
            return None
        self.deficit_ns += self.sleep_ns
        if self.deficit_ns >= MIN_SLEEP_NS:
            s = self.deficit_ns / 1e9
            self.deficit_ns = 0
            return s
        return 0.0


# ---- payloads -------------------------------------------------------------------------------------

def random_payloads(record_size: int, seed: int = 0, pool_bytes: int = 4 << 20) -> list[bytes]:
    """Distinct random uppercase-letter values of ``record_size`` bytes, cut end to end from one
    pool (at least 8 of them, the pool at least 4 MiB), so consecutive records do not repeat within
    a batch and compress like Kafka's fresh random letters."""
    count = max(8, pool_bytes // record_size)
    rnd = random.Random(seed)
    raw = rnd.randbytes(count * record_size)
    letters = bytes(65 + (b % 26) for b in range(256))
    pool = raw.translate(letters)
    return [pool[i * record_size:(i + 1) * record_size] for i in range(count)]


def read_payload_file(path: str, delimiter: str, out) -> list[bytes]:
    """The file's pieces between ``delimiter`` (Kafka drops trailing empty pieces), as UTF-8."""
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        raise PerfError("File does not exist or empty file provided.")
    out.write(f"Reading payloads from: {os.path.abspath(path)}\n")
    with open(path, encoding="utf-8") as f:
        pieces = f.read().split(delimiter)
    while pieces and pieces[-1] == "":
        pieces.pop()
    out.write(f"Number of messages read: {len(pieces)}\n")
    if not pieces:
        raise PerfError("no payloads in " + path)
    return [p.encode("utf-8") for p in pieces]


# ---- configuration --------------------------------------------------------------------------------

_TRUE = {"true": True, "false": False}

# Java producer 3.9 defaults (ProducerConfig), kept explicit: the tool reports them as such.
JAVA_DEFAULTS = {
    "acks": "all", "enable.idempotence": "true", "linger.ms": "0", "batch.size": "16384",
    "compression.type": "none", "max.in.flight.requests.per.connection": "5", "retries": "2147483647",
    "retry.backoff.ms": "100", "request.timeout.ms": "30000", "delivery.timeout.ms": "120000",
    "max.request.size": "1048576", "buffer.memory": "33554432", "client.id": "perf-producer-client",
}
# Accepted and meaningless for this client (serializers are bytes, the rest is JVM/security tuning
# the client does not have); anything else unknown is refused so a typo never passes silently.
IGNORED = {"key.serializer", "value.serializer", "partitioner.class", "send.buffer.bytes",
           "receive.buffer.bytes", "max.block.ms", "metadata.max.age.ms", "reconnect.backoff.ms",
           "reconnect.backoff.max.ms", "connections.max.idle.ms",
           "compression.gzip.level", "compression.lz4.level", "compression.zstd.level",
           "partitioner.adaptive.partitioning.enable", "partitioner.availability.timeout.ms",
           "partitioner.ignore.keys", "metrics.recording.level", "retry.backoff.max.ms",
           "client.dns.lookup", "interceptor.classes", "metric.reporters"}


@dataclass
class ProducerSettings:
    bootstrap: str
    acks: int
    idempotent: bool
    linger_ms: float
    batch_size: int
    compression: str
    max_in_flight: int
    retries: int
    retry_backoff_ms: int
    request_timeout_ms: int
    delivery_timeout_ms: int
    max_request_size: int
    buffer_memory: int
    client_id: str
    ignored: list[str] = field(default_factory=list)
    transactional_id: str | None = None
    security: object = None         # kbroker.client.security.ClientSecurity (security.protocol, ssl.*, sasl.*)


def read_props(producer_props: list[str] | None, config_file: str | None) -> dict[str, str]:
    """--producer.config first, then --producer-props on top (Kafka's order). A prop must be one
    ``key=value`` with a single '=' (Kafka splits on '=' and wants two pieces)."""
    if producer_props is None and config_file is None:
        raise PerfError("Either --producer-props or --producer.config must be specified.")
    props: dict[str, str] = {}
    if config_file is not None:
        try:
            with open(config_file, encoding="utf-8") as f:
                props.update(parse_properties(f.read()))
        except OSError as e:
            raise PerfError(f"cannot read --producer.config {config_file}: {e.strerror}") from None
    for item in producer_props or ():
        pieces = item.split("=")
        if len(pieces) != 2:
            raise PerfError(f"Invalid property: {item}")
        props[pieces[0]] = pieces[1]
    return props


def settings_from(props: dict[str, str]) -> ProducerSettings:
    """Kafka property names -> kbroker client settings, with the Java 3.9 producer's defaults."""
    merged = dict(JAVA_DEFAULTS)
    merged.update(props)
    unknown = sorted(k for k in props if k not in JAVA_DEFAULTS and k not in IGNORED
                     and k not in ("bootstrap.servers", "transactional.id") and not is_security_key(k))
    if unknown:
        raise PerfError("unsupported producer properties: " + ", ".join(unknown))
    if not merged.get("bootstrap.servers"):
        raise PerfError("bootstrap.servers is required (--producer-props bootstrap.servers=HOST:PORT)")

    def num(key, lo=0):
        try:
            v = int(merged[key])
        except ValueError:
            raise PerfError(f"{key} must be an integer, not {merged[key]!r}") from None
        if v < lo:
            raise PerfError(f"{key} must be at least {lo}, not {v}")
        return v

    acks = {"all": -1, "-1": -1, "0": 0, "1": 1}.get(merged["acks"].strip().lower())
    if acks is None:
        raise PerfError(f"acks must be all, -1, 0 or 1, not {merged['acks']!r}")
    idem_text = merged["enable.idempotence"].strip().lower()
    if idem_text not in _TRUE:
        raise PerfError(f"enable.idempotence must be true or false, not {merged['enable.idempotence']!r}")
    idempotent = _TRUE[idem_text]
    max_in_flight = num("max.in.flight.requests.per.connection", 1)
    retries = num("retries")
    conflict = acks != -1 or max_in_flight > 5 or retries == 0
    if idempotent and conflict:
        if "enable.idempotence" in props:
            raise PerfError("enable.idempotence=true needs acks=all, retries > 0 and "
                            "max.in.flight.requests.per.connection <= 5")
        idempotent = False      # Java 3.x: the implicit default yields to a conflicting setting
    tid = props.get("transactional.id") or None
    if tid is not None and not idempotent:
        if "enable.idempotence" in props or conflict:
            raise PerfError("transactional.id needs enable.idempotence (acks=all, retries > 0 and "
                            "max.in.flight.requests.per.connection <= 5)")
    compression = merged["compression.type"].strip().lower()
    if compression not in COMPRESSION or compression is None:
        raise PerfError(f"unknown compression.type {merged['compression.type']!r}")
    return ProducerSettings(
        bootstrap=merged["bootstrap.servers"], acks=acks, idempotent=idempotent,
        linger_ms=num("linger.ms"), batch_size=max(1, num("batch.size")), compression=compression,
        max_in_flight=max_in_flight, retries=retries, retry_backoff_ms=num("retry.backoff.ms"),
        request_timeout_ms=num("request.timeout.ms", 1), delivery_timeout_ms=num("delivery.timeout.ms", 1),
        max_request_size=num("max.request.size", 1), buffer_memory=num("buffer.memory", 1),
        client_id=merged["client.id"], ignored=sorted(k for k in props if k in IGNORED), transactional_id=tid,
        security=security_from(props, PerfError))


# ---- the run --------------------------------------------------------------------------------------

class _Open:
    __slots__ = ("builder", "partition", "sends", "created", "nbytes", "first_bytes")

    def __init__(self, builder, partition, created):
        self.builder, self.partition, self.created = builder, partition, created
        self.sends: list[float] = []
        self.nbytes = 0
        self.first_bytes = 0


class _Pipeline:
    """Closed batches per partition, sent as in-flight slots free up; acknowledgements feed Stats."""

    def __init__(self, producer: Producer, cluster: Cluster, topic: str, s: ProducerSettings,
                 stats: Stats, err):
        self.p, self.cluster, self.topic, self.s, self.stats, self.err = producer, cluster, topic, s, stats, err
        self.codec = COMPRESSION[s.compression]
        self.queued: dict[int, deque] = {}          # partition -> [(data, sends, first_bytes, nbytes)]
        self.in_flight: dict[int, int] = {}        # leader node -> requests outstanding
        self.next_seq: dict[int, int] = {}
        self.buffered = 0                          # bytes closed but not yet acknowledged
        self.space = asyncio.Event()
        self.tasks: set[asyncio.Task] = set()
        self.failed_records = 0
        self.requests = 0
        self.batches = 0
        self.records_in_batches = 0
        self.wire_bytes = 0
        self.errors: dict[str, int] = {}
        # Transactions: set once the current transaction's partitions are added; closed batches stay
        # queued until then.
        self.gate: asyncio.Event | None = None

    def close_batch(self, ob: _Open) -> None:
        seq = -1
        if self.s.idempotent:
            seq = self.next_seq.get(ob.partition, 0)
            self.next_seq[ob.partition] = (seq + len(ob.sends)) % (1 << 31)
        data = ob.builder.build(producer_id=self.p.producer_id, producer_epoch=self.p.producer_epoch,
                                base_sequence=seq, is_transactional=self.p.transactional_id is not None)
        self.queued.setdefault(ob.partition, deque()).append((data, ob.sends, ob.first_bytes, ob.nbytes))
        self.buffered += len(data)
        self.pump()

    def has_slot(self, partition: int) -> bool:
        node = self.cluster.leader_for(self.topic, partition)
        return self.in_flight.get(node, 0) < self.s.max_in_flight

    def pump(self) -> None:
        if self.gate is not None and not self.gate.is_set():
            return          # the transaction's partitions are being added: batches wait here, in order
        for partition, q in self.queued.items():
            while q:
                node = self.cluster.leader_for(self.topic, partition)
                if self.in_flight.get(node, 0) >= self.s.max_in_flight:
                    break
                item = q.popleft()
                self.in_flight[node] = self.in_flight.get(node, 0) + 1
                t = asyncio.get_running_loop().create_task(self._send(node, partition, *item))
                self.tasks.add(t)
                t.add_done_callback(self.tasks.discard)

    async def _send(self, node, partition, data, sends, first_bytes, nbytes) -> None:
        try:
            await self.p.produce_batch(self.topic, partition, data)
        except (KafkaError, OSError) as e:
            now = _now_ms()
            self.failed_records += len(sends)
            key = str(e)
            self.errors[key] = self.errors.get(key, 0) + len(sends)
            if self.errors[key] == len(sends):     # one line per distinct error, not per record
                self.err.write(f"ERROR {len(sends)} records of {self.topic}-{partition} failed: {e}\n")
        else:
            now_s = time.monotonic()
            now = int(now_s * 1000)
            self.stats.record_batch([now - int(t * 1000) for t in sends], first_bytes, nbytes, now)
        finally:
            self.requests += 1
            self.batches += 1
            self.records_in_batches += len(sends)
            self.wire_bytes += len(data)
            self.in_flight[node] -= 1
            self.buffered -= len(data)
            if self.buffered <= self.s.buffer_memory:
                self.space.set()
            self.pump()

    async def drain(self) -> None:
        """Wait until every closed batch is acknowledged or has failed."""
        while True:
            self.pump()
            if not self.tasks:
                return
            await asyncio.wait(list(self.tasks))


@dataclass
class RunConfig:
    topic: str
    num_records: int
    throughput: float
    settings: ProducerSettings
    record_size: int | None = None
    payloads: list[bytes] | None = None           # --payload-file pieces
    monotonic: bool = False
    print_metrics: bool = False
    reporting_interval_ms: int = REPORTING_INTERVAL_MS
    transaction_duration_ms: int = 0              # > 0: commit a transaction this often (needs a transactional id)


async def run(cfg: RunConfig, out=None, err=None) -> Stats:
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    s = cfg.settings
    cluster = Cluster(s.bootstrap, client_id=s.client_id, request_timeout_ms=s.request_timeout_ms,
                      retry_backoff_ms=s.retry_backoff_ms, allow_auto_topic_creation=True, security=s.security)
    producer = Producer(cluster=cluster, acks=s.acks, linger_ms=s.linger_ms, batch_size=s.batch_size,
                        compression_type=s.compression, enable_idempotence=s.idempotent, retries=s.retries,
                        retry_backoff_ms=s.retry_backoff_ms,
                        max_in_flight_requests_per_connection=s.max_in_flight,
                        request_timeout_ms=s.request_timeout_ms, delivery_timeout_ms=s.delivery_timeout_ms,
                        max_request_size=s.max_request_size, buffer_memory=s.buffer_memory)
    try:
        await producer.start()
        await cluster.wait_for_topic(cfg.topic, s.delivery_timeout_ms / 1000)
        partitions = cluster.partitions_for(cfg.topic)
        # Open the leaders' connections before the first batch. Sends that wait on a connection still
        # being opened resume (through the shared open future) after sends started once it is open,
        # so a partition's second batch could be written before its first one; the broker, knowing no
        # state for the new producer id, takes the second (KIP-360) and then refuses the first as
        # OUT_OF_ORDER_SEQUENCE_NUMBER: a whole batch lost (221 of 30,000 records under load).
        for node in sorted({cluster.leader_for(cfg.topic, p) for p in partitions}):
            await cluster.connection(node)
        biggest = (cfg.record_size if cfg.record_size is not None
                   else max(map(len, cfg.payloads)) if cfg.payloads else len(str(cfg.num_records)))
        if BATCH_HEADER + RECORD_OVERHEAD_MAX + biggest > s.max_request_size:
            raise PerfError(f"a record of {biggest} bytes does not fit max.request.size={s.max_request_size}")
        txn = None
        if s.transactional_id is not None:
            # Before the clock starts, as Java's initTransactions() comes before its first send.
            txn = TxnSession(producer, cluster, s.transactional_id, cfg.topic, partitions, s)
            await txn.init()
        stats = Stats(cfg.num_records, cfg.reporting_interval_ms, out)
        pipe = _Pipeline(producer, cluster, cfg.topic, s, stats, err)
        if txn is not None:
            txn.begin(pipe)
        await _produce(cfg, pipe, partitions, txn)
        if txn is not None:
            await txn.commit(pipe)
        else:
            await pipe.drain()
    finally:
        await producer.close()
    out.write(stats.total_line())
    if cfg.print_metrics:
        out.write(metrics_text(pipe, stats, s.client_id))
    out.flush()
    return stats


class TxnSession:
    """The transactions of ``--transactional-id`` / ``--transaction-duration-ms``, as Kafka's tool runs them:
    InitProducerId at the transaction coordinator, then begin / send / commit every duration. Each
    transaction adds every partition of the topic up front (one AddPartitionsToTxn), so the sends need
    no per-batch bookkeeping; the producer's batches carry the transactional flag and id. Records keep
    filling batches while a transaction's partitions are being added; they are sent after it."""

    def __init__(self, producer: Producer, cluster: Cluster, tid: str, topic: str, partitions: list[int],
                 s: ProducerSettings):
        self.p, self.cluster, self.tid, self.topic, self.partitions = producer, cluster, tid, topic, partitions
        self.timeout_ms = 60000
        self.deadline_s = s.delivery_timeout_ms / 1000
        self.backoff = max(s.retry_backoff_ms / 1000, 0.01)
        self.commits = 0
        self.commit_ms: list[float] = []
        self._adding: asyncio.Task | None = None

    async def _coordinator_call(self, api_key: int, body: dict, code_of) -> dict:
        deadline = time.monotonic() + self.deadline_s
        while True:
            _, r = await self.cluster.send_any(FIND_COORDINATOR, {"key": self.tid, "key_type": 1})
            if r["error_code"] == 0:
                conn = await self.cluster.connection(r["node_id"])
                _, r = await conn.send(api_key, body)
                code = code_of(r)
                if code == 0:
                    return r
            else:
                code = r["error_code"]
            if code not in _TXN_RETRY or time.monotonic() > deadline:
                raise_for_error(code, None, f"{API_NAMES[api_key]}({self.tid})")
            # The previous transaction's markers are still being written: Java's producer retries
            # AddPartitionsToTxn after 20 ms rather than retry.backoff.ms.
            await asyncio.sleep(min(self.backoff, 0.02) if code == Errors.CONCURRENT_TRANSACTIONS else self.backoff)

    async def init(self) -> None:
        r = await self._coordinator_call(INIT_PRODUCER_ID, {"transactional_id": self.tid,
                                                            "transaction_timeout_ms": self.timeout_ms},
                                         lambda r: r["error_code"])
        self.p.producer_id, self.p.producer_epoch = r["producer_id"], r["producer_epoch"]
        self.p.transactional_id = self.tid

    def begin(self, pipe: "_Pipeline") -> None:
        """Start the next transaction: records keep filling batches while its partitions are added
        (the previous commit's markers may still be on their way); the batches are sent after it."""
        pipe.gate = asyncio.Event()
        self._adding = asyncio.get_running_loop().create_task(self._add_partitions(pipe))

    async def _add_partitions(self, pipe: "_Pipeline") -> None:
        body = {"v3_and_below_transactional_id": self.tid, "v3_and_below_producer_id": self.p.producer_id,
                "v3_and_below_producer_epoch": self.p.producer_epoch,
                "v3_and_below_topics": [{"name": self.topic, "partitions": self.partitions}]}
        await self._coordinator_call(ADD_PARTITIONS_TO_TXN, body, lambda r: max(
            (x["partition_error_code"] for t in r["results_by_topic_v3_and_below"] for x in t["results_by_partition"]),
            key=lambda c: c != 0))
        pipe.gate.set()
        pipe.pump()

    async def commit(self, pipe: "_Pipeline") -> None:
        """Every batch of the transaction acknowledged (after its partitions were added), then EndTxn."""
        await self._adding       # its failure ends the run here
        await pipe.drain()
        t0 = time.monotonic()
        await self._coordinator_call(END_TXN, {"transactional_id": self.tid, "producer_id": self.p.producer_id,
                                               "producer_epoch": self.p.producer_epoch, "committed": True},
                                     lambda r: r["error_code"])
        self.commit_ms.append((time.monotonic() - t0) * 1000)
        self.commits += 1


FIND_COORDINATOR, INIT_PRODUCER_ID = ApiKey.FIND_COORDINATOR, ApiKey.INIT_PRODUCER_ID
ADD_PARTITIONS_TO_TXN, END_TXN = ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.END_TXN
_TXN_RETRY = {Errors.COORDINATOR_LOAD_IN_PROGRESS, Errors.COORDINATOR_NOT_AVAILABLE, Errors.NOT_COORDINATOR,
              Errors.CONCURRENT_TRANSACTIONS}


async def _produce(cfg: RunConfig, pipe: _Pipeline, partitions: list[int], txn: TxnSession | None = None) -> None:
    s = cfg.settings
    n = cfg.num_records
    codec, batch_size, linger = pipe.codec, s.batch_size, s.linger_ms / 1000
    mono = time.monotonic
    sleep = asyncio.sleep
    buffer_memory = s.buffer_memory
    throttle = cfg.throughput >= 0
    throttler = Throttler(cfg.throughput, mono())
    if cfg.record_size is not None:
        values = islice(cycle(random_payloads(cfg.record_size)), n)
    elif cfg.payloads:
        rnd = random.Random(0)
        pick = [rnd.randrange(len(cfg.payloads)) for _ in range(min(n, 1 << 16))]
        values = islice(map(cfg.payloads.__getitem__, cycle(pick)), n)
    else:
        values = map(str.encode, map(str, range(n)))
    nparts = len(partitions)
    part_ix = random.randrange(nparts)
    ob = _Open(BatchBuilder(codec, batch_size), partitions[part_ix], mono())
    append, sends = ob.builder.append, ob.sends
    next_yield = mono() + YIELD_EVERY_S
    total_bytes = batch_start_bytes = 0      # payload bytes so far / when the open batch began

    def rotate(now):
        nonlocal ob, append, sends, part_ix, batch_start_bytes
        ob.nbytes = total_bytes - batch_start_bytes
        batch_start_bytes = total_bytes
        pipe.close_batch(ob)
        part_ix = (part_ix + 1) % nparts
        ob = _Open(BatchBuilder(codec, batch_size), partitions[part_ix], now)
        append, sends = ob.builder.append, ob.sends

    txn_every = cfg.transaction_duration_ms / 1000 if txn is not None else None
    txn_end = mono() + txn_every if txn_every else None
    for i, value in enumerate(values):
        t = mono()
        if txn_end is not None and t >= txn_end:
            # Kafka's tool: commit once the duration has passed, then begin the next transaction.
            if sends:
                rotate(t)
            await txn.commit(pipe)
            txn.begin(pipe)
            t = mono()
            txn_end = t + txn_every
        if not append(None, None, value):
            rotate(t)
            append(None, None, value)
            if pipe.buffered > buffer_memory:       # Java's send() blocks on buffer.memory too
                pipe.space.clear()
                await pipe.space.wait()
            next_yield = t + YIELD_EVERY_S
            await sleep(0)
        if not sends:
            ob.first_bytes = len(value)
            ob.created = t
        sends.append(t)
        total_bytes += len(value)
        if throttle and throttler.should_throttle(i, t):
            pause = throttler.next_sleep()
            if pause is None:
                await _linger_sleep(pipe, lambda: ob, rotate, linger, None)
            elif pause:
                await _linger_sleep(pipe, lambda: ob, rotate, linger, pause)
        if t >= next_yield:
            next_yield = t + YIELD_EVERY_S
            if sends and t - ob.created >= linger and pipe.has_slot(ob.partition):
                rotate(t)
            await sleep(0)
    if sends:
        rotate(mono())


async def _linger_sleep(pipe: _Pipeline, current, rotate, linger: float, seconds: float | None) -> None:
    """Sleep ``seconds`` (None = forever) while still sending the open batch once linger.ms has
    passed: a throttled producer must not hold a batch back for the length of its pauses."""
    end = None if seconds is None else time.monotonic() + seconds
    while True:
        now = time.monotonic()
        if end is not None and now >= end:
            return
        ob = current()
        wait = None if end is None else end - now
        if ob.sends:
            due = ob.created + linger - now
            if due <= 0:
                rotate(now)
                continue
            wait = due if wait is None else min(wait, due)
        await asyncio.sleep(wait if wait is not None else 3600)


def metrics_text(pipe: _Pipeline, stats: Stats, client_id: str) -> str:
    """``--print-metrics``: Kafka's layout (sorted ``group:name:{tags}`` padded, ' : ', doubles with
    %.3f) for the figures this tool keeps; not the Java client's full metric set."""
    tags = "{client-id=%s}" % client_id
    elapsed_s = max(1e-9, (stats.clock() - stats.start) / 1000)
    m = {
        "record-send-total": float(stats.count), "record-send-rate": stats.count / elapsed_s,
        "record-error-total": float(pipe.failed_records),
        "request-total": float(pipe.requests), "request-rate": pipe.requests / elapsed_s,
        "batch-size-avg": pipe.wire_bytes / pipe.batches if pipe.batches else float("nan"),
        "records-per-request-avg": (pipe.records_in_batches / pipe.requests if pipe.requests else float("nan")),
        "outgoing-byte-total": float(pipe.wire_bytes),
    }
    rows = {f"producer-metrics:{k}:{tags}": v for k, v in m.items()}
    w = max(map(len, rows))
    lines = [java_format(f"%n%-{w}s   %s%n", "Metric Name", "Value")]
    for name in sorted(rows):
        lines.append(java_format(f"%-{w}s : %.3f%n", name, rows[name]))
    return "".join(lines)
