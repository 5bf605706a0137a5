"""``kbroker consumer-perf-test``: Kafka 3.9's ConsumerPerformance, on kbroker's client.

What matches Kafka: the header, the summary line (``%s, %s, %.4f, %.4f, %d, %.4f, %d, %d, %.4f,
%.4f`` with ``yyyy-MM-dd HH:mm:ss:SSS`` dates), the detailed lines (``time, threadId, ...``: the
interval's end, thread 0, cumulative MB, interval MB/s, cumulative records, interval records/s,
then rebalance ms, fetch ms and the interval's fetch rates) printed instead of the summary when
``--show-detailed-stats`` is given, the ``WARNING: Exiting before ...`` line on timeout, bytes =
key + value lengths, the stop test made per poll of at most ``max.poll.records`` (500) records, so
the count may pass ``--messages`` by less than one poll, as Kafka's does.

What differs: kbroker has no consumer groups yet. ``--group`` is accepted but not joined: every
partition of the topic is assigned directly, starting at the earliest offset (``--from-latest``: the
latest), and the tool says so on stderr. ``rebalance.time.ms`` is the time this assignment took
(metadata + offset lookups), the phase Kafka measures from start to partitions assigned. Each round
sends one Fetch per partition leader for all its partitions (the client's connections, negotiated
versions and metadata) and decodes the batches natively; only read_uncommitted is offered.
"""
from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass

from kbroker.client import Cluster, Consumer, KafkaError
from kbroker.client.connection import KafkaConnectionError, raise_for_error
from kbroker.client.security import is_security_key, security_from
from kbroker.config import parse_properties
from kbroker.record import decode_records, iter_batches

from .java_format import check_date_pattern, java_date, java_format, mib

HEADER_TAIL = ", rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec"
HEADER = "start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec" + HEADER_TAIL
DETAILED_HEADER = "time, threadId, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec" + HEADER_TAIL
SUMMARY_FMT = "%s, %s, %.4f, %.4f, %d, %.4f, %d, %d, %.4f, %.4f%n"
DETAILED_FMT = "%s, %d, %.4f, %.4f, %d, %.4f, %d, %d, %.4f, %.4f%n"
WARNING_FMT = ("WARNING: Exiting before consuming the expected number of messages: timeout (%d ms) exceeded. "
               "You can use the --timeout option to increase the timeout.%n")

FETCH = 1
SUPPORTED = {"bootstrap.servers", "client.id", "max.poll.records", "fetch.max.wait.ms", "fetch.min.bytes",
             "max.partition.fetch.bytes", "isolation.level", "request.timeout.ms", "retry.backoff.ms",
             "check.crcs", "auto.offset.reset"}
IGNORED = {"group.id", "enable.auto.commit", "auto.commit.interval.ms", "key.deserializer", "value.deserializer",
           "receive.buffer.bytes", "send.buffer.bytes", "session.timeout.ms", "heartbeat.interval.ms",
           "max.poll.interval.ms", "partition.assignment.strategy", "fetch.max.bytes",
           "metadata.max.age.ms", "reconnect.backoff.ms", "client.rack", "group.instance.id"}


class PerfError(Exception):
    pass


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class Options:
    bootstrap: str
    topic: str
    messages: int
    fetch_size: int = 1024 * 1024
    from_latest: bool = False
    detailed: bool = False
    reporting_interval_ms: int = 5000
    timeout_ms: int = 10000
    date_format: str = "yyyy-MM-dd HH:mm:ss:SSS"
    hide_header: bool = False
    print_metrics: bool = False
    group: str | None = None
    client_id: str = "perf-consumer-client"
    max_poll_records: int = 500
    fetch_max_wait_ms: int = 500
    fetch_min_bytes: int = 1
    isolation_level: str = "read_uncommitted"
    request_timeout_ms: int = 30000
    retry_backoff_ms: int = 100
    check_crcs: bool = False
    security: object = None         # kbroker.client.security.ClientSecurity (security.protocol, ssl.*, sasl.*)


