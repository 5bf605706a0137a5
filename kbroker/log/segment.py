"""One log segment: ``%020d.log`` plus its ``.index`` and ``.timeindex``.

Format: the .log is RecordBatch v2 batches exactly as produced on the wire with baseOffset and
partitionLeaderEpoch stamped by the leader (Kafka's log format is its wire format); the file name is the base
offset (the first offset the segment may hold) zero-padded to 20 digits. Index formats: index.py.

Descriptors: the active segment appends through its own O_APPEND descriptor (one write per
batch); every segment serves reads from a separate read-only descriptor (``read_fd``), so
sendfile on it never moves the writer. A leader's append is one native call (``append_leader``:
check, roll decision, stamp, write; the GIL released from 4 KiB on), a follower's or a writer
thread's one ``write_all``.

Index rule (Kafka's LogSegment.append): after each append, if more than index.interval.bytes
were written since the last entry *before* this batch, add an .index entry (batch last offset,
batch start position) and a .timeindex entry (greatest timestamp so far, its batch's last offset).

Threads: the broker's event-loop thread only; the byte work is native and releases the GIL.

Crash: an append is a single write, so a crash leaves a whole batch, a torn batch, or (if the
file size was updated before the data) garbage at the tail. ``recover()`` scans with CRC32C,
truncates at the first bad batch and rebuilds both indexes; a clean load (``load()``) only
reads the headers after the last index entry. A failed write is truncated away at once.
Batches stored with maxTimestamp -1 (before the leader set it from the records) send a load to
``recover()``, which sets it in the file (``_restamp``) before indexing.
"""
import logging
import os
import struct
import time

from kbroker import switches
from kbroker._native import segment as _native
from kbroker._native.batch import LAYOUT
from kbroker._native.crc import crc32c

from .errors import KAFKA_STORAGE_ERROR, LogAppendError
from .index import OffsetIndex, TimeIndex

_log = logging.getLogger(__name__)

INT64_MAX = (1 << 63) - 1
_OFF_CRC, _CRC_START, _OFF_MAX_TIMESTAMP = LAYOUT["OFF_CRC"], LAYOUT["CRC_START"], LAYOUT["OFF_MAX_TIMESTAMP"]
MAX_RELATIVE_OFFSET = (1 << 31) - 1   # Kafka reads the u32 as a signed int
_HEADER = 61                          # RecordBatch v2 header bytes (ext/layout.pxd HEADER_SIZE)
# Recent batches a segment remembers for tail reads (between this many and twice as many); 0 = none
# (KBROKER_SEGMENT_TAIL_BATCHES, for side-by-side measurement).
TAIL_BATCHES = switches.current.segment_tail_batches
# Read blocks: a small fetch (a consumer reading batch after batch, a tail reader) needs the batch
# boundaries around its position and then the bytes themselves: reading READ_BLOCK bytes of the file
# once and keeping them serves the following fetches' header walks and copies from memory instead of
# two header preads and a data pread each. At most READ_BLOCKS blocks process-wide (least recently
# used dropped first; 0 = none, KBROKER_SEGMENT_READ_BLOCKS, for side-by-side measurement). A block
# holds file bytes below the size the segment had when it was read: those never change until the
# file is cut, and every cut or reload drops the block (_forget_tail).
READ_BLOCK = 16 * 1024
READ_BLOCKS = switches.current.segment_read_blocks
read_blocks = _native.ReadBlocks(READ_BLOCKS, READ_BLOCK)   # the process's (the native Fetch path's too)

# Process-wide counters tests use to prove what a startup did (e.g. no CRC scan after a
# clean shutdown).
STATS = {"recovery_scans": 0, "recovery_bytes_scanned": 0, "bytes_truncated": 0}


def _unstamped(b) -> bool:
    """A CreateTime batch stored with maxTimestamp -1 though its first record has a timestamp."""
    return b.max_timestamp == -1 and b.first_timestamp >= 0 and not b.timestamp_type


def file_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


