# Included by request.pyx: the Produce fast path and its acks=all parking.

# dispatch_frames serves a Produce v3-11 frame here when it is the common request: no transactional id
# (v9+: and no tagged field),
# acks 0/1/-1 (-1 when each partition's ISR is this leader alone and min.insync.replicas <= 1, or has
# followers and would be waited for by append_records: then parked, ParkedProduce), up to
# FAST_PARTS partitions of any topics, each with an armed leader slot (FastLeader), none twice, and
# every batch ending as a plain leader append (LeaderAppender.check_plain: not idempotent unless
# the producer's next batch in sequence (LeaderAppender.in_sequence), no roll or
# flush due, the batch checks pass; not compressed when validation runs off the loop, below
# kbroker.log.writer.offload.bytes). All partitions are checked before the first is appended, so
# everything else, any refusal included, is left untouched for the reference path (produce.handle_native
# -> execute -> ReplicaManager.append_records), which stays the reference: what the native path does
# must give the same bytes in the log and in the answer (tests/test_native_differential.py,
# tests/test_produce_fast.py). Policy stays in Python as the slots' state: the ReplicaManager arms a
# slot when the conditions hold and disarms or re-arms it when they change (kbroker/replica/manager.py
# docstring); what may change without it (the log's config, offline flag, writes in flight,
# active segment, epoch cache, queued appends, waiters) is checked here per request, O(1) per partition.
#
# Two passes: the first checks every partition (nothing written), the second appends; a refusal in
# the first leaves the request whole for Python. acks=-1 with followers is parked (ParkedProduce), one
# object registered with each waiting partition, answered when the HW passes every row or on timeout.
# An idempotent batch is served only in its producer's steady state (the next sequence of the current
# epoch, no duplicate to answer); everything else about producer state stays in Python.

cdef class FastLeader:
    """One partition this broker leads, as the native Produce path needs it (armed by
    ReplicaManager._fast_refresh; replaced, never changed, when the partition's state changes)."""

    def __init__(self, tp, partition, LogState log not None, LeaderAppender ap not None, config, int epoch, bint alone,
                 bint followers, follower_key, waiters, dict tails not None, epoch_cache, bint park=False):
        self.tp, self.partition, self.log, self.ap, self.config = tp, partition, log, ap, config
        self.epoch, self.alone, self.followers, self.park = epoch, alone, followers, park
        self.follower_key, self.waiters, self.tails, self.epoch_cache = follower_key, waiters, tails, epoch_cache
        self.append_time = bool(config.log_append_time)
        self.seg = None
        self.st = None


cdef class FastProduce:
    """The Produce handler dispatch_frames gets (broker.py): called as ``handle_native`` for any
    request the native path leaves (``reference_path(conn, req)``), and holding the armed leader slots.
    ``fast``/``reference``: requests served natively / through ``reference_path`` (tests, A/B)."""

    def __init__(self, reference_path, rearm, write_failed, dict leaders not None, dict messages_in not None,
                 dict bytes_in not None, dict notify not None, appended, dict failing_dirs not None, int64_t big,
                 bint off_loop, produce_failed=None):
        self.reference_path, self.rearm, self.write_failed = reference_path, rearm, write_failed
        self.produce_failed = produce_failed
        self.messages_in, self.bytes_in = messages_in, bytes_in
        self.notify, self.appended, self.failing_dirs = notify, appended, failing_dirs
        self.big, self.off_loop = big, off_loop
        self.leaders = leaders

    def __call__(self, conn, req):
        self.reference += 1
        return self.reference_path(conn, req)


def arm_leader(dict leaders not None, FastLeader leader not None):
    """Serve ``leader.tp`` natively (replaces its slot in ``leaders``, the ReplicaManager's dict of
    armed slots that FastProduce and FastFetch share: topic -> {partition index: FastLeader})."""
    topic, index = leader.tp
    parts = leaders.get(topic)
    if parts is None:
        parts = leaders[topic] = {}
    parts[index] = leader


def disarm_leader(dict leaders not None, tp):
    """``tp`` takes the reference path (its slot removed from ``leaders``)."""
    parts = leaders.get(tp[0])
    if parts is not None:
        parts.pop(tp[1], None)
        if not parts:
            del leaders[tp[0]]


