# C-level API of kbroker._native.batch (RecordBatch v2, magic 2): GIL-free record walk another
# extension (e.g. the native request path) can reuse. The header layout and batch_crc are in
# layout.pxd. Declarations here must stay identical to the definitions in batch.pyx.
from libc.stdint cimport int32_t


# 0 when p[pos:end] holds exactly `count` well-formed records with
# offsetDeltas 0..count-1, else -1.
cdef int walk_records(const unsigned char *p, Py_ssize_t pos, Py_ssize_t end,
                      int32_t count) noexcept nogil
