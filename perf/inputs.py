"""Inputs for the pyperf suites: seeded, randomized and built before any timer starts.

Every generator takes a ``name`` that, with the fixed ``SEED``, picks its own random stream, so two
runs (or two machines) benchmark byte-identical inputs and ``pyperf compare_to`` compares like with
like. Nothing here is timed: a benchmark builds its inputs once per worker process, outside the
measured region.

Pieces:
  * ``size_label(n)``: ``128B``, ``1KiB``, ``64KiB``, ``1MiB`` — the unit suffix of benchmark names.
  * ``random_buffers`` (incompressible bytes, for CRC), ``text_values`` (word soup that compresses
    about as well as log lines do, for the codec benchmarks), ``records``.
  * ``fill_batch``: one uncompressed (or compressed) RecordBatch v2 of up to N bytes, built with the
    project's own ``BatchBuilder`` exactly as the client would send it (baseOffset 0).
  * ``BatchRing``: writable copies of producer batches for benchmarks whose subject stamps the batch
    in place (validate+stamp, Log.append_as_leader). The broker refuses a batch whose baseOffset is not
    0, so each pass hands out copies whose first 8 bytes were reset to 0 *before* the timer starts.
  * ``Sink``: where results go so the timed call is never dead code (and a place to check them).
"""
from __future__ import annotations

import random
import time
import zlib

from kbroker._native import batch as _batch

SEED = 0x6B62726F   # "kbro"
KiB = 1024
MiB = 1024 * KiB

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}

_ZERO_OFFSET = bytes(8)

# A small vocabulary: values made of these words compress roughly like JSON or log lines
# (lz4 about 2-3x, zstd more), unlike random bytes that no codec shrinks.
_WORDS = (b"user", b"order", b"id", b"status", b"ok", b"error", b"timestamp", b"region",
          b"eu-west", b"us-east", b"amount", b"currency", b"EUR", b"USD", b"session", b"click",
          b"view", b"cart", b"checkout", b"payment", b"{", b"}", b":", b",", b"\"", b"true",
          b"false", b"null", b"0", b"1", b"2", b"3", b"4", b"5", b"6", b"7", b"8", b"9")


def size_label(n: int) -> str:
    """Byte count as a benchmark-name suffix: 128B, 1KiB, 64KiB, 1MiB (exact units only)."""
    for unit, scale in (("MiB", MiB), ("KiB", KiB)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


def rng(name: str) -> random.Random:
    """A random stream of its own for each input, fixed by SEED and the input's name."""
    return random.Random(SEED ^ zlib.crc32(name.encode()))


def random_buffers(size: int, count: int, name: str) -> list[bytes]:
    r = rng(name)
    return [r.randbytes(size) for _ in range(count)]


def text_values(count: int, size: int, name: str) -> list[bytes]:
    """``count`` values of exactly ``size`` bytes of random words (compressible)."""
    r = rng(name)
    out = []
    for _ in range(count):
        parts = []
        n = 0
        while n < size:
            w = r.choice(_WORDS)
            parts.append(w)
            parts.append(b" ")
            n += len(w) + 1
        out.append(b"".join(parts)[:size])
    return out


def records(count: int, value_size: int, name: str, *, text: bool = False,
            key_size: int = 16) -> list[tuple[bytes, bytes]]:
    """(key, value) pairs: random keys of ``key_size`` bytes, random or text values."""
    r = rng(name + "/keys")
    keys = [r.randbytes(key_size) for _ in range(count)]
    if text:
        values = text_values(count, value_size, name + "/values")
    else:
        vr = rng(name + "/values")
        values = [vr.randbytes(value_size) for _ in range(count)]
    return list(zip(keys, values))


def fill_batch(max_bytes: int, value_size: int, name: str, *, codec: int = 0,
               text: bool = False, max_records: int | None = None,
               timestamp_ms: int | None = None) -> bytes:
    """One producer RecordBatch v2 of at most ``max_bytes`` bytes (BatchBuilder's limit), filled
    with records of ``value_size``-byte values until the next one would not fit (or
    ``max_records``). Timestamps are now (the log rolls on old CreateTime timestamps)."""
    now = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    limit = max_records if max_records is not None else max_bytes // max(value_size, 1) + 1
    recs = records(limit, value_size, name, text=text)
    builder = _batch.BatchBuilder(codec, max_bytes)
    for i, (k, v) in enumerate(recs):
        if not builder.append(now + i, k, v):
            break
    if builder.record_count == 0:
        raise ValueError(f"no record of {value_size} B fits in {max_bytes} B")
    return builder.build()


class BatchRing:
    """Writable copies of producer batches, handed out in passes.

    ``take(n)`` returns up to ``n`` buffers (at most one pass of the ring) whose baseOffset has been
    reset to 0, ready to be validated/stamped or appended once each. Call it *outside* the timed
    region. The ring totals about ``total_bytes`` so the copies are not all hot in the CPU cache at
    once for the large sizes, as bytes freshly received from many producers would not be either.
    """

    def __init__(self, batches: list[bytes], total_bytes: int):
        per = max(len(b) for b in batches)
        count = max(len(batches), total_bytes // per)
        self.buffers = [bytearray(batches[i % len(batches)]) for i in range(count)]
        self._next = 0

    def __len__(self) -> int:
        return len(self.buffers)

    def take(self, n: int) -> list[bytearray]:
        start = self._next
        stop = min(len(self.buffers), start + n)
        out = self.buffers[start:stop]
        for b in out:
            b[0:8] = _ZERO_OFFSET
        self._next = 0 if stop == len(self.buffers) else stop
        return out


class Sink:
    """Keeps the last result of each benchmark run so no timed call is dead code, and counts the
    runs. (CPython optimizes nothing away, but the discipline costs nothing outside the loop and
    lets a run check its results.)"""

    __slots__ = ("last", "runs")

    def __init__(self):
        self.last = None
        self.runs = 0

    def put(self, value) -> None:
        self.last = value
        self.runs += 1


SINK = Sink()
