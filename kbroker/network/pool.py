"""Broker-wide request memory pool (Kafka's ``queued.max.request.bytes``, KIP-72).

Every byte of request data a connection holds (its receive chunk and any frame buffer it has been
given) is reserved here *before* it is allocated. When the pool is exhausted, connections that need
memory stop reading (TCP backpressure) and are woken in FIFO order as requests complete, so the sum
over all connections stays bounded however many clients send at once.
"""
from __future__ import annotations

import collections


class MemoryPool:
    def __init__(self, capacity: int):
        if capacity <= 0:
            raise ValueError("memory pool capacity must be positive")
        self.capacity = capacity
        self.used = 0
        self._waiters: collections.deque = collections.deque()

    @property
    def available(self) -> int:
        return self.capacity - self.used

    def try_reserve(self, n: int) -> bool:
        if n > self.available:
            return False
        self.used += n
        return True

    def release(self, n: int) -> None:
        self.used -= n
        assert self.used >= 0, "memory pool released more than reserved"
        if not self._waiters:
            return
        # Each waiter gets one try per release: a waiter that is still short re-queues itself (behind
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
