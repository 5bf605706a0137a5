# Included by request.pyx: the wire codec of Produce v3-11 / Fetch v4-17 (parse, encode) and the frame
# helpers both fast paths share. Produce v9+ and Fetch v12+ are flexible (KIP-482): request header v2
# (its tagged fields after client_id), compact strings, arrays and records (unsigned varint length + 1,
# 0 for null) and a tag buffer closing every struct; their answers start with response header v1 (the
# correlation id and an empty tag buffer). Fetch v13+ names topics by id (16 bytes), v15+ carries a
# follower's id in the tagged replica_state instead of replica_id.

PRODUCE_MIN = 3
PRODUCE_MAX = 11
FETCH_MIN = 4
FETCH_MAX = 17

cdef enum:
    PRODUCE = 0
    FETCH = 1
    # the versions parsed here, as C constants (PRODUCE_MIN.. above are the module's Python names)
    C_PRODUCE_MIN = 3
    C_PRODUCE_MAX = 11
    C_FETCH_MIN = 4
    C_FETCH_MAX = 17
    # the first flexible versions; Fetch's first by topic id, first with replica_state, first with
    # replica_directory_id
    PRODUCE_FLEX = 9
    FETCH_FLEX = 12
    FETCH_IDS = 13
    FETCH_STATE = 15
    FETCH_DIR_ID = 17
    # Fetch: a topic (int16 name + int32 count); a partition (v4: int32 + int64 + int32, more later)
    MIN_FETCH_TOPIC = 6
    MIN_FORGOTTEN_TOPIC = 6
    # Smallest encodings of one array element: a topic (int16 name length + int32 partition count)
    # and a partition (int32 index + int32 records length).
    MIN_TOPIC = 6
    MIN_PARTITION = 8


cdef class ProduceRequest:
    """A parsed Produce request (v3-11). Also serves as the request header for the network layer
    (api_key, api_version, correlation_id, client_id). Fields are declared in request.pxd."""

    def __repr__(self):
        return (f"ProduceRequest(v{self.api_version}, correlation_id={self.correlation_id}, "
                f"acks={self.acks}, topics={[(t, [p[0] for p in ps]) for t, ps in self.topics]})")


cdef class FetchRequest:
    """A parsed Fetch request (v4-17); also the request header for the network layer. Fields are
    declared in request.pxd. v13+ names topics by id: ``topics`` holds each topic's 16-byte id in
    place of its name until the Fetch handler resolves them (kbroker/server/apis/fetch.py), which sets
    ``topics`` by name, ``ids`` and ``unknown``."""

    def __repr__(self):
        return (f"FetchRequest(v{self.api_version}, correlation_id={self.correlation_id}, "
                f"replica_id={self.replica_id}, topics={self.topics})")


# Strings a client repeats in every request (its client id, the topic names) decoded once: a small
# direct-mapped cache of ASCII strings (at most _STR_MAX bytes each, so it stays a few KiB) looked up by
# length and three bytes, confirmed with memcmp. Saves the decode, and the str handed on keeps its hash
# (the topic name is hashed again by every dict keyed by (topic, partition) downstream). Loop thread
# only in practice, and nothing here releases the GIL.
cdef enum:
    _STR_SLOTS = 64
    _STR_MAX = 255

cdef list _str_cache = [None] * _STR_SLOTS


cdef object _decode_str(const unsigned char *p, Py_ssize_t n):
    cdef Py_ssize_t i
    cdef object s
    if n == 0 or n > _STR_MAX:
        return PyUnicode_DecodeUTF8(<const char *>p, n, NULL)
    i = (n * 31 + p[0] * 7 + p[n - 1] * 131 + p[n >> 1]) & (_STR_SLOTS - 1)
    s = _str_cache[i]
    if s is not None and PyUnicode_GET_LENGTH(s) == n and memcmp(PyUnicode_DATA(s), p, n) == 0:
        return s
    s = PyUnicode_DecodeUTF8(<const char *>p, n, NULL)
    if PyUnicode_IS_ASCII(s):      # one byte per character: the memcmp above compares the encodings
        _str_cache[i] = s
    return s


