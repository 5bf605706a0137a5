"""Segment byte work for kbroker.log: appends, sparse-index search, batch walks.

Contract
- Files: a segment `.log` is RecordBatch v2 batches back to back (61-byte header, layout.pxd);
  `.index` entries are 8 bytes (relative offset u32, position u32),
  `.timeindex` entries 12 bytes (timestamp i64, relative offset u32), all big-endian.
- Threads: every function here may be called from any thread; the byte loops (write, pread,
  CRC, binary search) run without the GIL. The callers in kbroker.log own the state and call
  from the broker's event-loop thread.
- State: LogState / SegmentState mirror the state the kbroker.log objects own (those objects hold
  them and keep the policy); the files stay the truth: a crash mid-call leaves at most a partial
  write, which the caller truncates away (append) or the recovery scan cuts off (restart). A
  write-behind run (run_begin .. run_end, LeaderAppender) defers writes: batches committed inside
  it are written by run_end, which its caller (kbroker._native.request dispatch_frames) reaches
  before any answer of the run is sent and before the buffers holding them can be reused.

Parts
- append_leader: the leader's append in one call: the producer batch's checks (those of
  batch.validate_and_stamp, same codes and messages), the roll decision on the checked header, the
  stamp, the write (GIL released for large buffers). An idempotent batch comes back stamped but not
  written, so Log can answer a retried duplicate from producer state first.
- SegmentState: the active segment's append-time state (size, next offset, segment.ms clocks, max
  timestamp and its offset, bytes since the last index entry, the recent batches' (last offset,
  position)); LogSegment owns it and keeps roll, truncation and recovery. size / next_offset are
  written back to plain attributes so readers pay no call.
- LogState: the base class of Log; the fields the native Produce/Fetch read or write per request, as C
  fields; advance_hw is the one high-watermark rule.
- LeaderAppender, one per Log: the append limits read once per LogConfig object (a config change
  replaces the object) and the unflushed count; append = roll check + checks + stamp + write + state,
  returning the last offset or a code (roll, flush due, idempotent) for Log's Python code to finish.
- Write-behind (run_begin / run_end, on the thread that opened the run only): a plain append is
  stamped in the receive chunk and committed to the state at once; its bytes are written by run_end,
  one writev per log. Every other write path of the log writes pending bytes first. A failed write of
  deferred bytes cuts the log back to the first of them (Log._deferred_write_failed); which answers
  that makes wrong is request.pyx's lost.pxi. An idempotent batch is never deferred.
- ReadBlock / ReadBlocks: the process's typed cache of segment read blocks (one per segment, least
  recently used dropped, only bytes that never change until a cut), so small fetches copy from memory;
  seek_batch_in finds batch boundaries inside a block.
"""
cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.pythread cimport PyThread_get_thread_ident
from libc.errno cimport EINTR, errno
from libc.stdint cimport int16_t, int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy, memmove
from posix.types cimport off_t
from posix.uio cimport iovec, writev
from posix.unistd cimport pread, pwrite, write

from hton cimport load_be16, load_be32, load_be64, store_be32, store_be64
from layout cimport *

from kbroker._native.batch cimport BatchInfo, check_for_append, parse_header, stamp

# Header walks read this much at a time: a fetch or index translation walks at most about
# index.interval.bytes (4 KiB) of batches, so one read usually covers the whole walk.
cdef enum:
    WALK_CHUNK = 16384
# Recovery reads big chunks so CRC work dominates syscalls; a larger batch gets its own buffer.
cdef enum:
    SCAN_CHUNK = 1048576

# Relative offsets are stored as u32 but Kafka reads them as a signed int, so a segment
# spans at most INT32_MAX offsets (Kafka's canConvertToRelativeOffset).
cdef int64_t MAX_RELATIVE = 0x7FFFFFFF

cdef enum:                  # LeaderAppender.append's codes (a written batch's last offset is >= 0)
    CODE_ROLL = -1
    CODE_IDEMPOTENT = -2
    CODE_FLUSH_DUE = -3
APPEND_ROLL = CODE_ROLL
APPEND_IDEMPOTENT = CODE_IDEMPOTENT
APPENDED_FLUSH_DUE = CODE_FLUSH_DUE

# Kafka's "warm section": lookups near the tail (consumers at the head of the log) binary
# search only the last 8 KiB of the index, pages that stay resident.
cdef enum:
    WARM_BYTES = 8192

INDEX_OFFSET = 0     # .index keyed by relative offset
INDEX_POSITION = 1   # .index keyed by file position
INDEX_TIME = 2       # .timeindex keyed by timestamp

# Why a scan stopped (scan_batches' third result).
SCAN_OK = 0
SCAN_SHORT_HEADER = 1     # fewer than 61 bytes left: torn tail
SCAN_BAD_LENGTH = 2       # batchLength too small or runs past the end of the file
SCAN_BAD_MAGIC = 3
SCAN_BAD_CRC = 4
SCAN_BAD_OFFSET = 5       # offsets not increasing, or out of the segment's u32 range
SCAN_IO_ERROR = 6


cdef object _os_error(int err):
    # OSError for an errno that a GIL-free helper returned (errno itself may have changed since)
    import os
    return OSError(err, os.strerror(err))


cdef int _write_full(int fd, const char *p, Py_ssize_t left) noexcept nogil:
    # 0, or the errno that stopped it (bytes written until then stay: the caller truncates).
    cdef Py_ssize_t n
    while left > 0:
        n = write(fd, p, <size_t>left)
        if n < 0:
            if errno == EINTR:
                continue
            return errno
        if n == 0:              # no progress and no error: treat like a full disk
            return 28           # ENOSPC
        p += n
        left -= n
    return 0


cdef enum:
    IOV_BATCH = 1024            # IOV_MAX on Linux: iovecs per writev call


cdef int _writev_full(int fd, iovec *iov, Py_ssize_t cnt) noexcept nogil:
    # _write_full for ``cnt`` iovecs (consumed: a short write advances them in place).
    cdef Py_ssize_t n
    while cnt > 0:
        n = writev(fd, iov, <int>(cnt if cnt < IOV_BATCH else IOV_BATCH))
        if n < 0:
            if errno == EINTR:
                continue
            return errno
        if n == 0:
            return 28           # ENOSPC
        while cnt > 0 and n >= <Py_ssize_t>iov[0].iov_len:
            n -= <Py_ssize_t>iov[0].iov_len
            iov += 1
            cnt -= 1
        if n > 0:
            iov[0].iov_base = <char *>iov[0].iov_base + n
            iov[0].iov_len -= <size_t>n
    return 0


def write_all(int fd, buf):
    """Write all of ``buf`` to ``fd`` (retrying short writes and EINTR) without the GIL.

    Returns the number of bytes written (== len(buf)). Raises OSError on failure; bytes
    already written by then stay in the file and the caller must truncate them away."""
    cdef Py_buffer view
    cdef int err
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        with nogil:
            err = _write_full(fd, <const char *>view.buf, view.len)
        if err:
            raise _os_error(err)
        return view.len
    finally:
        PyBuffer_Release(&view)


# A batch this large is checked, stamped and written without the GIL; a smaller one's work (a few
# hundred ns plus one write) costs less than handing the GIL over and back.
cdef enum:
    NOGIL_APPEND_BYTES = 4096


