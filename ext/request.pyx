"""Native request path: Produce (v3-8) and Fetch (v4-11) parsed straight from the request frame and
their responses encoded in one call each (kbroker.network.connection dispatches them here; every
other request and version goes through the generic schema codec, which stays the reference:
tests/test_native_*).

Parsing walks the frame once with bounds checks on every read. The result holds no dicts: a
``ProduceRequest`` with the header fields and ``topics`` = [(name, [(index, records), ...]), ...]
where ``records`` is a memoryview slice of the frame (None for a null batch) — the batch bytes are
never copied. Malformed input (truncation, a length past the frame, a negative non-null length,
invalid UTF-8, an array longer than the bytes left could hold, trailing bytes) raises
``ProtocolError``, on which the connection closes exactly as on the Python path.

Produce v3-8 are non-flexible (Kafka's Produce is flexible from v9): int16-length strings,
int32-length arrays and records, request header v1 (client_id nullable string), response header
v0 (correlation id only).
"""
from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.ref cimport PyObject, Py_DECREF, Py_INCREF
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.errno cimport errno
from posix.time cimport CLOCK_MONOTONIC, CLOCK_REALTIME, clock_gettime, timespec
from posix.unistd cimport pread
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy, memset

cdef extern from "Python.h":
    int PyDict_Contains(object, object) except -1
    bint PyUnicode_IS_ASCII(object)
    Py_ssize_t PyUnicode_GET_LENGTH(object)
    void *PyUnicode_DATA(object)

from kbroker._native.hton cimport load_be16, load_be32, load_be64, store_be16, store_be32, store_be64
from kbroker._native.segment cimport (LeaderAppender, LogState, SegmentState, read_full, run_begin, run_end, run_lost,
                                      seek_in, set_run_tag, tail_end, tail_position)
from layout cimport HEADER_SIZE

from kbroker._native.batch import BatchError

from kbroker.protocol.types import FileRegions, ProtocolError

PRODUCE_MIN = 3
PRODUCE_MAX = 8
FETCH_MIN = 4
FETCH_MAX = 11

cdef enum:
    PRODUCE = 0
    FETCH = 1
    # the versions parsed here, as C constants (PRODUCE_MIN.. above are the module's Python names)
    C_PRODUCE_MIN = 3
    C_PRODUCE_MAX = 8
    C_FETCH_MIN = 4
    C_FETCH_MAX = 11
    # Fetch: a topic (int16 name + int32 count); a partition (v4: int32 + int64 + int32, more later)
    MIN_FETCH_TOPIC = 6
    MIN_FORGOTTEN_TOPIC = 6
    # Smallest encodings of one array element: a topic (int16 name length + int32 partition count)
    # and a partition (int32 index + int32 records length).
    MIN_TOPIC = 6
    MIN_PARTITION = 8


cdef class ProduceRequest:
    """A parsed Produce request (v3-8). Also serves as the request header for the network layer
    (api_key, api_version, correlation_id, client_id). Fields are declared in request.pxd."""

    def __repr__(self):
        return (f"ProduceRequest(v{self.api_version}, correlation_id={self.correlation_id}, "
                f"acks={self.acks}, topics={[(t, [p[0] for p in ps]) for t, ps in self.topics]})")


cdef class FetchRequest:
    """A parsed Fetch request (v4-11); also the request header for the network layer. Fields are
    declared in request.pxd."""

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
    cdef const unsigned char *p
    cdef Py_ssize_t pos
    cdef Py_ssize_t end
    cdef Py_buffer view       # the frame's buffer, held while the reader lives (p points into it)
    cdef bint held

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
    """Parse a whole Produce v3-8 request frame (size prefix removed). -> ProduceRequest.
    Raises ProtocolError on malformed input or another API/version."""
    cdef _Reader r = _frame_reader(frame)
    cdef ProduceRequest req = ProduceRequest.__new__(ProduceRequest)
    req.api_key = r.i16()
    req.api_version = r.i16()
    req.correlation_id = r.i32()
    if req.api_key != PRODUCE or not PRODUCE_MIN <= req.api_version <= PRODUCE_MAX:
        raise ProtocolError(f"not a Produce v{PRODUCE_MIN}-{PRODUCE_MAX} request")
    req.client_id = r.string(True)
    req.transactional_id = r.string(True)
    req.acks = r.i16()
    req.timeout_ms = r.i32()
    cdef int32_t n_topics = r.array_len(MIN_TOPIC)
    cdef int32_t n_parts, i, j, index, size
    cdef list topics = []
    cdef list parts
    cdef object name, records
    for i in range(n_topics):
        name = r.string(False)
        n_parts = r.array_len(MIN_PARTITION)
        parts = []
        for j in range(n_parts):
            index = r.i32()
            size = r.i32()
            if size < 0:
                records = None
            else:
                r.need(size)
                records = frame[r.pos:r.pos + size]
                r.pos += size
            parts.append((index, records))
        topics.append((name, parts))
    if r.pos != r.end:
        raise ProtocolError(f"ProduceRequest v{req.api_version}: {r.end - r.pos} trailing bytes")
    req.topics = topics
    return req


def parse_fetch(frame):
    """Parse a whole Fetch v4-11 request frame (size prefix removed). -> FetchRequest with
    ``topics`` = [(name, [(partition, current_leader_epoch, fetch_offset, log_start_offset,
    partition_max_bytes), ...]), ...] (-1 for fields a version lacks, as the codec's defaults).
    forgotten_topics_data (v7+) is checked and dropped (we hand out no sessions); rack_id (v11) kept.
    Raises ProtocolError on malformed input or another API/version."""
    cdef _Reader r = _frame_reader(frame)
    cdef FetchRequest req = FetchRequest.__new__(FetchRequest)
    req.api_key = r.i16()
    req.api_version = r.i16()
    req.correlation_id = r.i32()
    cdef int version = req.api_version
    if req.api_key != FETCH or not FETCH_MIN <= version <= FETCH_MAX:
        raise ProtocolError(f"not a Fetch v{FETCH_MIN}-{FETCH_MAX} request")
    req.client_id = r.string(True)
    req.replica_id = r.i32()
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
    # partition: index, [current_leader_epoch v9+], fetch_offset, [log_start_offset v5+], max_bytes
    cdef Py_ssize_t min_part = 4 + 8 + 4 + (4 if version >= 9 else 0) + (8 if version >= 5 else 0)
    cdef int32_t n_topics = r.array_len(MIN_FETCH_TOPIC)
    cdef int32_t n_parts, i, j, partition, leader_epoch, part_max
    cdef int64_t fetch_offset, log_start
    cdef list topics = []
    cdef list parts
    cdef object name
    for i in range(n_topics):
        name = r.string(False)
        n_parts = r.array_len(min_part)
        parts = []
        for j in range(n_parts):
            partition = r.i32()
            leader_epoch = r.i32() if version >= 9 else -1
            fetch_offset = r.i64()
            log_start = r.i64() if version >= 5 else -1
            part_max = r.i32()
            parts.append((partition, leader_epoch, fetch_offset, log_start, part_max))
        topics.append((name, parts))
    req.topics = topics
    if version >= 7:
        n_topics = r.array_len(MIN_FORGOTTEN_TOPIC)
        for i in range(n_topics):
            r.string(False)
            n_parts = r.array_len(4)
            r.need(4 * <Py_ssize_t>n_parts)
            r.pos += 4 * <Py_ssize_t>n_parts
    req.rack_id = r.string(False) if version >= 11 else ""
    if r.pos != r.end:
        raise ProtocolError(f"FetchRequest v{version}: {r.end - r.pos} trailing bytes")
    return req


