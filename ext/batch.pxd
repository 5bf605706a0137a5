# kbroker._native.batch (RecordBatch v2, magic 2): every cdef class it exports (the typed header
# record, the client's batch builder) and the C-level functions other extensions cimport as
# kbroker._native.batch (the segment's scan and leader append: header parse, record walk, append
# checks, stamping). The header layout itself is in layout.pxd. Declarations here must stay
# identical to the definitions in batch.pyx.
cimport cython
from libc.stdint cimport int16_t, int32_t, int64_t, uint32_t


# Header fields of one batch; ``position`` is its byte offset in the buffer or file it was read
# from. Python sees the fields read-only (plus derived properties defined in batch.pyx).
@cython.final
cdef class BatchInfo:
    cdef readonly Py_ssize_t position
    cdef readonly Py_ssize_t size
    cdef readonly int64_t base_offset
    cdef readonly int32_t partition_leader_epoch
    cdef readonly int magic
    cdef readonly uint32_t crc
    cdef readonly int attributes
    cdef readonly int32_t last_offset_delta
    cdef readonly int64_t first_timestamp
    cdef readonly int64_t max_timestamp
    cdef readonly int64_t producer_id
    cdef readonly int16_t producer_epoch
    cdef readonly int32_t base_sequence
    cdef readonly int32_t record_count


# Encodes records into one RecordBatch v2 for kbroker's own client: each ``append`` encodes its
# record into a growing C buffer; ``build`` writes the header, compresses the records section
# (codec != 0) and computes the CRC, once.
@cython.final
cdef class BatchBuilder:
    cdef int codec
    cdef int timestamp_type                 # 0 CreateTime, 1 LogAppendTime
    cdef Py_ssize_t batch_size              # append refuses a record past this (but not the first)
    cdef char *buf                          # encoded records section, uncompressed
    cdef Py_ssize_t length
    cdef Py_ssize_t capacity
    cdef readonly int32_t record_count
    cdef int64_t first_timestamp
    cdef int64_t max_timestamp
    cdef bint built                         # build() ran: the builder takes nothing more
    cdef int _reserve(self, Py_ssize_t extra) except -1


# A BatchInfo from the HEADER_SIZE bytes at buf (the caller checked they are there).
cdef BatchInfo parse_header(const char *buf, Py_ssize_t position)

# 0 when p[pos:end] holds exactly `count` well-formed records with
# offsetDeltas 0..count-1, else -1.
cdef int walk_records(const unsigned char *p, Py_ssize_t pos, Py_ssize_t end,
                      int32_t count) noexcept nogil

# validate_and_stamp's checks on the n bytes at p (``buf`` their owner, for a compressed section):
# 0, or BatchError raised with the same code and message. ``prevalidated`` skips the record walk
# of a compressed section (validate_batch already ran). A valid batch whose records were walked
# here leaves with maxTimestamp set from them (and its CRC rewritten) when it differed.
cdef int check_for_append(char *p, Py_ssize_t n, object buf, int64_t max_message_bytes,
                          bint compacted, bint prevalidated) except -1
# Stamp baseOffset / partitionLeaderEpoch (and LogAppendTime + CRC when log_append_time_ms >= 0)
# into the size bytes of a checked batch.
cdef void stamp(char *buf, Py_ssize_t size, int64_t base_offset, int32_t leader_epoch,
                int64_t log_append_time_ms) noexcept nogil
