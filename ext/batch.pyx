# distutils: libraries = z
"""RecordBatch v2 (magic 2): leader-side validate-and-stamp, reading, building.

Wire == disk. The 61-byte header is defined once, in layout.pxd; then come the
records (one compressed blob when attributes & 7 != 0). Record:
  length varint | attributes i8 | timestampDelta varlong | offsetDelta varint |
  keyLen varint (-1 = null) key | valueLen varint (-1 = null) value |
  headerCount varint | [keyLen varint, key utf8, valueLen varint, value]*
All varints are zigzag (protobuf sint32/sint64).

baseOffset and partitionLeaderEpoch sit outside the CRC, so the broker stamps
them in place without touching the checksum; only LogAppendTime (attributes
bit 3 and maxTimestamp, both covered) or a maxTimestamp that disagrees with the
records (set from them, as Kafka's LogValidator does) forces a CRC recomputation.

All byte work runs in `nogil` C-level helpers; Python objects are created
per batch, except in decode_* which by definition returns per-record tuples.
"""
cimport cython
from cpython.buffer cimport (PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release,
                             PyObject_GetBuffer)
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from libc.stdint cimport INT64_MIN, int16_t, int32_t, int64_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset

from ccrc32c cimport crc32c_update
from hton cimport load_be16, load_be32, load_be64, store_be16, store_be32, store_be64
from layout cimport *
from varint cimport read_varint, read_varlong, varlong_size, write_varlong

import mmap as _mmap
import time


from czlib cimport *

from errors cimport (ERR_CORRUPT_MESSAGE, ERR_INVALID_RECORD, ERR_INVALID_TIMESTAMP, ERR_MESSAGE_TOO_LARGE,
                     ERR_UNSUPPORTED_COMPRESSION_TYPE, ERR_UNSUPPORTED_FOR_MESSAGE_FORMAT)


# Below this many bytes the GIL round trip costs more than the byte work.
cdef Py_ssize_t NOGIL_BYTES = 4096

# Largest zigzag varint / varlong encodings.
cdef int MAX_VARINT = 5
cdef int MAX_VARLONG = 10

cdef object _compression = None
cdef object _codec = None

# The header layout for Python code (kbroker.record, kbroker.log, tests): read these instead of
# restating the numbers.
LAYOUT = {
    "LOG_OVERHEAD": LOG_OVERHEAD, "HEADER_SIZE": HEADER_SIZE, "CRC_START": CRC_START,
    "OFF_BASE_OFFSET": OFF_BASE_OFFSET, "OFF_LENGTH": OFF_LENGTH,
    "OFF_LEADER_EPOCH": OFF_LEADER_EPOCH, "OFF_MAGIC": OFF_MAGIC, "OFF_CRC": OFF_CRC,
    "OFF_ATTRIBUTES": OFF_ATTRIBUTES, "OFF_LAST_OFFSET_DELTA": OFF_LAST_OFFSET_DELTA,
    "OFF_BASE_TIMESTAMP": OFF_BASE_TIMESTAMP, "OFF_MAX_TIMESTAMP": OFF_MAX_TIMESTAMP,
    "OFF_PRODUCER_ID": OFF_PRODUCER_ID, "OFF_PRODUCER_EPOCH": OFF_PRODUCER_EPOCH,
    "OFF_BASE_SEQUENCE": OFF_BASE_SEQUENCE, "OFF_RECORDS_COUNT": OFF_RECORDS_COUNT,
    "ATTR_CODEC_MASK": ATTR_CODEC_MASK, "ATTR_LOG_APPEND_TIME": ATTR_LOG_APPEND_TIME,
    "ATTR_TRANSACTIONAL": ATTR_TRANSACTIONAL, "ATTR_CONTROL": ATTR_CONTROL,
    "ATTR_DELETE_HORIZON": ATTR_DELETE_HORIZON,
}


class BatchError(Exception):
    """A batch broke Kafka's rules; ``error_code`` is the Kafka error code
    the Produce response should carry."""

    def __init__(self, error_code, message):
        super().__init__(message)
        self.error_code = error_code

    def __reduce__(self):
        return (type(self), (self.error_code, self.args[0]))


# ---------------------------------------------------------------- varints

# Skip a length-prefixed field; a -1 length (null) is allowed when nullable.
cdef inline Py_ssize_t skip_field(const unsigned char *p, Py_ssize_t pos, Py_ssize_t end,
                                  bint nullable) noexcept nogil:
    cdef int32_t n
    pos = read_varint(p, pos, end, &n)
    if pos < 0:
        return -1
    if n < 0:
        return pos if (n == -1 and nullable) else -1
    if n > end - pos:
        return -1
    return pos + n


cdef int walk_records(const unsigned char *p, Py_ssize_t pos, Py_ssize_t end,
                      int32_t count) noexcept nogil:
    cdef int64_t max_delta = INT64_MIN
    return walk_records_keyed(p, pos, end, count, False, &max_delta)