cdef class _Writer:
    """Grows a bytes-like buffer; reused by the encoder (one per module: the loop thread only)."""
    cdef bytearray buf
    cdef char *p
    cdef Py_ssize_t pos
    cdef Py_ssize_t cap

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
    """The whole Produce v3-8 response frame (size prefix included) as bytes.

    ``topics``: [(name, [[index, error_code, base_offset, log_append_time_ms, log_start_offset,
    error_message], ...]), ...] in request order; throttle_time_ms is 0 (no quotas yet)."""
    if not PRODUCE_MIN <= version <= PRODUCE_MAX:
        raise ValueError(f"Produce v{version} is not encoded natively")
    cdef _Writer w = _out
    w.pos = 0
    w.reserve(12)
    w.pos = 4                       # size prefix, filled in last
    w.i32(correlation_id)
    w.i32(<int32_t>len(topics))
    cdef list parts, res
    cdef object name
    for name, parts in topics:
        w.string(name, False)
        w.reserve(4)
        w.i32(<int32_t>len(parts))
        for res in parts:
            _produce_row(w, version, <int32_t>res[0], <int16_t>res[1], <int64_t>res[2], <int64_t>res[3],
                         <int64_t>res[4], res[5])
    return _produce_end(w)


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
    # one partition's row of a Produce v3-8 response (the layout both Produce encoders write)
    w.reserve(4 + 2 + 8 + 8 + 8 + 4)
    _row_head(w, version, index, error_code, base_offset, log_append_time_ms, log_start_offset)
    if version >= 8:
        w.i32(0)                        # record_errors: none
        w.string(error_message, True)
    return 0


cdef bytes _produce_end(_Writer w):
    # throttle_time_ms (0: no quotas yet), the size prefix, the frame as bytes
    w.reserve(4)
    w.i32(0)
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
                     int32_t n_topics) except -1:
    # a Fetch v4-11 response from its start up to the topic count (the size prefix left to fill in)
    w.pos = 0
    w.reserve(4 + 4 + 4 + 2 + 4 + 4)
    w.pos = 4
    w.i32(correlation_id)
    w.i32(0)                                         # throttle_time_ms
    if version >= 7:
        w.i16(error_code)
        w.i32(0)                                     # session_id
    w.i32(n_topics)
    return 0


cdef int _fetch_row(_Writer w, int version, int32_t index, int16_t error_code, int64_t high_watermark,
                    int64_t last_stable_offset, int64_t log_start_offset) except -1:
    # one partition's row of a Fetch v4-11 response up to its records (the layout both Fetch encoders
    # write); room is reserved for the records' length too
    w.reserve(4 + 2 + 8 + 8 + 8 + 4 + 4 + 4)
    _row_head(w, version, index, error_code, high_watermark, last_stable_offset, log_start_offset)
    w.i32(-1)                                        # aborted_transactions: null
    if version >= 11:
        w.i32(-1)                                    # preferred_read_replica
    return 0


def encode_fetch_response(int version, int32_t correlation_id, int16_t error_code, list topics,
                          Py_ssize_t inline_max):
    """The whole Fetch v4-11 response (size prefix included) -> (chunks, bytes copied inline).

    ``topics``: [(name, [[partition_index, error_code, high_watermark, last_stable_offset,
    log_start_offset, records], ...]), ...]; ``records`` is bytes or a FileRegions. A partition's
    regions smaller than ``inline_max`` bytes in total are read into the response (one chunk, written
    with the other responses of the read) while the response's copied bytes stay within
    ``inline_max`` too (a many-partition answer of small ranges is not copied whole: copying was
    measured cheaper than sendfile only up to that size); the others stay FileRegions chunks for
    sendfile, splitting the response into [bytes, FileRegions, bytes, ...] as the generic encoder does. throttle_time_ms 0,
    session_id 0, aborted_transactions null (no transactions), preferred_read_replica -1 (v11)."""
    if not FETCH_MIN <= version <= FETCH_MAX:
        raise ValueError(f"Fetch v{version} is not encoded natively")
    cdef _Writer w = _out
    cdef list chunks = []
    cdef Py_ssize_t size = 0, copied = 0, rsize
    cdef list parts, res
    cdef object name, records, region
    cdef Py_buffer raw                               # bytes records (a segment read block's slice)
    _fetch_head(w, version, correlation_id, error_code, <int32_t>len(topics))
    for name, parts in topics:
        w.string(name, False)
        w.reserve(4)
        w.i32(<int32_t>len(parts))
        for res in parts:
            _fetch_row(w, version, <int32_t>res[0], <int16_t>res[1], <int64_t>res[2], <int64_t>res[3],
                       <int64_t>res[4])
            records = res[5]
            if isinstance(records, FileRegions):
                rsize = records.size
                w.i32(<int32_t>rsize)
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
                w.i32(-1)
            else:
                # the plain buffer protocol: a typed memoryview costs ~1,500 instructions to set up
                PyObject_GetBuffer(records, &raw, PyBUF_SIMPLE)
                try:
                    rsize = raw.len
                    w.i32(<int32_t>rsize)
                    if rsize:
                        w.reserve(rsize)
                        memcpy(w.p + w.pos, raw.buf, rsize)
                        w.pos += rsize
                finally:
                    PyBuffer_Release(&raw)
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


# ---- request metrics (kbroker.request_metrics): counted once per answered request on the loop thread --
# Bucket upper bounds in seconds: 2^(k/2) * 10 µs for k in 0..46 (the same numbers as
# kbroker.request_metrics.BOUNDS_S, which reads them from here).
DEF N_BOUNDS = 47
cdef double _BOUNDS[N_BOUNDS]
for _k in range(N_BOUNDS):
    _BOUNDS[_k] = 1e-5 * 2.0 ** (_k / 2.0)
BOUNDS_S = tuple(_BOUNDS[_k] for _k in range(N_BOUNDS))
N_BUCKETS = N_BOUNDS + 1
if sizeof((<TimeHistogram>None)._counts) != N_BUCKETS * sizeof(long long):
    raise ImportError("request.pxd TimeHistogram._counts must hold N_BUCKETS counters")