cdef struct _Parts:
    # one request's partitions as _produce_fast reads them (request order), with no Python list: the
    # object pointers are owned references (_Parts_release drops them)
    int32_t n                       # partitions
    int32_t n_topics
    int32_t n_bufs                  # records views taken so far
    PyObject *leader[FAST_PARTS]    # FastLeader
    PyObject *buf[FAST_PARTS]       # memoryview of the batch in the frame
    Py_ssize_t at[FAST_PARTS]       # the batch's position in the frame
    int32_t size[FAST_PARTS]
    int32_t index[FAST_PARTS]
    int32_t topic[FAST_PARTS]
    int64_t base[FAST_PARTS]        # the answer: base offset, append time, log start
    int64_t last[FAST_PARTS]        # the batch's last offset
    bint wait[FAST_PARTS]           # acks=-1 waits for the HW to pass ``last`` (a ParkedProduce row)
    int64_t time[FAST_PARTS]
    int64_t start[FAST_PARTS]
    PyObject *name[FAST_PARTS]      # per topic: its name (str), its bytes' position and length, partitions
    Py_ssize_t t_at[FAST_PARTS]
    int16_t t_len[FAST_PARTS]
    int32_t t_parts[FAST_PARTS]
    int64_t t_msgs[FAST_PARTS]      # per topic: messages and bytes appended (MessagesIn / BytesIn)
    int64_t t_bytes[FAST_PARTS]


cdef inline void _parts_release(_Parts *ps) noexcept:
    cdef int32_t k
    for k in range(ps.n):
        Py_XDECREF(ps.leader[k])
    for k in range(ps.n_bufs):
        Py_DECREF(<object>ps.buf[k])
    for k in range(ps.n_topics):
        Py_DECREF(<object>ps.name[k])


cdef inline PyObject *_held(object o) noexcept:
    Py_INCREF(o)
    return <PyObject *>o


cdef inline SegmentState _active_state(FastLeader fl, LogState lg):
    # ``lg``'s active segment as the slot's (``fl.seg``, ``fl.st``), re-read after a roll or on first
    # use (both fast paths)
    cdef list segments = <list>lg.segments
    cdef object seg = segments[len(segments) - 1]
    if seg is not fl.seg:
        fl.st = seg._st
        fl.seg = seg
    return fl.st


cdef object _produce_fast(FastProduce fp, ConnState conn, object view, const unsigned char *p, Py_ssize_t begin,
                          Py_ssize_t size, Py_ssize_t start, Py_ssize_t end, bint *run, no_response,
                          close, chunk):
    """The frame at ``begin`` (``size`` bytes), walked once -> None: served natively (its Slot queued
    with the answer), or the ProduceRequest parse_produce would give, for the reference path (not the
    common request, or not a plain append: nothing was done; a write-behind run may have begun, which
    the caller would begin all the same). A malformed frame raises ProtocolError as parse_produce does.
    Every partition (up to FAST_PARTS, of any number of topics) is looked up and checked first
    (LeaderAppender.check_plain: no effect), then all are appended in request order, so a refusal
    of any leaves the whole request untouched."""
    cdef _Parts ps
    ps.n = ps.n_topics = ps.n_bufs = 0
    try:
        return _produce_parts(fp, conn, view, p, begin, size, start, end, run, no_response, close, chunk, &ps)
    finally:
        _parts_release(&ps)


cdef ProduceRequest _produce_request(object view, Py_ssize_t begin, _Parts *ps, ProduceRequest req,
                                     int32_t n_topics):
    # the walked topics 0..n_topics-1 as parse_produce's ``topics`` (records: slices of the frame,
    # those check_plain took reused), set on ``req``
    cdef list topics = [], parts
    cdef int32_t t, j, k = 0
    cdef object records
    for t in range(n_topics):
        parts = []
        for j in range(ps.t_parts[t]):
            if k < ps.n_bufs:
                records = <object>ps.buf[k]
            elif ps.size[k] < 0:
                records = None
            else:
                records = view[begin + ps.at[k]:begin + ps.at[k] + ps.size[k]]
            parts.append((ps.index[k], records))
            k += 1
        topics.append((<object>ps.name[t], parts))
    req.topics = topics
    return req


