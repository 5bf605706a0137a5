"""Compression codecs of Kafka's RecordBatch v2 (attributes bits 0-2).

When a batch is compressed, everything after recordsCount (byte 61) is one
compressed blob in the codec's stream format:
  1 gzip   - a gzip member (zlib streams are accepted on read too)
  2 snappy - xerial framing as written by Kafka's Java client:
             b"\\x82SNAPPY\\x00" | version i32 | compatible i32 |
             ([blockLen i32][raw snappy block])*   (big-endian ints)
             Plain raw snappy (no framing) is accepted on read.
  3 lz4    - the LZ4 *frame* format (independent blocks)
  4 zstd   - a zstd frame

``decompress`` never produces more than ``max_size`` bytes: snappy states every
block's length up front (the whole output is summed and refused before anything
is allocated), gzip is inflated natively into a buffer of at most ``max_size + 1``
bytes, and lz4/zstd decode into a buffer sized from their frame/block headers
(at most ``max_size + 1``), so a decompression bomb costs at most the cap in
memory before it is refused.

Validating a producer's compressed batch normally decodes nothing here: gzip, lz4
and zstd sections are streamed through a small window and walked as they decode
(kbroker._native.codec.check_section). ``decompress_view`` is the validation path
for the rest (snappy; lz4 frames with linked or > 256 KiB blocks; zstd frames with
windows > 16 MiB; KBROKER_CODEC_STREAMING=0): it decodes
into this thread's reusable scratch buffer instead of fresh memory (fresh
multi-MiB buffers cost page faults and zero-filling on every batch, more than
lz4 itself) and returns a view that stays valid until the thread's next call.
Every codec runs with the GIL released (zlib natively, cramjam's *_into calls
release it themselves), so validation can run on executor threads.
"""
from __future__ import annotations

import mmap
import struct
import threading
import zlib

import cramjam

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
CODECS = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}

XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = struct.Struct(">8sii")
_XERIAL_BLOCK = 32 * 1024  # uncompressed bytes per chunk, like the Java client
# A thread keeps at most this much scratch between calls (bigger batches get a buffer of their own
# that is dropped afterwards, so an attack's memory goes back).
SCRATCH_KEEP = 8 << 20


class CompressionError(ValueError):
    """Corrupt compressed data, an unknown codec, or output above the cap."""


class DecompressionLimitExceeded(CompressionError):
    """The decompressed output would exceed ``max_size``."""


def compress(codec: int, data) -> bytes:
    """Compress ``data`` (any buffer) with Kafka codec ``codec``."""
    if codec == NONE:
        return bytes(data)
    if codec == GZIP:
        c = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        return c.compress(data) + c.flush()
    if codec == SNAPPY:
        return _xerial_compress(memoryview(data).cast("B"))
    if codec == LZ4:
        c = cramjam.lz4.Compressor(content_checksum=False, block_linked=False)
        c.compress(bytes(data))
        return bytes(c.finish())
    if codec == ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise CompressionError(f"unknown compression codec {codec}")


def decompress(codec: int, data, max_size: int) -> bytes:
    """Decompress ``data``; raise DecompressionLimitExceeded as soon as the
    output would exceed ``max_size`` bytes, CompressionError if corrupt."""
    if codec == NONE:
        if len(data) > max_size:
            raise DecompressionLimitExceeded(f"{len(data)} bytes > cap {max_size}")
        return bytes(data)
    try:
        return bytes(decompress_view(codec, data, max_size))
    finally:
        trim_scratch()


class _Scratch(threading.local):
    buf = None


_scratch = _Scratch()


_MMAP_FROM = 1 << 20


def _scratch_view(size: int) -> memoryview:
    """A writable view of at least ``size`` bytes of this thread's scratch buffer."""
    buf = _scratch.buf
    if buf is None or len(buf) < size:
        have = 0 if buf is None else len(buf)
        # Grow geometrically while below the keep limit, exactly above it.
        grown = max(size, min(2 * have, SCRATCH_KEEP))
        # bytearray(n) zero-fills n bytes holding the GIL (tens of milliseconds at a bomb cap's size,
        # stalling the loop); an anonymous mapping is zero pages faulted in as the decompressor writes them.
        buf = _scratch.buf = bytearray(grown) if grown < _MMAP_FROM else mmap.mmap(-1, grown)
    return memoryview(buf)