# walk_records, plus (need_keys) -2 when a record has a null key: a compacted
# topic cannot accept one (Kafka's LogValidator answers INVALID_RECORD); max_delta[0]
# is raised to the largest timestampDelta walked.
cdef int walk_records_keyed(const unsigned char *p, Py_ssize_t pos, Py_ssize_t end,
                            int32_t count, bint need_keys, int64_t *max_delta) noexcept nogil:
    cdef int32_t i, h, length, offset_delta, nheaders, key_length
    cdef int64_t ts_delta
    cdef Py_ssize_t rec_end
    # Each record takes at least 7 bytes: a lying recordsCount fails here, before any loop.
    if count < 0 or <int64_t>count * 7 > end - pos:
        return -1
    for i in range(count):
        pos = read_varint(p, pos, end, &length)
        if pos < 0 or length < 1 or length > end - pos:
            return -1
        rec_end = pos + length
        pos += 1  # record attributes, unused
        pos = read_varlong(p, pos, rec_end, &ts_delta)
        if pos < 0:
            return -1
        if ts_delta > max_delta[0]:
            max_delta[0] = ts_delta
        pos = read_varint(p, pos, rec_end, &offset_delta)
        if pos < 0 or offset_delta != i:
            return -1
        if need_keys and read_varint(p, pos, rec_end, &key_length) > 0 and key_length < 0:
            return -2
        pos = skip_field(p, pos, rec_end, True)    # key
        if pos < 0:
            return -1
        pos = skip_field(p, pos, rec_end, True)    # value
        if pos < 0:
            return -1
        pos = read_varint(p, pos, rec_end, &nheaders)
        if pos < 0 or nheaders < 0:
            return -1
        for h in range(nheaders):
            pos = skip_field(p, pos, rec_end, False)  # header key: never null
            if pos < 0:
                return -1
            pos = skip_field(p, pos, rec_end, True)   # header value
            if pos < 0:
                return -1
        if pos != rec_end:
            return -1
    return 0 if pos == end else -1


# ---------------------------------------------------------------- header

@cython.final
@cython.freelist(64)
cdef class BatchInfo:
    """Header fields of one batch (declared in batch.pxd); ``position`` is its byte offset in
    the buffer or segment file it was read from (0 for validate_and_stamp)."""

    def __cinit__(self):
        pass

    def __init__(self):
        raise TypeError("BatchInfo is created by kbroker._native.batch")

    @property
    def codec(self):
        return self.attributes & ATTR_CODEC_MASK

    @property
    def timestamp_type(self):
        return 1 if self.attributes & ATTR_LOG_APPEND_TIME else 0

    @property
    def is_transactional(self):
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def is_control(self):
        return bool(self.attributes & ATTR_CONTROL)

    @property
    def last_offset(self):
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self):
        return self.base_offset + self.last_offset_delta + 1

    def __repr__(self):
        return (f"BatchInfo(position={self.position}, size={self.size}, "
                f"base_offset={self.base_offset}, last_offset_delta={self.last_offset_delta}, "
                f"record_count={self.record_count}, codec={self.codec}, "
                f"first_timestamp={self.first_timestamp}, max_timestamp={self.max_timestamp}, "
                f"producer_id={self.producer_id}, producer_epoch={self.producer_epoch}, "
                f"base_sequence={self.base_sequence}, attributes={self.attributes:#x}, "
                f"partition_leader_epoch={self.partition_leader_epoch})")


cdef BatchInfo parse_header(const char *buf, Py_ssize_t position):
    cdef BatchInfo info = BatchInfo.__new__(BatchInfo)
    info.position = position
    info.base_offset = batch_base_offset(buf)
    info.size = <Py_ssize_t>batch_size(buf)
    info.partition_leader_epoch = batch_leader_epoch(buf)
    info.magic = batch_magic(buf)
    info.crc = batch_stored_crc(buf)
    info.attributes = <uint16_t>batch_attributes(buf)
    info.last_offset_delta = batch_last_offset_delta(buf)
    info.first_timestamp = batch_base_timestamp(buf)
    info.max_timestamp = batch_max_timestamp(buf)
    info.producer_id = batch_producer_id(buf)
    info.producer_epoch = batch_producer_epoch(buf)
    info.base_sequence = batch_base_sequence(buf)
    info.record_count = batch_records_count(buf)
    return info



# ---------------------------------------------------------------- leader append

# Outcome codes of check_and_stamp; messages live on the Python side.
cdef enum Verdict:
    OK = 0
    TOO_SHORT
    BAD_MAGIC
    BAD_LENGTH
    TRAILING
    TOO_LARGE
    BAD_CRC
    NONZERO_BASE
    BAD_COUNT
    CONTROL
    NO_SEQUENCE
    APPEND_TIME_SET
    BAD_CODEC
    BAD_RECORDS
    NULL_KEY

_VERDICTS = {
    TOO_SHORT: (ERR_CORRUPT_MESSAGE, "buffer shorter than a batch header"),
    BAD_MAGIC: (ERR_UNSUPPORTED_FOR_MESSAGE_FORMAT, "only magic 2 record batches are accepted"),
    BAD_LENGTH: (ERR_CORRUPT_MESSAGE, "batchLength is outside [49, buffer size - 12]"),
    TRAILING: (ERR_INVALID_RECORD, "a produce request must carry exactly one batch per partition"),
    TOO_LARGE: (ERR_MESSAGE_TOO_LARGE, "batch is larger than max.message.bytes"),
    BAD_CRC: (ERR_CORRUPT_MESSAGE, "CRC-32C mismatch"),
    NONZERO_BASE: (ERR_INVALID_RECORD, "producer batches must have baseOffset 0"),
    BAD_COUNT: (ERR_INVALID_RECORD, "recordsCount must be > 0 and equal lastOffsetDelta + 1"),
    CONTROL: (ERR_INVALID_RECORD, "clients may not send control batches"),
    NO_SEQUENCE: (ERR_INVALID_RECORD, "an idempotent batch (producerId >= 0) needs baseSequence >= 0"),
    APPEND_TIME_SET: (ERR_INVALID_TIMESTAMP, "clients may not set the LogAppendTime attribute"),
    BAD_CODEC: (ERR_UNSUPPORTED_COMPRESSION_TYPE, "unknown compression codec"),
    BAD_RECORDS: (ERR_INVALID_RECORD, "records do not match the batch header "
                                      "(lengths, count or offsetDeltas 0..n-1)"),
    NULL_KEY: (ERR_INVALID_RECORD, "compacted topic cannot accept a record without a key"),
}

