"""A Fetch long poll as callbacks on one future, for the Fetch handler's wait (server/apis/fetch.py).

A follower's next fetch usually arrives before the next append and waits for it: at full speed that is
one long poll per produce request and follower (~6,300 per GB at RF=3, docs/perf/replication-cpu.md).
A coroutine around ``asyncio.wait_for(asyncio.shield(waiter), remaining)`` costs a shield future, a
timeout handle and wait_for's own future and callbacks on every wake (23 µs against 12 µs per poll in
a 20,000-poll microbenchmark); here a wake is one done-callback and the deadline one timer handle for
the whole poll.

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


def long_poll(notifier, tps, waiter, max_wait_s: float, read, enough, answer=None) -> asyncio.Future:
    loop = asyncio.get_running_loop()
    result = loop.create_future()
    # The deadline is on the monotonic clock (the one request metrics and clients measure with), not
    # the loop's: uvloop's loop.time() and timers are libuv's whole milliseconds of a coarse clock, so a
    # timer at loop.time() + max_wait fired up to ~1 ms before max_wait had passed.
    deadline = _now() + max_wait_s
    state = [waiter, None]          # [current waiter, deadline timer]

    def attempt(_fut=None, final=False) -> None:
        if result.done():
            return
        current = state[0]
        if current is not None:
            notifier.forget(tps, current)
            state[0] = None
        try:
            res = read()
            done = final or enough(res) or _now() >= deadline
            if done:
                res = res if answer is None else answer(res)
        except BaseException as exc:    # a callback's exception would reach no one: the fetch would hang
            done, res = True, exc
        if done:
            timer = state[1]
            if timer is not None:
                timer.cancel()
                state[1] = None
            if isinstance(res, BaseException):
                result.set_exception(res)   # the connection answers or closes, as for a failed handler
            else:
                result.set_result(res)
            return
        w = state[0] = notifier.waiter(tps)
        w.add_done_callback(attempt)

    def expire() -> None:
        left = deadline - _now()
        if left > 0:                # the loop's clock ran ahead of ours: wait out the rest
            state[1] = loop.call_later(left if left > _REARM_MIN_S else _REARM_MIN_S, expire)
            return
        state[1] = None
        attempt(final=True)

    def dropped(fut) -> None:
        if fut.cancelled():
            if state[0] is not None:
                notifier.forget(tps, state[0])
                state[0] = None
            if state[1] is not None:
                state[1].cancel()
                state[1] = None

    state[1] = loop.call_later(max_wait_s, expire)
    result.add_done_callback(dropped)
    waiter.add_done_callback(attempt)
    return result
