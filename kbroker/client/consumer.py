"""Consumer-side reads without groups: Fetch of offset ranges, ListOffsets, range iteration.

Records are decoded per batch natively (``kbroker.record.decode_records``, which decompresses
first). Control batches (transaction markers) are skipped; with ``read_committed`` the batches of
aborted transactions listed in the Fetch response are skipped too, as Kafka's consumers do.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from kbroker.protocol.errors import Errors
from kbroker.record import decode_records, iter_batches

from .cluster import Cluster, ClusterClient
from .connection import KafkaConnectionError, KafkaError, raise_for_error

FETCH, LIST_OFFSETS = 1, 2
EARLIEST, LATEST, MAX_TIMESTAMP = -2, -1, -3
ISOLATION = {"read_uncommitted": 0, "read_committed": 1, 0: 0, 1: 1}


@dataclass(frozen=True, slots=True)
class Record:
    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int      # 0 CreateTime, 1 LogAppendTime
    key: bytes | None
    value: bytes | None
    headers: list = field(default_factory=list)   # [(str, bytes | None)]


@dataclass(slots=True)
class FetchResult:
    topic: str
    partition: int
    records: list[Record]
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    next_offset: int            # where the next fetch should start
    raw: bytes | None = None    # the records section as returned, when asked for
    aborted_transactions: list | None = None    # the answer's, for callers decoding ``raw`` (AbortedFilter)


class AbortedFilter:
    """Which batches of one Fetch answer a consumer skips (KIP-98, as Kafka's consumers do): control
    batches always; with read_committed, a transactional batch of a producer that has an aborted
    transaction (from the answer's ``aborted_transactions``) starting at or before the batch's last
    offset, until that producer's marker is passed. ``skip`` takes every batch of the answer in
    offset order (the filter keeps state across them)."""

    __slots__ = ("_pending", "_next", "_aborting")

    def __init__(self, aborted_transactions=None):
        self._pending = sorted((a["first_offset"], a["producer_id"]) for a in (aborted_transactions or ()))
        self._next = 0
        self._aborting: set[int] = set()

    def skip(self, info) -> bool:
        """``info``: a batch header (kbroker.record BatchInfo) -> True when it must not be read."""
        last = info.base_offset + info.last_offset_delta
        pending = self._pending
        while self._next < len(pending) and pending[self._next][0] <= last:
            self._aborting.add(pending[self._next][1])
            self._next += 1
        if info.is_control:
            if info.is_transactional:
                self._aborting.discard(info.producer_id)   # the marker ends that transaction
            return True
        return info.is_transactional and info.producer_id in self._aborting


def _offset_spec(spec) -> int:
    if spec in ("earliest", "beginning"):
        return EARLIEST
    if spec in ("latest", "end"):
        return LATEST
    if spec == "max_timestamp":
        return MAX_TIMESTAMP
    return int(spec)


class Consumer(ClusterClient):
    def __init__(self, bootstrap_servers=None, *, cluster: Cluster | None = None, client_id: str = "kbroker-consumer",
                 isolation_level="read_uncommitted", request_timeout_ms: int = 30000,
                 retry_backoff_ms: int = 100, check_crcs: bool = False, retries: int = 10, security=None):
        if isolation_level not in ISOLATION:
            raise ValueError(f"isolation_level must be read_uncommitted or read_committed, not {isolation_level!r}")
        super().__init__(bootstrap_servers, cluster, client_id, request_timeout_ms, retry_backoff_ms, security)
        self.isolation = ISOLATION[isolation_level]
        self.retry_backoff = retry_backoff_ms / 1000
        self.request_timeout_ms = request_timeout_ms
        self.check_crcs = check_crcs
        self.retries = retries

    async def with_leader(self, topic: str, partition: int, make_call):
        """Run ``await make_call(conn)`` against the current leader of ``topic``/``partition``
        (``conn``: its negotiated BrokerConnection, whose ``host``, ``port`` and ``version_for``
        callers may use to talk to that broker their own way) and return its result.

        A retriable KafkaError raised by ``make_call`` (or by finding the leader) is retried up to
        ``retries`` times with backoff from ``retry_backoff_ms`` doubling to 1 s: a
        KafkaConnectionError drops that broker's connection, an error meaning stale metadata
        (NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION, ...) refreshes the topic's metadata
        first, so the next attempt goes to the new leader. Other errors, and the last attempt's,
        are raised. ``make_call`` may run several times: it must be safe to repeat."""
        backoff = self.retry_backoff
        for attempt in range(self.retries + 1):
            node = -1
            try:
                conn = await self.cluster.leader_connection(topic, partition)
                node = conn.node_id
                return await make_call(conn)
            except KafkaError as e:
                if not e.retriable or attempt == self.retries:
                    raise
                if isinstance(e, KafkaConnectionError):
                    self.cluster.invalidate(node)
                if e.invalidates_metadata:
                    try:
                        await self.cluster.refresh_metadata([topic])
                    except KafkaError:
                        pass
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)

    # ---- fetch ---------------------------------------------------------------------------------

    async def fetch(self, topic: str, partition: int, offset: int, max_bytes: int = 1048576,
                    max_wait_ms: int = 500, min_bytes: int = 1, raw: bool = False,
                    decode: bool = True) -> FetchResult:
        """One Fetch of ``topic``/``partition`` from ``offset``. Records below ``offset`` (a batch
        starts before it) are dropped; a trailing partial batch is ignored. ``decode=False``
        skips the per-record decode: ``records`` is empty and ``raw`` is the records section as
        received (no copy), for callers that decode batches themselves (kbroker.spark)."""
        async def call(conn):
            version = conn.version_for(FETCH)
            body = {
                "replica_id": -1, "max_wait_ms": max_wait_ms, "min_bytes": min_bytes,
                "max_bytes": max_bytes, "isolation_level": self.isolation,
                "session_id": 0, "session_epoch": -1,
                "topics": [{"topic": topic, "partitions": [{
                    "partition": partition, "fetch_offset": offset, "partition_max_bytes": max_bytes,
                    "current_leader_epoch": -1, "log_start_offset": -1}]}],
                "forgotten_topics_data": [], "rack_id": "",
            }
            timeout = (self.request_timeout_ms + max_wait_ms) / 1000
            _, resp = await conn.send(FETCH, body, version, timeout=timeout)
            raise_for_error(resp.get("error_code", 0), None, "fetch")
            for t in resp["responses"]:
                for p in t["partitions"]:
                    if t["topic"] == topic and p["partition_index"] == partition:
                        raise_for_error(p["error_code"], None, f"fetch {topic}-{partition}@{offset}")
                        return p
            raise KafkaError(Errors.UNKNOWN_SERVER_ERROR, f"fetch response lacks {topic}-{partition}")

        p = await self.with_leader(topic, partition, call)
        data = p["records"]
        if not decode:
            return FetchResult(topic, partition, [], p["high_watermark"], p.get("last_stable_offset", -1),
                               p.get("log_start_offset", -1), offset, data if data is not None else b"",
                               self.aborted_of(p))
        records, next_offset = self._decode(topic, partition, data, offset, self.aborted_of(p))
        return FetchResult(topic, partition, records, p["high_watermark"], p.get("last_stable_offset", -1),
                           p.get("log_start_offset", -1), next_offset,
                           bytes(data) if raw and data is not None else (b"" if raw else None))

    def aborted_of(self, partition_answer: dict) -> list | None:
        """The aborted transactions of a Fetch answer's partition that this consumer honours: only
        read_committed skips aborted data."""
        return partition_answer.get("aborted_transactions") if self.isolation == 1 else None

    def _decode(self, topic, partition, data, offset, aborted):
        out: list[Record] = []
        next_offset = offset
        if data is None or len(data) == 0:
            return out, next_offset
        skipped = AbortedFilter(aborted)
        mv = memoryview(data)
        for info in iter_batches(mv, 0, self.check_crcs):
            last = info.base_offset + info.last_offset_delta
            next_offset = max(next_offset, last + 1)
            if skipped.skip(info) or last < offset:
                continue
            ts_type = info.timestamp_type
            for off, ts, key, value, headers in decode_records(mv[info.position:info.position + info.size],
                                                               check_crc=False):
                if off >= offset:
                    out.append(Record(topic, partition, off, ts, ts_type, key, value, headers))
        return out, next_offset

    # ---- offsets -------------------------------------------------------------------------------

    async def list_offsets(self, topic: str, partition: int, spec="latest") -> int:
        """``spec``: 'earliest', 'latest', 'max_timestamp' or a timestamp in ms (-> the first
        offset whose timestamp is >= it, or -1 if none)."""
        ts = _offset_spec(spec)

        async def call(conn):
            body = {"replica_id": -1, "isolation_level": self.isolation, "topics": [{
                "name": topic, "partitions": [{"partition_index": partition, "timestamp": ts,
                                               "current_leader_epoch": -1}]}]}
            _, resp = await conn.send(LIST_OFFSETS, body)
            p = resp["topics"][0]["partitions"][0]
            raise_for_error(p["error_code"], None, f"list_offsets {topic}-{partition}")
            return p["offset"]

        return await self.with_leader(topic, partition, call)

    async def partitions(self, topic: str) -> list[int]:
        await self.cluster.wait_for_topic(topic)
        return self.cluster.partitions_for(topic)

    async def iter_range(self, ranges: dict, max_bytes: int = 1048576, max_wait_ms: int = 500):
        """Async iterator of records over ``{(topic, partition): (start, end)}`` (end exclusive; an
        end of None = the high watermark when iteration of that partition starts; start may be
        'earliest'/'latest'). Partitions are read in turn, in offset order within each."""
        for (topic, partition), (start, end) in ranges.items():
            if not isinstance(start, int) or start < 0:
                start = await self.list_offsets(topic, partition, start if start is not None else "earliest")
            if end is None:
                end = await self.list_offsets(topic, partition, "latest")
            pos = start
            while pos < end:
                r = await self.fetch(topic, partition, pos, max_bytes=max_bytes, max_wait_ms=max_wait_ms)
                for rec in r.records:
                    if rec.offset >= end:
                        break
                    yield rec
                if r.next_offset <= pos:
                    if r.high_watermark <= pos:
                        break   # nothing more will come within this range's promise
                    continue
                pos = r.next_offset
