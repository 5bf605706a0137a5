"""The fetch session cache (kbroker/server/fetch_sessions.py) in process: Kafka's slot and eviction rules,
the epochs, what an incremental read covers and what its answer keeps."""
import asyncio

import pytest

from kbroker.server import fetch_sessions as fs
from kbroker.server.notify import AppendNotifier

MIN = fs.EVICTION_MS + 1


@pytest.fixture
def loop():
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


def cache(loop, slots=2, notifier=None):
    return fs.FetchSessionCache(slots, (notifier or AppendNotifier()).waiters, loop, 1000)


def fields(index, offset=0):
    return (index, -1, offset, -1, 1 << 20)


def row(index, hw, records=b"", error=0, lso=None, log_start=0):
    return [index, error, hw, hw if lso is None else lso, log_start, records]


def test_epochs_wrap_to_one_and_final_stays():
    assert fs.next_epoch(0) == 1 and fs.next_epoch(7) == 8
    assert fs.next_epoch(0x7FFFFFFF) == 1
    assert fs.next_epoch(-1) == -1


def test_ids_are_random_non_zero_and_unique(loop):
    c = cache(loop, slots=50)
    ids = [c.create(False, 1, False, 0).id for _ in range(50)]
    assert 0 not in ids and len(set(ids)) == 50
    assert all(c.get(i).epoch == 1 for i in ids)


def test_a_full_cache_evicts_as_kafka(loop):
    c = cache(loop, slots=2)
    a = c.create(False, 5, False, 0)
    b = c.create(False, 9, False, 0)
    for s, n in ((a, 5), (b, 9)):
        for i in range(n):
            s.add("t", fields(i))
    # fresh consumer sessions: a new consumer session takes no slot, a follower's takes the smaller one
    assert c.create(False, 100, False, 10) is None
    f = c.create(True, 1, False, 10)
    assert f is not None and c.get(a.id) is None and c.get(b.id) is b and c.evictions == 1
    # the follower's session stays against consumers; a session unused for EVICTION_MS goes first
    assert c.create(False, 100, False, 20) is None
    c.touch(f, MIN - 5)
    g = c.create(False, 1, False, MIN)          # b was last used at 0: stale
    assert g is not None and c.get(b.id) is None and c.get(f.id) is f
    # sessions older than EVICTION_MS (not stale) are evictable by size: a smaller newcomer may not
    c.touch(f, 2 * MIN)
    c.touch(g, 2 * MIN)
    assert c.create(False, 0, False, 2 * MIN) is None
    h = c.create(False, 5, False, 2 * MIN)      # g holds 0 partitions: any newcomer outranks it
    assert h is not None and c.get(g.id) is None and c.get(f.id) is f


def test_no_slots_no_sessions(loop):
    assert cache(loop, slots=0).create(True, 1, False, 0) is None


def test_an_incremental_read_covers_listed_dirty_and_carried_partitions_only(loop):
    notifier = AppendNotifier()
    c = cache(loop, slots=1, notifier=notifier)
    s = c.create(False, 4, False, 0)
    for i in range(4):
        s.add("t", fields(i))
    read = s.candidates(True)
    assert [cp.index for cp in read] == [0, 1, 2, 3]
    out = s.settle(read, [("t", [row(0, 5), row(1, 0), row(2, 0), row(3, 0, error=6)])], lambda cp, r: r[3], True)
    assert [r[0] for r in out[0][1]] == [0, 1, 2, 3]
    # partition 0 has unread data (offset 0 < HW 5), 3 an error: both carried; nothing else is read
    assert sorted(cp.index for cp in s.candidates(False)) == [0, 3]
    # an HW move of partition 2 reaches the session through its standing waiter
    notifier.appended(("t", 2))
    assert ("t", 2) in notifier.waiters          # the waiter stays registered
    got = s.candidates(False)
    assert [cp.index for cp in got] == [0, 2, 3]  # in session order
    out = s.settle(got, [("t", [row(0, 5), row(2, 1), row(3, 0)])], lambda cp, r: r[3])
    # 0: nothing new for the client (same HW, no records); 2: HW moved; 3: the error went away (HW -1 then)
    assert [r[0] for r in out[0][1]] == [2, 3]
    # 2 now has data below its HW too; the client lists 0 and 2 past their data: settled, not carried
    s.add("t", fields(0, 5))
    s.add("t", fields(2, 1))
    got = s.candidates(False)
    assert [cp.index for cp in got] == [0, 2]
    assert s.settle(got, [("t", [row(0, 5), row(2, 1)])], lambda cp, r: r[3]) == []
    assert s.candidates(False) == []


