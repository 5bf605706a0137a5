# Included by segment.pyx: header walks that position a read (fetch start and end, translate_offset,
# offset_for_timestamp) from the file (seek_batch) or from bytes already in memory (seek_batch_in,
# seek_in: a read block, also the native Fetch path's).
#
# Contract: the walk starts at a batch boundary and trusts the headers (CRCs were checked on append or
# by recovery); it stops at the first batch meeting the target, or where the bytes it may read end.

# Header walks read this much at a time: a fetch or index translation walks at most about
# index.interval.bytes (4 KiB) of batches, so one read usually covers the whole walk.
cdef enum:
    WALK_CHUNK = 16384


def seek_batch(int fd, int64_t start, int64_t end, int64_t target_offset,
               int64_t limit_position, int64_t target_timestamp):
    """Walk batch headers from ``start`` (a batch boundary) towards ``end`` and stop at the
    first batch that satisfies any of: lastOffset >= target_offset, position + size >
    limit_position, maxTimestamp >= target_timestamp.

    Returns (position, size, base_offset, last_offset, max_timestamp) of that batch, or
    (position, 0, -1, -1, -1) when the walk reached ``end`` (or a torn header) first.
    Headers are trusted here (CRCs were checked on append or by recovery)."""
    cdef char chunk[WALK_CHUNK]
    cdef int64_t wstart = 0, wlen = 0, pos = start
    cdef int64_t base_off = -1, last_off = -1, max_ts = -1, size = 0
    cdef Py_ssize_t n
    cdef const char *h
    cdef int found = 0, err = 0
    with nogil:
        while pos + HEADER_SIZE <= end:
            if pos < wstart or pos + HEADER_SIZE > wstart + wlen:
                n = pread(fd, chunk, WALK_CHUNK, <off_t>pos)
                if n < 0:
                    if errno == EINTR:
                        continue
                    err = errno
                    break
                wstart = pos
                wlen = n
                if wlen < HEADER_SIZE:
                    break
            h = chunk + (pos - wstart)
            size = batch_size(h)
            if size < HEADER_SIZE or pos + size > end:
                break
            base_off = batch_base_offset(h)
            last_off = base_off + batch_last_offset_delta(h)
            max_ts = batch_max_timestamp(h)
            if (last_off >= target_offset or pos + size > limit_position
                    or max_ts >= target_timestamp):
                found = 1
                break
            pos += size
    if err:
        raise _os_error(err)
    if found:
        return (pos, size, base_off, last_off, max_ts)
    return (pos, 0, -1, -1, -1)


def seek_batch_in(bytes block not None, int64_t block_pos, int64_t start, int64_t end,
                  int64_t target_offset, int64_t limit_position):
    """seek_batch over file bytes already in memory: ``block`` holds the file from ``block_pos`` on,
    ``start`` is a batch boundary inside it. A batch counts once its header is in the block (it may
    end past the block). -> (position, size, base_offset, last_offset) of the first batch with
    lastOffset >= target_offset or position + size > limit_position, or (position, 0, -1, -1) where
    the walk stopped first: at ``end`` or at a header the block does not hold whole (``position`` is
    then the batch boundary to continue from)."""
    cdef int64_t size = 0, base_off = -1, last_off = -1
    cdef int64_t pos = seek_in(PyBytes_AS_STRING(block), block_pos, block_pos + PyBytes_GET_SIZE(block), start,
                               end, target_offset, limit_position, &size, &base_off, &last_off)
    return (pos, size, base_off, last_off)


cdef int64_t seek_in(const char *data, int64_t block_pos, int64_t block_end, int64_t start, int64_t end,
                     int64_t target_offset, int64_t limit_position, int64_t *size_out, int64_t *base_out,
                     int64_t *last_out) noexcept:
    # seek_batch_in over ``data`` (the file's bytes [block_pos, block_end)): the position, and the
    # batch's size (0: not found), base and last offsets through the pointers
    cdef int64_t pos = start, size, base_off, last_off
    cdef const char *h
    size_out[0] = 0
    base_out[0] = last_out[0] = -1
    if start < block_pos:
        return start
    while pos + HEADER_SIZE <= end and pos + HEADER_SIZE <= block_end:
        h = data + (pos - block_pos)
        size = batch_size(h)
        if size < HEADER_SIZE or pos + size > end:
            break
        base_off = batch_base_offset(h)
        last_off = base_off + batch_last_offset_delta(h)
        if last_off >= target_offset or pos + size > limit_position:
            size_out[0] = size
            base_out[0] = base_off
            last_out[0] = last_off
            return pos
        pos += size
    return pos