def options_from(args) -> Options:
    """argparse namespace (kbroker.cli.perf_test) -> Options; --consumer.config first, then the
    flags (Kafka sets bootstrap.servers, max.partition.fetch.bytes and the reset policy over it)."""
    props: dict[str, str] = {}
    if args.consumer_config:
        try:
            with open(args.consumer_config, encoding="utf-8") as f:
                props = parse_properties(f.read())
        except OSError as e:
            raise PerfError(f"cannot read --consumer.config {args.consumer_config}: {e.strerror}") from None
    unknown = sorted(k for k in props if k not in SUPPORTED and k not in IGNORED and not is_security_key(k))
    if unknown:
        raise PerfError("unsupported consumer properties: " + ", ".join(unknown))
    bootstrap = args.bootstrap_server or args.broker_list
    if not bootstrap:
        raise PerfError("--bootstrap-server is required")
    if args.reporting_interval <= 0:
        raise PerfError("Reporting interval must be greater than 0.")
    if args.messages < 0:
        raise PerfError("--messages must not be negative")
    try:
        check_date_pattern(args.date_format)
    except ValueError as e:
        raise PerfError(str(e)) from None

    def num(key, default):
        try:
            return int(props.get(key, default))
        except ValueError:
            raise PerfError(f"{key} must be an integer, not {props[key]!r}") from None

    iso = props.get("isolation.level", "read_uncommitted").strip().lower()
    if iso != "read_uncommitted":
        raise PerfError(f"isolation.level={iso} is not supported by this tool (read_uncommitted only)")
    return Options(
        bootstrap=bootstrap, topic=args.topic, messages=args.messages, fetch_size=args.fetch_size,
        from_latest=args.from_latest, detailed=args.show_detailed_stats,
        reporting_interval_ms=args.reporting_interval, timeout_ms=args.timeout, date_format=args.date_format,
        hide_header=args.hide_header, print_metrics=args.print_metrics, group=args.group,
        client_id=props.get("client.id", "perf-consumer-client"), security=security_from(props, PerfError),
        max_poll_records=max(1, num("max.poll.records", 500)),
        fetch_max_wait_ms=num("fetch.max.wait.ms", 500), fetch_min_bytes=num("fetch.min.bytes", 1),
        isolation_level=iso, request_timeout_ms=num("request.timeout.ms", 30000),
        retry_backoff_ms=num("retry.backoff.ms", 100),
        check_crcs=props.get("check.crcs", "false").strip().lower() == "true")


@dataclass
class Result:
    start_ms: int
    end_ms: int
    messages: int
    bytes: int
    rebalance_ms: int
    fetches: int


def summary_line(r: Result, date_format: str = "yyyy-MM-dd HH:mm:ss:SSS") -> str:
    elapsed_s = (r.end_ms - r.start_ms) / 1000.0
    fetch_ms = (r.end_ms - r.start_ms) - r.rebalance_ms
    mb = mib(r.bytes)
    return java_format(SUMMARY_FMT, java_date(r.start_ms, date_format), java_date(r.end_ms, date_format),
                       mb, _div(mb, elapsed_s), r.messages, _div(r.messages, elapsed_s), r.rebalance_ms,
                       fetch_ms, _div(mb, fetch_ms / 1000.0), _div(r.messages, fetch_ms / 1000.0))


def detailed_line(now_ms: int, last_ms: int, nbytes: int, last_bytes: int, msgs: int, last_msgs: int,
                  rebalance_ms: int, date_format: str = "yyyy-MM-dd HH:mm:ss:SSS") -> str:
    elapsed = float(now_ms - last_ms)
    interval_mb = mib(nbytes - last_bytes)
    fetch_ms = now_ms - last_ms - rebalance_ms
    return java_format(DETAILED_FMT, java_date(now_ms, date_format), 0, mib(nbytes),
                       _div(1000.0 * interval_mb, elapsed), msgs, _div(msgs - last_msgs, elapsed) * 1000.0,
                       rebalance_ms, fetch_ms,
                       0.0 if fetch_ms <= 0 else 1000.0 * interval_mb / fetch_ms,
                       0.0 if fetch_ms <= 0 else 1000.0 * (msgs - last_msgs) / fetch_ms)


