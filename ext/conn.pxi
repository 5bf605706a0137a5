# Included by request.pyx: the connection read loop: dispatch of a read's frames, the answers written out.
#
# on_read (Connection.buffer_updated) is one native call per readable event: stamp the read's clocks,
# dispatch_frames over the chunk, prepare the chunk for the next read, take the answers that are one
# chunk (take_answers) and send them in one send when the transport has nothing buffered (the rest, or
# an error, goes to transport.write, which keeps partial writes, backpressure and fatal errors), then
# observe their slots. recv_ready is the readable callback itself on asyncio's selector loop. Every
# uncommon case calls the connection's Python where its own path would: a large frame's buffer, a
# refused size prefix, a chunk to rotate or pool memory to reserve, an answer of several chunks or
# CLOSE. The fields a read touches are C fields of ConnState, the connection's native base.

def dispatch_frames(ConnState conn not None, chunk, Py_ssize_t start, Py_ssize_t end, Py_ssize_t max_frame, produce, fetch,
                    dict supported, no_response, close):
    """Every complete frame of a receive chunk (kbroker.network.connection ``_parse_chunk``), from
    ``start`` up to ``end``, in one call per read, or the one frame of a buffer of its own (an mmap,
    size prefix included: ``_complete_frame``): a Produce v3-11 / Fetch v4-17 frame whose version is
    advertised (``supported``, api.SUPPORTED) and has a handler (``produce``/``fetch``, None when the
    native path is off) is parsed, counted, handled and, when the handler returns its encoded answer,
    queued right here; any other frame, a malformed one included, goes to ``conn._dispatch`` (which
    gives the generic outcome: a malformed frame is logged and closes the connection), an awaitable
    answer to ``conn._dispatch_later`` and a failing handler to ``conn._handler_raised``. The
    connection's ``_start`` follows each frame. Stops when the connection closes.

    Consecutive Produce frames (a run starts at one that another complete frame follows) form one
    write-behind run (ext/segment.pyx LeaderAppender): their plain leader appends are written
    together, one writev per log, when the run ends: before any other frame is handled, before an
    answer could be sent, and before this returns (the chunk is then free to be reused). When a
    log's write failed (at the run's end, or earlier when something else had to write that log's
    deferred bytes first), the log was cut back to the first of them, and each request whose batch
    was cut away answers as Kafka answers a failed append (``_lost_answers``): that partition's row
    KAFKA_STORAGE_ERROR with base offset, append time and log start -1 (and, from v8, the write's
    error message, as the reference path), its other rows unchanged; an acks=0 request closes the
    connection; an acks=all wait on the batch was decided KAFKA_STORAGE_ERROR (Log.on_cut,
    ReplicaManager._appends_cut). The connection stays open.
    -> 0 (the rest is an incomplete frame, or nothing), 1 (the frame at ``conn._start`` announces a
    size outside (0, max_frame]) or 2 (the frame at ``conn._start`` will not fit in this chunk)."""
    return _dispatch_chunk(conn, chunk, start, end, max_frame, produce, fetch, supported, no_response, close)


cdef object _dispatch_chunk(ConnState conn, chunk, Py_ssize_t start, Py_ssize_t end, Py_ssize_t max_frame, produce, fetch,
                            dict supported, no_response, close):
    # dispatch_frames (and on_read) without the Python call
    cdef bint run = False
    cdef Py_buffer pb
    # the chunk's buffer: a receive chunk's bytearray, or the mmap of a frame too large for one
    PyObject_GetBuffer(chunk.buf, &pb, PyBUF_SIMPLE)
    try:
        return _dispatch_frames(conn, chunk, <const unsigned char *>pb.buf, pb.len, start, end, max_frame,
                                produce, fetch, supported, no_response, close, &run)
    finally:
        if run:
            _end_run(conn, &run, no_response, close)
        PyBuffer_Release(&pb)


cdef inline int _answered(ConnState conn, bint *run, no_response, close) except -1:
    # a request's answer is queued: sent now unless more frames of this read follow
    if not conn._in_read:
        if run[0]:
            _end_run(conn, run, no_response, close)     # an answer leaves only after its batch is written
        conn._flush()
    return 0


cdef inline bint _frame_follows(const unsigned char *p, Py_ssize_t start, Py_ssize_t end) noexcept:
    # a complete frame starts at ``start``
    cdef int32_t size
    if end - start < 4:
        return False
    size = <int32_t>load_be32(<const char *>p + start)
    return 0 < size <= end - start - 4


