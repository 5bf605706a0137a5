"""Asyncio producer: per-partition record accumulator, a sender task, retries, idempotence.

Records are encoded natively into one ``BatchBuilder`` per partition as they are sent; a batch
leaves when it is full (``batch_size``), ``linger_ms`` after its first record, or on ``flush()``.
The sender groups ready batches by partition leader into one Produce request per broker and keeps
at most ``max_in_flight_requests_per_connection`` requests outstanding to each.

Idempotence (``enable_idempotence``): one InitProducerId gives (producerId, epoch); each partition
numbers its records from 0 and a batch's baseSequence is fixed when it is first built, so a retry
resends the very same bytes and the broker can spot a duplicate. To keep sequences in order across
retries we keep a single batch in flight per partition when idempotent (several partitions still
share a request, and requests to one broker still pipeline).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass

from kbroker._native.batch import LAYOUT, BatchBuilder
from kbroker.protocol.errors import Errors

from .cluster import Cluster
from .connection import KafkaConnectionError, KafkaError, raise_for_error
from .partitioner import StickyPartitioner

log = logging.getLogger(__name__)

PRODUCE, INIT_PRODUCER_ID = 0, 22
COMPRESSION = {"none": 0, None: 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
RECORD_OVERHEAD_MAX = 21
BATCH_HEADER = LAYOUT["HEADER_SIZE"]         # RecordBatch v2 header (ext/layout.pxd)
_SEQ_WRAP = 1 << 31


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    topic: str
    partition: int
    offset: int          # -1 when unknown (acks=0, or a duplicate the broker had already written)
    timestamp: int       # CreateTime we sent, or the broker's LogAppendTime
    log_start_offset: int = -1


class _Batch:
    __slots__ = ("topic", "partition", "builder", "futures", "created", "full", "attempts",
                 "data", "base_sequence", "count", "deadline", "size")

    def __init__(self, topic, partition, builder, now, deadline):
        self.topic, self.partition, self.builder = topic, partition, builder
        self.futures = []          # (future, timestamp, callback)
        self.created = now
        self.full = False
        self.attempts = 0
        self.data = None           # built bytes, fixed on first send so retries resend them as is
        self.base_sequence = -1
        self.count = 0
        self.deadline = deadline
        self.size = 0

    def build(self, producer_id, producer_epoch, base_sequence):
        if self.data is None:
            self.base_sequence = base_sequence
            self.data = self.builder.build(producer_id=producer_id, producer_epoch=producer_epoch,
                                           base_sequence=base_sequence)
            self.builder = None
        return self.data


def _resolve(fut, cb, err, md):
    if not fut.done():
        if err is None:
            fut.set_result(md)
        else:
            fut.set_exception(err)
    if cb is not None:
        try:
            cb(err, md)
        except Exception:  # a user callback must not kill the sender
            log.exception("delivery callback raised")


class Producer:
    def __init__(self, bootstrap_servers=None, *, cluster: Cluster | None = None, client_id: str = "kbroker-producer",
                 acks=-1, linger_ms: float = 5, batch_size: int = 16384, compression_type: str | None = "none",
                 enable_idempotence: bool = False, retries: int = 2147483647, retry_backoff_ms: int = 100,
                 max_in_flight_requests_per_connection: int = 5, request_timeout_ms: int = 30000,
                 delivery_timeout_ms: int = 120000, max_request_size: int = 1048576,
                 buffer_memory: int = 32 * 1024 * 1024, partitioner=None, allow_auto_create_topics: bool = True,
                 security=None):
        acks = {"all": -1, "-1": -1, "0": 0, "1": 1}.get(str(acks), acks)
        if acks not in (-1, 0, 1):
            raise ValueError(f"acks must be -1/all, 0 or 1, not {acks!r}")
        if compression_type not in COMPRESSION:
            raise ValueError(f"unknown compression.type {compression_type!r}")
        if enable_idempotence:
            if acks != -1:
                raise ValueError("enable.idempotence requires acks=all")
            if max_in_flight_requests_per_connection > 5:
                raise ValueError("enable.idempotence requires max.in.flight.requests.per.connection <= 5")
        self._own_cluster = cluster is None
        self.cluster = cluster or Cluster(bootstrap_servers, client_id=client_id,
                                          request_timeout_ms=request_timeout_ms,
                                          retry_backoff_ms=retry_backoff_ms,
                                          allow_auto_topic_creation=allow_auto_create_topics, security=security)
        self.acks = acks
        self.linger = linger_ms / 1000
        self.batch_size = batch_size
        self.codec = COMPRESSION[compression_type]
        self.idempotent = enable_idempotence
        self.retries = retries
        self.retry_backoff = retry_backoff_ms / 1000
        self.max_in_flight = max_in_flight_requests_per_connection
        self.request_timeout_ms = request_timeout_ms
        self.delivery_timeout = delivery_timeout_ms / 1000
        self.max_request_size = max_request_size
        self.buffer_memory = buffer_memory
        self.partitioner = partitioner or StickyPartitioner()
        self.producer_id, self.producer_epoch = -1, -1
        # Named in every Produce request once a caller runs transactions with this producer's id.
        self.transactional_id: str | None = None
        self._batches: dict[tuple[str, int], deque[_Batch]] = {}
        self._next_seq: dict[tuple[str, int], int] = {}
        self._muted: set[tuple[str, int]] = set()      # idempotent: partitions with a batch in flight
        self._in_flight: dict[int, int] = {}           # node -> outstanding Produce requests
        self._tasks: set[asyncio.Task] = set()
        self._queued_bytes = 0
        self._wake: asyncio.Event | None = None
        self._space: asyncio.Event | None = None
        self._flushing = 0
        self._sender: asyncio.Task | None = None
        self._closed = False
        self._fatal: Exception | None = None

    # ---- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> "Producer":
        self._wake = asyncio.Event()
        self._space = asyncio.Event()
        await self.cluster.any_connection()
        if self.idempotent:
            await self._init_producer_id()
        self._sender = asyncio.get_running_loop().create_task(self._run())
        return self

    async def __aenter__(self):
        return await self.start()

    async def __aexit__(self, *exc):
        await self.close()

    async def close(self, timeout: float | None = None) -> None:
        """Send what is queued (bounded by ``timeout``), then stop."""
        if self._closed:
            return
        try:
            await asyncio.wait_for(self.flush(), timeout)
        except asyncio.TimeoutError:
            pass
        self._closed = True
        if self._sender is not None:
            self._sender.cancel()
            try:
                await self._sender
            except asyncio.CancelledError:
                pass
        for t in list(self._tasks):
            t.cancel()
        err = KafkaError(Errors.NETWORK_EXCEPTION, "producer closed")
        for dq in self._batches.values():
            for b in dq:
                self._complete(b, err)
        self._batches.clear()
        if self._own_cluster:
            await self.cluster.close()

    async def _init_producer_id(self) -> None:
        backoff = self.retry_backoff
        deadline = time.monotonic() + self.delivery_timeout
        while True:
            try:
                _, resp = await self.cluster.send_any(INIT_PRODUCER_ID, {
                    "transactional_id": None, "transaction_timeout_ms": 60000})
                raise_for_error(resp["error_code"], None, "InitProducerId")
                self.producer_id, self.producer_epoch = resp["producer_id"], resp["producer_epoch"]
                return
            except KafkaError as e:
                if not e.retriable or time.monotonic() + backoff > deadline:
                    raise
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)

    # ---- sending -------------------------------------------------------------------------------

    async def send(self, topic: str, value=None, key=None, partition: int | None = None,
                   timestamp_ms: int | None = None, headers=None, on_delivery=None) -> asyncio.Future:
        """Queue one record; returns a future of RecordMetadata (also passed to
        ``on_delivery(err, metadata)``). Awaits only for metadata of a new topic or buffer space."""
        if self._closed or self._sender is None:
            raise RuntimeError("producer not started or closed")
        if self._fatal is not None:
            raise self._fatal
        est = (BATCH_HEADER + RECORD_OVERHEAD_MAX + (len(key) if key is not None else 0)
               + (len(value) if value is not None else 0)
               + sum(len(k) + (len(v) if v is not None else 0) + 10 for k, v in (headers or ())))
        if est > self.max_request_size:
            raise KafkaError(Errors.MESSAGE_TOO_LARGE,
                             f"record of ~{est} bytes exceeds max.request.size {self.max_request_size}")
        while self._queued_bytes > self.buffer_memory:
            self._space.clear()
            await self._space.wait()
        parts = self.cluster.partitions_for(topic)
        if not parts:
            await self.cluster.wait_for_topic(topic, self.delivery_timeout)
            parts = self.cluster.partitions_for(topic)
        n = len(parts)
        if partition is None:
            partition = self.partitioner.partition(topic, key, n, self.cluster.available_partitions(topic))
        elif not 0 <= partition < n:
            raise KafkaError(Errors.UNKNOWN_TOPIC_OR_PARTITION, f"{topic} has {n} partitions, not {partition}")
        ts = int(time.time() * 1000) if timestamp_ms is None else int(timestamp_ms)
        fut = asyncio.get_running_loop().create_future()
        created_new = self._append((topic, partition), ts, key, value, headers, fut, on_delivery, est)
        if created_new and key is None:
            # KIP-480: the sticky partition's batch filled up; spread the next records elsewhere.
            self.partitioner.on_new_batch(topic, partition, n, self.cluster.available_partitions(topic))
        return fut

    async def send_and_wait(self, topic: str, value=None, key=None, **kw) -> RecordMetadata:
        return await (await self.send(topic, value, key, **kw))

    def _append(self, tp, ts, key, value, headers, fut, cb, est) -> bool:
        dq = self._batches.get(tp)
        if dq is None:
            dq = self._batches[tp] = deque()
        created_new = False
        b = dq[-1] if dq else None
        if b is None or b.full or b.data is not None or not b.builder.append(ts, key, value, headers):
            if b is not None:
                b.full = True
                created_new = True
            now = time.monotonic()
            b = _Batch(tp[0], tp[1], BatchBuilder(self.codec, self.batch_size), now, now + self.delivery_timeout)
            b.builder.append(ts, key, value, headers)   # the first record always fits
            dq.append(b)
            self._wake.set()
        b.futures.append((fut, ts, cb))
        b.count += 1
        b.size += est
        self._queued_bytes += est
        if b.builder.size_in_bytes() >= self.batch_size:
            b.full = True
            self._wake.set()
        return created_new

    async def flush(self) -> None:
        """Send everything queued now and wait for all of it to complete."""
        futs = [f for dq in self._batches.values() for b in dq for f, _, _ in b.futures]
        if not futs:
            return
        self._flushing += 1
        self._wake.set()
        try:
            await asyncio.gather(*futs, return_exceptions=True)
        finally:
            self._flushing -= 1

    async def produce_batch(self, topic: str, partition: int, batch_bytes) -> RecordMetadata:
        """Send one pre-built RecordBatch as is (bypassing the accumulator); retried on retriable
        errors until ``delivery_timeout_ms``. -> metadata with the batch's base offset."""
        deadline = time.monotonic() + self.delivery_timeout
        backoff = self.retry_backoff
        attempts = 0
        while True:
            attempts += 1
            node = -1
            try:
                conn = await self.cluster.leader_connection(topic, partition)
                node = conn.node_id
                _, resp = await conn.send(PRODUCE, self._request([(topic, partition, batch_bytes)]),
                                          expect_response=self.acks != 0)
                if resp is None:
                    return RecordMetadata(topic, partition, -1, -1)
                pr = resp["responses"][0]["partition_responses"][0]
                code = pr["error_code"]
                if code == Errors.DUPLICATE_SEQUENCE_NUMBER:
                    return RecordMetadata(topic, partition, -1, pr.get("log_append_time_ms", -1))
                raise_for_error(code, pr.get("error_message"), f"produce {topic}-{partition}")
                return RecordMetadata(topic, partition, pr["base_offset"], pr.get("log_append_time_ms", -1),
                                      pr.get("log_start_offset", -1))
            except KafkaError as e:
                if not e.retriable or attempts > self.retries or time.monotonic() + backoff > deadline:
                    raise
                if isinstance(e, KafkaConnectionError):
                    self.cluster.invalidate(node)
                if e.invalidates_metadata:
                    await self._refresh([topic])
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)

    def _request(self, items) -> dict:
        topics: dict[str, list] = {}
        for topic, partition, data in items:
            topics.setdefault(topic, []).append({"index": partition, "records": data})
        return {"transactional_id": self.transactional_id, "acks": self.acks, "timeout_ms": self.request_timeout_ms,
                "topic_data": [{"name": t, "partition_data": ps} for t, ps in topics.items()]}

    async def _refresh(self, topics):
        try:
            await self.cluster.refresh_metadata(topics)
        except KafkaError as e:
            log.debug("metadata refresh failed: %s", e)

    # ---- sender --------------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            wait = self._drain_ready()
            try:
                await asyncio.wait_for(self._wake.wait(), wait)
            except asyncio.TimeoutError:
                pass

    def _drain_ready(self) -> float | None:
        """Start a Produce request per broker for every ready batch; -> seconds until the next
        batch becomes ready by linger (None = nothing queued)."""
        now = time.monotonic()
        next_wait = None
        by_node: dict[int, list[_Batch]] = {}
        need_metadata = set()
        for tp, dq in self._batches.items():
            if not dq or tp in self._muted:
                continue
            b = dq[0]
            if b.deadline < now:
                dq.popleft()
                self._complete(b, KafkaError(Errors.REQUEST_TIMED_OUT,
                                             f"{tp[0]}-{tp[1]}: delivery.timeout.ms expired"))
                continue
            ready = (b.full or len(dq) > 1 or b.data is not None or self._flushing or self._closed
                     or now - b.created >= self.linger)
            if not ready:
                left = self.linger - (now - b.created)
                next_wait = left if next_wait is None else min(next_wait, left)
                continue
            leader = self.cluster.leader_for(*tp)
            if leader < 0:
                need_metadata.add(tp[0])
                next_wait = self.retry_backoff if next_wait is None else min(next_wait, self.retry_backoff)
                continue
            by_node.setdefault(leader, []).append(b)
        if need_metadata:
            self._spawn(self._refresh(sorted(need_metadata)))
        for node, batches in by_node.items():
            if self._in_flight.get(node, 0) >= self.max_in_flight:
                continue   # the completion of an outstanding request wakes the sender
            items, size = [], 0
            for b in batches:
                est = len(b.data) if b.data is not None else b.builder.size_in_bytes()
                if items and size + est > self.max_request_size:
                    next_wait = 0
                    break
                tp = (b.topic, b.partition)
                self._batches[tp].popleft()
                if b.data is None:
                    seq = -1
                    if self.idempotent:
                        seq = self._next_seq.get(tp, 0)
                        self._next_seq[tp] = (seq + b.count) % _SEQ_WRAP
                    b.build(self.producer_id, self.producer_epoch, seq)
                    if b.futures and not b.full:
                        # a batch leaving by linger also moves the sticky partition on
                        n = len(self.cluster.partitions_for(b.topic) or ())
                        if n:
                            self.partitioner.on_new_batch(b.topic, b.partition, n)
                if self.idempotent:
                    self._muted.add(tp)
                b.attempts += 1
                items.append(b)
                size += len(b.data)
            if items:
                self._in_flight[node] = self._in_flight.get(node, 0) + 1
                self._spawn(self._send_request(node, items))
        return next_wait

    def _spawn(self, coro):
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _send_request(self, node: int, batches: list[_Batch]) -> None:
        try:
            try:
                conn = await self.cluster.connection(node)
                body = self._request([(b.topic, b.partition, b.data) for b in batches])
                _, resp = await conn.send(PRODUCE, body, expect_response=self.acks != 0)
            except KafkaError as e:
                if isinstance(e, KafkaConnectionError):
                    self.cluster.invalidate(node)
                for b in batches:
                    await self._retry_or_fail(b, e)
                return
            if resp is None:   # acks=0: no answer, no offsets
                for b in batches:
                    self._complete(b, None, -1, -1)
                return
            results = {(t["name"], p["index"]): p for t in resp["responses"] for p in t["partition_responses"]}
            for b in batches:
                pr = results.get((b.topic, b.partition))
                if pr is None:
                    await self._retry_or_fail(b, KafkaError(Errors.UNKNOWN_SERVER_ERROR, "partition missing from response"))
                    continue
                code = pr["error_code"]
                if code == Errors.NONE:
                    self._complete(b, None, pr["base_offset"], pr.get("log_append_time_ms", -1),
                                   pr.get("log_start_offset", -1))
                elif code == Errors.DUPLICATE_SEQUENCE_NUMBER:
                    # an earlier attempt was written; the broker no longer knows its offsets
                    self._complete(b, None, -1, pr.get("log_append_time_ms", -1))
                else:
                    await self._retry_or_fail(b, KafkaError(code, pr.get("error_message"),
                                                            f"produce {b.topic}-{b.partition}"))
        finally:
            self._in_flight[node] -= 1
            self._wake.set()

    async def _retry_or_fail(self, b: _Batch, err: KafkaError) -> None:
        tp = (b.topic, b.partition)
        now = time.monotonic()
        if err.retriable and b.attempts <= self.retries and now + self.retry_backoff < b.deadline:
            if err.invalidates_metadata:
                await self._refresh([b.topic])
            await asyncio.sleep(self.retry_backoff)
            # back at the head of its partition's queue, same bytes and sequence as before
            self._batches.setdefault(tp, deque()).appendleft(b)
            self._muted.discard(tp)
            self._wake.set()
            return
        self._muted.discard(tp)
        self._complete(b, err)

    def _complete(self, b: _Batch, err, base_offset=-1, log_append_time=-1, log_start_offset=-1) -> None:
        self._muted.discard((b.topic, b.partition))
        self._queued_bytes -= b.size
        if self._space is not None and self._queued_bytes <= self.buffer_memory:
            self._space.set()
        for i, (fut, ts, cb) in enumerate(b.futures):
            md = None
            if err is None:
                md = RecordMetadata(b.topic, b.partition, base_offset + i if base_offset >= 0 else -1,
                                    log_append_time if log_append_time >= 0 else ts, log_start_offset)
            _resolve(fut, cb, err, md)
        b.futures = []