cdef ProduceRequest _produce_resume(object view, Py_ssize_t begin, Py_ssize_t size, _Parts *ps, ProduceRequest req,
                                    int32_t t, Py_ssize_t at, int64_t n_topics):
    # a shape the walk does not take (tagged fields, more than FAST_PARTS partitions, an empty array, a
    # string that is not UTF-8, a length past the frame): the topics before topic ``t`` (which starts at
    # ``at``) as walked, the rest parsed from there by parse_produce's own loop (its errors included)
    cdef object frame = view[begin:begin + size]
    cdef _Reader r = _frame_reader(frame)
    _produce_request(view, begin, ps, req, t)
    r.pos = at
    _produce_topics(r, frame, req, n_topics - t)
    return req


cdef object _produce_parts(FastProduce fp, ConnState conn, object view, const unsigned char *p, Py_ssize_t begin,
                           Py_ssize_t size, Py_ssize_t start, Py_ssize_t end, bint *run, no_response,
                           close, chunk, _Parts *ps):
    cdef const unsigned char *f = p + begin
    cdef Py_ssize_t pos = 8, name_at, topic_at
    cdef int16_t acks
    cdef int64_t n16, rsize, n_topics, n_parts
    cdef int32_t version, correlation_id, timeout_ms, index, count = 0
    cdef bint flex, fast_ok = True
    cdef int32_t t, j, k, failed = -1, waiting = 0
    cdef int64_t last, now
    cdef object client_id = None, txn, name, parts = None, result, records, error = None
    cdef LogState lg
    cdef list entries
    cdef FastLeader fl
    cdef SegmentState st
    cdef ProduceRequest req
    cdef Slot slot
    cdef double started
    if size < 8 + 2 + 2 + 2 + 4 + 4:
        return parse_produce(view[begin:begin + size])
    version = <int16_t>load_be16(<const char *>f + 2)
    correlation_id = <int32_t>load_be32(<const char *>f + 4)
    flex = version >= PRODUCE_FLEX
    client_id = _client_id(f, size, &pos)
    if client_id is _REFUSED:
        return parse_produce(view[begin:begin + size])
    # header tags, transactional id (null: the common request), acks, timeout, the topic count
    if flex:
        txn = _cstring_at(f, size, &pos) if _no_tags_at(f, size, &pos) else _REFUSED
    elif size - pos >= 2:
        txn = _client_id(f, size, &pos)
    else:
        txn = _REFUSED
    if txn is _REFUSED or size - pos < 2 + 4 + 1:
        return parse_produce(view[begin:begin + size])
    acks = <int16_t>load_be16(<const char *>f + pos)
    timeout_ms = <int32_t>load_be32(<const char *>f + pos + 2)
    pos += 6
    if flex:
        n_topics = _fuv(f, size, &pos) - 1
    elif size - pos < 4:
        return parse_produce(view[begin:begin + size])
    else:
        n_topics = <int32_t>load_be32(<const char *>f + pos)
        pos += 4
    if not (1 <= n_topics <= FAST_PARTS):
        return parse_produce(view[begin:begin + size])
    req = _header(PRODUCE, version)
    req.correlation_id = correlation_id
    req.client_id = client_id
    req.transactional_id = txn
    req.acks = acks
    req.timeout_ms = timeout_ms
    if txn is not None or not (-1 <= acks <= 1) or fp.failing_dirs:
        fast_ok = False
    # The whole frame walked once: each partition's position recorded (ps), and, while the request
    # is still the common one, its leader slot looked up and checked
    for t in range(n_topics):
        topic_at = pos
        if flex:
            n16 = _fuv(f, size, &pos) - 1                           # the topic's name
            if n16 <= 0 or n16 > 0x7FFF or size - pos < n16 + 1:
                return _produce_resume(view, begin, size, ps, req, t, topic_at, n_topics)
            name_at = pos
            pos += n16
            n_parts = _fuv(f, size, &pos) - 1
        else:
            if size - pos < 2 + 4:
                return _produce_resume(view, begin, size, ps, req, t, topic_at, n_topics)
            n16 = <int16_t>load_be16(<const char *>f + pos)           # the topic's name
            pos += 2
            if n16 <= 0 or size - pos < n16 + 4:
                return _produce_resume(view, begin, size, ps, req, t, topic_at, n_topics)
            name_at = pos
            pos += n16
            n_parts = <int32_t>load_be32(<const char *>f + pos)
            pos += 4
        if not (1 <= n_parts <= FAST_PARTS - ps.n):
            return _produce_resume(view, begin, size, ps, req, t, topic_at, n_topics)
        name = _utf8(f + name_at, n16)
        if name is _REFUSED:
            return _produce_resume(view, begin, size, ps, req, t, topic_at, n_topics)
        if fast_ok:
            parts = fp.leaders.get(name)
            # authorization hook: a topic not yet allowed Write on this connection takes the reference path
            if parts is None or (conn._acl_write is not None and name not in <set>conn._acl_write):
                fast_ok = False
        ps.name[t] = _held(name)
        ps.n_topics = t + 1
        ps.t_at[t] = name_at
        ps.t_len[t] = <int16_t>n16
        ps.t_parts[t] = <int32_t>n_parts
        ps.t_msgs[t] = ps.t_bytes[t] = 0
        for j in range(n_parts):
            if size - pos < 4 + 4:
                return _produce_resume(view, begin, size, ps, req, t, topic_at, n_topics)
            index = <int32_t>load_be32(<const char *>f + pos)
            if flex:
                pos += 4
                rsize = _fuv(f, size, &pos)
                if rsize < 0:
                    return _produce_resume(view, begin, size, ps, req, t, topic_at, n_topics)
                rsize -= 1
            else:
                rsize = <int32_t>load_be32(<const char *>f + pos + 4)
                pos += 8
            if rsize > size - pos:
                return _produce_resume(view, begin, size, ps, req, t, topic_at, n_topics)
            if rsize < 0:
                rsize = -1                                  # null records
            k = ps.n
            ps.leader[k] = NULL
            ps.at[k] = pos
            ps.size[k] = <int32_t>rsize
            ps.index[k] = index
            ps.topic[k] = t
            ps.n = k + 1
            if rsize > 0:
                pos += rsize
            if flex and not _no_tags_at(f, size, &pos):     # the partition's
                return _produce_resume(view, begin, size, ps, req, t, topic_at, n_topics)
            if fast_ok:
                fast_ok = _produce_slot(fp, parts, index, rsize, acks, f + ps.at[k], ps, k)
        if flex and not _no_tags_at(f, size, &pos):         # the topic's
            return _produce_resume(view, begin, size, ps, req, t, topic_at, n_topics)
    if flex and not _no_tags_at(f, size, &pos):             # the request's
        return _produce_resume(view, begin, size, ps, req, <int32_t>n_topics, pos, n_topics)
    if pos != size:                                   # the last batch (tag buffer) ends the frame
        raise ProtocolError(f"ProduceRequest v{version}: {size - pos} trailing bytes")
    if not fast_ok:
        return _produce_request(view, begin, ps, req, <int32_t>n_topics)
    # every batch checked before any is appended (no effect: nothing stamped, written or counted)
    now = _now_ms()
    for k in range(ps.n):
        fl = <FastLeader>ps.leader[k]
        records = view[begin + ps.at[k]:begin + ps.at[k] + ps.size[k]]
        ps.buf[k] = _held(records)
        ps.n_bufs = k + 1
        try:
            if fl.ap.check_plain(fl.st, records, fl.config, now, <char *>f + ps.at[k], ps.size[k]):
                # not a plain append (idempotent out of sequence, flush or roll due)
                return _produce_request(view, begin, ps, req, <int32_t>n_topics)
        except BatchError:
            return _produce_request(view, begin, ps, req, <int32_t>n_topics)    # refused: the reference path answers it
    started = _monotonic()
    if not run[0] and _frame_follows(p, start, end):
        run_begin()
        run[0] = True
    if run[0]:
        set_run_tag(len(_run_slots))    # this request's deferred appends (its slot follows, below)
    for k in range(ps.n):
        fl = <FastLeader>ps.leader[k]
        st = fl.st
        lg = fl.log
        ps.base[k] = st.next_offset
        ps.wait[k] = False
        try:
            last = fl.ap.append_checked(st, <object>ps.buf[k], <char *>f + ps.at[k], ps.size[k], fl.epoch, now,
                                        &count)
        except OSError as e:
            failed = k
            error = e
            break
        # Log.append_as_leader's and ReplicaManager.append_records' bookkeeping of a plain append
        lg.dirty = True
        ps.start[k] = lg.log_start_offset
        ps.time[k] = now if fl.append_time else -1
        ps.t_msgs[ps.topic[k]] += last - ps.base[k] + 1
        ps.t_bytes[ps.topic[k]] += ps.size[k]
        if fl.followers and PyDict_Contains(fp.notify, fl.follower_key):
            fp.appended(fl.follower_key)
        if fl.alone and lg.advance_hw_alone(st.next_offset):
            if PyDict_Contains(fp.notify, fl.tp):
                fp.appended(fl.tp)
        ps.last[k] = last
        if acks == -1 and last >= lg._high_watermark:
            ps.wait[k] = True           # append_records' pending (only a slot with followers gets here)
            waiting += 1
    for t in range(ps.n_topics):                      # per topic, as append_records' per-partition sums
        if ps.t_bytes[t]:
            _bump(fp.messages_in, <object>ps.name[t], ps.t_msgs[t])
            _bump(fp.bytes_in, <object>ps.name[t], ps.t_bytes[t])
    if failed >= 0:
        # partition ``failed`` could not be written: Python's storage-failure finisher answers it
        # and appends the partitions after it as append_records would have
        result = fp.write_failed(conn, <object>ps.leader[failed], error, version, correlation_id, acks, timeout_ms,
                                 *_rows_after_failure(ps, failed))
        fp.reference += 1
    else:
        if acks == 0:
            result = no_response
        elif waiting:
            result = _park(fp, conn, version, correlation_id, timeout_ms, ps, waiting)
        else:
            result = [_encode_rows(version, correlation_id, f, ps)]
        fp.fast += 1
    slot = _new_slot(req, PRODUCE, version, False, conn._pending, conn._request_counts, conn.last_active,
                     conn._read_at, started)
    if run[0]:
        _run_slots.append(slot)
    if not _end_native(slot, result, no_response, close):
        conn._dispatch_later(slot, result, chunk)
    return None


