"""CRC-32C (Castagnoli) over any Python buffer.

The checksum Kafka's RecordBatch v2 stores at byte 17, covering bytes
[21, end) of the batch. The C implementation (ext/crc32c.c) picks the SSE4.2
instruction path or a slicing-by-8 table once at load time.
"""
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from libc.stdint cimport uint32_t

from ccrc32c cimport crc32c_hw_available, crc32c_update, crc32c_update_sw

# Below this size the GIL round trip costs more than the CRC itself.
cdef size_t GIL_RELEASE_BYTES = 4096


cdef uint32_t crc32c_buf(uint32_t crc, const char *buf, size_t n) noexcept:
    if n < GIL_RELEASE_BYTES:
        return crc32c_update(crc, buf, n)
    with nogil:
        crc = crc32c_update(crc, buf, n)
    return crc


def crc32c(data, unsigned long long value=0):
    """Return the CRC-32C of ``data`` (any C-contiguous buffer), continuing
    from ``value`` (the CRC of the preceding bytes; 0 to start)."""
    cdef Py_buffer view
    cdef uint32_t crc
    if value > 0xFFFFFFFF:
        raise ValueError("value must be a 32-bit CRC")
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        crc = crc32c_buf(<uint32_t>value, <const char *>view.buf, <size_t>view.len)
    finally:
        PyBuffer_Release(&view)
    return crc


def hardware():
    """True when the CPU's crc32 instruction path is in use."""
    return crc32c_hw_available() != 0


def _crc32c_table(data, unsigned long long value=0):
    """Test hook: the slicing-by-8 table path regardless of the CPU."""
    cdef Py_buffer view
    cdef uint32_t crc
    if value > 0xFFFFFFFF:
        raise ValueError("value must be a 32-bit CRC")
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        with nogil:
            crc = crc32c_update_sw(<uint32_t>value, view.buf, <size_t>view.len)
    finally:
        PyBuffer_Release(&view)
    return crc
