"""Segment byte work (append, sparse-index search, batch walks); see segment.pyx."""
import enum

from typing_extensions import Buffer

from kbroker._native.batch import BatchInfo

INDEX_OFFSET: int
INDEX_POSITION: int
INDEX_TIME: int
SCAN_OK: int
SCAN_SHORT_HEADER: int
SCAN_BAD_LENGTH: int
SCAN_BAD_MAGIC: int
SCAN_BAD_CRC: int
SCAN_BAD_OFFSET: int
SCAN_IO_ERROR: int

def write_all(fd: int, buf: Buffer) -> int: ...
def append_leader(fd: int, buf: Buffer, position: int, base_offset: int, leader_epoch: int,
                  max_message_bytes: int, log_append_time_ms: int, compacted: bool, prevalidated: bool,
                  room: int, max_timestamp_limit: int, last_offset_limit: int) -> BatchInfo | None: ...
def index_lookup(buf: Buffer, entries: int, kind: int, target: int) -> int: ...
def index_valid_entries(buf: Buffer, entries: int, kind: int, max_position: int) -> int: ...
def offset_entry(buf: Buffer, slot: int) -> tuple[int, int]: ...
def time_entry(buf: Buffer, slot: int) -> tuple[int, int]: ...
def put_offset_entry(buf: Buffer, slot: int, relative_offset: int, position: int) -> None: ...
def put_time_entry(buf: Buffer, slot: int, timestamp: int, relative_offset: int) -> None: ...

class IndexAppend(enum.IntEnum):
    INDEX_REFUSED = 0
    INDEX_ADDED = 1
    INDEX_NOT_NEEDED = 2

class IndexFile:
    base_offset: int
    entries: int
    max_entries: int
    writable: bool
    fd: int
    mm: Buffer | None
    def add_offset_entry(self, offset: int, position: int) -> int: ...
    def add_time_entry(self, timestamp: int, offset: int) -> int: ...
def seek_batch(fd: int, start: int, end: int, target_offset: int, limit_position: int,
               target_timestamp: int) -> tuple[int, int, int, int, int]: ...
def seek_batch_in(block: bytes, block_pos: int, start: int, end: int, target_offset: int,
                  limit_position: int) -> tuple[int, int, int, int]: ...
def scan_batches(fd: int, start: int, end: int, segment_base: int, min_offset: int,
                 check_crc: bool = ...) -> tuple[int, list[BatchInfo], int]: ...

class SegmentState:
    """Active segment state (see segment.pyx)."""
    fd: int
    base_offset: int
    index_interval_bytes: int
    size: int
    next_offset: int
    created_ms: int
    has_first: bool
    first_batch_ms: int
    max_timestamp: int
    offset_of_max_timestamp: int
    bytes_since_index: int
    index_full: bool
    tail_floor: int
    def __init__(self, owner: object, index: object, time_index: object, base_offset: int,
                 index_interval_bytes: int, created_ms: int, tail_batches: int) -> None: ...
    def sync_index(self) -> None: ...
    def commit(self, position: int, n: int, last_offset: int, max_timestamp: int) -> None: ...
    def commit_batches(self, position: int, n: int, infos: list[BatchInfo]) -> None: ...
    def add_batch(self, position: int, size: int, last_offset: int, max_timestamp: int) -> None: ...
    def should_roll(self, batch_size: int, last_offset: int, max_timestamp: int, now_ms: int,
                    segment_bytes: int, segment_ms: int) -> bool: ...
    def append_stamped(self, buf: Buffer, segment_bytes: int, segment_ms: int, now_ms: int) -> int: ...
    def append_leader(self, buf: Buffer, leader_epoch: int, max_message_bytes: int,
                      log_append_time_ms: int, compacted: bool, prevalidated: bool, segment_bytes: int,
                      segment_ms: int, now_ms: int) -> BatchInfo | None: ...
    def tail_position(self, offset: int, start_position: int) -> int: ...
    def tail_end(self, start: int, limit: int, min_one_batch: bool) -> int: ...
    def forget_tail(self) -> None: ...
    def tail(self) -> tuple[list[int], list[int]]: ...
    def set_tail(self, last_offsets: list[int], positions: list[int]) -> None: ...

APPEND_ROLL: int
APPEND_IDEMPOTENT: int
APPENDED_FLUSH_DUE: int

def open_run() -> None: ...
def close_run() -> int: ...

class LeaderAppender:
    """One log's leader-append settings (read once per LogConfig object) and unflushed count."""
    unflushed: int
    last: int
    info: BatchInfo | None
    log: object
    @property
    def pending(self) -> int: ...
    def __init__(self) -> None: ...
    def write_deferred(self) -> None: ...
    def append(self, st: SegmentState, buf: Buffer, leader_epoch: int, cfg: object, prevalidated: bool,
               now_ms: int) -> int: ...

class ReadBlock:
    """A segment's file bytes from a batch boundary (ReadBlocks.load)."""
    pos: int
    data: bytes
    floor: int
    cursor: int
    cursor_floor: int

class ReadBlocks:
    """The process's read blocks: segment -> ReadBlock, least recently used first, at most ``limit``."""
    by_segment: dict[object, ReadBlock]
    limit: int
    block_size: int
    def __init__(self, limit: int, block_size: int) -> None: ...
    def get(self, seg: object) -> ReadBlock | None: ...
    def load(self, seg: object, fd: int, pos: int, size: int) -> ReadBlock | None: ...
    def holding(self, seg: object, fd: int, start: int, n: int, size: int) -> ReadBlock | None: ...
    def forget(self, seg: object) -> None: ...

class LogState:
    """The per-request fields of kbroker.log.log.Log (its base class)."""
    config: object
    segments: list
    offline: bool
    dirty: bool
    log_start_offset: int
    def advance_hw(self, isr: list[int], followers: dict, local_id: int, min_isr: int, leo: int) -> bool: ...
