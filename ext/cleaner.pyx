"""Log-compaction byte work for kbroker.log.cleaner: key hashing, the dedupe map, record filtering.

Contract
- Keys are reduced to a 128-bit hash (MurmurHash3 x64-128 of the key bytes, seed 0); two keys
  that collide would make the older one look superseded, at odds of about 2^-128 per pair.
- ``OffsetMap`` is a bounded open-addressing table of (hash, latest offset), 24 bytes a slot,
  allocated once per cleaning round; ``put_section`` adds every keyed record of one
  uncompressed records section (what follows byte 61 of a batch, after decompression).
- ``filter_section`` copies the records that survive into a new records section: a record
  survives when it has a key, no later offset for its key is in the map, and it is not a
  tombstone whose delete horizon has passed. Surviving record bytes are copied verbatim
  (offsetDelta stays relative to the batch's original baseOffset, as Kafka keeps it), except
  that a new base timestamp (the KIP-534 delete horizon) rewrites each timestampDelta.
- ``finish_batch`` builds the cleaned batch: the original header with the new count, length,
  attributes, timestamps and CRC.
- Threads: every byte loop runs without the GIL; callers pass buffers they do not mutate.
- Malformed records raise ValueError (the caller keeps the batch as it was).
"""
cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport INT64_MIN, int32_t, int64_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcmp, memcpy

from hton cimport store_be16, store_be32, store_be64
from layout cimport *
from varint cimport read_varint, read_varlong, varlong_size, write_varlong

# Sentinel "keep the base timestamp" for filter_section.
KEEP_BASE_TIMESTAMP = -(1 << 63)
cdef int64_t NO_REBASE = INT64_MIN


# ---------------------------------------------------------------- hashing

cdef inline uint64_t rotl(uint64_t x, int r) noexcept nogil:
    return (x << r) | (x >> (64 - r))


cdef inline uint64_t fmix(uint64_t k) noexcept nogil:
    k ^= k >> 33
    k *= <uint64_t>0xff51afd7ed558ccd
    k ^= k >> 33
    k *= <uint64_t>0xc4ceb9fe1a85ec53
    k ^= k >> 33
    return k


cdef inline uint64_t load_le64(const unsigned char *p) noexcept nogil:
    cdef uint64_t v = 0
    cdef int i
    for i in range(8):
        v |= (<uint64_t>p[i]) << (8 * i)
    return v


cdef void hash128(const unsigned char *data, Py_ssize_t n, uint64_t *out) noexcept nogil:
    # MurmurHash3 x64-128, seed 0.
    cdef uint64_t c1 = <uint64_t>0x87c37b91114253d5
    cdef uint64_t c2 = <uint64_t>0x4cf5ad432745937f
    cdef uint64_t h1 = 0, h2 = 0, k1, k2
    cdef Py_ssize_t blocks = n // 16, i
    cdef const unsigned char *tail
    cdef int rem, j
    for i in range(blocks):
        k1 = load_le64(data + 16 * i)
        k2 = load_le64(data + 16 * i + 8)
        k1 *= c1; k1 = rotl(k1, 31); k1 *= c2; h1 ^= k1
        h1 = rotl(h1, 27); h1 += h2; h1 = h1 * 5 + 0x52dce729
        k2 *= c2; k2 = rotl(k2, 33); k2 *= c1; h2 ^= k2
        h2 = rotl(h2, 31); h2 += h1; h2 = h2 * 5 + 0x38495ab5
    tail = data + blocks * 16
    rem = <int>(n & 15)
    k1 = 0
    k2 = 0
    if rem > 8:
        for j in range(rem - 1, 7, -1):
            k2 ^= (<uint64_t>tail[j]) << (8 * (j - 8))
        k2 *= c2; k2 = rotl(k2, 33); k2 *= c1; h2 ^= k2
    if rem > 0:
        for j in range(min(rem, 8) - 1, -1, -1):
            k1 ^= (<uint64_t>tail[j]) << (8 * j)
        k1 *= c1; k1 = rotl(k1, 31); k1 *= c2; h1 ^= k1
    h1 ^= <uint64_t>n
    h2 ^= <uint64_t>n
    h1 += h2
    h2 += h1
    h1 = fmix(h1)
    h2 = fmix(h2)
    h1 += h2
    h2 += h1
    out[0] = h1
    out[1] = h2


