# Included by segment.pyx: a log's leader appends (LeaderAppender) and the write-behind run they join.
#
# Contract: LeaderAppender reads one LogConfig object's limits once (a config change replaces the
# object) and makes a leader's append one native call: roll check + checks + stamp + write + state,
# or a code (roll, flush due, idempotent) for Log's Python code to finish. Between run_begin and
# run_end (the thread that opened the run only) a plain append is stamped and committed at once and
# its bytes written by run_end, one writev per log; every other write path of the log writes pending
# bytes first. A failed write of deferred bytes cuts the log back to the first of them
# (Log._deferred_write_failed) and records the cut-away batches' run tags (run_lost) for the request
# path (ext/lost.pxi) to rewrite the answers that claimed them. An idempotent batch is never deferred.

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