cdef inline Py_ssize_t _bucket(double x) noexcept:
    """bisect_left over the bounds: the first bucket whose bound is >= x (N_BOUNDS: overflow)."""
    cdef Py_ssize_t lo = 0, hi = N_BOUNDS, mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if _BOUNDS[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


cdef class TimeHistogram:
    """Fixed-bound histogram of durations in seconds: per-bucket counts (not cumulative) and a sum."""

    def __init__(self):
        memset(self._counts, 0, sizeof(self._counts))
        self.sum_s = 0.0

    cdef inline void add(self, double x):
        self._counts[_bucket(x)] += 1
        self.sum_s += x

    @property
    def counts(self):
        """The per-bucket counts, a new list."""
        return [self._counts[i] for i in range(N_BUCKETS)]

    def snapshot(self):
        return self.counts, self.sum_s


cdef class RequestStats:
    """RequestMetrics of one request type (Kafka's names in ``histograms``)."""

    def __init__(self, str name):
        self.name = name
        self.count = 0
        self.queue = TimeHistogram()
        self.local = TimeHistogram()
        self.remote = TimeHistogram()
        self.send = TimeHistogram()
        self.total = TimeHistogram()

    cpdef observe(self, double queue_s, double local_s, double send_s, double total_s):
        cdef double remote_s = total_s - queue_s - local_s - send_s
        if remote_s < 0.0:          # clock granularity: the parts may exceed the whole by a tick
            remote_s = 0.0
        self.count += 1
        self.queue.add(queue_s)
        self.local.add(local_s)
        self.remote.add(remote_s)
        self.send.add(send_s)
        self.total.add(total_s)

    def histograms(self):
        """Kafka's metric names -> histogram."""
        return {"RequestQueueTimeMs": self.queue, "LocalTimeMs": self.local, "RemoteTimeMs": self.remote,
                "ResponseSendTimeMs": self.send, "TotalTimeMs": self.total}


# ---- per-request slot (kbroker.network.connection) -------------------------------------------------
# The registry's dict (api key -> RequestStats, kbroker.request_metrics.REQUEST_STATS.by_key: cleared,
# never replaced) and its get() for the misses (first request of a key, FetchFollower). Bound once by
# request_metrics at import.
cdef dict _stats_by_key = {}
cdef object _stats_get = None


def bind_request_stats(dict by_key, get):
    """Where ``Slot.observe`` counts: the registry's dict and its ``get(api_key, follower)``."""
    global _stats_by_key, _stats_get
    _stats_by_key = by_key
    _stats_get = get


cdef class Slot:
    """One request of a connection, from its frame to its answer's last byte. Request metrics
    (kbroker.request_metrics), monotonic seconds: arrived (frame complete) -> started (handler called)
    -> local (handler returned; its awaitable's wait is "remote") -> queued (answer handed to the send
    path) -> observed once the last byte was given to the socket/transport. A C type: created and
    observed once per request on the loop thread, where a Python class cost two interpreter frames
    (``__init__``, ``observe``) per request."""

    def __init__(self, header, double since, double arrived):
        self.header = header
        self.api_key = header.api_key
        self.since = since      # loop time the request arrived (the sweeper closes requests that never end)
        self.arrived = arrived
        self.started = arrived
        self.local = 0.0
        self.queued = arrived
        # chunks None, done and follower (a Fetch from a replica: FetchFollower) False: a new object's
        # fields (tp_alloc zeroes them; Cython sets object fields to None)

    cpdef observe(self, double sent):
        cdef object stats = None
        if not self.follower:
            stats = _stats_by_key.get(self.api_key)
        if stats is None:
            stats = _stats_get(self.api_key, self.follower)
        (<RequestStats?>stats).observe(self.started - self.arrived, self.local, sent - self.queued,
                                       sent - self.arrived)


def observe_slots(list slots, double sent):
    """``Slot.observe(sent)`` of every slot in ``slots`` (answers that left in one write)."""
    _observe_slots(slots, sent)


cdef int _observe_slots(list slots, double sent) except -1:
    cdef Slot slot
    for slot in slots:
        slot.observe(sent)
    return 0



cdef inline int64_t _now_ms() noexcept:
    """time.time_ns() // 1_000_000 (the wall clock append_records stamps with), without the call."""
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    return <int64_t>ts.tv_sec * 1000 + ts.tv_nsec // 1000000


cdef inline double _monotonic() noexcept:
    """time.monotonic() without the call: the same clock (CLOCK_MONOTONIC), in seconds."""
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <double>ts.tv_sec + <double>ts.tv_nsec * 1e-9


def begin_native(frame, parse, pending, dict counts, double since, double arrived):
    """The network layer's native dispatch up to its handler call (kbroker.network.connection):
    ``parse(frame)`` (parse_produce or parse_fetch; a malformed frame raises ProtocolError and nothing
    is queued), a Slot for the request appended to ``pending``, the request counted in ``counts``
    ((api_key, api_version) -> n, the server's metrics), FetchFollower told apart, and the handler's
    start time stamped. -> the Slot (its ``header`` is the parsed request)."""
    return _begin_native(frame, parse, pending, counts, since, arrived)


cdef Slot _begin_native(frame, parse, pending, dict counts, double since, double arrived):
    cdef object req = parse(frame)
    if type(req) is ProduceRequest:
        return _new_slot(req, (<ProduceRequest>req).api_key, (<ProduceRequest>req).api_version, False,
                         pending, counts, since, arrived, _monotonic())
    return _new_slot(req, (<FetchRequest?>req).api_key, (<FetchRequest>req).api_version,
                     (<FetchRequest>req).replica_id >= 0, pending, counts, since, arrived, _monotonic())


cdef Slot _new_slot(header, int api_key, int version, bint follower, pending, dict counts, double since,
                    double arrived, double started):
    # the request's Slot appended to ``pending`` and the request counted in ``counts``
    cdef Slot slot = Slot.__new__(Slot)         # no __init__: the fields are set here, in C
    slot.api_key = api_key
    slot.follower = follower
    slot.header = header
    slot.since = since
    slot.arrived = slot.queued = arrived
    slot.started = started
    pending.append(slot)
    kv = (api_key, version)
    counts[kv] = counts.get(kv, 0) + 1
    return slot


def end_native(Slot slot, result, no_response, close):
    """After the handler returned ``result``: its local time stamped; an answer already encoded (a
    list of chunks, ``no_response`` or ``close``) is queued on the slot (done) -> True; anything else
    (an awaitable) -> False, for the caller to wait on."""
    return _end_native(slot, result, no_response, close)


cdef bint _end_native(Slot slot, result, no_response, close):
    cdef double t1 = _monotonic()
    slot.local = t1 - slot.started
    if type(result) is list or result is no_response or result is close:
        slot.chunks = result
        slot.done = True
        slot.queued = t1
        return True
    return False


# ---- the common Produce without a Python frame (issue 10) ------------------------------------------
# dispatch_frames serves a Produce v3-8 frame here when it is the common request: no transactional id,
# acks 0/1/-1 (-1 when each partition's ISR is this leader alone and min.insync.replicas <= 1, or has
# followers and would be waited for by append_records: then parked, ParkedProduce), up to
# FAST_PARTS partitions of any topics, each with an armed leader slot (FastLeader), none twice, and
# every batch ending as a plain leader append (LeaderAppender.check_plain: not idempotent unless
# the producer's next batch in sequence (LeaderAppender.in_sequence), no roll or
# flush due, the batch checks pass; not compressed when validation runs off the loop, below
# kbroker.log.writer.offload.bytes). All partitions are checked before the first is appended, so
# everything else, any refusal included, is left untouched for the Python path (produce.handle_native
# -> execute -> ReplicaManager.append_records), which stays the reference: what the native path does
# must give the same bytes in the log and in the answer (tests/test_native_differential.py,
# tests/test_produce_fast.py). Policy stays in Python as the slots' state: the ReplicaManager arms a
# slot when the conditions hold and disarms or re-arms it when they change (ARCHITECTURE.md, "Native
# Produce fast path"); what may change without it (the log's config, offline flag, writes in flight,
# active segment, epoch cache, queued appends, waiters) is checked here per request, O(1) per partition.

cdef class FastLeader:
    """One partition this broker leads, as the native Produce path needs it (armed by
    ReplicaManager._fast_refresh; replaced, never changed, when the partition's state changes)."""
    cdef readonly object partition, config, tp, follower_key, epoch_cache
    cdef readonly LogState log
    cdef object seg                     # the LogSegment whose SegmentState ``st`` is (the active one)
    cdef SegmentState st
    cdef LeaderAppender ap
    cdef object waiters                 # Partition.waiters (deque, never replaced)
    cdef dict tails                     # Log.append_tails (never replaced)
    cdef int32_t epoch
    cdef bint followers                 # replicas beyond this one: wake their long polls
    cdef bint alone                     # ISR = this leader, min.insync.replicas <= 1: the HW follows the
                                        # log end, and acks=-1 is answered at once
    cdef bint park                      # ISR with followers, >= min.insync.replicas, not stale: acks=-1 is
                                        # appended and waits for the HW (ParkedProduce)
    cdef bint append_time               # LogAppendTime topic

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
    request the native path leaves (``fallback(conn, req)``), and holding the armed leader slots.
    ``fast``/``slow``: requests served natively / through ``fallback`` (tests, A/B)."""
    cdef object fallback
    cdef object rearm                   # rearm(tp): the ReplicaManager re-evaluates a slot (config changed)
    cdef object write_failed            # produce.fast_write_failed (bound to the broker): a write failed
    cdef dict leaders                   # topic -> {partition index: FastLeader} (arm_leader / disarm_leader)
    cdef dict messages_in, bytes_in     # BrokerMetrics' per-topic counts (never replaced)
    cdef dict notify                    # AppendNotifier._waiters (never replaced)
    cdef object appended                # AppendNotifier.appended
    cdef dict failing_dirs              # ReplicaManager._failing_dirs (never replaced)
    cdef int64_t big                    # AppendThreads.write_offload_bytes
    cdef bint off_loop                  # AppendThreads.validates_off_loop
    cdef object produce_failed          # BrokerMetrics.produce_failed: a parked row that failed (ParkedProduce)
    cdef readonly long long fast, slow

    def __init__(self, fallback, rearm, write_failed, dict leaders not None, dict messages_in not None,
                 dict bytes_in not None, dict notify not None, appended, dict failing_dirs not None, int64_t big,
                 bint off_loop, produce_failed=None):
        self.fallback, self.rearm, self.write_failed = fallback, rearm, write_failed
        self.produce_failed = produce_failed
        self.messages_in, self.bytes_in = messages_in, bytes_in
        self.notify, self.appended, self.failing_dirs = notify, appended, failing_dirs
        self.big, self.off_loop = big, off_loop
        self.leaders = leaders

    def __call__(self, conn, req):
        self.slow += 1
        return self.fallback(conn, req)


def arm_leader(dict leaders not None, FastLeader leader not None):
    """Serve ``leader.tp`` natively (replaces its slot in ``leaders``, the ReplicaManager's dict of
    armed slots that FastProduce and FastFetch share: topic -> {partition index: FastLeader})."""
    topic, index = leader.tp
    parts = leaders.get(topic)
    if parts is None:
        parts = leaders[topic] = {}
    parts[index] = leader


def disarm_leader(dict leaders not None, tp):
    """``tp`` takes the Python path (its slot removed from ``leaders``)."""
    parts = leaders.get(tp[0])
    if parts is not None:
        parts.pop(tp[1], None)
        if not parts:
            del leaders[tp[0]]


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


cdef inline object _utf8(const unsigned char *p, Py_ssize_t n):
    # _decode_str, or _REFUSED for bytes that are not UTF-8
    try:
        return _decode_str(p, n)
    except UnicodeDecodeError:
        return _REFUSED


cdef enum:
    FAST_PARTS = 64     # partitions of one request the fast path takes (more: the Python path)


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
        Py_DECREF(<object>ps.leader[k])
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


cdef int _produce_fast(FastProduce fp, ConnState conn, object view, const unsigned char *p, Py_ssize_t begin,
                       Py_ssize_t size, Py_ssize_t start, Py_ssize_t end, bint *run, no_response,
                       close, chunk) except -1:
    """The frame at ``begin`` (``size`` bytes) served natively -> 1 (its Slot queued with the answer),
    or 0: not the common request, or not a plain append (nothing was done: the caller's path takes
    it from scratch; a write-behind run may have begun, which the caller would begin all the same).
    Every partition (up to FAST_PARTS, of any number of topics) is looked up and checked first
    (LeaderAppender.check_plain: no effect), then all are appended in request order, so a refusal
    of any leaves the whole request untouched."""
    cdef _Parts ps
    ps.n = ps.n_topics = ps.n_bufs = 0
    try:
        return _produce_parts(fp, conn, view, p, begin, size, start, end, run, no_response, close, chunk, &ps)
    finally:
        _parts_release(&ps)


cdef int _produce_parts(FastProduce fp, ConnState conn, object view, const unsigned char *p, Py_ssize_t begin,
                        Py_ssize_t size, Py_ssize_t start, Py_ssize_t end, bint *run, no_response,
                        close, chunk, _Parts *ps) except -1:
    cdef const unsigned char *f = p + begin
    cdef Py_ssize_t pos = 8, name_at
    cdef int16_t n16, acks
    cdef int32_t version, correlation_id, timeout_ms, index, rsize, n_topics, n_parts, count = 0
    cdef int32_t t, j, k, failed = -1, waiting = 0
    cdef int64_t last, now, leo
    cdef object client_id = None, name, parts, result, records, error = None
    cdef LogState lg
    cdef list entries
    cdef FastLeader fl
    cdef SegmentState st
    cdef ProduceRequest req
    cdef Slot slot
    cdef double started
    if size < 8 + 2 + 2 + 2 + 4 + 4:
        return 0
    version = <int16_t>load_be16(<const char *>f + 2)
    correlation_id = <int32_t>load_be32(<const char *>f + 4)
    client_id = _client_id(f, size, &pos)
    if client_id is _REFUSED:
        return 0
    if size - pos < 2 + 2 + 4 + 4:
        return 0
    if <int16_t>load_be16(<const char *>f + pos) != -1:           # a transactional id
        return 0
    acks = <int16_t>load_be16(<const char *>f + pos + 2)
    timeout_ms = <int32_t>load_be32(<const char *>f + pos + 4)
    n_topics = <int32_t>load_be32(<const char *>f + pos + 8)
    if not (-1 <= acks <= 1) or not (1 <= n_topics <= FAST_PARTS) or fp.failing_dirs:
        return 0
    pos += 12
    for t in range(n_topics):
        if size - pos < 2 + 4:
            return 0
        n16 = <int16_t>load_be16(<const char *>f + pos)           # the topic's name
        pos += 2
        if n16 <= 0 or size - pos < n16 + 4:
            return 0
        name_at = pos
        pos += n16
        n_parts = <int32_t>load_be32(<const char *>f + pos)
        pos += 4
        if not (1 <= n_parts <= FAST_PARTS - ps.n):
            return 0
        name = _utf8(f + name_at, n16)
        parts = None if name is _REFUSED else fp.leaders.get(name)
        if parts is None:
            return 0
        ps.name[t] = _held(name)
        ps.n_topics = t + 1
        ps.t_at[t] = name_at
        ps.t_len[t] = n16
        ps.t_parts[t] = n_parts
        ps.t_msgs[t] = ps.t_bytes[t] = 0
        for j in range(n_parts):
            if size - pos < 4 + 4:
                return 0
            index = <int32_t>load_be32(<const char *>f + pos)
            rsize = <int32_t>load_be32(<const char *>f + pos + 4)
            pos += 8
            if rsize <= 0 or rsize > size - pos:
                return 0
            fl = (<dict>parts).get(index)
            if fl is None:
                return 0
            # per partition, O(1): what may change without the slot being re-armed
            if ((acks == -1 and not (fl.alone or fl.park)) or rsize >= fp.big
                    or (fp.off_loop and rsize > 22 and f[pos + 22] & 7)      # compressed: validated off the loop
                    or (fl.alone and len(fl.waiters)) or fl.tails):
                return 0
            lg = fl.log
            if lg.config is not fl.config or fl.partition.leader_epoch != fl.epoch:
                # a config change (or a leadership change a re-arm missed): the next request sees the
                # new slot, or none
                fp.rearm(fl.tp)
                return 0
            if lg.offline or lg._write_job is not None or lg.write_future is not None:
                return 0
            entries = fl.epoch_cache.entries
            if not entries or entries[len(entries) - 1][0] < fl.epoch:  # not yet in the cache: Python assigns it
                return 0
            for k in range(ps.n):
                if ps.leader[k] == <PyObject *>fl:  # the same partition twice: Python answers INVALID_RECORD
                    return 0
            _active_state(fl, lg)
            k = ps.n
            ps.leader[k] = _held(fl)
            ps.n = k + 1
            ps.at[k] = pos
            ps.size[k] = rsize
            ps.index[k] = index
            ps.topic[k] = t
            pos += rsize
    if pos != size:                                   # the last batch ends the frame
        return 0
    # every batch checked before any is appended (no effect: nothing stamped, written or counted)
    now = _now_ms()
    for k in range(ps.n):
        fl = <FastLeader>ps.leader[k]
        records = view[begin + ps.at[k]:begin + ps.at[k] + ps.size[k]]
        ps.buf[k] = _held(records)
        ps.n_bufs = k + 1
        try:
            if fl.ap.check_plain(fl.st, records, fl.config, now, <char *>f + ps.at[k], ps.size[k]):
                return 0            # not a plain append (idempotent out of sequence, flush or roll due)
        except BatchError:
            return 0                # refused: the Python path answers it
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
        if fl.alone:
            leo = st.next_offset
            if leo > lg._high_watermark:
                lg._high_watermark = leo
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
        fp.slow += 1
    else:
        if acks == 0:
            result = no_response
        elif waiting:
            result = _park(fp, conn, version, correlation_id, timeout_ms, ps, waiting)
        else:
            result = [_encode_rows(version, correlation_id, f, ps)]
        fp.fast += 1
    req = _header(PRODUCE, version)
    req.correlation_id = correlation_id
    req.client_id = client_id
    req.acks = acks
    req.timeout_ms = timeout_ms
    slot = _new_slot(req, PRODUCE, version, False, conn._pending, conn._request_counts, conn.last_active,
                     conn._read_at, started)
    if run[0]:
        _run_slots.append(slot)
    if not _end_native(slot, result, no_response, close):
        conn._dispatch_later(slot, result, chunk)
    return 1


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
    w.pos = 0
    w.reserve(4 + 4 + 4)
    w.pos = 4
    w.i32(correlation_id)
    w.i32(ps.n_topics)
    for t in range(ps.n_topics):
        w.reserve(2 + ps.t_len[t] + 4)
        w.i16(ps.t_len[t])
        memcpy(w.p + w.pos, f + ps.t_at[t], ps.t_len[t])
        w.pos += ps.t_len[t]
        w.i32(ps.t_parts[t])
        for j in range(ps.t_parts[t]):
            _produce_row(w, version, ps.index[k], 0, ps.base[k], ps.time[k], ps.start[k], None)
            k += 1
    return _produce_end(w)


# ---- acks=all with followers: the request parked until the high watermark covers it ---------------
cdef enum:
    _PARKED = -1                # a row still waiting (DelayedProduce's UNDECIDED)
    _REQUEST_TIMED_OUT = 7      # Errors.REQUEST_TIMED_OUT
    _KAFKA_STORAGE_ERROR = 56   # Errors.KAFKA_STORAGE_ERROR


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
    cdef readonly object future
    cdef readonly object timer
    cdef object produce_failed
    cdef list tps                   # per partition, request order: its tp (the Partition's own tuple)
    cdef list names                 # per topic: its name
    cdef int version
    cdef int32_t correlation_id, n, n_topics
    cdef readonly int32_t remaining
    cdef int32_t t_parts[FAST_PARTS]
    cdef int32_t index[FAST_PARTS]
    cdef int32_t topic[FAST_PARTS]
    cdef int16_t code[FAST_PARTS]
    cdef int64_t base[FAST_PARTS]
    cdef int64_t time[FAST_PARTS]
    cdef int64_t start[FAST_PARTS]

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
                self._decide(k, _REQUEST_TIMED_OUT)

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
        # fast path took was UTF-8, so encoding it gives the same bytes)
        cdef _Writer w = _out
        cdef int32_t t, j, k = 0
        w.pos = 0
        w.reserve(4 + 4 + 4)
        w.pos = 4
        w.i32(self.correlation_id)
        w.i32(self.n_topics)
        for t in range(self.n_topics):
            w.string(self.names[t], False)
            w.reserve(4)
            w.i32(self.t_parts[t])
            for j in range(self.t_parts[t]):
                _produce_row(w, self.version, self.index[k], self.code[k], self.base[k], self.time[k],
                             self.start[k], None)
                k += 1
        return _produce_end(w)


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


# ---- the consumer Fetch without a Python frame (issue 10) -------------------------------------------
# dispatch_frames serves a Fetch v4-11 frame here when it is the common consumer request: replica_id < 0,
# no fetch session, no forgotten topics, any rack id (no replica selector: fetch.py ignores it), any
# number of topics and partitions, each partition's leader slot (FastLeader, the one the Produce path
# uses: armed and disarmed by the ReplicaManager on leadership changes) armed, current_leader_epoch -1
# or the slot's, log start <= fetch_offset <= log end, a read (fetch_offset < high watermark) in the
# active segment with batch boundaries the segment's recent-batch list or read block answer, and an
# answer fetch.handle_native would give at once (bytes >= min_bytes, or max_wait_ms <= 0) whose records
# (whole batches, as Log.read cuts them under fetch._read's shrinking budget) are below the sendfile
# threshold in total and copied from the segments' read blocks (read as LogSegment.read_bytes reads
# one). The high watermark, log start offset, active segment and offline flag are read from the Log per
# request (no copies to keep exact). Everything else is left untouched for the Python path
# (fetch.handle_native -> _read -> Log.read), which stays the reference: the answer here must be the
# same bytes (tests/test_native_differential.py, tests/test_fetch_fast.py).

cdef enum:
    _UNDECIDED = -2                         # a read position the native path leaves to Python

cdef int64_t _I64_MAX = 0x7FFFFFFFFFFFFFFF
# fetch.py _RESPONSE_DATA_CEILING: record data never brings an answer near the int32 size limit
cdef int64_t _DATA_CEILING = 0x7FFFFFFF - (64 << 20)


cdef class FastFetch:
    """The Fetch handler dispatch_frames gets (broker.py): called as ``handle_native`` for any request
    the native path leaves (``fallback(conn, req)``). Reads the ReplicaManager's armed leader slots
    (``leaders``, shared with FastProduce), counts BytesOut per topic in ``bytes_out`` (never
    replaced), caps answers by the broker's ``fetch.max.bytes`` (``config_values``: the BrokerConfig's
    dict of typed values) and copies records from the segments' read blocks (kbroker.log.segment
    ``_blocks``: at most ``read_blocks`` of at most ``read_block`` bytes each; 0: none are kept).
    ``fast``/``slow``: requests served natively / through ``fallback`` (tests, A/B)."""
    cdef object fallback
    cdef object rearm                   # rearm(tp): the ReplicaManager re-evaluates a slot
    cdef dict leaders
    cdef dict bytes_out
    cdef dict config_values
    cdef dict blocks
    cdef Py_ssize_t read_blocks         # kbroker.log.segment.READ_BLOCKS (0: no blocks)
    cdef int64_t read_block
    cdef int32_t local_id
    cdef dict topic_configs             # LogManager.topic_configs (topic -> overrides; never replaced)
    cdef object complete                # ReplicaManager._complete: a follower's fetch moved the HW
    cdef object broker_metrics          # BrokerMetrics (replication_bytes_out)
    cdef readonly long long fast, slow
    # followers' fetches: answered here / positions recorded here, then Python's long poll / all Python
    cdef readonly long long follower_fast, follower_polled, follower_slow

    def __init__(self, fallback, rearm, dict leaders not None, dict bytes_out not None,
                 dict config_values not None, dict blocks not None, Py_ssize_t read_blocks, int64_t read_block,
                 int32_t local_id, dict topic_configs not None, complete, broker_metrics):
        self.fallback, self.rearm, self.leaders, self.bytes_out = fallback, rearm, leaders, bytes_out
        self.config_values, self.blocks = config_values, blocks
        self.read_blocks, self.read_block, self.local_id = read_blocks, read_block, local_id
        self.topic_configs, self.complete, self.broker_metrics = topic_configs, complete, broker_metrics

    def reread(self, ConnState conn not None, bytes frame not None):
        """A long poll's read of a follower's fetch whose positions were recorded natively (fetch.py
        ``_poll_recorded``; ``frame``: FetchRequest.frame) -> [the answer's chunks, its records' size],
        or None: Python's read (fetch._read) this time."""
        cdef list out = []
        if _fetch_fast(self, conn, <const unsigned char *>PyBytes_AS_STRING(frame), 0, len(frame), None, None,
                       out):
            return out
        return None

    def __call__(self, conn, req):
        if type(req) is FetchRequest and (<FetchRequest>req).recorded:
            self.follower_polled += 1   # not "slow": its positions were recorded natively
        else:
            self.slow += 1
            if type(req) is FetchRequest and (<FetchRequest>req).replica_id >= 0:
                self.follower_slow += 1
        return self.fallback(conn, req)


