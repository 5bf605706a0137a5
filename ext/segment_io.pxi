# Included by segment.pyx: the file I/O every other room writes and reads through.
#
# Contract: GIL-free loops over write / writev / pwrite / pread that retry EINTR and short transfers
# and return 0 or the errno that stopped them (read_full: the bytes read, or -errno); a write that made
# no progress without an error counts as ENOSPC. Bytes written before a failure stay in the file: the
# caller truncates them away. _os_error turns such an errno into the OSError raised once the GIL is back.

cdef object _os_error(int err):
    # OSError for an errno that a GIL-free helper returned (errno itself may have changed since)
    import os
    return OSError(err, os.strerror(err))


cdef int _write_full(int fd, const char *p, Py_ssize_t left) noexcept nogil:
    # 0, or the errno that stopped it (bytes written until then stay: the caller truncates).
    cdef Py_ssize_t n
    while left > 0:
        n = write(fd, p, <size_t>left)
        if n < 0:
            if errno == EINTR:
                continue
            return errno
        if n == 0:              # no progress and no error: treat like a full disk
            return 28           # ENOSPC
        p += n
        left -= n
    return 0


cdef enum:
    IOV_BATCH = 1024            # IOV_MAX on Linux: iovecs per writev call


cdef int _writev_full(int fd, iovec *iov, Py_ssize_t cnt) noexcept nogil:
    # _write_full for ``cnt`` iovecs (consumed: a short write advances them in place).
    cdef Py_ssize_t n
    while cnt > 0:
        n = writev(fd, iov, <int>(cnt if cnt < IOV_BATCH else IOV_BATCH))
        if n < 0:
            if errno == EINTR:
                continue
            return errno
        if n == 0:
            return 28           # ENOSPC
        while cnt > 0 and n >= <Py_ssize_t>iov[0].iov_len:
            n -= <Py_ssize_t>iov[0].iov_len
            iov += 1
            cnt -= 1
        if n > 0:
            iov[0].iov_base = <char *>iov[0].iov_base + n
            iov[0].iov_len -= <size_t>n
    return 0


def write_all(int fd, buf):
    """Write all of ``buf`` to ``fd`` (retrying short writes and EINTR) without the GIL.

    Returns the number of bytes written (== len(buf)). Raises OSError on failure; bytes
    already written by then stay in the file and the caller must truncate them away."""
    cdef Py_buffer view
    cdef int err
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        with nogil:
            err = _write_full(fd, <const char *>view.buf, view.len)
        if err:
            raise _os_error(err)
        return view.len
    finally:
        PyBuffer_Release(&view)


cdef int _pwrite_all(int fd, const char *p, Py_ssize_t n, int64_t pos) noexcept nogil:
    # pwrite until done; 0 or errno.
    cdef Py_ssize_t w
    while n > 0:
        w = pwrite(fd, p, <size_t>n, <off_t>pos)
        if w < 0:
            if errno == EINTR:
                continue
            return errno
        if w == 0:
            return 28
        p += w
        n -= w
        pos += w
    return 0


cdef int read_full(int fd, char *buf, int64_t n, int64_t pos) noexcept nogil:
    # pread until n bytes or EOF; returns bytes read, or -errno.
    cdef int64_t got = 0
    cdef Py_ssize_t r
    while got < n:
        r = pread(fd, buf + got, <size_t>(n - got), <off_t>(pos + got))
        if r < 0:
            if errno == EINTR:
                continue
            return -errno
        if r == 0:
            break
        got += r
    return <int>got if got < 0x7FFFFFFF else 0x7FFFFFFF
