# kbroker._native.request: every cdef class it exports, by the include that implements it (request.pyx
# lists the includes). Fields a class keeps private are still declared here: Cython needs one place.
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t

from kbroker._native.segment cimport LeaderAppender, LogState, ReadBlocks, SegmentState


cdef enum:
    FAST_PARTS = 64     # partitions of one request the Produce fast path takes (more: the reference path)


# ---- wire.pxi: the parsed requests -------------------------------------------------------------------

cdef class ProduceRequest:
    cdef readonly int api_key
    cdef readonly int api_version
    cdef readonly int correlation_id
    cdef readonly object client_id          # str or None
    cdef readonly object transactional_id   # str or None
    cdef readonly int acks
    cdef readonly int timeout_ms
    # [(topic name, [(partition index, records memoryview into the frame or None), ...]), ...]
    cdef readonly list topics


cdef class FetchRequest:
    cdef readonly int api_key
    cdef readonly int api_version
    cdef readonly int correlation_id
    cdef readonly object client_id          # str or None
    cdef readonly int replica_id
    cdef readonly int max_wait_ms
    cdef readonly int min_bytes
    cdef readonly int max_bytes
    cdef readonly int isolation_level
    cdef readonly int session_id
    cdef readonly int session_epoch
    # [(topic, [(partition, current_leader_epoch, fetch_offset, log_start_offset, partition_max_bytes)])]
    cdef readonly list topics
    cdef readonly list forgotten            # forgotten_topics_data: [(topic, [partition, ...])]
    cdef readonly str rack_id
    # a follower's fetch whose positions the native path recorded (ReplicaManager.record_follower_fetch's
    # effect, nothing to read yet): the Fetch handler only long-polls it, recording nothing again
    cdef readonly bint recorded
    cdef readonly bytes frame               # the frame of a recorded fetch (FastFetch.reread); else None


# The codec's cursors, shared by the fast paths' includes (module helpers, not API). A read past the
# frame's end raises ProtocolError; a write is preceded by a ``reserve`` of its bytes.
cdef class _Reader:
    cdef const unsigned char *p             # the frame's bytes (inside ``view``)
    cdef Py_ssize_t pos                     # the next byte to read
    cdef Py_ssize_t end
    cdef Py_buffer view                     # the frame's buffer, held while the reader lives
    cdef bint held                          # ``view`` is held (released when the reader is freed)
    cdef inline int need(self, Py_ssize_t n) except -1
    cdef inline int16_t i16(self) except? -1
    cdef inline int32_t i32(self) except? -1
    cdef inline int64_t i64(self) except? -1
    cdef inline int8_t i8(self) except? -1
    cdef object string(self, bint nullable)
    # a non-null array's length, refused when ``elem_min`` bytes per element cannot fit in the rest
    cdef int32_t array_len(self, Py_ssize_t elem_min) except? -1


cdef class _Writer:
    cdef bytearray buf                      # the encoded bytes, grown by ``reserve``
    cdef char *p                            # buf's first byte (moves when it grows)
    cdef Py_ssize_t pos                     # the next byte to write
    cdef Py_ssize_t cap                     # len(buf)
    cdef int reserve(self, Py_ssize_t n) except -1
    cdef inline void i16(self, int16_t x) noexcept
    cdef inline void i32(self, int32_t x) noexcept
    cdef inline void i64(self, int64_t x) noexcept
    cdef int string(self, object s, bint nullable) except -1


# ---- reqstats.pxi: request metrics ------------------------------------------------------------------

cdef class TimeHistogram:
    # per bucket, not cumulative (request_metrics.BOUNDS_S; 48 = reqstats.pxi N_BOUNDS + 1): C counters,
    # so a request's five adds allocate no ints (``counts`` gives them as a list)
    cdef long long _counts[48]
    cdef public double sum_s                # seconds observed in total
    cdef inline void add(self, double x)


