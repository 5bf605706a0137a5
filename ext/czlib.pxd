# Declarations of zlib's inflate API for cimport (batch.pyx: gzip validation on the general path;
# codec.pyx: streaming gzip validation). Both link -lz.

cdef extern from "zlib.h" nogil:
    ctypedef struct z_stream:
        const unsigned char *next_in
        unsigned int avail_in
        unsigned char *next_out
        unsigned int avail_out
    int inflateInit2(z_stream *strm, int window_bits)
    int inflate(z_stream *strm, int flush)
    int inflateReset(z_stream *strm)
    int inflateEnd(z_stream *strm)
    enum:
        Z_OK
        Z_STREAM_END
        Z_NO_FLUSH
        Z_BUF_ERROR
