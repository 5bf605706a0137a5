"""Threads of the produce append path: compressed batches are checked off the loop, and large
writes overlap receiving.

- Validation pool (``kbroker.log.validation.threads`` threads, shared by every log): a compressed
  producer batch is checked by ``validate_batch`` there (decompression and the record walk release
  the GIL), then appended on the loop with ``prevalidated=True``.
- One writer thread per log dir: a batch of at least ``kbroker.log.writer.offload.bytes`` is stamped
  on the loop, written there (Log.begin_append_as_leader / WriteJob.run / finish_append), and its
  offsets become visible (LEO, HW, indexes) only once the bytes are in the file.

Ordering is the caller's: each Log has ``append_tails`` (per source connection, the done-future of
its last queued append; the source's next append to that log, queued or not, goes behind it) and
``write_future`` (a large write in flight: every append to the log waits for it). See
ReplicaManager.append_records.

Threads: ``AppendThreads`` is used from the event-loop thread; the pool threads only run
validate_batch and WriteJob.run, which touch nothing but the batch bytes and the segment's fd.
"""
from __future__ import annotations

import concurrent.futures
import os

from kbroker._native.batch import LAYOUT

from .log import validate_batch

# Codec bits of a RecordBatch v2's attributes (a big-endian int16): in its low byte. The produce hot
# path (ReplicaManager.append_records) tests ``records[22] & 7`` inline; these name the numbers.
ATTRIBUTES_LOW_BYTE = LAYOUT["OFF_ATTRIBUTES"] + 1
CODEC_MASK = LAYOUT["ATTR_CODEC_MASK"]
assert (ATTRIBUTES_LOW_BYTE, CODEC_MASK) == (22, 7)


def codec_of(buf) -> int:
    """The compression codec a producer batch claims (0 = none); 0 for a buffer too short to say."""
    return buf[ATTRIBUTES_LOW_BYTE] & CODEC_MASK if len(buf) > ATTRIBUTES_LOW_BYTE else 0


class AppendThreads:
    def __init__(self, validation_threads: int, write_offload_bytes: int):
        self.validation_threads = validation_threads
        self.validates_off_loop = validation_threads > 0
        # 0 = never: every append writes on the loop as before.
        self.write_offload_bytes = write_offload_bytes if write_offload_bytes > 0 else 1 << 62
        self._validators = None
        self._writers: dict = {}           # log dir -> one-thread executor

    def validate(self, loop, log, buf):
        """Start validate_batch(buf) with the log's current settings on the pool -> (future,
        settings); the future raises LogAppendError for a refused batch."""
        if self._validators is None:
            self._validators = concurrent.futures.ThreadPoolExecutor(
                self.validation_threads, thread_name_prefix="kbroker-validate")
        cfg = log.config
        settings = (cfg.max_message_bytes, "compact" in cfg.cleanup_policy)
        return loop.run_in_executor(self._validators, validate_batch, buf, *settings), settings

    @staticmethod
    def settings_of(log) -> tuple:
        cfg = log.config
        return cfg.max_message_bytes, "compact" in cfg.cleanup_policy

    def writer(self, log):
        """The one writer thread of the dir holding ``log`` (appends to one dir stay in order)."""
        d = os.path.dirname(log.dir)
        ex = self._writers.get(d)
        if ex is None:
            ex = self._writers[d] = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="kbroker-writer")
        return ex

    def shutdown(self) -> None:
        if self._validators is not None:
            self._validators.shutdown(wait=False, cancel_futures=True)
        for ex in self._writers.values():
            ex.shutdown(wait=True)
        self._writers.clear()
