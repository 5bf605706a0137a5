"""Native TLS reads: the records of a server-side ``ssl.SSLObject`` decrypted straight into a connection's
receive buffer, many records per call (kbroker.network.tlsconn).

Python's ``ssl`` reads one TLS record (at most 16 KiB) per ``SSLObject.read`` call, a Python call, a copy
out of the incoming memory BIO and OpenSSL's per-call work each time. ``TlsReader.receive`` takes the
ciphertext of one socket read, appends it to the SSL object's read BIO (``BIO_write``) and loops
``SSL_read_ex`` into the connection's next receive view (``conn._next``) until OpenSSL wants more
ciphertext, handing every filled view to ``conn.buffer_updated`` (the native read path's ``on_read``), with
the GIL released around the OpenSSL calls.

Python exposes neither the ``SSL*`` nor the ``BIO*``: they are read from CPython's private objects
(``_ssl._SSLSocket``: after the object head ``PyObject *Socket; SSL *ssl``; ``_ssl.MemoryBIO``: after the
head ``BIO *bio``) only after a proof that they are what they claim: the types are those of ``_ssl``
and large enough, and ``SSL_get_rbio``/``SSL_get_wbio`` of the SSL pointer are the two BIO pointers.
``library_problem`` checks, once per process, that one libssl is loaded, that ``_ssl`` resolves
``SSL_read_ex`` to the function this module calls and that its version has the headers' major.minor.
Any failed check raises ``TlsUnsupported`` (the caller reads through Python's ``ssl``), never a crash.

Handshake, writes and shutdown stay with Python's ``ssl``; they run on the same thread as ``receive``
(the event loop's), so the SSL object is never used by two threads at once.
"""
from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from libc.string cimport strlen

# The heads of CPython's _ssl objects, as far as they are read (see the module doc).
cdef extern from *:
    """
    #include <openssl/ssl.h>
    typedef struct { PyObject_HEAD PyObject *kb_socket; SSL *ssl; } kb_ssl_socket_head;
    typedef struct { PyObject_HEAD BIO *bio; } kb_memory_bio_head;
    """
    ctypedef struct kb_ssl_socket_head:
        SSL *ssl
    ctypedef struct kb_memory_bio_head:
        BIO *bio

cdef extern from "dlfcn.h" nogil:
    ctypedef struct Dl_info:
        const char *dli_fname
    void *dlopen(const char *filename, int flags)
    void *dlsym(void *handle, const char *symbol)
    int dlclose(void *handle)
    int dladdr(const void *addr, Dl_info *info)
    enum:
        RTLD_NOW
        RTLD_NOLOAD

cdef extern from "link.h" nogil:
    struct dl_phdr_info:
        const char *dlpi_name
    int dl_iterate_phdr(int (*callback)(dl_phdr_info *info, size_t size, void *data) noexcept nogil, void *data)

# receive/drain outcomes
WANT_READ = 0       # every byte of ciphertext consumed: read the socket again
STOPPED = 1         # the connection closed, paused reading or has no buffer: call drain() when it resumes
CLOSE_NOTIFY = 2    # the peer closed its side of TLS


class TlsUnsupported(Exception):
    """The native reader cannot be used here (the reason is the message): read through Python's ssl."""


class TlsError(Exception):
    """OpenSSL refused the incoming bytes (a corrupted or forged record, a protocol violation): fatal."""


cdef int _count_libssl(dl_phdr_info *info, size_t size, void *data) noexcept nogil:
    cdef const char *name = info.dlpi_name
    cdef size_t n, i
    if name == NULL:
        return 0
    n = strlen(name)
    i = n
    while i > 0 and name[i - 1] != b'/':
        i -= 1
    if n - i >= 9 and name[i] == b'l' and name[i + 1] == b'i' and name[i + 2] == b'b' and name[i + 3] == b's' \
            and name[i + 4] == b's' and name[i + 5] == b'l' and name[i + 6] == b'.' and name[i + 7] == b's' \
            and name[i + 8] == b'o':
        (<int *>data)[0] += 1
    return 0


