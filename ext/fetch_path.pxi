# Included by request.pyx: the Fetch fast path and the follower high-watermark advance.

# dispatch_frames serves a Fetch v4-17 frame here when it is the common consumer request: replica_id < 0,
# no fetch session, no forgotten topics, any rack id (an empty one with a replica selector set), any
# number of topics and partitions, each partition's leader slot (FastLeader, the one the Produce path
# uses: armed and disarmed by the ReplicaManager on leadership changes) armed, current_leader_epoch -1
# or the slot's, log start <= fetch_offset <= log end, a read (fetch_offset < high watermark) in the
# active segment with batch boundaries the segment's recent-batch list or read block answer (a
# read_committed consumer's up to the log's last stable offset, with the aborted transactions of the range
# read: per partition, never per record), and an
# answer fetch.handle_native would give at once (bytes >= min_bytes, or max_wait_ms <= 0) whose records
# (whole batches, as Log.read cuts them under fetch._read's shrinking budget) are below the sendfile
# threshold in total and copied from the segments' read blocks (read as LogSegment.read_bytes reads
# one). The high watermark, log start offset, active segment and offline flag are read from the Log per
# request (no copies to keep exact). Everything else is left untouched for the reference path
# (fetch.handle_native -> _read -> Log.read), which stays the reference: the answer here must be the
# same bytes (tests/test_native_differential.py, tests/test_fetch_fast.py). The flexible versions (v12+)
# are taken when the request carries no tagged field (v15+: so never a follower's, whose id is in the
# tagged replica_state); last_fetched_epoch is read past, as the reference path reads past it (kafka-python
# sends its position's epoch); v13+'s topic ids are looked up in the broker's id -> name map (an unknown
# id: the reference path answers UNKNOWN_TOPIC_ID).

cdef enum:
    _UNDECIDED = -2                         # a read position the native path leaves to Python

cdef int64_t _I64_MAX = 0x7FFFFFFFFFFFFFFF
# fetch.py _RESPONSE_DATA_CEILING: record data never brings an answer near the int32 size limit
cdef int64_t _DATA_CEILING = 0x7FFFFFFF - (64 << 20)


cdef class FastFetch:
    """The Fetch handler dispatch_frames gets (broker.py): called as ``handle_native`` for any request
    the native path leaves (``reference_path(conn, req)``). Reads the ReplicaManager's armed leader slots
    (``leaders``, shared with FastProduce), counts BytesOut per topic in ``bytes_out`` (never
    replaced), caps answers by the broker's ``fetch.max.bytes`` (``config_values``: the BrokerConfig's
    dict of typed values) and copies records from the segments' read blocks (``blocks``: the process's
    ReadBlocks, kbroker.log.segment.read_blocks, which LogSegment reads through too).
    ``fast``/``reference``: requests served natively / through ``reference_path`` (tests, A/B)."""

    def __init__(self, reference_path, rearm, dict leaders not None, dict bytes_out not None,
                 dict config_values not None, ReadBlocks blocks not None, int32_t local_id,
                 dict topic_configs not None, complete, broker_metrics, dict topic_ids=None):
        self.reference_path, self.rearm, self.leaders, self.bytes_out = reference_path, rearm, leaders, bytes_out
        self.config_values, self.blocks, self.local_id = config_values, blocks, local_id
        self.topic_configs, self.complete, self.broker_metrics = topic_configs, complete, broker_metrics
        # MetadataCache.topic_ids (id -> name; never replaced): v13+ fetches name topics by id. Without
        # it those take the reference path.
        self.topic_ids = topic_ids if topic_ids is not None else {}

    def reread(self, ConnState conn not None, bytes frame not None):
        """A long poll's read of a follower's fetch whose positions were recorded natively (fetch.py
        ``_poll_recorded``; ``frame``: FetchRequest.frame) -> [the answer's chunks, its records' size],
        or None: Python's read (fetch._read) this time."""
        cdef list out = []
        if _fetch_fast(self, conn, frame, <const unsigned char *>PyBytes_AS_STRING(frame), 0, len(frame), None,
                       None, out) is None:
            return out
        return None

    def __call__(self, conn, req):
        if type(req) is FetchRequest and (<FetchRequest>req).recorded:
            self.follower_polled += 1   # not "reference": its positions were recorded natively
        else:
            self.reference += 1
            if type(req) is FetchRequest and (<FetchRequest>req).replica_id >= 0:
                self.follower_reference += 1
        return self.reference_path(conn, req)


