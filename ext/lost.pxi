# Included by request.pyx: write-behind runs and the answers a failed write makes wrong.
#
# When a deferred write fails (at run_end, or earlier when another write path of that log writes the
# pending bytes first) the log is cut back to the first deferred batch; the connection stays open and
# each request whose batch was cut away answers as Kafka answers a failed append:
# 1. an answer already encoded (acks=1; acks=-1 answered at once): that partition's row is rewritten
#    to KAFKA_STORAGE_ERROR, base offset / append time / log start -1, no record errors, and from v8
#    the write's message; its rows on logs that were written keep theirs.
# 2. an answer still to come (acks=-1 parked, appends queued off the loop): the rows are kept in
#    Slot.lost and rewritten the same way when the connection finishes it (lost_answer).
# 3. acks=0: the connection closes after the answers queued before it.
# 4. at the cut itself (Log.on_cut -> ReplicaManager): every acks=all wait on a batch at or after the
#    cut is decided KAFKA_STORAGE_ERROR, since those offsets will be reused.
# 5. while a dir is failing, an append Python would defer in a run is written at once (append_records)
#    and the native path leaves such requests to Python (failing_dirs): the outcome is a lone write's,
#    and only a written append ends the failure streak.
# Rows that already carry an error are left alone.

# The Produce requests of the current write-behind run, in order: a request's appends are tagged with
# its index here (set_run_tag), so the batches a failed write cut away name their requests' slots.
cdef list _run_slots = []


cdef int _end_run(ConnState conn, bint *run, no_response, close) except -1:
    # the run's deferred bytes written, or the logs that failed cut back and the answers claiming their
    # batches corrected (_lost_answers)
    run[0] = False
    try:
        if run_end():
            _lost_answers(conn, no_response, close)
    finally:
        del _run_slots[:]
    return 0


cdef int _lost_answers(ConnState conn, no_response, close) except -1:
    # Each request of the run whose batch a failed write cut away (run_lost): its answer, once there is
    # one, gets that partition's row as a failed append's (_lost_answer); an answer still to come (acks=all
    # parked, appends queued off the loop) is corrected when the connection finishes it (lost_answer).
    cdef dict per = {}, rows
    cdef Slot slot
    cdef Py_ssize_t n = len(_run_slots)
    for lg, message, tags in run_lost():
        tp = (lg.topic, lg.partition)
        for tag in tags:
            if tag is None:
                continue
            rows = per.get(tag)
            if rows is None:
                per[tag] = rows = {}
            if tp not in rows:
                rows[tp] = message
    for tag, rows in per.items():
        if <Py_ssize_t>tag >= n:
            conn.close()            # its slot was never queued (its handler raised): no answer may claim it
            continue
        slot = <Slot>_run_slots[<Py_ssize_t>tag]
        if slot.done:
            slot.chunks = _lost_answer(slot.header.api_version, rows, slot.chunks, no_response, close)
        else:
            slot.lost = rows
    return 0


def lost_answer(Slot slot, chunks, no_response, close):
    """A Produce answer that was not ready when its write-behind run's write failed (kbroker.network.
    connection ``_finish``, when ``slot.lost``): corrected as dispatch_frames corrects the others."""
    return _lost_answer(slot.header.api_version, slot.lost, chunks, no_response, close)


cdef object _lost_answer(int version, dict rows, chunks, no_response, close):
    # acks=0: the connection closes (as for any failed acks=0 append: the client has no other way to
    # learn of it); an encoded answer: the rows on ``rows``' partitions that claim the append rewritten
    if chunks is no_response:
        return close
    if type(chunks) is list and len(<list>chunks) == 1 and type((<list>chunks)[0]) is bytes:
        if version >= PRODUCE_FLEX:
            return [_rewrite_produce_flex((<list>chunks)[0], version, rows)]
        return [_rewrite_produce((<list>chunks)[0], version, rows)]
    return chunks


cdef inline int64_t _uv(const unsigned char *s, Py_ssize_t n, Py_ssize_t *pos) except -1:
    # an unsigned varint of an encoded answer at pos[0] (moved past it)
    cdef int64_t v = 0
    cdef int shift = 0
    cdef unsigned char b
    while True:
        if pos[0] >= n or shift > 28:
            raise ValueError("truncated Produce response")
        b = s[pos[0]]
        pos[0] += 1
        v |= (<int64_t>(b & 0x7F)) << shift
        if not b & 0x80:
            return v
        shift += 7


cdef inline int _skip_answer_tags(const unsigned char *s, Py_ssize_t n, Py_ssize_t *pos) except -1:
    cdef int64_t k = _uv(s, n, pos), i
    for i in range(k):
        _uv(s, n, pos)
        pos[0] += _uv(s, n, pos)
    if pos[0] > n:
        raise ValueError("truncated Produce response")
    return 0


