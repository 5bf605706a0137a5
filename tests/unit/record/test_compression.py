"""kbroker.record.compression: round trips, interop with aiokafka's and
kafka-python's codecs, the decompression cap, and bomb resistance."""
import os
import random
import struct
import subprocess
import sys
import textwrap
import zlib

import aiokafka.codec as aio_codec
import kafka.codec as kp_codec
import pytest

from kbroker.protocol.types import uvarint_bytes
from kbroker.record import compression as C

CODECS = [C.NONE, C.GZIP, C.SNAPPY, C.LZ4, C.ZSTD]
SIZES = [0, 1, 100, 32 * 1024 - 1, 32 * 1024, 32 * 1024 + 1, 200_000]


def payload(size, seed=0):
    rnd = random.Random(seed)
    words = [rnd.randbytes(rnd.randrange(1, 12)) for _ in range(50)]
    out = bytearray()
    while len(out) < size:
        out += rnd.choice(words)
    return bytes(out[:size])


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("size", SIZES)
def test_round_trip_and_exact_cap(codec, size):
    data = payload(size, size)
    blob = C.compress(codec, data)
    assert C.decompress(codec, blob, size) == data
    assert C.decompress(codec, memoryview(blob), size + 1000) == data
    if size:
        with pytest.raises(C.DecompressionLimitExceeded):
            C.decompress(codec, blob, size - 1)


def test_interop_with_aiokafka_codecs():
    data = payload(100_000, 3)
    # aiokafka -> us
    assert C.decompress(C.GZIP, aio_codec.gzip_encode(data), len(data)) == data
    assert C.decompress(C.SNAPPY, aio_codec.snappy_encode(data), len(data)) == data
    assert C.decompress(C.SNAPPY, aio_codec.snappy_encode(data, xerial_compatible=False),
                        len(data)) == data
    assert C.decompress(C.LZ4, aio_codec.lz4_encode(data), len(data)) == data
    assert C.decompress(C.ZSTD, aio_codec.zstd_encode(data), len(data)) == data
    # us -> aiokafka
    assert aio_codec.gzip_decode(C.compress(C.GZIP, data)) == data
    assert aio_codec.snappy_decode(C.compress(C.SNAPPY, data)) == data
    assert aio_codec.lz4_decode(C.compress(C.LZ4, data)) == data
    assert aio_codec.zstd_decode(C.compress(C.ZSTD, data)) == data


def test_interop_with_kafka_python_gzip():
    data = payload(50_000, 4)
    assert kp_codec.gzip_decode(C.compress(C.GZIP, data)) == data
    assert C.decompress(C.GZIP, kp_codec.gzip_encode(data), len(data)) == data


def test_gzip_accepts_zlib_and_concatenated_members():
    data = payload(10_000, 5)
    assert C.decompress(C.GZIP, zlib.compress(data), len(data)) == data
    two = C.compress(C.GZIP, data[:4000]) + C.compress(C.GZIP, data[4000:])
    assert C.decompress(C.GZIP, two, len(data)) == data
    with pytest.raises(C.DecompressionLimitExceeded):
        C.decompress(C.GZIP, two, len(data) - 1)


def test_xerial_framing_layout():
    data = payload(70_000, 6)
    blob = C.compress(C.SNAPPY, data)
    magic, version, compat = struct.unpack_from(">8sii", blob)
    assert (magic, version, compat) == (b"\x82SNAPPY\x00", 1, 1)
    pos, chunks = 16, 0
    while pos < len(blob):
        (n,) = struct.unpack_from(">i", blob, pos)
        pos += 4 + n
        chunks += 1
    assert pos == len(blob)
    assert chunks == 3  # 32 KiB of input per chunk


