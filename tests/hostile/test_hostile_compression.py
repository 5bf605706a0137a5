"""Bounded decompression (kbroker/record/compression.py): the output size read from LZ4/zstd block
headers is an upper bound of the real output (so one decode suffices), a bomb is refused at the cap,
and bytes that are not frames fall back to the growing buffer (still capped)."""
import os
import random

import cramjam
import pytest

from kbroker.record.compression import (LZ4, ZSTD, DecompressionLimitExceeded, _lz4_bound, _zstd_bound, compress,
                                        decompress)


def _payloads():
    r = random.Random(3)
    yield b""
    yield b"x"
    yield os.urandom(200_000)                                          # incompressible: raw blocks
    yield b"\0" * (3 << 20)                                            # RLE / highly compressible
    yield b"".join(r.choice([b"alpha ", b"beta ", b"kafka "]) for _ in range(300_000))


@pytest.mark.parametrize("codec", [LZ4, ZSTD])
def test_header_bound_covers_output(codec):
    bound_of = _lz4_bound if codec == LZ4 else _zstd_bound
    for raw in _payloads():
        frames = [compress(codec, raw)]
        if codec == ZSTD:      # streamed frames carry no content size (as librdkafka writes them)
            c = cramjam.zstd.Compressor()
            c.compress(raw)
            frames.append(bytes(c.finish()))
        for data in frames + [frames[0] + frames[0]]:
            bound = bound_of(memoryview(data))
            assert bound is not None
            out = decompress(codec, data, 64 << 20)
            assert bound >= len(out), (codec, len(raw), bound, len(out))
            assert out == raw * (len(out) // max(len(raw), 1)) if raw else out == b""


@pytest.mark.parametrize("codec", [LZ4, ZSTD])
def test_bomb_refused_at_cap_and_garbage_is_corrupt(codec):
    bomb = compress(codec, b"\0" * (20 << 20))
    with pytest.raises(DecompressionLimitExceeded):
        decompress(codec, bomb, 8 << 20)
    assert (_lz4_bound if codec == LZ4 else _zstd_bound)(memoryview(b"not a frame at all")) is None
    with pytest.raises(Exception) as e:
        decompress(codec, b"not a frame at all", 8 << 20)
    assert "corrupt" in str(e.value) or "exceeds" in str(e.value)
