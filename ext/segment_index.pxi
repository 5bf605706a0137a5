# Included by segment.pyx: the sparse .index / .timeindex files: binary search, entry access, the
# sanity check recovery uses, and single-entry writes.
#
# Contract: entries are big-endian (.index: relative offset u32, position u32; .timeindex: timestamp
# i64, relative offset u32), keys non-decreasing as appends leave them. Lookups search Kafka's "warm
# section" (the last WARM_BYTES of entries) first, without the GIL. kbroker.log.index owns the files
# (mmapped, preallocated) and calls these on their buffers or descriptors.

# Kafka's "warm section": lookups near the tail (consumers at the head of the log) binary
# search only the last 8 KiB of the index, pages that stay resident.
cdef enum:
    WARM_BYTES = 8192

INDEX_OFFSET = 0     # .index keyed by relative offset
INDEX_POSITION = 1   # .index keyed by file position
INDEX_TIME = 2       # .timeindex keyed by timestamp

cdef inline int64_t _key(const char *base, Py_ssize_t slot, int kind) noexcept nogil:
    if kind == 0:
        return <int64_t>load_be32(base + slot * 8)
    if kind == 1:
        return <int64_t>load_be32(base + slot * 8 + 4)
    return <int64_t>load_be64(base + slot * 12)


cdef Py_ssize_t _glb(const char *base, Py_ssize_t lo, Py_ssize_t hi, int64_t target,
                     int kind) noexcept nogil:
    # Greatest slot in [lo, hi] whose key <= target, or lo - 1 when none.
    cdef Py_ssize_t mid
    if _key(base, lo, kind) > target:
        return lo - 1
    while lo < hi:
        mid = hi - (hi - lo) // 2           # upper middle so lo always advances
        if _key(base, mid, kind) <= target:
            lo = mid
        else:
            hi = mid - 1
    return lo


def index_lookup(buf, Py_ssize_t entries, int kind, int64_t target):
    """Greatest slot whose key is <= target, or -1 (no such entry / empty index).

    kind: INDEX_OFFSET (target = relative offset), INDEX_POSITION (target = file position),
    INDEX_TIME (target = timestamp). Keys must be non-decreasing, which append guarantees."""
    cdef Py_buffer view
    cdef Py_ssize_t esize = 12 if kind == 2 else 8
    cdef Py_ssize_t warm, slot
    cdef const char *base
    if entries <= 0:
        return -1
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        if view.len < entries * esize:
            raise ValueError("index buffer shorter than its entry count")
        base = <const char *>view.buf
        with nogil:
            warm = entries - WARM_BYTES // esize
            if warm > 0 and _key(base, warm, kind) <= target:
                slot = _glb(base, warm, entries - 1, target, kind)
            else:
                slot = _glb(base, 0, entries - 1, target, kind)
        return slot
    finally:
        PyBuffer_Release(&view)


def index_valid_entries(buf, Py_ssize_t entries, int kind, int64_t max_position):
    """Length of the longest prefix of entries that is well formed.

    Offset index: relative offsets strictly increasing, positions non-decreasing and below
    max_position. Time index: timestamps and offsets non-decreasing. A preallocated file left
    untrimmed by a crash ends in zero entries, which fail these rules and are cut off."""
    cdef Py_buffer view
    cdef const char *base
    cdef Py_ssize_t i
    cdef int64_t prev_k = -1, prev_v = -1, k, v
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        base = <const char *>view.buf
        if entries * (12 if kind == 2 else 8) > view.len:
            raise ValueError("index buffer shorter than its entry count")
        with nogil:
            for i in range(entries):
                if kind == 2:
                    k = <int64_t>load_be64(base + i * 12)
                    v = <int64_t>load_be32(base + i * 12 + 8)
                    if i > 0 and (k < prev_k or v < prev_v):
                        break
                    if i > 0 and k == 0 and v == 0:
                        break
                else:
                    k = <int64_t>load_be32(base + i * 8)
                    v = <int64_t>load_be32(base + i * 8 + 4)
                    if i > 0 and (k <= prev_k or v < prev_v):
                        break
                    if v >= max_position:
                        break
                prev_k = k
                prev_v = v
            else:
                i = entries
        return i
    finally:
        PyBuffer_Release(&view)


def offset_entry(buf, Py_ssize_t slot):
    """(relative_offset, position) of an .index entry."""
    cdef Py_buffer view
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        if (slot + 1) * 8 > view.len or slot < 0:
            raise IndexError(slot)
        return (load_be32(<const char *>view.buf + slot * 8),
                load_be32(<const char *>view.buf + slot * 8 + 4))
    finally:
        PyBuffer_Release(&view)


def time_entry(buf, Py_ssize_t slot):
    """(timestamp, relative_offset) of a .timeindex entry."""
    cdef Py_buffer view
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        if (slot + 1) * 12 > view.len or slot < 0:
            raise IndexError(slot)
        return (<int64_t>load_be64(<const char *>view.buf + slot * 12),
                load_be32(<const char *>view.buf + slot * 12 + 8))
    finally:
        PyBuffer_Release(&view)