def library_problem(str ssl_module_file, unsigned long python_version_number):
    """Why this module's OpenSSL may not drive the SSL objects of Python's ``_ssl`` (loaded from
    ``ssl_module_file``, reporting ``python_version_number``: ``ssl.OPENSSL_VERSION_NUMBER``), or None
    when it may: one libssl in the process, ``_ssl`` resolving ``SSL_read_ex`` to ours, and the running
    library, ``_ssl``'s and the headers of this build agreeing on major.minor."""
    cdef int libs = 0
    cdef void *handle
    cdef void *theirs
    cdef Dl_info info
    cdef unsigned long running = OpenSSL_version_num()
    dl_iterate_phdr(_count_libssl, &libs)
    if libs != 1:
        return f"{libs} libssl libraries loaded in the process (one is required)"
    if (running >> 20) != (HEADER_VERSION >> 20):
        return f"OpenSSL running {running:#x} differs in major.minor from the headers built against {HEADER_VERSION:#x}"
    if running != python_version_number:
        return f"Python's ssl reports OpenSSL {python_version_number:#x}, this module runs {running:#x}"
    handle = dlopen(ssl_module_file.encode(), RTLD_NOW | RTLD_NOLOAD)
    if handle == NULL:
        return f"{ssl_module_file} is not loaded"
    theirs = dlsym(handle, "SSL_read_ex")
    dlclose(handle)
    if theirs == NULL:
        return "Python's _ssl does not resolve SSL_read_ex (OpenSSL linked statically)"
    if theirs != <void *>SSL_read_ex:
        where = "?"
        if dladdr(theirs, &info) and info.dli_fname != NULL:
            where = (<bytes>info.dli_fname).decode(errors="replace")
        return f"Python's _ssl resolves SSL_read_ex in {where}, not in this module's libssl"
    return None


cdef str _error_text(int err):
    # the first error of OpenSSL's queue (the cause), then the queue cleared: Python's ssl must not
    # find our errors on its next call
    cdef unsigned long e = ERR_get_error()
    cdef char buf[256]
    if e == 0:
        ERR_clear_error()
        if err == SSL_ERROR_SYSCALL:
            return "TLS stream ended unexpectedly"
        return f"TLS read failed (SSL_get_error {err})"
    ERR_error_string_n(e, buf, sizeof(buf))
    ERR_clear_error()
    return (<bytes>buf).decode(errors="replace")


