# distutils: libraries = lz4 zstd z
"""Validation of compressed records sections by streaming decompression.

``check_section`` decodes a compressed records section (codec 1 gzip, 3 lz4, 4 zstd) chunk by
chunk into a small reused window and walks the records as each chunk arrives, without the GIL:
the decompressed batch is never written out whole, so the walk reads bytes still in cache and no
batch-sized buffer is faulted in. It answers exactly what "decompress (capped), then
walk_records_keyed" answers: a decoder error or output past the cap wins over a record error (the
rest of the section is still decoded to find out), trailing bytes after the last record are a
record error.

lz4: the frame format as Kafka's clients write it (independent blocks of at most 256 KiB). Like
Kafka's reader (Lz4BlockInputStream) the header checksum and block checksums are verified and the
content checksum is not (the batch's CRC-32C already covers every byte). Linked blocks, dictionary
ids, bigger blocks or anything that is not an lz4 frame answer UNSUPPORTED, and the caller takes the
general path (kbroker.record.compression), which gives its usual verdict.
zstd: ZSTD_decompressStream with a reused context; frames whose window exceeds 2^WINDOW_LOG_MAX
also answer UNSUPPORTED (their decoder state would be that large).
gzip: zlib inflate, gzip or zlib headers, concatenated members.
snappy is not handled here (its blocks state their sizes; the general path refuses a bomb before
decoding).
"""
cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from libc.stdint cimport INT64_MIN, int32_t, int64_t, uint32_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memmove, memset

from varint cimport read_varint, read_varlong

from kbroker import switches


cdef extern from "lz4.h" nogil:
    int LZ4_decompress_safe(const char *src, char *dst, int compressedSize, int dstCapacity)

cdef extern from "zstd.h" nogil:
    ctypedef struct ZSTD_inBuffer:
        const void *src
        size_t size
        size_t pos
    ctypedef struct ZSTD_outBuffer:
        void *dst
        size_t size
        size_t pos
    ctypedef enum ZSTD_ResetDirective:
        ZSTD_reset_session_only
    ctypedef enum ZSTD_dParameter:
        ZSTD_d_windowLogMax
    ZSTD_DCtx *ZSTD_createDCtx()
    size_t ZSTD_freeDCtx(ZSTD_DCtx *dctx)
    size_t ZSTD_DCtx_reset(ZSTD_DCtx *dctx, ZSTD_ResetDirective reset)
    size_t ZSTD_DCtx_setParameter(ZSTD_DCtx *dctx, ZSTD_dParameter param, int value)
    size_t ZSTD_decompressStream(ZSTD_DCtx *dctx, ZSTD_outBuffer *output, ZSTD_inBuffer *input)
    unsigned ZSTD_isError(size_t code)
    size_t ZSTD_sizeof_DCtx(const ZSTD_DCtx *dctx)

cdef extern from "zstd_errors.h" nogil:
    ctypedef enum ZSTD_ErrorCode:
        ZSTD_error_frameParameter_windowTooLarge
    ZSTD_ErrorCode ZSTD_getErrorCode(size_t functionResult)

from czlib cimport *


# Outcomes of check_section (mirrored in codec.pyi and used by batch.check_compressed).
cdef enum:
    SECTION_OK = 0
    SECTION_BAD_RECORDS = 1      # count, lengths or offset deltas disagree with the header
    SECTION_NULL_KEY = 2         # a record without a key (compacted topics)
    SECTION_CORRUPT = 3          # the codec refused the bytes
    SECTION_OVER_CAP = 4         # the output would exceed the cap
    SECTION_UNSUPPORTED = 5      # not handled here: use the general path

OK = SECTION_OK
BAD_RECORDS = SECTION_BAD_RECORDS
NULL_KEY = SECTION_NULL_KEY
CORRUPT = SECTION_CORRUPT
OVER_CAP = SECTION_OVER_CAP
UNSUPPORTED = SECTION_UNSUPPORTED

# Room before the window for the unread tail of a chunk (a varint cut by a chunk boundary).
cdef enum:
    CARRY = 16
# The decode window: lz4 decodes one block at a time into it (so blocks up to this size), zstd and
# gzip fill CHUNK bytes at a time. Small enough to stay in L2 while the walk reads it.
cdef enum:
    WINDOW = 256 * 1024
cdef enum:
    CHUNK = 64 * 1024
# zstd frames may ask for a window up to 2^27 by default; one above 2^WINDOW_LOG_MAX goes to the
# general path (bounded by the cap) instead of growing a pooled context that large.
cdef enum:
    WINDOW_LOG_MAX = 24