# Cap on a compressed batch's decompressed records section when validating a
# produce: far above what a client's batch.size produces (a bomb is refused
# after at most this much output), and the most memory one validation takes.
DEFAULT_MAX_DECOMPRESSED = 64 * 1024 * 1024


cdef Verdict check_batch(char *buf, Py_ssize_t n, int64_t max_message_bytes,
                         bint compacted, int64_t *max_delta) noexcept nogil:
    # Everything but the contents of a compressed records section (checked by
    # the caller after decompressing it); max_delta as walk_records_keyed.
    cdef const unsigned char *p = <const unsigned char *>buf
    cdef int32_t batch_length, count, last_delta, base_sequence
    cdef int64_t size, producer_id
    cdef int attributes
    cdef uint32_t crc
    if n < OFF_MAGIC + 1:
        return TOO_SHORT
    # Magic before the size checks: legacy (v0/v1) message sets share the
    # first 17 bytes' layout and may be shorter than a v2 header.
    if buf[OFF_MAGIC] != 2:
        return BAD_MAGIC
    batch_length = <int32_t>load_be32(buf + OFF_LENGTH)
    size = <int64_t>batch_length + LOG_OVERHEAD
    if size < HEADER_SIZE or size > n:
        return BAD_LENGTH
    if size < n:
        return TRAILING
    if size > max_message_bytes:
        return TOO_LARGE
    if batch_crc(buf, <Py_ssize_t>size) != load_be32(buf + OFF_CRC):
        return BAD_CRC
    if load_be64(buf + OFF_BASE_OFFSET) != 0:
        return NONZERO_BASE
    attributes = load_be16(buf + OFF_ATTRIBUTES)
    count = <int32_t>load_be32(buf + OFF_RECORDS_COUNT)
    last_delta = <int32_t>load_be32(buf + OFF_LAST_OFFSET_DELTA)
    if count <= 0 or <int64_t>last_delta + 1 != count:
        return BAD_COUNT
    if attributes & ATTR_CONTROL:
        return CONTROL
    producer_id = <int64_t>load_be64(buf + OFF_PRODUCER_ID)
    base_sequence = <int32_t>load_be32(buf + OFF_BASE_SEQUENCE)
    if producer_id >= 0 and base_sequence < 0:
        return NO_SEQUENCE
    if attributes & ATTR_LOG_APPEND_TIME:
        return APPEND_TIME_SET
    if (attributes & ATTR_CODEC_MASK) > 4:
        return BAD_CODEC
    if (attributes & ATTR_CODEC_MASK) == 0:
        return check_records(p + HEADER_SIZE, <Py_ssize_t>size - HEADER_SIZE, count, compacted, max_delta)
    return OK


cdef Verdict check_records(const unsigned char *p, Py_ssize_t n, int32_t count,
                           bint compacted, int64_t *max_delta) noexcept nogil:
    cdef int r = walk_records_keyed(p, 0, n, count, compacted, max_delta)
    if r == -2:
        return NULL_KEY
    return OK if r == 0 else BAD_RECORDS


cdef void stamp(char *buf, Py_ssize_t size, int64_t base_offset, int32_t leader_epoch,
                int64_t log_append_time_ms) noexcept nogil:
    cdef int attributes = load_be16(buf + OFF_ATTRIBUTES)
    cdef uint32_t crc
    store_be64(buf + OFF_BASE_OFFSET, <uint64_t>base_offset)
    store_be32(buf + OFF_LEADER_EPOCH, <uint32_t>leader_epoch)
    if log_append_time_ms >= 0:
        store_be16(buf + OFF_ATTRIBUTES, <uint16_t>(attributes | ATTR_LOG_APPEND_TIME))
        store_be64(buf + OFF_MAX_TIMESTAMP, <uint64_t>log_append_time_ms)
        crc = batch_crc(buf, size)
        store_be32(buf + OFF_CRC, crc)


cdef inline void set_max_timestamp(char *buf, Py_ssize_t size, int64_t max_delta) noexcept nogil:
    # A checked CreateTime batch's maxTimestamp is its records' largest timestamp (firstTimestamp
    # + the largest timestampDelta), whatever the client wrote there (some write -1): the time
    # index, ListOffsets by time and time-based retention read it. Rewritten with the CRC only
    # when it differs. INT64_MIN: the records were not walked here (validate_batch did it).
    cdef int64_t want
    if max_delta == INT64_MIN:
        return
    want = batch_base_timestamp(buf) + max_delta
    if batch_max_timestamp(buf) != want:
        store_be64(buf + OFF_MAX_TIMESTAMP, <uint64_t>want)
        store_be32(buf + OFF_CRC, batch_crc(buf, size))


cdef object zstd_content_size(object view):
    # Frame_Content_Size of a zstd frame header (RFC 8878 3.1.1.1), 0 when absent or not a frame.
    if len(view) < 6 or int.from_bytes(view[:4], "little") != 0xFD2FB528:
        return 0
    fhd = view[4]
    single = (fhd >> 5) & 1
    size = (single, 2, 4, 8)[fhd >> 6]
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3]
    if size == 0 or pos + size > len(view):
        return 0
    value = int.from_bytes(view[pos:pos + size], "little")
    return value + 256 if size == 2 else value