cdef bint _produce_slot(FastProduce fp, object parts, int32_t index, int64_t rsize, int16_t acks,
                        const unsigned char *batch, _Parts *ps, int32_t k) except -1:
    # partition ``k`` of the walk (index ``index`` of a topic whose armed slots are ``parts``, its batch
    # of ``rsize`` bytes at ``batch``) as the fast path takes it: its FastLeader held in ps -> True; or
    # False, the request is the reference path's. Per partition, O(1): what may change without the
    # slot being re-armed.
    cdef FastLeader fl = (<dict>parts).get(index)
    cdef LogState lg
    cdef list entries
    cdef int32_t i
    if fl is None or rsize <= 0:
        return False
    if ((acks == -1 and not (fl.alone or fl.park)) or rsize >= fp.big
            or (fp.off_loop and rsize > 22 and batch[22] & 7)      # compressed: validated off the loop
            or (fl.alone and len(fl.waiters)) or fl.tails):
        return False
    lg = fl.log
    if lg.config is not fl.config or fl.partition.leader_epoch != fl.epoch:
        # a config change (or a leadership change a re-arm missed): the next request sees the new slot,
        # or none
        fp.rearm(fl.tp)
        return False
    if lg.offline or lg._write_job is not None or lg.write_future is not None:
        return False
    entries = fl.epoch_cache.entries
    if not entries or entries[len(entries) - 1][0] < fl.epoch:  # not yet in the cache: Python assigns it
        return False
    for i in range(k):
        if ps.leader[i] == <PyObject *>fl:  # the same partition twice: Python answers INVALID_RECORD
            return False
    _active_state(fl, lg)
    ps.leader[k] = _held(fl)
    return True