def _div(a: float, b: float) -> float:
    if b:
        return a / b
    if a != a or a == 0:
        return float("nan")
    return float("inf") if a > 0 else float("-inf")


async def run(o: Options, out=None, err=None) -> Result:
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    if not o.hide_header:
        out.write((DETAILED_HEADER if o.detailed else HEADER) + "\n")
        out.flush()
    cluster = Cluster(o.bootstrap, client_id=o.client_id, request_timeout_ms=o.request_timeout_ms,
                      retry_backoff_ms=o.retry_backoff_ms, security=o.security)
    consumer = Consumer(cluster=cluster, isolation_level=o.isolation_level,
                        request_timeout_ms=o.request_timeout_ms, retry_backoff_ms=o.retry_backoff_ms,
                        check_crcs=o.check_crcs)
    group_note = f" --group {o.group} is accepted but" if o.group else ""
    err.write(f"consumer-perf-test:{group_note} kbroker has no consumer groups yet: reading every partition "
              f"of {o.topic} by direct assignment from the {'latest' if o.from_latest else 'earliest'} offset; "
              f"no offsets are committed\n")
    err.flush()
    start_ms = wall_ms()
    try:
        await consumer.start()
        try:
            await cluster.wait_for_topic(o.topic, o.request_timeout_ms / 1000)
        except KafkaError as e:
            raise PerfError(f"topic {o.topic}: {e}") from None
        parts = cluster.partitions_for(o.topic)
        spec = "latest" if o.from_latest else "earliest"
        offsets = await asyncio.gather(*(consumer.list_offsets(o.topic, p, spec) for p in parts))
        positions = dict(zip(parts, offsets))
        rebalance_ms = wall_ms() - start_ms
        result = await _consume(o, _Fetcher(o, cluster, positions), start_ms, rebalance_ms, out)
    finally:
        await consumer.close()
    if not o.detailed:
        out.write(summary_line(result, o.date_format))
    if o.print_metrics:
        out.write(_metrics(o, result))
    out.flush()
    return result


class _Fetcher:
    """One Fetch request per partition leader covering all its assigned partitions (as Kafka's
    consumer does), records decoded natively: per record only (key, value) lengths reach Python."""

    def __init__(self, o: Options, cluster: Cluster, positions: dict[int, int]):
        self.o, self.cluster, self.positions = o, cluster, positions
        self.max_wait = min(o.fetch_max_wait_ms, 100)      # Kafka's tool polls with 100 ms
        self.requests = 0

    async def fetch_all(self) -> list[list[int]]:
        """One round: -> per partition with data, the list of record sizes (key + value bytes)."""
        by_leader: dict[int, list[int]] = {}
        for p in self.positions:
            by_leader.setdefault(self.cluster.leader_for(self.o.topic, p), []).append(p)
        if -1 in by_leader:
            await self.cluster.refresh_metadata([self.o.topic])
            return []
        results = await asyncio.gather(*(self._fetch(n, ps) for n, ps in by_leader.items()))
        return [sizes for r in results for sizes in r]

    async def _fetch(self, node: int, parts: list[int]) -> list[list[int]]:
        o = self.o
        try:
            conn = await self.cluster.connection(node)
            body = {
                "replica_id": -1, "max_wait_ms": self.max_wait, "min_bytes": o.fetch_min_bytes,
                "max_bytes": 52428800, "isolation_level": 0, "session_id": 0, "session_epoch": -1,
                "topics": [{"topic": o.topic, "partitions": [{
                    "partition": p, "fetch_offset": self.positions[p], "partition_max_bytes": o.fetch_size,
                    "current_leader_epoch": -1, "log_start_offset": -1} for p in parts]}],
                "forgotten_topics_data": [], "rack_id": "",
            }
            self.requests += 1
            _, resp = await conn.send(FETCH, body, timeout=(o.request_timeout_ms + self.max_wait) / 1000)
            raise_for_error(resp.get("error_code", 0), None, "fetch")
        except KafkaError as e:
            if not e.retriable:
                raise
            if isinstance(e, KafkaConnectionError):
                self.cluster.invalidate(node)
            await asyncio.sleep(o.retry_backoff_ms / 1000)
            await self.cluster.refresh_metadata([o.topic])
            return []
        out = []
        for t in resp["responses"]:
            for pr in t["partitions"]:
                p = pr["partition_index"]
                code = pr["error_code"]
                if code:
                    err = KafkaError(code, None, f"fetch {o.topic}-{p}@{self.positions.get(p)}")
                    if not err.retriable:
                        raise err
                    await self.cluster.refresh_metadata([o.topic])
                    continue
                sizes = self._sizes(p, pr["records"])
                if sizes:
                    out.append(sizes)
        return out

    def _sizes(self, partition: int, data) -> list[int]:
        """Sizes of the records at or after the partition's position; advances the position past
        every whole batch (a trailing partial batch is left for the next fetch)."""
        if data is None or len(data) == 0:
            return []
        pos = self.positions[partition]
        mv = memoryview(data)
        sizes: list[int] = []
        for info in iter_batches(mv, 0, self.o.check_crcs):
            nxt = info.base_offset + info.last_offset_delta + 1
            if info.is_control or nxt <= pos:
                pos = max(pos, nxt)
                continue
            recs = decode_records(mv[info.position:info.position + info.size])
            start = self.positions[partition]
            sizes.extend([(len(k) if k is not None else 0) + (len(v) if v is not None else 0)
                          for off, _, k, v, _ in recs if off >= start])
            pos = max(pos, nxt)
        self.positions[partition] = pos
        return sizes