cdef int64_t _batch_position(FastFetch ff, seg, SegmentState st, int64_t offset,
                             int64_t start_position) except -3:
    """LogSegment.batch_position answered from the recent-batch list or the read block, as that method
    does (its block cursor moved the same way); _UNDECIDED where it would load a block or search the
    index and the file (the reference path then does)."""
    cdef int64_t pos = tail_position(st, offset, start_position), bpos, size = 0, base = -1, last = -1
    cdef ReadBlock block
    if pos != -2:
        return pos                      # -1: past the last batch
    block = ff.blocks.get(seg)
    if block is None or offset <= block.floor:
        return _UNDECIDED
    bpos = block.pos
    pos = seek_in(PyBytes_AS_STRING(block.data), bpos, bpos + len(block.data),
                  block.cursor if offset > block.cursor_floor else bpos, st.size, offset, _I64_MAX,
                  &size, &base, &last)
    if size:
        block.cursor = pos
        block.cursor_floor = base - 1
        return pos if pos >= start_position else _UNDECIDED
    if pos + HEADER_SIZE > st.size:
        return -1                       # past the last batch
    return _UNDECIDED


cdef int64_t _end_position(FastFetch ff, seg, SegmentState st, int64_t start, int64_t max_bytes,
                           int64_t max_offset, bint min_one_batch) except -3:
    """LogSegment.end_position(start, max_bytes, max_offset, min_one_batch) from the recent-batch
    list or the read block; _UNDECIDED where that method would load a block or walk the file."""
    cdef int64_t end = st.size, pos, limit, byte_end, bpos, bend, size = 0, base, last
    cdef ReadBlock block
    if max_offset < st.next_offset:
        pos = _batch_position(ff, seg, st, max_offset, start)
        if pos == _UNDECIDED:
            return _UNDECIDED
        if pos >= 0:
            end = pos
    if end - start <= max_bytes:
        return end
    limit = start + max_bytes
    byte_end = tail_end(st, start, limit, min_one_batch)
    if byte_end != -2:
        return end if end < byte_end else byte_end
    block = ff.blocks.get(seg)
    if block is None:
        return _UNDECIDED               # loads a block (a small read) or walks the file
    bpos = block.pos
    bend = bpos + len(block.data)
    if start < bpos or (limit + HEADER_SIZE > bend and bend < end):
        return _UNDECIDED
    pos = seek_in(PyBytes_AS_STRING(block.data), bpos, bend, start, end, _I64_MAX, limit, &size, &base, &last)
    if not size:
        return _UNDECIDED               # the index and the file
    byte_end = pos
    if byte_end == start and min_one_batch:
        byte_end = start + size
    return end if end < byte_end else byte_end


cdef inline bint _valid_utf8(const unsigned char *s, Py_ssize_t n):
    # whether n bytes decode as a request string does (the common ASCII name: no decode)
    cdef Py_ssize_t i
    for i in range(n):
        if s[i] >= 0x80:
            return _utf8(s, n) is not _REFUSED
    return True


