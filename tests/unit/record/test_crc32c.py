"""CRC-32C: golden values, hardware vs table path, and the crc32c package as
an independent oracle over many sizes and alignments."""
import mmap
import os
import random
import subprocess
import sys

import crc32c as crc32c_pkg
import pytest

from kbroker._native import crc
from kbroker.record.reference import crc32c as ref_crc32c

GOLDEN = [
    (b"", 0),
    (b"123456789", 0xE3069283),
    (b"a", 0xC1D04330),
    (bytes(32), 0x8A9136AA),
    (b"\xff" * 32, 0x62A8AB43),
    (bytes(range(32)), 0x46DD794E),
]

# Sizes around every branch of the C code: alignment prologue, 8-byte steps,
# the 3 x 256 and 3 x 8192 interleaved blocks, and the tails after them.
SIZES = [0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 63, 64, 255, 256, 767, 768, 769, 775,
         776, 1000, 4095, 4096, 4097, 24575, 24576, 24577, 24583, 24584, 50000,
         100003, 1 << 20]


@pytest.mark.parametrize("data,expected", GOLDEN)
def test_golden(data, expected):
    assert crc.crc32c(data) == expected
    assert crc._crc32c_table(data) == expected
    assert ref_crc32c(data) == expected


def test_buffer_types():
    data = b"123456789"
    assert crc.crc32c(bytearray(data)) == 0xE3069283
    assert crc.crc32c(memoryview(data)) == 0xE3069283
    assert crc.crc32c(memoryview(b"xx" + data)[2:]) == 0xE3069283
    with mmap.mmap(-1, len(data)) as m:
        m.write(data)
        assert crc.crc32c(m) == 0xE3069283


def test_rejects_non_buffers_and_bad_seed():
    with pytest.raises(TypeError):
        crc.crc32c("123456789")
    with pytest.raises(BufferError):
        crc.crc32c(memoryview(b"abcdef")[::2])  # not contiguous
    with pytest.raises(ValueError):
        crc.crc32c(b"x", 1 << 32)
    with pytest.raises(OverflowError):
        crc.crc32c(b"x", -1)


def test_incremental_equals_one_shot():
    rnd = random.Random(7)
    data = rnd.randbytes(200_000)
    whole = crc.crc32c(data)
    for _ in range(50):
        cuts = sorted(rnd.sample(range(len(data)), 5))
        value = 0
        prev = 0
        for cut in cuts + [len(data)]:
            value = crc.crc32c(data[prev:cut], value)
            prev = cut
        assert value == whole
    assert crc._crc32c_table(data[1000:], crc._crc32c_table(data[:1000])) == whole


@pytest.mark.parametrize("size", SIZES)
def test_matches_crc32c_package_all_alignments(size):
    rnd = random.Random(size)
    raw = bytearray(rnd.randbytes(size + 16))
    for offset in range(9):
        view = memoryview(raw)[offset:offset + size]
        expected = crc32c_pkg.crc32c(bytes(view))
        assert crc.crc32c(view) == expected, (size, offset)
        assert crc._crc32c_table(view) == expected, (size, offset)


def test_matches_reference_random():
    rnd = random.Random(1)
    for _ in range(200):
        data = rnd.randbytes(rnd.randrange(0, 600))
        seed = rnd.getrandbits(32)
        assert crc.crc32c(data, seed) == ref_crc32c(data, seed) == crc32c_pkg.crc32c(data, seed)


def test_hardware_flag_matches_cpu():
    with open("/proc/cpuinfo") as f:
        has_sse42 = " sse4_2" in f.read()
    if sys.platform == "linux" and os.uname().machine == "x86_64":
        assert crc.hardware() == has_sse42
    else:
        assert crc.hardware() is False


def test_env_forces_table_path():
    code = ("from kbroker._native import crc; import os;"
            "d = os.urandom(100000); import crc32c;"
            "assert crc.crc32c(d) == crc32c.crc32c(d);"
            "print(crc.hardware(), crc.crc32c(b'123456789'))")
    env = dict(os.environ, KBROKER_CRC32C_SOFTWARE="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    assert out == ["False", str(0xE3069283)]