cdef class _Reader:
    """Bounds-checked big-endian reads over a request frame (fields in request.pxd)."""

    def __dealloc__(self):
        if self.held:
            PyBuffer_Release(&self.view)

    cdef inline int need(self, Py_ssize_t n) except -1:
        if n < 0 or n > self.end - self.pos:
            raise ProtocolError(f"need {n} bytes at {self.pos}, frame has {self.end}")
        return 0

    cdef inline int16_t i16(self) except? -1:
        self.need(2)
        cdef int16_t v = <int16_t>load_be16(<const char *>self.p + self.pos)
        self.pos += 2
        return v

    cdef inline int32_t i32(self) except? -1:
        self.need(4)
        cdef int32_t v = <int32_t>load_be32(<const char *>self.p + self.pos)
        self.pos += 4
        return v

    cdef inline int64_t i64(self) except? -1:
        self.need(8)
        cdef int64_t v = <int64_t>load_be64(<const char *>self.p + self.pos)
        self.pos += 8
        return v

    cdef inline int8_t i8(self) except? -1:
        self.need(1)
        cdef int8_t v = <int8_t>self.p[self.pos]
        self.pos += 1
        return v

    cdef object string(self, bint nullable):
        cdef int16_t n = self.i16()
        if n < 0:
            if nullable:
                return None
            raise ProtocolError("null in non-nullable string")
        self.need(n)
        cdef Py_ssize_t start = self.pos
        self.pos += n
        try:
            return _decode_str(self.p + start, n)
        except UnicodeDecodeError as e:
            raise ProtocolError(f"invalid UTF-8 string: {e}") from None

    cdef int32_t array_len(self, Py_ssize_t elem_min) except? -1:
        cdef int32_t n = self.i32()
        if n < 0:
            raise ProtocolError("null in non-nullable array")
        if <int64_t>n * elem_min > self.end - self.pos:
            raise ProtocolError(f"array of {n} elements cannot fit in {self.end - self.pos} bytes")
        return n

    cdef int64_t uvarint(self) except -1:
        # an unsigned varint of at most 5 bytes (the reference codec's limit: up to 2^35 - 1)
        cdef int64_t v = 0
        cdef int shift = 0
        cdef unsigned char b
        while True:
            if self.pos >= self.end:
                raise ProtocolError("truncated varint")
            b = self.p[self.pos]
            self.pos += 1
            v |= (<int64_t>(b & 0x7F)) << shift
            if not b & 0x80:
                return v
            shift += 7
            if shift > 28:
                raise ProtocolError("unsigned varint longer than 5 bytes")

    cdef object cstring(self, bint nullable):
        # a compact string: uvarint length + 1 (0: null)
        cdef int64_t n = self.uvarint()
        if n == 0:
            if nullable:
                return None
            raise ProtocolError("null in non-nullable compact string")
        n -= 1
        self.need(n)
        cdef Py_ssize_t start = self.pos
        self.pos += n
        try:
            return _decode_str(self.p + start, n)
        except UnicodeDecodeError as e:
            raise ProtocolError(f"invalid UTF-8 string: {e}") from None

    cdef int64_t carray_len(self, Py_ssize_t elem_min) except? -1:
        # a non-null compact array's length (uvarint length + 1), refused as array_len refuses
        cdef int64_t n = self.uvarint() - 1
        if n < 0:
            raise ProtocolError("null in non-nullable array")
        if n * elem_min > self.end - self.pos:
            raise ProtocolError(f"array of {n} elements cannot fit in {self.end - self.pos} bytes")
        return n

    cdef int skip_tags(self) except -1:
        # a tag buffer whose fields are all unknown here (skipped, as the reference codec skips them)
        cdef int64_t n = self.uvarint(), i, size
        for i in range(n):
            self.uvarint()
            size = self.uvarint()
            self.need(size)
            self.pos += size
        return 0


def peek_key_version(frame):
    """-> (api_key, api_version) of a frame, or (-1, -1) if it is shorter than 4 bytes."""
    cdef const unsigned char[::1] v = frame
    if v.shape[0] < 4:
        return -1, -1
    return <int16_t>load_be16(<const char *>&v[0]), <int16_t>load_be16(<const char *>&v[2])


cdef _Reader _frame_reader(frame):
    """A reader over a whole request frame (any contiguous buffer; held until the reader is freed),
    refusing one too short for the api_key/api_version/correlation_id header. A plain buffer
    request: a typed memoryview here cost parse_produce ~850 more instructions (callgrind)."""
    cdef _Reader r = _Reader.__new__(_Reader)
    PyObject_GetBuffer(frame, &r.view, PyBUF_SIMPLE)
    r.held = True
    r.end = r.view.len
    if r.end < 8:
        raise ProtocolError("truncated request header")
    r.p = <const unsigned char *>r.view.buf
    r.pos = 0
    return r


