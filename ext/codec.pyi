"""Streaming validation of compressed records sections; see codec.pyx."""
from typing_extensions import Buffer

OK: int
BAD_RECORDS: int
NULL_KEY: int
CORRUPT: int
OVER_CAP: int
UNSUPPORTED: int

def check_section(body: Buffer, codec: int, count: int, compacted: bool,
                  max_decompressed: int) -> int: ...
def check_section_ts(body: Buffer, codec: int, count: int, compacted: bool,
                     max_decompressed: int) -> tuple[int, int]: ...
def xxh32_digest(data: Buffer, seed: int = 0) -> int: ...
def set_streaming(on: bool) -> bool: ...
