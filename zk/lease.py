"""How long this broker may still act on its ZooKeeper session while it cannot reach ZooKeeper.

Contract: ``SessionLease.expired(now)`` turns True no later than the moment ZooKeeper may have
expired the session, measured on this process's monotonic clock; a broker that sees it True stops
leading (the controller may be electing other leaders already).

Why the bound holds:

* ZooKeeper expires a session no earlier than T after the last request it received from the
  client (the server rounds the expiry up to its next tick), T being the *negotiated* timeout: the
  server clamps the requested one into [2, 20] ticks, so it may be lower than configured. The
  negotiated value comes with the connect answer (kazoo only logs it: NegotiatedTimeoutLogger reads
  it there). We use the smaller of negotiated and configured: when the server raised the timeout
  this only makes us step down earlier than needed; until the answer is read, the configured one.
* The server received our request no earlier than we sent it. So if a request sent at ``anchor``
  was answered in this session, the session cannot expire before ``anchor + T``. ``heard`` records
  such answers (BrokerZk sends a heartbeat read every T/10 while connected, so the anchor is at most
  T/10 plus a round trip old when a cut starts). The moment kazoo reports SUSPENDED is no anchor:
  on a silent cut it comes up to 2/3 T after the last answer.
* We step down at ``anchor + T - margin`` with margin = T/10: the time the broker takes to act on
  it (its loop checks every 100 ms at most, plus event-loop lag) and the rate difference of the two
  machines' clocks stay well inside it. A disconnection shorter than about T - T/10 - T/10 (the
  heartbeat age) therefore changes nothing: the broker keeps serving, as before.

A new session (after an expiry) starts a new anchor; answers from an older session are ignored.
Thread-safe: ``heard`` runs on the heartbeat thread, ``expired`` on the broker's loop; the fields
are replaced whole (one float / int each), which is atomic under the GIL.
"""
from __future__ import annotations

import logging
import time

MARGIN_FRACTION = 0.1         # margin and heartbeat period, as a fraction of the session timeout


class SessionLease:
    def __init__(self, configured_timeout_ms: int, now: float | None = None):
        self.configured_timeout_ms = int(configured_timeout_ms)
        self.negotiated_timeout_ms: int | None = None
        self.session_id: int | None = None
        # Before any answer: the time the client was created (its connect request is sent later).
        self.anchor = time.monotonic() if now is None else now

    @property
    def timeout_ms(self) -> int:
        n = self.negotiated_timeout_ms
        return self.configured_timeout_ms if n is None else min(n, self.configured_timeout_ms)

    @property
    def heartbeat_s(self) -> float:
        return max(self.timeout_ms * MARGIN_FRACTION / 1000, 0.05)

    @property
    def deadline(self) -> float:
        t = self.timeout_ms / 1000
        return self.anchor + t - t * MARGIN_FRACTION

    def heard(self, sent_at: float, session_id: int) -> None:
        """A request sent at ``sent_at`` (monotonic) was answered in session ``session_id``."""
        if session_id != self.session_id:
            self.session_id = session_id
            self.anchor = sent_at
        elif sent_at > self.anchor:
            self.anchor = sent_at

    def expired(self, now: float | None = None) -> bool:
        return (time.monotonic() if now is None else now) >= self.deadline

    def remaining(self, now: float | None = None) -> float:
        return self.deadline - (time.monotonic() if now is None else now)


class NegotiatedTimeoutLogger(logging.LoggerAdapter):
    """kazoo's logger, reading the negotiated session timeout from the record kazoo writes when a
    session is created (kazoo 2.11 keeps it nowhere else): its third argument."""

    def __init__(self, logger: logging.Logger, lease: SessionLease):
        super().__init__(logger, {})
        self.lease = lease

    def log(self, level, msg, *args, **kwargs):
        if isinstance(msg, str) and msg.startswith("Session created") and len(args) >= 3:
            try:
                self.lease.negotiated_timeout_ms = int(args[2])
            except (TypeError, ValueError):
                pass
        super().log(level, msg, *args, **kwargs)