def parse_produce(frame):
    """Parse a whole Produce v3-11 request frame (size prefix removed). -> ProduceRequest.
    Raises ProtocolError on malformed input or another API/version."""
    cdef _Reader r = _frame_reader(frame)
    cdef ProduceRequest req = ProduceRequest.__new__(ProduceRequest)
    req.api_key = r.i16()
    req.api_version = r.i16()
    req.correlation_id = r.i32()
    if req.api_key != PRODUCE or not PRODUCE_MIN <= req.api_version <= PRODUCE_MAX:
        raise ProtocolError(f"not a Produce v{PRODUCE_MIN}-{PRODUCE_MAX} request")
    cdef bint flex = req.api_version >= PRODUCE_FLEX
    req.client_id = r.string(True)
    if flex:
        r.skip_tags()                                # request header v2
        req.transactional_id = r.cstring(True)
    else:
        req.transactional_id = r.string(True)
    req.acks = r.i16()
    req.timeout_ms = r.i32()
    # a flexible topic: name, partition count, tag buffer (1 byte each at least)
    cdef int64_t n_topics = r.carray_len(3) if flex else r.array_len(MIN_TOPIC)
    req.topics = []
    _produce_topics(r, frame, req, n_topics)
    return req


cdef int _produce_topics(_Reader r, frame, ProduceRequest req, int64_t n_topics) except -1:
    # parse_produce from a topic's start at ``r.pos`` to the frame's end: ``n_topics`` topics appended
    # to ``req.topics``, then the request's tag buffer; the fast Produce walk resumes here with the
    # topics it has walked already in ``req.topics`` (records: slices of ``frame``, not copies)
    cdef bint flex = req.api_version >= PRODUCE_FLEX
    cdef int64_t n_parts, i, j, size
    cdef int32_t index
    cdef list topics = req.topics
    cdef list parts
    cdef object name, records
    for i in range(n_topics):
        if flex:
            name = r.cstring(False)
            n_parts = r.carray_len(6)                # a partition: index, records length, tag buffer
        else:
            name = r.string(False)
            n_parts = r.array_len(MIN_PARTITION)
        parts = []
        for j in range(n_parts):
            index = r.i32()
            size = (r.uvarint() - 1) if flex else r.i32()
            if size < 0:
                records = None
            else:
                r.need(size)
                records = frame[r.pos:r.pos + size]
                r.pos += size
            if flex:
                r.skip_tags()
            parts.append((index, records))
        if flex:
            r.skip_tags()
        topics.append((name, parts))
    if flex:
        r.skip_tags()
    if r.pos != r.end:
        raise ProtocolError(f"ProduceRequest v{req.api_version}: {r.end - r.pos} trailing bytes")
    return 0


def parse_fetch(frame):
    """Parse a whole Fetch v4-17 request frame (size prefix removed). -> FetchRequest with
    ``topics`` = [(name, [(partition, current_leader_epoch, fetch_offset, log_start_offset,
    partition_max_bytes), ...]), ...] (-1 for fields a version lacks, as the codec's defaults; v13+: the
    topic's 16-byte id in place of its name), ``forgotten`` = [(name or id, [partition, ...]), ...]
    (v7+), rack_id (v11+), v15+'s replica id from the tagged replica_state. last_fetched_epoch (v12+),
    cluster_id and replica_directory_id are checked and dropped (the Fetch handler reads none of them).
    Raises ProtocolError on malformed input or another API/version."""
    cdef _Reader r = _frame_reader(frame)
    cdef FetchRequest req = FetchRequest.__new__(FetchRequest)
    req.api_key = r.i16()
    req.api_version = r.i16()
    req.correlation_id = r.i32()
    cdef int version = req.api_version
    if req.api_key != FETCH or not FETCH_MIN <= version <= FETCH_MAX:
        raise ProtocolError(f"not a Fetch v{FETCH_MIN}-{FETCH_MAX} request")
    cdef bint flex = version >= FETCH_FLEX
    req.client_id = r.string(True)
    if flex:
        r.skip_tags()                                # request header v2
    req.replica_id = r.i32() if version < FETCH_STATE else -1
    req.max_wait_ms = r.i32()
    req.min_bytes = r.i32()
    req.max_bytes = r.i32()
    req.isolation_level = r.i8()
    if version >= 7:
        req.session_id = r.i32()
        req.session_epoch = r.i32()
    else:
        req.session_id = 0
        req.session_epoch = -1
    _fetch_body(r, req)
    return req


