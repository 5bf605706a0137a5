"""What a leader applies to a producer batch beyond the native checks, when the topic asks for it:
the timestamp bounds of KIP-937 (``message.timestamp.before.max.ms`` / ``after.max.ms``) and the
topic's ``compression.type`` when it names a codec (Kafka's LogValidator recompresses such batches).

Both are off for a topic with Kafka's defaults; the native Produce path then serves it alone. A log
whose config turns either on (``LogConfig.leader_rewrites``) is left to the reference path, which calls
:func:`apply` before the native append.
"""
from __future__ import annotations

from kbroker._native import batch as _batch
from kbroker._native.crc import crc32c
from kbroker.record import HEADER_SIZE, LAYOUT, LOG_OVERHEAD, decode_records
from kbroker.record.compression import CompressionError, compress, decompress

from .errors import CORRUPT_MESSAGE, INVALID_TIMESTAMP, LogAppendError

# The broker's compression.type values naming a codec, as RecordBatch attribute codec bits.
CODECS = {"uncompressed": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}

_ATTR = LAYOUT["OFF_ATTRIBUTES"]
_LENGTH = LAYOUT["OFF_LENGTH"]
_CRC = LAYOUT["OFF_CRC"]
_CRC_START = LAYOUT["CRC_START"]
_CODEC_MASK = LAYOUT["ATTR_CODEC_MASK"]
_APPEND_TIME = LAYOUT["ATTR_LOG_APPEND_TIME"]
_NO_TIMESTAMP = -1
# A decompressed records section larger than this is refused (the batch's own cap is max.message.bytes
# compressed; Kafka bounds the inflated size by the same buffers).
_MAX_INFLATED = 64 * 1024 * 1024


def apply(buf, config, now: int):
    """-> the batch to append: ``buf`` itself, or a recompressed copy (a bytearray). Raises
    LogAppendError: INVALID_TIMESTAMP for a CreateTime record outside [now - before, now + after],
    CORRUPT_MESSAGE when the batch cannot be read."""
    try:
        info = _batch.read_batch(buf, 0, False)
    except _batch.BatchError as e:
        raise LogAppendError(e.error_code, str(e)) from None
    bounds = config.timestamp_bounds
    if bounds is not None and not info.attributes & _APPEND_TIME:
        _check_timestamps(buf, bounds, now)
    target = config.compression_codec
    if target is None or target == info.codec:
        return buf
    return _recompress(buf, info, target)


def _check_timestamps(buf, bounds, now: int) -> None:
    before, after = bounds
    try:
        records = decode_records(buf)
    except _batch.BatchError as e:
        raise LogAppendError(e.error_code, str(e)) from None
    for offset, ts, *_ in records:
        if ts == _NO_TIMESTAMP:
            continue
        if now - ts > before or ts - now > after:
            # Kafka's wording (LogValidator), with the offset the producer gave the record
            raise LogAppendError(INVALID_TIMESTAMP,
                                 f"Timestamp {ts} of message with offset {offset} is out of range. The "
                                 f"timestamp should be within [{now - before}, {now + after}]")


def _recompress(buf, info, target: int) -> bytearray:
    """The batch with its records section in codec ``target``: same header fields (producer id,
    sequence, timestamps, transactional and control bits), new length, codec bits and CRC."""
    view = memoryview(buf)[:info.size]
    body = view[HEADER_SIZE:]
    if info.codec:
        try:
            body = decompress(info.codec, body, _MAX_INFLATED)
        except CompressionError as e:
            raise LogAppendError(CORRUPT_MESSAGE, f"records section: {e}") from None
    packed = compress(target, body)
    out = bytearray(HEADER_SIZE + len(packed))
    out[:HEADER_SIZE] = view[:HEADER_SIZE]
    out[HEADER_SIZE:] = packed
    out[_LENGTH:_LENGTH + 4] = (len(out) - LOG_OVERHEAD).to_bytes(4, "big")
    attrs = int.from_bytes(out[_ATTR:_ATTR + 2], "big")
    out[_ATTR:_ATTR + 2] = ((attrs & ~_CODEC_MASK) | target).to_bytes(2, "big")
    out[_CRC:_CRC + 4] = crc32c(memoryview(out)[_CRC_START:]).to_bytes(4, "big")
    return out