class LogSegment:
    def __init__(self, dir_path: str, base_offset: int, index_interval_bytes: int,
                 segment_index_bytes: int, active: bool, now_ms: int | None = None):
        self.dir = dir_path
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.segment_index_bytes = segment_index_bytes
        self.log_path = os.path.join(dir_path, file_name(base_offset, ".log"))
        self._append_fd = -1
        # Open (or create) the log first: its size bounds index positions.
        flags = os.O_RDONLY | os.O_CREAT
        self.read_fd = os.open(self.log_path, flags, 0o644)
        self.index = OffsetIndex(os.path.join(dir_path, file_name(base_offset, ".index")),
                                 base_offset, segment_index_bytes, active,
                                 max_position=max(os.fstat(self.read_fd).st_size, 1))
        self.time_index = TimeIndex(os.path.join(dir_path, file_name(base_offset, ".timeindex")),
                                    base_offset, segment_index_bytes, active)
        # The state appends move lives in native code (segment.SegmentState: size, next offset, roll
        # clocks, max timestamp, bytes since the last index entry, index-full flag, and the last
        # appended batches' (last offset, position) list that tail reads search); ``size`` and
        # ``next_offset`` are mirrored here as plain attributes (set by the state on every append)
        # because readers use them on every fetch. segment.ms counts from the first batch's
        # timestamp (Kafka's rollingBasedTimestamp) or, before any batch, from creation.
        self._st = _native.SegmentState(
            self, self.index, self.time_index, base_offset, index_interval_bytes,
            int(time.time() * 1000) if now_ms is None else now_ms, TAIL_BATCHES)
        self._set_end(os.fstat(self.read_fd).st_size, base_offset)
        self._st.sync_index()
        self._st.forget_tail()              # sets _tail_floor, _tail_start
        if active:
            self._open_append()
        self.deleted = False

    # -- state ----------------------------------------------------------------------------

    def _set_end(self, size: int, next_offset: int) -> None:
        """Size and next offset (one past the last offset in the segment), here and natively."""
        st = self._st
        self.size = st.size = size
        self.next_offset = st.next_offset = next_offset

    def _set_append_fd(self, fd: int) -> None:
        self._append_fd = self._st.fd = fd

    # Read and set by recovery, retention, the cleaner and tests (not per request): native fields.
    @property
    def max_timestamp(self) -> int:
        """The greatest batch max timestamp so far (-1 for none)."""
        return self._st.max_timestamp

    @max_timestamp.setter
    def max_timestamp(self, value: int) -> None:
        self._st.max_timestamp = value

    @property
    def offset_of_max_timestamp(self) -> int:
        return self._st.offset_of_max_timestamp

    @offset_of_max_timestamp.setter
    def offset_of_max_timestamp(self, value: int) -> None:
        self._st.offset_of_max_timestamp = value

    @property
    def bytes_since_index(self) -> int:
        return self._st.bytes_since_index

    @bytes_since_index.setter
    def bytes_since_index(self, value: int) -> None:
        self._st.bytes_since_index = value

    @property
    def created_ms(self) -> int:
        return self._st.created_ms

    @property
    def first_batch_ms(self) -> int | None:
        """The first batch's max timestamp (segment.ms counts from it), None before any batch."""
        st = self._st
        return st.first_batch_ms if st.has_first else None

    @first_batch_ms.setter
    def first_batch_ms(self, value: int | None) -> None:
        st = self._st
        st.has_first = value is not None
        st.first_batch_ms = -1 if value is None else value

    # The last appended batches' (last offset, position), in file order and contiguous up to
    # ``size``; ``_tail_floor`` is the last offset before the first of them. A tail read (a consumer
    # or follower at the log end) finds its batch there instead of reading headers from the file (two
    # preads per fetch). Cleared whenever the file is cut or re-read. Lists are copies (tests). The
    # state keeps ``_tail_floor`` (the last offset before the list) and ``_tail_start`` (the list's
    # first position) here as plain attributes, INT64_MAX when the list is empty: a read the list
    # cannot answer (a consumer behind the log end) tests them without a native call.
    @property
    def _tail_last(self) -> list[int]:
        return self._st.tail()[0]

    @_tail_last.setter
    def _tail_last(self, last_offsets: list[int]) -> None:
        positions = self._st.tail()[1][:len(last_offsets)]
        self._st.set_tail(list(last_offsets), positions + [0] * (len(last_offsets) - len(positions)))

    @property
    def _tail_pos(self) -> list[int]:
        return self._st.tail()[1]

    @_tail_pos.setter
    def _tail_pos(self, positions: list[int]) -> None:
        last_offsets = self._st.tail()[0][:len(positions)]
        self._st.set_tail(last_offsets + [0] * (len(positions) - len(last_offsets)), list(positions))

    def set_tail_bounds(self, floor: int, start: int) -> None:
        """The native state's recent-batch list changed: ``floor`` is the last offset before it and
        ``start`` its first position (both INT64_MAX when the list is empty)."""
        self._tail_floor = floor
        self._tail_start = start

    @property
    def active(self) -> bool:
        return self._append_fd >= 0

    def _open_append(self):
        self._set_append_fd(os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))

    def make_active(self):
        """Reopen the last segment of a loaded log for appends."""
        if not self.active:
            self._open_append()
            self.index.make_writable(self.segment_index_bytes)
            self.time_index.make_writable(self.segment_index_bytes)
            self._st.sync_index()

    def index_sane(self) -> bool:
        """Both indexes fully well formed and consistent with the log's size."""
        if not (self.index.sane and self.time_index.sane):
            return False
        last_off, last_pos = self.index.last_entry()
        return last_pos <= self.size and (self.index.entries == 0 or last_pos < self.size)

    # -- load -----------------------------------------------------------------------------

    def load(self) -> bool:
        """Clean load: trust the indexes, read only the headers after the last index entry to
        find next_offset and the max timestamp. Returns False when the tail does not end on a
        batch boundary or an index is malformed (the caller then runs ``recover``)."""
        self._forget_tail()
        if not self.index_sane():
            return False
        last_off, pos = self.index.last_entry()
        valid_end, batches, reason = _native.scan_batches(
            self.read_fd, pos, self.size, self.base_offset, self.base_offset, False)
        if valid_end != self.size:
            return False
        # A missing index file loads as empty: rebuild it if Kafka's rule would have made
        # entries (a batch starting more than index.interval.bytes into the segment), or if
        # the time index is empty while the offset index is not.
        if not self.index.entries and any(b.position > self.index_interval_bytes for b in batches):
            return False
        if self.index.entries and not self.time_index.entries:
            return False
        if any(_unstamped(b) for b in batches):
            return False            # written before the leader set maxTimestamp: recover restamps it
        st = self._st
        ts, ts_off = self.time_index.last_entry()
        if batches:
            self._set_end(self.size, batches[-1].last_offset + 1)
        elif self.index.entries:
            self._set_end(self.size, last_off + 1)
        for b in batches:
            if b.max_timestamp > ts:
                ts, ts_off = b.max_timestamp, b.last_offset
        st.max_timestamp, st.offset_of_max_timestamp = ts, ts_off
        # Bytes since the last index entry: the entry's batch and everything after it.
        st.bytes_since_index = self.size - pos if self.index.entries else self.size
        st.sync_index()
        self._load_first_batch_ms()
        return True

    def _load_first_batch_ms(self):
        if self.size:
            _pos, size, _b, _l, max_ts = _native.seek_batch(self.read_fd, 0, self.size, -1, INT64_MAX, INT64_MAX)
            if size:
                self._st.first_batch_ms = max_ts
                self._st.has_first = True

    def recover(self, min_offset: int):
        """Unclean load: CRC-scan the whole file, truncate at the first invalid batch, rebuild
        both indexes. Returns (batches, bytes_truncated), batches the scanned headers (native
        BatchInfo, ``position`` = file position)."""
        STATS["recovery_scans"] += 1
        STATS["recovery_bytes_scanned"] += self.size
        valid_end, batches, reason = _native.scan_batches(
            self.read_fd, 0, self.size, self.base_offset, min_offset, True)
        if self._restamp(batches):
            valid_end, batches, reason = _native.scan_batches(
                self.read_fd, 0, self.size, self.base_offset, min_offset, True)
        self.index.reset()
        self.time_index.reset()
        self._forget_tail()
        truncated = self.size - valid_end
        if truncated:
            self._truncate_file(valid_end)
            STATS["bytes_truncated"] += truncated
        st = self._st
        self._set_end(self.size, self.base_offset)
        st.max_timestamp = -1
        st.offset_of_max_timestamp = self.base_offset
        st.bytes_since_index = 0
        st.sync_index()
        add = st.add_batch
        for b in batches:
            add(b.position, b.size, b.last_offset, b.max_timestamp)
        if batches:
            self._set_end(self.size, batches[-1].last_offset + 1)
        if not self.active:
            # A closed segment keeps Kafka's roll-time shape: final time entry, trimmed files.
            self._final_time_entry()
            self.index.trim()
            self.time_index.trim()
            st.sync_index()
        self._load_first_batch_ms()
        return batches, truncated

    def _restamp(self, batches) -> int:
        """Set the maxTimestamp of CreateTime batches stored with -1 (brokers before the leader
        set it from the records kept what clients such as Sarama send) to their records' largest
        timestamp, CRC rewritten, in the file: the time index, ListOffsets by time and time
        retention read it. Returns how many batches changed."""
        from ..record import decode_records

        fixed = 0
        fd = -1
        try:
            for b in batches:
                if not _unstamped(b):
                    continue
                raw = bytearray(os.pread(self.read_fd, b.size, b.position))
                want = max((r[1] for r in decode_records(raw)), default=-1)
                if want < 0:
                    continue
                struct.pack_into(">q", raw, _OFF_MAX_TIMESTAMP, want)
                struct.pack_into(">I", raw, _OFF_CRC, crc32c(memoryview(raw)[_CRC_START:]))
                if fd < 0:
                    fd = os.open(self.log_path, os.O_WRONLY)
                os.pwrite(fd, raw[_OFF_CRC:_OFF_MAX_TIMESTAMP + 8], b.position + _OFF_CRC)
                fixed += 1
            if fd >= 0:
                os.fsync(fd)
        finally:
            if fd >= 0:
                os.close(fd)
        if fixed:
            _log.info("%s: set the max timestamp of %d batch(es) stored with -1 from their records",
                      self.log_path, fixed)
        return fixed

    def headers(self, start_position: int = 0):
        """Header-only walk (no CRC) of the batches from ``start_position``; used to rebuild
        producer state on a clean start."""
        _end, batches, _reason = _native.scan_batches(
            self.read_fd, start_position, self.size, self.base_offset, self.base_offset, False)
        return batches

    # -- append ---------------------------------------------------------------------------

    def should_roll(self, batch_size: int, last_offset: int, max_timestamp: int, now_ms: int,
                    segment_bytes: int, segment_ms: int) -> bool:
        """Kafka's roll rule, checked before appending a batch: the batch does not fit in
        segment.bytes, segment.ms has passed, an index is full, or the last offset is past the u32
        relative range. segment.ms is measured in record time when the segment has a first-batch
        timestamp (the incoming batch's max timestamp minus it), else in wall time since the
        segment was created: replaying old records must not roll a segment per batch."""
        return self._st.should_roll(batch_size, last_offset, max_timestamp, now_ms, segment_bytes, segment_ms)

    def append(self, buf, base_offset: int, last_offset: int, max_timestamp: int) -> None:
        """Write one stamped batch (a single write) and maintain the sparse indexes.

        On a write error the partial bytes are truncated away and LogAppendError
        (KAFKA_STORAGE_ERROR) is raised; the segment is then exactly as before."""
        position = self.size
        try:
            n = _native.write_all(self._append_fd, buf)
        except OSError as e:
            self.write_failed(e)
        self._st.commit(position, n, last_offset, max_timestamp)

    def append_leader(self, buf, leader_epoch: int, max_message_bytes: int, append_time: int,
                      compacted: bool, prevalidated: bool, segment_bytes: int, segment_ms: int, now_ms: int):
        """A leader's append at ``next_offset`` in one native call (SegmentState.append_leader):
        check, stamp and write one producer batch, with ``should_roll``'s rule decided on the
        checked header, then size, next offset, indexes and the recent-batch list moved. -> None
        when the segment must roll first (nothing stamped or written); else the stamped header
        (BatchInfo), ``position`` -1 for an idempotent batch (stamped, not roll-checked nor
        written: the caller checks it against producer state, then rolls if due and writes with
        ``append``). Raises BatchError for a refused batch and LogAppendError as ``append`` for a
        failed write. (Log.append_as_leader calls the native method itself.)"""
        try:
            return self._st.append_leader(buf, leader_epoch, max_message_bytes, append_time, compacted,
                                          prevalidated, segment_bytes, segment_ms, now_ms)
        except OSError as e:
            self.write_failed(e)

    def write_failed(self, e: OSError):
        """After a failed append write: cut the partial bytes back to ``size`` (the state is as
        before the write) and raise LogAppendError (KAFKA_STORAGE_ERROR)."""
        self._truncate_file(self.size)
        raise LogAppendError(KAFKA_STORAGE_ERROR, f"write to {self.log_path} failed: {e.strerror}") from e

    def write_bytes(self, buf) -> int:
        """The write of ``append`` alone, for a writer thread (GIL released in write_all); the
        loop then calls committed_write, or truncates the partial bytes away on OSError."""
        return _native.write_all(self._append_fd, buf)

    def committed_write(self, position: int, n: int, last_offset: int, max_timestamp: int) -> None:
        """The in-memory part of ``append`` once write_bytes wrote ``n`` bytes at ``position``."""
        self._st.commit(position, n, last_offset, max_timestamp)

    def append_batches(self, buf, infos) -> None:
        """Write already-stamped batches (a follower's copy of the leader's bytes) with one
        write and index each batch as ``append`` would. ``infos`` are the batches' headers
        (native BatchInfo, positions relative to ``buf``), contiguous from position 0."""
        position = self.size
        try:
            n = _native.write_all(self._append_fd, buf)
        except OSError as e:
            self.write_failed(e)
        self._st.commit_batches(position, n, infos if type(infos) is list else list(infos))

    def truncate_to(self, offset: int) -> int:
        """Remove the batch holding ``offset`` and everything after it (follower truncation).
        Returns the bytes removed; the segment's next offset becomes that batch's base."""
        r = self.translate_offset(offset)
        if r is None:
            return 0
        position, _size, batch_base = r[0], r[1], r[2]
        removed = self.size - position
        self.cut(position, batch_base)
        return removed

    def cut(self, position: int, batch_base: int) -> None:
        """Drop everything from the batch at file ``position`` (base offset ``batch_base``) on:
        file, indexes, and the state re-derived from what is left (truncate_to's work once the
        batch is found; also the unwind of deferred bytes that could not be written)."""
        self.index.truncate_to_offset(batch_base)
        self.time_index.truncate_to_offset(batch_base)
        self._truncate_file(position)
        # Re-derive next offset, max timestamp and bytes-since-index from what is left.
        st = self._st
        self._set_end(self.size, self.base_offset)
        st.max_timestamp = -1
        st.offset_of_max_timestamp = self.base_offset
        st.has_first = False
        st.sync_index()
        if not self.load():
            self.recover(self.base_offset)

    def _forget_tail(self) -> None:
        self._st.forget_tail()
        read_blocks.forget(self)

    def _truncate_file(self, size: int) -> None:
        self._forget_tail()
        fd = self._append_fd if self._append_fd >= 0 else os.open(self.log_path, os.O_WRONLY)
        try:
            os.ftruncate(fd, size)
        finally:
            if fd != self._append_fd:
                os.close(fd)
        self.size = self._st.size = size

    # -- read -----------------------------------------------------------------------------

    def translate_offset(self, offset: int, start_position: int = 0):
        """(position, size, base_offset, last_offset, max_timestamp) of the first batch whose
        last offset >= ``offset``, or None when the segment has no such batch."""
        _off, pos = self.index.lookup(offset)
        r = _native.seek_batch(self.read_fd, max(pos, start_position), self.size,
                               offset, INT64_MAX, INT64_MAX)
        return r if r[1] else None

    def batch_position(self, offset: int, start_position: int = 0) -> int:
        """translate_offset's position alone (-1 for none), from the recent-batch list when it
        covers ``offset``, else from the read block, else from the index and the file."""
        if offset > self._tail_floor:
            pos = self._st.tail_position(offset, start_position)
            if pos != -2:
                return pos                  # -1: past the last batch
        block = read_blocks.get(self)
        if block is not None and offset > block.floor:
            # Every batch before the block's first ends at or below its floor: walk the block (from the
            # batch found last time when the offset is past it: a reader moving on walks one header),
            # and on into the next block of the file when the batch lies just past this one.
            walk = block.cursor if offset > block.cursor_floor else block.pos
            r = _native.seek_batch_in(block.data, block.pos, walk, self.size, offset, INT64_MAX)
            if not r[1] and r[0] + _HEADER <= self.size:
                block = read_blocks.load(self, self.read_fd, r[0], self.size)
                r = _native.seek_batch_in(block.data, block.pos, r[0], self.size, offset, INT64_MAX)
            if r[1]:
                block.cursor = r[0]
                block.cursor_floor = r[2] - 1
                if r[0] >= start_position:
                    return r[0]
            elif r[0] + _HEADER > self.size:
                return -1                   # past the last batch
        r = self.translate_offset(offset, start_position)
        return -1 if r is None else r[0]

    def read_bytes(self, start: int, length: int):
        """The file's bytes [start, start + length) (a range a read just placed below ``size``) from
        the read block, reading a new block at ``start`` when it does not hold them; None when the
        range is larger than a block (the caller sends it from the file)."""
        block = read_blocks.holding(self, self.read_fd, start, length, self.size)
        if block is None:
            return None                     # too large, no blocks, or cut underneath: the caller's pread
        i = start - block.pos
        return memoryview(block.data)[i:i + length]

    def end_position(self, start: int, max_bytes: int, max_offset: int, min_one_batch: bool) -> int:
        """Where a read starting at batch boundary ``start`` ends: only whole batches, none
        with last offset >= ``max_offset``, at most ``max_bytes`` unless ``min_one_batch`` lets
        the first batch through whole (KIP-74)."""
        end = self.size
        if max_offset < self.next_offset:
            pos = self.batch_position(max_offset, start)
            if pos >= 0:
                end = pos
        if end - start > max_bytes:
            limit = start + max_bytes
            # Batch boundaries from the recent-batch list: the last one at or below the limit.
            if start >= self._tail_start:
                byte_end = self._st.tail_end(start, limit, min_one_batch)
                if byte_end != -2:
                    return end if end < byte_end else byte_end
            block = read_blocks.get(self)
            if block is not None or (read_blocks.limit and max_bytes < READ_BLOCK):
                # Batch boundaries from the read block: the first batch crossing the limit. A small
                # read (its bytes will be copied from a block) reads a block at ``start`` when none
                # holds the limit's batch; a large one (sent with sendfile) walks the file as before.
                if block is None or start < block.pos or (limit + _HEADER > block.pos + len(block.data)
                                                          and block.pos + len(block.data) < end):
                    block = (read_blocks.load(self, self.read_fd, start, self.size)
                             if max_bytes < READ_BLOCK else None)
                r = (start, 0) if block is None else _native.seek_batch_in(
                    block.data, block.pos, start, end, INT64_MAX, limit)
                if r[1]:
                    byte_end = r[0]
                    if byte_end == start and min_one_batch:
                        byte_end = start + r[1]
                    return end if end < byte_end else byte_end
            _off, pos = self.index.lookup_position(limit)
            r = _native.seek_batch(self.read_fd, max(pos, start), end, INT64_MAX, limit, INT64_MAX)
            byte_end = r[0]
            if byte_end == start and min_one_batch:
                byte_end = start + r[1]
            end = min(end, byte_end)
        return end

    def find_timestamp(self, timestamp: int, min_offset: int = 0, position: int | None = None):
        """(base_offset, max_timestamp, position, size) of the first batch whose max timestamp
        >= ``timestamp``, searched from the batch holding ``min_offset`` (the log start) or later, or
        from byte ``position`` (the batch after one that held no record wanted); None if none."""
        if position is None:
            _ts, off = self.time_index.lookup(timestamp)
            _o, position = self.index.lookup(max(off, min_offset))
        r = _native.seek_batch(self.read_fd, position, self.size, INT64_MAX, INT64_MAX, timestamp)
        return (r[2], r[4], r[0], r[1]) if r[1] else None

    @property
    def largest_timestamp(self) -> int:
        """For time retention: the greatest batch timestamp, or the file's mtime if none."""
        if self.max_timestamp >= 0:
            return self.max_timestamp
        return int(os.stat(self.log_path).st_mtime * 1000)

    # -- lifecycle ------------------------------------------------------------------------

    def _final_time_entry(self) -> None:
        st = self._st
        if st.max_timestamp >= 0:
            try:
                self.time_index.maybe_append(st.max_timestamp, st.offset_of_max_timestamp)
            except OSError:
                pass        # optional entry; the time index stays valid without it
            st.sync_index()

    def on_become_inactive(self) -> None:
        """On roll: final time-index entry, trim both indexes, close the append descriptor."""
        self._forget_tail()
        self._final_time_entry()
        self.index.trim()
        self.time_index.trim()
        self._st.sync_index()
        if self._append_fd >= 0:
            os.close(self._append_fd)
            self._set_append_fd(-1)

    def flush(self) -> None:
        os.fsync(self._append_fd if self._append_fd >= 0 else self.read_fd)
        self.index.flush()
        self.time_index.flush()

    def close(self, trim: bool = True) -> None:
        """Trim indexes and close every descriptor (clean shutdown); ``trim=False`` when the
        files are already gone (partition deleted)."""
        read_blocks.forget(self)
        if trim and self.active:
            self._final_time_entry()
        self.index.close(trim)
        self.time_index.close(trim)
        if self._append_fd >= 0:
            os.close(self._append_fd)
            self._set_append_fd(-1)
        if self.read_fd >= 0:
            os.close(self.read_fd)
            self.read_fd = -1

    def mark_deleted(self) -> None:
        """Rename the files to ``.deleted``; descriptors stay open so in-flight sendfiles on
        ``read_fd`` finish (the fd number cannot be reused until ``close``)."""
        self.index.close(trim=False)
        self.time_index.close(trim=False)
        if self._append_fd >= 0:
            os.close(self._append_fd)
            self._set_append_fd(-1)
        for path in (self.log_path, self.index.path, self.time_index.path):
            if os.path.exists(path):
                os.replace(path, path + ".deleted")
        self.deleted = True

    def remove(self) -> None:
        """Close the read descriptor and unlink the ``.deleted`` files."""
        read_blocks.forget(self)
        if self.read_fd >= 0:
            os.close(self.read_fd)
            self.read_fd = -1
        for path in (self.log_path, self.index.path, self.time_index.path):
            # Once renamed, the plain name may already belong to a compacted replacement.
            for p in (path + ".deleted",) if self.deleted else (path + ".deleted", path):
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
