"""The native segment state (kbroker._native.segment.SegmentState behind LogSegment) against a
plain-Python model of Kafka's LogSegment rules: after every append, truncation and reload the
size, next offset, roll clocks, greatest timestamp, bytes since the last index entry, both index
files' entries, the recent-batch list, and the roll decision agree with the model."""
import random

from kbroker._native.crc import crc32c
from kbroker.log.segment import INT64_MAX, MAX_RELATIVE_OFFSET, TAIL_BATCHES, LogSegment

T0 = 1_700_000_000_000
INTERVAL = 1024
INDEX_BYTES = 144               # small indexes, so "index full" is reached
OFFSET_ENTRIES, TIME_ENTRIES = INDEX_BYTES // 8, INDEX_BYTES // 12


class Model:
    """What a segment must hold after a sequence of appends (Kafka's LogSegment.append)."""

    def __init__(self, base, created_ms):
        self.base = base
        self.created_ms = created_ms
        self.reset()

    def reset(self):
        self.size = 0
        self.next_offset = self.base
        self.first_batch_ms = None
        self.max_ts, self.max_ts_offset = -1, self.base
        self.since_index = 0
        self.index, self.time_index = [], []
        self.batches = []           # (position, size, last offset, max timestamp)

    def append(self, n, last, max_ts):
        pos = self.size
        if max_ts > self.max_ts:
            self.max_ts, self.max_ts_offset = max_ts, last
        if self.since_index > INTERVAL:
            self.index.append((last, pos))
            if not self.time_index or self.max_ts > self.time_index[-1][0]:
                self.time_index.append((self.max_ts, self.max_ts_offset))
            self.since_index = 0
        self.since_index += n
        self.size = pos + n
        self.next_offset = last + 1
        if self.first_batch_ms is None:
            self.first_batch_ms = max_ts
        self.batches.append((pos, n, last, max_ts))

    def index_full(self):
        return len(self.index) >= OFFSET_ENTRIES or len(self.time_index) >= TIME_ENTRIES

    def should_roll(self, batch_size, last, max_ts, now, seg_bytes, seg_ms):
        if self.size == 0:
            return False
        if self.size > seg_bytes - batch_size:
            return True
        if self.first_batch_ms is not None and self.first_batch_ms >= 0:
            waited = max_ts - self.first_batch_ms
        else:
            waited = now - self.created_ms
        return waited > seg_ms or self.index_full() or last - self.base > MAX_RELATIVE_OFFSET

    def tail_covers(self, tail_last, tail_pos, appended):
        """The recent-batch list is a suffix of the batches, at most twice TAIL_BATCHES long, and
        holds at least the last ``appended`` ones (up to TAIL_BATCHES): a reload starts it empty."""
        n = len(tail_last)
        assert n == len(tail_pos) and min(appended, TAIL_BATCHES) <= n <= 2 * TAIL_BATCHES
        if n:
            assert [(b[2], b[0]) for b in self.batches[-n:]] == list(zip(tail_last, tail_pos))


def header(base, n, last, max_ts):
    """A RecordBatch v2 header with a valid CRC plus filler, ``n`` bytes in all (the state, the
    header walks of load() and recovery's CRC scan read nothing else)."""
    h = bytearray(n)
    h[0:8] = base.to_bytes(8, "big")
    h[8:12] = (n - 12).to_bytes(4, "big")
    h[16] = 2
    h[23:27] = (last - base).to_bytes(4, "big")
    h[27:35] = max_ts.to_bytes(8, "big", signed=True)
    h[35:43] = max_ts.to_bytes(8, "big", signed=True)
    h[43:51] = (-1).to_bytes(8, "big", signed=True)
    h[17:21] = crc32c(bytes(h[21:])).to_bytes(4, "big")
    return bytes(h)