# A pooled zstd context bigger than this after a call is freed (its buffers follow the frames' windows).
cdef enum:
    DCTX_KEEP = 12 * 1024 * 1024
cdef enum:
    POOL_KEEP = 16

# walk_stream: the decoder failed (its status says how)
cdef enum:
    DECODER_FAILED = -9


cdef inline uint32_t le32(const unsigned char *p) noexcept nogil:
    return <uint32_t>p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24)


cdef inline uint32_t rotl32(uint32_t x, int r) noexcept nogil:
    return (x << r) | (x >> (32 - r))


cdef uint32_t xxh32(const unsigned char *p, Py_ssize_t n, uint32_t seed) noexcept nogil:
    # XXH32 (the lz4 frame format's header and block checksums), from its public specification.
    cdef uint32_t P1 = 2654435761U, P2 = 2246822519U, P3 = 3266489917U
    cdef uint32_t P4 = 668265263U, P5 = 374761393U
    cdef const unsigned char *end = p + n
    cdef uint32_t v1, v2, v3, v4, h
    if n >= 16:
        v1 = seed + P1 + P2
        v2 = seed + P2
        v3 = seed
        v4 = seed - P1
        while end - p >= 16:
            v1 = rotl32(v1 + le32(p) * P2, 13) * P1
            v2 = rotl32(v2 + le32(p + 4) * P2, 13) * P1
            v3 = rotl32(v3 + le32(p + 8) * P2, 13) * P1
            v4 = rotl32(v4 + le32(p + 12) * P2, 13) * P1
            p += 16
        h = rotl32(v1, 1) + rotl32(v2, 7) + rotl32(v3, 12) + rotl32(v4, 18)
    else:
        h = seed + P5
    h += <uint32_t>n
    while end - p >= 4:
        h = rotl32(h + le32(p) * P3, 17) * P4
        p += 4
    while p < end:
        h = rotl32(h + p[0] * P5, 11) * P1
        p += 1
    h ^= h >> 15
    h *= P2
    h ^= h >> 13
    h *= P3
    h ^= h >> 16
    return h


def xxh32_digest(data, uint32_t seed=0):
    """XXH32 of a buffer (exposed for tests)."""
    cdef const unsigned char[::1] v = memoryview(data).cast("B")
    return xxh32(&v[0] if v.shape[0] else NULL, v.shape[0], seed)


# ---------------------------------------------------------------- decoders

cdef struct Decoder:
    int codec
    int status                  # SECTION_* once it failed
    const unsigned char *src
    Py_ssize_t n
    Py_ssize_t pos
    int64_t produced
    int64_t cap
    # lz4
    bint in_frame
    int flg
    Py_ssize_t block_max
    # zstd
    ZSTD_DCtx *dctx
    size_t zret                 # last ZSTD_decompressStream result: 0 = at a frame boundary
    # gzip
    z_stream zs
    bint zs_open
    bint zs_done


cdef inline Py_ssize_t fail(Decoder *d, int status) noexcept nogil:
    d.status = status
    return -1


cdef inline Py_ssize_t count_out(Decoder *d, Py_ssize_t got) noexcept nogil:
    d.produced += got
    if d.produced > d.cap:
        return fail(d, SECTION_OVER_CAP)
    return got


