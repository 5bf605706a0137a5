"""Appends to and reads from the partitions of a coordinator's internal topic (``__consumer_offsets``
for the group coordinator, ``__transaction_state`` for the transaction coordinator).

``append`` is the ONE place where the coordinator writes: with the broker's ReplicaManager (when
replication is wired in) it appends with acks=-1 and waits until the batch is replicated (or
``offsets.commit.timeout.ms`` passes); without one, it appends to the local leader log, which on a
single broker is the whole ISR. Errors come back as Kafka maps them for the group APIs.

Batches are built by the native BatchBuilder, one batch per call (all records of one commit or one
group write), so a commit is one append whatever its partition count.
"""
from __future__ import annotations

import inspect
import logging
import os

from kbroker._native.batch import BatchBuilder
from kbroker.record import decode_records, iter_batches

from ..log.errors import LogAppendError
from ..protocol.errors import Errors
from ..topics import GROUP_METADATA_TOPIC as OFFSETS_TOPIC

log = logging.getLogger(__name__)


# Kafka's mapping of append errors for offset commits (GroupMetadataManager.storeOffsets) ...
_COMMIT_ERRORS = {
    Errors.UNKNOWN_TOPIC_OR_PARTITION: Errors.COORDINATOR_NOT_AVAILABLE,
    Errors.NOT_ENOUGH_REPLICAS: Errors.COORDINATOR_NOT_AVAILABLE,
    Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND: Errors.COORDINATOR_NOT_AVAILABLE,
    Errors.REQUEST_TIMED_OUT: Errors.COORDINATOR_NOT_AVAILABLE,
    Errors.NOT_LEADER_OR_FOLLOWER: Errors.NOT_COORDINATOR,
    Errors.KAFKA_STORAGE_ERROR: Errors.NOT_COORDINATOR,
    Errors.MESSAGE_TOO_LARGE: Errors.INVALID_COMMIT_OFFSET_SIZE,
    Errors.RECORD_LIST_TOO_LARGE: Errors.INVALID_COMMIT_OFFSET_SIZE,
    Errors.INVALID_FETCH_SIZE: Errors.INVALID_COMMIT_OFFSET_SIZE,
}
# ... and for group metadata (storeGroup): too large is a server error there.
_GROUP_ERRORS = dict(_COMMIT_ERRORS)
for _c in (Errors.MESSAGE_TOO_LARGE, Errors.RECORD_LIST_TOO_LARGE, Errors.INVALID_FETCH_SIZE):
    _GROUP_ERRORS[_c] = Errors.UNKNOWN_SERVER_ERROR


def map_error(code: int, for_commit: bool) -> int:
    if code == 0:
        return 0
    table = _COMMIT_ERRORS if for_commit else _GROUP_ERRORS
    try:
        return int(table.get(Errors(code), code))
    except ValueError:
        return int(Errors.UNKNOWN_SERVER_ERROR)


def build_batch(records, now_ms: int, producer: tuple[int, int, int] | None = None) -> bytearray:
    """One RecordBatch v2 holding ``records`` [(key, value-or-None)], writable for stamping.
    ``producer`` (id, epoch, base sequence) makes it a transactional batch (a TxnOffsetCommit's offsets)."""
    size = 128 + sum(len(k) + (len(v) if v is not None else 0) + 32 for k, v in records)
    b = BatchBuilder(0, size)
    for k, v in records:
        b.append(now_ms, k, v)
    if producer is None:
        return bytearray(b.build())
    return bytearray(b.build(producer[0], producer[1], producer[2], -1, True))


