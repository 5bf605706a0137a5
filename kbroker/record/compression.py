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

``decompress`` never produces more than ``max_size`` bytes: gzip is inflated
in bounded steps, snappy blocks declare their length up front, and lz4/zstd
decode into a buffer grown up to ``max_size + 1`` bytes, so a decompression
bomb costs at most the cap in memory before it is refused.
"""
from __future__ import annotations

import struct
import zlib

import cramjam

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
CODECS = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}

XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = struct.Struct(">8sii")
_XERIAL_BLOCK = 32 * 1024  # uncompressed bytes per chunk, like the Java client
_INFLATE_STEP = 64 * 1024


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
    if codec == GZIP:
        return _inflate(data, max_size)
    if codec == SNAPPY:
        view = memoryview(data).cast("B")
        if view[:8] == XERIAL_MAGIC:
            return _xerial_decompress(view, max_size)
        return _snappy_block(view, max_size, max_size)
    if codec in (LZ4, ZSTD):
        module = cramjam.lz4 if codec == LZ4 else cramjam.zstd
        return _decode_into(module, data, max_size)
    raise CompressionError(f"unknown compression codec {codec}")


def _inflate(data, max_size: int) -> bytes:
    out = bytearray()
    pending = bytes(data)
    while pending:
        d = zlib.decompressobj(32 + zlib.MAX_WBITS)  # gzip or zlib header
        chunk = pending
        try:
            while chunk and not d.eof:
                room = max_size - len(out) + 1
                out += d.decompress(chunk, min(room, _INFLATE_STEP))
                if len(out) > max_size:
                    raise DecompressionLimitExceeded(f"gzip output exceeds cap {max_size}")
                chunk = d.unconsumed_tail
            if not d.eof:
                raise CompressionError("truncated gzip stream")
        except zlib.error as e:
            raise CompressionError(f"corrupt gzip data: {e}") from None
        # Concatenated gzip members are one valid stream.
        pending = d.unused_data
    return bytes(out)


def _snappy_block(block: memoryview, room: int, max_size: int) -> bytes:
    try:
        n = cramjam.snappy.decompress_raw_len(block)
    except Exception as e:
        raise CompressionError(f"corrupt snappy block: {e}") from None
    if n > room:
        raise DecompressionLimitExceeded(f"snappy output exceeds cap {max_size}")
    try:
        return bytes(cramjam.snappy.decompress_raw(block))
    except Exception as e:
        raise CompressionError(f"corrupt snappy block: {e}") from None


def _xerial_compress(view: memoryview) -> bytes:
    parts = [_XERIAL_HEADER.pack(XERIAL_MAGIC, 1, 1)]
    for start in range(0, len(view), _XERIAL_BLOCK):
        block = bytes(cramjam.snappy.compress_raw(view[start:start + _XERIAL_BLOCK]))
        parts.append(struct.pack(">i", len(block)))
        parts.append(block)
    return b"".join(parts)


def _xerial_decompress(view: memoryview, max_size: int) -> bytes:
    if len(view) < _XERIAL_HEADER.size:
        raise CompressionError("truncated xerial snappy header")
    out = bytearray()
    pos = _XERIAL_HEADER.size
    while pos < len(view):
        if pos + 4 > len(view):
            raise CompressionError("truncated xerial snappy block length")
        (n,) = struct.unpack_from(">i", view, pos)
        pos += 4
        if n < 0 or pos + n > len(view):
            raise CompressionError("xerial snappy block runs past the data")
        out += _snappy_block(view[pos:pos + n], max_size - len(out), max_size)
        pos += n
    return bytes(out)


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


def _decode_into(module, data, max_size: int) -> bytes:
    # Neither format always states its output size, but both can be bounded from their block
    # headers without decoding: one decode into a buffer of that bound (at most max_size + 1, the
    # spare byte telling "exactly max_size" from "more"). Unwalkable input falls back to a buffer
    # that starts small and grows 4x per retry; memory never exceeds the cap.
    limit = max_size + 1
    view = memoryview(data).cast("B")
    bound = (_lz4_bound if module is cramjam.lz4 else _zstd_bound)(view)
    if bound is not None:
        size = min(limit, max(bound, 1))
    else:
        size = min(limit, max(4 * len(data), 64 * 1024))
    while True:
        out = bytearray(size)
        try:
            n = module.decompress_into(data, out)
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
        del out[n:]
        return bytes(out)