def append_leader(int fd, buf, int64_t position, int64_t base_offset, int32_t leader_epoch,
                  int64_t max_message_bytes, int64_t log_append_time_ms, bint compacted,
                  bint prevalidated, int64_t room, int64_t max_timestamp_limit,
                  int64_t last_offset_limit):
    """A leader's append of one producer batch in one call: check it (batch.validate_and_stamp's
    checks, BatchError with its codes), decide whether the active segment must roll first, stamp
    baseOffset / partitionLeaderEpoch (and LogAppendTime) in place and write it to ``fd`` (the
    segment's O_APPEND descriptor, whose file is ``position`` bytes long).

    Roll rule (LogSegment.should_roll): the segment rolls when the batch is larger than ``room``
    (its bytes left; -1 forces a roll), its max timestamp (the append time when stamped so) is past
    ``max_timestamp_limit``, or its last offset past ``last_offset_limit``. Then nothing is
    stamped or written and None is returned: roll and call again.

    An idempotent batch (producerId >= 0) is checked and stamped, neither roll-checked nor
    written: -> its BatchInfo with ``position`` -1; the caller checks it against producer state,
    then rolls and writes as for any batch. Otherwise -> the stamped header as a BatchInfo whose
    ``position`` is where it was written. Raises
    OSError when the write fails (bytes already written stay: truncate back to ``position``)."""
    return _append_leader(fd, buf, position, base_offset, leader_epoch, max_message_bytes,
                          log_append_time_ms, compacted, prevalidated, room, max_timestamp_limit,
                          last_offset_limit)


cdef object _append_leader(int fd, object buf, int64_t position, int64_t base_offset,
                           int32_t leader_epoch, int64_t max_message_bytes, int64_t log_append_time_ms,
                           bint compacted, bint prevalidated, int64_t room, int64_t max_timestamp_limit,
                           int64_t last_offset_limit):
    # append_leader's work; SegmentState.append_leader calls it with the limits it derives itself.
    cdef Appended out
    return _append_leader_into(fd, buf, position, base_offset, leader_epoch, max_message_bytes,
                               log_append_time_ms, compacted, prevalidated, room, max_timestamp_limit,
                               last_offset_limit, &out, True, False)


cdef object _append_leader_into(int fd, object buf, int64_t position, int64_t base_offset,
                                int32_t leader_epoch, int64_t max_message_bytes, int64_t log_append_time_ms,
                                bint compacted, bint prevalidated, int64_t room, int64_t max_timestamp_limit,
                                int64_t last_offset_limit, Appended *out, bint want_info, bint defer):
    # -> an idempotent batch's stamped header (position -1, not written), else ``out`` filled
    # (size -1: roll first) and None, or, with ``want_info``, the written batch's header. With
    # ``defer`` the batch is stamped, not written: the caller writes ``out.data`` itself.
    cdef Py_buffer view
    cdef char *p
    cdef Py_ssize_t n
    cdef BatchInfo info
    PyObject_GetBuffer(buf, &view, PyBUF_WRITABLE)
    try:
        p = <char *>view.buf
        n = view.len
        check_for_append(p, n, buf, max_message_bytes, compacted, prevalidated)
        # Checked: the batch fills the buffer exactly.
        if <int64_t>load_be64(p + OFF_PRODUCER_ID) >= 0:
            # A retried duplicate is answered from producer state: it must neither be written
            # nor roll the segment, so the caller decides both.
            stamp(p, n, base_offset, leader_epoch, log_append_time_ms)
            info = parse_header(p, 0)
            info.position = -1
            return info
        if _roll_first(p, n, base_offset, log_append_time_ms, room, max_timestamp_limit, last_offset_limit,
                       out):
            out.size = -1
            return None
        _stamp_write(fd, p, n, base_offset, leader_epoch, log_append_time_ms, defer, out)
        return parse_header(p, <Py_ssize_t>position) if want_info else None
    finally:
        PyBuffer_Release(&view)


cdef inline bint _roll_first(const char *p, Py_ssize_t n, int64_t base_offset, int64_t log_append_time_ms,
                             int64_t room, int64_t max_timestamp_limit, int64_t last_offset_limit,
                             Appended *out) noexcept:
    # the roll rule on a checked batch (``out``: its last offset and max timestamp as stamped)
    _limits(p, base_offset, log_append_time_ms, out)
    return n > room or out.max_timestamp > max_timestamp_limit or out.last_offset > last_offset_limit


cdef inline void _limits(const char *p, int64_t base_offset, int64_t log_append_time_ms,
                         Appended *out) noexcept:
    out.max_timestamp = (log_append_time_ms if log_append_time_ms >= 0
                         else <int64_t>load_be64(p + OFF_MAX_TIMESTAMP))
    out.last_offset = base_offset + <int32_t>load_be32(p + OFF_LAST_OFFSET_DELTA)


cdef int _stamp_write(int fd, char *p, Py_ssize_t n, int64_t base_offset, int32_t leader_epoch,
                      int64_t log_append_time_ms, bint defer, Appended *out) except -1:
    # stamp a checked batch that needs no roll and write it (with ``defer``: only stamp it);
    # ``out`` completed. OSError when the write failed.
    cdef int err = 0
    if defer:
        stamp(p, n, base_offset, leader_epoch, log_append_time_ms)
    elif n >= NOGIL_APPEND_BYTES:
        with nogil:
            stamp(p, n, base_offset, leader_epoch, log_append_time_ms)
            err = _write_full(fd, p, n)
    else:
        stamp(p, n, base_offset, leader_epoch, log_append_time_ms)
        err = _write_full(fd, p, n)
    if err:
        raise _os_error(err)
    out.size = n
    out.record_count = <int32_t>load_be32(p + OFF_RECORDS_COUNT)
    out.data = p
    return 0


# ----------------------------------------------------------------------------------------
# Active segment state (segment.pxd)

cdef int64_t _I64_MAX = 0x7FFFFFFFFFFFFFFF


