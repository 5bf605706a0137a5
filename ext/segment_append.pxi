# Included by segment.pyx: one leader append of one producer batch, in one call.
#
# Contract: append_leader / _append_leader_into check a batch as batch.validate_and_stamp does (same
# BatchError codes and messages), apply Kafka's roll rule to the checked header (_roll_first, with the
# limits SegmentState.roll_limits derives), stamp base offset / leader epoch (and LogAppendTime) in
# place and write it (without the GIL from NOGIL_APPEND_BYTES on), or with ``defer`` only stamp it for
# the write-behind run (segment_leader.pxi). An idempotent batch is stamped, never roll-checked nor
# written here: the caller checks it against producer state first.

cdef enum:                  # LeaderAppender.append's codes (a written batch's last offset is >= 0)
    CODE_ROLL = -1
    CODE_IDEMPOTENT = -2
    CODE_FLUSH_DUE = -3
APPEND_ROLL = CODE_ROLL
APPEND_IDEMPOTENT = CODE_IDEMPOTENT
APPENDED_FLUSH_DUE = CODE_FLUSH_DUE


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