cdef seed_scratch(int codec, object body, Py_ssize_t max_decompressed):
    # decompress_view grows this thread's scratch with bytearray(n), which zero-fills n bytes with
    # the GIL held: a bomb's 64 MiB held every other thread (the event loop) ~40 ms per batch.
    # When this batch may need more than the thread keeps, hand it a buffer of lazily zeroed
    # pages instead (an anonymous mmap: its pages are faulted in by the decompressor, GIL
    # released); decompress_view then finds it big enough and trim_scratch drops it afterwards.
    c = _compression
    limit = max_decompressed + 1
    view = memoryview(body).cast("B")
    if codec == 3:
        bound = c._lz4_bound(view)                  # a few header reads per 64 KiB block
        need = limit if bound is None else min(limit, max(bound, 1))
    elif codec == 4:
        # The first frame's stated content size only (walking every block header in Python, as
        # decompress_view does, would double a ~50 us cost per MiB); a frame without it, or later
        # frames adding past the keep limit, take the zero-filled path as before.
        need = min(limit, zstd_content_size(view))
    elif codec == 1:
        need = min(limit, int.from_bytes(view[-4:], "little") + 1) if len(view) >= 18 else 0
    else:
        return                      # snappy states its size and refuses past the cap first
    if need <= c.SCRATCH_KEEP:
        return
    have = c._scratch.buf
    if have is None or len(have) < need:
        c._scratch.buf = None       # the old buffer first: never both mapped
        c._scratch.buf = _mmap.mmap(-1, need)


cdef Verdict check_compressed(object body, int codec, int32_t count, bint compacted,
                              Py_ssize_t max_decompressed, int64_t *max_delta) except? BAD_RECORDS:
    # Like Kafka's LogValidator: decompress the records section (bounded by max_decompressed,
    # every codec without the GIL) and check its records against the header. Corrupt data or
    # output past the cap is CORRUPT_MESSAGE; records that contradict the header are INVALID_RECORD.
    # gzip/lz4/zstd stream through a small window (kbroker._native.codec, the produce path's
    # frames); snappy and frames that module leaves alone are decompressed whole into this
    # thread's reusable scratch buffer and walked.
    global _compression, _codec
    cdef Py_buffer raw
    cdef Verdict verdict
    cdef int outcome
    if _codec is None:
        from kbroker._native import codec as _n
        from kbroker.record import compression as _c
        _codec, _compression = _n, _c
    if codec != 2:
        outcome, delta = _codec.check_section_ts(body, codec, count, compacted, max_decompressed)
        if outcome == _codec.OK:
            max_delta[0] = delta
            return OK
        if outcome == _codec.BAD_RECORDS:
            return BAD_RECORDS
        if outcome == _codec.NULL_KEY:
            return NULL_KEY
        if outcome == _codec.OVER_CAP:
            raise BatchError(ERR_CORRUPT_MESSAGE,
                             f"records section expands past {max_decompressed} bytes")
        if outcome == _codec.CORRUPT:
            raise BatchError(ERR_CORRUPT_MESSAGE,
                             f"records section: corrupt {_compression.CODECS[codec]} data")
    seed_scratch(codec, body, max_decompressed)
    try:
        section = _compression.decompress_view(codec, body, max_decompressed)
    except _compression.DecompressionLimitExceeded:
        _compression.trim_scratch()
        raise BatchError(ERR_CORRUPT_MESSAGE,
                         f"records section expands past {max_decompressed} bytes") from None
    except _compression.CompressionError as e:
        _compression.trim_scratch()
        raise BatchError(ERR_CORRUPT_MESSAGE, f"records section: {e}") from None
    PyObject_GetBuffer(section, &raw, PyBUF_SIMPLE)
    try:
        with nogil:
            verdict = check_records(<const unsigned char *>raw.buf, raw.len, count, compacted, max_delta)
    finally:
        PyBuffer_Release(&raw)
        del section
        _compression.trim_scratch()
    return verdict


cdef Verdict check_all(char *p, Py_ssize_t n, object buf, int64_t max_message_bytes,
                       bint compacted, bint records, Py_ssize_t max_decompressed,
                       bint fix) except? BAD_RECORDS:
    # check_batch, then (records) the compressed records section. Reads only, unless ``fix``:
    # then a valid batch whose records were walked gets its maxTimestamp set from them.
    cdef Verdict verdict
    cdef int codec
    cdef int64_t max_delta = INT64_MIN
    if n >= NOGIL_BYTES:
        with nogil:
            verdict = check_batch(p, n, max_message_bytes, compacted, &max_delta)
    else:
        verdict = check_batch(p, n, max_message_bytes, compacted, &max_delta)
    codec = batch_attributes(p) & ATTR_CODEC_MASK if verdict == OK else 0
    if records and codec != 0:
        verdict = check_compressed(memoryview(buf)[HEADER_SIZE:n], codec, batch_records_count(p),
                                   compacted, max_decompressed, &max_delta)
    if fix and verdict == OK:
        if n >= NOGIL_BYTES:
            with nogil:
                set_max_timestamp(p, n, max_delta)
        else:
            set_max_timestamp(p, n, max_delta)
    return verdict


