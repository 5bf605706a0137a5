"""Small fetches from the segments' read blocks (LogSegment.batch_position / end_position / read_bytes
through kbroker.log.segment.read_blocks): every answer must equal the one read from the index and the file
without blocks — positions, ends and the bytes themselves — for readers moving batch by batch, jumping
around, at the tail, and across appends, rolls, follower truncation and a reload. A sequential reader
must need about one pread per block, not three per fetch. The checker is shown to see a stale block."""
import os
import random

from kbroker._native.segment import ReadBlocks
from kbroker.log import Log, LogConfig
from kbroker.log import segment as segment_mod

from test_log import T0, batch


def _reference(seg, offset, max_bytes, max_offset, one):
    """(start, end, bytes) from the index and the file alone: no tail list, no block."""
    saved = seg._tail_last, seg._tail_pos, segment_mod.read_blocks
    seg._tail_last, seg._tail_pos = [], []
    segment_mod.read_blocks = ReadBlocks(0, segment_mod.READ_BLOCK)
    try:
        r = seg.translate_offset(offset)
        if r is None:
            return -1, -1, b""
        end = seg.end_position(r[0], max_bytes, max_offset, one)
        return r[0], end, os.pread(seg.read_fd, end - r[0], r[0])
    finally:
        seg._tail_last, seg._tail_pos, segment_mod.read_blocks = saved


def _with_blocks(seg, offset, max_bytes, max_offset, one):
    start = seg.batch_position(offset)
    if start < 0:
        return -1, -1, b""
    end = seg.end_position(start, max_bytes, max_offset, one)
    data = seg.read_bytes(start, end - start)
    return start, end, (bytes(data) if data is not None else os.pread(seg.read_fd, end - start, start))


def _mismatches(log, offsets, rng, fixed=None):
    """Reads of ``offsets`` under random limits (or ``fixed`` (max_bytes, one)) against _reference."""
    bad = []
    for off in offsets:
        for seg in log.segments:
            if seg.base_offset <= off <= seg.next_offset:
                break
        max_bytes = rng.choice((1, 60, 200, 900, 5000, 1 << 20))
        max_offset = rng.randrange(off, seg.next_offset + 2)
        one = rng.random() < 0.8
        if fixed:
            (max_bytes, one), max_offset = fixed, log.log_end_offset
        got = _with_blocks(seg, off, max_bytes, max_offset, one)
        want = _reference(seg, off, max_bytes, max_offset, one)
        if got != want:
            bad.append((seg.base_offset, off, max_bytes, max_offset, one, got[:2], want[:2], got[2] == want[2]))
    return bad


class _CountingBlocks:
    """segment_mod.read_blocks with each block read from the file listed as a "pread"."""

    def __init__(self, inner, calls):
        self.inner, self.calls, self.limit = inner, calls, inner.limit

    def get(self, seg):
        return self.inner.get(seg)

    def forget(self, seg):
        self.inner.forget(seg)

    def load(self, seg, fd, pos, size):
        self.calls.append("pread")
        return self.inner.load(seg, fd, pos, size)

    def holding(self, seg, fd, start, n, size):
        before = self.inner.get(seg)
        block = self.inner.holding(seg, fd, start, n, size)
        if block is not None and block is not before:
            self.calls.append("pread")
        return block


def _count_file_reads(monkeypatch) -> list:
    """From now on every file read ("pread": os.pread and block loads) and native header walk in the
    file ("seek") is listed."""
    calls = []
    real_pread, real_seek = os.pread, segment_mod._native.seek_batch
    monkeypatch.setattr(os, "pread", lambda *a: calls.append("pread") or real_pread(*a))
    monkeypatch.setattr(segment_mod._native, "seek_batch", lambda *a: calls.append("seek") or real_seek(*a))
    monkeypatch.setattr(segment_mod, "read_blocks", _CountingBlocks(segment_mod.read_blocks, calls))
    return calls


def _grow(log, rng, n):
    for _ in range(n):
        log.append_as_leader(batch(rng.randint(1, 5), rng.choice((10, 100, 700))), 0, T0)


