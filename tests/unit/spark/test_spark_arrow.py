"""The native Arrow codec of the Spark data source without Spark or a broker: rows encoded by
build_batches decode back to the same columns through RecordDecoder, whatever the row/byte caps
(every buffer grows from empty, and from the previous batch's size, across many flushes). Also
the read path's receive-buffer pool."""
from __future__ import annotations

import random

import pyarrow as pa
import pytest

from kbroker._native.arrow import ArrowDecodeError, RecordDecoder, build_batches
from kbroker._native.batch import LAYOUT

HEADER = LAYOUT["HEADER_SIZE"]


def _rows(n, seed):
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        key = None if rnd.random() < 0.2 else rnd.randbytes(rnd.randrange(0, 40))
        r = rnd.random()
        value = None if r < 0.1 else rnd.randbytes(rnd.choice([0, 5, 100, 3000, 70000]))
        headers = None if rnd.random() < 0.4 else [
            {"key": f"h{j}", "value": None if rnd.random() < 0.3 else rnd.randbytes(rnd.randrange(0, 20))}
            for j in range(rnd.randrange(1, 4))]
        out.append((key, value, headers))
    return out


def _encode(rows, batch_size):
    keys = pa.array([r[0] for r in rows], pa.binary())
    values = pa.array([r[1] for r in rows], pa.binary())
    htype = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
    headers = pa.array([r[2] for r in rows], htype)
    import numpy as np
    return build_batches(keys, values, headers, np.arange(len(rows), dtype=np.int64), batch_size,
                         timestamp_ms=1_700_000_000_123)


def _decode(batches, include_headers, max_rows, max_bytes, lo=0, hi=1 << 62):
    dec = RecordDecoder(include_headers, max_rows, max_bytes)
    out, base = [], 0
    for data, count in batches:
        section = memoryview(data)[HEADER:]
        pos, idx = 0, 0
        while True:
            pos, idx, full = dec.append(section, count, base, 1_700_000_000_123, -1, 0, lo, hi, pos, idx)
            if not full:
                break
            out.append(dec.flush("t", 3))
        base += count
    if dec.rows:
        out.append(dec.flush("t", 3))
    return out


def _as_rows(rbs, include_headers):
    rows = []
    for rb in rbs:
        assert rb.schema.field("timestamp").type == pa.timestamp("us", tz="UTC")
        d = rb.to_pydict()
        for i in range(rb.num_rows):
            h = d["headers"][i] if include_headers else None
            rows.append((d["offset"][i], d["key"][i], d["value"][i],
                         [{"key": x["key"], "value": x["value"]} for x in h] if h is not None else None))
            assert d["topic"][i] == "t" and d["partition"][i] == 3 and d["timestampType"][i] == 0
            assert int(d["timestamp"][i].timestamp() * 1000) == 1_700_000_000_123
    return rows


@pytest.mark.parametrize("max_rows,max_bytes", [(1, 1 << 20), (7, 300), (50, 200_000), (65536, 32 << 20)])
def test_decode_equals_encoded_rows(max_rows, max_bytes):
    rows = _rows(400, seed=max_rows)
    batches = _encode(rows, 64 * 1024)
    assert len(batches) > 3
    rbs = _decode(batches, True, max_rows, max_bytes)
    want = [(i, k, v, h) for i, (k, v, h) in enumerate(rows)]
    assert _as_rows(rbs, True) == want
    for rb in rbs:
        assert rb.num_rows <= max_rows
        data = sum(len(x or b"") for x in rb.column("key").to_pylist() + rb.column("value").to_pylist())
        assert rb.num_rows == 1 or data <= max_bytes
    # without headers: same keys/values/offsets
    assert [r[:3] for r in _as_rows(_decode(batches, False, max_rows, max_bytes), False)] == \
        [w[:3] for w in want]


def test_decode_keeps_only_the_offset_range():
    rows = _rows(300, seed=9)
    batches = _encode(rows, 16 * 1024)
    got = _as_rows(_decode(batches, True, 13, 1 << 20, lo=37, hi=251), True)
    assert [g[0] for g in got] == list(range(37, 251))
    assert got == [(i, *rows[i]) for i in range(37, 251)]


def test_checker_sees_a_changed_record():
    rows = _rows(50, seed=4)
    batches = _encode(rows, 1 << 20)
    data, count = batches[0]
    damaged = bytearray(data)
    big = next(v for _, v, _ in rows if v is not None and len(v) >= 3000)
    damaged[bytes(damaged).index(big) + 1000] ^= 0xFF      # one byte inside a value
    got = _as_rows(_decode([(bytes(damaged), count)], True, 1000, 1 << 20), True)
    assert got != [(i, *r) for i, r in enumerate(rows)]


def test_truncated_section_is_refused():
    rows = _rows(20, seed=5)
    data, count = _encode(rows, 1 << 20)[0]
    dec = RecordDecoder(True, 1000, 1 << 20)
    with pytest.raises(ArrowDecodeError):
        dec.append(memoryview(data)[HEADER:-3], count, 0, 0, -1, 0, 0, 1 << 40)


def test_fetch_buffers_are_reused_and_bounded():
    from kbroker.spark.kafka import _Buffers
    pool = _Buffers(keep=2, largest=4 << 20)
    first = pool.take(100)
    pool.give(first)
    assert pool.take(50) is first                   # reused, no new allocation
    big = pool.take(8 << 20)
    assert len(big) >= 8 << 20
    pool.give(big)
    assert not pool.free                            # past `largest`: dropped
    held = [pool.take(10) for _ in range(3)]
    for b in held:
        pool.give(b)
    assert len(pool.free) == 2                      # at most `keep` idle
    small = pool.free[-1]
    assert pool.take(len(small) + 1) is not small   # too small for the response: not used