cdef bytes _rewrite_produce_flex(bytes answer, int version, dict rows):
    # _rewrite_produce of a flexible (v9+) answer: compact lengths, each struct's tag buffer (skipped
    # where a row is rewritten, copied elsewhere); the throttle time and the answer's tags copied
    cdef const unsigned char *s = <const unsigned char *>PyBytes_AS_STRING(answer)
    cdef Py_ssize_t n = len(answer), pos = 8, at, row
    cdef int64_t t, j, e, n_topics, n_parts, n_errors, name_len, slen
    cdef int32_t index
    cdef int16_t code
    cdef _Writer w = _out
    _skip_answer_tags(s, n, &pos)                   # the response header's
    n_topics = _uv(s, n, &pos) - 1
    w.pos = 0
    w.reserve(pos)
    memcpy(w.p, s, pos)
    w.pos = pos
    for t in range(n_topics):
        at = pos
        name_len = _uv(s, n, &pos) - 1
        if name_len < 0 or pos + name_len > n:
            raise ValueError("truncated Produce response")
        name = PyUnicode_DecodeUTF8(<const char *>s + pos, name_len, NULL)
        pos += name_len
        n_parts = _uv(s, n, &pos) - 1
        w.reserve(pos - at)
        memcpy(w.p + w.pos, s + at, pos - at)
        w.pos += pos - at
        for j in range(n_parts):
            row = pos
            if pos + 30 > n:
                raise ValueError("truncated Produce response")
            index = <int32_t>load_be32(<const char *>s + pos)
            code = <int16_t>load_be16(<const char *>s + pos + 4)
            pos += 30
            n_errors = _uv(s, n, &pos) - 1
            for e in range(n_errors):
                pos += 4
                slen = _uv(s, n, &pos) - 1
                if slen > 0:
                    pos += slen
                _skip_answer_tags(s, n, &pos)
            slen = _uv(s, n, &pos) - 1              # error_message
            if slen > 0:
                pos += slen
            _skip_answer_tags(s, n, &pos)
            if pos > n:
                raise ValueError("truncated Produce response")
            message = rows.get((name, index)) if code == 0 else None
            if message is not None:
                _produce_row(w, version, index, ERR_KAFKA_STORAGE_ERROR, -1, -1, -1, message)
            else:
                w.reserve(pos - row)
                memcpy(w.p + w.pos, s + row, pos - row)
                w.pos += pos - row
        at = pos
        _skip_answer_tags(s, n, &pos)               # the topic's
        w.reserve(pos - at)
        memcpy(w.p + w.pos, s + at, pos - at)
        w.pos += pos - at
    if n - pos < 5:
        raise ValueError("not a Produce response")
    w.reserve(n - pos)                              # throttle_time_ms and the answer's tags
    memcpy(w.p + w.pos, s + pos, n - pos)
    w.pos += n - pos
    store_be32(w.p, <uint32_t>(w.pos - 4))
    return PyBytes_FromStringAndSize(w.p, w.pos)


cdef bytes _rewrite_produce(bytes answer, int version, dict rows):
    # A Produce v3-8 response frame (size prefix included; v9+: _rewrite_produce_flex) with each row whose (topic, partition) is in
    # ``rows`` and whose error code is 0 replaced by a failed append's row: KAFKA_STORAGE_ERROR, base
    # offset, append time and log start -1, no record errors, the message (v8). Other bytes copied.
    cdef const unsigned char *s = <const unsigned char *>PyBytes_AS_STRING(answer)
    cdef Py_ssize_t n = len(answer), pos = 12, at, row
    cdef int32_t t, j, e, n_topics, n_parts, n_errors, index
    cdef int16_t name_len, slen, code
    cdef _Writer w = _out
    if n < 16:
        raise ValueError("not a Produce response")
    w.pos = 0
    w.reserve(12)
    memcpy(w.p, s, 12)
    w.pos = 12
    n_topics = <int32_t>load_be32(<const char *>s + 8)
    for t in range(n_topics):
        at = pos
        if pos + 2 > n:
            raise ValueError("truncated Produce response")
        name_len = <int16_t>load_be16(<const char *>s + pos)
        if name_len < 0 or pos + 2 + name_len + 4 > n:
            raise ValueError("truncated Produce response")
        name = PyUnicode_DecodeUTF8(<const char *>s + pos + 2, name_len, NULL)
        n_parts = <int32_t>load_be32(<const char *>s + pos + 2 + name_len)
        pos += 2 + name_len + 4
        w.reserve(pos - at)
        memcpy(w.p + w.pos, s + at, pos - at)
        w.pos += pos - at
        for j in range(n_parts):
            row = pos
            if pos + 22 > n:
                raise ValueError("truncated Produce response")
            index = <int32_t>load_be32(<const char *>s + pos)
            code = <int16_t>load_be16(<const char *>s + pos + 4)
            pos += 22 + (8 if version >= 5 else 0)
            if version >= 8:
                n_errors = <int32_t>load_be32(<const char *>s + pos)
                pos += 4
                for e in range(n_errors):
                    slen = <int16_t>load_be16(<const char *>s + pos + 4)
                    pos += 6 + (slen if slen > 0 else 0)
                slen = <int16_t>load_be16(<const char *>s + pos)
                pos += 2 + (slen if slen > 0 else 0)
            if pos > n:
                raise ValueError("truncated Produce response")
            message = rows.get((name, index)) if code == 0 else None
            if message is not None:
                _produce_row(w, version, index, ERR_KAFKA_STORAGE_ERROR, -1, -1, -1, message)
            else:
                w.reserve(pos - row)
                memcpy(w.p + w.pos, s + row, pos - row)
                w.pos += pos - row
    if n - pos != 4:
        raise ValueError("not a Produce response")
    return _produce_end(w, False)