def _readers(log, rng):
    """A sequential reader from the start, a random one, and one at the tail."""
    end = log.log_end_offset
    start = log.log_start_offset
    seq = list(range(start, end + 1))
    jumps = [rng.randrange(start, end + 2) for _ in range(300)]
    tail = [rng.randrange(max(start, end - 20), end + 1) for _ in range(100)]
    return seq + jumps + tail


def test_block_answers_equal_the_file_through_appends_rolls_truncation_and_reload(tmp_path):
    rng = random.Random(5)
    cfg = {"segment.bytes": 64 * 1024, "index.interval.bytes": 4096}
    log = Log(str(tmp_path / "t-0"), "t", 0, LogConfig(cfg))
    _grow(log, rng, 40)
    assert _mismatches(log, _readers(log, rng), rng) == []
    _grow(log, rng, 600)                        # several rolls; reads interleaved with appends below
    assert len(log.segments) > 2
    assert _mismatches(log, _readers(log, rng), rng) == []
    for _ in range(30):
        _grow(log, rng, 3)
        assert _mismatches(log, [log.log_end_offset - k for k in range(6)], rng) == []
    end = log.log_end_offset
    log.truncate_to(end - 37)                   # a follower's truncation inside the cached range
    assert _mismatches(log, _readers(log, rng), rng) == []
    _grow(log, rng, 50)                         # new bytes where the cut ones were
    assert _mismatches(log, _readers(log, rng), rng) == []
    log.close()
    log = Log(str(tmp_path / "t-0"), "t", 0, LogConfig(cfg))
    assert _mismatches(log, _readers(log, rng), rng) == []
    log.close()


def test_truncation_drops_the_block_before_new_bytes_take_the_cut_positions(tmp_path):
    log = Log(str(tmp_path / "t-0"), "t", 0, LogConfig({}))
    for _ in range(30):
        log.append_as_leader(batch(1, 100), 0, T0)
    seg = log.segments[-1]
    old = _with_blocks(seg, 25, 200, log.log_end_offset, True)
    assert old[2] == _reference(seg, 25, 200, log.log_end_offset, True)[2]
    log.truncate_to(20)
    for _ in range(10):
        log.append_as_leader(batch(1, 100, ts=T0 + 5000), 0, T0)   # other bytes, same sizes
    new = _with_blocks(seg, 25, 200, log.log_end_offset, True)
    assert new[:2] == old[:2] and new[2] != old[2]
    assert new == _reference(seg, 25, 200, log.log_end_offset, True)
    log.close()


def test_a_sequential_reader_needs_one_pread_per_block(tmp_path, monkeypatch):
    log = Log(str(tmp_path / "t-0"), "t", 0, LogConfig({}))
    for _ in range(2000):
        log.append_as_leader(batch(1, 100), 0, T0)   # ~170 B batches: ~96 per 16 KiB block
    calls = _count_file_reads(monkeypatch)
    seg = log.segments[-1]
    n = 1000
    for off in range(100, 100 + n):
        start = seg.batch_position(off)
        end = seg.end_position(start, 200, log.log_end_offset, True)
        assert seg.read_bytes(start, end - start) is not None
    # without blocks: a header walk for the start, one for the end and the data pread per fetch
    assert len(calls) <= n // 80 + 3, calls.count("pread")
    log.close()


def test_the_checker_sees_a_stale_block(tmp_path):
    rng = random.Random(9)
    log = Log(str(tmp_path / "t-0"), "t", 0, LogConfig({}))
    _grow(log, rng, 200)
    seg = log.segments[-1]
    _with_blocks(seg, 10, 200, log.log_end_offset, True)    # a small read: a block at offset 10's batch
    block = segment_mod.read_blocks.get(seg)
    at = block.pos + segment_mod._HEADER + 5        # one byte of the block's first batch's records
    fd = os.open(seg.log_path, os.O_WRONLY)
    try:
        os.pwrite(fd, bytes([block.data[at - block.pos] ^ 0xFF]), at)   # the file now differs from the block
    finally:
        os.close(fd)
    seg._tail_last, seg._tail_pos = [], []          # so reads near the end come from the block too
    bad = _mismatches(log, range(10, 40), rng, fixed=(200, True))
    assert bad and not bad[0][-1]                   # same positions, other bytes
    log.close()