cdef int _fetch_body(_Reader r, FetchRequest req) except -1:
    # parse_fetch from the topic count at ``r.pos`` to the frame's end (``req``: the header's fields);
    # the fast Fetch walk resumes here when the request is not one it takes
    cdef int version = req.api_version
    cdef bint flex = version >= FETCH_FLEX, by_id = version >= FETCH_IDS
    # partition: index, [current_leader_epoch v9+], fetch_offset, [last_fetched_epoch v12+],
    # [log_start_offset v5+], max_bytes, [tag buffer v12+]
    cdef Py_ssize_t min_part = (4 + 8 + 4 + (4 if version >= 9 else 0) + (8 if version >= 5 else 0)
                                + (5 if flex else 0))
    # a topic: its name (or id), its partition count, [tag buffer]
    cdef Py_ssize_t min_topic = (18 if by_id else 3) if flex else MIN_FETCH_TOPIC
    cdef int64_t n_topics = r.carray_len(min_topic) if flex else r.array_len(MIN_FETCH_TOPIC)
    cdef int64_t n_parts, i, j
    cdef int32_t partition, leader_epoch, part_max
    cdef int64_t fetch_offset, log_start
    cdef list topics = []
    cdef list parts, forgotten = []
    cdef object name
    for i in range(n_topics):
        name = _fetch_topic(r, flex, by_id)
        n_parts = r.carray_len(min_part) if flex else r.array_len(min_part)
        parts = []
        for j in range(n_parts):
            partition = r.i32()
            leader_epoch = r.i32() if version >= 9 else -1
            fetch_offset = r.i64()
            if flex:
                r.i32()                              # last_fetched_epoch
            log_start = r.i64() if version >= 5 else -1
            part_max = r.i32()
            if flex:
                _partition_tags(r, version)
            parts.append((partition, leader_epoch, fetch_offset, log_start, part_max))
        if flex:
            r.skip_tags()
        topics.append((name, parts))
    req.topics = topics
    if version >= 7:
        n_topics = r.carray_len(min_topic) if flex else r.array_len(MIN_FORGOTTEN_TOPIC)
        for i in range(n_topics):
            name = _fetch_topic(r, flex, by_id)
            n_parts = r.carray_len(4) if flex else r.array_len(4)
            r.need(4 * n_parts)
            parts = []
            for j in range(n_parts):
                parts.append(r.i32())
            forgotten.append((name, parts))
            if flex:
                r.skip_tags()
    req.forgotten = forgotten
    if version >= 11:
        req.rack_id = r.cstring(False) if flex else r.string(False)
    else:
        req.rack_id = ""
    if flex:
        _fetch_tags(r, req)
    if r.pos != r.end:
        raise ProtocolError(f"FetchRequest v{version}: {r.end - r.pos} trailing bytes")
    return 0


cdef object _fetch_topic(_Reader r, bint flex, bint by_id):
    # a Fetch topic's name, or its id (v13+: 16 bytes)
    cdef object tid
    if by_id:
        r.need(16)
        tid = PyBytes_FromStringAndSize(<const char *>r.p + r.pos, 16)
        r.pos += 16
        return tid
    return r.cstring(False) if flex else r.string(False)


cdef inline int _tag_end(_Reader r, Py_ssize_t end, str name) except -1:
    # a known tagged field must fill its announced size exactly (as the reference codec checks)
    if r.pos != end:
        raise ProtocolError(f"tagged field {name} size mismatch")
    return 0


cdef int _partition_tags(_Reader r, int version) except -1:
    # a Fetch partition's tag buffer: v17's replica_directory_id (tag 0, a uuid) checked, others skipped
    cdef int64_t n = r.uvarint(), i, tag, size
    cdef Py_ssize_t end
    for i in range(n):
        tag = r.uvarint()
        size = r.uvarint()
        r.need(size)
        end = r.pos + size
        if tag == 0 and version >= FETCH_DIR_ID:
            if size < 16:
                raise ProtocolError("truncated replica_directory_id")
            r.pos += 16
            _tag_end(r, end, "replica_directory_id")
        r.pos = end
    return 0