cdef object _fetch_fast(FastFetch ff, ConnState conn, object view, const unsigned char *p, Py_ssize_t begin,
                        Py_ssize_t size, no_response, close, list reread=None):
    """The frame at ``begin`` (``size`` bytes; ``view``: a buffer holding it) walked once -> None:
    served natively (its Slot queued with the answer); or the FetchRequest parse_fetch would give, for
    the caller's path: a follower's fetch with nothing to read whose positions were recorded here
    (FetchRequest.recorded: the caller's path long-polls it), or not the common request (nothing was
    done but read blocks read and their cursors moved as the reference path reads and moves them). A
    malformed frame raises ProtocolError as parse_fetch does. ``reread``: a long poll's read of a
    follower's fetch recorded before (FastFetch.reread): nothing recorded, no Slot; None with [the
    answer's chunks, its records' size] appended to ``reread`` (whether or not that is min_bytes: the
    poll decides), or _REFUSED (Python's read)."""
    cdef const unsigned char *f = p + begin
    cdef Py_ssize_t pos = 8, name_at, topics_at, count_at, part_len
    cdef int64_t name_len, rack_len = 0, n_topics, n_parts, t, j
    cdef int32_t version, correlation_id, replica_id = -1, max_wait_ms, min_bytes, max_bytes, index
    cdef int32_t leader_epoch = -1, part_max, session_epoch = -1
    cdef bint flex, by_id
    cdef int8_t isolation
    cdef int64_t fetch_offset, hw, lso, log_start, start = 0, end, n, budget, limit, total = 0, topic_total
    cdef int64_t sendfile_min, rd_max
    cdef bint first = True, follower
    cdef object rid = None, fs, tcfg
    cdef list recs = None                   # a follower's partitions: (FastLeader, FollowerState, fetch
                                            # offset, current leader epoch, log end, the row's position)
    cdef object client_id = None, rack = "", name, tparts, seg, cap, metrics, name0 = None, aborted = None
    cdef bint committed
    cdef LogState lg
    cdef ReadBlock block
    cdef list more = None                   # BytesOut: the first topic with data (name0, total0), the others
    cdef int64_t total0 = 0
    cdef FastLeader fl
    cdef SegmentState st
    cdef FetchRequest req
    cdef Slot slot
    cdef _Writer w
    cdef double started = _monotonic()
    if size < pos + 2:
        return _fetch_declined(view, f, begin, size, None, -1, -1, reread)
    version = <int16_t>load_be16(<const char *>f + 2)
    correlation_id = <int32_t>load_be32(<const char *>f + 4)
    flex = version >= FETCH_FLEX
    by_id = version >= FETCH_IDS
    client_id = _client_id(f, size, &pos)
    if client_id is _REFUSED:
        return _fetch_declined(view, f, begin, size, None, -1, -1, reread)
    if flex and not _no_tags_at(f, size, &pos):                  # the request header's tags
        return _fetch_declined(view, f, begin, size, None, -1, -1, reread)
    # [replica_id (before v15: then in the tagged replica_state)], max_wait_ms, min_bytes, max_bytes,
    # isolation_level, [session_id, session_epoch], the topic count
    if size - pos < (4 if version < FETCH_STATE else 0) + 13 + (8 if version >= 7 else 0) + 4:
        return _fetch_declined(view, f, begin, size, None, -1, -1, reread)
    if version < FETCH_STATE:
        replica_id = <int32_t>load_be32(<const char *>f + pos)
        pos += 4
    max_wait_ms = <int32_t>load_be32(<const char *>f + pos)
    min_bytes = <int32_t>load_be32(<const char *>f + pos + 4)
    max_bytes = <int32_t>load_be32(<const char *>f + pos + 8)
    isolation = <int8_t>f[pos + 12]
    pos += 13
    follower = replica_id >= 0
    committed = not follower and isolation == 1
    req = FetchRequest.__new__(FetchRequest)
    req.api_key = FETCH
    req.api_version = version
    req.correlation_id = correlation_id
    req.client_id = client_id
    req.replica_id = replica_id
    req.max_wait_ms = max_wait_ms
    req.min_bytes = min_bytes
    req.max_bytes = max_bytes
    req.isolation_level = isolation
    req.session_epoch = -1
    if version >= 7:
        session_epoch = <int32_t>load_be32(<const char *>f + pos + 4)
        req.session_id = <int32_t>load_be32(<const char *>f + pos)
        req.session_epoch = session_epoch
        pos += 8
        # a fetch session (an id, or an epoch other than -1: 0 asks for one) is fetch.py's
        if req.session_id != 0 or session_epoch != -1:
            return _fetch_declined(view, f, begin, size, req, pos, -1, reread)
    count_at = pos
    if flex:
        n_topics = _fuv(f, size, &pos) - 1
    else:
        n_topics = <int32_t>load_be32(<const char *>f + pos)
        pos += 4
    topics_at = pos
    # The whole frame's layout first (nothing read before it is known to be the common request): each
    # topic's name (UTF-8, not empty; v13+: its id) and partitions (index, [current_leader_epoch],
    # fetch_offset, [last_fetched_epoch], [log_start_offset], max bytes, [no tagged field]), no
    # forgotten topics, a rack id (UTF-8, any: no replica selector, so fetch.py ignores it, KIP-392's
    # preferred read replica is always -1), no tagged field (v15+: so no follower), nothing after.
    part_len = 4 + (4 if version >= 9 else 0) + 8 + (4 if flex else 0) + (8 if version >= 5 else 0) + 4 + flex
    if n_topics < 0:
        return _fetch_declined(view, f, begin, size, req, count_at, -1, reread)
    for t in range(n_topics):
        if by_id:
            if size - pos < 16:
                return _fetch_declined(view, f, begin, size, req, count_at, -1, reread)
            pos += 16
        elif flex:
            name_len = _fuv(f, size, &pos) - 1
            if name_len <= 0 or name_len > 0x7FFF or size - pos < name_len or not _valid_utf8(f + pos, name_len):
                return _fetch_declined(view, f, begin, size, req, count_at, -1, reread)
            pos += name_len
        else:
            if size - pos < 2:
                return _fetch_declined(view, f, begin, size, req, count_at, -1, reread)
            name_len = <int16_t>load_be16(<const char *>f + pos)
            if name_len <= 0 or size - pos - 2 < name_len + 4 or not _valid_utf8(f + pos + 2, name_len):
                return _fetch_declined(view, f, begin, size, req, count_at, -1, reread)
            pos += 2 + name_len
        if flex:
            n_parts = _fuv(f, size, &pos) - 1
        else:
            n_parts = <int32_t>load_be32(<const char *>f + pos)
            pos += 4
        if n_parts < 0 or n_parts * part_len > size - pos:
            return _fetch_declined(view, f, begin, size, req, count_at, -1, reread)
        if flex:
            for j in range(n_parts):
                if f[pos + part_len - 1] != 0:                  # the partition's tagged fields
                    return _fetch_declined(view, f, begin, size, req, count_at, -1, reread)
                pos += part_len
            if not _no_tags_at(f, size, &pos):                   # the topic's
                return _fetch_declined(view, f, begin, size, req, count_at, -1, reread)
        else:
            pos += n_parts * part_len
    if version >= 7:
        if flex:
            if size - pos < 1 or f[pos] != 1:                     # forgotten topics (compact: 1 is empty)
                return _fetch_declined(view, f, begin, size, req, count_at, -1, reread)
            pos += 1
        else:
            if size - pos < 4 or <int32_t>load_be32(<const char *>f + pos) != 0:     # forgotten topics
                return _fetch_declined(view, f, begin, size, req, count_at, -1, reread)
            pos += 4
    if version >= 11:
        if flex:
            rack_len = _fuv(f, size, &pos) - 1
        elif size - pos < 2:
            return _fetch_declined(view, f, begin, size, req, count_at, -1, reread)
        else:
            rack_len = <int16_t>load_be16(<const char *>f + pos)
            pos += 2
        if rack_len < 0 or size - pos < rack_len:
            return _fetch_declined(view, f, begin, size, req, count_at, -1, reread)
        if rack_len:
            # KIP-392: with a replica selector the leader may name another replica: Python's answer
            if ff.config_values.get("replica.selector.class") is not None:
                return _fetch_declined(view, f, begin, size, req, count_at, -1, reread)
            rack = _utf8(f + pos, rack_len)
            if rack is _REFUSED:
                return _fetch_declined(view, f, begin, size, req, count_at, -1, reread)
        pos += rack_len
    if flex and not _no_tags_at(f, size, &pos):                   # the request's (v15+: replica_state)
        return _fetch_declined(view, f, begin, size, req, count_at, -1, reread)
    if pos != size:
        return _fetch_declined(view, f, begin, size, req, count_at, -1, reread)
    req.rack_id = rack
    # fetch._read's budget: the request's max_bytes capped by fetch.max.bytes (a follower's:
    # replica.fetch.response.max.bytes) and the data ceiling
    cap = ff.config_values.get("replica.fetch.response.max.bytes" if follower else "fetch.max.bytes")
    if cap is None:
        return _fetch_declined(view, f, begin, size, req, topics_at, n_topics, reread)
    budget = cap
    if max_bytes < budget:
        budget = max_bytes
    if budget > _DATA_CEILING:
        budget = _DATA_CEILING
    sendfile_min = conn._sendfile_min
    # fetch._read partition by partition in request order (Log.read of the active segment: from the
    # batch holding fetch_offset, whole batches below the HW, the first batch of the answer whole as
    # KIP-74, the budget shrinking by what each partition got), written as encode_fetch_response
    # writes it; the records (all of them below the sendfile threshold: fetch._read copies each from
    # the read block) copied from the read blocks
    if follower:
        rid = replica_id
        if reread is None:
            recs = []
    elif reread is not None:
        return _fetch_declined(view, f, begin, size, req, topics_at, n_topics, reread)
    w = _out
    _fetch_head(w, version, correlation_id, 0, n_topics)
    pos = topics_at
    for t in range(n_topics):
        if by_id:
            name_at = pos
            name_len = 16
            pos += 16
            name = ff.topic_ids.get(PyBytes_FromStringAndSize(<const char *>f + name_at, 16))
            if name is None:
                return _fetch_declined(view, f, begin, size, req, topics_at, n_topics, reread)                # an unknown id: UNKNOWN_TOPIC_ID is the reference path's
        else:
            if flex:
                name_len = _fuv(f, size, &pos) - 1
                name_at = pos
            else:
                name_len = <int16_t>load_be16(<const char *>f + pos)
                name_at = pos + 2
            pos = name_at + name_len
            name = _utf8(f + name_at, name_len)
        if flex:
            n_parts = _fuv(f, size, &pos) - 1
        else:
            n_parts = <int32_t>load_be32(<const char *>f + pos)
            pos += 4
        tparts = ff.leaders.get(name)
        if tparts is None:
            return _fetch_declined(view, f, begin, size, req, topics_at, n_topics, reread)
        # authorization hook: a topic not yet allowed Read (a follower: no ClusterAction yet) on this
        # connection takes the reference path
        if conn._acl_read is not None and not (conn._acl_cluster if follower else name in <set>conn._acl_read):
            return _fetch_declined(view, f, begin, size, req, topics_at, n_topics, reread)
        if follower:
            # leader.replication.throttled.replicas set for the topic: the leader quota's counting
            # (ReplicaManager.record_leader_bytes) is Python's
            tcfg = ff.topic_configs.get(name)
            if tcfg and tcfg.get("leader.replication.throttled.replicas"):
                return _fetch_declined(view, f, begin, size, req, topics_at, n_topics, reread)
        # the topic as the request named it (its name's bytes, or its id)
        w.reserve(5 + name_len + 5)
        if not by_id:
            if flex:
                w.uvarint(<uint64_t>name_len + 1)
            else:
                w.i16(<int16_t>name_len)
        memcpy(w.p + w.pos, f + name_at, name_len)
        w.pos += name_len
        _count(w, flex, n_parts)
        topic_total = 0
        for j in range(n_parts):
            index = <int32_t>load_be32(<const char *>f + pos)
            pos += 4
            if version >= 9:
                leader_epoch = <int32_t>load_be32(<const char *>f + pos)
                pos += 4
            fetch_offset = <int64_t>load_be64(<const char *>f + pos)
            pos += 8
            if flex:
                pos += 4                                          # last_fetched_epoch: unused
            if version >= 5:
                pos += 8                                          # the follower's log start: unused
            part_max = <int32_t>load_be32(<const char *>f + pos)
            pos += 4 + flex                                       # [the partition's empty tag buffer]
            fl = (<dict>tparts).get(index)
            if fl is None or (leader_epoch >= 0 and leader_epoch != fl.epoch):
                return _fetch_declined(view, f, begin, size, req, topics_at, n_topics, reread)                # epoch fencing (KIP-320): the reference path answers the error
            if fl.partition.leader_epoch != fl.epoch:
                ff.rearm(fl.tp)         # a leadership change a re-arm missed: the next request sees the new slot
                return _fetch_declined(view, f, begin, size, req, topics_at, n_topics, reread)
            if fl.partition.leader_id != ff.local_id:
                return _fetch_declined(view, f, begin, size, req, topics_at, n_topics, reread)
            if follower:
                # record_follower_fetch's common case only: an ISR follower (no expansion, never
                # throttled: ReplicaManager.leader_throttled), known, of a leader whose ISR writes stand
                if fl.partition.stale or rid not in fl.partition.isr:
                    return _fetch_declined(view, f, begin, size, req, topics_at, n_topics, reread)
                fs = fl.partition.followers.get(rid)
                if fs is None:
                    return _fetch_declined(view, f, begin, size, req, topics_at, n_topics, reread)
            lg = fl.log
            if lg.offline or lg._write_job is not None:
                return _fetch_declined(view, f, begin, size, req, topics_at, n_topics, reread)
            hw = lg._high_watermark
            log_start = lg.log_start_offset
            if fetch_offset < log_start:
                return _fetch_declined(view, f, begin, size, req, topics_at, n_topics, reread)                # out of range
            st = _active_state(fl, lg)
            seg = fl.seg
            limit = part_max if part_max < budget else budget
            n = 0
            # Log.read's bound: the HW for consumers (the last stable offset for read_committed ones), the
            # log end for followers
            lso = hw
            if committed:
                lso = (<object>lg).last_stable_offset
            rd_max = st.next_offset if follower else lso
            if fetch_offset >= rd_max:  # Log.read: nothing to read yet (an empty row); past the log end
                if fetch_offset > st.next_offset:       # out of range
                    return _fetch_declined(view, f, begin, size, req, topics_at, n_topics, reread)
            else:
                if fetch_offset < st.base_offset or rd_max > st.next_offset or (first and limit < 0):
                    return _fetch_declined(view, f, begin, size, req, topics_at, n_topics, reread)            # an older segment
                start = _batch_position(ff, seg, st, fetch_offset, 0)
                if start < 0:
                    return _fetch_declined(view, f, begin, size, req, topics_at, n_topics, reread)
                end = _end_position(ff, seg, st, start, limit, rd_max, first)
                if end == _UNDECIDED:
                    return _fetch_declined(view, f, begin, size, req, topics_at, n_topics, reread)
                n = end - start
                if n > 0:
                    total += n
                    if total >= sendfile_min:
                        return _fetch_declined(view, f, begin, size, req, topics_at, n_topics, reread)        # sent by sendfile
                    # LogSegment.read_bytes' block (None: read from the file, by the reference path)
                    block = ff.blocks.holding(seg, <int>seg.read_fd, start, n, st.size)
                    if block is None:
                        return _fetch_declined(view, f, begin, size, req, topics_at, n_topics, reread)
                else:
                    n = 0
            if recs is not None:        # its HW is written once the position is recorded (below)
                recs.append((fl, fs, fetch_offset, leader_epoch, st.next_offset, w.pos))
            if committed:
                # fetch._read: the aborted transactions that may hold data in what is served
                aborted = (<object>lg).aborted_transactions(fetch_offset, lso) if n else []
            _fetch_row(w, version, index, 0, hw, lso, log_start, aborted)
            _records_len(w, flex, n)
            if n:
                w.reserve(n)
                memcpy(w.p + w.pos, PyBytes_AS_STRING(block.data) + (start - block.pos), n)
                w.pos += n
                budget -= n
                topic_total += n
                first = False
            _no_tags(w, flex)                                     # the partition's
        pos += flex                                               # the request topic's empty tag buffer
        _no_tags(w, flex)                                         # the topic's
        if topic_total:
            if name0 is None:
                name0 = name
                total0 = topic_total
            elif more is None:
                more = [(name, topic_total)]
            else:
                more.append((name, topic_total))
    _no_tags(w, flex)                                             # the answer's
    metrics = conn.server.metrics
    if reread is not None:
        # fetch._read's re-read in the long poll: its bookkeeping whatever the poll makes of it
        if total:
            ff.broker_metrics.replication_bytes_out += total
            metrics.fetch_copy_bytes += total
        store_be32(w.p, <uint32_t>(w.pos - 4))
        reread.append([PyBytes_FromStringAndSize(w.p, w.pos)])
        reread.append(total)
        if total >= min_bytes:
            ff.fast += 1                # the answer (the poll's deadline answers the others)
            ff.follower_fast += 1
        return None
    if total < min_bytes and max_wait_ms > 0:
        if not follower or total:
            return _fetch_declined(view, f, begin, size, req, topics_at, n_topics, reread)    # a long poll
        # a follower's fetch with nothing to read (caught up): its positions recorded here, the long
        # poll left to Python (fetch.handle_native, FetchRequest.recorded), whose re-reads take the frame
        _record_followers(ff, recs, None)
        _fetch_declined(view, f, begin, size, req, topics_at, n_topics, None)
        req.recorded = True
        req.frame = PyBytes_FromStringAndSize(<const char *>f, size)
        return req
    # the answer: fetch._read's bookkeeping (BytesOut per topic, the bytes copied), the Slot
    if follower:
        # each row's HW read after its own position was recorded (fetch._read: record, then read)
        _record_followers(ff, recs, w)
        if total:
            ff.broker_metrics.replication_bytes_out += total
            metrics.fetch_copy_bytes += total
        ff.follower_fast += 1
    elif name0 is not None:
        _bump(ff.bytes_out, name0, total0)
        if more is not None:
            for name, n in more:
                _bump(ff.bytes_out, name, n)
        metrics.fetch_copy_bytes += total
    store_be32(w.p, <uint32_t>(w.pos - 4))
    result = [PyBytes_FromStringAndSize(w.p, w.pos)]
    ff.fast += 1
    slot = _new_slot(req, FETCH, version, follower, conn._pending, conn._request_counts, conn.last_active,
                     conn._read_at, started)
    _end_native(slot, result, no_response, close)
    return None