cdef class RequestStats:
    cdef public str name                    # the request's metric name (Produce, FetchConsumer, ...)
    cdef public long long count             # requests observed
    cdef public TimeHistogram queue, local, remote, send, total     # Kafka's five request times
    cpdef observe(self, double queue_s, double local_s, double send_s, double total_s)


# ---- slots.pxi: one request from its frame to its answer ---------------------------------------------

cdef class Slot:
    cdef public object header               # RequestHeader, ProduceRequest or FetchRequest
    cdef readonly int api_key
    cdef public object chunks               # the encoded answer, NO_RESPONSE or CLOSE once done
    cdef public bint done                   # the answer is in ``chunks``
    cdef public bint follower               # a follower's Fetch (FetchFollower stats)
    cdef public double since, arrived, started, local, queued   # the request's clock readings
    cdef public object lost                 # {(topic, partition): message}: rows whose appends were cut away
    cpdef observe(self, double sent)


# ---- produce_path.pxi: the Produce fast path -----------------------------------------------------------

cdef class FastLeader:
    cdef readonly object partition          # the Partition this broker leads
    cdef readonly object config             # its LogConfig
    cdef readonly object tp                 # (topic, partition index), the Partition's own tuple
    cdef readonly object follower_key       # the key a follower's long poll waits on
    cdef readonly object epoch_cache        # the Log's leader-epoch cache
    cdef readonly LogState log              # the Log's C state
    cdef object seg                         # the LogSegment whose SegmentState ``st`` is (the active one)
    cdef SegmentState st                    # the active segment's C state, re-read after a roll
    cdef LeaderAppender ap                  # the Log's plain leader append
    cdef object waiters                     # Partition.waiters (deque, never replaced)
    cdef dict tails                         # Log.append_tails (never replaced)
    cdef int32_t epoch                      # the leader epoch
    cdef bint followers                     # replicas beyond this one: wake their long polls
    cdef bint alone                         # ISR = this leader, min.insync.replicas <= 1: the HW follows
                                            # the log end, and acks=-1 is answered at once
    cdef bint park                          # ISR with followers, >= min.insync.replicas, not stale: acks=-1
                                            # is appended and waits for the HW (ParkedProduce)
    cdef bint append_time                   # LogAppendTime topic


cdef class FastProduce:
    cdef object reference_path              # the reference path's handler: reference_path(conn, req)
    cdef object rearm                       # rearm(tp): the ReplicaManager re-evaluates a slot (config changed)
    cdef object write_failed                # produce.fast_write_failed (bound to the broker): a write failed
    cdef dict leaders                       # topic -> {partition index: FastLeader} (arm_leader / disarm_leader)
    cdef dict messages_in, bytes_in         # BrokerMetrics' per-topic counts (never replaced)
    cdef dict notify                        # AppendNotifier.waiters (never replaced)
    cdef object appended                    # AppendNotifier.appended
    cdef dict failing_dirs                  # ReplicaManager._failing_dirs (never replaced)
    cdef int64_t big                        # AppendThreads.write_offload_bytes
    cdef bint off_loop                      # AppendThreads.validates_off_loop
    cdef object produce_failed              # BrokerMetrics.produce_failed: a parked row that failed
    cdef readonly long long fast, reference # requests served natively / through ``reference_path``


cdef class ParkedProduce:
    cdef readonly object future             # its result: the encoded answer ([bytes])
    cdef readonly object timer              # the timeout_ms timer (``expire``)
    cdef object produce_failed              # BrokerMetrics.produce_failed
    cdef list tps                           # per partition, request order: its tp (the Partition's own tuple)
    cdef list names                         # per topic: its name
    cdef int version                        # the request's Produce version
    cdef int32_t correlation_id, n, n_topics    # the request's; its partitions; its topics
    cdef readonly int32_t remaining         # partitions not decided yet
    cdef int32_t t_parts[FAST_PARTS]        # per topic: its partitions
    cdef int32_t index[FAST_PARTS]          # per partition: its index
    cdef int32_t topic[FAST_PARTS]          # per partition: its topic's position in ``names``
    cdef int16_t code[FAST_PARTS]           # per partition: its error code, or -1 while it waits
    cdef int64_t base[FAST_PARTS]           # per partition: base offset, append time, log start answered
    cdef int64_t time[FAST_PARTS]
    cdef int64_t start[FAST_PARTS]
    cpdef decide(self, tp, int error_code)
    cdef object _decide(self, int32_t k, int error_code)
    cdef bytes _encode(self)