cdef object _dispatch_frames(ConnState conn, chunk, const unsigned char *p, Py_ssize_t buflen, Py_ssize_t start,
                             Py_ssize_t end, Py_ssize_t max_frame, produce, fetch, dict supported, no_response,
                             close, bint *run):
    cdef object view = chunk.view
    cdef Py_ssize_t begin
    cdef int32_t size
    cdef int key, version
    cdef object handler, parse, frame, sv, result, req
    cdef Slot slot
    cdef FastProduce fast = produce if type(produce) is FastProduce else None
    cdef FastFetch ffast = fetch if type(fetch) is FastFetch else None
    cdef int done
    while not conn.closed:
        if end - start < 4:
            return 0
        size = <int32_t>load_be32(<const char *>p + start)
        if size <= 0 or size > max_frame:
            return 1
        begin = start + 4
        if end - begin < size:
            return 2 if begin + size > buflen else 0
        start = begin + size
        conn._start = start
        handler = None
        key = -1
        if size >= 4:
            key = <int16_t>load_be16(<const char *>p + begin)
            version = <int16_t>load_be16(<const char *>p + begin + 2)
            if key == PRODUCE:
                if C_PRODUCE_MIN <= version <= C_PRODUCE_MAX:
                    handler, parse = produce, parse_produce
            elif key == FETCH:
                if C_FETCH_MIN <= version <= C_FETCH_MAX:
                    handler, parse = fetch, parse_fetch
            if handler is not None:
                sv = supported.get(key)
                if sv is None or not (sv[0] <= version <= sv[1]):
                    handler = None
        if handler is None or key != PRODUCE:
            if run[0]:
                _end_run(conn, run, no_response, close)     # anything else may read or write the logs
                if conn.closed:
                    return 0
            if handler is None:
                conn._dispatch(view[begin:begin + size], chunk)
                continue
        done = False
        req = None
        try:
            if key == PRODUCE:
                if fast is not None:
                    # the frame walked once: served (None), or parsed for the handler
                    req = _produce_fast(fast, conn, view, p, begin, size, start, end, run, no_response, close,
                                        chunk)
                    done = req is None
            elif ffast is not None:
                req = _fetch_fast(ffast, conn, view, p, begin, size, no_response, close)
                done = req is None
        except ProtocolError:
            conn._dispatch(view[begin:begin + size], chunk)     # malformed: the generic outcome
            continue
        except Exception:
            # as a raising handler: logged, the connection closed (the slot only names the request)
            conn._handler_raised(_new_slot(_header(key, version), key, version, False, conn._pending,
                                           conn._request_counts, conn.last_active, conn._read_at,
                                           _monotonic()))
            continue
        if done == 1:
            _answered(conn, run, no_response, close)
            continue
        if req is not None:
            # the request the fast path's walk parsed (a Fetch's ``recorded``: its follower's positions
            # were recorded, the long poll's reads take the frame again)
            slot = _new_slot(req, key, version, key == FETCH and (<FetchRequest>req).replica_id >= 0,
                             conn._pending, conn._request_counts, conn.last_active, conn._read_at, _monotonic())
        else:
            # no fast path: parsed here
            frame = view[begin:begin + size]
            try:
                slot = _begin_native(frame, parse, conn._pending, conn._request_counts, conn.last_active,
                                     conn._read_at)
            except ProtocolError:
                conn._dispatch(frame, chunk)        # malformed: the generic outcome (nothing was queued)
                continue
        if key == PRODUCE and not run[0] and _frame_follows(p, start, end):
            # a run only when another frame of the chunk follows: a lone request (one in flight) is
            # written as it is handled, so a failing disk still answers it KAFKA_STORAGE_ERROR
            run_begin()
            run[0] = True
        if run[0]:
            set_run_tag(len(_run_slots))    # the reference path's appends defer in the run as the fast path's
            _run_slots.append(slot)
        try:
            result = handler(conn, slot.header)
        except Exception:
            conn._handler_raised(slot)
            continue
        if _end_native(slot, result, no_response, close):
            _answered(conn, run, no_response, close)
        else:
            conn._dispatch_later(slot, result, chunk)
    return 0


