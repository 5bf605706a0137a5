"""Sparse offset and time indexes of one log segment (Kafka-compatible files).

Formats (big-endian, fixed-size entries, no header):
- ``%020d.index``: 8-byte entries ``relative offset u32 | position u32``. An entry says "the
  batch whose last offset is base+relative starts at byte ``position`` of the .log"; entries are
  sparse (one per index.interval.bytes of log), relative offsets strictly increase.
- ``%020d.timeindex``: 12-byte entries ``timestamp i64 | relative offset u32``: the greatest
  timestamp seen in the segment up to and including that offset. Timestamps never decrease.

The active segment's index files are preallocated (sparse) to segment.index.bytes; entries are
written with pwrite and read through a read-only shared mmap, so a full disk costs a skipped
entry (harmless: the index is sparse) rather than a SIGBUS. On roll and on close the files are
trimmed to their entries. Lookups are a native binary search (``segment.index_lookup``); the
append rule is the native ``IndexFile`` these classes extend (the leader's append path calls it
directly), and the Python methods here only say why it refused an entry.

Threads: the event-loop thread appends and looks up; nothing here blocks beyond page faults.

Crash: the files carry no checksum. A crash can leave an index untrimmed (a zero-filled tail)
or behind the log. Loading keeps only the longest well-formed prefix (``valid_entries``); the
owner compares it with the file and, for segments that recovery scans, resets and rebuilds the
index from the log, which is always the source of truth.
"""
import mmap
import os

from kbroker._native import segment as _native

from .errors import CorruptIndexError

_ADDED = int(_native.IndexAppend.INDEX_ADDED)
_REFUSED = int(_native.IndexAppend.INDEX_REFUSED)