def key_hash(key):
    """The 16-byte hash the dedupe map stores for ``key`` (little-endian h1 | h2)."""
    cdef Py_buffer view
    cdef uint64_t h[2]
    PyObject_GetBuffer(key, &view, PyBUF_SIMPLE)
    try:
        hash128(<const unsigned char *>view.buf, view.len, h)
    finally:
        PyBuffer_Release(&view)
    return PyBytes_FromStringAndSize(<const char *>h, 16)


# ---------------------------------------------------------------- record walk

cdef struct Rec:
    Py_ssize_t start          # first byte of the length varint
    Py_ssize_t body           # first byte after the length varint (attributes)
    Py_ssize_t after_ts       # first byte after timestampDelta
    Py_ssize_t end            # one past the record
    int64_t ts_delta
    int32_t offset_delta
    Py_ssize_t key            # -1 = null key
    Py_ssize_t key_len
    bint tombstone


cdef inline Py_ssize_t next_record(const unsigned char *p, Py_ssize_t pos, Py_ssize_t n,
                                   Rec *r) noexcept nogil:
    # Parse the record at pos; returns the position after it or -1 if malformed.
    cdef int32_t length, klen, vlen, nh, hl
    cdef Py_ssize_t q, h
    r.start = pos
    q = read_varint(p, pos, n, &length)
    if q < 0 or length < 1 or length > n - q:
        return -1
    r.body = q
    r.end = q + length
    q += 1                                            # attributes
    q = read_varlong(p, q, r.end, &r.ts_delta)
    if q < 0:
        return -1
    r.after_ts = q
    q = read_varint(p, q, r.end, &r.offset_delta)
    if q < 0:
        return -1
    q = read_varint(p, q, r.end, &klen)
    if q < 0 or klen < -1 or klen > r.end - q:
        return -1
    if klen >= 0:
        r.key = q
        r.key_len = klen
        q += klen
    else:
        r.key = -1
        r.key_len = 0
    q = read_varint(p, q, r.end, &vlen)
    if q < 0 or vlen < -1 or vlen > r.end - q:
        return -1
    r.tombstone = vlen == -1
    if vlen > 0:
        q += vlen
    q = read_varint(p, q, r.end, &nh)
    if q < 0 or nh < 0:
        return -1
    for h in range(nh):
        q = read_varint(p, q, r.end, &hl)
        if q < 0 or hl < 0 or hl > r.end - q:
            return -1
        q += hl
        q = read_varint(p, q, r.end, &hl)
        if q < 0 or hl < -1 or hl > r.end - q:
            return -1
        if hl > 0:
            q += hl
    if q != r.end:
        return -1
    return r.end


# ---------------------------------------------------------------- dedupe map