cdef int _fetch_tags(_Reader r, FetchRequest req) except -1:
    # a Fetch request's own tag buffer: cluster_id (tag 0) checked, v15+'s replica_state (tag 1: the
    # follower's id and epoch, its own tag buffer) read, others skipped
    cdef int64_t n = r.uvarint(), i, tag, size
    cdef Py_ssize_t end, saved = r.end
    for i in range(n):
        tag = r.uvarint()
        size = r.uvarint()
        r.need(size)
        end = r.pos + size
        r.end = end                     # a known field reads inside its own bytes only
        try:
            if tag == 0:
                r.cstring(True)
                _tag_end(r, end, "cluster_id")
            elif tag == 1 and req.api_version >= FETCH_STATE:
                req.replica_id = r.i32()
                r.i64()                 # replica_epoch
                r.skip_tags()
                _tag_end(r, end, "replica_state")
        finally:
            r.end = saved
        r.pos = end
    return 0


cdef class _Writer:
    """Grows a bytes-like buffer; reused by the encoder (the loop thread only). Fields are declared in
    request.pxd. An answer built in one may not call code that encodes into the same one before its
    bytes are taken: ``_out`` serves the request paths, ParkedProduce (decided from inside them) its own."""

    def __cinit__(self):
        self.cap = 4096
        self.buf = bytearray(self.cap)
        self.p = self.buf
        self.pos = 0

    cdef int reserve(self, Py_ssize_t n) except -1:
        cdef Py_ssize_t want = self.pos + n
        if want <= self.cap:
            return 0
        while self.cap < want:
            self.cap *= 2
        self.buf.extend(bytes(self.cap - len(self.buf)))
        self.p = self.buf
        return 0

    cdef inline void i16(self, int16_t x) noexcept:
        store_be16(self.p + self.pos, <uint16_t>x)
        self.pos += 2

    cdef inline void i32(self, int32_t x) noexcept:
        store_be32(self.p + self.pos, <uint32_t>x)
        self.pos += 4

    cdef inline void i64(self, int64_t x) noexcept:
        store_be64(self.p + self.pos, <uint64_t>x)
        self.pos += 8

    cdef inline void uvarint(self, uint64_t v) noexcept:
        # an unsigned varint (room reserved by the caller: at most 10 bytes)
        while v >= 0x80:
            self.p[self.pos] = <char>((v & 0x7F) | 0x80)
            v >>= 7
            self.pos += 1
        self.p[self.pos] = <char>v
        self.pos += 1

    cdef int cstring(self, object s, bint nullable) except -1:
        # a compact string (uvarint length + 1; 0 for null)
        cdef bytes b
        if s is None:
            if not nullable:
                raise ValueError("null in non-nullable string")
            self.reserve(1)
            self.uvarint(0)
            return 0
        b = (<str>s).encode("utf-8")
        cdef Py_ssize_t n = len(b)
        self.reserve(5 + n)
        self.uvarint(<uint64_t>n + 1)
        memcpy(self.p + self.pos, PyBytes_AS_STRING(b), n)
        self.pos += n
        return 0

    cdef int string(self, object s, bint nullable) except -1:
        cdef bytes b
        if s is None:
            if not nullable:
                raise ValueError("null in non-nullable string")
            self.reserve(2)
            self.i16(-1)
            return 0
        b = (<str>s).encode("utf-8")
        cdef Py_ssize_t n = len(b)
        if n > 0x7FFF:
            raise ValueError("string longer than 32767 bytes")
        self.reserve(2 + n)
        self.i16(<int16_t>n)
        memcpy(self.p + self.pos, PyBytes_AS_STRING(b), n)
        self.pos += n
        return 0


cdef _Writer _out = _Writer()


def encode_produce_response(int version, int32_t correlation_id, list topics):
    """The whole Produce v3-11 response frame (size prefix included) as bytes.

    ``topics``: [(name, [[index, error_code, base_offset, log_append_time_ms, log_start_offset,
    error_message], ...]), ...] in request order; throttle_time_ms is 0; no tagged fields (v10+'s
    leader hints are the reference encoder's: kbroker/server/apis/produce.py)."""
    if not PRODUCE_MIN <= version <= PRODUCE_MAX:
        raise ValueError(f"Produce v{version} is not encoded natively")
    cdef bint flex = version >= PRODUCE_FLEX
    cdef _Writer w = _out
    w.pos = 0
    w.reserve(4 + 4 + 1 + 5)
    w.pos = 4                       # size prefix, filled in last
    w.i32(correlation_id)
    if flex:
        w.uvarint(0)                # response header v1: no tagged fields
    _count(w, flex, len(topics))
    cdef list parts, res
    cdef object name
    for name, parts in topics:
        if flex:
            w.cstring(name, False)
        else:
            w.string(name, False)
        w.reserve(5)
        _count(w, flex, len(parts))
        for res in parts:
            _produce_row(w, version, <int32_t>res[0], <int16_t>res[1], <int64_t>res[2], <int64_t>res[3],
                         <int64_t>res[4], res[5])
        _no_tags(w, flex)
    return _produce_end(w, flex)


