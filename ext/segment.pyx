"""Segment byte work for kbroker.log: appends, sparse-index search, batch walks, recovery, read blocks.

Contract
- Files: a segment `.log` is RecordBatch v2 batches back to back (61-byte header, layout.pxd);
  `.index` entries are 8 bytes (relative offset u32, position u32),
  `.timeindex` entries 12 bytes (timestamp i64, relative offset u32), all big-endian.
- Threads: every function here may be called from any thread; the byte loops (write, pread,
  CRC, binary search) run without the GIL. The callers in kbroker.log own the state and call
  from the broker's event-loop thread.
- State: LogState / SegmentState mirror the state the kbroker.log objects own (those objects hold
  them and keep the policy); the files stay the truth: a crash mid-call leaves at most a partial
  write, which the caller truncates away (append) or the recovery scan cuts off (restart). A
  write-behind run (run_begin .. run_end, LeaderAppender) defers writes: batches committed inside
  it are written by run_end, which its caller (kbroker._native.request dispatch_frames) reaches
  before any answer of the run is sent and before the buffers holding them can be reused.

One extension built from one include per concern, so calls between them stay direct C calls
(segment.pxd declares every cdef class and every C-level function other modules cimport, as the
table of contents; segment.pyi is the Python API):

- segment_io.pxi        write / writev / pwrite / pread loops without the GIL, errno -> OSError
- segment_append.pxi    append_leader: one producer batch checked, roll-checked, stamped, written
- segment_state.pxi     SegmentState: the active segment's append-time state; tail_position / tail_end
- segment_index.pxi     the sparse .index / .timeindex: lookup, sanity check, entry reads; IndexFile,
                        the append rule
- segment_walk.pxi      seek_batch / seek_batch_in / seek_in: header walks that position a read
- segment_scan.pxi      scan_batches: the recovery scan (CRC, offsets) of a segment file
- segment_logstate.pxi  LogState: Log's per-request C fields and the one high-watermark rule
- segment_leader.pxi    LeaderAppender and the write-behind run (run_begin .. run_end, run_lost)
- segment_blocks.pxi    ReadBlock / ReadBlocks: the process's typed cache of segment read blocks
"""
cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.pythread cimport PyThread_get_thread_ident
from libc.errno cimport EINTR, errno
from libc.stdint cimport int16_t, int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy, memmove
from posix.types cimport off_t
from posix.uio cimport iovec, writev
from posix.unistd cimport pread, pwrite, write

from hton cimport load_be16, load_be32, load_be64, store_be32, store_be64
from layout cimport *

from kbroker._native.batch cimport BatchInfo, check_for_append, parse_header, stamp

# Relative offsets are stored as u32 but Kafka reads them as a signed int, so a segment
# spans at most INT32_MAX offsets (Kafka's canConvertToRelativeOffset).
cdef int64_t MAX_RELATIVE = 0x7FFFFFFF

include "segment_io.pxi"
include "segment_append.pxi"
include "segment_state.pxi"
include "segment_index.pxi"
include "segment_walk.pxi"
include "segment_scan.pxi"
include "segment_logstate.pxi"
include "segment_leader.pxi"
include "segment_blocks.pxi"
