"""LogSegment: one write per batch, Kafka's sparse-index rule, translate_offset, roll trimming,
and files that a real client's record reader parses."""
import os
import struct

from kafka.record import MemoryRecords
from kafka.record.default_records import DefaultRecordBatchBuilder

from kbroker._native.batch import validate_and_stamp
from kbroker.log.segment import LogSegment


def stamped(base_offset, n=3, value_size=100, ts=1_700_000_000_000):
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                  producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                  batch_size=1 << 22)
    for i in range(n):
        b.append(i, timestamp=ts + i, key=None, value=bytes([65 + i % 26]) * value_size, headers=[])
    buf = bytearray(b.build())
    info = validate_and_stamp(buf, base_offset, 7, 1 << 22, -1)
    return buf, info


def fill(seg, count, base=None, ts=1_700_000_000_000, **kw):
    """Append ``count`` batches with rising timestamps; returns [(position, size, base, last, max_ts)]."""
    out = []
    off = seg.next_offset if base is None else base
    for k in range(count):
        buf, info = stamped(off, ts=ts + 10 * k, **kw)
        out.append((seg.size, info.size, off, info.last_offset, info.max_timestamp))
        seg.append(buf, off, info.last_offset, info.max_timestamp)
        off = info.last_offset + 1
    return out


def expected_index(batches, interval, base):
    # Kafka's rule, restated independently: before each batch, if more than `interval` bytes
    # were appended since the last entry, index this batch (its last offset, its position).
    entries, since = [], 0
    for pos, size, _b, last, _ts in batches:
        if since > interval:
            entries.append((last - base, pos))
            since = 0
        since += size
    return entries


def test_index_entries_follow_kafka_rule(tmp_path):
    seg = LogSegment(str(tmp_path), 50, 4096, 1 << 20, active=True)
    batches = fill(seg, 60, value_size=300)         # ~1 KiB batches
    seg.on_become_inactive()
    raw = open(seg.index.path, "rb").read()
    assert len(raw) % 8 == 0 and len(raw) > 0        # trimmed on roll
    got = list(struct.iter_unpack(">II", raw))
    assert got == expected_index(batches, 4096, 50)
    # Time index: the max timestamp so far at each offset-index entry (timestamps rise with
    # every batch here), plus the final one on roll.
    traw = open(seg.time_index.path, "rb").read()
    tentries = list(struct.iter_unpack(">qI", traw))
    by_last = {b[3] - 50: b[4] for b in batches}
    assert tentries[:-1] == [(by_last[rel], rel) for rel, _pos in got]
    assert tentries[-1] == (batches[-1][4], batches[-1][3] - 50)
    assert seg._append_fd == -1                      # no writer after roll
    seg.close()


def test_index_interval_zero_indexes_every_batch_after_first(tmp_path):
    seg = LogSegment(str(tmp_path), 0, 0, 1 << 20, active=True)
    batches = fill(seg, 5, value_size=10)
    assert [seg.index.entry(i) for i in range(seg.index.entries)] == [(b[3], b[0]) for b in batches[1:]]
    seg.close()


def test_translate_offset_every_offset(tmp_path):
    seg = LogSegment(str(tmp_path), 0, 1024, 1 << 20, active=True)
    batches = fill(seg, 40, value_size=200)
    for pos, size, base, last, _ts in batches:
        for off in (base, (base + last) // 2, last):
            assert seg.translate_offset(off)[:4] == (pos, size, base, last)
    assert seg.translate_offset(batches[-1][3] + 1) is None
    seg.close()


def test_end_position_whole_batches(tmp_path):
    seg = LogSegment(str(tmp_path), 0, 512, 1 << 20, active=True)
    batches = fill(seg, 20, value_size=150)
    p0, s0 = batches[0][0], batches[0][1]
    # max_bytes smaller than the first batch: KIP-74 returns it whole, or nothing.
    assert seg.end_position(p0, 10, 10 ** 9, True) == p0 + s0
    assert seg.end_position(p0, 10, 10 ** 9, False) == p0
    # A limit in the middle of batch 3 stops before it.
    limit = batches[3][0] + 5 - p0
    assert seg.end_position(p0, limit, 10 ** 9, True) == batches[3][0]
    # max_offset inside batch 5 excludes batch 5.
    assert seg.end_position(p0, 1 << 30, batches[5][2] + 1, True) == batches[5][0]
    seg.close()


def test_log_file_parses_with_kafka_python(tmp_path):
    seg = LogSegment(str(tmp_path), 100, 4096, 1 << 20, active=True)
    fill(seg, 10, n=4)
    seg.close()
    data = open(os.path.join(str(tmp_path), "00000000000000000100.log"), "rb").read()
    recs = MemoryRecords(data)
    offsets = []
    while recs.has_next():
        batch = recs.next_batch()
        assert batch.validate_crc()
        offsets += [r.offset for r in batch]
    assert offsets == list(range(100, 140))


def test_load_after_close_restores_state(tmp_path):
    seg = LogSegment(str(tmp_path), 0, 700, 1 << 20, active=True)
    batches = fill(seg, 30, value_size=100)
    entries = seg.index.entries
    seg.close()
    again = LogSegment(str(tmp_path), 0, 700, 1 << 20, active=False)
    assert again.load()
    assert again.next_offset == batches[-1][3] + 1
    assert again.max_timestamp == max(b[4] for b in batches)
    assert again.index.entries == entries
    again.make_active()
    more = fill(again, 10, value_size=100)
    # Continuing appends keep the exact same index as one uninterrupted run would.
    assert [again.index.entry(i) for i in range(again.index.entries)] == \
        [(e + 0, p) for e, p in expected_index(batches + more, 700, 0)]
    again.close()


def test_roll_rules(tmp_path):
    seg = LogSegment(str(tmp_path), 0, 4096, 1 << 20, active=True, now_ms=0)
    assert not seg.should_roll(100, 0, 10 ** 12, 10 ** 12, 1000, 10)     # empty segments never roll
    fill(seg, 1, value_size=100, ts=1000)
    size = seg.size
    assert not seg.should_roll(100, 3, 1000, 1000, size + 100, 10 ** 9)
    assert seg.should_roll(101, 3, 1000, 1000, size + 100, 10 ** 9)   # would exceed segment.bytes
    # segment.ms: the incoming batch's max timestamp minus the first batch's max timestamp (1002),
    # strictly greater as in Kafka; wall-clock time does not matter once a timestamp is known.
    assert not seg.should_roll(10, 3, 1002 + 500, 10 ** 12, 1 << 30, 500)
    assert seg.should_roll(10, 3, 1002 + 501, 0, 1 << 30, 500)
    assert seg.should_roll(10, (1 << 31), 1000, 1000, 1 << 30, 10 ** 9)  # relative offset overflow
    seg.close()
