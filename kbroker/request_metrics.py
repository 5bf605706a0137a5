"""Kafka's RequestMetrics per request type and the network thread's idle ratio, counted cheaply on the
loop thread and read by the metrics collector (kbroker.metrics) at scrape time.

``REQUEST_STATS.get(api_key).observe(queue_s, local_s, send_s, total_s)`` is called by the network
layer once per answered request (Python and native paths): a count, five float additions and five
bucket indexes (binary search over fixed bounds, all in C: ext/request.pyx). No locks: only the loop
thread writes; a scrape from another thread may see one request half counted, which the next scrape
corrects.

Times are seconds here and exported in milliseconds, as Kafka's ``*TimeMs`` histograms are:
- RequestQueueTimeMs: frame complete -> handler starts (``queue_s``),
- LocalTimeMs: handler running on the loop (``local_s``),
- RemoteTimeMs: waiting for others (acks=all, long polls, rebalances) = total - queue - local - send,
- ResponseSendTimeMs: response handed to the socket -> last byte written (``send_s``),
- TotalTimeMs: frame complete -> response sent (``total_s``).

The idle meter gives NetworkProcessorAvgIdlePercent: the fraction of wall time the event loop spent
waiting in its selector's ``select()`` (timed by wrapping the selector of asyncio's selector loop;
loops without a Python selector, such as uvloop, are measured as wall time minus the loop thread's CPU
time).
"""
from __future__ import annotations

import threading
import time

# Bucket upper bounds in seconds: 2^(k/2) * 10 µs, 10 µs .. ~84 s (47 bounds, ratio 1.41): fine enough
# for quantiles within ~20% and cheap to index. Values above the last bound go to the overflow bucket.
# TimeHistogram and RequestStats are Cython classes (ext/request.pyx): ``observe`` runs once per answered
# request on the loop thread, and in Python its five bisects and attribute updates were ~5% of a
# one-record Produce's busy samples. Same fields and semantics: ``counts`` is a list per bucket (not
# cumulative), ``sum_s`` a float; remote = total - queue - local - send, clamped at 0.
from ._native.request import BOUNDS_S, N_BUCKETS, RequestStats, TimeHistogram, bind_request_stats  # noqa: E402

# Kafka's request names (RequestMetrics' ``request`` tag) for keys whose ApiKeys name differs from
# our schema name; Fetch is split by who asks, as Kafka splits it.
FETCH = 1
FETCH_CONSUMER = "FetchConsumer"
FETCH_FOLLOWER = "FetchFollower"


class RequestStatsRegistry:
    """api key -> RequestStats, created on first use (only the loop thread creates)."""

    def __init__(self):
        # api key -> stats of every key but FetchFollower's; the network layer reads it directly (one
        # dict lookup per answered request), so it is only ever cleared, never replaced
        self.by_key: dict[int, RequestStats] = {}
        self._fetch_follower: RequestStats | None = None

    def get(self, api_key: int, follower: bool = False) -> RequestStats:
        """Stats of ``api_key``; for Fetch, ``follower=True`` (replica_id >= 0) selects FetchFollower."""
        if follower and api_key == FETCH:
            s = self._fetch_follower
            if s is None:
                s = self._fetch_follower = RequestStats(FETCH_FOLLOWER)
            return s
        s = self.by_key.get(api_key)
        if s is None:
            s = self.by_key[api_key] = RequestStats(_request_name(api_key))
        return s

    def all(self) -> list[RequestStats]:
        out = list(self.by_key.values())
        if self._fetch_follower is not None:
            out.append(self._fetch_follower)
        return out

    def clear(self) -> None:
        self.by_key.clear()
        self._fetch_follower = None


def _request_name(api_key: int) -> str:
    if api_key == FETCH:
        return FETCH_CONSUMER
    from .protocol.messages import API_NAMES
    return API_NAMES.get(api_key, str(api_key))


REQUEST_STATS = RequestStatsRegistry()
# the network layer's slots (ext/request.pyx ``Slot.observe``) count into this registry
bind_request_stats(REQUEST_STATS.by_key, REQUEST_STATS.get)


def quantile(counts, q: float) -> float:
    """The q-quantile (seconds) of per-bucket counts, interpolated linearly inside its bucket (as
    PromQL's histogram_quantile does); 0.0 when empty. The overflow bucket reports the last bound."""
    n = sum(counts)
    if n == 0:
        return 0.0
    rank = q * n
    seen = 0
    for i, c in enumerate(counts):
        if c and seen + c >= rank:
            if i >= len(BOUNDS_S):
                return BOUNDS_S[-1]
            lo = BOUNDS_S[i - 1] if i > 0 else 0.0
            return lo + (BOUNDS_S[i] - lo) * ((rank - seen) / c)
        seen += c
    return BOUNDS_S[-1]


class LoopIdleMeter:
    """Seconds the event loop spent waiting for I/O (NetworkProcessorAvgIdlePercent)."""

    def __init__(self):
        self.idle_s = 0.0
        self.installed_at: float | None = None
        self.method: str | None = None       # "select" or "cpu"
        self._cpu_clock: int | None = None
        self._cpu0 = 0.0
        self._last: tuple[float, float] | None = None   # (wall, idle) of the previous ratio() window
        self._last_ratio = 1.0

    def install(self, loop) -> None:
        """Start measuring ``loop`` (call from its thread, once)."""
        self.installed_at = time.perf_counter()
        selector = getattr(loop, "_selector", None)
        select = getattr(selector, "select", None)
        if select is not None:
            perf = time.perf_counter

            def timed_select(timeout=None):
                t0 = perf()
                try:
                    return select(timeout)
                finally:
                    self.idle_s += perf() - t0

            selector.select = timed_select      # instance attribute shadows the class's method
            self.method = "select"
        else:
            self._cpu_clock = time.pthread_getcpuclockid(threading.get_ident())
            self._cpu0 = time.clock_gettime(self._cpu_clock)
            self.method = "cpu"

    def idle_seconds(self) -> float:
        """Idle seconds since install (any thread may call)."""
        if self.installed_at is None:
            return 0.0
        if self.method == "cpu":
            busy = time.clock_gettime(self._cpu_clock) - self._cpu0
            return max(0.0, (time.perf_counter() - self.installed_at) - busy)
        return self.idle_s

    def ratio(self, min_window_s: float = 1.0) -> float:
        """Idle fraction of wall time since the previous call at least ``min_window_s`` ago (since
        install for the first); a call inside the window repeats the previous value."""
        if self.installed_at is None:
            return 1.0
        now, idle = time.perf_counter(), self.idle_seconds()
        prev = self._last or (self.installed_at, 0.0)
        wall = now - prev[0]
        if wall < min_window_s and self._last is not None:
            return self._last_ratio
        if wall > 0:
            self._last_ratio = min(1.0, max(0.0, (idle - prev[1]) / wall))
        self._last = (now, idle)
        return self._last_ratio


LOOP_IDLE = LoopIdleMeter()