cdef Py_ssize_t lz4_fill(Decoder *d, unsigned char *dst) noexcept nogil:
    # The next block's bytes into dst (at most WINDOW): > 0 bytes, 0 at the end, -1 failed.
    cdef const unsigned char *s = d.src
    cdef Py_ssize_t hlen, raw, extra
    cdef uint32_t size
    cdef int flg, bd, out
    while True:
        if not d.in_frame:
            if d.pos == d.n:
                return 0 if d.n else fail(d, SECTION_CORRUPT)     # no frame at all
            if d.n - d.pos < 7 or le32(s + d.pos) != 0x184D2204:
                return fail(d, SECTION_UNSUPPORTED)          # skippable/legacy frames, garbage
            flg = s[d.pos + 4]
            bd = s[d.pos + 5]
            # version 01, independent blocks, no dictionary id, reserved bits clear
            if (flg & 0xC0) != 0x40 or not (flg & 0x20) or (flg & 0x03) or (bd & 0x8F):
                return fail(d, SECTION_UNSUPPORTED)
            d.block_max = 1 << (8 + 2 * ((bd >> 4) & 7))    # 4: 64 KiB .. 7: 4 MiB
            if d.block_max < (64 << 10) or d.block_max > WINDOW:
                return fail(d, SECTION_UNSUPPORTED)
            hlen = 2 + (8 if flg & 0x08 else 0)
            if d.n - d.pos < 4 + hlen + 1:
                return fail(d, SECTION_CORRUPT)
            if ((xxh32(s + d.pos + 4, hlen, 0) >> 8) & 0xFF) != s[d.pos + 4 + hlen]:
                return fail(d, SECTION_CORRUPT)
            d.flg = flg
            d.pos += 4 + hlen + 1
            d.in_frame = True
        if d.n - d.pos < 4:
            return fail(d, SECTION_CORRUPT)
        size = le32(s + d.pos)
        d.pos += 4
        if size == 0:                                       # end mark
            if d.flg & 0x04:                                # content checksum: not verified (as Kafka)
                if d.n - d.pos < 4:
                    return fail(d, SECTION_CORRUPT)
                d.pos += 4
            d.in_frame = False
            continue
        raw = size & 0x7FFFFFFF
        extra = 4 if d.flg & 0x10 else 0
        if raw > d.block_max or raw + extra > d.n - d.pos:
            return fail(d, SECTION_CORRUPT)
        if extra and xxh32(s + d.pos, raw, 0) != le32(s + d.pos + raw):
            return fail(d, SECTION_CORRUPT)
        if size >> 31:                                      # stored uncompressed
            memcpy(dst, s + d.pos, raw)
            out = <int>raw
        else:
            out = LZ4_decompress_safe(<const char *>(s + d.pos), <char *>dst, <int>raw,
                                      <int>d.block_max)
            if out < 0:
                return fail(d, SECTION_CORRUPT)
        d.pos += raw + extra
        if out > 0:
            return count_out(d, out)


cdef Py_ssize_t zstd_fill(Decoder *d, unsigned char *dst) noexcept nogil:
    cdef ZSTD_inBuffer inb
    cdef ZSTD_outBuffer outb
    cdef size_t r
    inb.src = d.src
    inb.size = <size_t>d.n
    inb.pos = <size_t>d.pos
    outb.dst = dst
    outb.size = CHUNK
    outb.pos = 0
    while outb.pos == 0:
        if inb.pos == inb.size:
            if d.zret != 0 or d.n == 0:             # input ended inside a frame, or no frame at all
                return fail(d, SECTION_CORRUPT)
            return 0
        r = ZSTD_decompressStream(d.dctx, &outb, &inb)
        if ZSTD_isError(r):
            if ZSTD_getErrorCode(r) == ZSTD_error_frameParameter_windowTooLarge:
                return fail(d, SECTION_UNSUPPORTED)
            return fail(d, SECTION_CORRUPT)
        d.zret = r
        d.pos = <Py_ssize_t>inb.pos
    return count_out(d, <Py_ssize_t>outb.pos)


cdef Py_ssize_t gzip_fill(Decoder *d, unsigned char *dst) noexcept nogil:
    cdef int rc
    cdef Py_ssize_t got
    if d.zs_done:
        return 0
    d.zs.next_out = dst
    d.zs.avail_out = CHUNK
    while True:
        rc = inflate(&d.zs, Z_NO_FLUSH)
        got = CHUNK - d.zs.avail_out
        if rc == Z_STREAM_END:
            if d.zs.avail_in == 0:
                d.zs_done = True
                return count_out(d, got) if got else 0
            if inflateReset(&d.zs) != Z_OK:         # concatenated members are one valid stream
                return fail(d, SECTION_CORRUPT)
        elif rc == Z_OK or rc == Z_BUF_ERROR:
            if d.zs.avail_out == 0:
                return count_out(d, got)
            if d.zs.avail_in == 0:                  # truncated: hand over what came, fail next time
                if got:
                    return count_out(d, got)
                return fail(d, SECTION_CORRUPT)
        else:
            return fail(d, SECTION_CORRUPT)         # Z_DATA_ERROR, Z_NEED_DICT, Z_MEM_ERROR
        if d.zs.avail_out == 0:
            return count_out(d, got)


cdef inline Py_ssize_t fill(Decoder *d, unsigned char *dst) noexcept nogil:
    if d.codec == 3:
        return lz4_fill(d, dst)
    if d.codec == 4:
        return zstd_fill(d, dst)
    return gzip_fill(d, dst)


# ---------------------------------------------------------------- the record walk over chunks

cdef struct Stream:
    unsigned char *data         # the window; CARRY bytes before it hold a carried tail
    const unsigned char *p      # next unread byte
    const unsigned char *end    # end of the decoded bytes
    bint eof
    Decoder *d