@cython.final
cdef class OffsetMap:
    """Bounded map key hash -> latest offset (Kafka's SkimpyOffsetMap idea): ``slots`` slots,
    filled at most to ``max_entries`` (load factor) so probes stay short. Fields and C methods are
    declared in cleaner.pxd (with the Slot struct)."""

    def __cinit__(self, Py_ssize_t slots, double load_factor=0.9):
        if slots < 1:
            raise ValueError("an offset map needs at least one slot")
        self.table = <Slot *>calloc(<size_t>slots, sizeof(Slot))
        if self.table == NULL:
            raise MemoryError()
        self.slots = slots
        self.max_entries = max(1, <Py_ssize_t>(slots * load_factor))
        self.size = 0
        self.latest_offset = -1

    def __dealloc__(self):
        free(self.table)

    @property
    def room(self):
        """Entries that can still be added without passing the load factor."""
        return self.max_entries - self.size

    cdef inline Slot *find(self, uint64_t h1, uint64_t h2) noexcept nogil:
        # The slot holding (h1, h2), or the empty slot where it would go.
        cdef Py_ssize_t i = <Py_ssize_t>(h1 % <uint64_t>self.slots)
        cdef Slot *s
        while True:
            s = &self.table[i]
            if s.offset_plus_one == 0 or (s.h1 == h1 and s.h2 == h2):
                return s
            i += 1
            if i == self.slots:
                i = 0

    cdef int put_records(self, const unsigned char *p, Py_ssize_t n, int32_t count,
                         int64_t base_offset) noexcept nogil:
        cdef Rec r
        cdef Py_ssize_t pos = 0
        cdef int32_t i
        cdef uint64_t h[2]
        cdef Slot *s
        cdef int64_t off
        for i in range(count):
            pos = next_record(p, pos, n, &r)
            if pos < 0:
                return -1
            if r.key < 0:
                continue
            if self.size >= self.max_entries:
                return -2
            hash128(p + r.key, r.key_len, h)
            s = self.find(h[0], h[1])
            off = base_offset + r.offset_delta
            if s.offset_plus_one == 0:
                s.h1 = h[0]
                s.h2 = h[1]
                self.size += 1
            s.offset_plus_one = off + 1
            if off > self.latest_offset:
                self.latest_offset = off
        return 0

    def put_section(self, raw, int32_t count, int64_t base_offset):
        """Add the keyed records of one uncompressed records section. The caller checks
        ``room`` >= count first; ValueError if the section is malformed, OverflowError if
        the map filled up anyway."""
        cdef Py_buffer view
        cdef int rc
        PyObject_GetBuffer(raw, &view, PyBUF_SIMPLE)
        try:
            with nogil:
                rc = self.put_records(<const unsigned char *>view.buf, view.len, count, base_offset)
        finally:
            PyBuffer_Release(&view)
        if rc == -1:
            raise ValueError("malformed records section")
        if rc == -2:
            raise OverflowError("offset map is full")

    def mark(self, int64_t offset):
        """Raise ``latest_offset`` to ``offset`` (a batch without keyed records was mapped)."""
        if offset > self.latest_offset:
            self.latest_offset = offset

    def get(self, key):
        """Latest offset mapped for ``key``, or -1."""
        cdef Py_buffer view
        cdef uint64_t h[2]
        PyObject_GetBuffer(key, &view, PyBUF_SIMPLE)
        try:
            hash128(<const unsigned char *>view.buf, view.len, h)
        finally:
            PyBuffer_Release(&view)
        return self.find(h[0], h[1]).offset_plus_one - 1


# ---------------------------------------------------------------- filtering

cdef int64_t filter_records(OffsetMap m, const unsigned char *p, Py_ssize_t n, int32_t count,
                            int64_t base_offset, int64_t base_ts, bint retain_tombstones,
                            int64_t new_base_ts, unsigned char *out, int64_t *stats) noexcept nogil:
    # Writes the surviving records to out; returns bytes written or -1 if malformed.
    # stats: [kept, tombstones kept, max timestamp kept]
    cdef Rec r
    cdef Py_ssize_t pos = 0, w = 0, body_len
    cdef int32_t i
    cdef uint64_t h[2]
    cdef int64_t off, found, ts
    cdef Slot *s
    stats[0] = 0
    stats[1] = 0
    stats[2] = -1
    for i in range(count):
        pos = next_record(p, pos, n, &r)
        if pos < 0:
            return -1
        if r.key < 0:
            continue            # a keyless record has no place in a compacted log
        off = base_offset + r.offset_delta
        hash128(p + r.key, r.key_len, h)
        s = m.find(h[0], h[1])
        found = s.offset_plus_one - 1
        if found >= 0 and off < found:
            continue            # superseded by a later record with this key
        if r.tombstone and not retain_tombstones:
            continue
        ts = base_ts + r.ts_delta
        if ts > stats[2]:
            stats[2] = ts
        stats[0] += 1
        if r.tombstone:
            stats[1] += 1
        if new_base_ts == NO_REBASE:
            memcpy(out + w, p + r.start, <size_t>(r.end - r.start))
            w += r.end - r.start
        else:
            body_len = 1 + varlong_size(ts - new_base_ts) + (r.end - r.after_ts)
            w = write_varlong(<char *>out, w, body_len)
            out[w] = p[r.body]
            w += 1
            w = write_varlong(<char *>out, w, ts - new_base_ts)
            memcpy(out + w, p + r.after_ts, <size_t>(r.end - r.after_ts))
            w += r.end - r.after_ts
    if pos != n:
        return -1
    return w


