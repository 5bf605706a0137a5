"""MemoryPool: reservations never exceed capacity and a release never spins on waiters that still do
not fit (that once froze the broker's event loop with a large frame waiting)."""
from kbroker.network.pool import FrameCache, MemoryPool


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


# ---- FrameCache: recycled buffers of large frames -----------------------------------------------------

def test_frame_cache_reuses_a_buffer_only_when_no_view_of_it_is_left():
    cache = FrameCache(max_idle_bytes=4 << 20, max_buffer=1 << 20, idle_s=2.0)
    a = cache.take(300_000, now=0.0)
    assert len(a) == 512 * 1024 and cache.fresh == 1
    a[:5] = b"first"
    view = memoryview(a)[:300_000]          # a handler (or a writer thread) still holds the frame
    cache.give(a, now=1.0)
    del a
    b = cache.take(300_000, now=1.1)
    assert cache.reused == 0 and bytes(view[:5]) == b"first"     # passed over: the view stays intact
    b[:5] = b"other"
    assert bytes(view[:5]) == b"first"
    del view
    cache.give(b, now=1.2)
    b_id = id(b)
    del b
    c = cache.take(400_000, now=1.3)        # same size class, nothing else refers to it: reused
    assert cache.reused == 1 and id(c) == b_id and bytes(c[:5]) == b"other"


def test_frame_cache_bounds_and_idle_trim():
    cache = FrameCache(max_idle_bytes=1 << 20, max_buffer=512 * 1024, idle_s=2.0)
    big = cache.take(600_000, now=0.0)      # above max_buffer: exact size, never kept
    assert len(big) == 600_000
    cache.give(big, now=0.0)
    assert cache.idle_bytes == 0
    bufs = [cache.take(500_000, now=0.0) for _ in range(3)]
    for buf in bufs:
        cache.give(buf, now=0.0)
    assert cache.idle_bytes == 1 << 20       # two of 512 KiB kept, the third over the cap dropped
    cache.trim(now=1.0)
    assert cache.idle_bytes == 1 << 20
    cache.trim(now=2.5)                      # unused for longer than idle_s: back to the OS
    assert cache.idle_bytes == 0
