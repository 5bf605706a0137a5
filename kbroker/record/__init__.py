"""Kafka record batches (RecordBatch v2, magic 2; layout in ext/layout.pxd).

The byte work is native (kbroker._native.batch); this package adds what
needs Python: decompression of compressed batches (kbroker.record.compression)
before the native record decoder runs. reference.py is the slow pure-Python
test oracle and is not imported here.
"""
from __future__ import annotations

from kbroker._native.batch import (
    LAYOUT,
    BatchBuilder,
    BatchError,
    BatchInfo,
    decode_record_data,
    iter_batches,
    read_batch,
    validate_and_stamp,
)
from kbroker.protocol.errors import Errors
from kbroker.record.compression import CompressionError, decompress

__all__ = [
    "BatchBuilder", "BatchError", "BatchInfo", "HEADER_SIZE", "LAYOUT", "LOG_OVERHEAD",
    "decode_records", "iter_batches", "read_batch", "validate_and_stamp",
]

# The header layout is defined once, natively (ext/layout.pxd).
LOG_OVERHEAD = LAYOUT["LOG_OVERHEAD"]
HEADER_SIZE = LAYOUT["HEADER_SIZE"]

# Default cap on a decompressed records section: far above any batch the
# broker accepts (max.message.bytes default 1048588) yet bounded.
DEFAULT_MAX_DECOMPRESSED = 64 * 1024 * 1024


def decode_records(batch, *, check_crc: bool = False,
                   max_decompressed: int = DEFAULT_MAX_DECOMPRESSED):
    """Records of the batch at the start of ``batch`` (any buffer) as a list
    of (offset, timestamp, key, value, headers), compressed or not. Raises
    BatchError (CORRUPT_MESSAGE) for malformed data, including compressed
    data that inflates beyond ``max_decompressed`` bytes."""
    info = read_batch(batch, 0, check_crc)
    body = memoryview(batch)[HEADER_SIZE:info.size]
    if info.codec:
        try:
            body = decompress(info.codec, body, max_decompressed)
        except CompressionError as e:
            raise BatchError(Errors.CORRUPT_MESSAGE, f"records section: {e}") from e
    return decode_record_data(body, info.record_count, info.base_offset,
                              info.first_timestamp,
                              info.max_timestamp if info.timestamp_type else -1)
