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


def write_offset_entry(int fd, Py_ssize_t slot, uint32_t relative_offset, uint32_t position):
    """pwrite one .index entry at ``slot`` of the index file; raises OSError (e.g. ENOSPC)."""
    cdef char e[8]
    cdef int err
    store_be32(e, relative_offset)
    store_be32(e + 4, position)
    with nogil:
        err = _pwrite_all(fd, e, 8, <int64_t>slot * 8)
    if err:
        raise _os_error(err)


def write_time_entry(int fd, Py_ssize_t slot, int64_t timestamp, uint32_t relative_offset):
    """pwrite one .timeindex entry at ``slot`` of the index file; raises OSError."""
    cdef char e[12]
    cdef int err
    store_be64(e, <uint64_t>timestamp)
    store_be32(e + 8, relative_offset)
    with nogil:
        err = _pwrite_all(fd, e, 12, <int64_t>slot * 12)
    if err:
        raise _os_error(err)


# The index appends the leader's append path makes (SegmentState.index_batch, once per
# index.interval.bytes: every batch larger than that), without a Python frame: OffsetIndex.append
# and TimeIndex.maybe_append on their common case, reading and updating the same attributes. Any
# other case (a read-only or full index, an entry out of order, a value past its 32 bits, no
# mapping to read the last entry from) is left to those methods, which judge it (and raise).
cdef enum:
    INDEX_LEAVE = 0         # the Python method decides
    INDEX_ADDED = 1
    INDEX_NOT_NEEDED = 2    # time index only: the timestamp is not above the last entry's


cdef inline bint _u32(int64_t v) noexcept:
    return 0 <= v <= 0xFFFFFFFF


cdef int _last_entry_at(object mm, Py_ssize_t at, Py_ssize_t esize, char *out) except -1:
    # the entry at byte ``at`` of the index's mapping copied to ``out`` -> 1, or 0 when not mapped there
    cdef Py_buffer view
    if mm is None:
        return 0
    PyObject_GetBuffer(mm, &view, PyBUF_SIMPLE)
    try:
        if at < 0 or at + esize > view.len:
            return 0
        memcpy(out, <const char *>view.buf + at, esize)
        return 1
    finally:
        PyBuffer_Release(&view)


cdef int _pwrite_entry(int fd, const char *e, Py_ssize_t esize, int64_t at) except -1:
    # One small pwrite into the page cache: cheaper with the GIL held than handing it over and back.
    cdef int err = _pwrite_all(fd, e, esize, at)
    if err:
        raise _os_error(err)
    return 0


cdef int _offset_index_append(object idx, int64_t offset, int64_t position) except -1:
    # OffsetIndex.append(offset, position) -> INDEX_ADDED, or INDEX_LEAVE (nothing done). OSError as
    # append (entry not added).
    cdef int64_t entries = idx.entries
    cdef int64_t rel = offset - <int64_t>idx.base_offset
    cdef char e[8]
    if not idx.writable or entries >= <int64_t>idx._max_entries or not _u32(rel) or not _u32(position):
        return INDEX_LEAVE
    if entries:
        if not _last_entry_at(idx._mm, <Py_ssize_t>(entries - 1) * 8, 8, e):
            return INDEX_LEAVE
        if rel <= <int64_t>load_be32(e):
            return INDEX_LEAVE
    store_be32(e, <uint32_t>rel)
    store_be32(e + 4, <uint32_t>position)
    _pwrite_entry(idx._fd, e, 8, entries * 8)
    idx.entries = entries + 1
    return INDEX_ADDED


cdef int _time_index_append(object tix, int64_t timestamp, int64_t offset) except -1:
    # TimeIndex.maybe_append(timestamp, offset) -> INDEX_ADDED, INDEX_NOT_NEEDED, or INDEX_LEAVE
    # (nothing done). OSError as maybe_append (entry not added).
    cdef int64_t entries = tix.entries
    cdef int64_t base = tix.base_offset
    cdef int64_t rel = offset - base
    cdef char e[12]
    if entries:
        if not _last_entry_at(tix._mm, <Py_ssize_t>(entries - 1) * 12, 12, e):
            return INDEX_LEAVE
        if timestamp <= <int64_t>load_be64(e):
            return INDEX_NOT_NEEDED
        if offset < base + <int64_t>load_be32(e + 8):
            return INDEX_LEAVE
    if not tix.writable or entries >= <int64_t>tix._max_entries or not _u32(rel):
        return INDEX_LEAVE
    store_be64(e, <uint64_t>timestamp)
    store_be32(e + 8, <uint32_t>rel)
    _pwrite_entry(tix._fd, e, 12, entries * 12)
    tix.entries = entries + 1
    return INDEX_ADDED