cdef int64_t _batch_position(FastFetch ff, seg, SegmentState st, int64_t offset,
                             int64_t start_position) except -3:
    """LogSegment.batch_position answered from the recent-batch list or the read block, as that method
    does (its block cursor moved the same way); _UNDECIDED where it would load a block or search the
    index and the file (the Python path then does)."""
    cdef int64_t pos = tail_position(st, offset, start_position), bpos, size = 0, base = -1, last = -1
    cdef list block
    cdef bytes data
    if pos != -2:
        return pos                      # -1: past the last batch
    if not ff.read_blocks:
        return _UNDECIDED
    block = ff.blocks.get(seg)
    if block is None or offset <= <int64_t>block[2]:
        return _UNDECIDED
    data = <bytes>block[1]
    bpos = <int64_t>block[0]
    pos = seek_in(PyBytes_AS_STRING(data), bpos, bpos + len(data),
                  <int64_t>block[3] if offset > <int64_t>block[4] else bpos, st.size, offset, _I64_MAX,
                  &size, &base, &last)
    if size:
        block[3] = pos
        block[4] = base - 1
        return pos if pos >= start_position else _UNDECIDED
    if pos + HEADER_SIZE > st.size:
        return -1                       # past the last batch
    return _UNDECIDED


cdef int64_t _end_position(FastFetch ff, seg, SegmentState st, int64_t start, int64_t max_bytes,
                           int64_t max_offset, bint min_one_batch) except -3:
    """LogSegment.end_position(start, max_bytes, max_offset, min_one_batch) from the recent-batch
    list or the read block; _UNDECIDED where that method would load a block or walk the file."""
    cdef int64_t end = st.size, pos, limit, byte_end, bpos, bend, size = 0, base, last
    cdef list block
    cdef bytes data
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
    if not ff.read_blocks:
        return _UNDECIDED
    block = ff.blocks.get(seg)
    if block is None:
        return _UNDECIDED               # loads a block (a small read) or walks the file
    data = <bytes>block[1]
    bpos = <int64_t>block[0]
    bend = bpos + len(data)
    if start < bpos or (limit + HEADER_SIZE > bend and bend < end):
        return _UNDECIDED
    pos = seek_in(PyBytes_AS_STRING(data), bpos, bend, start, end, _I64_MAX, limit, &size, &base, &last)
    if not size:
        return _UNDECIDED               # the index and the file
    byte_end = pos
    if byte_end == start and min_one_batch:
        byte_end = start + size
    return end if end < byte_end else byte_end


