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


def test_history_checker_counts_exactly_once_violations():
    # A consume-transform-produce run: inputs are "sent", committed output "acked", aborted output "abort"ed.
    h = History()
    for v in (b"i0", b"i1", b"i2", b"i3"):
        h.send(v)
    h.ack(b"i0", 0, 0)
    h.abort(b"i1", 0, 1)       # written by an aborted transaction...
    h.ack(b"i1", 0, 3)         # ...and again by the committed replay
    h.ack(b"i2", 0, 4)
    h.ack(b"i2", 0, 5)         # committed twice (the later offset is what the history keeps)
    # i3: never written: lost
    for off, v in ((0, b"i0"), (1, b"i1"), (3, b"i1"), (4, b"i2"), (5, b"i2")):
        h.poll(0, off, v)
    r = h.check()
    assert r.aborted_visible == 1                  # offset 1 is aborted output, read_committed saw it
    assert r.not_once == 3                          # i1 and i2 read twice, i3 never
    assert r.duplicates == 2 and r.unseen == 1
    assert "not exactly once 3 of 4" in r.line()


def test_history_checker_clean_transactional_history_is_clean():
    h = History()
    for i in range(10):
        h.send(b"%d" % i)
    for i in range(10):
        h.abort(b"%d" % i, 0, i)                    # a first, aborted attempt at every input
        h.ack(b"%d" % i, 0, 11 + i)                 # the committed one, after the ABORT marker at 10
        h.poll(0, 11 + i, b"%d" % i)
    r = h.check()
    assert (r.acked_lost, r.unseen, r.duplicates, r.inconsistent_offsets, r.aborted_visible, r.not_once) == \
        (0, 0, 0, 0, 0, 0)
