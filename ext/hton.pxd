# Big-endian load/store helpers from ext/hton.h (unaligned-safe, GIL-free).
# Loads return unsigned values; cast to the signed type a field needs,
# e.g. <int64_t>load_be64(p) for baseOffset.
from libc.stdint cimport uint16_t, uint32_t, uint64_t


cdef extern from "hton.h" nogil:
    uint16_t load_be16(const char *p)
    uint32_t load_be32(const char *p)
    uint64_t load_be64(const char *p)
    void store_be16(char *p, uint16_t v)
    void store_be32(char *p, uint32_t v)
    void store_be64(char *p, uint64_t v)