def test_records_move_a_partition_to_the_end_and_a_drop_unregisters(loop):
    notifier = AppendNotifier()
    c = cache(loop, slots=1, notifier=notifier)
    s = c.create(True, 3, False, 0)
    for i in range(3):
        s.add("t", fields(i))
    assert ("t", 0, "follower") in notifier.waiters and ("t", 0) in notifier.waiters
    read = s.candidates(True)
    s.settle(read, [("t", [row(0, 1, b"x"), row(1, 0), row(2, 0)])], lambda cp, r: 1, True)
    assert [cp.index for cp in s.candidates(True)] == [0, 1, 2]        # a full answer keeps the order
    got = s.candidates(True)
    s.settle(got, [("t", [row(0, 2, b"y"), row(1, 0), row(2, 0)])], lambda cp, r: 2)
    assert [cp.index for cp in s.candidates(True)] == [1, 2, 0]
    s.drop(("t", 0))
    assert ("t", 0) not in notifier.waiters and ("t", 0, "follower") not in notifier.waiters
    c.remove(s.id)
    assert notifier.waiters == {}


def test_a_waiting_poll_wakes_on_a_dirty_partition(loop):
    notifier = AppendNotifier()
    c = cache(loop, slots=1, notifier=notifier)
    s = c.create(False, 1, False, 0)
    s.add("t", fields(0))
    s.candidates(False)
    fut = s.waiter()
    assert not fut.done()
    notifier.appended(("t", 0))
    assert fut.done()
    s.forget(None, fut)
    assert s.waiter().done()                  # dirty already: done at once


def test_an_unused_session_drops_its_waiters_until_used_again(loop):
    notifier = AppendNotifier()
    c = cache(loop, slots=2, notifier=notifier)
    s = c.create(False, 2, False, 0)
    busy = c.create(False, 1, False, 0)
    for i in range(2):
        s.add("t", fields(i))
    busy.add("u", fields(0))
    c.touch(busy, fs.DORMANT_MS)
    assert c.check_dormant(fs.DORMANT_MS) == 1
    assert s.dormant and not busy.dormant
    assert ("t", 0) not in notifier.waiters and ("u", 0) in notifier.waiters
    s.add("t", fields(2))                    # added while asleep: no waiter until it resumes
    assert ("t", 2) not in notifier.waiters
    s.resume()
    assert {("t", 0), ("t", 1), ("t", 2)} <= set(notifier.waiters)
    s.candidates(False)
    s.waiter()                                      # a poll waiting on it: never put to sleep
    assert c.check_dormant(fs.DORMANT_MS) == 0


def test_the_dormant_check_runs_from_start_until_close(loop, monkeypatch):
    # the broker starts the cache with itself and closes it at stop: every session closed, no more checks
    monkeypatch.setattr(fs, "DORMANT_MS", 40)
    notifier = AppendNotifier()
    c = cache(loop, slots=2, notifier=notifier)
    s = c.create(False, 1, False, fs.now_ms())
    s.add("t", fields(0))
    c.start()
    loop.run_until_complete(asyncio.sleep(0.2))
    assert s.dormant and ("t", 0) not in notifier.waiters
    s.resume()
    assert ("t", 0) in notifier.waiters
    c.close()
    assert len(c) == 0 and notifier.waiters == {}
    late = c.create(False, 1, False, fs.now_ms() - 1000)
    loop.run_until_complete(asyncio.sleep(0.2))
    assert not late.dormant