def take_answers(pending, list out, list answered, no_response):
    """The send path's common case (kbroker.network.connection ``_flush``): from the head of ``pending``
    (a deque of Slots in request order) take every done slot whose answer is one chunk (appended to
    ``out``) or nothing (``no_response``), each slot to ``answered``. Stops at the first slot not done
    or with any other answer (CLOSE, several chunks), which stays at the head for the caller."""
    _take_answers(pending, out, answered, no_response)


cdef int _take_answers(pending, list out, list answered, no_response) except -1:
    cdef Slot slot
    cdef object chunks
    popleft = pending.popleft
    while pending:
        slot = <Slot?>pending[0]
        if not slot.done:
            return 0
        chunks = slot.chunks
        if chunks is no_response:
            pass
        elif type(chunks) is list and len(<list>chunks) == 1:
            out.append((<list>chunks)[0])
        else:
            return 0
        popleft()
        answered.append(slot)
    return 0


# ---- one native call per readable event -------------------------------------------------------------
# kbroker.network.connection binds ``Connection.buffer_updated`` / ``get_buffer`` to ``on_read`` /
# ``next_buffer`` (KBROKER_NATIVE_READ, on by default, on both loops). The common read:
# bytes landed in the receive chunk -> every complete frame dispatched (dispatch_frames) -> the chunk
# prepared for the next read (reused from its start, or the rest of its tail) -> the answers of the
# read taken (take_answers) and written in one send -> their slots observed. Everything else is the
# connection's Python, called from here at the point where Python's own path would be: a frame in a
# buffer of its own (``_read_rest``: all of buffer_updated but the clocks), a size prefix that is
# refused or needs a buffer of its own (``_chunk_code``), a chunk to rotate or pool memory to reserve
# (``_prepare`` / ``_wait_for_memory``), an answer that is not one chunk (CLOSE, sendfile regions:
# ``_flush`` after what was taken left). The connection's Python ``_read_py`` stays the reference.

cdef class ReadStats:
    """Reads served by ``on_read`` (native) and by the connection's Python (reference: a large frame's
    buffer, or KBROKER_NATIVE_READ=0); one per server (NetworkMetrics.reads)."""


cdef class ConnState:
    """The fields of a client connection (kbroker.network.connection.Connection, a subclass) that
    every read touches, as C fields: ``on_read`` reads and writes them without attribute lookups
    (Python code sees them as ordinary attributes). The connection's other state stays in its dict."""


cdef dict _rd_supported = None
cdef object _rd_no_response = None, _rd_close = None
cdef Py_ssize_t _rd_min_tail = 4096


def bind_read(dict supported, no_response, close, Py_ssize_t min_tail):
    """kbroker.network.connection's constants for ``on_read``: api.SUPPORTED (mutated in place, never
    replaced), NO_RESPONSE, CLOSE and the smallest chunk tail worth reading into (_MIN_TAIL)."""
    global _rd_supported, _rd_no_response, _rd_close, _rd_min_tail
    _rd_supported, _rd_no_response, _rd_close, _rd_min_tail = supported, no_response, close, min_tail


def next_buffer(ConnState conn, sizehint):
    """``Connection.get_buffer``: the view ``_prepare`` set up for the next read."""
    return conn._next


cdef extern from "sys/socket.h" nogil:
    ssize_t send(int fd, const void *buf, size_t n, int flags)
    enum:
        MSG_DONTWAIT
        MSG_NOSIGNAL


cdef int _write_out(ConnState conn, list out) except -1:
    # one write of the read's answers. On asyncio's selector transport with nothing buffered the bytes
    # go straight to the socket (as transport.write would send them first); what the socket does not
    # take, or an error, goes to transport.write (it buffers the rest and registers for writability,
    # or meets the same error and closes: its own outcome). Other loops (uvloop: its write is C that
    # sends at once when it can) get transport.write.
    cdef object data
    cdef Py_buffer pb
    cdef ssize_t n = -1
    cdef int fd
    transport = conn.transport
    if len(out) == 1:
        data = out[0]
    else:
        data = b"".join(out)
    fd = conn._sock_fd
    if fd >= 0 and conn._direct_write and not transport._buffer and not transport._conn_lost \
            and transport._empty_waiter is None \
            and not transport._eof:
        PyObject_GetBuffer(data, &pb, PyBUF_SIMPLE)
        try:
            if pb.len == 0:
                return 0
            with nogil:
                n = send(fd, pb.buf, <size_t>pb.len, MSG_DONTWAIT | MSG_NOSIGNAL)
            if n == pb.len:
                return 0
        finally:
            PyBuffer_Release(&pb)
        if n > 0:
            data = memoryview(data)[n:]
    transport.write(data)
    return 0


