"""Leader-epoch cache of one partition: which leader epoch started at which offset.

File ``leader-epoch-checkpoint`` in the partition directory, Kafka's text format:
    0\\n<n>\\n<epoch> <start_offset>\\n...
Entries are strictly increasing in both epoch and start offset.

Used by OffsetsForLeaderEpoch (``end_offset_for_epoch``) and follower truncation. Filled on
leader appends (a batch stamped with a newer epoch starts an entry) and, after an unclean
shutdown, from the partitionLeaderEpoch of the recovered batches.

Durability: a new epoch (``assign``) only changes memory and marks the cache dirty; the file is
written when the log flushes (before its recovery point moves) and at clean shutdown. So the
first append of a partition, or a leadership change of a thousand partitions, costs no fsync on
the request path (as Kafka since KAFKA-15046). After kill -9, entries the file lacks belong to
batches at or after the recovery point, which recovery CRC-scans and re-assigns from their
partitionLeaderEpoch. Truncations still write at once (rare, and a stale file must not claim
offsets that are gone).

Threads: the event-loop thread mutates; ``write_snapshot`` is safe from any thread (serialised
per cache by a lock; a snapshot older than what is on disk is dropped). Crash: the file is
replaced atomically (checkpoint.py); recovery re-assigns epochs from the scanned batches and
truncates entries past the log end.
"""
import os
import threading

from .checkpoint import read_lines, write_lines

FILE_NAME = "leader-epoch-checkpoint"
UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1


class LeaderEpochCache:
    def __init__(self, dir_path: str):
        self.path = os.path.join(dir_path, FILE_NAME)
        self.entries: list = []
        for e in read_lines(self.path):
            if len(e) != 2:
                raise ValueError(f"{self.path}: malformed entry {' '.join(e)!r}")
            self.entries.append((int(e[0]), int(e[1])))
        self._version = 0          # bumped by every change of ``entries``
        self._written = 0          # version last written to the file
        self._closed = False       # no more writes (the log was closed or deleted)
        self._io = threading.Lock()

    @property
    def dirty(self) -> bool:
        """Changed since the file was last written."""
        return self._version != self._written

    def _changed(self, flush: bool) -> None:
        self._version += 1
        if flush:
            self.flush()

    @property
    def latest_epoch(self) -> int:
        return self.entries[-1][0] if self.entries else UNDEFINED_EPOCH

    def assign(self, epoch: int, start_offset: int, flush: bool = False) -> bool:
        """Record that ``epoch`` starts at ``start_offset`` if it is newer than the latest.
        Entries at or after start_offset from older epochs are dropped (a truncated log).
        Written to the file later (see the module doc) unless ``flush``. Returns whether the
        cache changed."""
        if epoch < 0 or (self.entries and epoch <= self.entries[-1][0]):
            return False
        while self.entries and self.entries[-1][1] >= start_offset:
            self.entries.pop()
        self.entries.append((epoch, start_offset))
        self._changed(flush)
        return True

    def end_offset_for_epoch(self, epoch: int, log_end_offset: int):
        """(epoch, end_offset) as Kafka's OffsetsForLeaderEpoch answers: the end offset of the
        largest epoch <= ``epoch`` is the start offset of the next larger epoch (or the log end
        offset for the latest epoch); unknown / too-new epochs give (-1, -1)."""
        if epoch == UNDEFINED_EPOCH or not self.entries:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if epoch == self.entries[-1][0]:
            return epoch, log_end_offset
        floor = None
        for e, start in self.entries:
            if e > epoch:
                return (floor if floor is not None else epoch), start
            floor = e
        return UNDEFINED_EPOCH, UNDEFINED_OFFSET

    def truncate_from_end(self, end_offset: int, flush: bool = True) -> None:
        """Drop entries starting at or after ``end_offset`` (the log was truncated there)."""
        n = len(self.entries)
        while self.entries and self.entries[-1][1] >= end_offset:
            self.entries.pop()
        if len(self.entries) != n:
            self._changed(flush)

    def truncate_from_start(self, start_offset: int, flush: bool = True) -> None:
        """The log start moved to ``start_offset``: drop entries wholly below it and move the
        start of the epoch covering it up to it."""
        changed = False
        while len(self.entries) > 1 and self.entries[1][1] <= start_offset:
            self.entries.pop(0)
            changed = True
        if self.entries and self.entries[0][1] < start_offset:
            self.entries[0] = (self.entries[0][0], start_offset)
            changed = True
        if changed:
            self._changed(flush)

    def clear(self) -> None:
        """Forget every entry and write the empty file now (the log restarts from scratch)."""
        self.entries = []
        self._changed(True)

    def flush(self) -> None:
        """Write the file now (temp, fsync, rename) if it is behind memory."""
        version, lines = self.snapshot()
        self.write_snapshot(version, lines)

    def snapshot(self):
        """(version, lines) to hand to ``write_snapshot`` on another thread."""
        return self._version, [f"{e} {o}" for e, o in self.entries]

    def write_snapshot(self, version: int, lines: list) -> None:
        """Write ``lines`` (taken at ``version``) unless the file already holds that version or a
        newer one, or the cache is closed. Any thread; raises OSError (e.g. ENOSPC)."""
        with self._io:
            if self._closed or version <= self._written:
                return
            write_lines(self.path, lines)
            self._written = version

    def close(self) -> None:
        """No file writes after this (a writer thread may still hold an old snapshot)."""
        with self._io:
            self._closed = True
