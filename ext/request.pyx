"""Native request path: Produce parsed straight from the request frame and its response encoded
in one call each (kbroker.network.connection dispatches Produce v3-8 here; every other request and
version goes through the generic schema codec, which stays the reference: tests/test_native_*).

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
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int16_t, int32_t, int64_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy

from kbroker._native.hton cimport load_be16, load_be32, load_be64, store_be16, store_be32, store_be64

from kbroker.protocol.types import ProtocolError

PRODUCE_MIN = 3
PRODUCE_MAX = 8

cdef enum:
    PRODUCE = 0
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


cdef class _Reader:
    cdef const unsigned char *p
    cdef Py_ssize_t pos
    cdef Py_ssize_t end

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
            return PyUnicode_DecodeUTF8(<const char *>self.p + start, n, NULL)
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


def parse_produce(frame):
    """Parse a whole Produce v3-8 request frame (size prefix removed). -> ProduceRequest.
    Raises ProtocolError on malformed input or another API/version."""
    cdef const unsigned char[::1] v = frame
    cdef _Reader r = _Reader.__new__(_Reader)
    r.end = v.shape[0]
    if r.end < 8:
        raise ProtocolError("truncated request header")
    r.p = &v[0]
    r.pos = 0
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
            w.reserve(4 + 2 + 8 + 8 + 8 + 4)
            w.i32(<int32_t>res[0])
            w.i16(<int16_t>res[1])
            w.i64(<int64_t>res[2])
            w.i64(<int64_t>res[3])               # log_append_time_ms (v2+)
            if version >= 5:
                w.i64(<int64_t>res[4])           # log_start_offset
            if version >= 8:
                w.i32(0)                         # record_errors: none
                w.string(res[5], True)           # error_message
    w.reserve(4)
    w.i32(0)                                     # throttle_time_ms
    store_be32(w.p, <uint32_t>(w.pos - 4))
    return PyBytes_FromStringAndSize(w.p, w.pos)
