"""replica/longpoll.py: the Fetch long poll as callbacks, driven by the broker's real AppendNotifier on a
real event loop (the read is a counter standing in for the handler's partition read)."""
from __future__ import annotations

import asyncio

import pytest

from kbroker.replica.longpoll import long_poll
from kbroker.server.notify import AppendNotifier

TP = ("t", 0)


def run(coro):
    return asyncio.run(coro)


class Data:
    """What the handler's read would find: bytes appended so far."""

    def __init__(self):
        self.size = 0
        self.reads = 0

    def read(self):
        self.reads += 1
        return self.size


def test_an_append_completes_the_poll_at_once():
    async def main():
        n, d = AppendNotifier(), Data()
        loop = asyncio.get_running_loop()
        fut = long_poll(n, [TP], n.waiter([TP]), 5.0, d.read, lambda size: size >= 1)
        t0 = loop.time()
        await asyncio.sleep(0.01)
        d.size = 100
        n.appended(TP)
        assert await asyncio.wait_for(fut, 1.0) == 100
        assert loop.time() - t0 < 1.0
        assert d.reads == 1
        assert not n.waiters          # nothing left registered
    run(main())


def test_too_little_waits_for_the_next_append():
    async def main():
        n, d = AppendNotifier(), Data()
        fut = long_poll(n, [TP], n.waiter([TP]), 5.0, d.read, lambda size: size >= 200)
        d.size = 100
        n.appended(TP)
        await asyncio.sleep(0.01)
        assert not fut.done() and d.reads == 1
        assert n.waiters[TP]          # re-registered for the next append
        d.size = 250
        n.appended(TP)
        assert await asyncio.wait_for(fut, 1.0) == 250
        assert d.reads == 2 and not n.waiters
    run(main())


def test_the_deadline_answers_with_what_there_is():
    async def main():
        n, d = AppendNotifier(), Data()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        fut = long_poll(n, [TP], n.waiter([TP]), 0.1, d.read, lambda size: size >= 1)
        assert await asyncio.wait_for(fut, 2.0) == 0
        assert loop.time() - t0 >= 0.09
        assert d.reads == 1 and not n.waiters
    run(main())


def test_an_append_before_the_call_is_not_missed():
    async def main():
        n, d = AppendNotifier(), Data()
        w = n.waiter([TP])             # registered by the handler before it returned
        d.size = 10
        n.appended(TP)                 # resolves w before long_poll sees it
        fut = long_poll(n, [TP], w, 5.0, d.read, lambda size: size >= 1)
        assert await asyncio.wait_for(fut, 1.0) == 10
    run(main())


def test_a_cancelled_poll_leaves_nothing_behind():
    async def main():
        n, d = AppendNotifier(), Data()
        loop = asyncio.get_running_loop()
        fut = long_poll(n, [TP, ("t", 1)], n.waiter([TP, ("t", 1)]), 5.0, d.read, lambda size: size >= 1)
        assert n.waiters
        timers = len(loop._scheduled)
        fut.cancel()
        await asyncio.sleep(0)
        assert not n.waiters
        assert sum(not h.cancelled() for h in loop._scheduled) <= timers - 1
        n.appended(TP)                 # a later append finds nothing to wake
        await asyncio.sleep(0)
        assert d.reads == 0
    run(main())


def test_a_failing_read_fails_the_future_instead_of_hanging():
    """An exception in a done-callback reaches no awaiter: the poll must carry it to its future so the
    connection answers or closes (never a silent hang); the deadline timer goes with it."""
    async def main():
        n = AppendNotifier()

        def read():
            raise RuntimeError("read failed on purpose")
        fut = long_poll(n, [TP], n.waiter([TP]), 30.0, read, lambda size: True)
        n.appended(TP)
        try:
            await asyncio.wait_for(fut, 1.0)
        except RuntimeError as exc:
            assert "on purpose" in str(exc)
        else:
            raise AssertionError("the poll answered although its read failed")
        assert not n.waiters
    run(main())