cdef Py_ssize_t refill(Stream *s) noexcept nogil:
    # Move the unread tail (< CARRY bytes) in front of the window, decode the next chunk after it.
    cdef Py_ssize_t tail = s.end - s.p
    cdef Py_ssize_t got
    if s.eof:
        return 0
    memmove(s.data - tail, s.p, tail)
    s.p = s.data - tail
    s.end = s.data
    got = fill(s.d, s.data)
    if got < 0:
        return -1
    if got == 0:
        s.eof = True
    s.end = s.data + got
    return got


cdef inline Py_ssize_t ensure(Stream *s, Py_ssize_t k) noexcept nogil:
    # At least k (<= CARRY) contiguous bytes at s.p unless the stream ends first: the bytes there, -1 failed.
    while s.end - s.p < k:
        if s.eof:
            break
        if refill(s) < 0:
            return -1
    return s.end - s.p


cdef inline int skip(Stream *s, int64_t n) noexcept nogil:
    # 0, -1 the stream ended first, DECODER_FAILED
    cdef Py_ssize_t avail, got
    while True:
        avail = s.end - s.p
        if n <= avail:
            s.p += n
            return 0
        n -= avail
        s.p = s.end
        got = refill(s)
        if got < 0:
            return DECODER_FAILED
        if got == 0:
            return -1


cdef inline int take_varint(Stream *s, int64_t *rem, int32_t *out) noexcept nogil:
    # A zigzag varint inside the current record (rem bytes left): 0, -1 malformed, DECODER_FAILED.
    cdef Py_ssize_t avail = ensure(s, 5)
    cdef Py_ssize_t q
    if avail < 0:
        return DECODER_FAILED
    q = read_varint(s.p, 0, min(avail, rem[0]), out)
    if q < 0:
        return -1
    s.p += q
    rem[0] -= q
    return 0


cdef inline int skip_field(Stream *s, int64_t *rem, bint nullable) noexcept nogil:
    cdef int32_t n
    cdef int r = take_varint(s, rem, &n)
    if r != 0:
        return r
    if n < 0:
        return 0 if (n == -1 and nullable) else -1
    if n > rem[0]:
        return -1
    rem[0] -= n
    return skip(s, n)


cdef int walk_stream(Stream *s, int32_t count, bint need_keys, int64_t *max_delta) noexcept nogil:
    # walk_records_keyed (batch.pyx) over the decoded stream: 0, -1 bad records, -2 null key on a
    # compacted topic, DECODER_FAILED. max_delta: the largest timestampDelta seen.
    cdef int32_t i, h, length, offset_delta, nheaders, key_length
    cdef int64_t ts_delta, rem
    cdef Py_ssize_t avail, q
    cdef int r
    if count < 0:
        return -1
    for i in range(count):
        rem = 1 << 40                              # the length varint: bounded by the stream only
        r = take_varint(s, &rem, &length)
        if r != 0:
            return r
        if length < 1:
            return -1
        rem = length
        avail = ensure(s, 11)                      # attributes + the timestamp varlong
        if avail < 0:
            return DECODER_FAILED
        if avail < 1:
            return -1
        s.p += 1                                   # record attributes, unused
        rem -= 1
        avail -= 1
        q = read_varlong(s.p, 0, min(avail, rem), &ts_delta)
        if q < 0:
            return -1
        if ts_delta > max_delta[0]:
            max_delta[0] = ts_delta
        s.p += q
        rem -= q
        r = take_varint(s, &rem, &offset_delta)
        if r != 0:
            return r
        if offset_delta != i:
            return -1
        if need_keys:
            avail = ensure(s, 5)
            if avail < 0:
                return DECODER_FAILED
            if read_varint(s.p, 0, min(avail, rem), &key_length) > 0 and key_length < 0:
                return -2
        r = skip_field(s, &rem, True)              # key
        if r != 0:
            return r
        r = skip_field(s, &rem, True)              # value
        if r != 0:
            return r
        r = take_varint(s, &rem, &nheaders)
        if r != 0:
            return r
        if nheaders < 0:
            return -1
        for h in range(nheaders):
            r = skip_field(s, &rem, False)         # header key: never null
            if r != 0:
                return r
            r = skip_field(s, &rem, True)          # header value
            if r != 0:
                return r
        if rem != 0:
            return -1
    avail = ensure(s, 1)                           # nothing may follow the last record
    if avail < 0:
        return DECODER_FAILED
    return 0 if avail == 0 else -1