def filter_section(OffsetMap m, raw, int32_t count, int64_t base_offset, int64_t base_timestamp,
                   bint retain_tombstones, int64_t new_base_timestamp=KEEP_BASE_TIMESTAMP):
    """Surviving records of an uncompressed records section (rules in the module doc).

    Returns (section bytes, kept, tombstones kept, max timestamp of the kept records or -1).
    ``new_base_timestamp`` other than KEEP_BASE_TIMESTAMP rewrites every kept record's
    timestampDelta against it; ValueError if the section is malformed."""
    cdef Py_buffer view
    cdef unsigned char *out
    cdef int64_t w
    cdef int64_t stats[3]
    cdef Py_ssize_t cap
    PyObject_GetBuffer(raw, &view, PyBUF_SIMPLE)
    try:
        # A rewritten timestampDelta (<= 10 bytes) and length (<= 5) may each grow.
        cap = view.len + <Py_ssize_t>count * 16 + 16
        out = <unsigned char *>malloc(<size_t>cap)
        if out == NULL:
            raise MemoryError()
        try:
            with nogil:
                w = filter_records(m, <const unsigned char *>view.buf, view.len, count, base_offset,
                                   base_timestamp, retain_tombstones, new_base_timestamp, out, stats)
            if w < 0:
                raise ValueError("malformed records section")
            return (PyBytes_FromStringAndSize(<const char *>out, w), stats[0], stats[1], stats[2])
        finally:
            free(out)
    finally:
        PyBuffer_Release(&view)


def finish_batch(header, section, int32_t count, int attributes, int64_t base_timestamp,
                 int64_t max_timestamp):
    """A batch from the first 61 bytes of the original (``header``: offsets, epoch, producer
    fields and lastOffsetDelta are kept) and a new, possibly compressed, records ``section``,
    with recordsCount, attributes, timestamps, length and CRC set anew."""
    cdef Py_buffer hv, sv
    cdef bytes result
    cdef char *out
    cdef Py_ssize_t total
    PyObject_GetBuffer(header, &hv, PyBUF_SIMPLE)
    try:
        if hv.len < HEADER_SIZE:
            raise ValueError("header shorter than 61 bytes")
        PyObject_GetBuffer(section, &sv, PyBUF_SIMPLE)
        try:
            total = HEADER_SIZE + sv.len
            result = PyBytes_FromStringAndSize(NULL, total)
            out = PyBytes_AS_STRING(result)
            with nogil:
                memcpy(out, hv.buf, HEADER_SIZE)
                memcpy(out + HEADER_SIZE, sv.buf, <size_t>sv.len)
                store_be32(out + OFF_LENGTH, <uint32_t>(total - LOG_OVERHEAD))
                store_be16(out + OFF_ATTRIBUTES, <uint16_t>attributes)
                store_be64(out + OFF_BASE_TIMESTAMP, <uint64_t>base_timestamp)
                store_be64(out + OFF_MAX_TIMESTAMP, <uint64_t>max_timestamp)
                store_be32(out + OFF_RECORDS_COUNT, <uint32_t>count)
                store_be32(out + OFF_CRC, batch_crc(out, total))
        finally:
            PyBuffer_Release(&sv)
    finally:
        PyBuffer_Release(&hv)
    return result
