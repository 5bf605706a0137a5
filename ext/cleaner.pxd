# C-level API of kbroker._native.cleaner: the key hash other extensions could reuse.
# Declarations here must stay identical to the definitions in cleaner.pyx.
from libc.stdint cimport uint64_t


# MurmurHash3 x64-128 (seed 0) of data[0:n] into out[0] (h1), out[1] (h2).
cdef void hash128(const unsigned char *data, Py_ssize_t n, uint64_t *out) noexcept nogil
