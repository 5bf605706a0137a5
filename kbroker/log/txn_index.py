"""The aborted-transaction index of one partition, and the control records of transaction markers.

In memory: every aborted transaction still in the log, ordered by its marker's offset. On disk: one
``%020d.txnindex`` per segment (named after the segment's base offset) holding the aborted
transactions whose ABORT marker lies in that segment, in Kafka's format: 34-byte entries, big-endian
    version i16 (0) | producer_id i64 | first_offset i64 | last_offset i64 | last_stable_offset i64
``last_offset`` is the marker's offset, ``first_offset`` the transaction's first data offset,
``last_stable_offset`` the partition's LSO once the transaction completed.

A read_committed fetch asks for the aborted transactions overlapping the range it serves
(``overlapping``); the consumer drops those producers' batches between first and last offset.

Control records (markers): a control batch (attributes: transactional | control) holds one record whose
key is ``version i16 (0) | type i16`` (0 = ABORT, 1 = COMMIT) and whose value is
``version i16 (0) | coordinator_epoch i32``.

Threads: the event-loop thread (the owning Log's).

Crash: files are rewritten with temp + fsync + rename; appends of one entry are plain writes. The
owning Log rebuilds the entries past its producer-state snapshot by replaying the markers there
(``truncate_from``, then ``append``), so a torn or missing tail entry is rebuilt, and entries of
segments that no longer exist are dropped on load (``retain``).
"""
import bisect
import os
import struct
import time
from typing import NamedTuple

from kbroker._native.crc import crc32c

from ..protocol.types import varint_bytes
from .checkpoint import fsync_dir

SUFFIX = ".txnindex"
VERSION = 0
ENTRY = struct.Struct(">hqqqq")
ENTRY_SIZE = ENTRY.size           # 34

ABORT = 0
COMMIT = 1
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20
HEADER_SIZE = 61                  # RecordBatch v2 header


