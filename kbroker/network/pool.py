"""Broker-wide request memory pool (Kafka's ``queued.max.request.bytes``, KIP-72).

Every byte of request data a connection holds (its receive chunk and any frame buffer it has been
given) is reserved here *before* it is allocated. When the pool is exhausted, connections that need
memory stop reading (TCP backpressure) and are woken in FIFO order as memory comes back, so the sum
over all connections stays bounded however many clients send at once.

Two kinds of reservation: *partial* memory backs a large frame whose bytes are still arriving (a
client can announce a frame and never finish it), everything else is *complete* (receive chunks,
frames that have fully arrived). Partial reservations may use at most ``partial_limit``: the rest of
the pool is kept for requests that are complete and for the receive chunks of clients already being
served, so stalled partial frames alone can never starve them.
"""
from __future__ import annotations

import collections


class MemoryPool:
    def __init__(self, capacity: int, partial_limit: int | None = None):
        if capacity <= 0:
            raise ValueError("memory pool capacity must be positive")
        self.capacity = capacity
        self.partial_limit = capacity if partial_limit is None else min(partial_limit, capacity)
        self.used = 0
        self.partial = 0          # part of ``used`` backing frames still arriving
        self._waiters: collections.deque = collections.deque()

    @property
    def available(self) -> int:
        return self.capacity - self.used

    def try_reserve(self, n: int, partial: bool = False) -> bool:
        if n > self.available:
            return False
        if partial:
            if self.partial + n > self.partial_limit:
                return False
            self.partial += n
        self.used += n
        return True

    def settle(self, n: int) -> None:
        """``n`` partial bytes now back a complete frame (no longer count against partial_limit)."""
        self.partial -= n
        assert self.partial >= 0, "memory pool settled more than reserved"
        if self._waiters:
            self._wake()

    def release(self, n: int, partial: bool = False) -> None:
        self.used -= n
        if partial:
            self.partial -= n
        assert self.used >= 0 and self.partial >= 0, "memory pool released more than reserved"
        if self._waiters:
            self._wake()

    def _wake(self) -> None:
        # Each waiter gets one try per wake-up: a waiter that is still short re-queues itself (behind
        # those not yet tried), so a large frame cannot spin this loop forever and a small request
        # behind it is not blocked by it.
        pending, self._waiters = self._waiters, collections.deque()
        while pending:
            if self.available <= 0:
                self._waiters.extendleft(reversed(pending))
                return
            pending.popleft()()

    def wait(self, callback) -> None:
        self._waiters.append(callback)

    def forget(self, callback) -> None:
        try:
            self._waiters.remove(callback)
        except ValueError:
            pass
