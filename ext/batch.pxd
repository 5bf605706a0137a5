# C-level API of kbroker._native.batch (RecordBatch v2, magic 2): the GIL-free
# byte helpers another extension (e.g. a recovery scan) can reuse.
#
# Only plain C functions are declared here, never the cdef classes or the
# layout enums: with the current build, Cython looks this file up under the
# qualified name kbroker._native.batch and does not find it in ext/, so
# batch.pyx must compile with or without it. Declarations here must stay
# identical to the definitions in batch.pyx.
from libc.stdint cimport int32_t, int64_t, uint32_t


# The zigzag varint helpers live in varint.pxd (inline, cimported by every record walker).

# 0 when p[pos:end] holds exactly `count` well-formed records with
# offsetDeltas 0..count-1, else -1.
cdef int walk_records(const unsigned char *p, Py_ssize_t pos, Py_ssize_t end,
                      int32_t count) noexcept nogil

# CRC-32C a batch of `size` bytes starting at `batch` should carry (bytes [21, size)).
cdef uint32_t batch_crc(const char *batch, Py_ssize_t size) noexcept nogil
