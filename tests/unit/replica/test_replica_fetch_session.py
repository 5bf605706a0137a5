"""The follower's side of a fetch session (kbroker/replica/fetcher.py FetchSession): what each request
lists and forgets, the id and epoch it carries, and how answers and failures move them."""
from kbroker.protocol.errors import Errors
from kbroker.replica.fetcher import FetchSession

A, B, C = ("t", 0), ("t", 1), ("u", 0)


def test_full_then_incremental_then_forgotten():
    s = FetchSession()
    listed, gone, sid, epoch = s.next({A: (0, 1, 0, 9), B: (0, 1, 0, 9)})
    assert (set(listed), gone, sid, epoch) == ({A, B}, [], 0, 0)
    assert s.answered(0, 77)
    listed, gone, sid, epoch = s.next({A: (5, 1, 0, 9), B: (0, 1, 0, 9)})
    assert (listed, gone, sid, epoch) == ({A: (5, 1, 0, 9)}, [], 77, 1)
    assert s.answered(0, 77)
    listed, gone, sid, epoch = s.next({A: (5, 1, 0, 9), C: (0, 2, 0, 9)})
    assert (listed, gone, sid, epoch) == ({C: (0, 2, 0, 9)}, [B], 77, 2)


def test_session_errors_and_failures_go_back_to_a_full_fetch():
    s = FetchSession()
    s.next({A: (0, 1, 0, 9)})
    s.answered(0, 5)
    s.next({A: (0, 1, 0, 9)})
    assert not s.answered(Errors.INVALID_FETCH_SESSION_EPOCH, 0)
    assert s.next({A: (0, 1, 0, 9)})[2:] == (5, 0)           # closes 5, asks for a new one
    assert s.answered(0, 6)
    s.next({A: (0, 1, 0, 9)})
    assert not s.answered(Errors.FETCH_SESSION_ID_NOT_FOUND, 0)
    assert s.next({A: (0, 1, 0, 9)})[2:] == (0, 0)
    s.answered(0, 8)
    s.close()
    assert s.next({A: (0, 1, 0, 9)})[2:] == (8, 0)
    # a full answer without a session (no slot on the leader): full fetches go on
    assert s.answered(0, 0)
    assert s.next({A: (1, 1, 0, 9)})[2:] == (0, 0)


def test_few_partitions_fetch_sessionless_and_close_the_session():
    s = FetchSession(min_partitions=2)
    s.next({A: (0, 1, 0, 9), B: (0, 1, 0, 9)})
    s.answered(0, 3)
    listed, gone, sid, epoch = s.next({A: (0, 1, 0, 9)})
    assert (set(listed), gone, sid, epoch) == ({A}, [], 3, -1)   # ends session 3
    assert s.answered(0, 0)
    assert s.next({A: (0, 1, 0, 9)})[2:] == (0, -1)
