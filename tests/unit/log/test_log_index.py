"""OffsetIndex / TimeIndex: Kafka's file format, greatest-lower-bound lookups, preallocation,
trimming, and the sanity check that cuts a crash's zero-filled tail."""
import bisect
import os
import random
import struct

import pytest
from hypothesis import given, settings, strategies as st

from kbroker._native import segment as native
from kbroker.log.errors import CorruptIndexError
from kbroker.log.index import OffsetIndex, TimeIndex

BASE = 1000


def test_offset_index_format_prealloc_and_trim(tmp_path):
    path = str(tmp_path / "00000000000000001000.index")
    idx = OffsetIndex(path, BASE, 4096, writable=True)
    assert os.path.getsize(path) == 4096            # preallocated to segment.index.bytes
    idx.append(1005, 0)
    idx.append(1010, 4200)
    idx.append(1100, 9000)
    idx.trim()
    raw = open(path, "rb").read()
    assert len(raw) == 3 * 8
    assert list(struct.iter_unpack(">II", raw)) == [(5, 0), (10, 4200), (100, 9000)]
    idx.close()
    again = OffsetIndex(path, BASE, 4096, writable=False)
    assert again.entries == 3 and again.sane
    assert again.lookup(999) == (BASE, 0)            # below the first entry: segment start
    assert again.lookup(1005) == (1005, 0)
    assert again.lookup(1009) == (1005, 0)
    assert again.lookup(1010) == (1010, 4200)
    assert again.lookup(10 ** 9) == (1100, 9000)
    assert again.lookup_position(4199) == (1005, 0)
    assert again.lookup_position(4200) == (1010, 4200)
    again.close()


def test_offset_index_refuses_non_increasing_and_full(tmp_path):
    idx = OffsetIndex(str(tmp_path / "a.index"), BASE, 16, writable=True)
    idx.append(1001, 10)
    with pytest.raises(CorruptIndexError):
        idx.append(1001, 20)
    idx.append(1002, 20)
    assert idx.is_full
    with pytest.raises(CorruptIndexError):
        idx.append(1003, 30)
    idx.close()


def test_every_refusal_leaves_the_files_as_they_were_and_says_why(tmp_path):
    # The rule lives in IndexFile (the leader's append path calls it directly); each case it refuses
    # changes nothing, and the Python method names the reason.
    idx = OffsetIndex(str(tmp_path / "r.index"), BASE, 8 * 4, writable=True)
    tix = TimeIndex(str(tmp_path / "r.timeindex"), BASE, 12 * 4, writable=True)
    assert idx.add_offset_entry(1010, 100) == native.IndexAppend.INDEX_ADDED
    assert tix.add_time_entry(50, 1010) == native.IndexAppend.INDEX_ADDED
    before = (open(idx.path, "rb").read(), open(tix.path, "rb").read())
    offset_cases = [((1010, 200), "not above the last entry"),              # not increasing
                    ((BASE + (1 << 32), 200), "does not fit 32 bits"),     # relative offset past u32
                    ((1020, 1 << 32), "does not fit 32 bits")]             # position past u32
    for args, why in offset_cases:
        assert idx.add_offset_entry(*args) == native.IndexAppend.INDEX_REFUSED
        with pytest.raises(CorruptIndexError, match=why):
            idx.append(*args)
    assert tix.add_time_entry(50, 1020) == native.IndexAppend.INDEX_NOT_NEEDED   # timestamp not above
    assert tix.maybe_append(49, 1020) is False
    for args, why in [((60, 1005), "below the last entry"), ((60, BASE + (1 << 32)), "does not fit 32 bits")]:
        assert tix.add_time_entry(*args) == native.IndexAppend.INDEX_REFUSED
        with pytest.raises(CorruptIndexError, match=why):
            tix.maybe_append(*args)
    assert (idx.entries, tix.entries) == (1, 1)
    assert (open(idx.path, "rb").read(), open(tix.path, "rb").read()) == before
    idx.trim()
    tix.trim()
    with pytest.raises(CorruptIndexError, match="read-only"):
        idx.append(1020, 200)
    with pytest.raises(CorruptIndexError, match="read-only"):
        tix.maybe_append(60, 1020)
    idx.close()
    tix.close()


