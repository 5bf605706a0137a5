"""RecordBatch v2 <-> Arrow columns for the Spark data source; see arrow.pyx."""
from typing import final

import numpy as np
import pyarrow as pa
from typing_extensions import Buffer

class ArrowDecodeError(ValueError): ...

@final
class RecordDecoder:
    include_headers: bool
    max_rows: int
    max_bytes: int
    rows: int
    data_bytes: int
    last_offset: int
    def __init__(self, include_headers: bool = False, max_rows: int = 65536,
                 max_bytes: int = 67108864) -> None: ...
    def append(self, section: Buffer, count: int, base_offset: int, base_timestamp: int,
               log_append_time: int, timestamp_type: int, lo: int, hi: int,
               pos: int = 0, index: int = 0) -> tuple[int, int, bool]: ...
    def flush(self, topic: str, partition: int) -> pa.RecordBatch: ...

def kafka_arrow_schema(include_headers: bool = False) -> pa.Schema: ...
def partition_for_keys(keys: pa.Array, num_partitions: int) -> np.ndarray: ...
def build_batches(keys: pa.Array | None, values: pa.Array, headers: pa.Array | None, rows: np.ndarray,
                  batch_size: int, codec: int = 0, timestamp_ms: int | None = None,
                  max_records: int = 1048576) -> list[tuple[bytes, int]]: ...
def set_producer_fields(batch: Buffer, producer_id: int, producer_epoch: int,
                        base_sequence: int) -> bytes: ...
