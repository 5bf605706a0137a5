"""Native send step for answers made of bytes chunks and file ranges (sendfile Fetch answers).

kbroker.network.connection hands an answer's chunks (bytes-like objects and ``FileRegions``) to a
``SendCursor`` once, then calls ``cursor.send(sock_fd, metrics)`` each time the non-blocking socket is
writable. One call writes with the GIL released, piece after piece, until the answer is out (True) or
the socket is full (False): the would-block is a return code, not a raised ``BlockingIOError``, and the
cursor's position is an index into a C array of pieces plus an offset into the current one, so a resume
rebuilds no list and allocates nothing.

Pieces: a bytes chunk goes out with ``send`` (no ``MSG_MORE``: corking the header in front of the file
bytes cost broker CPU in the capacity A/B, docs/perf/fetch-capacity.md); a file range with ``sendfile``
from its own offset (the file's position is not used nor moved). Empty pieces are dropped.
A sendfile that returns 0 before its range is done means the file is shorter than the range the answer
promised (segment truncated underneath): ``ConnectionError``, the connection must close. Any other
failure is an ``OSError`` of its errno (``BrokenPipeError``, ``ConnectionResetError``...).

Metrics, as the reference path counted them: ``metrics.fetch_sendfile_bytes`` grows by the file bytes each
call sent, ``metrics.fetch_sendfile_calls`` by one per file range sent in full.

The cursor keeps a reference to the chunks (the file ranges' descriptors or file objects stay as
alive as they were with the reference path) and a buffer view of each bytes chunk until it is freed.
"""
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_CheckBuffer, PyObject_GetBuffer
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.errno cimport EAGAIN, EINTR, errno
from libc.string cimport strerror
from posix.types cimport off_t

cdef extern from "<errno.h>" nogil:
    int EWOULDBLOCK

cdef extern from "<sys/sendfile.h>" nogil:
    ssize_t sendfile(int out_fd, int in_fd, off_t *offset, size_t count)

cdef extern from "<sys/socket.h>" nogil:
    ssize_t send(int fd, const void *buf, size_t n, int flags)
    int MSG_NOSIGNAL


# what _run stopped on
cdef enum:
    RUN_DONE = 0
    RUN_BLOCKED = 1
    RUN_ERROR = 2
    RUN_SHORT = 3


cdef class SendCursor:
    """An answer's pieces and how far they have gone out (see the module doc; fields in sendio.pxd)."""

    def __cinit__(self, chunks):
        cdef Py_ssize_t total = 0, nbuf = 0, i = 0
        cdef Piece *p
        cdef long long pos, length
        self.chunks = chunks = list(chunks)
        for c in chunks:
            if PyObject_CheckBuffer(c):
                nbuf += 1
                total += 1
            else:
                total += len(c.regions)
        self.pieces = <Piece *>PyMem_Malloc(max(total, 1) * sizeof(Piece))
        self.views = <Py_buffer *>PyMem_Malloc(max(nbuf, 1) * sizeof(Py_buffer))
        if self.pieces == NULL or self.views == NULL:
            raise MemoryError()
        for c in chunks:
            if PyObject_CheckBuffer(c):
                PyObject_GetBuffer(c, &self.views[self.nviews], PyBUF_SIMPLE)
                self.nviews += 1
                if self.views[self.nviews - 1].len == 0:
                    continue
                p = &self.pieces[i]
                p.data = <const char *>self.views[self.nviews - 1].buf
                p.fd = -1
                p.pos = 0
                p.length = self.views[self.nviews - 1].len
                i += 1
                self.remaining += p.length
                continue
            for fd, pos, length in c.regions:
                if length < 0 or pos < 0:
                    raise ValueError(f"bad file range ({fd!r}, {pos}, {length})")
                if length == 0:
                    continue
                p = &self.pieces[i]
                p.data = NULL
                p.fd = fd if isinstance(fd, int) else fd.fileno()
                p.pos = pos
                p.length = length
                i += 1
                self.remaining += length
        self.count = i

    def __dealloc__(self):
        cdef Py_ssize_t k
        if self.views != NULL:
            for k in range(self.nviews):
                PyBuffer_Release(&self.views[k])
            PyMem_Free(self.views)
        PyMem_Free(self.pieces)

    @property
    def done(self):
        return self.index >= self.count

    def send(self, int sock_fd, metrics=None):
        """Write to the non-blocking ``sock_fd`` until the answer is out (-> True) or the socket would
        block (-> False; call again once it is writable). Raises on a failure (module doc)."""
        cdef long long file_bytes = 0
        cdef Py_ssize_t ranges = 0
        cdef int err = 0
        cdef int code
        with nogil:
            code = self._run(sock_fd, &file_bytes, &ranges, &err)
        if metrics is not None and (file_bytes or ranges):
            metrics.fetch_sendfile_bytes += file_bytes
            metrics.fetch_sendfile_calls += ranges
        if code == RUN_DONE:
            return True
        if code == RUN_BLOCKED:
            return False
        if code == RUN_SHORT:
            raise ConnectionError(f"short sendfile ({self.offset} < {self.pieces[self.index].length}): "
                                  "segment shrank")
        raise OSError(err, strerror(err).decode("utf-8", "replace"))

    cdef int _run(self, int sock_fd, long long *file_bytes, Py_ssize_t *ranges, int *err) noexcept nogil:
        cdef Piece *p
        cdef ssize_t n
        cdef off_t pos
        while self.index < self.count:
            p = &self.pieces[self.index]
            if p.data != NULL:
                n = send(sock_fd, p.data + self.offset, p.length - self.offset, MSG_NOSIGNAL)
            else:
                pos = <off_t>(p.pos + self.offset)
                n = sendfile(sock_fd, p.fd, &pos, p.length - self.offset)
            if n < 0:
                if errno == EINTR:
                    continue
                if errno == EAGAIN or errno == EWOULDBLOCK:
                    return RUN_BLOCKED
                err[0] = errno
                return RUN_ERROR
            if n == 0 and p.data == NULL:
                return RUN_SHORT
            self.offset += n
            self.remaining -= n
            if p.data == NULL:
                file_bytes[0] += n
            if self.offset == p.length:
                if p.data == NULL:
                    ranges[0] += 1
                self.index += 1
                self.offset = 0
        return RUN_DONE
