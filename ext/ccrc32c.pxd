# Declarations of ext/crc32c.h for cimport by any .pyx (CRC-32C, Castagnoli).
# crc starts at 0; crc32c_update(0, b"123456789", 9) == 0xE3069283.
from libc.stdint cimport uint32_t


cdef extern from "crc32c.h" nogil:
    uint32_t crc32c_update(uint32_t crc, const void *buf, size_t len)
    int crc32c_hw_available()
    uint32_t crc32c_update_sw(uint32_t crc, const void *buf, size_t len)