async def _consume(o: Options, fetcher: _Fetcher, start_ms: int, rebalance_ms: int, out) -> Result:
    messages = nbytes = 0
    last_msgs = last_bytes = 0
    now = last_consumed = wall_ms()
    last_report = start_ms                  # as in Kafka, the first interval includes the assignment
    round_rebalance = rebalance_ms          # Kafka shows the join time in the first detailed line only
    pending: list[list[int]] = []           # fetched record sizes not yet handed out by a "poll"
    pending_ix = 0
    mpr = o.max_poll_records
    while messages < o.messages and now - last_consumed <= o.timeout_ms:
        # a "poll": up to max.poll.records records from what was fetched, fetching when empty
        if not pending:
            pending = [s for part in await fetcher.fetch_all() for s in part]
            pending_ix = 0
        chunk = pending[pending_ix:pending_ix + mpr]
        pending_ix += len(chunk)
        if pending_ix >= len(pending):
            pending, pending_ix = [], 0
        now = wall_ms()
        if chunk:
            last_consumed = now
            messages += len(chunk)
            nbytes += sum(chunk)
            if now - last_report >= o.reporting_interval_ms:
                if o.detailed:
                    out.write(detailed_line(now, last_report, nbytes, last_bytes, messages, last_msgs,
                                            round_rebalance, o.date_format))
                    out.flush()
                round_rebalance = 0
                last_report, last_msgs, last_bytes = now, messages, nbytes
    if messages < o.messages:
        out.write(java_format(WARNING_FMT, o.timeout_ms))
    return Result(start_ms, wall_ms(), messages, nbytes, rebalance_ms, fetcher.requests)


def _metrics(o: Options, r: Result) -> str:
    tags = "{client-id=%s}" % o.client_id
    elapsed_s = max(1e-9, (r.end_ms - r.start_ms) / 1000)
    m = {"records-consumed-total": float(r.messages), "records-consumed-rate": r.messages / elapsed_s,
         "bytes-consumed-total": float(r.bytes), "bytes-consumed-rate": r.bytes / elapsed_s,
         "fetch-total": float(r.fetches)}
    rows = {f"consumer-fetch-manager-metrics:{k}:{tags}": v for k, v in m.items()}
    w = max(map(len, rows))
    lines = [java_format(f"%n%-{w}s   %s%n", "Metric Name", "Value")]
    for name in sorted(rows):
        lines.append(java_format(f"%-{w}s : %.3f%n", name, rows[name]))
    return "".join(lines)
