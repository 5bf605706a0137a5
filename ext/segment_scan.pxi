# Included by segment.pyx: the recovery scan of a segment file (scan_batches).
#
# Contract: every batch between two positions is checked (whole header, length within the file,
# magic 2, CRC32C, offsets increasing and within the segment's u32 range) in large reads without the
# GIL; the scan stops at the first bad batch and says why (SCAN_*). The caller (LogSegment.recover)
# truncates the file to the valid end and rebuilds the indexes from the returned headers.

# Recovery reads big chunks so CRC work dominates syscalls; a larger batch gets its own buffer.
cdef enum:
    SCAN_CHUNK = 1048576

# Why a scan stopped (scan_batches' third result).
SCAN_OK = 0
SCAN_SHORT_HEADER = 1     # fewer than 61 bytes left: torn tail
SCAN_BAD_LENGTH = 2       # batchLength too small or runs past the end of the file
SCAN_BAD_MAGIC = 3
SCAN_BAD_CRC = 4
SCAN_BAD_OFFSET = 5       # offsets not increasing, or out of the segment's u32 range
SCAN_IO_ERROR = 6


# A scanned batch kept until the GIL is back: its position and a copy of its header.
cdef struct BatchRec:
    int64_t position
    char header[HEADER_SIZE]


def scan_batches(int fd, int64_t start, int64_t end, int64_t segment_base,
                 int64_t min_offset, bint check_crc=True):
    """Validate the batches of a segment file between ``start`` and ``end``.

    Checks per batch: a full 61-byte header, batchLength within the file, magic 2, CRC32C
    over [21, end) (when check_crc), base offset >= min_offset and > the previous batch's
    last offset, and both offsets within the segment's u32 relative range.

    Returns (valid_end, batches, reason): valid_end is the position just past the last good
    batch, batches a list of kbroker._native.batch.BatchInfo (``position`` = file position),
    and reason a SCAN_* code (SCAN_OK when the scan reached ``end`` exactly)."""
    cdef char *buf = NULL
    cdef int64_t cap = SCAN_CHUNK
    cdef int64_t wstart = start, wlen = 0, pos = start, size, got
    cdef int64_t next_min = min_offset
    cdef const char *h
    cdef BatchRec *recs = NULL
    cdef BatchRec *grown
    cdef Py_ssize_t nrec = 0, caprec = 1024, i
    cdef int reason = 0
    cdef char *nb
    cdef BatchRec *r
    cdef int64_t base_offset, last_offset
    buf = <char *>malloc(<size_t>cap)
    recs = <BatchRec *>malloc(sizeof(BatchRec) * caprec)
    if buf == NULL or recs == NULL:
        free(buf)
        free(recs)
        raise MemoryError()
    try:
        with nogil:
            while pos < end:
                if end - pos < HEADER_SIZE:
                    reason = 1
                    break
                # Make sure the header is in the window.
                if pos + HEADER_SIZE > wstart + wlen:
                    got = read_full(fd, buf, min(cap, end - pos), pos)
                    if got < 0:
                        reason = 6
                        break
                    wstart = pos
                    wlen = got
                    if wlen < HEADER_SIZE:
                        reason = 1
                        break
                h = buf + (pos - wstart)
                size = batch_size(h)
                if size < HEADER_SIZE or pos + size > end:
                    reason = 2
                    break
                if batch_magic(h) != MAGIC_V2:
                    reason = 3
                    break
                # Make sure the whole batch is in the window (grow for big batches).
                if pos + size > wstart + wlen:
                    if size > cap:
                        nb = <char *>realloc(buf, <size_t>size)
                        if nb == NULL:
                            reason = 6
                            break
                        buf = nb
                        cap = size
                    got = read_full(fd, buf, min(cap, end - pos), pos)
                    if got < size:
                        reason = 6 if got < 0 else 2
                        break
                    wstart = pos
                    wlen = got
                    h = buf
                if check_crc:
                    if batch_crc(h, size) != batch_stored_crc(h):
                        reason = 4
                        break
                base_offset = batch_base_offset(h)
                last_offset = base_offset + batch_last_offset_delta(h)
                if (base_offset < next_min or last_offset < base_offset
                        or base_offset - segment_base < 0
                        or last_offset - segment_base > MAX_RELATIVE):
                    reason = 5
                    break
                if nrec == caprec:
                    grown = <BatchRec *>realloc(recs, sizeof(BatchRec) * caprec * 2)
                    if grown == NULL:
                        reason = 6
                        break
                    recs = grown
                    caprec *= 2
                r = &recs[nrec]
                r.position = pos
                memcpy(r.header, h, HEADER_SIZE)
                nrec += 1
                next_min = last_offset + 1
                pos += size
        out = []
        for i in range(nrec):
            out.append(parse_header(recs[i].header, <Py_ssize_t>recs[i].position))
        return (pos, out, reason)
    finally:
        free(buf)
        free(recs)