# ---- fetch_path.pxi: the Fetch fast path ---------------------------------------------------------------

cdef class FastFetch:
    cdef object reference_path              # the reference path's handler: reference_path(conn, req)
    cdef object rearm                       # rearm(tp): the ReplicaManager re-evaluates a slot
    cdef dict leaders                       # the armed leader slots, shared with FastProduce
    cdef dict bytes_out                     # BrokerMetrics' BytesOut per topic (never replaced)
    cdef dict config_values                 # the BrokerConfig's typed values (fetch.max.bytes)
    cdef ReadBlocks blocks                  # the process's read blocks (kbroker.log.segment.read_blocks)
    cdef int32_t local_id                   # this broker's id
    cdef dict topic_configs                 # LogManager.topic_configs (topic -> overrides; never replaced)
    cdef object complete                    # ReplicaManager._complete: a follower's fetch moved the HW
    cdef object broker_metrics              # BrokerMetrics (replication_bytes_out)
    cdef readonly long long fast, reference # requests served natively / through ``reference_path``
    # followers' fetches: answered here / positions recorded here, then Python's long poll / all Python
    cdef readonly long long follower_fast, follower_polled, follower_reference


# ---- conn.pxi: the connection read loop ------------------------------------------------------------------

cdef class ReadStats:
    cdef public long long native            # reads served by on_read
    cdef public long long reference         # reads served by the connection's Python (the reference path)


cdef class ConnState:
    cdef public object transport            # the asyncio / uvloop transport
    cdef public object server               # the KafkaServer
    cdef public object loop                 # the event loop
    cdef public object _chunk               # the receive chunk being read into
    cdef public object _frame               # the buffer of its own (mmap) of a large frame being received
    cdef public object _next                # the memoryview handed to the kernel by get_buffer
    cdef public object partial_since        # loop time of the first byte of a frame not yet complete
    cdef public object _pending             # deque of the requests' Slots, in arrival order
    cdef public object _reads               # the server's ReadStats
    cdef public bint closed                 # the connection is closed
    cdef public bint _in_read               # inside one read's dispatch: answers wait for its end
    cdef public bint _writing               # an answer is being sent (the next ones queue behind it)
    cdef public bint _loop_clock_is_monotonic   # loop.time() is CLOCK_MONOTONIC (the clocks agree)
    cdef public bint _direct_write          # on_read may send on the socket itself (asyncio's transport)
    cdef public Py_ssize_t _start, _end     # the chunk's first unparsed byte; the end of its received bytes
    cdef public Py_ssize_t _frame_need      # size of a large frame waiting for pool memory
    cdef public Py_ssize_t max_frame        # the largest frame accepted (socket.request.max.bytes)
    # the server's, fixed when it starts (copied here: an attribute of the server costs a dict lookup
    # per request): the native handlers (None when the native path is off), NetworkMetrics.requests
    # (requests counted per key and version) and the sendfile threshold
    cdef public object _native_produce, _native_fetch
    cdef public dict _request_counts
    cdef public long long _sendfile_min
    cdef public double last_active, _read_at    # the last read's loop time and clock reading
    cdef public int _sock_fd                # the socket's descriptor (direct sends; -1: none)
    # authorization (kbroker/server/apis/authz.py): the topics this connection may Write / Read and whether
    # it holds ClusterAction, as decided so far; None without an authorizer (the native path checks nothing)
    cdef public object _acl_write, _acl_read
    cdef public bint _acl_cluster
