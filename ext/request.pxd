# C-level interface of kbroker._native.request: the parsed Produce request, for a native consumer
# (e.g. a future native append loop) to read without attribute lookups. See request.pyx.

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
    cdef readonly str rack_id
    # a follower's fetch whose positions the native path recorded (ReplicaManager.record_follower_fetch's
    # effect, nothing to read yet): the Fetch handler only long-polls it, recording nothing again
    cdef readonly bint recorded
    cdef readonly bytes frame               # the frame of a recorded fetch (FastFetch.reread); else None


cdef class TimeHistogram:
    # per bucket, not cumulative (request_metrics.BOUNDS_S; 48 = request.pyx N_BUCKETS): C counters, so
    # a request's five adds allocate no ints (``counts`` gives them as a list)
    cdef long long _counts[48]
    cdef public double sum_s
    cdef inline void add(self, double x)


cdef class RequestStats:
    cdef public str name
    cdef public long long count
    cdef public TimeHistogram queue, local, remote, send, total
    cpdef observe(self, double queue_s, double local_s, double send_s, double total_s)


cdef class Slot:
    cdef public object header               # RequestHeader, ProduceRequest or FetchRequest
    cdef readonly int api_key
    cdef public object chunks               # the encoded answer, NO_RESPONSE or CLOSE once done
    cdef public bint done
    cdef public bint follower
    cdef public double since, arrived, started, local, queued
    cdef public object lost                 # {(topic, partition): message}: rows whose appends were cut away
    cpdef observe(self, double sent)
