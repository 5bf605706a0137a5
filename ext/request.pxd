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
