# kbroker._native.sendio: the cdef class it exports (an answer's send step, kbroker.network.connection).


# One piece of an answer: a bytes chunk (``data``) or a file range (``data`` NULL: ``fd`` from ``pos``).
ctypedef struct Piece:
    const char *data        # a bytes chunk's first byte; NULL for a file range
    int fd                  # a file range's descriptor
    long long pos           # a file range's first byte in the file
    Py_ssize_t length


# An answer's chunks as a C array of pieces and how far they have gone out: ``send`` resumes at
# piece ``index``, ``offset`` bytes in, with the GIL released (sendio.pyx's module doc has the contract).
cdef class SendCursor:
    cdef Piece *pieces
    cdef Py_buffer *views                   # a buffer view of each bytes chunk, released when freed
    cdef Py_ssize_t count, nviews           # pieces; views held
    cdef readonly Py_ssize_t index          # the piece being sent
    cdef readonly Py_ssize_t offset         # bytes of it already sent
    cdef readonly long long remaining       # bytes of the answer not yet sent
    cdef object chunks                      # the chunks, kept alive while their pieces are sent
    # sends until done / blocked / failed: a RUN_* code (sendio.pyx); counts file bytes and whole ranges
    cdef int _run(self, int sock_fd, long long *file_bytes, Py_ssize_t *ranges, int *err) noexcept nogil
