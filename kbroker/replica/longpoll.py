"""A Fetch long poll as callbacks on one future, for the Fetch handler's wait (server/apis/fetch.py).

A follower's next fetch usually arrives before the next append and waits for it: at full speed that is
one long poll per produce request and follower. A coroutine around
``asyncio.wait_for(asyncio.shield(waiter), remaining)`` costs a shield future, a timeout handle and
wait_for's own future and callbacks on every wake; here a wake is one done-callback and the deadline one
timer handle for the whole poll, and the network layer answers the future from its done-callback (no Task).

A poll's state is one slotted ``_Poll`` object, never closures that name themselves: such closures form
reference cycles that only the cyclic collector frees, and its sweeps of that garbage hold the loop (they
set the latency p99). Refcounting frees a finished poll.

``long_poll(notifier, tps, waiter, max_wait_s, read, enough, answer)`` returns a future of
``answer(read())`` (``answer`` defaults to the read's result itself):
``waiter`` (registered by the caller before it returned, so no append in between is missed) wakes an
attempt; an attempt forgets its waiter, calls ``read()``, and resolves the future when ``enough(result)``
or the deadline has passed, else registers a new waiter. The deadline (monotonic clock) runs a last
attempt; a timer that fires before it (uvloop's millisecond loop clock) is re-armed for the rest. If the future
is cancelled (the connection went away) the waiter and the timer are dropped with it; an exception
in ``read``/``enough``/``answer`` fails the future (never a silent hang).

Threads: the event-loop thread.
"""
from __future__ import annotations

import asyncio
import time

_now = time.monotonic
# The shortest re-arm of a deadline timer that fired early: uvloop's timers count whole milliseconds.
_REARM_MIN_S = 0.001


class _Poll:
    """One long poll's state. A class rather than closures: ``attempt`` and ``expire`` closures named
    themselves (to re-register / re-arm), a function <-> cell reference cycle that kept every poll's
    objects (its futures, the request, the read and answer callables: ~40 objects) alive until the
    cyclic collector ran; at the broker's generation-0 threshold a collection of ~20,000 such objects
    held the loop ~10 ms. Here the waiter's and the timer's references to the bound methods go when
    they have run or are cancelled, so refcounting frees a finished poll at once."""
    __slots__ = ("notifier", "tps", "read", "enough", "answer", "deadline", "result", "waiter", "timer")

    def attempt(self, _fut=None, final=False) -> None:
        result = self.result
        if result.done():
            return
        current = self.waiter
        if current is not None:
            self.notifier.forget(self.tps, current)
            self.waiter = None
        try:
            res = self.read()
            done = final or self.enough(res) or _now() >= self.deadline
            if done and self.answer is not None:
                res = self.answer(res)
        except BaseException as exc:    # a callback's exception would reach no one: the fetch would hang
            done, res = True, exc
        if done:
            timer = self.timer
            if timer is not None:
                timer.cancel()
                self.timer = None
            if isinstance(res, BaseException):
                result.set_exception(res)   # the connection answers or closes, as for a failed handler
            else:
                result.set_result(res)
            return
        w = self.waiter = self.notifier.waiter(self.tps)
        w.add_done_callback(self.attempt)

    def expire(self) -> None:
        left = self.deadline - _now()
        if left > 0:                # the loop's clock ran ahead of ours: wait out the rest
            self.timer = asyncio.get_running_loop().call_later(
                left if left > _REARM_MIN_S else _REARM_MIN_S, self.expire)
            return
        self.timer = None
        self.attempt(final=True)

    def dropped(self, fut) -> None:
        if fut.cancelled():
            if self.waiter is not None:
                self.notifier.forget(self.tps, self.waiter)
                self.waiter = None
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None


def long_poll(notifier, tps, waiter, max_wait_s: float, read, enough, answer=None) -> asyncio.Future:
    loop = asyncio.get_running_loop()
    poll = _Poll()
    poll.notifier, poll.tps, poll.read, poll.enough, poll.answer = notifier, tps, read, enough, answer
    # The deadline is on the monotonic clock (the one request metrics and clients measure with), not
    # the loop's: uvloop's loop.time() and timers are libuv's whole milliseconds of a coarse clock, so a
    # timer at loop.time() + max_wait fired up to ~1 ms before max_wait had passed.
    poll.deadline = _now() + max_wait_s
    result = poll.result = loop.create_future()
    poll.waiter = waiter
    poll.timer = loop.call_later(max_wait_s, poll.expire)
    result.add_done_callback(poll.dropped)
    waiter.add_done_callback(poll.attempt)
    return result


class StandingWaiter:
    """A waiter that stays on its notifier key: what AppendNotifier.appended does with a waiter
    (``done()``, then ``set_result(None)``, the key's list dropped) registers this one again and calls
    ``woken(tp)``. A fetch session (server/fetch_sessions.py) learns so of every append and high
    watermark move of its partitions without registering a future per partition and poll; and the
    native Produce path, which calls ``appended`` only for keys with waiters, keeps telling it."""
    __slots__ = ("waiters", "key", "tp", "woken")

    def __init__(self, waiters: dict, key, tp, woken):
        self.waiters, self.key, self.tp, self.woken = waiters, key, tp, woken
        waiters.setdefault(key, []).append(self)

    def done(self) -> bool:
        return False

    def set_result(self, _result) -> None:
        self.waiters.setdefault(self.key, []).append(self)
        self.woken(self.tp)

    def cancel(self) -> None:
        lst = self.waiters.get(self.key)
        if lst:
            try:
                lst.remove(self)
            except ValueError:
                pass
            if not lst:
                del self.waiters[self.key]
