"""kbroker storage: Kafka-compatible partition logs (see each module's contract comment).

    LogManager  - the log dirs: lock, meta.properties, checkpoints, load/recover, periodic jobs
    Log         - one partition: append_as_leader, read, retention, recovery
    LogSegment  - one .log file with its .index and .timeindex
    LogCleaner  - compaction threads (cleanup.policy=compact), crash-safe segment swaps
"""
from .cleaner import LogCleaner
from .errors import LogAppendError, LogDirError, LogError, OffsetOutOfRange
from .log import AppendResult, FetchData, Log, LogConfig, validate_batch
from .manager import LogManager
from .segment import LogSegment

__all__ = ["AppendResult", "FetchData", "Log", "LogAppendError", "LogConfig", "LogDirError",
           "LogCleaner", "LogError", "LogManager", "LogSegment", "OffsetOutOfRange", "validate_batch"]