cdef class SegmentState:
    """The in-memory state of one segment that appends move: size, next offset, the roll clocks
    (creation time, first batch's timestamp), the greatest timestamp and its offset, bytes since
    the last index entry, whether an index is full, and the recent batches' (last offset, position)
    list that tail reads search. LogSegment keeps ``size`` and ``next_offset`` as its own attributes
    too (readers use them on every fetch); every native change writes both back to the owner. So
    that a read the list cannot answer costs no call, the owner also holds ``_tail_floor`` (the last
    offset before the list, INT64_MAX when it is empty) and ``_tail_start`` (its first position,
    INT64_MAX when empty), rewritten when they change (after an empty list, and every
    ``tail_batches`` appends when the older half is dropped).

    Index entries are added through the owner's OffsetIndex/TimeIndex objects (once per
    index.interval.bytes, so their Python cost is spread over many appends); ``index_full`` is a
    cached "either index is full" the owner refreshes with ``sync_index`` after changing an index
    itself (reset, truncation, trim, reopen). Event-loop thread only."""

    def __cinit__(self, owner, index, time_index, int64_t base_offset, int64_t index_interval_bytes,
                  int64_t created_ms, Py_ssize_t tail_batches):
        self.fd = -1
        self.owner = owner
        self.index = index
        self.time_index = time_index
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.size = 0
        self.next_offset = base_offset
        self.created_ms = created_ms
        self.has_first = False
        self.first_batch_ms = -1
        self.max_timestamp = -1
        self.offset_of_max_timestamp = base_offset
        self.bytes_since_index = 0
        self.index_full = False
        self.tail_floor = base_offset - 1
        self.tail_n = 0
        self.tail_half = tail_batches if tail_batches > 0 else 0
        self.tail_last = NULL
        self.tail_pos = NULL
        if self.tail_half:
            self.tail_last = <int64_t *>malloc(sizeof(int64_t) * 2 * self.tail_half)
            self.tail_pos = <int64_t *>malloc(sizeof(int64_t) * 2 * self.tail_half)
            if self.tail_last == NULL or self.tail_pos == NULL:
                raise MemoryError()

    def __dealloc__(self):
        free(self.tail_last)
        free(self.tail_pos)

    def sync_index(self):
        """Refresh ``index_full`` from the index objects (after the owner changed one)."""
        idx = self.index
        tix = self.time_index
        self.index_full = idx.entries >= idx._max_entries or tix.entries >= tix._max_entries

    cdef int index_batch(self, int64_t position, int64_t size, int64_t last_offset,
                         int64_t max_timestamp) except -1:
        # Kafka's LogSegment.append after the write: recent-batch list, max timestamp, and an
        # index entry when more than index.interval.bytes were written since the last one
        # (before this batch). Called before next_offset moves past the batch.
        cdef Py_ssize_t h = self.tail_half
        cdef bint moved = False
        if h:
            if self.tail_n == 0:
                self.tail_floor = self.next_offset - 1
                moved = True
            elif self.tail_n >= 2 * h:
                self.tail_floor = self.tail_last[h - 1]
                memmove(self.tail_last, self.tail_last + h, sizeof(int64_t) * h)
                memmove(self.tail_pos, self.tail_pos + h, sizeof(int64_t) * h)
                self.tail_n = h
                moved = True
            self.tail_last[self.tail_n] = last_offset
            self.tail_pos[self.tail_n] = position
            self.tail_n += 1
            if moved:
                self.publish_tail()
        if max_timestamp > self.max_timestamp:
            self.max_timestamp = max_timestamp
            self.offset_of_max_timestamp = last_offset
        if self.bytes_since_index > self.index_interval_bytes:
            try:
                self.index.append(last_offset, position)
                self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
                self.bytes_since_index = 0
            except OSError:
                # Disk full or failing under the index: the batch itself is written, and a sparse
                # index without this entry is still correct (lookups scan a bit more).
                pass
            self.sync_index()
        self.bytes_since_index += size
        return 0

    cdef int publish_tail(self) except -1:
        owner = self.owner
        if self.tail_n:
            owner._tail_floor = self.tail_floor
            owner._tail_start = self.tail_pos[0]
        else:
            owner._tail_floor = _I64_MAX
            owner._tail_start = _I64_MAX
        return 0

    cdef int committed(self, int64_t position, int64_t n, int64_t last_offset,
                       int64_t max_timestamp) except -1:
        # State after ``n`` bytes of a batch ending at ``last_offset`` were written at ``position``.
        owner = self.owner
        self.size = position + n
        owner.size = self.size
        self.index_batch(position, n, last_offset, max_timestamp)
        self.next_offset = last_offset + 1
        owner.next_offset = self.next_offset
        if not self.has_first:
            self.first_batch_ms = max_timestamp
            self.has_first = True
        return 0

    def commit(self, int64_t position, int64_t n, int64_t last_offset, int64_t max_timestamp):
        """The in-memory part of an append once its ``n`` bytes are written at ``position``."""
        self.committed(position, n, last_offset, max_timestamp)

    def commit_batches(self, int64_t position, int64_t n, list infos not None):
        """commit for ``n`` bytes of stamped batches written at ``position`` in one write;
        ``infos`` their headers (BatchInfo, positions relative to the write), in order."""
        cdef BatchInfo info
        cdef Py_ssize_t i, count = len(infos)
        if count == 0:
            raise ValueError("no batches")
        owner = self.owner
        self.size = position + n
        owner.size = self.size
        for i in range(count):
            info = <BatchInfo?>infos[i]
            self.index_batch(position + info.position, info.size,
                             info.base_offset + info.last_offset_delta, info.max_timestamp)
        info = <BatchInfo>infos[count - 1]
        self.next_offset = info.base_offset + info.last_offset_delta + 1
        owner.next_offset = self.next_offset
        if not self.has_first:
            self.first_batch_ms = (<BatchInfo>infos[0]).max_timestamp
            self.has_first = True

    def add_batch(self, int64_t position, int64_t size, int64_t last_offset, int64_t max_timestamp):
        """index_batch alone, for a rebuild from the file (recovery): size / next_offset untouched."""
        self.index_batch(position, size, last_offset, max_timestamp)

    cdef bint roll_due(self, int64_t batch_size, int64_t last_offset, int64_t max_timestamp,
                       int64_t now_ms, int64_t segment_bytes, int64_t segment_ms) noexcept:
        cdef int64_t waited
        if self.size == 0:
            return False
        if self.size > segment_bytes - batch_size:
            return True
        if self.has_first and self.first_batch_ms >= 0:
            waited = max_timestamp - self.first_batch_ms
        else:
            waited = now_ms - self.created_ms
        if waited > segment_ms or self.index_full:
            return True
        return last_offset - self.base_offset > MAX_RELATIVE

    def should_roll(self, int64_t batch_size, int64_t last_offset, int64_t max_timestamp,
                    int64_t now_ms, int64_t segment_bytes, int64_t segment_ms):
        """Kafka's roll rule before appending a batch (LogSegment.should_roll's doc)."""
        return self.roll_due(batch_size, last_offset, max_timestamp, now_ms, segment_bytes, segment_ms)

    def append_stamped(self, buf, int64_t segment_bytes, int64_t segment_ms, int64_t now_ms):
        """Write one batch that append_leader checked and stamped at ``next_offset`` (an idempotent
        batch, once producer state accepted it) unless should_roll's rule says roll first: -> the
        bytes written (then ``commit`` done), or -1 with nothing written. OSError for a failed write
        (bytes may remain past ``size``: truncate them); ValueError when the batch is not stamped at
        ``next_offset``."""
        cdef Py_buffer view
        cdef const char *p
        cdef Py_ssize_t n
        cdef int64_t last, max_ts, position = self.size
        cdef int err
        PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
        try:
            p = <const char *>view.buf
            n = view.len
            if n < HEADER_SIZE or batch_base_offset(p) != self.next_offset or batch_size(p) != n:
                raise ValueError("not one batch stamped at this segment's next offset")
            last = batch_base_offset(p) + batch_last_offset_delta(p)
            max_ts = batch_max_timestamp(p)
            if self.roll_due(n, last, max_ts, now_ms, segment_bytes, segment_ms):
                return -1
            if n >= NOGIL_APPEND_BYTES:
                with nogil:
                    err = _write_full(self.fd, p, n)
            else:
                err = _write_full(self.fd, p, n)
            if err:
                raise _os_error(err)
            self.committed(position, n, last, max_ts)
            return n
        finally:
            PyBuffer_Release(&view)

    cdef void roll_limits(self, int64_t segment_bytes, int64_t segment_ms, int64_t now_ms,
                          int64_t *room, int64_t *ts_limit, int64_t *off_limit) noexcept:
        # roll_due's rule as the limits _append_leader_into checks a batch against.
        if self.size == 0:
            room[0] = ts_limit[0] = off_limit[0] = _I64_MAX
            return
        room[0] = segment_bytes - self.size
        if self.has_first and self.first_batch_ms >= 0:
            if segment_ms > _I64_MAX - self.first_batch_ms:
                ts_limit[0] = _I64_MAX
            else:
                ts_limit[0] = self.first_batch_ms + segment_ms
        else:
            ts_limit[0] = _I64_MAX
            if now_ms - self.created_ms > segment_ms:
                room[0] = -1
        if self.index_full:
            room[0] = -1
        off_limit[0] = self.base_offset + MAX_RELATIVE

    def append_leader(self, buf, int32_t leader_epoch, int64_t max_message_bytes,
                      int64_t log_append_time_ms, bint compacted, bint prevalidated,
                      int64_t segment_bytes, int64_t segment_ms, int64_t now_ms):
        """A leader's append at ``next_offset``: the module's append_leader with the roll limits
        derived from this state (should_roll's rule), then, when written, ``commit``. -> None
        when the segment must roll first, else the stamped header (``position`` -1 for an
        idempotent batch: stamped, not written, state untouched). BatchError for a refused
        batch; OSError for a failed write (bytes may remain past ``size``: truncate them)."""
        cdef int64_t position = self.size, room, ts_limit, off_limit
        cdef int64_t base = self.next_offset
        cdef BatchInfo info
        self.roll_limits(segment_bytes, segment_ms, now_ms, &room, &ts_limit, &off_limit)
        r = _append_leader(self.fd, buf, position, base, leader_epoch, max_message_bytes,
                           log_append_time_ms, compacted, prevalidated, room, ts_limit, off_limit)
        if r is not None:
            info = <BatchInfo>r
            if info.position >= 0:
                self.committed(position, info.size, base + info.last_offset_delta, info.max_timestamp)
        return r

    # -- recent batches (tail reads) --

    def tail_position(self, int64_t offset, int64_t start_position):
        """Position of the first remembered batch whose last offset >= ``offset`` when it is at or
        after ``start_position``; -1 when ``offset`` is past the last batch; -2 when the list does
        not answer (empty, ``offset`` at or below its floor, or the batch before ``start_position``)."""
        return tail_position(self, offset, start_position)

    def tail_end(self, int64_t start, int64_t limit, bint min_one_batch):
        """The last remembered batch boundary at or below ``limit`` (the next one when that is
        ``start`` and ``min_one_batch``; ``size`` past the last batch), for a read from batch
        boundary ``start``; -2 when the list does not reach back to ``start``."""
        return tail_end(self, start, limit, min_one_batch)

    def forget_tail(self):
        self.tail_n = 0
        self.publish_tail()

    def tail(self):
        """([last offset], [position]) of the remembered batches, oldest first."""
        cdef Py_ssize_t i
        return ([self.tail_last[i] for i in range(self.tail_n)],
                [self.tail_pos[i] for i in range(self.tail_n)])

    def set_tail(self, list last_offsets not None, list positions not None):
        """Replace the remembered batches (tests, side-by-side measurement)."""
        cdef Py_ssize_t i, n = len(last_offsets)
        if len(positions) != n or n > 2 * self.tail_half:
            raise ValueError("tail lists of different lengths or longer than the tail")
        for i in range(n):
            self.tail_last[i] = last_offsets[i]
            self.tail_pos[i] = positions[i]
        self.tail_n = n
        self.publish_tail()