def put_offset_entry(buf, Py_ssize_t slot, uint32_t relative_offset, uint32_t position):
    """Store an .index entry in a writable buffer (the mmapped, preallocated file)."""
    cdef Py_buffer view
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE | 0x0001)   # PyBUF_WRITABLE
    try:
        if (slot + 1) * 8 > view.len or slot < 0:
            raise IndexError(slot)
        store_be32(<char *>view.buf + slot * 8, relative_offset)
        store_be32(<char *>view.buf + slot * 8 + 4, position)
    finally:
        PyBuffer_Release(&view)


def put_time_entry(buf, Py_ssize_t slot, int64_t timestamp, uint32_t relative_offset):
    """Store a .timeindex entry in a writable buffer."""
    cdef Py_buffer view
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE | 0x0001)
    try:
        if (slot + 1) * 12 > view.len or slot < 0:
            raise IndexError(slot)
        store_be64(<char *>view.buf + slot * 12, <uint64_t>timestamp)
        store_be32(<char *>view.buf + slot * 12 + 8, relative_offset)
    finally:
        PyBuffer_Release(&view)


# The writer side of one index file, the one home of the append rule (kbroker.log.index.OffsetIndex /
# TimeIndex subclass it and keep the file's lifecycle: open, preallocate, trim, truncate). The leader's
# append path (SegmentState.index_batch) calls add_offset_entry / add_time_entry as C calls; Python
# calls them through OffsetIndex.append / TimeIndex.maybe_append, which raise when one refuses.
cdef class IndexFile:
    def __cinit__(self, *args, **kwargs):
        self.fd = -1

    cpdef int add_offset_entry(self, int64_t offset, int64_t position) except -1:
        """Add the .index entry "the batch whose last offset is ``offset`` starts at ``position``".
        -> INDEX_ADDED, or INDEX_REFUSED (nothing done: read-only or full index, ``offset`` not above
        the last entry's, a value past 32 bits). OSError: the write failed, the entry is not added."""
        cdef int64_t rel = offset - self.base_offset
        cdef char e[8]
        if not self.writable or self.entries >= self.max_entries or not _u32(rel) or not _u32(position):
            return INDEX_REFUSED
        if self.entries:
            if not _entry_at(self.mm, self.entries - 1, 8, e) or rel <= <int64_t>load_be32(e):
                return INDEX_REFUSED
        store_be32(e, <uint32_t>rel)
        store_be32(e + 4, <uint32_t>position)
        _pwrite_entry(self.fd, e, 8, self.entries * 8)
        self.entries += 1
        return INDEX_ADDED

    cpdef int add_time_entry(self, int64_t timestamp, int64_t offset) except -1:
        """Add the .timeindex entry (``timestamp``, ``offset``) when ``timestamp`` is above the last
        entry's (Kafka keeps the time index strictly increasing in timestamp). -> INDEX_ADDED,
        INDEX_NOT_NEEDED (timestamp not above the last), or INDEX_REFUSED (nothing done: read-only or
        full index, ``offset`` below the last entry's, past 32 bits). OSError as add_offset_entry."""
        cdef int64_t rel = offset - self.base_offset
        cdef char e[12]
        if self.entries:
            if not _entry_at(self.mm, self.entries - 1, 12, e):
                return INDEX_REFUSED
            if timestamp <= <int64_t>load_be64(e):
                return INDEX_NOT_NEEDED
            if rel < <int64_t>load_be32(e + 8):
                return INDEX_REFUSED
        if not self.writable or self.entries >= self.max_entries or not _u32(rel):
            return INDEX_REFUSED
        store_be64(e, <uint64_t>timestamp)
        store_be32(e + 8, <uint32_t>rel)
        _pwrite_entry(self.fd, e, 12, self.entries * 12)
        self.entries += 1
        return INDEX_ADDED


cdef inline bint _u32(int64_t v) noexcept:
    return 0 <= v <= 0xFFFFFFFF


cdef int _entry_at(object mm, int64_t slot, Py_ssize_t esize, char *out) except -1:
    # entry ``slot`` of the index's mapping copied to ``out`` -> 1, or 0 when not mapped there
    cdef Py_buffer view
    if mm is None:
        return 0
    PyObject_GetBuffer(mm, &view, PyBUF_SIMPLE)
    try:
        if slot < 0 or (slot + 1) * esize > view.len:
            return 0
        memcpy(out, <const char *>view.buf + slot * esize, esize)
        return 1
    finally:
        PyBuffer_Release(&view)


cdef int _pwrite_entry(int fd, const char *e, Py_ssize_t esize, int64_t at) except -1:
    # One small pwrite into the page cache: cheaper with the GIL held than handing it over and back.
    cdef int err = _pwrite_all(fd, e, esize, at)
    if err:
        raise _os_error(err)
    return 0