def validate_batch(buf, int64_t max_message_bytes, bint compacted=False,
                   Py_ssize_t max_decompressed=DEFAULT_MAX_DECOMPRESSED):
    """Every check validate_and_stamp makes, record level included (a compressed section is
    decompressed, at most ``max_decompressed`` bytes, and walked), without stamping. The one
    write: when ``buf`` is writable, a valid batch's maxTimestamp is set from its records (and
    the CRC rewritten) if it differs, as validate_and_stamp would, so that a later
    ``prevalidated`` append, which does not walk the records again, stores it right. Safe on
    any thread (nothing but ``buf`` is touched); the byte work runs without the GIL. Returns
    None; raises BatchError with the same codes as validate_and_stamp."""
    cdef Py_buffer view
    cdef Verdict verdict
    cdef bint writable = True
    try:
        PyObject_GetBuffer(buf, &view, PyBUF_WRITABLE)
    except BufferError:
        writable = False
        PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        verdict = check_all(<char *>view.buf, view.len, buf, max_message_bytes, compacted, True,
                            max_decompressed, writable)
        if verdict != OK:
            code, message = _VERDICTS[verdict]
            raise BatchError(code, message)
    finally:
        PyBuffer_Release(&view)


cdef int check_for_append(char *p, Py_ssize_t n, object buf, int64_t max_message_bytes,
                          bint compacted, bint prevalidated) except -1:
    # validate_and_stamp's checks, for native appenders (segment.append_leader): raises
    # BatchError with the same codes and messages.
    cdef Verdict verdict = check_all(p, n, buf, max_message_bytes, compacted, not prevalidated,
                                     DEFAULT_MAX_DECOMPRESSED, True)
    if verdict != OK:
        code, message = _VERDICTS[verdict]
        raise BatchError(code, message)
    return 0


def validate_and_stamp(buf, int64_t base_offset, int32_t leader_epoch,
                       int64_t max_message_bytes, int64_t log_append_time_ms,
                       bint compacted=False, Py_ssize_t max_decompressed=DEFAULT_MAX_DECOMPRESSED,
                       bint prevalidated=False):
    """Validate the one producer batch filling the writable buffer ``buf`` and
    stamp baseOffset / partitionLeaderEpoch in place (plus LogAppendTime:
    attributes bit 3, maxTimestamp and the CRC when log_append_time_ms >= 0; else
    maxTimestamp from the records, and the CRC, when the header disagrees with them).
    A compressed records section is decompressed (at most ``max_decompressed``
    bytes) and its records checked like an uncompressed one, unless
    ``prevalidated`` (validate_batch already did that, e.g. on an executor
    thread); header and CRC checks always run. ``compacted`` also requires every
    record to have a key. Nothing is stamped unless the batch is valid. Returns
    the stamped header as a BatchInfo; raises BatchError."""
    cdef Py_buffer view
    cdef Verdict verdict
    cdef char *p
    cdef Py_ssize_t n
    PyObject_GetBuffer(buf, &view, PyBUF_WRITABLE)
    try:
        p = <char *>view.buf
        n = view.len
        verdict = check_all(p, n, buf, max_message_bytes, compacted, not prevalidated,
                            max_decompressed, True)
        if verdict != OK:
            code, message = _VERDICTS[verdict]
            raise BatchError(code, message)
        if n >= NOGIL_BYTES:
            with nogil:
                stamp(p, n, base_offset, leader_epoch, log_append_time_ms)
        else:
            stamp(p, n, base_offset, leader_epoch, log_append_time_ms)
        return parse_header(p, 0)
    finally:
        PyBuffer_Release(&view)


# ---------------------------------------------------------------- gzip

# inflate_bounded outcomes.
cdef enum:
    INFLATE_DONE = 0
    INFLATE_CORRUPT = 1
    INFLATE_TRUNCATED = 2
    INFLATE_FULL = 3


cdef Py_ssize_t inflate_bounded(const unsigned char *src, Py_ssize_t n, unsigned char *dst,
                                Py_ssize_t cap, int *err) noexcept nogil:
    # Inflate the gzip (or zlib) members back to back in src[0:n] into dst[0:cap]; returns the
    # bytes written and sets err to an INFLATE_* outcome (FULL: dst filled before the end).
    cdef z_stream zs
    cdef int rc
    cdef Py_ssize_t produced = 0
    memset(&zs, 0, sizeof(z_stream))
    if n > <Py_ssize_t>0xFFFFFFFFU or inflateInit2(&zs, 32 + 15) != Z_OK:    # 32: gzip or zlib header
        err[0] = INFLATE_CORRUPT
        return 0
    zs.next_in = src
    zs.avail_in = <unsigned int>n
    err[0] = INFLATE_CORRUPT
    while True:
        zs.next_out = dst + produced
        zs.avail_out = <unsigned int>min(cap - produced, <Py_ssize_t>0x7FFFFFFF)
        rc = inflate(&zs, Z_NO_FLUSH)
        produced = zs.next_out - dst
        if rc == Z_STREAM_END:
            if zs.avail_in == 0:
                err[0] = INFLATE_DONE
                break
            if inflateReset(&zs) != Z_OK:     # concatenated members are one valid stream
                break
        elif rc == Z_OK or rc == Z_BUF_ERROR:
            if produced >= cap:
                err[0] = INFLATE_FULL
                break
            if zs.avail_in == 0:
                err[0] = INFLATE_TRUNCATED
                break
        else:
            break                             # Z_DATA_ERROR, Z_NEED_DICT, Z_MEM_ERROR
    inflateEnd(&zs)
    return produced