cdef int64_t tail_position(SegmentState st, int64_t offset, int64_t start_position) noexcept:
    # SegmentState.tail_position (also ext/fetch_path.pxi)
    cdef Py_ssize_t lo = 0, hi = st.tail_n, mid
    if hi == 0 or offset <= st.tail_floor:
        return -2
    while lo < hi:
        mid = (lo + hi) >> 1
        if st.tail_last[mid] < offset:
            lo = mid + 1
        else:
            hi = mid
    if lo == st.tail_n:
        return -1
    return st.tail_pos[lo] if st.tail_pos[lo] >= start_position else -2


cdef int64_t tail_end(SegmentState st, int64_t start, int64_t limit, bint min_one_batch) noexcept:
    # SegmentState.tail_end (also ext/fetch_path.pxi)
    cdef Py_ssize_t lo = 0, hi = st.tail_n, mid, n = st.tail_n
    cdef int64_t byte_end
    if n == 0 or start < st.tail_pos[0]:
        return -2
    while lo < hi:
        mid = (lo + hi) >> 1
        if st.tail_pos[mid] <= limit:
            lo = mid + 1
        else:
            hi = mid
    if lo == 0:
        return -2
    byte_end = st.tail_pos[lo - 1]
    if byte_end == start and min_one_batch:
        byte_end = st.tail_pos[lo] if lo < n else st.size
    return byte_end


# ----------------------------------------------------------------------------------------
# Sparse index: binary search, entry access, sanity check


cdef inline int64_t _key(const char *base, Py_ssize_t slot, int kind) noexcept nogil:
    if kind == 0:
        return <int64_t>load_be32(base + slot * 8)
    if kind == 1:
        return <int64_t>load_be32(base + slot * 8 + 4)
    return <int64_t>load_be64(base + slot * 12)


cdef Py_ssize_t _glb(const char *base, Py_ssize_t lo, Py_ssize_t hi, int64_t target,
                     int kind) noexcept nogil:
    # Greatest slot in [lo, hi] whose key <= target, or lo - 1 when none.
    cdef Py_ssize_t mid
    if _key(base, lo, kind) > target:
        return lo - 1
    while lo < hi:
        mid = hi - (hi - lo) // 2           # upper middle so lo always advances
        if _key(base, mid, kind) <= target:
            lo = mid
        else:
            hi = mid - 1
    return lo


def index_lookup(buf, Py_ssize_t entries, int kind, int64_t target):
    """Greatest slot whose key is <= target, or -1 (no such entry / empty index).

    kind: INDEX_OFFSET (target = relative offset), INDEX_POSITION (target = file position),
    INDEX_TIME (target = timestamp). Keys must be non-decreasing, which append guarantees."""
    cdef Py_buffer view
    cdef Py_ssize_t esize = 12 if kind == 2 else 8
    cdef Py_ssize_t warm, slot
    cdef const char *base
    if entries <= 0:
        return -1
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        if view.len < entries * esize:
            raise ValueError("index buffer shorter than its entry count")
        base = <const char *>view.buf
        with nogil:
            warm = entries - WARM_BYTES // esize
            if warm > 0 and _key(base, warm, kind) <= target:
                slot = _glb(base, warm, entries - 1, target, kind)
            else:
                slot = _glb(base, 0, entries - 1, target, kind)
        return slot
    finally:
        PyBuffer_Release(&view)


def index_valid_entries(buf, Py_ssize_t entries, int kind, int64_t max_position):
    """Length of the longest prefix of entries that is well formed.

    Offset index: relative offsets strictly increasing, positions non-decreasing and below
    max_position. Time index: timestamps and offsets non-decreasing. A preallocated file left
    untrimmed by a crash ends in zero entries, which fail these rules and are cut off."""
    cdef Py_buffer view
    cdef const char *base
    cdef Py_ssize_t i
    cdef int64_t prev_k = -1, prev_v = -1, k, v
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        base = <const char *>view.buf
        if entries * (12 if kind == 2 else 8) > view.len:
            raise ValueError("index buffer shorter than its entry count")
        with nogil:
            for i in range(entries):
                if kind == 2:
                    k = <int64_t>load_be64(base + i * 12)
                    v = <int64_t>load_be32(base + i * 12 + 8)
                    if i > 0 and (k < prev_k or v < prev_v):
                        break
                    if i > 0 and k == 0 and v == 0:
                        break
                else:
                    k = <int64_t>load_be32(base + i * 8)
                    v = <int64_t>load_be32(base + i * 8 + 4)
                    if i > 0 and (k <= prev_k or v < prev_v):
                        break
                    if v >= max_position:
                        break
                prev_k = k
                prev_v = v
            else:
                i = entries
        return i
    finally:
        PyBuffer_Release(&view)