cdef class TlsReader:
    """The native reads of one server-side TLS connection: ``TlsReader(sslobj, incoming, outgoing)``
    with the ``ssl.SSLObject`` made by ``SSLContext.wrap_bio(incoming, outgoing, server_side=True)``.
    Raises ``TlsUnsupported`` when the pointer proof fails. ``paused`` is set while the connection does
    not want its bytes (``receive`` then only appends the ciphertext; ``drain`` delivers it later)."""

    def __cinit__(self, sslobj, incoming, outgoing):
        cdef SSL *ssl
        cdef BIO *rbio
        cdef BIO *wbio
        inner = getattr(sslobj, "_sslobj", None)
        for obj, name, size in ((inner, "_SSLSocket", sizeof(kb_ssl_socket_head)),
                                (incoming, "MemoryBIO", sizeof(kb_memory_bio_head)),
                                (outgoing, "MemoryBIO", sizeof(kb_memory_bio_head))):
            t = type(obj)
            if t.__module__ != "_ssl" or t.__name__ != name or t.__basicsize__ < <Py_ssize_t>size:
                raise TlsUnsupported(f"not an _ssl.{name} of the expected layout: {t.__module__}.{t.__name__}")
        ssl = (<kb_ssl_socket_head *><void *>inner).ssl
        rbio = (<kb_memory_bio_head *><void *>incoming).bio
        wbio = (<kb_memory_bio_head *><void *>outgoing).bio
        if ssl == NULL or rbio == NULL or wbio == NULL or SSL_get_rbio(ssl) != rbio or SSL_get_wbio(ssl) != wbio:
            raise TlsUnsupported("the SSL object's BIOs are not the memory BIOs given")
        self.ssl = ssl
        self.keep = (inner, incoming, outgoing)

    def receive(self, data, Py_ssize_t nbytes, conn):
        """The first ``nbytes`` of ``data`` (ciphertext from the socket) given to the SSL object, then
        ``drain(conn)``. When its read BIO is empty (the common case) OpenSSL reads ``data`` in place
        through a read-only BIO, with no copy into a memory BIO; what it has not read when this returns
        (the connection paused) is copied into a memory BIO of its own, as ``data`` is reused."""
        cdef Py_buffer pb
        cdef BIO *rbio
        cdef BIO *own
        cdef size_t left
        cdef int written = 0
        PyObject_GetBuffer(data, &pb, PyBUF_SIMPLE)
        try:
            if nbytes < 0 or nbytes > pb.len or nbytes > 0x7fffffff:
                raise ValueError(f"nbytes {nbytes} outside the buffer of {pb.len}")
            if nbytes == 0:
                return self._drain(conn)
            rbio = SSL_get_rbio(self.ssl)
            if BIO_ctrl_pending(rbio) == 0:
                rbio = BIO_new_mem_buf(pb.buf, <int>nbytes)
                if rbio == NULL:
                    raise MemoryError("cannot make a TLS read BIO")
                BIO_set_mem_eof_return(rbio, -1)   # empty: want more, not EOF
                SSL_set0_rbio(self.ssl, rbio)      # frees the previous one (Python's holds its own reference)
                self.borrowed = True
            else:
                with nogil:
                    written = BIO_write(rbio, pb.buf, <int>nbytes)
                if written != nbytes:
                    ERR_clear_error()
                    raise MemoryError("cannot append ciphertext to the TLS read BIO")
            try:
                return self._drain(conn)
            finally:
                if self.borrowed:
                    self.borrowed = False
                    rbio = SSL_get_rbio(self.ssl)
                    left = BIO_ctrl_pending(rbio)
                    own = BIO_new(BIO_s_mem())
                    if own == NULL:
                        raise MemoryError("cannot make a TLS read BIO")
                    BIO_set_mem_eof_return(own, -1)
                    if left and BIO_write(own, <char *>pb.buf + nbytes - left, <int>left) != <int>left:
                        ERR_clear_error()
                        raise MemoryError("cannot keep ciphertext in the TLS read BIO")
                    SSL_set0_rbio(self.ssl, own)
        finally:
            PyBuffer_Release(&pb)

    def drain(self, conn):
        """Decrypt what the read BIO holds into ``conn._next`` views, calling ``conn.buffer_updated(n)``
        for each filled one, until OpenSSL wants more ciphertext (``WANT_READ``), the connection stops
        taking bytes (``STOPPED``: closed, ``paused`` or no buffer) or the peer sent close_notify
        (``CLOSE_NOTIFY``). A record OpenSSL refuses raises ``TlsError`` (the bytes before it delivered)."""
        return self._drain(conn)

    cdef int _drain(self, conn) except -1:
        cdef Py_buffer pb
        cdef size_t got = 0, filled, room
        cdef int ret, err
        cdef char *p
        self.calls += 1
        while True:
            if self.paused or conn.closed:
                return STOPPED
            view = conn._next
            if view is None:
                return STOPPED
            PyObject_GetBuffer(view, &pb, PyBUF_WRITABLE)
            filled = 0
            err = 0
            try:
                room = <size_t>pb.len
                if room == 0:
                    return STOPPED
                p = <char *>pb.buf
                with nogil:
                    while filled < room:
                        ret = SSL_read_ex(self.ssl, p + filled, room - filled, &got)
                        if ret <= 0:
                            err = SSL_get_error(self.ssl, ret)
                            break
                        filled += got
            finally:
                PyBuffer_Release(&pb)
            if err != 0 and err != SSL_ERROR_WANT_READ and err != SSL_ERROR_ZERO_RETURN:
                msg = _error_text(err)
            else:
                msg = None
            if filled:
                self.bytes_read += filled
                conn.buffer_updated(filled)
            if err == 0:
                continue            # the view is full: the connection's next one
            if err == SSL_ERROR_WANT_READ:
                return WANT_READ
            if err == SSL_ERROR_ZERO_RETURN:
                return CLOSE_NOTIFY
            raise TlsError(msg)
