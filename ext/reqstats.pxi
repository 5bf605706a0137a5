# Included by request.pyx: request metrics, counted once per answered request on the loop thread.

# Bucket upper bounds in seconds: 2^(k/2) * 10 µs for k in 0..46 (the same numbers as
# kbroker.request_metrics.BOUNDS_S, which reads them from here).
DEF N_BOUNDS = 47
cdef double _BOUNDS[N_BOUNDS]
for _k in range(N_BOUNDS):
    _BOUNDS[_k] = 1e-5 * 2.0 ** (_k / 2.0)
BOUNDS_S = tuple(_BOUNDS[_k] for _k in range(N_BOUNDS))
N_BUCKETS = N_BOUNDS + 1
if sizeof((<TimeHistogram>None)._counts) != N_BUCKETS * sizeof(long long):
    raise ImportError("request.pxd TimeHistogram._counts must hold N_BUCKETS counters")


cdef inline Py_ssize_t _bucket(double x) noexcept:
    """bisect_left over the bounds: the first bucket whose bound is >= x (N_BOUNDS: overflow)."""
    cdef Py_ssize_t lo = 0, hi = N_BOUNDS, mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if _BOUNDS[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


cdef class TimeHistogram:
    """Fixed-bound histogram of durations in seconds: per-bucket counts (not cumulative) and a sum."""

    def __init__(self):
        memset(self._counts, 0, sizeof(self._counts))
        self.sum_s = 0.0

    cdef inline void add(self, double x):
        self._counts[_bucket(x)] += 1
        self.sum_s += x

    @property
    def counts(self):
        """The per-bucket counts, a new list."""
        return [self._counts[i] for i in range(N_BUCKETS)]

    def snapshot(self):
        return self.counts, self.sum_s


cdef class RequestStats:
    """RequestMetrics of one request type (Kafka's names in ``histograms``)."""

    def __init__(self, str name):
        self.name = name
        self.count = 0
        self.queue = TimeHistogram()
        self.local = TimeHistogram()
        self.remote = TimeHistogram()
        self.send = TimeHistogram()
        self.total = TimeHistogram()

    cpdef observe(self, double queue_s, double local_s, double send_s, double total_s):
        cdef double remote_s = total_s - queue_s - local_s - send_s
        if remote_s < 0.0:          # clock granularity: the parts may exceed the whole by a tick
            remote_s = 0.0
        self.count += 1
        self.queue.add(queue_s)
        self.local.add(local_s)
        self.remote.add(remote_s)
        self.send.add(send_s)
        self.total.add(total_s)

    def histograms(self):
        """Kafka's metric names -> histogram."""
        return {"RequestQueueTimeMs": self.queue, "LocalTimeMs": self.local, "RemoteTimeMs": self.remote,
                "ResponseSendTimeMs": self.send, "TotalTimeMs": self.total}