cdef tuple _rows_after_failure(_Parts *ps, int32_t failed):
    # The answer rows as execute builds them (request order), those before partition ``failed``
    # filled in; the failed partition's row; the (tp, row) slots and {tp: records} entries of the
    # partitions after it (not appended yet); the acks=-1 partitions before it still waiting for the
    # HW, as (Partition, required offset, tp, row, base offset, append time, log start) with their
    # rows left unfilled: produce.fast_write_failed's arguments.
    cdef list out = [], rows, slots = [], row, failed_row = None, parked = []
    cdef dict rest = {}
    cdef int32_t t, j, k = 0
    cdef FastLeader fl
    for t in range(ps.n_topics):
        rows = []
        for j in range(ps.t_parts[t]):
            fl = <FastLeader>ps.leader[k]
            if k < failed and ps.wait[k]:
                # acks=-1 appended, waiting for the HW: its row is filled when decided
                row = [ps.index[k], 0, -1, -1, -1, None]
                parked.append((fl.partition, ps.last[k] + 1, fl.tp, row, ps.base[k], ps.time[k], ps.start[k]))
            elif k < failed:
                row = [ps.index[k], 0, ps.base[k], ps.time[k], ps.start[k], None]
            else:
                row = [ps.index[k], 0, -1, -1, -1, None]
                if k == failed:
                    failed_row = row
                else:
                    slots.append((fl.tp, row))
                    rest[fl.tp] = <object>ps.buf[k]
            rows.append(row)
            k += 1
        out.append((<object>ps.name[t], rows))
    return out, failed_row, slots, rest, parked


