# The RecordBatch v2 (magic 2) header layout: the one definition every native module cimports
# (batch, segment, cleaner, request, arrow). Python code reads the same numbers from
# kbroker._native.batch.LAYOUT instead of redefining them.
#
# Header (61 bytes, big-endian):
#    0 baseOffset i64 | 8 batchLength i32 (= size - 12) | 12 partitionLeaderEpoch i32
#   16 magic i8 | 17 crc u32 = CRC-32C of bytes [21, end) | 21 attributes i16
#   23 lastOffsetDelta i32 | 27 baseTimestamp i64 | 35 maxTimestamp i64
#   43 producerId i64 | 51 producerEpoch i16 | 53 baseSequence i32 | 57 recordsCount i32
# then the records (one compressed blob when attributes & 7 != 0).
# baseOffset, batchLength and partitionLeaderEpoch sit before the CRC span: the leader stamps
# the offset and epoch in place without touching the checksum.
from libc.stdint cimport int16_t, int32_t, int64_t, uint32_t

from ccrc32c cimport crc32c_update
from hton cimport load_be16, load_be32, load_be64


cdef enum:
    # Field offsets.
    OFF_BASE_OFFSET = 0
    OFF_LENGTH = 8
    OFF_LEADER_EPOCH = 12
    OFF_MAGIC = 16
    OFF_CRC = 17
    OFF_ATTRIBUTES = 21
    OFF_LAST_OFFSET_DELTA = 23
    OFF_BASE_TIMESTAMP = 27
    OFF_MAX_TIMESTAMP = 35
    OFF_PRODUCER_ID = 43
    OFF_PRODUCER_EPOCH = 51
    OFF_BASE_SEQUENCE = 53
    OFF_RECORDS_COUNT = 57

    # Field sizes (bytes).
    SIZE_BASE_OFFSET = 8
    SIZE_LENGTH = 4
    SIZE_LEADER_EPOCH = 4
    SIZE_MAGIC = 1
    SIZE_CRC = 4
    SIZE_ATTRIBUTES = 2
    SIZE_LAST_OFFSET_DELTA = 4
    SIZE_BASE_TIMESTAMP = 8
    SIZE_MAX_TIMESTAMP = 8
    SIZE_PRODUCER_ID = 8
    SIZE_PRODUCER_EPOCH = 2
    SIZE_BASE_SEQUENCE = 4
    SIZE_RECORDS_COUNT = 4

    # baseOffset + batchLength: the bytes batchLength does not count.
    LOG_OVERHEAD = 12
    HEADER_SIZE = 61
    # The CRC covers [CRC_START, end of batch).
    CRC_START = 21
    MAGIC_V2 = 2

    # Attribute bits.
    ATTR_CODEC_MASK = 0x07          # 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd
    ATTR_LOG_APPEND_TIME = 0x08     # timestampType
    ATTR_TRANSACTIONAL = 0x10
    ATTR_CONTROL = 0x20
    ATTR_DELETE_HORIZON = 0x40      # KIP-534: baseTimestamp holds the delete horizon
    MAX_CODEC = 4


# Field readers over a header at h (at least HEADER_SIZE readable bytes, except batch_size and
# batch_magic which need only LOG_OVERHEAD and OFF_MAGIC + 1).
cdef inline int64_t batch_base_offset(const char *h) noexcept nogil:
    return <int64_t>load_be64(h + OFF_BASE_OFFSET)

cdef inline int64_t batch_size(const char *h) noexcept nogil:
    # Whole batch in bytes (batchLength + 12); may be negative or tiny for garbage.
    return <int64_t><int32_t>load_be32(h + OFF_LENGTH) + LOG_OVERHEAD

cdef inline int32_t batch_leader_epoch(const char *h) noexcept nogil:
    return <int32_t>load_be32(h + OFF_LEADER_EPOCH)

cdef inline int batch_magic(const char *h) noexcept nogil:
    return <signed char>h[OFF_MAGIC]

cdef inline uint32_t batch_stored_crc(const char *h) noexcept nogil:
    return load_be32(h + OFF_CRC)

cdef inline int batch_attributes(const char *h) noexcept nogil:
    return <int>load_be16(h + OFF_ATTRIBUTES)

cdef inline int32_t batch_last_offset_delta(const char *h) noexcept nogil:
    return <int32_t>load_be32(h + OFF_LAST_OFFSET_DELTA)

cdef inline int64_t batch_last_offset(const char *h) noexcept nogil:
    return batch_base_offset(h) + batch_last_offset_delta(h)

cdef inline int64_t batch_base_timestamp(const char *h) noexcept nogil:
    return <int64_t>load_be64(h + OFF_BASE_TIMESTAMP)

cdef inline int64_t batch_max_timestamp(const char *h) noexcept nogil:
    return <int64_t>load_be64(h + OFF_MAX_TIMESTAMP)

cdef inline int64_t batch_producer_id(const char *h) noexcept nogil:
    return <int64_t>load_be64(h + OFF_PRODUCER_ID)

cdef inline int16_t batch_producer_epoch(const char *h) noexcept nogil:
    return <int16_t>load_be16(h + OFF_PRODUCER_EPOCH)

cdef inline int32_t batch_base_sequence(const char *h) noexcept nogil:
    return <int32_t>load_be32(h + OFF_BASE_SEQUENCE)

cdef inline int32_t batch_records_count(const char *h) noexcept nogil:
    return <int32_t>load_be32(h + OFF_RECORDS_COUNT)


# The CRC-32C a batch of `size` bytes starting at `batch` should carry.
cdef inline uint32_t batch_crc(const char *batch, Py_ssize_t size) noexcept nogil:
    return crc32c_update(0, batch + CRC_START, <size_t>(size - CRC_START))
