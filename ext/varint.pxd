# Zigzag varints of Kafka's record format (protobuf sint32/sint64), shared by every module that walks
# or builds records (batch, arrow). GIL-free inline helpers: cimport them, there is no module behind.
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t


# The sint32 at p[pos]: the position after it, or -1 if it is truncated at `end` or longer than 5 bytes.
cdef inline Py_ssize_t read_varint(const unsigned char *p, Py_ssize_t pos, Py_ssize_t end,
                                   int32_t *out) noexcept nogil:
    cdef uint32_t raw = 0
    cdef int shift = 0
    cdef unsigned char b
    while True:
        if pos >= end or shift > 28:
            return -1
        b = p[pos]
        pos += 1
        raw |= <uint32_t>(b & 0x7F) << shift
        if not (b & 0x80):
            break
        shift += 7
    out[0] = <int32_t>((raw >> 1) ^ (~(raw & 1) + 1))
    return pos


# The sint64 at p[pos]: the position after it, or -1 if it is truncated at `end` or longer than 10 bytes.
cdef inline Py_ssize_t read_varlong(const unsigned char *p, Py_ssize_t pos, Py_ssize_t end,
                                    int64_t *out) noexcept nogil:
    cdef uint64_t raw = 0
    cdef int shift = 0
    cdef unsigned char b
    while True:
        if pos >= end or shift > 63:
            return -1
        b = p[pos]
        pos += 1
        raw |= <uint64_t>(b & 0x7F) << shift
        if not (b & 0x80):
            break
        shift += 7
    out[0] = <int64_t>((raw >> 1) ^ (~(raw & 1) + 1))
    return pos


# Bytes the zigzag encoding of v takes (a sint32 is written the same way).
cdef inline int varlong_size(int64_t v) noexcept nogil:
    cdef uint64_t z = (<uint64_t>v << 1) ^ <uint64_t>(v >> 63)
    cdef int n = 1
    while z >= 0x80:
        z >>= 7
        n += 1
    return n


# Write the zigzag encoding of v at p[pos]; return the position after it.
cdef inline Py_ssize_t write_varlong(char *p, Py_ssize_t pos, int64_t v) noexcept nogil:
    cdef uint64_t z = (<uint64_t>v << 1) ^ <uint64_t>(v >> 63)
    while z >= 0x80:
        p[pos] = <char>((z & 0x7F) | 0x80)
        z >>= 7
        pos += 1
    p[pos] = <char>z
    return pos + 1