cdef inline void _count(_Writer w, bint flex, Py_ssize_t n) noexcept:
    # an array's element count (room reserved by the caller: 5 bytes): compact (n + 1) or int32
    if flex:
        w.uvarint(<uint64_t>n + 1)
    else:
        w.i32(<int32_t>n)


cdef inline int _no_tags(_Writer w, bint flex) except -1:
    # a flexible struct's empty tag buffer
    if flex:
        w.reserve(1)
        w.p[w.pos] = 0
        w.pos += 1
    return 0


cdef inline void _row_head(_Writer w, int version, int32_t index, int16_t error_code, int64_t a, int64_t b,
                           int64_t log_start_offset) noexcept:
    # the start both Produce and Fetch partition rows share (room reserved by the caller): index, error
    # code, two int64 (Produce: base offset, log append time; Fetch: HW, last stable offset) and the log
    # start offset from v5 on
    w.i32(index)
    w.i16(error_code)
    w.i64(a)
    w.i64(b)
    if version >= 5:
        w.i64(log_start_offset)


cdef int _produce_row(_Writer w, int version, int32_t index, int16_t error_code, int64_t base_offset,
                      int64_t log_append_time_ms, int64_t log_start_offset, object error_message) except -1:
    # one partition's row of a Produce v3-11 response (the layout every Produce encoder writes)
    w.reserve(4 + 2 + 8 + 8 + 8 + 4)
    _row_head(w, version, index, error_code, base_offset, log_append_time_ms, log_start_offset)
    if version >= PRODUCE_FLEX:
        w.uvarint(1)                    # record_errors: none (a compact array)
        w.cstring(error_message, True)
        _no_tags(w, True)
    elif version >= 8:
        w.i32(0)                        # record_errors: none
        w.string(error_message, True)
    return 0


cdef bytes _produce_end(_Writer w, bint flex):
    # throttle_time_ms (0), the tag buffer of a flexible answer, the size prefix, the frame as bytes
    w.reserve(5)
    w.i32(0)
    if flex:
        w.uvarint(0)
    store_be32(w.p, <uint32_t>(w.pos - 4))
    return PyBytes_FromStringAndSize(w.p, w.pos)


cdef int _inline_region(_Writer w, object region) except -1:
    """Copy one (fd, position, length) file range into the response (pread on the loop thread: only
    ranges below the sendfile threshold come here, and they are in the page cache after an append)."""
    fd, position, length = region
    cdef int ifd = fd if isinstance(fd, int) else fd.fileno()
    cdef int64_t pos = position
    cdef Py_ssize_t n = length, got
    w.reserve(n)
    while n > 0:
        got = pread(ifd, w.p + w.pos, n, pos)
        if got < 0:
            raise OSError(errno, "pread of a fetch range failed")
        if got == 0:
            # The promised size is already in the response: the connection must close.
            raise ConnectionError(f"segment shrank under a fetch ({n} bytes missing)")
        w.pos += got
        pos += got
        n -= got
    return 0


cdef int _fetch_head(_Writer w, int version, int32_t correlation_id, int16_t error_code,
                     Py_ssize_t n_topics, int32_t session_id=0) except -1:
    # a Fetch v4-17 response from its start up to the topic count (the size prefix left to fill in)
    cdef bint flex = version >= FETCH_FLEX
    w.pos = 0
    w.reserve(4 + 4 + 1 + 4 + 2 + 4 + 5)
    w.pos = 4
    w.i32(correlation_id)
    if flex:
        w.uvarint(0)                                 # response header v1: no tagged fields
    w.i32(0)                                         # throttle_time_ms
    if version >= 7:
        w.i16(error_code)
        w.i32(session_id)
    _count(w, flex, n_topics)
    return 0