cdef list _block_holding(FastFetch ff, seg, SegmentState st, int64_t start, int64_t n):
    """LogSegment.read_bytes' block for [start, start + n): the segment's read block when it holds the
    range (moved to the most recently used end), else a new one read at ``start`` (LogSegment._load_block,
    the least recently used block dropped past the limit); None when no block can hold it (the
    Python path sends it from the file)."""
    cdef list block
    cdef int64_t bpos, want, floor
    cdef bytes data
    cdef dict blocks = ff.blocks
    if not ff.read_blocks or n > ff.read_block:
        return None
    block = blocks.get(seg)
    if block is not None:
        bpos = <int64_t>block[0]
        if start >= bpos and start + n <= bpos + len(<bytes>block[1]):
            if next(reversed(blocks)) is not seg:
                blocks[seg] = blocks.pop(seg)
            return block
    want = st.size - start
    if want > ff.read_block:
        want = ff.read_block
    if want < n:
        return None
    data = PyBytes_FromStringAndSize(NULL, want)
    if read_full(<int>seg.read_fd, PyBytes_AS_STRING(data), want, start) != want:
        return None                     # cut underneath: the Python path reports it
    floor = <int64_t>load_be64(PyBytes_AS_STRING(data)) - 1 if want >= HEADER_SIZE else _I64_MAX
    block = [start, data, floor, start, floor]
    blocks.pop(seg, None)
    blocks[seg] = block
    if len(blocks) > ff.read_blocks:
        try:
            del blocks[next(iter(blocks))]
        except (KeyError, RuntimeError):
            pass
    return block