def inflate_into(src, out):
    """Inflate gzip/zlib data ``src`` into the writable buffer ``out`` without the GIL.
    Returns (bytes written, outcome): 0 complete, 1 corrupt, 2 truncated, 3 ``out`` filled
    before the stream ended."""
    cdef Py_buffer sv, ov
    cdef Py_ssize_t n
    cdef int err = 0
    PyObject_GetBuffer(src, &sv, PyBUF_SIMPLE)
    try:
        PyObject_GetBuffer(out, &ov, PyBUF_WRITABLE)
        try:
            with nogil:
                n = inflate_bounded(<const unsigned char *>sv.buf, sv.len,
                                    <unsigned char *>ov.buf, ov.len, &err)
        finally:
            PyBuffer_Release(&ov)
    finally:
        PyBuffer_Release(&sv)
    return n, err


# ---------------------------------------------------------------- reading

cdef inline void check_crc_or_raise(const char *p, Py_ssize_t size, uint32_t stored) except *:
    cdef uint32_t crc
    if size >= NOGIL_BYTES:
        with nogil:
            crc = batch_crc(p, size)
    else:
        crc = batch_crc(p, size)
    if crc != stored:
        raise BatchError(ERR_CORRUPT_MESSAGE, "CRC-32C mismatch")


cdef BatchInfo header_at(const char *p, Py_ssize_t n, Py_ssize_t pos, bint check_crc):
    # Header of the complete batch at pos, or None if the batch is partial.
    cdef int32_t batch_length
    cdef BatchInfo info
    if n - pos < LOG_OVERHEAD:
        return None
    batch_length = <int32_t>load_be32(p + pos + OFF_LENGTH)
    if batch_length < HEADER_SIZE - LOG_OVERHEAD:
        raise BatchError(ERR_CORRUPT_MESSAGE, f"batchLength {batch_length} at position {pos} "
                                              "is smaller than a batch header")
    if batch_length > n - pos - LOG_OVERHEAD:
        return None
    if p[pos + OFF_MAGIC] != 2:
        raise BatchError(ERR_UNSUPPORTED_FOR_MESSAGE_FORMAT,
                         f"magic {p[pos + OFF_MAGIC]} at position {pos}")
    info = parse_header(p + pos, pos)
    if check_crc:
        check_crc_or_raise(p + pos, info.size, info.crc)
    return info


def iter_batches(buf, Py_ssize_t start=0, bint check_crc=False):
    """Headers of every complete batch in ``buf`` from ``start`` on, as a list
    of BatchInfo (``position`` = byte offset in buf). A trailing partial batch
    ends the list silently, as Kafka clients expect of a fetch response."""
    cdef Py_buffer view
    cdef list out = []
    cdef BatchInfo info
    cdef Py_ssize_t pos = start
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        if start < 0 or start > view.len:
            raise ValueError("start outside the buffer")
        while True:
            info = header_at(<const char *>view.buf, view.len, pos, check_crc)
            if info is None:
                break
            out.append(info)
            pos += info.size
        return out
    finally:
        PyBuffer_Release(&view)


def read_batch(buf, Py_ssize_t position=0, bint check_crc=False):
    """Header of the complete batch at ``position``; BatchError
    (CORRUPT_MESSAGE) if it is partial."""
    cdef Py_buffer view
    cdef BatchInfo info
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        if position < 0 or position > view.len:
            raise ValueError("position outside the buffer")
        info = header_at(<const char *>view.buf, view.len, position, check_crc)
        if info is None:
            raise BatchError(ERR_CORRUPT_MESSAGE, f"partial batch at position {position}")
        return info
    finally:
        PyBuffer_Release(&view)


cdef object field_bytes(const unsigned char *p, Py_ssize_t *pos, Py_ssize_t end, bint nullable):
    cdef int32_t length
    cdef Py_ssize_t at = read_varint(p, pos[0], end, &length)
    if at < 0 or length < -1 or (length == -1 and not nullable) or length > end - at:
        raise BatchError(ERR_CORRUPT_MESSAGE, "malformed record field")
    if length == -1:
        pos[0] = at
        return None
    pos[0] = at + length
    return PyBytes_FromStringAndSize(<const char *>p + at, length)


cdef list decode_section(const unsigned char *p, Py_ssize_t n, int32_t count,
                         int64_t base_offset, int64_t base_timestamp,
                         int64_t log_append_time):
    # log_append_time >= 0 replaces every record's timestamp, as Kafka does
    # for LogAppendTime batches (their maxTimestamp is the broker's clock).
    cdef list out = []
    cdef list headers
    cdef int32_t i, h, length, offset_delta, nheaders
    cdef int64_t ts_delta
    cdef Py_ssize_t pos = 0, rec_end
    cdef object key, value, hkey
    if count < 0:
        raise BatchError(ERR_CORRUPT_MESSAGE, "negative recordsCount")
    for i in range(count):
        pos = read_varint(p, pos, n, &length)
        if pos < 0 or length < 1 or length > n - pos:
            raise BatchError(ERR_CORRUPT_MESSAGE, f"record {i}: bad length")
        rec_end = pos + length
        pos += 1
        pos = read_varlong(p, pos, rec_end, &ts_delta)
        if pos < 0:
            raise BatchError(ERR_CORRUPT_MESSAGE, f"record {i}: bad timestampDelta")
        pos = read_varint(p, pos, rec_end, &offset_delta)
        if pos < 0:
            raise BatchError(ERR_CORRUPT_MESSAGE, f"record {i}: bad offsetDelta")
        key = field_bytes(p, &pos, rec_end, True)
        value = field_bytes(p, &pos, rec_end, True)
        pos = read_varint(p, pos, rec_end, &nheaders)
        if pos < 0 or nheaders < 0 or nheaders > rec_end - pos:
            raise BatchError(ERR_CORRUPT_MESSAGE, f"record {i}: bad header count")
        headers = []
        for h in range(nheaders):
            hkey = field_bytes(p, &pos, rec_end, False)
            try:
                hkey = (<bytes>hkey).decode("utf-8")
            except UnicodeDecodeError:
                raise BatchError(ERR_CORRUPT_MESSAGE, f"record {i}: header key is not UTF-8") from None
            headers.append((hkey, field_bytes(p, &pos, rec_end, True)))
        if pos != rec_end:
            raise BatchError(ERR_CORRUPT_MESSAGE, f"record {i}: length does not match its fields")
        out.append((base_offset + offset_delta,
                    log_append_time if log_append_time >= 0 else base_timestamp + ts_delta,
                    key, value, headers))
    if pos != n:
        raise BatchError(ERR_CORRUPT_MESSAGE, "records do not fill the batch")
    return out


