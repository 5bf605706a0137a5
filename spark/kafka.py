"""The cluster side of the data source: topic/partition resolution and offset lookups (driver),
ranged reads into Arrow batches and batch production (executors), all through kbroker's own
asyncio client. Each public function is synchronous and owns its event loop, because Spark
calls the data source from plain threads.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import queue
import re
import threading
import time

from kbroker.protocol.errors import Errors

from .options import EARLIEST, LATEST, ClientConfig, OffsetRange, OptionError, ReadConfig

_log = logging.getLogger("kbroker.spark")
_WAITING: set = set()       # topics already reported as awaited (one warning per driver process)

UNKNOWN_TOPIC_OR_PARTITION = Errors.UNKNOWN_TOPIC_OR_PARTITION
OFFSET_OUT_OF_RANGE = Errors.OFFSET_OUT_OF_RANGE


class DataLossError(RuntimeError):
    """Offsets the query needs are gone (retention, a deleted topic) and failOnDataLoss=true."""


def _cluster(cfg: ClientConfig):
    from kbroker.client import Cluster
    from kbroker.client.security import security_from
    # Metadata requests never auto-create topics (allow_auto_topic_creation=False).
    return Cluster(cfg.bootstrap, client_id=cfg.client_id, request_timeout_ms=cfg.request_timeout_ms,
                   retry_backoff_ms=cfg.retry_backoff_ms, allow_auto_topic_creation=False,
                   security=security_from(cfg.security))


def _consumer(cfg: ClientConfig, cluster):
    from kbroker.client import Consumer
    return Consumer(cluster=cluster, client_id=cfg.client_id, isolation_level=cfg.isolation_level,
                    request_timeout_ms=cfg.request_timeout_ms, retry_backoff_ms=cfg.retry_backoff_ms,
                    check_crcs=cfg.check_crcs, retries=cfg.retries)


async def _topic_partitions(cluster, cfg: ReadConfig) -> dict[str, list[int]]:
    """{topic: sorted partitions} the query reads now. A named topic that does not exist fails
    with the option that named it, except a ``subscribe``d one in a streaming query, which is
    waited for (left out until it appears)."""
    if cfg.strategy == "subscribepattern":
        await cluster.fetch_metadata(None, allow_auto_topic_creation=False)
        pat = re.compile(cfg.target)
        return {t: sorted(tm.partitions) for t, tm in sorted(cluster.topics.items())
                if not tm.is_internal and tm.error_code == 0 and pat.fullmatch(t)}
    wanted = cfg.target if cfg.strategy == "subscribe" else list(cfg.target)
    resp = await cluster.fetch_metadata(sorted(set(wanted)), allow_auto_topic_creation=False)
    errors = {t["name"]: t["error_code"] for t in resp["topics"]}
    out = {}
    for t in wanted:
        tm = cluster.topics.get(t)
        if tm is None or errors.get(t, 0) == UNKNOWN_TOPIC_OR_PARTITION:
            if cfg.streaming and cfg.strategy == "subscribe":
                # Spark's Kafka source subscribes and waits: the topic's partitions join the query
                # when it appears (read from their earliest offset, like any new partition).
                if t not in _WAITING:
                    _WAITING.add(t)
                    _log.warning("option 'subscribe': topic %r does not exist yet; the query waits for it", t)
                continue
            opt = "subscribe" if cfg.strategy == "subscribe" else "assign"
            raise OptionError(f"option '{opt}': topic {t!r} does not exist")
        parts = sorted(tm.partitions)
        if cfg.strategy == "assign":
            missing = [p for p in cfg.target[t] if p not in tm.partitions]
            if missing:
                raise OptionError(f"option 'assign': topic {t!r} has no partition(s) {missing} "
                                  f"(it has {len(parts)})")
            parts = list(cfg.target[t])
        out[t] = parts
    return out


async def _list(consumer, tps, spec) -> dict:
    """{(t, p): offset} for spec 'earliest' | 'latest' | a timestamp (ms) | {(t,p): ts}."""
    async def one(tp):
        s = spec.get(tp) if isinstance(spec, dict) else spec
        if s is None:
            return tp, None
        return tp, await consumer.list_offsets(tp[0], tp[1], s)
    return dict(await asyncio.gather(*(one(tp) for tp in tps)))


async def _resolve(consumer, tps, spec, name, cfg: ReadConfig, latest: dict, earliest: dict) -> dict:
    """A start/end spec -> {(t, p): offset} for every tp."""
    if spec == "earliest":
        return dict(earliest)
    if spec == "latest":
        return dict(latest)
    if isinstance(spec, tuple):       # by timestamp
        ts = spec[1]
        if isinstance(ts, dict):
            per = {(t, p): v for t, parts in ts.items() for p, v in parts.items()}
            missing = [tp for tp in tps if tp not in per]
            if missing:
                raise OptionError(f"option '{name}OffsetsByTimestamp' lacks partitions {missing}")
        else:
            per = {tp: ts for tp in tps}
        found = await _list(consumer, tps, per)
        out = {}
        for tp, off in found.items():
            if off is None or off < 0:
                # no record at or after the timestamp
                if name == "starting" and cfg.timestamp_strategy == "error":
                    raise OptionError(f"option 'startingOffsetsByTimestamp'/'startingTimestamp': no offset of "
                                      f"{tp[0]}-{tp[1]} has a timestamp >= {per[tp]} (set "
                                      f"startingOffsetsByTimestampStrategy=latest to start at the end)")
                off = latest[tp]
            out[tp] = off
        return out
    out = {}
    given = {(t, p): off for t, parts in spec.items() for p, off in parts.items()}
    unknown = [tp for tp in given if tp not in latest]
    if unknown:
        raise OptionError(f"option '{name}Offsets' names partitions the query does not read: "
                          f"{', '.join(f'{t}-{p}' for t, p in unknown)}")
    for tp in tps:
        off = given.get(tp)
        if off is None:
            if cfg.strategy == "assign" or name == "ending":
                raise OptionError(f"option '{name}Offsets' must give an offset for {tp[0]}-{tp[1]}")
            off = EARLIEST if name == "starting" else LATEST
        out[tp] = earliest[tp] if off == EARLIEST else latest[tp] if off == LATEST else off
    return out


def plan_batch(cfg: ReadConfig) -> list[OffsetRange]:
    """The offset ranges of a batch query (before minPartitions splitting)."""
    async def go():
        cluster = _cluster(cfg.client)
        try:
            consumer = _consumer(cfg.client, cluster)
            tparts = await _topic_partitions(cluster, cfg)
            tps = [(t, p) for t, ps in tparts.items() for p in ps]
            earliest = await _list(consumer, tps, "earliest")
            latest = await _list(consumer, tps, "latest")
            start = await _resolve(consumer, tps, cfg.starting, "starting", cfg, latest, earliest)
            end = await _resolve(consumer, tps, cfg.ending, "ending", cfg, latest, earliest)
            ranges = []
            for tp in tps:
                s, e = start[tp], end[tp]
                if s < earliest[tp]:
                    if cfg.fail_on_data_loss:
                        raise DataLossError(
                            f"{tp[0]}-{tp[1]}: offsets {s}..{earliest[tp] - 1} are gone (log start offset "
                            f"{earliest[tp]}); set failOnDataLoss=false to skip them")
                    s = earliest[tp]
                if e < s:
                    raise OptionError(f"{tp[0]}-{tp[1]}: ending offset {e} is before starting offset {s} "
                                      "(options 'startingOffsets' / 'endingOffsets')")
                ranges.append(OffsetRange(tp[0], tp[1], s, e))
            return ranges
        finally:
            await cluster.close()
    return asyncio.run(go())


def latest_offsets(cfg: ReadConfig) -> tuple[dict, dict]:
    """(earliest, latest) {(t, p): offset} for every partition the query reads now."""
    async def go():
        cluster = _cluster(cfg.client)
        try:
            consumer = _consumer(cfg.client, cluster)
            tparts = await _topic_partitions(cluster, cfg)
            tps = [(t, p) for t, ps in tparts.items() for p in ps]
            return await _list(consumer, tps, "earliest"), await _list(consumer, tps, "latest")
        finally:
            await cluster.close()
    return asyncio.run(go())


def starting_offsets(cfg: ReadConfig) -> dict:
    """{(t, p): offset} a new streaming query starts from."""
    async def go():
        cluster = _cluster(cfg.client)
        try:
            consumer = _consumer(cfg.client, cluster)
            tparts = await _topic_partitions(cluster, cfg)
            tps = [(t, p) for t, ps in tparts.items() for p in ps]
            earliest = await _list(consumer, tps, "earliest")
            latest = await _list(consumer, tps, "latest")
            return await _resolve(consumer, tps, cfg.starting, "starting", cfg, latest, earliest)
        finally:
            await cluster.close()
    return asyncio.run(go())


# ---------------------------------------------------------------- executor side: read


class _Buffers:
    """Reusable receive buffers for Fetch responses, shared by the read tasks of one Python worker
    (Spark reuses workers): a fresh multi-MiB buffer costs a zero fill and a page fault per 4 KiB,
    as much as receiving into it. A buffer goes back with ``give`` once the decoder is done with
    it; a read keeps at most queue size + 2 alive, and at most ``keep`` idle ones (each at most
    ``largest`` bytes) are kept."""

    def __init__(self, keep: int = 4, largest: int = 64 << 20):
        self.free: collections.deque = collections.deque()
        self.keep = keep
        self.largest = largest      # a response past this (one huge batch) is not kept around

    def take(self, size: int) -> bytearray:
        while True:
            try:
                buf = self.free.pop()       # deque pop/append are atomic: safe across threads
            except IndexError:
                return bytearray(max(size, 1 << 20))
            if len(buf) >= size:
                return buf

    def give(self, buf) -> None:
        if buf is not None and len(self.free) < self.keep and len(buf) <= self.largest:
            self.free.append(buf)


_BUFFERS = _Buffers()


class _FetchChannel:
    """Fetch requests to partition leaders over plain blocking sockets, the response read with
    recv_into straight into a reusable buffer: one copy from the kernel, into pages already
    mapped. kbroker's client once copied each response byte three times (asyncio streams, most of a
    read task's time); it now receives into
    one buffer per frame too, but a fresh one (a page fault per 4 KiB), and from the event loop's
    thread. The client still finds the leader, negotiates the Fetch version and drives the retries
    across leader moves (Consumer.with_leader): a socket failure raises KafkaConnectionError
    like a broken client connection does, so the leader's connection is invalidated, metadata
    refreshed and the fetch retried."""

    def __init__(self, consumer, buffers: _Buffers, client_id: str):
        self.consumer = consumer
        self.buffers = buffers
        self.client_id = client_id
        self.socks: dict = {}            # (host, port) -> socket
        self.cid = 0

    def close(self) -> None:
        for s in self.socks.values():
            s.close()
        self.socks.clear()

    def _sock(self, conn, timeout):
        import socket
        key = (conn.host, conn.port)
        s = self.socks.get(key)
        if s is None:
            s = socket.create_connection(key, timeout)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.socks[key] = s
        s.settimeout(timeout)
        return s

    def _exchange(self, conn, frame: bytes, cid: int, timeout: float):
        """Send one request frame, return (buffer, response memoryview without the size)."""
        from kbroker.client import KafkaConnectionError
        key = (conn.host, conn.port)
        buf = None
        try:
            s = self._sock(conn, timeout)
            s.sendall(frame)
            head = bytearray(4)
            self._recv_exactly(s, memoryview(head))
            size = int.from_bytes(head, "big", signed=True)
            if size < 8:
                raise OSError(f"bad response size {size}")
            buf = self.buffers.take(size)
            view = memoryview(buf)[:size]
            self._recv_exactly(s, view)
        except OSError as e:       # includes timeouts: the connection is out of step, drop it
            self.buffers.give(buf)
            s = self.socks.pop(key, None)
            if s is not None:
                s.close()
            raise KafkaConnectionError(f"fetch connection to {key[0]}:{key[1]}: {e or 'timed out'}") from None
        got = int.from_bytes(view[:4], "big", signed=True)
        if got != cid:
            self.buffers.give(buf)
            self.socks.pop(key).close()
            raise KafkaConnectionError(f"fetch connection to {key[0]}:{key[1]}: correlation id {got}, "
                                       f"expected {cid}")
        return buf, view

    @staticmethod
    def _recv_exactly(s, view) -> None:
        got, n = 0, len(view)
        while got < n:
            k = s.recv_into(view[got:])
            if k == 0:
                raise OSError("connection closed by the broker")
            got += k

    async def fetch(self, topic: str, partition: int, offset: int, max_bytes: int, max_wait_ms: int):
        """-> (buffer, records memoryview, high watermark, aborted transactions to skip or None); the
        buffer goes back to the pool when the caller is done with the records. Partition errors raise
        KafkaError."""
        from kbroker.client import KafkaError
        from kbroker.client.connection import raise_for_error
        from kbroker.protocol import api
        from kbroker.protocol.errors import Errors
        consumer = self.consumer

        async def call(conn):
            version = conn.version_for(1)   # Fetch, as the client negotiated it with this broker
            self.cid = (self.cid + 1) & 0x7FFFFFFF
            body = {
                "replica_id": -1, "max_wait_ms": max_wait_ms, "min_bytes": 1, "max_bytes": max_bytes,
                "isolation_level": consumer.isolation, "session_id": 0, "session_epoch": -1,
                "topics": [{"topic": topic, "partitions": [{
                    "partition": partition, "fetch_offset": offset, "partition_max_bytes": max_bytes,
                    "current_leader_epoch": -1, "log_start_offset": -1}]}],
                "forgotten_topics_data": [], "rack_id": "",
            }
            frame = api.encode_request(1, version, self.cid, self.client_id, body)
            timeout = (consumer.request_timeout_ms + max_wait_ms) / 1000
            buf, view = self._exchange(conn, frame, self.cid, timeout)
            try:
                _, resp = api.decode_response(1, version, view)
                raise_for_error(resp.get("error_code", 0), None, "fetch")
                for t in resp["responses"]:
                    for p in t["partitions"]:
                        if t["topic"] == topic and p["partition_index"] == partition:
                            raise_for_error(p["error_code"], None, f"fetch {topic}-{partition}@{offset}")
                            data = p["records"]
                            return (buf, (data if data is not None else memoryview(b"")), p["high_watermark"],
                                    consumer.aborted_of(p))
                raise KafkaError(Errors.UNKNOWN_SERVER_ERROR, f"fetch response lacks {topic}-{partition}")
            except BaseException:
                self.buffers.give(buf)
                raise

        return await consumer.with_leader(topic, partition, call)


class _ClientChannel:
    """The same fetches through kbroker's client (a fresh frame buffer per response): kept only
    so perf/spark_bench.py can show what _FetchChannel buys in the same run."""

    def __init__(self, consumer, buffers: _Buffers, client_id: str):
        self.consumer = consumer

    def close(self) -> None:
        pass

    async def fetch(self, topic: str, partition: int, offset: int, max_bytes: int, max_wait_ms: int):
        r = await self.consumer.fetch(topic, partition, offset, max_bytes=max_bytes, max_wait_ms=max_wait_ms,
                                      decode=False)
        return None, memoryview(r.raw if r.raw is not None else b""), r.high_watermark, r.aborted_transactions


def _fetch_ranges(client: ClientConfig, topic: str, partition: int, start: int, end: int,
                  fail_on_data_loss: bool, out, stop, buffers: _Buffers, via_client: bool = False):
    """Fetch thread of read_range: puts (fetch_position, [BatchInfo], records, buffer, aborted
    transactions) for every fetch of [start, end) on the bounded queue ``out``, then None; an
    exception is put instead of None. Runs ahead of the decoder by the queue's size, so the network overlaps the decoding;
    the decoder gives each buffer back to ``buffers`` when done with it."""
    from kbroker.client import KafkaError
    from kbroker.record import iter_batches

    loop = asyncio.new_event_loop()
    cluster = _cluster(client)
    consumer = _consumer(client, cluster)
    channel = (_ClientChannel if via_client else _FetchChannel)(consumer, buffers, client.client_id)

    def put(item):
        while not stop.is_set():
            try:
                out.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    try:
        pos = start
        while pos < end and not stop.is_set():
            try:
                buf, data, high_watermark, aborted = loop.run_until_complete(channel.fetch(
                    topic, partition, pos, client.max_partition_fetch_bytes, client.fetch_max_wait_ms))
            except KafkaError as e:
                if e.error != OFFSET_OUT_OF_RANGE:
                    raise
                earliest = loop.run_until_complete(consumer.list_offsets(topic, partition, "earliest"))
                if pos < earliest:
                    if fail_on_data_loss:
                        raise DataLossError(f"{topic}-{partition}: offsets {pos}..{earliest - 1} are gone "
                                            f"(log start offset {earliest}); set failOnDataLoss=false "
                                            "to skip them") from e
                    pos = earliest
                    continue
                latest = loop.run_until_complete(consumer.list_offsets(topic, partition, "latest"))
                if fail_on_data_loss:
                    raise DataLossError(f"{topic}-{partition}: offset {pos} is past the log end {latest} "
                                        f"(the range ended at {end}); set failOnDataLoss=false to "
                                        "stop there") from e
                break
            infos = iter_batches(data, 0, client.check_crcs) if len(data) else []
            nxt = pos
            for info in infos:
                if info.base_offset >= end:
                    nxt = end
                    break
                nxt = max(nxt, info.next_offset)
            if nxt <= pos:
                buffers.give(buf)
                # Nothing at pos: past the high watermark the range promised data that is gone
                # (truncation); below it, a gap (compaction, aborted data) ends at the HW.
                if high_watermark <= pos:
                    if fail_on_data_loss:
                        raise DataLossError(f"{topic}-{partition}: the range ends at {end} but the log "
                                            f"ends at {high_watermark}; set failOnDataLoss=false to "
                                            "stop there")
                    break
                nxt = min(high_watermark, end)
            elif not put((pos, infos, data, buf, aborted)):
                return
            pos = nxt
        put(None)
    except BaseException as e:   # handed to the decoding side, which raises it in the task
        put(e)
    finally:
        channel.close()
        loop.run_until_complete(cluster.close())
        loop.close()


def read_range(client: ClientConfig, topic: str, partition: int, start: int, end: int,
               include_headers: bool, fail_on_data_loss: bool, max_rows: int, max_bytes: int,
               via_client: bool = False):
    """Yield pyarrow.RecordBatches (Spark's Kafka schema) of offsets [start, end) of one
    partition, fetched from its leader (the client retries across leader moves) and decoded
    natively. With kafka.isolation.level=read_committed the plan's ends are last stable offsets and
    aborted transactions' records are skipped, as Kafka's consumers do (AbortedFilter); control
    records never show. Offsets missing because of compaction are skipped; offsets below the log start
    (retention) fail when ``fail_on_data_loss``, else are skipped. A fetch thread keeps up to
    two fetches ahead (bounded memory: 4 x kafka.max.partition.fetch.bytes of buffers).
    ``via_client`` fetches through kbroker's client instead (the slower path, for perf only)."""
    from kbroker._native.arrow import RecordDecoder
    from kbroker._native.batch import LAYOUT
    from kbroker.client import AbortedFilter
    from kbroker.record import DEFAULT_MAX_DECOMPRESSED
    from kbroker.record.compression import decompress

    if start >= end:
        return
    header_size = LAYOUT["HEADER_SIZE"]
    fetched: queue.Queue = queue.Queue(maxsize=2)
    stop = threading.Event()
    buffers = _BUFFERS
    fetcher = threading.Thread(target=_fetch_ranges, name=f"kbroker-fetch-{topic}-{partition}", daemon=True,
                               args=(client, topic, partition, start, end, fail_on_data_loss, fetched, stop,
                                     buffers, via_client))
    fetcher.start()
    decoder = RecordDecoder(include_headers, max_rows, max_bytes)
    try:
        while True:
            item = fetched.get()
            if item is None:
                break
            if isinstance(item, BaseException):
                raise item
            pos, infos, mv, buf, aborted = item
            skipped = AbortedFilter(aborted)
            for info in infos:
                if info.base_offset >= end:
                    break
                if skipped.skip(info) or info.next_offset <= pos:
                    continue
                section = mv[info.position + header_size:info.position + info.size]
                if info.codec:
                    section = decompress(info.codec, section, DEFAULT_MAX_DECOMPRESSED)
                ts_type = info.timestamp_type
                lat = info.max_timestamp if ts_type else -1
                spos, sidx = 0, 0
                while True:
                    spos, sidx, full = decoder.append(section, info.record_count, info.base_offset,
                                                      info.first_timestamp, lat, ts_type, pos, end, spos, sidx)
                    if not full:
                        break
                    yield decoder.flush(topic, partition)
            # every record of this fetch is copied into the decoder's buffers: reuse the buffer
            section = mv = item = None
            buffers.give(buf)
        if decoder.rows:
            yield decoder.flush(topic, partition)
    finally:
        stop.set()
        fetcher.join()


# ---------------------------------------------------------------- executor side: write


class ArrowProducer:
    """Builds RecordBatches from Arrow columns natively and produces them with kbroker's client
    from a sender thread (its own event loop), so the network overlaps the task's next Arrow
    batch. One batch in flight per partition when idempotent (sequences stay ordered), up to
    max.in.flight otherwise; at most ``max_pending_bytes`` are unacknowledged before the task
    waits. ``linger.ms`` > 0 gathers Arrow batches for up to that long (or 1 MiB) before routing,
    so small Arrow batches still make large record batches. ``close`` waits for every ack."""

    def __init__(self, client: ClientConfig, topic_option: str | None):
        from kbroker.client import Producer
        self.cfg = client.producer
        self.topic_option = topic_option
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="kbroker-sink", daemon=True)
        self.thread.start()
        self.cluster = _cluster(client)
        self.producer = Producer(cluster=self.cluster, client_id=client.client_id, acks=self.cfg["acks"],
                                 enable_idempotence=self.cfg["idempotence"],
                                 request_timeout_ms=client.request_timeout_ms,
                                 retry_backoff_ms=client.retry_backoff_ms,
                                 delivery_timeout_ms=self.cfg["delivery_timeout_ms"])
        self.sequences: dict[tuple[str, int], int] = {}
        self.sticky: dict[str, int] = {}
        self.records = self.batches = self.bytes = 0
        self.max_pending_bytes = max(16 * 1024 * 1024, 4 * self.cfg["batch_size"])
        self.inflight: collections.deque = collections.deque()    # (future, size)
        self.inflight_bytes = 0
        self.gates: dict[tuple[str, int], asyncio.Semaphore] = {}
        self.held: list = []            # Arrow batches gathered for linger.ms
        self.held_bytes = 0
        self.held_since = 0.0
        if self.cfg["idempotence"]:
            self._call(self.producer._init_producer_id())

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def _partitions(self, topic: str) -> int:
        parts = self.cluster.partitions_for(topic)
        if parts is None:
            resp = self._call(self.cluster.fetch_metadata([topic], allow_auto_topic_creation=False))
            errs = {t["name"]: t["error_code"] for t in resp["topics"]}
            parts = self.cluster.partitions_for(topic)
            if parts is None or errs.get(topic):
                raise OptionError(f"topic {topic!r} (from the 'topic' option or column) does not exist")
        return len(parts)

    def write(self, rb) -> None:
        """Take one pyarrow.RecordBatch (columns value [key, topic, partition, headers])."""
        if rb.num_rows == 0:
            return
        linger = self.cfg["linger_ms"] / 1000
        if linger <= 0:
            self._route(rb)
            return
        if not self.held:
            self.held_since = time.monotonic()
        self.held.append(rb)
        self.held_bytes += rb.nbytes
        if self.held_bytes >= (1 << 20) or time.monotonic() - self.held_since >= linger:
            self._release()

    def _release(self) -> None:
        import pyarrow as pa
        if self.held:
            held, self.held, self.held_bytes = self.held, [], 0
            self._route(held[0] if len(held) == 1 else pa.concat_batches(held))

    def _route(self, rb) -> None:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        from kbroker._native.arrow import build_batches, partition_for_keys

        n = rb.num_rows
        names = rb.schema.names
        value = rb.column(names.index("value"))
        key = rb.column(names.index("key")) if "key" in names else None
        headers = rb.column(names.index("headers")) if "headers" in names else None
        if self.topic_option:
            groups = [(self.topic_option, None)]
        else:
            tcol = rb.column(names.index("topic"))
            if tcol.null_count:
                raise ValueError("a row has a null 'topic' and no 'topic' option is set")
            enc = tcol.dictionary_encode()
            codes = enc.indices.to_numpy(zero_copy_only=False)
            groups = [(str(enc.dictionary[i]), np.flatnonzero(codes == i).astype(np.int64))
                      for i in range(len(enc.dictionary))]
        explicit = None
        if "partition" in names:
            explicit = pc.fill_null(rb.column(names.index("partition")).cast(pa.int32()), -1) \
                .to_numpy(zero_copy_only=False)
        for topic, rows in groups:
            nparts = self._partitions(topic)
            if key is not None:
                part = partition_for_keys(key, nparts)
            else:
                part = np.full(n, -1, dtype=np.int32)
            if explicit is not None:
                bad = explicit[(explicit >= nparts) | (explicit < -1)]
                if len(bad):
                    raise ValueError(f"'partition' {int(bad[0])} is out of range for topic {topic!r} "
                                     f"({nparts} partitions)")
                part = np.where(explicit >= 0, explicit, part).astype(np.int32)
            if rows is None:
                rows = np.arange(n, dtype=np.int64)
            else:
                part = part[rows]
            nulls = part < 0
            if nulls.any():
                # Null keys: sticky per Arrow batch (Kafka's KIP-480 idea: fill one partition's
                # batch, then move on), so they spread over the partitions across batches.
                s = self.sticky.get(topic)
                s = (np.random.randint(nparts) if s is None else s + 1) % nparts
                self.sticky[topic] = s
                part = np.where(nulls, s, part).astype(np.int32)
            order = np.argsort(part, kind="stable")
            bounds = np.flatnonzero(np.diff(part[order])) + 1
            for chunk in np.split(order, bounds):
                p = int(part[chunk[0]])
                for data, count in build_batches(key, value, headers, rows[chunk], self.cfg["batch_size"],
                                                 self.cfg["codec"]):
                    self._send(topic, p, data, count)

    def _send(self, topic, partition, data, count):
        from kbroker._native.arrow import set_producer_fields
        tp = (topic, partition)
        if self.cfg["idempotence"]:
            seq = self.sequences.get(tp, 0)
            data = set_producer_fields(data, self.producer.producer_id, self.producer.producer_epoch, seq)
            self.sequences[tp] = (seq + count) & 0x7FFFFFFF
        fut = asyncio.run_coroutine_threadsafe(self._produce(tp, data, count), self.loop)
        self.inflight.append((fut, len(data)))
        self.inflight_bytes += len(data)
        self.bytes += len(data)
        while self.inflight_bytes > self.max_pending_bytes:
            self._settle_oldest()

    def _settle_oldest(self):
        fut, size = self.inflight.popleft()
        self.inflight_bytes -= size
        fut.result()        # raises the delivery error in the task

    async def _produce(self, tp, data, count):
        gate = self.gates.get(tp)
        if gate is None:
            # FIFO gate: with idempotence one request per partition at a time, in sequence order
            gate = self.gates[tp] = asyncio.Semaphore(1 if self.cfg["idempotence"] else self.cfg["max_in_flight"])
        async with gate:
            await self.producer.produce_batch(tp[0], tp[1], data)
        self.records += count
        self.batches += 1

    def close(self) -> dict:
        try:
            self._release()
            while self.inflight:
                self._settle_oldest()
            return {"records": self.records, "batches": self.batches, "bytes": self.bytes}
        finally:
            self.abort()

    def abort(self) -> None:
        for fut, _ in self.inflight:
            fut.cancel()
        self.inflight.clear()
        try:
            self._call(self.cluster.close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join()
            self.loop.close()


def wait_for_partitions(client: ClientConfig, topic: str, timeout: float = 30.0) -> int:
    async def go():
        cluster = _cluster(client)
        try:
            deadline = time.monotonic() + timeout
            while True:
                await cluster.fetch_metadata([topic], allow_auto_topic_creation=False)
                parts = cluster.partitions_for(topic)
                if parts or time.monotonic() > deadline:
                    return len(parts or [])
                await asyncio.sleep(0.1)
        finally:
            await cluster.close()
    return asyncio.run(go())