def check(seg, m, rng, appended=0):
    assert (seg.size, seg.next_offset, seg.first_batch_ms) == (m.size, m.next_offset, m.first_batch_ms)
    assert (seg.max_timestamp, seg.offset_of_max_timestamp) == (m.max_ts, m.max_ts_offset)
    assert seg.bytes_since_index == m.since_index
    assert [seg.index.entry(i) for i in range(seg.index.entries)] == m.index
    assert [seg.time_index.entry(i) for i in range(seg.time_index.entries)] == m.time_index
    m.tail_covers(seg._tail_last, seg._tail_pos, appended)
    for _ in range(8):
        args = (rng.choice((61, 500, 5000)), m.next_offset + rng.choice((0, 5, MAX_RELATIVE_OFFSET)),
                T0 + rng.choice((-10_000, 0, 50_000, 200_000)), T0 + rng.choice((0, 50_000, 200_000)),
                rng.choice((4000, 60_000, 1 << 30)), rng.choice((60_000, 100_000, INT64_MAX)))
        assert seg.should_roll(*args) == m.should_roll(*args), args


def grow(seg, m, rng, count):
    """Append up to ``count`` batches (fewer when an index fills); -> how many."""
    for i in range(count):
        if m.index_full():
            return i
        base = m.next_offset
        last = base + rng.randrange(0, 4)
        n = rng.choice((61, 120, 700, 1500))
        max_ts = T0 + rng.randrange(-5_000, 100_000)
        seg.append(header(base, n, last, max_ts), base, last, max_ts)
        m.append(n, last, max_ts)
    return count


def test_state_follows_the_model_through_appends_truncation_and_reloads(tmp_path):
    rng = random.Random(11)
    d = str(tmp_path)
    seg = LogSegment(d, 100, INTERVAL, INDEX_BYTES, active=True, now_ms=T0)
    m = Model(100, T0)
    check(seg, m, rng)
    appended = 0
    for step in range(60):
        appended += grow(seg, m, rng, rng.randrange(1, 12))
        check(seg, m, rng, appended)
        if step % 15 == 7 and len(m.batches) > 3:
            # Follower truncation to a batch's base offset: the state is re-derived from the file.
            keep = rng.randrange(1, len(m.batches))
            pos, _n, _last, _ts = m.batches[keep]
            first_cut = m.batches[keep - 1][2] + 1
            seg.truncate_to(first_cut)
            replay, old_index, old_time = m.batches[:keep], m.index, m.time_index
            m.reset()
            for p, n, last, ts in replay:
                m.append(n, last, ts)
            # Truncation keeps the entries below the cut (a time entry may point below it from a
            # later index step: Kafka keeps it too).
            m.index = [e for e in old_index if e[0] < first_cut]
            m.time_index = [e for e in old_time if e[1] < first_cut]
            assert seg.size == pos
            appended = 0            # a reload may start the recent-batch list empty
            check(seg, m, rng)
    # A clean reload of the files gives the same state.
    seg.close()
    again = LogSegment(d, 100, INTERVAL, INDEX_BYTES, active=False, now_ms=T0)
    assert again.load()
    again.make_active()
    check(again, m, rng)
    assert again._tail_last == []
    again.close()


def test_index_full_rolls_and_a_reset_index_does_not(tmp_path):
    """The roll check reads a cached index-full flag: it must follow the index both ways."""
    rng = random.Random(5)
    seg = LogSegment(str(tmp_path), 0, INTERVAL, INDEX_BYTES, active=True, now_ms=T0)
    m = Model(0, T0)
    while not m.index_full():
        grow(seg, m, rng, 1)
    assert seg.should_roll(61, m.next_offset, T0, T0, 1 << 30, INT64_MAX)
    batches, _cut = seg.recover(0)          # rebuild: same entries, still full
    assert seg.should_roll(61, m.next_offset, T0, T0, 1 << 30, INT64_MAX)
    seg.truncate_to(batches[1].base_offset)  # one batch left: no index entry, room again
    assert seg.index.entries == 0
    assert not seg.should_roll(61, seg.next_offset, T0, T0, 1 << 30, INT64_MAX)
    seg.close()