cdef inline bint _valid_utf8(const unsigned char *s, Py_ssize_t n):
    # whether n bytes decode as a request string does (the common ASCII name: no decode)
    cdef Py_ssize_t i
    for i in range(n):
        if s[i] >= 0x80:
            return _utf8(s, n) is not _REFUSED
    return True


cdef int _fetch_fast(FastFetch ff, ConnState conn, const unsigned char *p, Py_ssize_t begin, Py_ssize_t size,
                     no_response, close, list reread=None) except -1:
    """The frame at ``begin`` (``size`` bytes) served natively -> 1 (its Slot queued with the answer),
    2: a follower's fetch with nothing to read whose positions were recorded here (the caller's path
    long-polls it, FetchRequest.recorded), or 0: not the common request (nothing was done but read
    blocks read and their cursors moved as the Python path reads and moves them: the caller's path
    takes the request from scratch). ``reread``: a long poll's read of a follower's fetch recorded
    before (FastFetch.reread): nothing recorded, no Slot; 1 with [the answer's chunks, its records'
    size] appended to ``reread`` (whether or not that is min_bytes: the poll decides), or 0 (Python's
    read)."""
    cdef const unsigned char *f = p + begin
    cdef Py_ssize_t pos = 8, name_at, topics_at, part_len
    cdef int16_t name_len, rack_len = 0
    cdef int32_t version, correlation_id, replica_id, max_wait_ms, min_bytes, max_bytes, index
    cdef int32_t leader_epoch = -1, part_max, session_epoch = -1, n_topics, n_parts, t, j
    cdef int8_t isolation
    cdef int64_t fetch_offset, hw, log_start, start = 0, end, n, budget, limit, total = 0, topic_total
    cdef int64_t sendfile_min, rd_max
    cdef bint first = True, follower
    cdef object rid = None, fs, tcfg
    cdef list recs = None                   # a follower's partitions: (FastLeader, FollowerState, fetch
                                            # offset, current leader epoch, log end, the row's position)
    cdef object client_id = None, rack = "", name, tparts, seg, cap, metrics, name0 = None
    cdef LogState lg
    cdef list block, more = None            # BytesOut: the first topic with data (name0, total0), the others
    cdef int64_t total0 = 0
    cdef FastLeader fl
    cdef SegmentState st
    cdef FetchRequest req
    cdef Slot slot
    cdef _Writer w
    cdef double started = _monotonic()
    if size < pos + 2:
        return 0
    version = <int16_t>load_be16(<const char *>f + 2)
    correlation_id = <int32_t>load_be32(<const char *>f + 4)
    client_id = _client_id(f, size, &pos)
    if client_id is _REFUSED:
        return 0
    # replica_id, max_wait_ms, min_bytes, max_bytes, isolation_level, [session_id, session_epoch],
    # the topic count
    if size - pos < 17 + (8 if version >= 7 else 0) + 4:
        return 0
    replica_id = <int32_t>load_be32(<const char *>f + pos)
    max_wait_ms = <int32_t>load_be32(<const char *>f + pos + 4)
    min_bytes = <int32_t>load_be32(<const char *>f + pos + 8)
    max_bytes = <int32_t>load_be32(<const char *>f + pos + 12)
    isolation = <int8_t>f[pos + 16]
    pos += 17
    follower = replica_id >= 0
    if version >= 7:
        if <int32_t>load_be32(<const char *>f + pos) != 0:       # a fetch session
            return 0
        session_epoch = <int32_t>load_be32(<const char *>f + pos + 4)
        pos += 8
    n_topics = <int32_t>load_be32(<const char *>f + pos)
    pos += 4
    topics_at = pos
    # The whole frame's layout first (nothing read before it is known to be the common request): each
    # topic's name (UTF-8, not empty) and partitions (index, [current_leader_epoch], fetch_offset,
    # [log_start_offset], max bytes), no forgotten topics, a rack id (UTF-8, any: no replica
    # selector, so fetch.py ignores it, KIP-392's preferred read replica is always -1), nothing after.
    part_len = 4 + (4 if version >= 9 else 0) + 8 + (8 if version >= 5 else 0) + 4
    if n_topics < 0:
        return 0
    for t in range(n_topics):
        if size - pos < 2:
            return 0
        name_len = <int16_t>load_be16(<const char *>f + pos)
        if name_len <= 0 or size - pos - 2 < name_len + 4 or not _valid_utf8(f + pos + 2, name_len):
            return 0
        pos += 2 + name_len
        n_parts = <int32_t>load_be32(<const char *>f + pos)
        pos += 4
        if n_parts < 0 or <int64_t>n_parts * part_len > size - pos:
            return 0
        pos += n_parts * part_len
    if version >= 7:
        if size - pos < 4 or <int32_t>load_be32(<const char *>f + pos) != 0:     # forgotten topics
            return 0
        pos += 4
    if version >= 11:
        if size - pos < 2:
            return 0
        rack_len = <int16_t>load_be16(<const char *>f + pos)
        if rack_len < 0 or size - pos - 2 < rack_len:
            return 0
        if rack_len:
            rack = _utf8(f + pos + 2, rack_len)
            if rack is _REFUSED:
                return 0
        pos += 2 + rack_len
    if pos != size:
        return 0
    # fetch._read's budget: the request's max_bytes capped by fetch.max.bytes (a follower's:
    # replica.fetch.response.max.bytes) and the data ceiling
    cap = ff.config_values.get("replica.fetch.response.max.bytes" if follower else "fetch.max.bytes")
    if cap is None:
        return 0
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
        return 0
    w = _out
    _fetch_head(w, version, correlation_id, 0, n_topics)
    pos = topics_at
    for t in range(n_topics):
        name_len = <int16_t>load_be16(<const char *>f + pos)
        name_at = pos + 2
        pos = name_at + name_len
        n_parts = <int32_t>load_be32(<const char *>f + pos)
        pos += 4
        name = _utf8(f + name_at, name_len)
        tparts = ff.leaders.get(name)
        if tparts is None:
            return 0
        if follower:
            # leader.replication.throttled.replicas set for the topic: the leader quota's counting
            # (ReplicaManager.record_leader_bytes) is Python's
            tcfg = ff.topic_configs.get(name)
            if tcfg and tcfg.get("leader.replication.throttled.replicas"):
                return 0
        w.reserve(2 + name_len + 4)
        w.i16(name_len)
        memcpy(w.p + w.pos, f + name_at, name_len)
        w.pos += name_len
        w.i32(n_parts)
        topic_total = 0
        for j in range(n_parts):
            index = <int32_t>load_be32(<const char *>f + pos)
            pos += 4
            if version >= 9:
                leader_epoch = <int32_t>load_be32(<const char *>f + pos)
                pos += 4
            fetch_offset = <int64_t>load_be64(<const char *>f + pos)
            pos += 8
            if version >= 5:
                pos += 8                                          # the follower's log start: unused
            part_max = <int32_t>load_be32(<const char *>f + pos)
            pos += 4
            fl = (<dict>tparts).get(index)
            if fl is None or (leader_epoch >= 0 and leader_epoch != fl.epoch):
                return 0                # epoch fencing (KIP-320): the Python path answers the error
            if fl.partition.leader_epoch != fl.epoch:
                ff.rearm(fl.tp)         # a leadership change a re-arm missed: the next request sees the new slot
                return 0
            if fl.partition.leader_id != ff.local_id:
                return 0
            if follower:
                # record_follower_fetch's common case only: an ISR follower (no expansion, never
                # throttled: ReplicaManager.leader_throttled), known, of a leader whose ISR writes stand
                if fl.partition.stale or rid not in fl.partition.isr:
                    return 0
                fs = fl.partition.followers.get(rid)
                if fs is None:
                    return 0
            lg = fl.log
            if lg.offline or lg._write_job is not None:
                return 0
            hw = lg._high_watermark
            log_start = lg.log_start_offset
            if fetch_offset < log_start:
                return 0                # out of range
            st = _active_state(fl, lg)
            seg = fl.seg
            limit = part_max if part_max < budget else budget
            n = 0
            # Log.read's bound: the HW for consumers, the log end for followers
            rd_max = st.next_offset if follower else hw
            if fetch_offset >= rd_max:  # Log.read: nothing to read yet (an empty row); past the log end
                if fetch_offset > st.next_offset:       # out of range
                    return 0
            else:
                if fetch_offset < st.base_offset or rd_max > st.next_offset or (first and limit < 0):
                    return 0            # an older segment
                start = _batch_position(ff, seg, st, fetch_offset, 0)
                if start < 0:
                    return 0
                end = _end_position(ff, seg, st, start, limit, rd_max, first)
                if end == _UNDECIDED:
                    return 0
                n = end - start
                if n > 0:
                    total += n
                    if total >= sendfile_min:
                        return 0        # sent by sendfile
                    block = _block_holding(ff, seg, st, start, n)
                    if block is None:
                        return 0
                else:
                    n = 0
            if recs is not None:        # its HW is written once the position is recorded (below)
                recs.append((fl, fs, fetch_offset, leader_epoch, st.next_offset, w.pos))
            _fetch_row(w, version, index, 0, hw, hw, log_start)
            w.i32(<int32_t>n)
            if n:
                w.reserve(n)
                memcpy(w.p + w.pos, PyBytes_AS_STRING(<bytes>block[1]) + (start - <int64_t>block[0]), n)
                w.pos += n
                budget -= n
                topic_total += n
                first = False
        if topic_total:
            if name0 is None:
                name0 = name
                total0 = topic_total
            elif more is None:
                more = [(name, topic_total)]
            else:
                more.append((name, topic_total))
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
        return 1
    if total < min_bytes and max_wait_ms > 0:
        if not follower or total:
            return 0                    # a long poll
        # a follower's fetch with nothing to read (caught up): its positions recorded here, the long
        # poll left to Python (fetch.handle_native, FetchRequest.recorded)
        _record_followers(ff, recs, None)
        return 2
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
    req.session_epoch = session_epoch
    req.rack_id = rack
    slot = _new_slot(req, FETCH, version, follower, conn._pending, conn._request_counts, conn.last_active,
                     conn._read_at, started)
    _end_native(slot, result, no_response, close)
    return 1


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
    and caught-up time), then, past the HW, maybe_increment_hw (HW = min LEO over the ISR, clamped as
    Log.high_watermark's setter does) and _complete when it moved."""
    cdef int64_t o, leo, hw, cur, f_leo, start
    cdef object fs, p, f2, r
    cdef LogState lg
    cdef FastLeader fl = <FastLeader>rec[0]
    cdef list isr
    cdef dict followers
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
    cur = lg._high_watermark
    if o <= cur:
        return 0                        # an ISR follower at or below the HW cannot move it
    p = fl.partition
    isr = p.isr
    if len(isr) < <Py_ssize_t>lg.config.min_insync_replicas:
        return 0
    hw = leo
    followers = p.followers
    for r in isr:
        if <int32_t>r == ff.local_id:
            continue
        f2 = followers.get(r)
        if f2 is None:
            return 0
        f_leo = f2.leo
        if f_leo < 0:
            return 0
        if f_leo < hw:
            hw = f_leo
    if hw <= cur:
        return 0
    start = lg.log_start_offset
    lg._high_watermark = (hw if hw > start else start) if hw < leo else leo
    ff.complete(p)
    return 0


def dispatch_frames(ConnState conn not None, chunk, Py_ssize_t start, Py_ssize_t end, Py_ssize_t max_frame, produce, fetch,
                    dict supported, no_response, close):
    """Every complete frame of a receive chunk (kbroker.network.connection ``_parse_chunk``), from
    ``start`` up to ``end``, in one call per read, or the one frame of a buffer of its own (an mmap,
    size prefix included: ``_complete_frame``): a Produce v3-8 / Fetch v4-11 frame whose version is
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
    error message, as the Python path), its other rows unchanged; an acks=0 request closes the
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
        return [_rewrite_produce((<list>chunks)[0], version, rows)]
    return chunks


cdef bytes _rewrite_produce(bytes answer, int version, dict rows):
    # A Produce v3-8 response frame (size prefix included) with each row whose (topic, partition) is in
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
                _produce_row(w, version, index, _KAFKA_STORAGE_ERROR, -1, -1, -1, message)
            else:
                w.reserve(pos - row)
                memcpy(w.p + w.pos, s + row, pos - row)
                w.pos += pos - row
    if n - pos != 4:
        raise ValueError("not a Produce response")
    return _produce_end(w)


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
    cdef object handler, parse, frame, sv, result
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
        try:
            if key == PRODUCE:
                if fast is not None:
                    done = _produce_fast(fast, conn, view, p, begin, size, start, end, run, no_response, close,
                                         chunk)
            elif ffast is not None:
                done = _fetch_fast(ffast, conn, p, begin, size, no_response, close)
        except Exception:
            # as a raising handler: logged, the connection closed (the slot only names the request)
            conn._handler_raised(_new_slot(_header(key, version), key, version, False, conn._pending,
                                           conn._request_counts, conn.last_active, conn._read_at,
                                           _monotonic()))
            continue
        if done == 1:
            _answered(conn, run, no_response, close)
            continue
        frame = view[begin:begin + size]
        try:
            slot = _begin_native(frame, parse, conn._pending, conn._request_counts, conn.last_active,
                                 conn._read_at)
        except ProtocolError:
            conn._dispatch(frame, chunk)        # malformed: the generic outcome (nothing was queued)
            continue
        if done == 2:
            # _fetch_fast recorded its follower's positions: the long poll's reads take the frame again
            (<FetchRequest>slot.header).recorded = True
            (<FetchRequest>slot.header).frame = bytes(frame)
        if key == PRODUCE and not run[0] and _frame_follows(p, start, end):
            # a run only when another frame of the chunk follows: a lone request (one in flight) is
            # written as it is handled, so a failing disk still answers it KAFKA_STORAGE_ERROR
            run_begin()
            run[0] = True
        if run[0]:
            set_run_tag(len(_run_slots))    # the Python path's appends defer in the run as the fast path's
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


# ---- one native call per readable event (issue 10) -------------------------------------------------
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
    """Reads served by ``on_read`` (native) and by the connection's Python (python: a large frame's
    buffer, or KBROKER_NATIVE_READ=0); one per server (NetworkMetrics.reads)."""
    cdef public long long native
    cdef public long long python


cdef class ConnState:
    """The fields of a client connection (kbroker.network.connection.Connection, a subclass) that
    every read touches, as C fields: ``on_read`` reads and writes them without attribute lookups
    (Python code sees them as ordinary attributes). The connection's other state stays in its dict."""
    cdef public object transport, server, loop, _chunk, _frame, _next, partial_since, _pending, _reads
    cdef public bint closed, _in_read, _writing, _loop_clock_is_monotonic, _direct_write
    cdef public Py_ssize_t _start, _end, _frame_need, max_frame
    # the server's, fixed when it starts (copied here: an attribute of the server costs a dict lookup
    # per request): the native handlers (None when the native path is off), NetworkMetrics.requests
    # (requests counted per key and version) and the sendfile threshold
    cdef public object _native_produce, _native_fetch
    cdef public dict _request_counts
    cdef public long long _sendfile_min
    cdef public double last_active, _read_at
    cdef public int _sock_fd


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
        stats.python += 1
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