class OffsetsStore:
    def __init__(self, broker, topic: str = OFFSETS_TOPIC, timeout_key: str = "offsets.commit.timeout.ms"):
        self.broker = broker
        self.topic = topic
        self.timeout_key = timeout_key

    def _timeout_ms(self) -> int:
        return self.broker.config.get(self.timeout_key)

    async def append(self, partition: int, records, for_commit: bool,
                     producer: tuple[int, int, int] | None = None) -> tuple[int, int]:
        """Append ``records`` [(key bytes, value bytes or None)] to ``topic-partition`` and wait until
        they are durable. Returns (error code as the coordinator APIs report it, base offset or -1).
        ``producer``: (id, epoch, base sequence) of a transactional batch."""
        broker = self.broker
        tp = (self.topic, partition)
        buf = build_batch(records, broker.now_ms(), producer)
        lg = broker.logs.get(tp)
        if lg is not None:
            # this store is the partition's only writer: the log checks its batches as a coordinator's
            lg.producer_state.coordinator_appends = True
        rm = getattr(broker, "replica_manager", None)
        if rm is not None:
            try:
                res = rm.append_records({tp: memoryview(buf)}, -1, self._timeout_ms(), internal=True)
                if inspect.isawaitable(res):
                    res = await res
            except Exception:
                log.exception("append to %s-%d failed", *tp)
                return int(Errors.UNKNOWN_SERVER_ERROR), -1
            r = res[tp]
            return map_error(int(r.error_code), for_commit), r.base_offset
        # No ReplicaManager: the local leader log is the whole ISR on one broker.
        md = broker.metadata
        tinfo = md.topics.get(self.topic)
        pinfo = tinfo.partitions.get(partition) if tinfo is not None else None
        if pinfo is None:
            return map_error(Errors.UNKNOWN_TOPIC_OR_PARTITION, for_commit), -1
        if pinfo.leader != broker.broker_id:
            return map_error(Errors.NOT_LEADER_OR_FOLLOWER, for_commit), -1
        if lg is None:
            return map_error(Errors.NOT_LEADER_OR_FOLLOWER, for_commit), -1
        try:
            r = lg.append_as_leader(buf, pinfo.leader_epoch, broker.now_ms())
        except LogAppendError as e:
            return map_error(e.error_code, for_commit), -1
        broker.notifier.appended(tp)
        return 0, r.base_offset

    def read_all(self, partition: int, chunk_bytes: int):
        """Yield (offset, key, value, pending producer id) of every record in the partition's local log,
        oldest first, reading ``chunk_bytes`` (the load buffer size) at a time. Records of a transaction
        (TxnOffsetCommit) wait for their producer's marker: a COMMIT yields them at the marker, an ABORT
        drops them; those still open at the end come last with their producer id (-1 for all others)."""
        lg = self.broker.logs.get((self.topic, partition))
        if lg is None:
            return
        open_txns: dict[int, list] = {}
        offset = lg.log_start_offset
        end = lg.log_end_offset
        while offset < end:
            data = lg.read(offset, chunk_bytes, max_offset=end, min_one_batch=True)
            if not data.regions:
                break
            fd, pos, length = data.regions[0]
            buf = os.pread(fd, length, pos)
            view = memoryview(buf)
            advanced = False
            for info in iter_batches(view):
                if info.position + info.size > len(buf):
                    break
                if info.next_offset <= offset:
                    continue
                advanced = True
                offset = info.next_offset
                recs = decode_records(view[info.position:info.position + info.size])
                if info.is_control:
                    held = open_txns.pop(info.producer_id, [])
                    if recs and _is_commit(recs[0][2]):
                        yield from held
                    continue
                if info.is_transactional:
                    open_txns.setdefault(info.producer_id, []).extend(
                        (rec[0], rec[2], rec[3], -1) for rec in recs)
                    continue
                for rec in recs:
                    yield rec[0], rec[2], rec[3], -1
            if not advanced:
                break
        for pid, held in open_txns.items():
            for off, k, v, _ in held:
                yield off, k, v, pid


def _is_commit(control_key) -> bool:
    """A control record's key: int16 version, int16 type (0 ABORT, 1 COMMIT)."""
    return control_key is not None and len(control_key) >= 4 and control_key[2:4] == b"\x00\x01"