def decode_records(batch, bint check_crc=False):
    """Records of the uncompressed batch at the start of ``batch`` as a list
    of (offset, timestamp, key, value, headers). Compressed batches go through
    kbroker.record.decode_records, which decompresses first."""
    cdef Py_buffer view
    cdef BatchInfo info
    cdef const unsigned char *p
    PyObject_GetBuffer(batch, &view, PyBUF_SIMPLE)
    try:
        info = header_at(<const char *>view.buf, view.len, 0, check_crc)
        if info is None:
            raise BatchError(ERR_CORRUPT_MESSAGE, "partial batch")
        if info.codec != 0:
            raise BatchError(ERR_UNSUPPORTED_COMPRESSION_TYPE,
                             "compressed batch: use kbroker.record.decode_records")
        p = <const unsigned char *>view.buf
        return decode_section(p + HEADER_SIZE, info.size - HEADER_SIZE, info.record_count,
                              info.base_offset, info.first_timestamp,
                              info.max_timestamp if info.timestamp_type else -1)
    finally:
        PyBuffer_Release(&view)


def decode_record_data(raw, int32_t count, int64_t base_offset, int64_t base_timestamp,
                       int64_t log_append_time=-1):
    """Decode ``count`` records from an uncompressed records section (what
    follows byte 61, after decompression) that they must fill exactly.
    ``log_append_time`` >= 0 becomes every record's timestamp."""
    cdef Py_buffer view
    PyObject_GetBuffer(raw, &view, PyBUF_SIMPLE)
    try:
        return decode_section(<const unsigned char *>view.buf, view.len, count,
                              base_offset, base_timestamp, log_append_time)
    finally:
        PyBuffer_Release(&view)


# ---------------------------------------------------------------- building

