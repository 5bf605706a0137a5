"""Idempotent-producer state of one partition (sequence dedup and fencing).

In memory: per producer id, its current epoch and the metadata of its last 5 batches
(first/last sequence, first/last offset, max timestamp), as Kafka keeps
(ProducerStateEntry.NUM_BATCHES_TO_RETAIN).

Rules on a leader append (``check``), in Kafka's order:
- epoch below the producer's current epoch -> INVALID_PRODUCER_EPOCH (47);
- a higher epoch must start at sequence 0, else OUT_OF_ORDER_SEQUENCE_NUMBER (45);
- same epoch and the exact (first_seq, last_seq) of a retained batch -> a duplicate: the caller
  answers with that batch's original offsets and appends nothing;
- same epoch otherwise: first_seq must follow the last sequence (INT32_MAX wraps to 0), else 45;
- an unknown producer id (never seen, or its batches were removed by retention) may start at any
  sequence, as in Kafka since KIP-360.

Transactions: a transactional batch from a producer with no ongoing transaction here starts one at
the batch's first offset (``current_txn_first_offset``); a COMMIT or ABORT marker (``complete_txn``)
ends it. A marker with an epoch below the producer's is refused (INVALID_PRODUCER_EPOCH), one with
a coordinator epoch below the last marker's too (TRANSACTION_COORDINATOR_FENCED). The first offset
of the earliest ongoing transaction bounds the partition's last stable offset
(``first_unstable_offset``).

Snapshot file ``%020d.snapshot`` (the name is the log end offset it describes), Kafka's
version-1 layout, big-endian:
    version i16 (1) | crc u32 (CRC-32C of everything after it) | count i32 |
    count x [producer_id i64 | epoch i16 | last_sequence i32 | last_offset i64 |
             offset_delta i32 | timestamp i64 | coordinator_epoch i32 | txn_first_offset i64]
Kafka writes one entry per producer (its last batch). We write one entry per retained batch,
oldest first, so a restarted broker still recognises the last 5 batches; Kafka reading the same
file keeps the last entry per producer id, i.e. the newest batch, so the file stays compatible.
A producer with no retained batch (its epoch bumped by a marker) is one entry with last_sequence
and last_offset -1, as Kafka writes it. coordinator_epoch and txn_first_offset (-1: no ongoing
transaction) are the producer's, repeated in each of its entries.

Threads: the event-loop thread only.

Crash: state is derived data. Snapshots are written to a temp file, fsynced and renamed; a
missing, torn or stale (offset above the log end) snapshot is ignored or deleted and the state is
rebuilt by replaying batch headers from the newest usable snapshot (or the log start) to the end.
"""
import os
import struct
from collections import deque
from typing import NamedTuple

from kbroker._native.crc import crc32c

from .checkpoint import fsync_dir
from .errors import (INVALID_PRODUCER_EPOCH, OUT_OF_ORDER_SEQUENCE_NUMBER, TRANSACTION_COORDINATOR_FENCED,
                     LogAppendError)

INT32_MAX = (1 << 31) - 1
BATCHES_TO_RETAIN = 5
SNAPSHOT_VERSION = 1
_HEAD = struct.Struct(">hI")
_COUNT = struct.Struct(">i")
_ENTRY = struct.Struct(">qhiqiqiq")


def last_sequence(base_sequence: int, last_offset_delta: int) -> int:
    """Sequence of a batch's last record; sequences wrap from INT32_MAX to 0."""
    return (base_sequence + last_offset_delta) % (INT32_MAX + 1)


def in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (last_seq == INT32_MAX and next_seq == 0)


class BatchMetadata:
    __slots__ = ("first_seq", "last_seq", "first_offset", "last_offset", "timestamp")

    def __init__(self, first_seq, last_seq, first_offset, last_offset, timestamp):
        self.first_seq = first_seq
        self.last_seq = last_seq
        self.first_offset = first_offset
        self.last_offset = last_offset
        self.timestamp = timestamp

    def __repr__(self):
        return (f"BatchMetadata(seq={self.first_seq}..{self.last_seq}, "
                f"offsets={self.first_offset}..{self.last_offset})")


class ProducerEntry:
    __slots__ = ("producer_id", "epoch", "batches", "coordinator_epoch", "current_txn_first_offset",
                 "last_timestamp")

    def __init__(self, producer_id: int, epoch: int):
        self.producer_id = producer_id
        self.epoch = epoch
        self.batches = deque(maxlen=BATCHES_TO_RETAIN)
        self.coordinator_epoch = -1
        self.current_txn_first_offset = -1      # -1: no ongoing transaction
        self.last_timestamp = -1                # of its last batch or marker


