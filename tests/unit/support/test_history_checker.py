"""The history checker (tests/checkers.py) counts what it is meant to count: fed a history with a
known loss, duplicate and offset disagreement, it reports each (so a zero from it means something)."""
from checkers import History


def test_history_checker_counts_each_violation():
    h = History()
    for v in (b"a", b"b", b"c", b"d", b"e"):
        h.send(v)
    h.ack(b"a", 0, 0)
    h.ack(b"b", 0, 1)
    h.ack(b"c", 0, 2)          # acked, never read: lost
    h.ack(b"d", 0, 3)          # read at offset 4: inconsistent
    h.fail(b"e", "timed out")  # failed and not stored: unseen (allowed)
    for off, v in ((0, b"a"), (1, b"b"), (4, b"d"), (5, b"b")):   # b stored twice: duplicate
        h.poll(0, off, v)
    h.poll(0, 0, b"x")         # a second read of offset 0 disagrees with the first
    r = h.check()
    assert (r.sent, r.acked, r.acked_lost, r.unseen, r.duplicates, r.inconsistent_offsets) == (5, 4, 1, 1, 1, 2)
    assert "acked-but-lost 1 of 4" in r.line()


def test_history_checker_clean_history_is_clean():
    h = History()
    for i in range(100):
        v = b"%d" % i
        h.send(v)
        h.ack(v, 0, i)
        h.poll(0, i, v)
    r = h.check()
    assert (r.acked_lost, r.unseen, r.duplicates, r.inconsistent_offsets) == (0, 0, 0, 0)
