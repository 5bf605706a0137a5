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


def _decode_into(module, data, max_size: int) -> bytes:
    # Neither format reliably states its output size, so decode into a buffer
    # that starts small and grows 4x per retry up to max_size + 1 (the spare
    # byte tells "exactly max_size" apart from "more"). Retries cost at most
    # ~1.3x the final decode; memory never exceeds the cap.
    limit = max_size + 1
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
        if n == size and size < limit:
            # Filled exactly: the stream might have more; retry larger.
            size = min(limit, size * 4)
            continue
        del out[n:]
        return bytes(out)