@cython.final
cdef class BatchBuilder:
    """Encodes records into one RecordBatch v2 (for kbroker's own client).

    Records are encoded as they are appended into a growing C buffer; build()
    writes the header, compresses the records section when codec != 0 and
    computes the CRC. Fields are declared in batch.pxd."""

    def __cinit__(self):
        self.buf = NULL
        self.length = 0
        self.capacity = 0

    def __init__(self, int codec=0, Py_ssize_t batch_size=16384, int timestamp_type=0):
        if codec < 0 or codec > 4:
            raise ValueError(f"unknown compression codec {codec}")
        if timestamp_type not in (0, 1):
            raise ValueError("timestamp_type must be 0 (CreateTime) or 1 (LogAppendTime)")
        self.codec = codec
        self.timestamp_type = timestamp_type
        self.batch_size = batch_size
        self.record_count = 0
        self.first_timestamp = -1
        self.max_timestamp = -1
        self.built = False

    def __dealloc__(self):
        PyMem_Free(self.buf)

    cdef int _reserve(self, Py_ssize_t extra) except -1:
        cdef Py_ssize_t need = self.length + extra
        cdef Py_ssize_t cap = self.capacity if self.capacity else 256
        cdef char *grown
        if need <= self.capacity:
            return 0
        while cap < need:
            cap *= 2
        grown = <char *>PyMem_Realloc(self.buf, <size_t>cap)
        if grown == NULL:
            raise MemoryError()
        self.buf = grown
        self.capacity = cap
        return 0

    def append(self, timestamp_ms, key, value, headers=None):
        """Add one record; False (nothing added) when it would push a
        non-empty batch past batch_size. ``timestamp_ms`` None means now;
        key/value are bytes-like or None; headers an iterable of
        (str, bytes-like | None)."""
        cdef int64_t ts
        cdef int64_t ts_delta
        cdef Py_buffer kview, vview
        cdef bint has_key = False, has_value = False
        cdef Py_ssize_t body, total, pos, klen = -1, vlen = -1
        cdef list hdrs = []
        cdef Py_ssize_t hsize = 0
        cdef object hk, hv
        cdef bytes hkb
        cdef Py_buffer hview
        cdef char *out
        if self.built:
            raise RuntimeError("batch already built")
        ts = <int64_t>time.time_ns() // 1000000 if timestamp_ms is None else timestamp_ms
        if headers is not None:
            for hk, hv in headers:
                hkb = (<str>hk).encode("utf-8") if isinstance(hk, str) else bytes(hk)
                hv = None if hv is None else bytes(hv)
                hsize += varlong_size(len(hkb)) + len(hkb)
                hsize += varlong_size(-1) if hv is None else varlong_size(len(hv)) + len(hv)
                hdrs.append((hkb, hv))
        if key is not None:
            PyObject_GetBuffer(key, &kview, PyBUF_SIMPLE)
            has_key = True
        try:
            if value is not None:
                PyObject_GetBuffer(value, &vview, PyBUF_SIMPLE)
                has_value = True
            try:
                klen = kview.len if has_key else -1
                vlen = vview.len if has_value else -1
                ts_delta = 0 if self.record_count == 0 else ts - self.first_timestamp
                body = (1 + varlong_size(ts_delta) + varlong_size(self.record_count)
                        + varlong_size(klen) + (klen if klen > 0 else 0)
                        + varlong_size(vlen) + (vlen if vlen > 0 else 0)
                        + varlong_size(len(hdrs)) + hsize)
                total = varlong_size(body) + body
                if self.record_count > 0 and HEADER_SIZE + self.length + total > self.batch_size:
                    return False
                if self.record_count == 0:
                    self.first_timestamp = ts
                    self.max_timestamp = ts
                elif ts > self.max_timestamp:
                    self.max_timestamp = ts
                self._reserve(total)
                out = self.buf
                pos = self.length
                pos = write_varlong(out, pos, body)
                out[pos] = 0
                pos += 1
                pos = write_varlong(out, pos, ts_delta)
                pos = write_varlong(out, pos, self.record_count)
                pos = write_varlong(out, pos, klen)
                if klen > 0:
                    memcpy(out + pos, kview.buf, <size_t>klen)
                    pos += klen
                pos = write_varlong(out, pos, vlen)
                if vlen > 0:
                    memcpy(out + pos, vview.buf, <size_t>vlen)
                    pos += vlen
                pos = write_varlong(out, pos, len(hdrs))
                for hk, hv in hdrs:
                    pos = write_varlong(out, pos, len(<bytes>hk))
                    memcpy(out + pos, PyBytes_AS_STRING(hk), <size_t>len(<bytes>hk))
                    pos += len(<bytes>hk)
                    if hv is None:
                        pos = write_varlong(out, pos, -1)
                    else:
                        pos = write_varlong(out, pos, len(<bytes>hv))
                        memcpy(out + pos, PyBytes_AS_STRING(hv), <size_t>len(<bytes>hv))
                        pos += len(<bytes>hv)
                self.length = pos
                self.record_count += 1
                return True
            finally:
                if has_value:
                    PyBuffer_Release(&vview)
        finally:
            if has_key:
                PyBuffer_Release(&kview)

    def size_in_bytes(self):
        """Batch size so far, records uncompressed."""
        return HEADER_SIZE + self.length

    def build(self, int64_t producer_id=-1, int16_t producer_epoch=-1,
              int32_t base_sequence=-1, int32_t partition_leader_epoch=-1,
              bint is_transactional=False):
        """The finished batch (baseOffset 0) as bytes."""
        global _compression
        cdef object section
        cdef Py_buffer sview
        cdef bytes result
        cdef char *out
        cdef Py_ssize_t total
        cdef int attributes
        cdef uint32_t crc
        if self.built:
            raise RuntimeError("batch already built")
        if self.codec != 0:
            if _compression is None:
                from kbroker.record import compression as _c
                _compression = _c
            section = _compression.compress(
                self.codec, PyBytes_FromStringAndSize(self.buf, self.length))
        else:
            section = PyBytes_FromStringAndSize(self.buf, self.length)
        PyObject_GetBuffer(section, &sview, PyBUF_SIMPLE)
        try:
            total = HEADER_SIZE + sview.len
            if total - LOG_OVERHEAD > 0x7FFFFFFF:
                raise OverflowError("batch larger than 2 GiB")
            result = PyBytes_FromStringAndSize(NULL, total)
            out = PyBytes_AS_STRING(result)
            attributes = self.codec | (self.timestamp_type << 3)
            if is_transactional:
                attributes |= ATTR_TRANSACTIONAL
            store_be64(out + OFF_BASE_OFFSET, 0)
            store_be32(out + OFF_LENGTH, <uint32_t>(total - LOG_OVERHEAD))
            store_be32(out + OFF_LEADER_EPOCH, <uint32_t>partition_leader_epoch)
            out[OFF_MAGIC] = 2
            store_be16(out + OFF_ATTRIBUTES, <uint16_t>attributes)
            store_be32(out + OFF_LAST_OFFSET_DELTA, <uint32_t>(self.record_count - 1))
            store_be64(out + OFF_BASE_TIMESTAMP, <uint64_t>self.first_timestamp)
            store_be64(out + OFF_MAX_TIMESTAMP, <uint64_t>self.max_timestamp)
            store_be64(out + OFF_PRODUCER_ID, <uint64_t>producer_id)
            store_be16(out + OFF_PRODUCER_EPOCH, <uint16_t>producer_epoch)
            store_be32(out + OFF_BASE_SEQUENCE, <uint32_t>base_sequence)
            store_be32(out + OFF_RECORDS_COUNT, <uint32_t>self.record_count)
            memcpy(out + HEADER_SIZE, sview.buf, <size_t>sview.len)
            if total >= NOGIL_BYTES:
                with nogil:
                    crc = batch_crc(out, total)
            else:
                crc = batch_crc(out, total)
            store_be32(out + OFF_CRC, crc)
        finally:
            PyBuffer_Release(&sview)
        self.built = True
        return result
