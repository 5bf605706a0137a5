"""Exceptions raised by kbroker.log.

The storage layer names the few Kafka error codes it can produce; their numbers come from the
one table, kbroker.protocol.errors (a leaf module with no broker imports).
"""
from ..protocol.errors import Errors

CORRUPT_MESSAGE = Errors.CORRUPT_MESSAGE
MESSAGE_TOO_LARGE = Errors.MESSAGE_TOO_LARGE
OUT_OF_ORDER_SEQUENCE_NUMBER = Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
INVALID_PRODUCER_EPOCH = Errors.INVALID_PRODUCER_EPOCH
KAFKA_STORAGE_ERROR = Errors.KAFKA_STORAGE_ERROR
INVALID_RECORD = Errors.INVALID_RECORD
TRANSACTION_COORDINATOR_FENCED = Errors.TRANSACTION_COORDINATOR_FENCED


class LogError(Exception):
    """Base class of storage errors."""


class LogAppendError(LogError):
    """An append was refused or failed; nothing of it was acknowledged or kept."""

    def __init__(self, error_code: int, message: str):
        super().__init__(message)
        self.error_code = error_code
        self.message = message

    def __repr__(self):
        return f"LogAppendError({self.error_code}, {self.message!r})"


class OffsetOutOfRange(LogError):
    """A read below the log start offset or above the log end offset (OFFSET_OUT_OF_RANGE 1)."""

    error_code = 1

    def __init__(self, offset: int, log_start_offset: int, log_end_offset: int):
        super().__init__(f"offset {offset} is outside [{log_start_offset}, {log_end_offset}]")
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset


class LogDirError(LogError):
    """A log directory cannot be used: locked by another process, or meta.properties mismatch."""


class CorruptIndexError(LogError):
    """An index file failed its sanity check (it is rebuilt from the segment)."""