def on_read(ConnState conn, Py_ssize_t nbytes):
    """``Connection.buffer_updated`` in one native call (see above); the same effects, in the same
    order, as the connection's ``_read_py``."""
    cdef double now = _monotonic()
    cdef Py_ssize_t start, end
    cdef object chunk, code, pending
    cdef list out, answered
    cdef ReadStats stats = <ReadStats?>conn._reads
    conn._read_at = now
    conn.last_active = now if conn._loop_clock_is_monotonic else conn.loop.time()
    if conn._frame is not None or conn._chunk is None:
        stats.reference += 1
        conn._read_rest(nbytes)
        return
    stats.native += 1
    # _consume: the chunk's frames, every complete one dispatched in this call
    conn._next = None
    chunk = conn._chunk
    end = conn._end + nbytes
    conn._end = end
    conn._in_read = True
    try:
        code = _dispatch_chunk(conn, chunk, conn._start, end, conn.max_frame, conn._native_produce,
                               conn._native_fetch, _rd_supported, _rd_no_response, _rd_close)
        if code and not conn.closed:
            conn._chunk_code(code)
    finally:
        conn._in_read = False
    if conn.closed:
        return
    start = conn._start
    end = conn._end
    if conn._frame_need or end > start:
        if conn.partial_since is None:
            conn.partial_since = conn.last_active
    elif conn.partial_since is not None:
        conn.partial_since = None
    # _prepare's common case: the chunk reused from its start, or the rest of its tail
    if conn._frame_need:
        if not conn._prepare():
            conn._wait_for_memory()
    else:
        if start == end and chunk.refs == 0:
            start = end = 0
            conn._start = conn._end = 0
        if len(chunk.buf) - end >= _rd_min_tail:
            conn._next = chunk.view[end:]
        elif not conn._prepare():
            conn._wait_for_memory()
    # _flush: the answers that are one chunk (or none) in one write; anything else is _flush's
    if conn._writing or conn.closed:
        return
    pending = conn._pending
    if not pending:
        return
    out = []
    answered = []
    _take_answers(pending, out, answered, _rd_no_response)
    if out:
        _write_out(conn, out)
    if answered:
        _observe_slots(answered, _monotonic())
    if pending and (<Slot>pending[0]).done:
        conn._flush()


cdef extern from "sys/socket.h" nogil:
    ssize_t recv(int fd, void *buf, size_t n, int flags)

cdef extern from "errno.h":
    enum:
        EAGAIN
        EINTR

cdef extern from "string.h":
    char *strerror(int errnum)


def recv_ready(ConnState conn):
    """asyncio's ``_SelectorSocketTransport._read_ready__get_buffer`` for a connection on the native
    read path (``transport._read_ready_cb``, set in ``Connection.connection_made``): ``recv`` into the
    view ``_prepare`` set up, then ``on_read``; the same outcomes (would-block: nothing; 0 bytes:
    the transport's EOF handling; an error, or a failing ``on_read``: the transport's ``_fatal_error``)."""
    cdef Py_buffer pb
    cdef ssize_t n
    cdef int err = 0
    transport = conn.transport
    if transport._conn_lost:
        return
    buf = conn._next
    if buf is None:
        transport._read_ready__get_buffer()     # asyncio's own outcome for a missing buffer
        return
    PyObject_GetBuffer(buf, &pb, PyBUF_WRITABLE)
    try:
        if pb.len == 0:
            transport._read_ready__get_buffer()
            return
        with nogil:
            n = recv(conn._sock_fd, pb.buf, <size_t>pb.len, 0)
            if n < 0:
                err = errno
    finally:
        PyBuffer_Release(&pb)
    if n < 0:
        if err == EAGAIN or err == EINTR:          # EWOULDBLOCK is EAGAIN on Linux
            return
        # OSError(errno, text) is the errno's subclass (ConnectionResetError, ...), as recv_into raises
        transport._fatal_error(OSError(err, (<bytes>strerror(err)).decode()), 'Fatal read error on socket transport')
        return
    if n == 0:
        transport._read_ready__on_eof()
        return
    try:
        on_read(conn, n)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:
        transport._fatal_error(exc, 'Fatal error: protocol.buffer_updated() call failed.')
