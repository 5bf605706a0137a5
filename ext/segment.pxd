# kbroker._native.segment: every cdef class it exports and every C-level function other modules cimport
# (kbroker._native.request: the native Produce / Fetch paths, ext/request.pyx), by the include that
# implements it (segment.pyx lists the includes). IndexFile is the append rule of Kafka's
# OffsetIndex/TimeIndex; SegmentState is Kafka's LogSegment append side (kbroker.log.segment.LogSegment
# owns one and keeps the policy: roll, errors, truncation, load/recovery); LogState a Log's
# per-request fields; LeaderAppender one log's leader-append settings, so that a leader's append is
# one native call.
cimport cython
from libc.stdint cimport int32_t, int64_t
from posix.uio cimport iovec


# ---- segment_index.pxi: the append rule of the sparse .index / .timeindex files -----------------

# What IndexFile.add_offset_entry / add_time_entry did (Python: IndexAppend.INDEX_ADDED, ...).
cpdef enum IndexAppend:
    INDEX_REFUSED = 0       # nothing done: the Python method says why (and raises)
    INDEX_ADDED = 1
    INDEX_NOT_NEEDED = 2    # time index only: the timestamp is not above the last entry's


# One index file's writer state (kbroker.log.index.OffsetIndex / TimeIndex are its subclasses).
cdef class IndexFile:
    cdef public int64_t base_offset
    cdef public int64_t entries             # well-formed entries in the file
    cdef public int64_t max_entries         # room in the file (preallocated while writable)
    cdef public bint writable
    cdef public int fd                      # kept open while writable (entry pwrites), else -1
    cdef public object mm                   # read-only mmap of the file, None when empty
    cpdef int add_offset_entry(self, int64_t offset, int64_t position) except -1
    cpdef int add_time_entry(self, int64_t timestamp, int64_t offset) except -1


# ---- segment_append.pxi / segment_state.pxi: the active segment's append state -------------------

# One batch's append as _append_leader_into / LeaderAppender leave it.
cdef struct Appended:
    int64_t size                 # bytes written; -1: the segment must roll first (nothing done)
    int64_t last_offset
    int64_t max_timestamp        # as stamped
    int32_t record_count
    char *data                   # the stamped batch (with ``defer``: not written)


@cython.final
cdef class SegmentState:
    cdef public int fd                      # O_APPEND descriptor of the .log, -1 when inactive
    cdef readonly int64_t base_offset
    cdef readonly int64_t index_interval_bytes
    cdef public int64_t size                # mirrored to owner.size / owner.next_offset on change
    cdef public int64_t next_offset
    cdef public int64_t created_ms
    cdef public bint has_first              # first_batch_ms holds the first batch's max timestamp
    cdef public int64_t first_batch_ms
    cdef public int64_t max_timestamp
    cdef public int64_t offset_of_max_timestamp
    cdef public int64_t bytes_since_index
    cdef public bint index_full             # an index has no room for an entry (sync_index)
    cdef public int64_t tail_floor
    cdef object owner                       # the LogSegment (size / next_offset / tail bounds mirrors)
    cdef IndexFile index                    # its OffsetIndex and TimeIndex (entries added to them)
    cdef IndexFile time_index
    cdef int64_t *tail_last                 # recent batches: last offset, file position
    cdef int64_t *tail_pos
    cdef Py_ssize_t tail_n
    cdef Py_ssize_t tail_half               # TAIL_BATCHES: kept between this many and twice as many

    cdef int index_batch(self, int64_t position, int64_t size, int64_t last_offset,
                         int64_t max_timestamp) except -1
    cdef int publish_tail(self) except -1
    cdef bint _index_full(self) except -1
    cdef void roll_limits(self, int64_t segment_bytes, int64_t segment_ms, int64_t now_ms,
                          int64_t *room, int64_t *ts_limit, int64_t *off_limit) noexcept
    cdef bint roll_due(self, int64_t batch_size, int64_t last_offset, int64_t max_timestamp,
                       int64_t now_ms, int64_t segment_bytes, int64_t segment_ms) noexcept
    cdef int committed(self, int64_t position, int64_t n, int64_t last_offset,
                       int64_t max_timestamp) except -1


# ---- segment_logstate.pxi: Log's per-request fields, the high-watermark rule ---------------------

# The fields of a partition's log (kbroker.log.log.Log, a subclass) that the native Produce and Fetch
# paths read or write on every request, as C fields: typed access costs no attribute lookup (Python
# code sees ordinary attributes).
cdef class LogState:
    cdef public object config, segments, write_future, _write_job
    cdef public bint offline, dirty
    cdef public int64_t log_start_offset, _high_watermark
    cpdef bint advance_hw(self, list isr, dict followers, int local_id, Py_ssize_t min_isr, int64_t leo) except -1
    cpdef bint advance_hw_alone(self, int64_t leo) except -1
    cdef bint _raise_hw(self, int64_t hw, int64_t leo) noexcept


# ---- segment_leader.pxi: leader appends and the write-behind run ---------------------------------