def offset_entry(buf, Py_ssize_t slot):
    """(relative_offset, position) of an .index entry."""
    cdef Py_buffer view
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        if (slot + 1) * 8 > view.len or slot < 0:
            raise IndexError(slot)
        return (load_be32(<const char *>view.buf + slot * 8),
                load_be32(<const char *>view.buf + slot * 8 + 4))
    finally:
        PyBuffer_Release(&view)


def time_entry(buf, Py_ssize_t slot):
    """(timestamp, relative_offset) of a .timeindex entry."""
    cdef Py_buffer view
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        if (slot + 1) * 12 > view.len or slot < 0:
            raise IndexError(slot)
        return (<int64_t>load_be64(<const char *>view.buf + slot * 12),
                load_be32(<const char *>view.buf + slot * 12 + 8))
    finally:
        PyBuffer_Release(&view)


def put_offset_entry(buf, Py_ssize_t slot, uint32_t relative_offset, uint32_t position):
    """Store an .index entry in a writable buffer (the mmapped, preallocated file)."""
    cdef Py_buffer view
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE | 0x0001)   # PyBUF_WRITABLE
    try:
        if (slot + 1) * 8 > view.len or slot < 0:
            raise IndexError(slot)
        store_be32(<char *>view.buf + slot * 8, relative_offset)
        store_be32(<char *>view.buf + slot * 8 + 4, position)
    finally:
        PyBuffer_Release(&view)


def put_time_entry(buf, Py_ssize_t slot, int64_t timestamp, uint32_t relative_offset):
    """Store a .timeindex entry in a writable buffer."""
    cdef Py_buffer view
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE | 0x0001)
    try:
        if (slot + 1) * 12 > view.len or slot < 0:
            raise IndexError(slot)
        store_be64(<char *>view.buf + slot * 12, <uint64_t>timestamp)
        store_be32(<char *>view.buf + slot * 12 + 8, relative_offset)
    finally:
        PyBuffer_Release(&view)


cdef int _pwrite_all(int fd, const char *p, Py_ssize_t n, int64_t pos) noexcept nogil:
    # pwrite until done; 0 or errno.
    cdef Py_ssize_t w
    while n > 0:
        w = pwrite(fd, p, <size_t>n, <off_t>pos)
        if w < 0:
            if errno == EINTR:
                continue
            return errno
        if w == 0:
            return 28
        p += w
        n -= w
        pos += w
    return 0


def write_offset_entry(int fd, Py_ssize_t slot, uint32_t relative_offset, uint32_t position):
    """pwrite one .index entry at ``slot`` of the index file; raises OSError (e.g. ENOSPC)."""
    cdef char e[8]
    cdef int err
    store_be32(e, relative_offset)
    store_be32(e + 4, position)
    with nogil:
        err = _pwrite_all(fd, e, 8, <int64_t>slot * 8)
    if err:
        raise _os_error(err)


def write_time_entry(int fd, Py_ssize_t slot, int64_t timestamp, uint32_t relative_offset):
    """pwrite one .timeindex entry at ``slot`` of the index file; raises OSError."""
    cdef char e[12]
    cdef int err
    store_be64(e, <uint64_t>timestamp)
    store_be32(e + 8, relative_offset)
    with nogil:
        err = _pwrite_all(fd, e, 12, <int64_t>slot * 12)
    if err:
        raise _os_error(err)


# ----------------------------------------------------------------------------------------
# Header walk (fetch positioning, translate_offset, offset_for_timestamp)


def seek_batch(int fd, int64_t start, int64_t end, int64_t target_offset,
               int64_t limit_position, int64_t target_timestamp):
    """Walk batch headers from ``start`` (a batch boundary) towards ``end`` and stop at the
    first batch that satisfies any of: lastOffset >= target_offset, position + size >
    limit_position, maxTimestamp >= target_timestamp.

    Returns (position, size, base_offset, last_offset, max_timestamp) of that batch, or
    (position, 0, -1, -1, -1) when the walk reached ``end`` (or a torn header) first.
    Headers are trusted here (CRCs were checked on append or by recovery)."""
    cdef char chunk[WALK_CHUNK]
    cdef int64_t wstart = 0, wlen = 0, pos = start
    cdef int64_t base_off = -1, last_off = -1, max_ts = -1, size = 0
    cdef Py_ssize_t n
    cdef const char *h
    cdef int found = 0, err = 0
    with nogil:
        while pos + HEADER_SIZE <= end:
            if pos < wstart or pos + HEADER_SIZE > wstart + wlen:
                n = pread(fd, chunk, WALK_CHUNK, <off_t>pos)
                if n < 0:
                    if errno == EINTR:
                        continue
                    err = errno
                    break
                wstart = pos
                wlen = n
                if wlen < HEADER_SIZE:
                    break
            h = chunk + (pos - wstart)
            size = batch_size(h)
            if size < HEADER_SIZE or pos + size > end:
                break
            base_off = batch_base_offset(h)
            last_off = base_off + batch_last_offset_delta(h)
            max_ts = batch_max_timestamp(h)
            if (last_off >= target_offset or pos + size > limit_position
                    or max_ts >= target_timestamp):
                found = 1
                break
            pos += size
    if err:
        raise _os_error(err)
    if found:
        return (pos, size, base_off, last_off, max_ts)
    return (pos, 0, -1, -1, -1)


from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE


def seek_batch_in(bytes block not None, int64_t block_pos, int64_t start, int64_t end,
                  int64_t target_offset, int64_t limit_position):
    """seek_batch over file bytes already in memory: ``block`` holds the file from ``block_pos`` on,
    ``start`` is a batch boundary inside it. A batch counts once its header is in the block (it may
    end past the block). -> (position, size, base_offset, last_offset) of the first batch with
    lastOffset >= target_offset or position + size > limit_position, or (position, 0, -1, -1) where
    the walk stopped first: at ``end`` or at a header the block does not hold whole (``position`` is
    then the batch boundary to continue from)."""
    cdef int64_t size = 0, base_off = -1, last_off = -1
    cdef int64_t pos = seek_in(PyBytes_AS_STRING(block), block_pos, block_pos + PyBytes_GET_SIZE(block), start,
                               end, target_offset, limit_position, &size, &base_off, &last_off)
    return (pos, size, base_off, last_off)


cdef int64_t seek_in(const char *data, int64_t block_pos, int64_t block_end, int64_t start, int64_t end,
                     int64_t target_offset, int64_t limit_position, int64_t *size_out, int64_t *base_out,
                     int64_t *last_out) noexcept:
    # seek_batch_in over ``data`` (the file's bytes [block_pos, block_end)): the position, and the
    # batch's size (0: not found), base and last offsets through the pointers
    cdef int64_t pos = start, size, base_off, last_off
    cdef const char *h
    size_out[0] = 0
    base_out[0] = last_out[0] = -1
    if start < block_pos:
        return start
    while pos + HEADER_SIZE <= end and pos + HEADER_SIZE <= block_end:
        h = data + (pos - block_pos)
        size = batch_size(h)
        if size < HEADER_SIZE or pos + size > end:
            break
        base_off = batch_base_offset(h)
        last_off = base_off + batch_last_offset_delta(h)
        if last_off >= target_offset or pos + size > limit_position:
            size_out[0] = size
            base_out[0] = base_off
            last_out[0] = last_off
            return pos
        pos += size
    return pos


# ----------------------------------------------------------------------------------------
# Recovery scan


# A scanned batch kept until the GIL is back: its position and a copy of its header.
cdef struct BatchRec:
    int64_t position
    char header[HEADER_SIZE]