class CompletedTxn(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int              # the marker's offset
    aborted: bool


class ProducerStateManager:
    def __init__(self, dir_path: str):
        self.dir = dir_path
        self.producers: dict[int, ProducerEntry] = {}
        self.ongoing: dict[int, int] = {}      # producer id -> first offset of its ongoing transaction
        # producer id -> the guard of a verification in flight (begin_verification)
        self.verifying: dict[int, object] = {}
        # True for a coordinator's internal partition, whose only writer is its coordinator (Kafka's
        # AppendOrigin.COORDINATOR): the TxnOffsetCommit batches the group coordinator writes carry the
        # producer's id and epoch with base sequence 0, so only the epoch is checked; the sequence is
        # the client's business on its own partitions, and no coordinator batch is a retried duplicate.
        self.coordinator_appends = False

    # -- leader append --------------------------------------------------------------------

    def check(self, producer_id: int, epoch: int, first_seq: int, last_offset_delta: int):
        """Apply the rules above to a batch about to be appended. Returns the retained
        BatchMetadata when the batch is a duplicate, None when it may be appended; raises
        LogAppendError (45 / 47) otherwise."""
        entry = self.producers.get(producer_id)
        if entry is None:
            return None
        if epoch < entry.epoch:
            raise LogAppendError(
                INVALID_PRODUCER_EPOCH,
                f"producer {producer_id}: epoch {epoch} is older than the current epoch {entry.epoch}")
        if self.coordinator_appends:
            return None
        if epoch > entry.epoch:
            if first_seq != 0:
                raise LogAppendError(
                    OUT_OF_ORDER_SEQUENCE_NUMBER,
                    f"producer {producer_id}: new epoch {epoch} must start at sequence 0, got {first_seq}")
            return None
        last_seq = last_sequence(first_seq, last_offset_delta)
        for b in entry.batches:
            if b.first_seq == first_seq and b.last_seq == last_seq:
                return b
        if entry.batches and not in_sequence(entry.batches[-1].last_seq, first_seq):
            raise LogAppendError(
                OUT_OF_ORDER_SEQUENCE_NUMBER,
                f"producer {producer_id} epoch {epoch}: sequence {first_seq} does not follow "
                f"{entry.batches[-1].last_seq}")
        return None

    def update(self, producer_id: int, epoch: int, first_seq: int, last_offset_delta: int,
               first_offset: int, timestamp: int, transactional: bool = False) -> None:
        """Record an appended (or replayed) batch."""
        entry = self.producers.get(producer_id)
        if entry is None:
            entry = self.producers[producer_id] = ProducerEntry(producer_id, epoch)
        elif epoch != entry.epoch:
            if epoch < entry.epoch:
                return      # replaying an older epoch's batch cannot change the state
            entry.epoch = epoch
            entry.batches.clear()
        entry.batches.append(BatchMetadata(first_seq, last_sequence(first_seq, last_offset_delta),
                                           first_offset, first_offset + last_offset_delta, timestamp))
        entry.last_timestamp = timestamp
        if transactional and entry.current_txn_first_offset < 0:
            entry.current_txn_first_offset = first_offset
            self.ongoing[producer_id] = first_offset
            self.verifying.pop(producer_id, None)

    # -- KIP-890 verification ---------------------------------------------------------------------
    # Before the first transactional batch of a transaction is appended here, the leader may ask the
    # transaction coordinator whether this partition is in the producer's transaction. A guard taken
    # before asking is dropped by any marker for the producer, so an answer that a marker overtook
    # (the transaction ended meanwhile) cannot start a transaction here.

    def needs_verification(self, producer_id: int) -> bool:
        """True when a transactional batch of this producer would start a transaction here."""
        entry = self.producers.get(producer_id)
        return entry is None or entry.current_txn_first_offset < 0

    def begin_verification(self, producer_id: int) -> object:
        guard = self.verifying[producer_id] = object()
        return guard

    def verified(self, producer_id: int, guard: object) -> bool:
        """Whether ``guard`` still stands (no marker for the producer since begin_verification)."""
        return self.verifying.get(producer_id) is guard

    def check_marker(self, producer_id: int, epoch: int, coordinator_epoch: int) -> None:
        """Refuse a COMMIT/ABORT marker as Kafka does (LogAppendError 47 / 52), before it is written."""
        entry = self.producers.get(producer_id)
        if entry is None:
            return
        if epoch < entry.epoch:
            raise LogAppendError(
                INVALID_PRODUCER_EPOCH,
                f"producer {producer_id}: marker epoch {epoch} is older than the current epoch {entry.epoch}")
        if coordinator_epoch < entry.coordinator_epoch:
            raise LogAppendError(
                TRANSACTION_COORDINATOR_FENCED,
                f"producer {producer_id}: coordinator epoch {coordinator_epoch} is older than "
                f"{entry.coordinator_epoch}")

    def complete_txn(self, producer_id: int, epoch: int, coordinator_epoch: int, offset: int,
                     commit: bool, timestamp: int) -> CompletedTxn:
        """A marker written (or replayed) at ``offset``: end the producer's ongoing transaction. A
        marker with no transaction ongoing still completes one that starts at the marker itself."""
        entry = self.producers.get(producer_id)
        if entry is None:
            entry = self.producers[producer_id] = ProducerEntry(producer_id, epoch)
        elif epoch > entry.epoch:
            entry.epoch = epoch
            entry.batches.clear()
        first = entry.current_txn_first_offset
        entry.current_txn_first_offset = -1
        entry.coordinator_epoch = max(entry.coordinator_epoch, coordinator_epoch)
        entry.last_timestamp = timestamp
        self.ongoing.pop(producer_id, None)
        self.verifying.pop(producer_id, None)
        return CompletedTxn(producer_id, first if first >= 0 else offset, offset, not commit)

    def first_unstable_offset(self) -> int | None:
        """The first offset of the earliest ongoing transaction, None when there is none."""
        return min(self.ongoing.values()) if self.ongoing else None

    def replay(self, header) -> None:
        """Rebuild from a scanned data batch header (native BatchInfo from LogSegment.headers/recover);
        control batches are replayed by the log (``complete_txn``), which reads their record."""
        if header.producer_id >= 0 and not header.attributes & 0x20:   # control batches carry no sequence
            self.update(header.producer_id, header.producer_epoch, header.base_sequence,
                        header.last_offset_delta, header.base_offset,
                        header.max_timestamp, bool(header.attributes & 0x10))

    def clear(self) -> None:
        self.producers.clear()
        self.ongoing.clear()
        self.verifying.clear()

    # -- snapshots ------------------------------------------------------------------------

    def snapshot_path(self, offset: int) -> str:
        return os.path.join(self.dir, f"{offset:020d}.snapshot")

    def snapshot_offsets(self) -> list:
        out = []
        for name in os.listdir(self.dir):
            if name.endswith(".snapshot") and len(name) == 29 and name[:20].isdigit():
                out.append(int(name[:20]))
        return sorted(out)

    def write_snapshot(self, offset: int) -> None:
        body = bytearray(_COUNT.pack(sum(len(e.batches) or 1 for e in self.producers.values())))
        for e in self.producers.values():
            for b in e.batches:
                body += _ENTRY.pack(e.producer_id, e.epoch, b.last_seq, b.last_offset,
                                    b.last_offset - b.first_offset, b.timestamp, e.coordinator_epoch,
                                    e.current_txn_first_offset)
            if not e.batches:
                body += _ENTRY.pack(e.producer_id, e.epoch, -1, -1, 0, e.last_timestamp, e.coordinator_epoch,
                                    e.current_txn_first_offset)
        data = _HEAD.pack(SNAPSHOT_VERSION, crc32c(body)) + body
        path = self.snapshot_path(offset)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(self.dir)

    def load_snapshot(self, offset: int) -> bool:
        """Replace the state with the snapshot at ``offset``; False if it is unusable."""
        try:
            with open(self.snapshot_path(offset), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return False
        if len(data) < _HEAD.size + _COUNT.size:
            return False
        version, crc = _HEAD.unpack_from(data)
        body = memoryview(data)[_HEAD.size:]
        if version != SNAPSHOT_VERSION or crc32c(body) != crc:
            return False
        (count,) = _COUNT.unpack_from(body)
        if count < 0 or len(body) != _COUNT.size + count * _ENTRY.size:
            return False
        self.clear()
        for pid, epoch, last_seq, last_off, delta, ts, coord_epoch, txn_first in _ENTRY.iter_unpack(
                body[_COUNT.size:]):
            if last_off >= 0:
                first_seq = (last_seq - delta) % (INT32_MAX + 1)
                self.update(pid, epoch, first_seq, delta, last_off - delta, ts)
            entry = self.producers.get(pid)
            if entry is None:
                entry = self.producers[pid] = ProducerEntry(pid, epoch)
                entry.last_timestamp = ts
            entry.coordinator_epoch = coord_epoch
            entry.current_txn_first_offset = txn_first
            if txn_first >= 0:
                self.ongoing[pid] = txn_first
            else:
                self.ongoing.pop(pid, None)
        return True

    def delete_snapshots(self, above: int | None = None, below: int | None = None) -> None:
        """Delete snapshots with offset > ``above`` (after truncation) or < ``below`` (after
        retention moved the log start)."""
        for off in self.snapshot_offsets():
            if (above is not None and off > above) or (below is not None and off < below):
                try:
                    os.unlink(self.snapshot_path(off))
                except FileNotFoundError:
                    pass