@cython.final
cdef class LeaderAppender:
    cdef object config                      # the LogConfig the limits below were read from
    cdef int64_t max_message_bytes
    cdef int64_t segment_bytes
    cdef int64_t segment_ms
    cdef int64_t flush_messages
    cdef bint log_append_time
    cdef bint compact
    cdef public int64_t unflushed           # messages appended since the last flush (Log.unflushed_messages)
    cdef readonly int64_t last              # last offset of a batch answered APPENDED_FLUSH_DUE
    cdef readonly object info               # header of a batch answered APPEND_IDEMPOTENT
    # Write-behind within one receive chunk (run_begin .. run_end): batches stamped and committed
    # but not yet written, in order, all for one segment (``pend_st``) from file position
    # ``pend_start`` (the first one's base offset ``pend_base``); ``pend_refs`` keeps their buffers.
    cdef public object log                  # the Log: told when its pending bytes could not be written
    cdef SegmentState pend_st
    cdef int64_t pend_start
    cdef int64_t pend_base
    cdef int64_t pend_bytes
    cdef iovec *pend_iov
    cdef Py_ssize_t pend_n
    cdef Py_ssize_t pend_cap
    cdef list pend_refs
    cdef list pend_tags                     # per pending batch: the run tag of the request it answers

    cdef int load(self, cfg) except -1
    cdef int write_pending(self) except -1
    cdef int push(self, SegmentState st, object buf, char *data, int64_t n, int64_t position,
                  int64_t base) except -1
    cdef int commit(self, SegmentState st, object buf, Appended *out, int64_t position, int64_t base,
                    bint defer) except -1
    # several partitions' plain appends (ext/produce_path.pxi): all checked (no effect), then all appended
    cdef int check_plain(self, SegmentState st, object buf, object cfg, int64_t now_ms, char *p,
                         Py_ssize_t n) except -1
    cdef bint in_sequence(self, const char *p) except -1
    cdef int64_t append_checked(self, SegmentState st, object buf, char *p, Py_ssize_t n, int32_t leader_epoch,
                                int64_t now_ms, int32_t *records) except? -9


# LeaderAppender.check_plain: not a plain append, nothing done (the reference path takes it)
cdef enum:
    NOT_PLAIN = -4


# Write-behind run (ext/conn.pxi dispatch_frames): between run_begin and run_end a plain leader
# append (LeaderAppender.append: not idempotent, no roll or flush due) is stamped and committed but
# written only by run_end, one writev per log. -> run_end: how many logs failed to write theirs since
# run_begin (their appends were unwound: the answers claiming them must not leave as they are).
# ``set_run_tag(tag)``: the request whose appends follow (ext/lost.pxi: its index in the run); each
# deferred batch keeps the tag current when it was deferred. ``run_lost()``: what failed since run_begin,
# [(Log, error message, [tag of each batch cut away, in order]), ...] (taken: the list is emptied).
cdef void run_begin() noexcept
cdef int run_end() except -1
cdef void set_run_tag(object tag) noexcept
cdef list run_lost()



# ---- segment_state.pxi, segment_io.pxi, segment_walk.pxi: reads the Fetch path calls -------------

# Tail reads without a call (ext/fetch_path.pxi; SegmentState.tail_position / tail_end
# are these): the remembered batch at or after ``offset`` (-1 past the last, -2 the list does not
# answer), and the last boundary at or below ``limit`` for a read from ``start`` (-2 does not answer).
cdef int64_t tail_position(SegmentState st, int64_t offset, int64_t start_position) noexcept
cdef int64_t tail_end(SegmentState st, int64_t start, int64_t limit, bint min_one_batch) noexcept
# pread at ``pos`` until ``n`` bytes or the end of the file: the bytes read, or -errno
cdef int read_full(int fd, char *buf, int64_t n, int64_t pos) noexcept nogil
# seek_batch_in over the file bytes [block_pos, block_end) at ``data``: the position where the walk
# stopped; the found batch's size (0: none), base and last offsets through the pointers.
cdef int64_t seek_in(const char *data, int64_t block_pos, int64_t block_end, int64_t start, int64_t end,
                     int64_t target_offset, int64_t limit_position, int64_t *size_out, int64_t *base_out,
                     int64_t *last_out) noexcept


# ---- segment_blocks.pxi: the read-block cache ----------------------------------------------------

# Read blocks (kbroker.log.segment READ_BLOCK / READ_BLOCKS): the bytes of a segment's file from a batch
# boundary, kept so that small reads walk batch headers and copy records from memory. One ReadBlocks
# (the process's, kbroker.log.segment.read_blocks) serves LogSegment and the native Fetch path.
@cython.final
cdef class ReadBlock:
    cdef readonly int64_t pos               # file position of data[0], a batch boundary
    cdef readonly bytes data                # the file's bytes from ``pos`` (below the size the segment had)
    cdef readonly int64_t floor             # first batch's base offset - 1 (INT64_MAX: no whole header):
                                            # no batch before ``pos`` holds an offset above it
    cdef public int64_t cursor              # a batch boundary in the block, where the last walk stopped
    cdef public int64_t cursor_floor        # the cursor batch's base offset - 1


@cython.final
cdef class ReadBlocks:
    cdef readonly dict by_segment           # LogSegment -> ReadBlock, least recently used first
    cdef readonly Py_ssize_t limit          # blocks kept at most (0: none: every method answers None)
    cdef readonly int64_t block_size        # bytes per block at most
    cpdef ReadBlock get(self, seg)
    cpdef ReadBlock load(self, seg, int fd, int64_t pos, int64_t size)
    cpdef ReadBlock holding(self, seg, int fd, int64_t start, int64_t n, int64_t size)
    cpdef forget(self, seg)