cdef int read_full(int fd, char *buf, int64_t n, int64_t pos) noexcept nogil:
    # pread until n bytes or EOF; returns bytes read, or -errno.
    cdef int64_t got = 0
    cdef Py_ssize_t r
    while got < n:
        r = pread(fd, buf + got, <size_t>(n - got), <off_t>(pos + got))
        if r < 0:
            if errno == EINTR:
                continue
            return -errno
        if r == 0:
            break
        got += r
    return <int>got if got < 0x7FFFFFFF else 0x7FFFFFFF


def scan_batches(int fd, int64_t start, int64_t end, int64_t segment_base,
                 int64_t min_offset, bint check_crc=True):
    """Validate the batches of a segment file between ``start`` and ``end``.

    Checks per batch: a full 61-byte header, batchLength within the file, magic 2, CRC32C
    over [21, end) (when check_crc), base offset >= min_offset and > the previous batch's
    last offset, and both offsets within the segment's u32 relative range.

    Returns (valid_end, batches, reason): valid_end is the position just past the last good
    batch, batches a list of kbroker._native.batch.BatchInfo (``position`` = file position),
    and reason a SCAN_* code (SCAN_OK when the scan reached ``end`` exactly)."""
    cdef char *buf = NULL
    cdef int64_t cap = SCAN_CHUNK
    cdef int64_t wstart = start, wlen = 0, pos = start, size, got
    cdef int64_t next_min = min_offset
    cdef const char *h
    cdef BatchRec *recs = NULL
    cdef BatchRec *grown
    cdef Py_ssize_t nrec = 0, caprec = 1024, i
    cdef int reason = 0
    cdef char *nb
    cdef BatchRec *r
    cdef int64_t base_offset, last_offset
    buf = <char *>malloc(<size_t>cap)
    recs = <BatchRec *>malloc(sizeof(BatchRec) * caprec)
    if buf == NULL or recs == NULL:
        free(buf)
        free(recs)
        raise MemoryError()
    try:
        with nogil:
            while pos < end:
                if end - pos < HEADER_SIZE:
                    reason = 1
                    break
                # Make sure the header is in the window.
                if pos + HEADER_SIZE > wstart + wlen:
                    got = read_full(fd, buf, min(cap, end - pos), pos)
                    if got < 0:
                        reason = 6
                        break
                    wstart = pos
                    wlen = got
                    if wlen < HEADER_SIZE:
                        reason = 1
                        break
                h = buf + (pos - wstart)
                size = batch_size(h)
                if size < HEADER_SIZE or pos + size > end:
                    reason = 2
                    break
                if batch_magic(h) != MAGIC_V2:
                    reason = 3
                    break
                # Make sure the whole batch is in the window (grow for big batches).
                if pos + size > wstart + wlen:
                    if size > cap:
                        nb = <char *>realloc(buf, <size_t>size)
                        if nb == NULL:
                            reason = 6
                            break
                        buf = nb
                        cap = size
                    got = read_full(fd, buf, min(cap, end - pos), pos)
                    if got < size:
                        reason = 6 if got < 0 else 2
                        break
                    wstart = pos
                    wlen = got
                    h = buf
                if check_crc:
                    if batch_crc(h, size) != batch_stored_crc(h):
                        reason = 4
                        break
                base_offset = batch_base_offset(h)
                last_offset = base_offset + batch_last_offset_delta(h)
                if (base_offset < next_min or last_offset < base_offset
                        or base_offset - segment_base < 0
                        or last_offset - segment_base > MAX_RELATIVE):
                    reason = 5
                    break
                if nrec == caprec:
                    grown = <BatchRec *>realloc(recs, sizeof(BatchRec) * caprec * 2)
                    if grown == NULL:
                        reason = 6
                        break
                    recs = grown
                    caprec *= 2
                r = &recs[nrec]
                r.position = pos
                memcpy(r.header, h, HEADER_SIZE)
                nrec += 1
                next_min = last_offset + 1
                pos += size
        out = []
        for i in range(nrec):
            out.append(parse_header(recs[i].header, <Py_ssize_t>recs[i].position))
        return (pos, out, reason)
    finally:
        free(buf)
        free(recs)


# ----------------------------------------------------------------------------------------
# A log's leader appends (segment.pxd)

# Write-behind run: set by run_begin, cleared by run_end (event-loop thread only).
cdef bint _run_open = False
# The thread that opened the run: only its appends defer (a broker run in a thread beside another
# broker's loop, or an append on a worker thread, writes at once and never joins this run).
cdef unsigned long _run_thread = 0
cdef list _run_pending = []         # LeaderAppenders that deferred bytes in this run (maybe twice)
cdef int _run_failed = 0            # logs whose deferred bytes could not be written in this run
cdef object _run_tag = None         # the request whose appends are being made (set_run_tag)
cdef list _run_lost = []            # (Log, message, tags) per failed write of deferred bytes (run_lost)


cdef void run_begin() noexcept:
    global _run_open, _run_thread, _run_tag
    _run_thread = PyThread_get_thread_ident()
    _run_open = True
    _run_tag = None
    del _run_lost[:]


cdef void set_run_tag(object tag) noexcept:
    global _run_tag
    _run_tag = tag


cdef list run_lost():
    global _run_lost
    cdef list out = _run_lost
    _run_lost = []
    return out


cdef int run_end() except -1:
    global _run_open, _run_failed, _run_tag
    cdef LeaderAppender ap
    cdef int failed
    _run_open = False
    _run_tag = None             # no request is being handled: every batch cut away now counts (write_pending)
    try:
        for ap in _run_pending:
            try:
                ap.write_pending()
            except OSError:
                pass            # counted in _run_failed; that log was cut back (write_pending)
    finally:
        del _run_pending[:]
        failed = _run_failed
        _run_failed = 0
    return failed


def open_run():
    """run_begin from Python (tests, callers outside dispatch_frames)."""
    run_begin()


def close_run():
    """run_end from Python: -> the number of logs whose deferred bytes could not be written (their
    batches' tags stay in ``run_lost`` until the next run begins)."""
    return run_end()


cdef enum:
    SEQ_MAX = 0x7FFFFFFF        # producer sequences wrap from here to 0 (producer_state.in_sequence)


cdef class LogState:
    """The per-request fields of kbroker.log.log.Log (its base class; declared in segment.pxd)."""

    cpdef bint advance_hw(self, list isr, dict followers, int local_id, Py_ssize_t min_isr, int64_t leo) except -1:
        """A leader's high-watermark rule (Kafka's maybeIncrementLeaderHW): with at least ``min_isr``
        replicas in ``isr`` and every one but ``local_id`` known in ``followers`` with a log end
        (``.leo`` >= 0), the HW moves to the smallest log end over the ISR (this log's is ``leo``),
        clamped as Log.high_watermark's setter clamps it; it never moves back. -> whether it moved.
        The one implementation: Partition.maybe_increment_hw and the native Fetch path's follower
        record call it. Precondition, the stricter of the two callers': the partition is led here and
        its leadership is not stale (a stale or former leader's followers do not commit anything; the
        Python caller checks it, the native one only records followers of an armed, not stale slot)."""
        cdef int64_t hw = leo, f_leo
        cdef object r, f
        if len(isr) < min_isr:
            return False
        for r in isr:
            if <int>r == local_id:
                continue
            f = followers.get(r)
            if f is None:
                return False
            f_leo = f.leo
            if f_leo < 0:
                return False
            if f_leo < hw:
                hw = f_leo
        return self._raise_hw(hw, leo)

    cpdef bint advance_hw_alone(self, int64_t leo) except -1:
        """``advance_hw`` for an ISR of this replica alone (no follower to wait for): the HW moves to
        ``leo``. Log.high_watermark_to_end and the native Produce path's ISR-of-one append call it."""
        return self._raise_hw(leo, leo)

    cdef bint _raise_hw(self, int64_t hw, int64_t leo) noexcept:
        cdef int64_t start
        if hw <= self._high_watermark:
            return False
        start = self.log_start_offset
        self._high_watermark = (hw if hw > start else start) if hw < leo else leo
        return True