@cython.final
cdef class Workspace:
    """A decode window and a zstd context, reused across calls (pooled, one user at a time)."""

    def __cinit__(self):
        self.window = <unsigned char *>malloc(CARRY + WINDOW)
        if self.window == NULL:
            raise MemoryError()
        self.dctx = NULL

    def __dealloc__(self):
        free(self.window)
        if self.dctx != NULL:
            ZSTD_freeDCtx(self.dctx)

    cdef int prepare(self, int codec) except -1:
        if codec == 4 and self.dctx == NULL:
            self.dctx = ZSTD_createDCtx()
            if self.dctx == NULL:
                raise MemoryError()
            ZSTD_DCtx_setParameter(self.dctx, ZSTD_d_windowLogMax, WINDOW_LOG_MAX)
        return 0

    cdef void trim(self) noexcept:
        if self.dctx != NULL and ZSTD_sizeof_DCtx(self.dctx) > DCTX_KEEP:
            ZSTD_freeDCtx(self.dctx)
            self.dctx = NULL


cdef int run(Workspace ws, int codec, const unsigned char *src, Py_ssize_t n, int32_t count,
             bint need_keys, int64_t cap, int64_t *max_delta) noexcept nogil:
    cdef Decoder d
    cdef Stream s
    cdef int r
    cdef Py_ssize_t got
    memset(&d, 0, sizeof(Decoder))
    d.codec = codec
    d.src = src
    d.n = n
    d.cap = cap
    if codec == 4:
        d.dctx = ws.dctx
        ZSTD_DCtx_reset(d.dctx, ZSTD_reset_session_only)
    elif codec == 1:
        if n > <Py_ssize_t>0xFFFFFFFFU or inflateInit2(&d.zs, 32 + 15) != Z_OK:  # 32: gzip or zlib header
            return SECTION_CORRUPT
        d.zs_open = True
        d.zs.next_in = src
        d.zs.avail_in = <unsigned int>n
    s.data = ws.window + CARRY
    s.p = s.data
    s.end = s.data
    s.eof = False
    s.d = &d
    r = walk_stream(&s, count, need_keys, max_delta)
    if r == 0:
        r = SECTION_OK
    elif r == DECODER_FAILED:
        r = d.status
    else:
        # A record error, unless the rest of the section does not decode (or passes the cap):
        # decompress-then-walk would have failed on that first.
        while True:
            got = fill(&d, s.data)
            if got <= 0:
                break
        r = d.status if got < 0 else (SECTION_NULL_KEY if r == -2 else SECTION_BAD_RECORDS)
    if d.zs_open:
        inflateEnd(&d.zs)
    return r


_pool = []

# KBROKER_CODEC_STREAMING=0 sends every section to the general path (side-by-side measurement:
# kbroker.perf.attack_bench validation-cost); set_streaming changes it in this process.
cdef bint _streaming = switches.current.codec_streaming


def set_streaming(bint on):
    """Enable or disable check_section (disabled, it answers UNSUPPORTED); returns the old setting."""
    global _streaming
    old = _streaming
    _streaming = on
    return old


def check_section(body, int codec, int32_t count, bint compacted, int64_t max_decompressed):
    """Decode the compressed records section ``body`` (codec 1 gzip, 3 lz4, 4 zstd) and walk its
    records against the header's ``count`` (and, ``compacted``, require keys), never producing more
    than ``max_decompressed`` bytes. Returns OK, BAD_RECORDS, NULL_KEY, CORRUPT, OVER_CAP or
    UNSUPPORTED (use the general path). The work runs without the GIL."""
    return check_section_ts(body, codec, count, compacted, max_decompressed)[0]


def check_section_ts(body, int codec, int32_t count, bint compacted, int64_t max_decompressed):
    """check_section, and the largest timestampDelta of the records walked: (outcome, delta).
    The delta is meaningful when the outcome is OK (the leader sets the batch's maxTimestamp
    from it)."""
    cdef Py_buffer view
    cdef Workspace ws
    cdef int r
    cdef int64_t max_delta = INT64_MIN
    if not _streaming or (codec != 1 and codec != 3 and codec != 4):
        return SECTION_UNSUPPORTED, max_delta
    ws = _pool.pop() if _pool else Workspace()
    try:
        ws.prepare(codec)
        PyObject_GetBuffer(body, &view, PyBUF_SIMPLE)
        try:
            with nogil:
                r = run(ws, codec, <const unsigned char *>view.buf, view.len, count, compacted,
                        max_decompressed, &max_delta)
        finally:
            PyBuffer_Release(&view)
        ws.trim()
    finally:
        if len(_pool) < POOL_KEEP:
            _pool.append(ws)
    return r, max_delta