def _waits(loop_name, polls, max_wait_s):
    """``polls`` long polls started one after another at uneven points of the loop's clock ticks,
    answered by their deadline -> each one's wait by the monotonic clock (the clock request metrics and
    clients measure with)."""
    import random
    import time

    import uvloop

    async def main():
        n, d = AppendNotifier(), Data()
        rng = random.Random(7)
        waits = []

        async def one():
            t0 = time.monotonic()
            assert await long_poll(n, [TP], n.waiter([TP]), max_wait_s, d.read, lambda size: size >= 1) == 0
            waits.append(time.monotonic() - t0)

        tasks = []
        for _ in range(polls):
            await asyncio.sleep(rng.random() * 0.002)
            tasks.append(asyncio.ensure_future(one()))
        await asyncio.wait_for(asyncio.gather(*tasks), max_wait_s + 5.0)
        return waits

    loop = uvloop.new_event_loop() if loop_name == "uvloop" else asyncio.new_event_loop()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


@pytest.mark.parametrize("loop_name", ["asyncio", "uvloop"])
def test_the_deadline_never_answers_before_max_wait(loop_name):
    # uvloop's timers run on libuv's loop time, whole milliseconds of a coarse clock: a timer at
    # loop.time() + max_wait fired up to ~0.9 ms early by the monotonic clock. The poll's deadline is a
    # monotonic reading; a timer that fires before it is re-armed for the rest.
    waits = _waits(loop_name, 60, 0.02)
    assert min(waits) >= 0.02, sorted(waits)[:5]


def test_a_finished_poll_is_freed_without_the_cyclic_collector():
    """Every way a poll ends (woken at once, woken after re-registering, deadline, cancelled) leaves no
    reference cycle (a failed read does: its exception's traceback holds the frame that holds the
    future; that path is for bugs, and the collector frees it): with the collector off, dropping the last reference frees the poll's future
    and its read callable. (Closures that named themselves kept ~40 objects per poll for the collector,
    whose generation-0 runs over ~20,000 of them held the broker's loop ~10 ms.)"""
    import gc
    import weakref

    class Read:                     # a weakref-able read callable standing in for the handler's closure
        def __init__(self, d, fail=False):
            self.d, self.fail = d, fail

        def __call__(self):
            if self.fail:
                raise RuntimeError("read failed on purpose")
            return self.d.read()

    async def main():
        n, d = AppendNotifier(), Data()
        refs = []

        def start(max_wait_s, need, fail=False):
            r = Read(d, fail)
            fut = long_poll(n, [TP], n.waiter([TP]), max_wait_s, r, lambda size: size >= need)
            refs.append((weakref.ref(fut), weakref.ref(r)))
            return fut

        woken, later, timed, failed = start(5.0, 1), start(5.0, 200), start(0.01, 10**9), start(5.0, 1, True)
        cancelled = start(5.0, 1)
        cancelled.cancel()
        d.size = 100
        n.appended(TP)                 # answers woken, fails failed, re-registers later
        await asyncio.sleep(0.001)
        d.size = 300
        n.appended(TP)                 # answers later
        assert await asyncio.wait_for(woken, 1.0) == 100
        assert await asyncio.wait_for(later, 1.0) == 300
        assert await asyncio.wait_for(timed, 1.0) == 300
        with pytest.raises(RuntimeError):
            await failed
        del woken, later, timed, failed, cancelled
        for _ in range(3):
            await asyncio.sleep(0)     # the futures' own done-callbacks run
        assert not n.waiters
        return refs

    gc.collect()
    gc.disable()
    try:
        refs = run(main())
        del refs[3]                    # the failed read (see above)
        alive = [i for i, (f, r) in enumerate(refs) if f() is not None or r() is not None]
        assert not alive, f"polls {alive} still referenced: freed only by the cyclic collector"
    finally:
        gc.enable()
