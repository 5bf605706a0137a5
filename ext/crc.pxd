# C-level API of kbroker._native.crc. Other extensions should normally
# cimport ccrc32c (the C header) directly; this declares the GIL-aware helper.
# Must stay identical to the definition in crc.pyx.
from libc.stdint cimport uint32_t


# CRC-32C of buf[0:n] continuing from crc (0 to start); releases the GIL
# itself when n is large enough for that to pay off.
cdef uint32_t crc32c_buf(uint32_t crc, const char *buf, size_t n) noexcept