def trim_scratch() -> None:
    """Drop this thread's scratch buffer if it grew past SCRATCH_KEEP (after a big batch)."""
    buf = _scratch.buf
    if buf is not None and len(buf) > SCRATCH_KEEP:
        _scratch.buf = None


def decompress_view(codec: int, data, max_size: int) -> memoryview:
    """Decompress ``data`` (codec 1-4) into this thread's scratch buffer; the returned view is
    valid until this thread's next call here. Same errors and cap as ``decompress``."""
    view = memoryview(data).cast("B")
    if codec == GZIP:
        return _inflate(view, max_size)
    if codec == SNAPPY:
        if view[:8] == XERIAL_MAGIC:
            return _xerial_decompress(view, max_size)
        return _snappy_raw(view, max_size)
    if codec in (LZ4, ZSTD):
        return _decode_into(cramjam.lz4 if codec == LZ4 else cramjam.zstd, view, max_size)
    raise CompressionError(f"unknown compression codec {codec}")


_INFLATE_ERRORS = {1: "corrupt gzip data", 2: "truncated gzip stream"}


def _inflate(view: memoryview, max_size: int) -> memoryview:
    # Native zlib inflate (gzip or zlib headers, concatenated members) without the GIL. The
    # gzip trailer's ISIZE (the last member's length mod 2^32) sizes the first try; a wrong
    # guess only costs a re-inflate into a 4x larger buffer, never more than the cap.
    from kbroker._native.batch import inflate_into
    limit = max_size + 1
    hint = int.from_bytes(view[-4:], "little") if len(view) >= 18 else 0
    size = min(limit, max(hint + 1, 64 * 1024))
    while True:
        out = _scratch_view(size)[:size]
        n, err = inflate_into(view, out)
        if err == 3:                               # the buffer filled up first
            if size >= limit:
                raise DecompressionLimitExceeded(f"gzip output exceeds cap {max_size}")
            size = min(limit, size * 4)
            continue
        if err:
            raise CompressionError(_INFLATE_ERRORS[err])
        if n > max_size:
            raise DecompressionLimitExceeded(f"gzip output exceeds cap {max_size}")
        return out[:n]


def _snappy_len(block: memoryview) -> int:
    try:
        return cramjam.snappy.decompress_raw_len(block)
    except Exception as e:
        raise CompressionError(f"corrupt snappy block: {e}") from None


def _snappy_into(block: memoryview, out: memoryview) -> None:
    try:
        n = cramjam.snappy.decompress_raw_into(block, out)
    except Exception as e:
        raise CompressionError(f"corrupt snappy block: {e}") from None
    if n != len(out):
        raise CompressionError("snappy block shorter than its stated length")


def _snappy_raw(view: memoryview, max_size: int) -> memoryview:
    n = _snappy_len(view)
    if n > max_size:
        raise DecompressionLimitExceeded(f"snappy output {n} exceeds cap {max_size}")
    out = _scratch_view(n)[:n]
    _snappy_into(view, out)
    return out


def _xerial_compress(view: memoryview) -> bytes:
    parts = [_XERIAL_HEADER.pack(XERIAL_MAGIC, 1, 1)]
    for start in range(0, len(view), _XERIAL_BLOCK):
        block = bytes(cramjam.snappy.compress_raw(view[start:start + _XERIAL_BLOCK]))
        parts.append(struct.pack(">i", len(block)))
        parts.append(block)
    return b"".join(parts)


def _xerial_decompress(view: memoryview, max_size: int) -> memoryview:
    # Every block states its uncompressed length (the raw snappy preamble): sum them over the
    # framing first and refuse an oversized total before allocating any output.
    if len(view) < _XERIAL_HEADER.size:
        raise CompressionError("truncated xerial snappy header")
    blocks = []
    total = 0
    pos = _XERIAL_HEADER.size
    while pos < len(view):
        if pos + 4 > len(view):
            raise CompressionError("truncated xerial snappy block length")
        (n,) = struct.unpack_from(">i", view, pos)
        pos += 4
        if n < 0 or pos + n > len(view):
            raise CompressionError("xerial snappy block runs past the data")
        block = view[pos:pos + n]
        length = _snappy_len(block)
        total += length
        if total > max_size:
            raise DecompressionLimitExceeded(f"snappy output exceeds cap {max_size}")
        blocks.append((block, length))
        pos += n
    out = _scratch_view(total)[:total]
    at = 0
    for block, length in blocks:
        _snappy_into(block, out[at:at + length])
        at += length
    return out