cdef object _fetch_declined(object view, const unsigned char *f, Py_ssize_t begin, Py_ssize_t size, FetchRequest req,
                            Py_ssize_t at, int64_t n_topics, list reread):
    """A Fetch _fetch_fast does not serve, as parse_fetch gives it, from where the walk stopped: with no
    ``req`` (the header is not one it reads) the whole frame parsed; with ``n_topics`` < 0, ``req``'s
    header kept and the rest parsed from the topic count at ``at`` (a session, or a layout the walk
    does not take: parse_fetch's errors included); else the layout the walk validated (topics from
    ``at``, no forgotten topic, no tagged field, ``req.rack_id`` set) read into ``req.topics`` with no
    check made twice. A re-read (``reread``) makes no request: _REFUSED."""
    cdef _Reader r
    cdef Py_ssize_t pos = at
    cdef int version, t, j
    cdef bint flex, by_id
    cdef int64_t name_len, n_parts
    cdef int32_t partition, leader_epoch
    cdef int64_t fetch_offset, log_start
    cdef list topics, parts
    cdef object name
    if reread is not None:
        return _REFUSED
    if req is None:
        return parse_fetch(view[begin:begin + size])
    if n_topics < 0:
        r = _frame_reader(view[begin:begin + size])
        r.pos = at
        _fetch_body(r, req)
        return req
    version = req.api_version
    flex = version >= FETCH_FLEX
    by_id = version >= FETCH_IDS
    topics = []
    for t in range(n_topics):
        if by_id:
            name = PyBytes_FromStringAndSize(<const char *>f + pos, 16)
            pos += 16
        elif flex:
            name_len = _fuv(f, size, &pos) - 1
            name = _decode_str(f + pos, name_len)
            pos += name_len
        else:
            name_len = <int16_t>load_be16(<const char *>f + pos)
            name = _decode_str(f + pos + 2, name_len)
            pos += 2 + name_len
        if flex:
            n_parts = _fuv(f, size, &pos) - 1
        else:
            n_parts = <int32_t>load_be32(<const char *>f + pos)
            pos += 4
        parts = []
        for j in range(n_parts):
            partition = <int32_t>load_be32(<const char *>f + pos)
            pos += 4
            leader_epoch = -1
            if version >= 9:
                leader_epoch = <int32_t>load_be32(<const char *>f + pos)
                pos += 4
            fetch_offset = <int64_t>load_be64(<const char *>f + pos)
            pos += 8
            if flex:
                pos += 4                                          # last_fetched_epoch
            log_start = -1
            if version >= 5:
                log_start = <int64_t>load_be64(<const char *>f + pos)
                pos += 8
            parts.append((partition, leader_epoch, fetch_offset, log_start, <int32_t>load_be32(<const char *>f + pos)))
            pos += 4 + flex                                       # [the partition's empty tag buffer]
        pos += flex                                               # the topic's
        topics.append((name, parts))
    req.topics = topics
    req.forgotten = []
    return req


