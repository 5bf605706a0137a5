# Included by segment.pyx: the process's typed read-block cache (ReadBlock, ReadBlocks).
#
# Contract: one block per segment of at most block_size bytes read from a batch boundary, least
# recently used dropped first; a block holds only bytes below the size the segment had when read,
# which never change until a cut, and the segment drops its block (forget) on every cut or reload.
# LogSegment.read_bytes and the native Fetch path (ext/fetch_path.pxi) read through the same cache.

@cython.final
cdef class ReadBlock:
    """One segment's read block (fields in segment.pxd); made by ReadBlocks.load."""

    def __repr__(self):
        return f"ReadBlock(pos={self.pos}, {len(self.data)} bytes, floor={self.floor}, cursor={self.cursor})"


@cython.final
cdef class ReadBlocks:
    """The read blocks of the process: at most ``limit`` of at most ``block_size`` bytes, one per segment,
    the least recently used dropped first. A block holds file bytes below the size the segment had when
    it was read: those never change until the file is cut, and the segment drops its block (``forget``)
    on every cut or reload. Any thread may call; the dict is changed with the GIL held, and an eviction
    that loses a race with another thread's is left to the next load."""

    def __init__(self, Py_ssize_t limit, int64_t block_size):
        self.by_segment = {}
        self.limit = limit if limit > 0 else 0
        self.block_size = block_size

    cpdef ReadBlock get(self, seg):
        """``seg``'s block as it is (its place in the order unchanged), or None."""
        if not self.limit:
            return None
        return <ReadBlock>self.by_segment.get(seg)

    cpdef ReadBlock load(self, seg, int fd, int64_t pos, int64_t size):
        """Read ``seg``'s file (``fd``) from batch boundary ``pos`` (at most ``block_size`` bytes, up to
        ``size``) as its block, now the most recently used; None when no blocks are kept. A file cut
        underneath gives a shorter block (the caller's own read reports the cut)."""
        cdef int64_t want = size - pos
        cdef int got
        cdef bytes data
        cdef char *buf
        cdef ReadBlock block
        if not self.limit:
            return None
        if want > self.block_size:
            want = self.block_size
        if want < 0:
            want = 0
        data = PyBytes_FromStringAndSize(NULL, want)
        buf = PyBytes_AS_STRING(data)
        with nogil:
            got = read_full(fd, buf, want, pos)
        if got < 0:
            raise _os_error(-got)
        if got < want:
            data = data[:got]
        block = ReadBlock.__new__(ReadBlock)
        block.pos = pos
        block.data = data
        block.floor = <int64_t>load_be64(PyBytes_AS_STRING(data)) - 1 if got >= HEADER_SIZE else _I64_MAX
        block.cursor = pos
        block.cursor_floor = block.floor
        self.by_segment.pop(seg, None)
        self.by_segment[seg] = block
        if len(self.by_segment) > self.limit:
            try:
                del self.by_segment[next(iter(self.by_segment))]
            except (KeyError, RuntimeError):
                pass        # another thread's load moved the order meanwhile: evicted next time
        return block

    cpdef ReadBlock holding(self, seg, int fd, int64_t start, int64_t n, int64_t size):
        """The block holding ``seg``'s bytes [start, start + n) (a range a read placed below ``size``):
        its block, moved to the most recently used end, or a new one read at ``start``; None when no
        block can hold them (more than ``block_size``, no blocks kept, or the file was cut underneath:
        the caller reads the file itself)."""
        cdef ReadBlock block
        cdef dict blocks = self.by_segment
        if not self.limit or n > self.block_size:
            return None
        block = <ReadBlock>blocks.get(seg)
        if block is not None and start >= block.pos and start + n <= block.pos + len(block.data):
            if next(reversed(blocks)) is not seg:
                blocks[seg] = blocks.pop(seg)
            return block
        block = self.load(seg, fd, start, size)
        return block if len(block.data) >= n else None

    cpdef forget(self, seg):
        """Drop ``seg``'s block (its file was cut or reloaded)."""
        if self.by_segment:
            self.by_segment.pop(seg, None)