@cython.final
cdef class LeaderAppender:
    """One log's leader-append settings, read once per LogConfig object (a config change
    replaces Log.config, which the next append sees by identity; a LogConfig is never changed
    in place), and its count of messages appended since the last flush.

    Write-behind: inside a run (run_begin .. run_end, opened by ext/conn.pxi dispatch_frames
    around the Produce frames of one receive chunk) a plain append is stamped in its buffer and
    committed to the segment's state, and its bytes are written by run_end with the run's other
    batches of this log (one writev). Anything else an append does here (roll, idempotent batch,
    flush due, another segment) writes the pending bytes first. A failed write cuts the log back
    to the first pending batch (``log._deferred_write_failed``), counts the failure for run_end and
    records the cut-away batches' run tags (``run_lost``): the caller (dispatch_frames,
    ext/conn.pxi and lost.pxi) answers those requests' rows KAFKA_STORAGE_ERROR instead."""

    def __cinit__(self):
        self.config = None
        self.unflushed = 0
        self.last = -1
        self.info = None
        self.log = None
        self.pend_st = None
        self.pend_n = 0
        self.pend_cap = 0
        self.pend_bytes = 0
        self.pend_iov = NULL
        self.pend_refs = []
        self.pend_tags = []

    def __dealloc__(self):
        free(self.pend_iov)

    cdef int load(self, cfg) except -1:
        self.max_message_bytes = cfg.max_message_bytes
        self.segment_bytes = cfg.segment_bytes
        self.segment_ms = cfg.segment_ms
        self.flush_messages = cfg.flush_messages
        self.log_append_time = cfg.log_append_time
        self.compact = cfg.compact
        self.config = cfg
        return 0

    cdef int push(self, SegmentState st, object buf, char *data, int64_t n, int64_t position,
                  int64_t base) except -1:
        cdef iovec *grown
        cdef Py_ssize_t cap
        if self.pend_n == 0:
            self.pend_st = st
            self.pend_start = position
            self.pend_base = base
            _run_pending.append(self)
        if self.pend_n == self.pend_cap:
            cap = self.pend_cap * 2 if self.pend_cap else 64
            grown = <iovec *>realloc(self.pend_iov, sizeof(iovec) * cap)
            if grown == NULL:
                raise MemoryError()
            self.pend_iov = grown
            self.pend_cap = cap
        self.pend_iov[self.pend_n].iov_base = data
        self.pend_iov[self.pend_n].iov_len = <size_t>n
        self.pend_n += 1
        self.pend_bytes += n
        self.pend_refs.append(buf)
        self.pend_tags.append(_run_tag)
        return 0

    cdef int write_pending(self) except -1:
        # The deferred batches in one writev. On failure the log is cut back to the first of them
        # (file, indexes, state: Log._deferred_write_failed) and OSError raised.
        cdef SegmentState st = self.pend_st
        cdef int err
        cdef int64_t position = self.pend_start, base = self.pend_base
        cdef list tags
        cdef Py_ssize_t rows = 0
        global _run_failed
        if self.pend_n == 0:
            return 0
        if self.pend_bytes >= NOGIL_APPEND_BYTES:
            with nogil:
                err = _writev_full(st.fd, self.pend_iov, self.pend_n)
        else:
            err = _writev_full(st.fd, self.pend_iov, self.pend_n)
        self.pend_n = 0
        self.pend_bytes = 0
        self.pend_st = None
        del self.pend_refs[:]
        tags = self.pend_tags
        self.pend_tags = []
        if err:
            _run_failed += 1
            e = _os_error(err)
            for tag in tags:
                if tag is not _run_tag:
                    rows += 1       # not the request being handled (its own append raises: it answers that)
            message = None
            try:
                message = self.log._deferred_write_failed(st.owner, position, base, e, rows)
            finally:
                _run_lost.append((self.log, message, tags))     # their answers are corrected whatever happens
            raise e
        return 0

    @property
    def pending(self):
        """Deferred batches not yet written (0 outside a run)."""
        return self.pend_n

    def write_deferred(self):
        """Write the deferred batches now (before anything else changes this log or its files).
        OSError when that failed (the log is cut back to the first of them)."""
        self.write_pending()

    def append(self, SegmentState st not None, buf, int32_t leader_epoch, cfg, bint prevalidated,
               int64_t now_ms):
        """SegmentState.append_leader on the active segment ``st`` with ``cfg``'s limits, then the
        unflushed count. -> the batch's last offset when written, or inside a run deferred (state
        committed, no flush due); APPENDED_FLUSH_DUE when written and flush.messages reached (last
        offset in ``last``); APPEND_ROLL when the segment must roll first (nothing done);
        APPEND_IDEMPOTENT for an idempotent batch, stamped, not written (its header in ``info``).
        Deferred bytes are written before the last three. BatchError / OSError as
        SegmentState.append_leader."""
        cdef Appended out
        cdef int64_t position, base, room, ts_limit, off_limit
        cdef bint defer = _run_open and PyThread_get_thread_ident() == _run_thread
        if cfg is not self.config:
            self.load(cfg)
        if self.pend_n and self.pend_st is not st:
            self.write_pending()
        position = st.size
        base = st.next_offset
        st.roll_limits(self.segment_bytes, self.segment_ms, now_ms, &room, &ts_limit, &off_limit)
        r = _append_leader_into(st.fd, buf, position, base, leader_epoch, self.max_message_bytes,
                                now_ms if self.log_append_time else -1, self.compact, prevalidated,
                                room, ts_limit, off_limit, &out, False, defer)
        if r is not None:
            self.info = r
            self.write_pending()
            return CODE_IDEMPOTENT
        if out.size < 0:
            self.write_pending()
            return CODE_ROLL
        self.commit(st, buf, &out, position, base, defer)
        if self.unflushed >= self.flush_messages:
            self.write_pending()
            self.last = out.last_offset
            return CODE_FLUSH_DUE
        return out.last_offset

    cdef int commit(self, SegmentState st, object buf, Appended *out, int64_t position, int64_t base,
                    bint defer) except -1:
        # a stamped (and, unless ``defer``, written) batch committed to the segment's state
        if defer:
            self.push(st, buf, out.data, out.size, position, base)
        st.committed(position, out.size, out.last_offset, out.max_timestamp)
        self.unflushed += out.record_count
        return 0

    cdef int check_plain(self, SegmentState st, object buf, object cfg, int64_t now_ms, char *p,
                         Py_ssize_t n) except -1:
        # What ``append`` would not end as a plain append (too short to read, idempotent but not
        # ``in_sequence``, flush or roll due), refused with no effect at all (nothing stamped, written, counted; no pending
        # bytes written): -> 0 when ``append_checked`` with the same ``now_ms`` will append the ``n``
        # bytes at ``p`` (``buf``'s) as a plain append, else NOT_PLAIN; BatchError as ``append``. Several partitions of one request (ext/produce_path.pxi) are all
        # checked before the first is appended. The answer holds while nothing else appends to
        # this log.
        cdef Appended out
        cdef int64_t room, ts_limit, off_limit
        if cfg is not self.config:
            self.load(cfg)
        if (n < OFF_RECORDS_COUNT + 4
                or self.unflushed + <int32_t>load_be32(p + OFF_RECORDS_COUNT) >= self.flush_messages):
            return NOT_PLAIN
        if <int64_t>load_be64(p + OFF_PRODUCER_ID) >= 0 and not self.in_sequence(p):
            return NOT_PLAIN
        check_for_append(p, n, buf, self.max_message_bytes, self.compact, False)
        st.roll_limits(self.segment_bytes, self.segment_ms, now_ms, &room, &ts_limit, &off_limit)
        if _roll_first(p, n, st.next_offset, now_ms if self.log_append_time else -1, room, ts_limit,
                       off_limit, &out):
            return NOT_PLAIN
        return 0

    cdef bint in_sequence(self, const char *p) except -1:
        # An idempotent batch that producer state would append as it is (``check`` -> None) and that
        # needs nothing else: not transactional nor control, its producer known with this epoch and
        # at least one retained batch, not a duplicate of one, its first sequence the one after the
        # last (wrapping). Anything else (new producer, epoch bump, retry, out of order, older epoch)
        # is the reference path's (Log._append_leader_other).
        cdef int32_t first, prev
        cdef int64_t last
        if <int16_t>load_be16(p + OFF_ATTRIBUTES) & (ATTR_TRANSACTIONAL | ATTR_CONTROL):
            return False
        entry = self.log.producer_state.producers.get(<int64_t>load_be64(p + OFF_PRODUCER_ID))
        if entry is None or entry.epoch != <int16_t>load_be16(p + OFF_PRODUCER_EPOCH):
            return False
        batches = entry.batches
        if not batches:
            return False
        first = <int32_t>load_be32(p + OFF_BASE_SEQUENCE)
        if first < 0:
            return False
        last = (<int64_t>first + <int32_t>load_be32(p + OFF_LAST_OFFSET_DELTA)) % (<int64_t>SEQ_MAX + 1)
        for b in batches:
            if b.first_seq == first and b.last_seq == last:
                return False    # a retry: answered from producer state
        prev = batches[len(batches) - 1].last_seq      # (no wraparound in this module)
        return first == prev + 1 if prev != SEQ_MAX else first == 0

    cdef int64_t append_checked(self, SegmentState st, object buf, char *p, Py_ssize_t n, int32_t leader_epoch,
                                int64_t now_ms, int32_t *records) except? -9:
        # The append ``check_plain`` (0, same ``now_ms``, nothing else appended to this log since)
        # cleared: stamped, written (inside a run: deferred) and committed -> its last offset.
        # Pending bytes of another segment are written first (OSError as ``append``).
        # An idempotent batch is never deferred: this log's pending bytes, then it, are written at
        # once, and only then is it recorded in producer state (as Log._append_leader_other), so a
        # failed write (a cut-back run included) never leaves a retry answered as a duplicate.
        cdef Appended out
        cdef int64_t position, base
        cdef int64_t pid = <int64_t>load_be64(p + OFF_PRODUCER_ID)
        cdef bint defer = pid < 0 and _run_open and PyThread_get_thread_ident() == _run_thread
        if self.pend_n and (pid >= 0 or self.pend_st is not st):
            self.write_pending()
        position = st.size
        base = st.next_offset
        _limits(p, base, now_ms if self.log_append_time else -1, &out)
        _stamp_write(st.fd, p, n, base, leader_epoch, now_ms if self.log_append_time else -1, defer, &out)
        self.commit(st, buf, &out, position, base, defer)
        if pid >= 0:
            self.log.producer_state.update(pid, <int16_t>load_be16(p + OFF_PRODUCER_EPOCH),
                                           <int32_t>load_be32(p + OFF_BASE_SEQUENCE),
                                           <int32_t>load_be32(p + OFF_LAST_OFFSET_DELTA), base, out.max_timestamp)
        records[0] = out.record_count
        return out.last_offset


