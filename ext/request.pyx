"""Native request path: Produce (v3-11) and Fetch (v4-17) parsed straight from the request frame, served
natively when they are the common request, and the connection's read loop that dispatches them
(kbroker.network.connection). Every other request and version goes through the generic schema codec,
which stays the reference (tests/test_native_*).

One extension built from one include per concern, so calls between them stay direct C calls (request.pxd
declares every cdef class, by concern, as the table of contents; request.pyi is the Python API):

- wire.pxi          the codec: ProduceRequest / FetchRequest parsed from the frame, answers encoded
- reqstats.pxi      TimeHistogram, RequestStats: request metrics
- slots.pxi         Slot, begin_native / end_native: one request from frame to answer
- produce_path.pxi  FastLeader, FastProduce, ParkedProduce: the Produce fast path, acks=all parking
- fetch_path.pxi    FastFetch: the Fetch fast path, followers' positions and the high watermark
- lost.pxi          write-behind runs and rewriting the answers a failed write made wrong
- conn.pxi          ConnState, ReadStats: dispatch_frames, on_read / recv_ready, the answers written out

Parsing walks the frame once with bounds checks on every read: a native-range Produce/Fetch is walked
by its fast path (produce_path.pxi, fetch_path.pxi), which hands a request it does not serve to the
handler already parsed (parse_produce / parse_fetch finish what the walk does not take, from where it
stopped); parse_produce / parse_fetch parse a whole frame when no fast path runs. The result holds no dicts: a
``ProduceRequest`` with the header fields and ``topics`` = [(name, [(index, records), ...]), ...]
where ``records`` is a memoryview slice of the frame (None for a null batch) — the batch bytes are
never copied. Malformed input (truncation, a length past the frame, a negative non-null length,
invalid UTF-8, an array longer than the bytes left could hold, trailing bytes) raises
``ProtocolError``, on which the connection closes exactly as on the reference path.

Produce v3-8 and Fetch v4-11 are non-flexible: int16-length strings, int32-length arrays and records,
request header v1 (client_id nullable string), response header v0 (correlation id only). Produce v9+ and
Fetch v12+ are flexible: request header v2 (its tag buffer after client_id), compact strings, arrays and
records, a tag buffer after every struct, response header v1 (wire.pxi).
"""
from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.ref cimport PyObject, Py_DECREF, Py_INCREF, Py_XDECREF
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.errno cimport errno
from posix.time cimport CLOCK_MONOTONIC, CLOCK_REALTIME, clock_gettime, timespec
from posix.unistd cimport pread
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy, memset

cdef extern from "Python.h":
    int PyDict_Contains(object, object) except -1
    bint PyUnicode_IS_ASCII(object)
    Py_ssize_t PyUnicode_GET_LENGTH(object)
    void *PyUnicode_DATA(object)

from kbroker._native.hton cimport load_be16, load_be32, load_be64, store_be16, store_be32, store_be64
from kbroker._native.segment cimport (LeaderAppender, LogState, ReadBlock, ReadBlocks, SegmentState, run_begin,
                                      run_end, run_lost, seek_in, set_run_tag, tail_end, tail_position)
from errors cimport ERR_KAFKA_STORAGE_ERROR, ERR_REQUEST_TIMED_OUT
from layout cimport HEADER_SIZE

from kbroker._native.batch import BatchError

from kbroker.protocol.types import FileRegions, ProtocolError

include "wire.pxi"
include "reqstats.pxi"
include "slots.pxi"
include "produce_path.pxi"
include "fetch_path.pxi"
include "lost.pxi"
include "conn.pxi"
