# kbroker._native.tls: the cdef class it exports (native TLS reads, kbroker.network.tlsconn).

cdef extern from "openssl/ssl.h" nogil:
    ctypedef struct SSL:
        pass
    ctypedef struct BIO:
        pass
    int SSL_read_ex(SSL *s, void *buf, size_t num, size_t *readbytes)
    int SSL_get_error(const SSL *s, int ret)
    BIO *SSL_get_rbio(const SSL *s)
    BIO *SSL_get_wbio(const SSL *s)
    int BIO_write(BIO *b, const void *data, int dlen)
    BIO *BIO_new_mem_buf(const void *buf, int len)
    ctypedef struct BIO_METHOD:
        pass
    BIO *BIO_new(const BIO_METHOD *type)
    const BIO_METHOD *BIO_s_mem()
    long BIO_set_mem_eof_return(BIO *b, long v)
    size_t BIO_ctrl_pending(BIO *b)
    void SSL_set0_rbio(SSL *s, BIO *rbio)
    unsigned long OpenSSL_version_num()
    unsigned long HEADER_VERSION "OPENSSL_VERSION_NUMBER"
    enum:
        SSL_ERROR_WANT_READ
        SSL_ERROR_ZERO_RETURN
        SSL_ERROR_SYSCALL


cdef extern from "openssl/err.h" nogil:
    unsigned long ERR_get_error()
    void ERR_error_string_n(unsigned long e, char *buf, size_t len)
    void ERR_clear_error()


# One server-side TLS connection's native reads: ciphertext appended to its read BIO, records
# decrypted into the connection's receive views (tls.pyx's module doc has the contract).
cdef class TlsReader:
    cdef SSL *ssl
    cdef bint borrowed          # the SSL's read BIO is a read-only view of the ciphertext receive() was given
    cdef object keep            # the _ssl objects owning the pointers, alive as long as this reader
    cdef public bint paused     # the connection takes no bytes now: receive only appends
    cdef readonly unsigned long long bytes_read     # plaintext delivered
    cdef readonly unsigned long long calls          # receive/drain calls
    cdef int _drain(self, conn) except -1
