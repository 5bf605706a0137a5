"""MemoryPool: reservations never exceed capacity and a release never spins on waiters that still do
not fit (that once froze the broker's event loop with a large frame waiting)."""
from kbroker.network.pool import MemoryPool


def _waiter(pool, size, log):
    def wake():
        if pool.try_reserve(size):
            log.append(size)
        else:
            pool.wait(wake)
    return wake


def test_release_tries_each_waiter_once_and_keeps_order():
    pool = MemoryPool(100)
    assert pool.try_reserve(100)
    got = []
    big, small1, small2 = _waiter(pool, 80, got), _waiter(pool, 10, got), _waiter(pool, 10, got)
    for w in (big, small1, small2):
        pool.wait(w)
    pool.release(30)              # 30 free: the big one cannot fit, the two small ones can
    assert got == [10, 10]
    assert pool.used == 90
    pool.release(90)              # all free: the big one, still queued, gets its turn
    assert got == [10, 10, 80]
    assert pool.used == 80


def test_release_with_nothing_fitting_returns():
    pool = MemoryPool(10)
    assert pool.try_reserve(10)
    got = []
    pool.wait(_waiter(pool, 11, got))      # can never fit; must not loop forever
    pool.release(5)
    assert got == [] and pool.used == 5