class AbortedTxn(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


def file_path(dir_path: str, base_offset: int) -> str:
    return os.path.join(dir_path, f"{base_offset:020d}{SUFFIX}")


class TxnIndex:
    def __init__(self, dir_path: str):
        self.dir = dir_path
        self.entries: list[AbortedTxn] = []
        self._lasts: list[int] = []        # the entries' last offsets, for bisect

    # -- queries --------------------------------------------------------------------------

    def overlapping(self, start: int, end: int) -> list:
        """Aborted transactions that may hold data in [start, end): last_offset >= start and
        first_offset < end (what a fetch serving that range must report). The walk stops at the first
        entry whose last stable offset reaches ``end``: every later transaction was still open or not
        begun when that one completed, so it starts at or after that LSO."""
        entries = self.entries
        out = []
        for k in range(bisect.bisect_left(self._lasts, start), len(entries)):
            e = entries[k]
            if e.first_offset < end:
                out.append(e)
            if e.last_stable_offset >= end:
                break
        return out

    # -- changes --------------------------------------------------------------------------

    def append(self, entry: AbortedTxn, segment_base: int, write: bool = True) -> None:
        """Record an aborted transaction whose marker is in the segment at ``segment_base``."""
        if self._lasts and entry.last_offset <= self._lasts[-1]:
            return          # already known (a replay over entries the files still had)
        self.entries.append(entry)
        self._lasts.append(entry.last_offset)
        if write:
            with open(file_path(self.dir, segment_base), "ab") as f:
                f.write(ENTRY.pack(VERSION, *entry))

    def truncate_from(self, offset: int, bases: list) -> None:
        """Drop entries whose marker is at or after ``offset`` (truncation, or before a replay that
        rebuilds them), in memory and on disk."""
        i = bisect.bisect_left(self._lasts, offset)
        if i < len(self.entries):
            del self.entries[i:]
            del self._lasts[i:]
            self.rewrite(bases)

    def retain(self, bases: list) -> None:
        """The log's segments are now those starting at ``bases`` (retention, cleaning, truncation,
        load): drop entries below the first, move each entry to the file of the segment holding its
        marker and remove the files of segments that are gone."""
        first = bases[0] if bases else 0
        i = bisect.bisect_left(self._lasts, first)
        if i:
            del self.entries[:i]
            del self._lasts[:i]
        self.rewrite(bases)

    def rewrite(self, bases: list) -> None:
        wanted: dict[int, list] = {}
        for e in self.entries:
            k = bisect.bisect_right(bases, e.last_offset) - 1
            wanted.setdefault(bases[max(k, 0)], []).append(e)
        present = set(self._files())
        changed = False
        for base in present - wanted.keys():
            os.unlink(file_path(self.dir, base))
            changed = True
        for base, entries in wanted.items():
            data = b"".join(ENTRY.pack(VERSION, *e) for e in entries)
            path = file_path(self.dir, base)
            try:
                with open(path, "rb") as f:
                    if f.read() == data:
                        continue
            except FileNotFoundError:
                pass
            tmp = path + ".tmp"
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            changed = True
        if changed:
            fsync_dir(self.dir)

    def load(self) -> None:
        """Read every ``.txnindex`` file of the directory (a torn trailing entry is ignored)."""
        found = {}
        for base in self._files():
            with open(file_path(self.dir, base), "rb") as f:
                data = f.read()
            usable = len(data) - len(data) % ENTRY_SIZE
            for version, pid, first, last, lso in ENTRY.iter_unpack(data[:usable]):
                if version == VERSION and first <= last:
                    found[last] = AbortedTxn(pid, first, last, lso)
        self.entries = [found[k] for k in sorted(found)]
        self._lasts = sorted(found)

    def clear(self, remove_files: bool = True) -> None:
        self.entries = []
        self._lasts = []
        if remove_files:
            for base in self._files():
                os.unlink(file_path(self.dir, base))

    def _files(self) -> list:
        n = len(SUFFIX)
        return [int(name[:20]) for name in os.listdir(self.dir)
                if name.endswith(SUFFIX) and len(name) == 20 + n and name[:20].isdigit()]


# -- control batches ----------------------------------------------------------------------

def control_batch(producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
                  base_offset: int, leader_epoch: int, timestamp: int | None = None) -> bytes:
    """A stamped control batch holding one COMMIT or ABORT marker, as a leader appends it."""
    if timestamp is None:
        timestamp = int(time.time() * 1000)
    record = control_section(COMMIT if commit else ABORT, coordinator_epoch)
    after_crc = struct.pack(">hiqqqhii", ATTR_TRANSACTIONAL | ATTR_CONTROL, 0, timestamp, timestamp,
                            producer_id, producer_epoch, -1, 1) + record
    head = struct.pack(">qiib", base_offset, 4 + 1 + 4 + len(after_crc), leader_epoch, 2)
    return head + struct.pack(">I", crc32c(after_crc)) + after_crc


def control_section(kind: int, coordinator_epoch: int, timestamp_delta: int = 0) -> bytes:
    """The records section of a control batch: its one control record (``kind`` ABORT or COMMIT)."""
    key = struct.pack(">hh", 0, kind)
    value = struct.pack(">hi", 0, coordinator_epoch)
    body = (b"\x00" + varint_bytes(timestamp_delta) + varint_bytes(0) + varint_bytes(len(key)) + key
            + varint_bytes(len(value)) + value + varint_bytes(0))
    return varint_bytes(len(body)) + body


def _varint(buf, pos: int):
    shift = 0
    v = 0
    while True:
        b = buf[pos]
        pos += 1
        v |= (b & 0x7F) << shift
        if b < 0x80:
            return (v >> 1) ^ -(v & 1), pos
        shift += 7


def control_type(batch) -> tuple[int, int]:
    """(type, coordinator_epoch) of a control batch's first record: type ABORT (0), COMMIT (1), or
    another control type (-1 coordinator epoch when absent). ``batch``: the batch's bytes (at least
    its header and first record)."""
    pos = HEADER_SIZE
    _length, pos = _varint(batch, pos)
    pos += 1                                    # record attributes
    _ts, pos = _varint(batch, pos)
    _od, pos = _varint(batch, pos)
    klen, pos = _varint(batch, pos)
    if klen < 4:
        return -1, -1
    (kind,) = struct.unpack_from(">h", batch, pos + 2)
    pos += klen
    vlen, pos = _varint(batch, pos)
    epoch = struct.unpack_from(">i", batch, pos + 2)[0] if vlen >= 6 else -1
    return kind, epoch