def _lz4_bound(view) -> int | None:
    """Upper bound of an LZ4 frame sequence's output from its block headers (each block holds at most
    the frame's block maximum), or None when the bytes are not frames we can walk."""
    total, pos, n = 0, 0, len(view)
    while pos < n:
        if n - pos < 7 or bytes(view[pos:pos + 4]) != b"\x04\x22\x4d\x18":
            return None
        flg, bd = view[pos + 4], view[pos + 5]
        if flg >> 6 != 1:
            return None
        block_max = {4: 64 << 10, 5: 256 << 10, 6: 1 << 20, 7: 4 << 20}.get((bd >> 4) & 7)
        if block_max is None:
            return None
        pos += 6
        if flg & 0x08:                    # content size: exact
            if n - pos < 8:
                return None
            total += int.from_bytes(view[pos:pos + 8], "little")
            block_max = 0
            pos += 8
        pos += (4 if flg & 0x01 else 0) + 1
        while True:
            if n - pos < 4:
                return None
            size = int.from_bytes(view[pos:pos + 4], "little")
            pos += 4
            if size == 0:
                break
            raw = size & 0x7FFFFFFF
            total += raw if size & 0x80000000 and block_max else block_max
            pos += raw + (4 if flg & 0x10 else 0)
        pos += 4 if flg & 0x04 else 0
    return total


def _zstd_bound(view) -> int | None:
    """Upper bound of a zstd frame sequence's output from its frame and block headers (a compressed
    block regenerates at most 128 KiB), or None when the bytes are not frames we can walk."""
    total, pos, n = 0, 0, len(view)
    while pos < n:
        if n - pos < 6 or bytes(view[pos:pos + 4]) != b"\x28\xb5\x2f\xfd":
            return None
        fhd = view[pos + 4]
        single = (fhd >> 5) & 1
        fcs_size = (1 if single else 0) if fhd >> 6 == 0 else (2, 4, 8)[(fhd >> 6) - 1]
        pos += 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3]
        if fcs_size:
            if n - pos < fcs_size:
                return None
            fcs = int.from_bytes(view[pos:pos + fcs_size], "little") + (256 if fcs_size == 2 else 0)
            pos += fcs_size
        else:
            fcs = None
        blocks = 0
        while True:
            if n - pos < 3:
                return None
            h = int.from_bytes(view[pos:pos + 3], "little")
            pos += 3
            btype, bsize = (h >> 1) & 3, h >> 3
            if btype == 3:
                return None
            blocks += bsize if btype in (0, 1) else 128 << 10
            pos += 1 if btype == 1 else bsize
            if h & 1:
                break
        pos += 4 if fhd & 0x04 else 0
        total += fcs if fcs is not None else blocks
    return total


def _decode_into(module, view: memoryview, max_size: int) -> memoryview:
    # Neither format always states its output size, but both can be bounded from their block
    # headers without decoding: one decode into a buffer of that bound (at most max_size + 1, the
    # spare byte telling "exactly max_size" from "more"). Unwalkable input falls back to a buffer
    # that starts small and grows 4x per retry; memory never exceeds the cap.
    limit = max_size + 1
    bound = (_lz4_bound if module is cramjam.lz4 else _zstd_bound)(view)
    if bound is not None:
        size = min(limit, max(bound, 1))
    else:
        size = min(limit, max(4 * len(view), 64 * 1024))
    while True:
        out = _scratch_view(size)[:size]
        try:
            n = module.decompress_into(view, out)
        except cramjam.DecompressionError as e:
            if "failed to write whole buffer" not in str(e):
                raise CompressionError(f"corrupt {module.__name__} data: {e}") from None
            if size == limit:
                raise DecompressionLimitExceeded(f"output exceeds cap {max_size}") from None
            size = min(limit, size * 4)
            continue
        if n > max_size:
            raise DecompressionLimitExceeded(f"output exceeds cap {max_size}")
        if n == size and size < limit and bound is None:
            # Filled exactly a guessed size: the stream might have more; retry larger. (A size from
            # the headers is an upper bound: filling it exactly is a complete decode.)
            size = min(limit, size * 4)
            continue
        return out[:n]