cdef int _fetch_topic_out(_Writer w, int version, object name, dict ids) except -1:
    # a Fetch answer's topic: its name, or from v13 its id (``ids[name]``; a 16-byte ``name`` is an id
    # itself: an unknown id's row), and room for its partition count
    cdef object tid
    if version >= FETCH_IDS:
        tid = ids.get(name) if ids is not None else None
        if tid is None:
            tid = name
        if not isinstance(tid, bytes) or len(<bytes>tid) != 16:
            raise ValueError(f"no topic id for {name!r}")
        w.reserve(16 + 5)
        memcpy(w.p + w.pos, PyBytes_AS_STRING(tid), 16)
        w.pos += 16
    elif version >= FETCH_FLEX:
        w.cstring(name, False)
        w.reserve(5)
    else:
        w.string(name, False)
        w.reserve(5)
    return 0


cdef int _fetch_row(_Writer w, int version, int32_t index, int16_t error_code, int64_t high_watermark,
                    int64_t last_stable_offset, int64_t log_start_offset, object aborted) except -1:
    # one partition's row of a Fetch v4-17 response up to its records (the layout both Fetch encoders
    # write); room is reserved for the records' length too (_records_len). ``aborted``: None (null:
    # read_uncommitted, followers) or the aborted transactions of a read_committed row,
    # (producer_id, first_offset, ...) each
    cdef bint flex = version >= FETCH_FLEX
    cdef Py_ssize_t n = 0 if aborted is None else len(<list>aborted)
    w.reserve(4 + 2 + 8 + 8 + 8 + 5 + 17 * n + 4 + 5)
    _row_head(w, version, index, error_code, high_watermark, last_stable_offset, log_start_offset)
    if aborted is None:
        if flex:
            w.uvarint(0)                             # aborted_transactions: null
        else:
            w.i32(-1)
    else:
        _count(w, flex, n)
        for e in <list>aborted:
            w.i64(e[0])
            w.i64(e[1])
            if flex:
                w.uvarint(0)
    if version >= 11:
        w.i32(-1)                                    # preferred_read_replica
    return 0


cdef inline void _records_len(_Writer w, bint flex, int64_t n) noexcept:
    # a Fetch row's records length (room reserved by _fetch_row): n >= 0, or -1 for null
    if flex:
        w.uvarint(<uint64_t>(n + 1))
    else:
        w.i32(<int32_t>n)


def encode_fetch_response(int version, int32_t correlation_id, int16_t error_code, list topics,
                          Py_ssize_t inline_max, dict ids=None, int32_t session_id=0):
    """The whole Fetch v4-17 response (size prefix included) -> (chunks, bytes copied inline).

    ``topics``: [(name, [[partition_index, error_code, high_watermark, last_stable_offset,
    log_start_offset, records(, aborted_transactions)], ...]), ...]; ``records`` is bytes or a FileRegions;
    ``aborted_transactions`` (read_committed rows only) [(producer_id, first_offset, ...)]. v13+ writes each
    topic's id: ``ids[name]``, or ``name`` itself when it is a 16-byte id (an unknown id's rows). A
    partition's regions smaller than ``inline_max`` bytes in total are read into the response (one chunk,
    written with the other responses of the read) while the response's copied bytes stay within
    ``inline_max`` too (a many-partition answer of small ranges is not copied whole: copying was
    measured cheaper than sendfile only up to that size); the others stay FileRegions chunks for
    sendfile, splitting the response into [bytes, FileRegions, bytes, ...] as the generic encoder does. throttle_time_ms 0,
    ``session_id`` (v7+: the fetch session's id, 0 for none), aborted_transactions null unless given, preferred_read_replica -1 (v11), no tagged
    fields (v12+)."""
    if not FETCH_MIN <= version <= FETCH_MAX:
        raise ValueError(f"Fetch v{version} is not encoded natively")
    cdef bint flex = version >= FETCH_FLEX
    cdef _Writer w = _out
    cdef list chunks = []
    cdef Py_ssize_t size = 0, copied = 0, rsize
    cdef list parts, res
    cdef object name, records, region
    cdef Py_buffer raw                               # bytes records (a segment read block's slice)
    _fetch_head(w, version, correlation_id, error_code, len(topics), session_id)
    for name, parts in topics:
        _fetch_topic_out(w, version, name, ids)
        _count(w, flex, len(parts))
        for res in parts:
            _fetch_row(w, version, <int32_t>res[0], <int16_t>res[1], <int64_t>res[2], <int64_t>res[3],
                       <int64_t>res[4], res[6] if len(res) > 6 else None)
            records = res[5]
            if isinstance(records, FileRegions):
                rsize = records.size
                _records_len(w, flex, rsize)
                if rsize < inline_max and copied + rsize <= inline_max:
                    for region in records.regions:
                        _inline_region(w, region)
                    copied += rsize
                elif rsize:
                    chunks.append(PyBytes_FromStringAndSize(w.p, w.pos))
                    size += w.pos
                    chunks.append(records)
                    size += rsize
                    w.pos = 0
            elif records is None:
                _records_len(w, flex, -1)
            else:
                # the plain buffer protocol: a typed memoryview costs ~1,500 instructions to set up
                PyObject_GetBuffer(records, &raw, PyBUF_SIMPLE)
                try:
                    rsize = raw.len
                    _records_len(w, flex, rsize)
                    if rsize:
                        w.reserve(rsize)
                        memcpy(w.p + w.pos, raw.buf, rsize)
                        w.pos += rsize
                finally:
                    PyBuffer_Release(&raw)
            _no_tags(w, flex)                        # the partition's
        _no_tags(w, flex)                            # the topic's
    _no_tags(w, flex)                                # the answer's
    if not chunks:                                   # the common small answer: one chunk, no copy
        if w.pos - 4 > 0x7FFFFFFF:
            raise ValueError("Fetch response over 2^31-1 bytes")
        store_be32(w.p, <uint32_t>(w.pos - 4))
        return [PyBytes_FromStringAndSize(w.p, w.pos)], copied
    if w.pos:
        chunks.append(PyBytes_FromStringAndSize(w.p, w.pos))
        size += w.pos
    size -= 4
    if size > 0x7FFFFFFF:
        raise ValueError("Fetch response over 2^31-1 bytes")
    # The size prefix lives in the first chunk (bytes are immutable: rebuild that one chunk).
    first = bytearray(chunks[0])
    store_be32(<char *>first, <uint32_t>size)
    chunks[0] = first
    return chunks, copied

