# kbroker._native.arrow (RecordBatch v2 <-> Arrow columns, kbroker.spark): every cdef class it exports
# (the read side's buffers and decoder, the write side's column views) and the C structs they hold.
# The batch header comes from layout.pxd (its one definition) and the record varints from
# varint.pxd; arrow.pyx restates neither. Declarations here must match the definitions in
# arrow.pyx.
cimport cython
from libc.stdint cimport int32_t, int64_t, uint8_t

from ccrc32c cimport crc32c_update
from hton cimport store_be16, store_be32, store_be64
from layout cimport (CRC_START, HEADER_SIZE, LOG_OVERHEAD, MAGIC_V2, OFF_ATTRIBUTES,
                     OFF_BASE_OFFSET, OFF_BASE_SEQUENCE, OFF_BASE_TIMESTAMP, OFF_CRC, OFF_LAST_OFFSET_DELTA,
                     OFF_LEADER_EPOCH, OFF_LENGTH, OFF_MAGIC, OFF_MAX_TIMESTAMP, OFF_PRODUCER_EPOCH,
                     OFF_PRODUCER_ID, OFF_RECORDS_COUNT)
from varint cimport read_varint, read_varlong, varlong_size, write_varlong


# One Arrow buffer being filled: memory from pyarrow's default pool, grown (with the GIL) by the
# decoder's Python-facing side only; the GIL-free decode writes within ``capacity``.
@cython.final
cdef class _Mem:
    cdef object buf               # pyarrow.ResizableBuffer, None until the first grow
    cdef char *data
    cdef Py_ssize_t length        # bytes written
    cdef Py_ssize_t capacity
    cdef int grow(self, Py_ssize_t need) except -1
    cdef object finish(self)


# Records sections -> the Arrow buffers of Spark's Kafka schema (see RecordDecoder in arrow.pyx).
@cython.final
cdef class RecordDecoder:
    cdef readonly bint include_headers
    cdef readonly int64_t max_rows
    cdef readonly int64_t max_bytes
    cdef readonly int64_t rows
    cdef readonly int64_t data_bytes
    cdef readonly int64_t last_offset     # offset of the last record appended, -1 before any
    cdef _Mem key_valid, key_off, key_data, val_valid, val_off, val_data
    cdef _Mem offsets, timestamps, ts_types
    cdef _Mem hdr_valid, hdr_off, hk_off, hk_data, hv_valid, hv_off, hv_data
    cdef int64_t nheaders
    # What the record that stopped the decode with NEED_MEMORY needs: key, value, header bytes.
    cdef Py_ssize_t need_key, need_value, need_headers
    cdef list hints                       # buffer lengths of the last batch: the next one's sizes
    cdef object const_key, const_cols     # (topic, partition, rows) -> its topic/partition columns

    cdef list _mems(self)
    cdef int _reset(self) except -1
    cdef int _grow_for_record(self) except -1
    cdef int _decode(self, const unsigned char *p, Py_ssize_t n, int32_t count,
                     int64_t base_offset, int64_t base_timestamp, int64_t log_append_time,
                     int32_t ts_type, int64_t lo, int64_t hi,
                     Py_ssize_t *pos_io, int32_t *index_io) noexcept nogil


# One Arrow binary/string column (int32 offsets) seen as raw pointers (the write side).
cdef struct BinCol:
    const uint8_t *valid      # NULL = no nulls
    const int32_t *off
    const unsigned char *data
    int64_t base              # the array's offset into its buffers
    bint present


# A list<struct<key string, value binary>> headers column: list offsets/validity + children.
cdef struct HdrCol:
    const int32_t *off
    const uint8_t *valid
    int64_t base
    bint present
    BinCol hkey
    BinCol hval


# The write side's column views (partition_for_keys, build_batches): each holds the pyarrow buffers of
# one input column alive while the GIL-free encode reads them through ``col``'s raw pointers. Module
# helpers, not API: Python never gets one back.
cdef class _Column:
    cdef BinCol col                         # a binary or string column (present False: None, all null)
    cdef object keep                        # the buffers and views ``col`` points into


cdef class _ListColumn:
    cdef HdrCol col                         # a headers column, its key and value children inside
    cdef object keep                        # the buffers, views and child _Columns ``col`` points into
