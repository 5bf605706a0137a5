# C-level API of kbroker._native.codec (streaming validation of compressed records sections); see
# codec.pyx. Declarations here must stay identical to the definitions in codec.pyx.
cimport cython
from libc.stdint cimport int32_t, int64_t


cdef extern from "zstd.h" nogil:
    ctypedef struct ZSTD_DCtx:
        pass


# A decode window (CARRY + WINDOW bytes) and a zstd decoding context, pooled between calls.
@cython.final
cdef class Workspace:
    cdef unsigned char *window
    cdef ZSTD_DCtx *dctx
    cdef int prepare(self, int codec) except -1
    cdef void trim(self) noexcept


# Decode the records section src[0:n] (codec 1 gzip, 3 lz4, 4 zstd) through ws's window and walk
# its records: a SECTION_* outcome (0 = valid). ws must be prepared for the codec. max_delta[0] is
# raised to the largest timestampDelta walked.
cdef int run(Workspace ws, int codec, const unsigned char *src, Py_ssize_t n, int32_t count,
             bint need_keys, int64_t cap, int64_t *max_delta) noexcept nogil
