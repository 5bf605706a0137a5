# Included by request.pyx: one Slot per request, from its frame to its answer being sent.

# The registry's dict (api key -> RequestStats, kbroker.request_metrics.REQUEST_STATS.by_key: cleared,
# never replaced) and its get() for the misses (first request of a key, FetchFollower). Bound once by
# request_metrics at import.
cdef dict _stats_by_key = {}
cdef object _stats_get = None


def bind_request_stats(dict by_key, get):
    """Where ``Slot.observe`` counts: the registry's dict and its ``get(api_key, follower)``."""
    global _stats_by_key, _stats_get
    _stats_by_key = by_key
    _stats_get = get


cdef class Slot:
    """One request of a connection, from its frame to its answer's last byte. Request metrics
    (kbroker.request_metrics), monotonic seconds: arrived (frame complete) -> started (handler called)
    -> local (handler returned; its awaitable's wait is "remote") -> queued (answer handed to the send
    path) -> observed once the last byte was given to the socket/transport. A C type: created and
    observed once per request on the loop thread, where a Python class cost two interpreter frames
    (``__init__``, ``observe``) per request."""

    def __init__(self, header, double since, double arrived):
        self.header = header
        self.api_key = header.api_key
        self.since = since      # loop time the request arrived (the sweeper closes requests that never end)
        self.arrived = arrived
        self.started = arrived
        self.local = 0.0
        self.queued = arrived
        # chunks None, done and follower (a Fetch from a replica: FetchFollower) False: a new object's
        # fields (tp_alloc zeroes them; Cython sets object fields to None)

    cpdef observe(self, double sent):
        cdef object stats = None
        if not self.follower:
            stats = _stats_by_key.get(self.api_key)
        if stats is None:
            stats = _stats_get(self.api_key, self.follower)
        (<RequestStats?>stats).observe(self.started - self.arrived, self.local, sent - self.queued,
                                       sent - self.arrived)


def observe_slots(list slots, double sent):
    """``Slot.observe(sent)`` of every slot in ``slots`` (answers that left in one write)."""
    _observe_slots(slots, sent)


cdef int _observe_slots(list slots, double sent) except -1:
    cdef Slot slot
    for slot in slots:
        slot.observe(sent)
    return 0



cdef inline int64_t _now_ms() noexcept:
    """time.time_ns() // 1_000_000 (the wall clock append_records stamps with), without the call."""
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    return <int64_t>ts.tv_sec * 1000 + ts.tv_nsec // 1000000


cdef inline double _monotonic() noexcept:
    """time.monotonic() without the call: the same clock (CLOCK_MONOTONIC), in seconds."""
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <double>ts.tv_sec + <double>ts.tv_nsec * 1e-9


def begin_native(frame, parse, pending, dict counts, double since, double arrived):
    """The network layer's native dispatch up to its handler call (kbroker.network.connection):
    ``parse(frame)`` (parse_produce or parse_fetch; a malformed frame raises ProtocolError and nothing
    is queued), a Slot for the request appended to ``pending``, the request counted in ``counts``
    ((api_key, api_version) -> n, the server's metrics), FetchFollower told apart, and the handler's
    start time stamped. -> the Slot (its ``header`` is the parsed request)."""
    return _begin_native(frame, parse, pending, counts, since, arrived)


cdef Slot _begin_native(frame, parse, pending, dict counts, double since, double arrived):
    cdef object req = parse(frame)
    if type(req) is ProduceRequest:
        return _new_slot(req, (<ProduceRequest>req).api_key, (<ProduceRequest>req).api_version, False,
                         pending, counts, since, arrived, _monotonic())
    return _new_slot(req, (<FetchRequest?>req).api_key, (<FetchRequest>req).api_version,
                     (<FetchRequest>req).replica_id >= 0, pending, counts, since, arrived, _monotonic())


cdef Slot _new_slot(header, int api_key, int version, bint follower, pending, dict counts, double since,
                    double arrived, double started):
    # the request's Slot appended to ``pending`` and the request counted in ``counts``
    cdef Slot slot = Slot.__new__(Slot)         # no __init__: the fields are set here, in C
    slot.api_key = api_key
    slot.follower = follower
    slot.header = header
    slot.since = since
    slot.arrived = slot.queued = arrived
    slot.started = started
    pending.append(slot)
    kv = (api_key, version)
    counts[kv] = counts.get(kv, 0) + 1
    return slot


def end_native(Slot slot, result, no_response, close):
    """After the handler returned ``result``: its local time stamped; an answer already encoded (a
    list of chunks, ``no_response`` or ``close``) is queued on the slot (done) -> True; anything else
    (an awaitable) -> False, for the caller to wait on."""
    return _end_native(slot, result, no_response, close)


cdef bint _end_native(Slot slot, result, no_response, close):
    cdef double t1 = _monotonic()
    slot.local = t1 - slot.started
    if type(result) is list or result is no_response or result is close:
        slot.chunks = result
        slot.done = True
        slot.queued = t1
        return True
    return False