@pytest.mark.parametrize("codec", [C.GZIP, C.SNAPPY, C.LZ4, C.ZSTD])
def test_corrupt_input_raises_compression_error(codec):
    blob = bytearray(C.compress(codec, payload(5000, 7)))
    rnd = random.Random(codec)
    bad = [bytes(blob[: len(blob) // 2]), b"\x00" * 20, b"garbage!" * 5]
    for _ in range(30):
        mutated = bytearray(blob)
        mutated[rnd.randrange(len(mutated))] ^= 1 << rnd.randrange(8)
        bad.append(bytes(mutated))
    raised = 0
    for b in bad:
        try:
            C.decompress(codec, b, 1 << 20)
        except C.CompressionError:
            raised += 1
    # Truncation and garbage always fail; bit flips may hit slack bits.
    assert raised >= 3


def test_unknown_codec():
    with pytest.raises(C.CompressionError):
        C.compress(5, b"x")
    with pytest.raises(C.CompressionError):
        C.decompress(7, b"x", 10)


BOMB_SCRIPT = textwrap.dedent("""
    import resource, sys
    from kbroker.record import compression as C
    codec, path = int(sys.argv[1]), sys.argv[2]
    blob = open(path, "rb").read()
    C.decompress(codec, C.compress(codec, b"warm up" * 1000), 1 << 20)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        C.decompress(codec, blob, 1 << 20)
    except C.DecompressionLimitExceeded:
        print("raised", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
    else:
        print("accepted")
""")


@pytest.mark.parametrize("codec", [C.GZIP, C.SNAPPY, C.LZ4, C.ZSTD])
def test_bomb_is_refused_without_inflating(codec, tmp_path):
    # 50 MB of zeros, cap 1 MB: must raise, and peak RSS may grow by only a
    # few MB (the cap plus codec state), never by anything near 50 MB.
    path = tmp_path / "bomb"
    path.write_bytes(C.compress(codec, bytes(50 * 1024 * 1024)))
    out = subprocess.run([sys.executable, "-c", BOMB_SCRIPT, str(codec), str(path)],
                         check=True, capture_output=True, text=True).stdout.split()
    assert out[0] == "raised"
    grown_kib = int(out[1])
    assert grown_kib < 12 * 1024, f"peak RSS grew by {grown_kib} KiB"


def test_snappy_output_bounded_from_headers_before_decoding():
    # Each block's preamble states its length: a xerial stream whose stated lengths sum past the
    # cap is refused as too large before any block is decoded (the blocks here are garbage that
    # decoding would call corrupt), and so is a raw block claiming too much.
    block = uvarint_bytes(600_000) + b"\xff" * 20
    xerial = C._XERIAL_HEADER.pack(C.XERIAL_MAGIC, 1, 1) + b"".join(
        struct.pack(">i", len(block)) + block for _ in range(2))
    with pytest.raises(C.DecompressionLimitExceeded):
        C.decompress(C.SNAPPY, xerial, 1_000_000)
    with pytest.raises(C.CompressionError) as e:
        C.decompress(C.SNAPPY, xerial, 2_000_000)      # under the cap: now decoded, and corrupt
    assert not isinstance(e.value, C.DecompressionLimitExceeded)
    with pytest.raises(C.DecompressionLimitExceeded):
        C.decompress(C.SNAPPY, uvarint_bytes(1 << 30) + b"\x00", 1 << 20)


def test_gzip_size_hint_may_lie():
    # The gzip trailer's ISIZE only sizes the first try: too small means a retry, too large is
    # clamped to the cap; the output is right either way.
    raw = payload(300_000)
    gz = bytearray(C.compress(C.GZIP, raw))
    for isize in (1, 5_000_000_000 % (1 << 32), len(raw)):
        struct.pack_into("<I", gz, len(gz) - 4, isize)
        # zlib checks ISIZE at the end of the member: a lying one is corrupt, never a crash.
        try:
            assert C.decompress(C.GZIP, gz, 1 << 20) == raw
        except C.CompressionError as e:
            assert isize != len(raw) and "corrupt" in str(e)
    raw2 = payload(200_000, 5)
    two = C.compress(C.GZIP, raw) + C.compress(C.GZIP, raw2)   # the hint is the last member's
    assert C.decompress(C.GZIP, two, 1 << 20) == raw + raw2
    with pytest.raises(C.DecompressionLimitExceeded):
        C.decompress(C.GZIP, two, len(raw) + len(raw2) - 1)
    assert C.decompress(C.GZIP, two, len(raw) + len(raw2)) == raw + raw2


def test_scratch_reused_and_trimmed():
    a = C.compress(C.LZ4, payload(100_000))
    v1 = C.decompress_view(C.LZ4, a, 1 << 20)
    v2 = C.decompress_view(C.LZ4, a, 1 << 20)
    assert v1.obj is v2.obj                       # one buffer per thread, no fresh memory per call
    big = C.compress(C.ZSTD, bytes(C.SCRATCH_KEEP + 1))
    assert len(C.decompress_view(C.ZSTD, big, 64 << 20)) == C.SCRATCH_KEEP + 1
    C.trim_scratch()                              # a big batch's buffer is not kept
    assert C.decompress_view(C.LZ4, a, 1 << 20).obj is not v1.obj
    assert len(C.decompress_view(C.LZ4, a, 1 << 20).obj) <= C.SCRATCH_KEEP
