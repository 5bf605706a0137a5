"""Leader-epoch cache of one partition: which leader epoch started at which offset.

File ``leader-epoch-checkpoint`` in the partition directory, Kafka's text format:
    0\\n<n>\\n<epoch> <start_offset>\\n...
Entries are strictly increasing in both epoch and start offset.

Used by OffsetsForLeaderEpoch (``end_offset_for_epoch``) and follower truncation. Filled on
leader appends (a batch stamped with a newer epoch starts an entry) and, after an unclean
shutdown, from the partitionLeaderEpoch of the recovered batches.

Threads: the event-loop thread only. Crash: the file is replaced atomically (checkpoint.py);
recovery re-assigns epochs from the scanned batches and truncates entries past the log end.
"""
import os

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

    @property
    def latest_epoch(self) -> int:
        return self.entries[-1][0] if self.entries else UNDEFINED_EPOCH

    def assign(self, epoch: int, start_offset: int, flush: bool = True) -> bool:
        """Record that ``epoch`` starts at ``start_offset`` if it is newer than the latest.
        Entries at or after start_offset from older epochs are dropped (a truncated log).
        Returns whether the cache changed."""
        if epoch < 0 or (self.entries and epoch <= self.entries[-1][0]):
            return False
        while self.entries and self.entries[-1][1] >= start_offset:
            self.entries.pop()
        self.entries.append((epoch, start_offset))
        if flush:
            self.flush()
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
        if flush and len(self.entries) != n:
            self.flush()

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
        if flush and changed:
            self.flush()

    def flush(self) -> None:
        write_lines(self.path, [f"{e} {o}" for e, o in self.entries])