def test_untrimmed_crash_tail_is_cut(tmp_path):
    # A crash leaves the preallocated file untrimmed: entries then zeros.
    path = str(tmp_path / "b.index")
    idx = OffsetIndex(path, BASE, 8 * 100, writable=True)
    for i in range(1, 6):
        idx.append(BASE + i * 10, i * 5000)
    idx.flush()
    idx.mm.close()                                   # simulate the process dying: no trim
    idx.mm = None
    assert os.path.getsize(path) == 800
    loaded = OffsetIndex(path, BASE, 8 * 100, writable=False, max_position=1 << 20)
    assert loaded.entries == 5
    assert not loaded.sane                           # owner must rebuild or trust the prefix
    assert loaded.lookup(BASE + 33) == (BASE + 30, 15000)
    loaded.close()


def test_position_beyond_log_is_not_sane(tmp_path):
    path = str(tmp_path / "c.index")
    idx = OffsetIndex(path, BASE, 800, writable=True)
    idx.append(BASE + 1, 100)
    idx.append(BASE + 2, 5000)
    idx.close()
    loaded = OffsetIndex(path, BASE, 800, writable=False, max_position=4000)
    assert loaded.entries == 1 and not loaded.sane
    loaded.close()


def test_time_index_format_and_lookup(tmp_path):
    path = str(tmp_path / "00000000000000001000.timeindex")
    ti = TimeIndex(path, BASE, 1200, writable=True)
    assert os.path.getsize(path) == 1200
    assert ti.maybe_append(100, 1003)
    assert not ti.maybe_append(100, 1004)            # timestamps strictly increase
    assert not ti.maybe_append(50, 1005)
    assert ti.maybe_append(300, 1010)
    ti.trim()
    raw = open(path, "rb").read()
    assert list(struct.iter_unpack(">qI", raw)) == [(100, 3), (300, 10)]
    assert ti.lookup(99) == (-1, BASE)
    assert ti.lookup(100) == (100, 1003)
    assert ti.lookup(299) == (100, 1003)
    assert ti.lookup(10 ** 15) == (300, 1010)
    ti.close()


def test_truncate_to_offset(tmp_path):
    idx = OffsetIndex(str(tmp_path / "d.index"), 0, 800, writable=True)
    ti = TimeIndex(str(tmp_path / "d.timeindex"), 0, 1200, writable=True)
    for i in range(1, 11):
        idx.append(i * 10, i * 100)
        ti.maybe_append(i * 1000, i * 10)
    idx.truncate_to_offset(55)
    ti.truncate_to_offset(55)
    assert idx.entries == 5 and idx.last_entry() == (50, 500)
    assert ti.entries == 5 and ti.last_entry() == (5000, 50)
    idx.close()
    ti.close()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 1 << 31), min_size=1, max_size=3000, unique=True),
       st.lists(st.integers(-5, (1 << 31) + 5), min_size=1, max_size=50))
def test_native_glb_matches_bisect(keys, probes):
    # Covers the warm-section path (more than 1024 entries) and the cold path.
    keys.sort()
    buf = bytearray(len(keys) * 8)
    for i, k in enumerate(keys):
        native.put_offset_entry(buf, i, k, i)
    for t in probes + [keys[0], keys[-1], keys[len(keys) // 2]]:
        want = bisect.bisect_right(keys, t) - 1
        assert native.index_lookup(buf, len(keys), native.INDEX_OFFSET, t) == want


def test_native_time_lookup_matches_bisect():
    rnd = random.Random(7)
    ts = sorted(rnd.sample(range(-10 ** 12, 10 ** 13), 5000))
    buf = bytearray(len(ts) * 12)
    for i, t in enumerate(ts):
        native.put_time_entry(buf, i, t, i)
    for t in [rnd.randrange(-2 * 10 ** 12, 2 * 10 ** 13) for _ in range(500)]:
        assert native.index_lookup(buf, len(ts), native.INDEX_TIME, t) == bisect.bisect_right(ts, t) - 1