class _Index(_native.IndexFile):
    # base_offset, entries, max_entries, writable, fd (kept open while writable), mm: IndexFile's
    __slots__ = ("path", "max_index_bytes", "file_entries")
    ENTRY_SIZE = 0
    KIND = 0

    def __init__(self, path: str, base_offset: int, max_index_bytes: int, writable: bool,
                 max_position: int = 1 << 32):
        self.path = path
        self.base_offset = base_offset
        self.max_index_bytes = max_index_bytes
        self.writable = False
        esize = self.ENTRY_SIZE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            file_len = os.fstat(fd).st_size
            file_entries = file_len // esize
            size = file_entries * esize
            # Only look at the allocated prefix: a crash leaves the sparse preallocation in
            # place, and on tmpfs even *reading* a hole through mmap allocates a page (SIGBUS
            # on a full filesystem). Holes hold no entries anyway.
            try:
                data_end = os.lseek(fd, 0, os.SEEK_HOLE) if file_len else 0
            except OSError:
                data_end = file_len
            self.max_entries = file_entries
            if size:
                self.mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        # A crash can leave zero-filled preallocation after the real entries: keep the
        # well-formed prefix and remember whether that was the whole file.
        scan = min(file_entries, data_end // esize)
        self.entries = (_native.index_valid_entries(self.mm, scan, self.KIND, max_position)
                        if scan else 0)
        self.file_entries = file_entries
        if writable:
            self._remap(self._prealloc_size(max_index_bytes), True)
            self.file_entries = file_entries

    def _prealloc_size(self, max_index_bytes: int) -> int:
        return max(max_index_bytes // self.ENTRY_SIZE, self.entries, 1) * self.ENTRY_SIZE

    @property
    def sane(self) -> bool:
        """True when every entry in the file was well formed (a trimmed, clean index)."""
        return self.entries == self.file_entries

    @property
    def is_full(self) -> bool:
        return self.entries >= self.max_entries

    @property
    def size_bytes(self) -> int:
        return self.entries * self.ENTRY_SIZE

    def reset(self) -> None:
        """Drop every entry and reopen writable (recovery rebuilds the index from the log;
        truncating to 0 first clears any stale entries a crash left behind)."""
        self.entries = 0
        self._remap(0, False)
        self._remap(self._prealloc_size(self.max_index_bytes), True)

    def truncate_entries(self, n: int) -> None:
        if n < self.entries:
            if self.writable:
                os.pwrite(self.fd, bytes((self.entries - n) * self.ENTRY_SIZE), n * self.ENTRY_SIZE)
            self.entries = n
            if not self.writable:
                self.trim()

    def make_writable(self, max_index_bytes: int) -> None:
        """Reopen a trimmed index for appends (the last segment becomes active again)."""
        if not self.writable:
            self._remap(self._prealloc_size(max_index_bytes), True)

    def trim(self) -> None:
        """Shrink the file to its entries and close the writer (on roll and on close)."""
        self._remap(self.entries * self.ENTRY_SIZE, False)

    def _remap(self, size: int, writable: bool) -> None:
        # The mapping is always read-only: entries are written with pwrite, so a full disk
        # is an ENOSPC error on that write (the entry is skipped: the index is sparse) instead
        # of a SIGBUS from touching an unallocated page of the sparse preallocated file.
        if self.mm is not None:
            self.mm.close()
            self.mm = None
        fd = self.fd if self.fd >= 0 else os.open(self.path, os.O_RDWR)
        self.fd = -1
        try:
            os.ftruncate(fd, size)
            if size:
                self.mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        except BaseException:
            os.close(fd)
            raise
        if writable:
            self.fd = fd
        else:
            os.close(fd)
        self.writable = writable
        self.max_entries = size // self.ENTRY_SIZE
        self.file_entries = self.entries

    def flush(self) -> None:
        if self.fd >= 0:
            os.fsync(self.fd)

    def close(self, trim: bool = True) -> None:
        if trim and self.writable:
            self.trim()
        if self.mm is not None:
            self.mm.close()
            self.mm = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def rename(self, new_path: str) -> None:
        os.replace(self.path, new_path)
        self.path = new_path

    def _refused(self, what: str) -> CorruptIndexError:
        # why IndexFile refused an entry: its room checks, else ``what`` (the entry's own fault)
        if not self.writable:
            what = "append to a read-only index"
        elif self.entries >= self.max_entries:
            what = f"index is full ({self.entries} entries)"
        return CorruptIndexError(f"{self.path}: {what}")


class OffsetIndex(_Index):
    """``%020d.index``: relative offset u32 + position u32 per entry."""

    __slots__ = ()
    ENTRY_SIZE = 8
    KIND = _native.INDEX_OFFSET

    def append(self, offset: int, position: int) -> None:
        """Add an entry for the batch whose last offset is ``offset`` starting at ``position``.
        CorruptIndexError when the rule refuses it; OSError when the write failed (not added)."""
        if self.add_offset_entry(offset, position) == _ADDED:
            return
        last = self.last_entry()[0]
        if self.entries and offset <= last:
            raise self._refused(f"offset {offset} not above the last entry {last}")
        raise self._refused(f"entry ({offset}, {position}) does not fit 32 bits from base {self.base_offset}")

    def last_entry(self):
        """(offset, position) of the last entry, or (base_offset, 0) when empty."""
        if not self.entries:
            return self.base_offset, 0
        rel, pos = _native.offset_entry(self.mm, self.entries - 1)
        return self.base_offset + rel, pos

    def entry(self, slot: int):
        rel, pos = _native.offset_entry(self.mm, slot)
        return self.base_offset + rel, pos

    def lookup(self, offset: int):
        """(offset, position) of the greatest entry with offset <= ``offset``; (base, 0) if none."""
        slot = _native.index_lookup(self.mm, self.entries, _native.INDEX_OFFSET,
                                    offset - self.base_offset) if self.entries else -1
        if slot < 0:
            return self.base_offset, 0
        return self.entry(slot)

    def lookup_position(self, position: int):
        """(offset, position) of the greatest entry whose position <= ``position``; (base, 0) if none."""
        slot = _native.index_lookup(self.mm, self.entries, _native.INDEX_POSITION,
                                    position) if self.entries else -1
        if slot < 0:
            return self.base_offset, 0
        return self.entry(slot)

    def truncate_to_offset(self, offset: int) -> None:
        """Drop entries for offsets >= ``offset``."""
        slot = _native.index_lookup(self.mm, self.entries, _native.INDEX_OFFSET,
                                    offset - self.base_offset - 1) if self.entries and offset > self.base_offset else -1
        self.truncate_entries(slot + 1)


class TimeIndex(_Index):
    """``%020d.timeindex``: timestamp i64 + relative offset u32 per entry."""

    __slots__ = ()
    ENTRY_SIZE = 12
    KIND = _native.INDEX_TIME

    def last_entry(self):
        """(timestamp, offset) of the last entry, or (-1, base_offset) when empty."""
        if not self.entries:
            return -1, self.base_offset
        ts, rel = _native.time_entry(self.mm, self.entries - 1)
        return ts, self.base_offset + rel

    def entry(self, slot: int):
        ts, rel = _native.time_entry(self.mm, slot)
        return ts, self.base_offset + rel

    def maybe_append(self, timestamp: int, offset: int) -> bool:
        """Add (timestamp, offset) if the timestamp is above the last entry's (Kafka keeps the
        time index strictly increasing in timestamp). Returns whether an entry was added.
        CorruptIndexError when the rule refuses it; OSError when the write failed (not added)."""
        answer = self.add_time_entry(timestamp, offset)
        if answer != _REFUSED:
            return answer == _ADDED
        last_off = self.last_entry()[1]            # base_offset when empty
        if offset < last_off:
            raise CorruptIndexError(f"{self.path}: offset {offset} below the last entry {last_off}")
        raise self._refused(f"offset {offset} does not fit 32 bits from base {self.base_offset}")

    def lookup(self, timestamp: int):
        """(timestamp, offset) of the greatest entry with timestamp <= ``timestamp``;
        (-1, base_offset) if none."""
        slot = _native.index_lookup(self.mm, self.entries, _native.INDEX_TIME,
                                    timestamp) if self.entries else -1
        if slot < 0:
            return -1, self.base_offset
        return self.entry(slot)

    def truncate_to_offset(self, offset: int) -> None:
        """Drop entries for offsets >= ``offset``."""
        n = self.entries
        while n and self.entry(n - 1)[1] >= offset:
            n -= 1
        self.truncate_entries(n)
