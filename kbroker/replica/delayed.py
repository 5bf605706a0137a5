"""DelayedProduce: an acks=all Produce waiting until the high watermark covers each of its
batches (Kafka's DelayedProduce, without a purgatory: each partition keeps its waiters in append
order, so a high-watermark move completes a prefix of them).

A partition's outcome is decided once: NONE when the HW reaches the batch's end,
NOT_ENOUGH_REPLICAS_AFTER_APPEND when the ISR falls below min.insync.replicas,
NOT_LEADER_OR_FOLLOWER when leadership moves, REQUEST_TIMED_OUT at timeout_ms. The request's
future resolves when every partition is decided.

The same object collects the answers of a request whose appends were queued off the loop
(ReplicaManager._defer: compressed batches validated on worker threads, large ones written on the
log dir's writer thread); for acks 0/1 it has no timer and resolves when each append is decided.

Threads: the event-loop thread only.
"""
from __future__ import annotations

import asyncio


class DelayedProduce:
    __slots__ = ("results", "remaining", "future", "timer")

    def __init__(self, results: dict, waiting: int, loop: asyncio.AbstractEventLoop, timeout_ms: int,
                 on_timeout):
        self.results = results          # tp -> PartitionResult (already-final ones included)
        self.remaining = waiting
        self.future = loop.create_future()
        # None: no deadline (acks 0/1 waiting only for appends queued off the loop)
        self.timer = None if timeout_ms is None else loop.call_later(max(timeout_ms, 0) / 1000, on_timeout, self)

    def decide(self, tp, error_code: int) -> None:
        r = self.results[tp]
        if r.error_code != -1:
            return                      # already decided
        # A failed acks=all append reports no offset (Kafka answers -1).
        self.results[tp] = (r._replace(error_code=0) if error_code == 0 else
                            r._replace(error_code=int(error_code), base_offset=-1, log_append_time_ms=-1))
        self.remaining -= 1
        if self.remaining == 0:
            if self.timer is not None:
                self.timer.cancel()
            if not self.future.done():
                self.future.set_result(self.results)

    def undecided(self):
        return [tp for tp, r in self.results.items() if r.error_code == -1]