cdef ProduceRequest _header(int api_key, int version):
    cdef ProduceRequest req = ProduceRequest.__new__(ProduceRequest)
    req.api_key = api_key
    req.api_version = version
    return req


cdef inline int _bump(dict counts, key, int64_t n) except -1:
    cdef object v = counts.get(key)
    counts[key] = n if v is None else v + n
    return 0


cdef bytes _encode_rows(int version, int32_t correlation_id, const unsigned char *f, _Parts *ps):
    # encode_produce_response of the appended partitions, in request order (each topic name's bytes
    # as the request carried them in the frame ``f``)
    cdef _Writer w = _out
    cdef int32_t t, j, k = 0
    cdef bint flex = version >= PRODUCE_FLEX
    w.pos = 0
    w.reserve(4 + 4 + 1 + 5)
    w.pos = 4
    w.i32(correlation_id)
    if flex:
        w.uvarint(0)                # response header v1: no tagged fields
    _count(w, flex, ps.n_topics)
    for t in range(ps.n_topics):
        w.reserve(5 + ps.t_len[t] + 5)
        if flex:
            w.uvarint(<uint64_t>ps.t_len[t] + 1)
        else:
            w.i16(ps.t_len[t])
        memcpy(w.p + w.pos, f + ps.t_at[t], ps.t_len[t])
        w.pos += ps.t_len[t]
        _count(w, flex, ps.t_parts[t])
        for j in range(ps.t_parts[t]):
            _produce_row(w, version, ps.index[k], 0, ps.base[k], ps.time[k], ps.start[k], None)
            k += 1
        _no_tags(w, flex)
    return _produce_end(w, flex)


# ---- acks=all with followers: the request parked until the high watermark covers it ---------------
cdef enum:
    _PARKED = -1                # a row still waiting (DelayedProduce's UNDECIDED)


cdef _Writer _parked_out = _Writer()