cdef int _record_followers(FastFetch ff, list recs, _Writer w) except -1:
    """ReplicaManager.record_follower_fetch for each partition of a follower's fetch, in request order,
    for the case _fetch_fast checked (a known ISR follower, a leader not stale); with ``w``, then each
    row's HW and last stable offset (written before, at the row's position) set to the HW after it, as
    fetch._read reads it after its record (a partition named twice: the first row before the second
    record)."""
    cdef int64_t now = _now_ms(), hw, pos
    for rec in recs:
        _record_one(ff, <tuple>rec, now)
        if w is not None:
            hw = (<FastLeader>(<tuple>rec)[0]).log._high_watermark
            pos = <int64_t>(<tuple>rec)[5]
            store_be64(w.p + pos + 6, <uint64_t>hw)
            store_be64(w.p + pos + 14, <uint64_t>hw)
    return 0


cdef int _record_one(FastFetch ff, tuple rec, int64_t now) except -1:
    """One partition of _record_followers: Partition.update_follower (the follower's LEO, fetch epoch
    and caught-up time), then, past the HW, the leader's HW rule (LogState.advance_hw, as
    Partition.maybe_increment_hw) and _complete when it moved."""
    cdef int64_t o, leo
    cdef object fs, p
    cdef LogState lg
    cdef FastLeader fl = <FastLeader>rec[0]
    fs = rec[1]
    o = <int64_t>rec[2]
    leo = <int64_t>rec[4]
    if o >= leo:
        if now > <int64_t>fs.last_caught_up_ms:
            fs.last_caught_up_ms = now
    elif o >= <int64_t>fs.last_fetch_leader_leo >= 0:
        if <int64_t>fs.last_fetch_ms > <int64_t>fs.last_caught_up_ms:
            fs.last_caught_up_ms = fs.last_fetch_ms
    fs.last_fetch_leader_leo = leo
    fs.last_fetch_ms = now
    fs.leo = o
    fs.fetch_epoch = rec[3]
    lg = fl.log
    if o <= lg._high_watermark:
        return 0                        # an ISR follower at or below the HW cannot move it
    p = fl.partition
    if lg.advance_hw(p.isr, p.followers, ff.local_id, <Py_ssize_t>lg.config.min_insync_replicas, leo):
        ff.complete(p)
    return 0
