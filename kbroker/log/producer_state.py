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

Snapshot file ``%020d.snapshot`` (the name is the log end offset it describes), Kafka's
version-1 layout, big-endian:
    version i16 (1) | crc u32 (CRC-32C of everything after it) | count i32 |
    count x [producer_id i64 | epoch i16 | last_sequence i32 | last_offset i64 |
             offset_delta i32 | timestamp i64 | coordinator_epoch i32 | txn_first_offset i64]
Kafka writes one entry per producer (its last batch). We write one entry per retained batch,
oldest first, so a restarted broker still recognises the last 5 batches; Kafka reading the same
file keeps the last entry per producer id, i.e. the newest batch, so the file stays compatible.

Threads: the event-loop thread only.

Crash: state is derived data. Snapshots are written to a temp file, fsynced and renamed; a
missing, torn or stale (offset above the log end) snapshot is ignored or deleted and the state is
rebuilt by replaying batch headers from the newest usable snapshot (or the log start) to the end.
"""
import os
import struct
from collections import deque

from kbroker._native.crc import crc32c

from .checkpoint import fsync_dir
from .errors import INVALID_PRODUCER_EPOCH, OUT_OF_ORDER_SEQUENCE_NUMBER, LogAppendError

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
    __slots__ = ("producer_id", "epoch", "batches")

    def __init__(self, producer_id: int, epoch: int):
        self.producer_id = producer_id
        self.epoch = epoch
        self.batches = deque(maxlen=BATCHES_TO_RETAIN)


class ProducerStateManager:
    def __init__(self, dir_path: str):
        self.dir = dir_path
        self.producers: dict[int, ProducerEntry] = {}

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
               first_offset: int, timestamp: int) -> None:
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

    def replay(self, header) -> None:
        """Rebuild from a scanned batch header (native BatchInfo from LogSegment.headers/recover)."""
        if header.producer_id >= 0 and not header.attributes & 0x20:   # control batches carry no sequence
            self.update(header.producer_id, header.producer_epoch, header.base_sequence,
                        header.last_offset_delta, header.base_offset,
                        header.max_timestamp)

    def clear(self) -> None:
        self.producers.clear()

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
        body = bytearray(_COUNT.pack(sum(len(e.batches) for e in self.producers.values())))
        for e in self.producers.values():
            for b in e.batches:
                body += _ENTRY.pack(e.producer_id, e.epoch, b.last_seq, b.last_offset,
                                    b.last_offset - b.first_offset, b.timestamp, -1, -1)
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
        self.producers.clear()
        for pid, epoch, last_seq, last_off, delta, ts, _ce, _txn in _ENTRY.iter_unpack(body[_COUNT.size:]):
            first_seq = (last_seq - delta) % (INT32_MAX + 1)
            self.update(pid, epoch, first_seq, delta, last_off - delta, ts)
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
