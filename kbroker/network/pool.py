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
import mmap
import sys


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


class FrameCache:
    """Recycled buffers for large request frames (those that do not fit a receive chunk).

    A fresh anonymous mapping per frame costs a page fault and a zeroed page for every 4 KiB the kernel
    fills, and an munmap after (124 faults per 493 KiB Produce request, measured): a few buffers that
    already hold their pages are handed out again instead. Safety: a buffer is reused only when nothing
    else refers to it: any live memoryview of it (a handler, a thread still writing it to a segment)
    holds a reference, so such a buffer is passed over and freed by the garbage collector when its
    views go. Bounded: at most ``max_idle_bytes`` idle, none above ``max_buffer``, and everything idle
    is dropped after ``idle_s`` without use, so the memory of a burst goes back to the OS.
    Buffers are sized in powers of two (from 64 KiB) so a frame can take any buffer of its class.
    """

    MIN_CLASS = 64 * 1024

    def __init__(self, max_idle_bytes: int = 16 << 20, max_buffer: int = 8 << 20, idle_s: float = 2.0):
        self.max_idle_bytes = max_idle_bytes
        self.max_buffer = max_buffer
        self.idle_s = idle_s
        self._idle: dict[int, list] = {}
        self.idle_bytes = 0
        self.last_use = 0.0
        self.reused = 0
        self.fresh = 0

    @classmethod
    def size_class(cls, size: int) -> int:
        return max(cls.MIN_CLASS, 1 << (size - 1).bit_length())

    def take(self, size: int, now: float):
        """A writable buffer (an anonymous mmap) of at least ``size`` bytes."""
        self.last_use = now
        cls = self.size_class(size)
        stack = self._idle.get(cls)
        while stack:
            buf = stack.pop()
            self.idle_bytes -= cls
            # References: the local name and getrefcount's argument. Anything more is a live view.
            if sys.getrefcount(buf) == 2:
                self.reused += 1
                return buf
        self.fresh += 1
        return mmap.mmap(-1, cls if cls <= self.max_buffer else size)

    def give(self, buf, now: float) -> None:
        """``buf`` is no longer needed by the connection (its views may still be alive: see take)."""
        self.last_use = now
        cls = len(buf)
        if cls > self.max_buffer or cls != self.size_class(cls) or self.idle_bytes + cls > self.max_idle_bytes:
            return
        self._idle.setdefault(cls, []).append(buf)
        self.idle_bytes += cls

    def trim(self, now: float) -> None:
        """Drop every idle buffer when none was used for ``idle_s`` (called by the server's sweeper)."""
        if self.idle_bytes and now - self.last_use > self.idle_s:
            self._idle.clear()
            self.idle_bytes = 0