cdef class ParkedProduce:
    """An acks=-1 Produce the native path appended to partitions whose ISR has followers, waiting for
    the high watermark: a waiter in ReplicaManager's protocol, DelayedProduce's twin for this path.
    Each waiting partition's ``Partition.waiters`` holds ``(last offset + 1, this)``; ``decide(tp,
    code)`` comes from ReplicaManager._complete (0: the HW covers it) and _fail_waiters
    (NOT_LEADER_OR_FOLLOWER, NOT_ENOUGH_REPLICAS_AFTER_APPEND), ``expire`` from the timer at timeout_ms
    (REQUEST_TIMED_OUT, as ReplicaManager._timed_out). DelayedProduce's rules: a partition is decided
    once; an error answers base offset, append time and log start -1 and no message (produce._fill's
    row of a failed result) and counts produce_failed for its topic; when the last is decided the
    timer is cancelled and the answer encoded once: ``future``'s result is ([bytes]), the bytes
    produce.handle_native would answer. No per-partition dict: the rows are C arrays in request order.
    Threads: the event-loop thread only."""

    cpdef decide(self, tp, int error_code):
        """``tp``'s outcome (0 or an error code), unless it is already decided."""
        cdef int32_t k
        for k in range(self.n):
            if self.tps[k] is tp:
                return self._decide(k, error_code)
        for k in range(self.n):
            if self.tps[k] == tp:
                return self._decide(k, error_code)
        raise KeyError(tp)

    def expire(self):
        """timeout_ms passed: every partition not decided yet answers REQUEST_TIMED_OUT."""
        cdef int32_t k
        for k in range(self.n):
            if self.code[k] == _PARKED:
                self._decide(k, ERR_REQUEST_TIMED_OUT)

    def undecided(self):
        """The tps still waiting (DelayedProduce.undecided)."""
        cdef int32_t k
        return [self.tps[k] for k in range(self.n) if self.code[k] == _PARKED]

    cdef object _decide(self, int32_t k, int error_code):
        if self.code[k] != _PARKED:
            return None
        self.code[k] = <int16_t>error_code
        if error_code:
            self.base[k] = self.time[k] = self.start[k] = -1
        self.remaining -= 1
        if self.remaining == 0:
            if self.timer is not None:
                self.timer.cancel()
            if not self.future.done():
                for k in range(self.n):
                    if self.code[k] and self.produce_failed is not None:
                        self.produce_failed(self.names[self.topic[k]])
                self.future.set_result([self._encode()])
        return None

    cdef bytes _encode(self):
        # encode_produce_response of the rows (each topic name as the request carried it: a name the
        # fast path took was UTF-8, so encoding it gives the same bytes). Its own buffer: the last
        # decide comes from a high-watermark move, which can happen inside a fast Fetch while that
        # answer is being built in _out.
        cdef _Writer w = _parked_out
        cdef int32_t t, j, k = 0
        cdef bint flex = self.version >= PRODUCE_FLEX
        w.pos = 0
        w.reserve(4 + 4 + 1 + 5)
        w.pos = 4
        w.i32(self.correlation_id)
        if flex:
            w.uvarint(0)
        _count(w, flex, self.n_topics)
        for t in range(self.n_topics):
            if flex:
                w.cstring(self.names[t], False)
            else:
                w.string(self.names[t], False)
            w.reserve(5)
            _count(w, flex, self.t_parts[t])
            for j in range(self.t_parts[t]):
                _produce_row(w, self.version, self.index[k], self.code[k], self.base[k], self.time[k],
                             self.start[k], None)
                k += 1
            _no_tags(w, flex)
        return _produce_end(w, flex)


cdef object _park(FastProduce fp, ConnState conn, int version, int32_t correlation_id, int32_t timeout_ms, _Parts *ps,
                  int32_t waiting):
    # append_records' DelayedProduce for the appended request ``ps`` (``waiting`` of its partitions
    # wait for the HW): a ParkedProduce registered with each waiting partition -> its future
    cdef ParkedProduce w = ParkedProduce.__new__(ParkedProduce)
    cdef int32_t k, t
    cdef FastLeader fl
    loop = conn.loop
    w.future = loop.create_future()
    w.produce_failed = fp.produce_failed
    w.version = version
    w.correlation_id = correlation_id
    w.n = ps.n
    w.n_topics = ps.n_topics
    w.remaining = waiting
    w.names = [<object>ps.name[t] for t in range(ps.n_topics)]
    for t in range(ps.n_topics):
        w.t_parts[t] = ps.t_parts[t]
    w.tps = []
    for k in range(ps.n):
        w.tps.append((<FastLeader>ps.leader[k]).tp)
        w.index[k] = ps.index[k]
        w.topic[k] = ps.topic[k]
        w.code[k] = _PARKED if ps.wait[k] else 0
        w.base[k] = ps.base[k]
        w.time[k] = ps.time[k]
        w.start[k] = ps.start[k]
    w.timer = loop.call_later((timeout_ms if timeout_ms > 0 else 0) / 1000.0, w.expire)
    for k in range(ps.n):
        if ps.wait[k]:
            (<FastLeader>ps.leader[k]).waiters.append((ps.last[k] + 1, w))
    return w.future
