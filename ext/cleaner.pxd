# kbroker._native.cleaner: the cdef class it exports (log compaction's dedupe map, kbroker.log.cleaner);
# key hashing, the record walk and filtering are module functions of cleaner.pyx.
cimport cython
from libc.stdint cimport int32_t, int64_t, uint64_t


# One slot of the dedupe map: a key's 128-bit hash and the latest offset seen for it.
cdef struct Slot:
    uint64_t h1
    uint64_t h2
    int64_t offset_plus_one    # 0 = empty


# Bounded open-addressing map key hash -> latest offset (Kafka's SkimpyOffsetMap idea), allocated
# once per cleaning round: ``slots`` slots, filled at most to ``max_entries`` so probes stay short.
@cython.final
cdef class OffsetMap:
    cdef Slot *table
    cdef readonly Py_ssize_t slots
    cdef readonly Py_ssize_t max_entries
    cdef readonly Py_ssize_t size
    cdef readonly int64_t latest_offset     # highest offset mapped (put_section / mark), -1 before any
    # the slot holding (h1, h2), or the empty slot where it would go
    cdef inline Slot *find(self, uint64_t h1, uint64_t h2) noexcept nogil
    # the keyed records of one uncompressed records section: 0, -1 malformed, -2 the map is full
    cdef int put_records(self, const unsigned char *p, Py_ssize_t n, int32_t count,
                         int64_t base_offset) noexcept nogil