# ---- read blocks ------------------------------------------------------------------------------------

@cython.final
cdef class ReadBlock:
    """One segment's read block (fields in segment.pxd); made by ReadBlocks.load."""

    def __repr__(self):
        return f"ReadBlock(pos={self.pos}, {len(self.data)} bytes, floor={self.floor}, cursor={self.cursor})"


@cython.final
cdef class ReadBlocks:
    """The read blocks of the process: at most ``limit`` of at most ``block_size`` bytes, one per segment,
    the least recently used dropped first. A block holds file bytes below the size the segment had when
    it was read: those never change until the file is cut, and the segment drops its block (``forget``)
    on every cut or reload. Any thread may call; the dict is changed with the GIL held, and an eviction
    that loses a race with another thread's is left to the next load."""

    def __init__(self, Py_ssize_t limit, int64_t block_size):
        self.by_segment = {}
        self.limit = limit if limit > 0 else 0
        self.block_size = block_size

    cpdef ReadBlock get(self, seg):
        """``seg``'s block as it is (its place in the order unchanged), or None."""
        if not self.limit:
            return None
        return <ReadBlock>self.by_segment.get(seg)

    cpdef ReadBlock load(self, seg, int fd, int64_t pos, int64_t size):
        """Read ``seg``'s file (``fd``) from batch boundary ``pos`` (at most ``block_size`` bytes, up to
        ``size``) as its block, now the most recently used; None when no blocks are kept. A file cut
        underneath gives a shorter block (the caller's own read reports the cut)."""
        cdef int64_t want = size - pos
        cdef int got
        cdef bytes data
        cdef char *buf
        cdef ReadBlock block
        if not self.limit:
            return None
        if want > self.block_size:
            want = self.block_size
        if want < 0:
            want = 0
        data = PyBytes_FromStringAndSize(NULL, want)
        buf = PyBytes_AS_STRING(data)
        with nogil:
            got = read_full(fd, buf, want, pos)
        if got < 0:
            raise _os_error(-got)
        if got < want:
            data = data[:got]
        block = ReadBlock.__new__(ReadBlock)
        block.pos = pos
        block.data = data
        block.floor = <int64_t>load_be64(PyBytes_AS_STRING(data)) - 1 if got >= HEADER_SIZE else _I64_MAX
        block.cursor = pos
        block.cursor_floor = block.floor
        self.by_segment.pop(seg, None)
        self.by_segment[seg] = block
        if len(self.by_segment) > self.limit:
            try:
                del self.by_segment[next(iter(self.by_segment))]
            except (KeyError, RuntimeError):
                pass        # another thread's load moved the order meanwhile: evicted next time
        return block

    cpdef ReadBlock holding(self, seg, int fd, int64_t start, int64_t n, int64_t size):
        """The block holding ``seg``'s bytes [start, start + n) (a range a read placed below ``size``):
        its block, moved to the most recently used end, or a new one read at ``start``; None when no
        block can hold them (more than ``block_size``, no blocks kept, or the file was cut underneath:
        the caller reads the file itself)."""
        cdef ReadBlock block
        cdef dict blocks = self.by_segment
        if not self.limit or n > self.block_size:
            return None
        block = <ReadBlock>blocks.get(seg)
        if block is not None and start >= block.pos and start + n <= block.pos + len(block.data):
            if next(reversed(blocks)) is not seg:
                blocks[seg] = blocks.pop(seg)
            return block
        block = self.load(seg, fd, start, size)
        return block if len(block.data) >= n else None

    cpdef forget(self, seg):
        """Drop ``seg``'s block (its file was cut or reloaded)."""
        if self.by_segment:
            self.by_segment.pop(seg, None)