cdef inline int64_t _fuv(const unsigned char *f, Py_ssize_t size, Py_ssize_t *pos) noexcept:
    """The fast paths' unsigned varint at ``pos[0]`` (moved past it): at most 5 bytes, as the codec
    reads one, or -1 when it runs past ``size`` or is longer (the frame is then not one they take)."""
    cdef int64_t v = 0
    cdef int shift = 0
    cdef unsigned char b
    while pos[0] < size and shift <= 28:
        b = f[pos[0]]
        pos[0] += 1
        v |= (<int64_t>(b & 0x7F)) << shift
        if not b & 0x80:
            return v
        shift += 7
    return -1


cdef inline bint _no_tags_at(const unsigned char *f, Py_ssize_t size, Py_ssize_t *pos) noexcept:
    """An empty tag buffer at ``pos[0]`` (moved past it): the fast paths take a flexible request
    only when it carries no tagged field (the parse decides the others)."""
    if pos[0] >= size or f[pos[0]] != 0:
        return False
    pos[0] += 1
    return True


cdef object _REFUSED = object()      # _client_id: the frame is not one a fast path takes


cdef inline object _client_id(const unsigned char *f, Py_ssize_t size, Py_ssize_t *pos):
    """The request header's nullable client_id at ``pos[0]`` (two bytes there are the caller's to
    check), ``pos[0]`` moved past it; _REFUSED when it runs past the frame or is not UTF-8."""
    cdef int16_t n = <int16_t>load_be16(<const char *>f + pos[0])
    cdef object s
    pos[0] += 2
    if n < 0:
        return None
    if n > size - pos[0]:
        return _REFUSED
    s = _utf8(f + pos[0], n) if n else ""
    if s is not _REFUSED:
        pos[0] += n
    return s


cdef inline object _cstring_at(const unsigned char *f, Py_ssize_t size, Py_ssize_t *pos):
    """A nullable compact string at ``pos[0]`` (moved past it), as _client_id reads the int16-length
    one: None, the string, or _REFUSED when it runs past the frame or is not UTF-8."""
    cdef int64_t n = _fuv(f, size, pos) - 1
    cdef object s
    if n < -1 or n > size - pos[0]:
        return _REFUSED
    if n == -1:
        return None
    s = _utf8(f + pos[0], n) if n else ""
    if s is not _REFUSED:
        pos[0] += n
    return s


cdef inline object _utf8(const unsigned char *p, Py_ssize_t n):
    # _decode_str, or _REFUSED for bytes that are not UTF-8
    try:
        return _decode_str(p, n)
    except UnicodeDecodeError:
        return _REFUSED
