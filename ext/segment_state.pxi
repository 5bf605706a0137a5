# Included by segment.pyx: SegmentState, the active segment's append-time state, and the tail reads
# of its recent-batch list (tail_position / tail_end, which the native Fetch path calls without a
# Python call).
#
# Contract: the state mirrors what kbroker.log.segment.LogSegment owns (size and next offset are
# written back to the owner on every change; the owner keeps roll, truncation and recovery policy);
# index entries are added to the owner's OffsetIndex / TimeIndex objects once per index.interval.bytes
# (natively on their common case, segment_index.pxi).
# Event-loop thread only.

cdef int64_t _I64_MAX = 0x7FFFFFFFFFFFFFFF


cdef class SegmentState:
    """The in-memory state of one segment that appends move: size, next offset, the roll clocks
    (creation time, first batch's timestamp), the greatest timestamp and its offset, bytes since
    the last index entry, whether an index is full, and the recent batches' (last offset, position)
    list that tail reads search. LogSegment keeps ``size`` and ``next_offset`` as its own attributes
    too (readers use them on every fetch); every native change writes both back to the owner. So
    that a read the list cannot answer costs no call, the owner also holds the list's bounds (the last
    offset before the list and its first position, INT64_MAX when it is empty), set through its
    ``set_tail_bounds`` when they change (after an empty list, and every ``tail_batches`` appends when
    the older half is dropped).

    Index entries are added to the owner's OffsetIndex/TimeIndex objects (once per
    index.interval.bytes; natively, their methods only for the uncommon cases); ``index_full`` is a
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
        self.index_full = self._index_full()

    cdef bint _index_full(self) except -1:
        return (self.index.entries >= self.index.max_entries
                or self.time_index.entries >= self.time_index.max_entries)

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
                if self.index.add_offset_entry(last_offset, position) == INDEX_REFUSED:
                    self.index.append(last_offset, position)            # raises: says why
                if self.time_index.add_time_entry(self.max_timestamp,
                                                  self.offset_of_max_timestamp) == INDEX_REFUSED:
                    self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
                self.bytes_since_index = 0
            except OSError:
                # Disk full or failing under the index: the batch itself is written, and a sparse
                # index without this entry is still correct (lookups scan a bit more).
                pass
            self.index_full = self._index_full()
        self.bytes_since_index += size
        return 0

    cdef int publish_tail(self) except -1:
        # the owner's copy of the list's bounds (LogSegment.set_tail_bounds), rewritten only when they
        # move: after an empty list and when the older half is dropped (once per tail_half appends)
        if self.tail_n:
            self.owner.set_tail_bounds(self.tail_floor, self.tail_pos[0])
        else:
            self.owner.set_tail_bounds(_I64_MAX, _I64_MAX)
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