def test_large_reads_load_no_blocks(tmp_path, monkeypatch):
    """Reads sent with sendfile (limits above a block) read the file exactly as without blocks."""
    log = Log(str(tmp_path / "t-0"), "t", 0, LogConfig({}))
    for _ in range(3000):
        log.append_as_leader(batch(1, 100), 0, T0)
    calls = _count_file_reads(monkeypatch)

    def reads():
        calls.clear()
        off, ends = 0, []
        while off < 2500:
            data = log.read(off, 100 * 1024, log.log_end_offset)
            ends.append(data.regions[0][1:])
            off += data.size // 171                  # one-record batches of 171 B
        return ends, list(calls)

    with_blocks = reads()
    blocks = segment_mod.read_blocks
    monkeypatch.setattr(segment_mod, "read_blocks", ReadBlocks(0, segment_mod.READ_BLOCK))
    without = reads()
    assert with_blocks == without and blocks.get(log.segments[-1]) is None
    log.close()


def test_large_reads_inside_the_recent_batch_list_touch_no_file(tmp_path, monkeypatch):
    """The capacity fetch's shape, scaled down: reads of several batches' worth (sent with sendfile)
    that cut below the log end, each starting where the last ended or inside a batch. Inside the
    recent-batch list (SegmentState's tail bounds) Log.read finds the start and the cut with no
    header walk and no pread, and its region equals the one read from the index and the file."""
    monkeypatch.setattr(segment_mod, "TAIL_BATCHES", 64)
    log = Log(str(tmp_path / "t-0"), "t", 0, LogConfig({}))
    for _ in range(60):                              # < 2 x 64: the list holds every batch
        log.append_as_leader(batch(4, 1000), 0, T0)  # ~4 KiB batches of offsets 4k..4k+3
    seg = log.segments[-1]
    leo = log.log_end_offset
    max_bytes = seg.size * 7 // 120                 # 3.5 batches' worth: cut after the third
    offsets = list(range(0, leo, 12)) + [2, 45, 101, leo - 13, leo - 6]
    want = [_reference(seg, off, max_bytes, leo, True)[:2] for off in offsets]
    calls = _count_file_reads(monkeypatch)
    got = []
    for off in offsets:
        (_fd, pos, length), = log.read(off, max_bytes, leo).regions
        got.append((pos, pos + length))
    assert got == want and calls == []
    assert sum(b < seg.size for _a, b in got) >= len(offsets) - 3      # cut by the limit, not the log end
    log.close()


def test_a_broker_serves_batch_by_batch_readers_the_records_written(bootstrap):
    """A real broker, raw Fetch v11 one batch at a time (partition_max_bytes 1: KIP-74's first batch)
    while more is produced: every answer is the next batch, CRC-checked, with the value written. With
    one byte of a read block wrong the answers would carry it (test_the_checker_sees_a_stale_block)."""
    from test_broker_fetch import Raw, create_topic, fetch_records, produce, unique

    topic = create_topic(bootstrap, unique("read-block"))
    rng = random.Random(13)
    values = []

    def write(n):
        for _ in range(n):
            v = f"v{len(values)}-".encode() + b"x" * rng.randrange(0, 300)
            values.append(v)
            assert produce(raw, topic, 0, [(T0 + len(values), None, v)])["error_code"] == 0

    with Raw(bootstrap) as raw:
        write(400)
        for offset in range(400):
            if offset % 50 == 0:
                write(6)                          # appends between the reads
            p, records = fetch_records(raw, topic, 0, offset, partition_max_bytes=1)
            assert p["error_code"] == 0
            assert [(r[0], r[3]) for r in records] == [(offset, values[offset])], offset
            assert p["high_watermark"] == len(values)
        # a limit below two batches: whole batches only, never past the high watermark
        p, records = fetch_records(raw, topic, 0, len(values) - 3, partition_max_bytes=700)
        assert [r[0] for r in records] == list(range(len(values) - 3, len(values)))[:len(records)]
        assert records and records[-1][0] < p["high_watermark"]
