"""One transactional id's state (Kafka's TransactionMetadata) and the state machine's legal moves.

A change is prepared as a new ``TxnValue`` (``pending`` holds its state while it is written), written
to ``__transaction_state`` and only then applied: what the coordinator acts on is always on disk.
PrepareEpochFence is the one state never written: it marks, in memory, an epoch bump that fences the
producer while the ongoing transaction it had is aborted (the abort's PrepareAbort carries the epoch).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .records import (COMPLETE_ABORT, COMPLETE_COMMIT, DEAD, EMPTY, ONGOING, PREPARE_ABORT, PREPARE_COMMIT,
                      PREPARE_EPOCH_FENCE, STATE_NAMES, TxnValue)

# state -> the states it may be reached from (Kafka's TransactionState.validPreviousStates).
VALID_PREVIOUS = {
    EMPTY: {EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT},
    ONGOING: {ONGOING, EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT},
    PREPARE_COMMIT: {ONGOING},
    PREPARE_ABORT: {ONGOING, PREPARE_EPOCH_FENCE},
    COMPLETE_COMMIT: {PREPARE_COMMIT},
    COMPLETE_ABORT: {PREPARE_ABORT},
    DEAD: {EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT},
    PREPARE_EPOCH_FENCE: {ONGOING},
}

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
# An epoch this high gets a new producer id instead of a bump (Kafka: Short.MaxValue - 1).
MAX_EPOCH = 32766


class IllegalTransition(RuntimeError):
    pass


@dataclass
class TxnMetadata:
    transactional_id: str
    producer_id: int
    last_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    timeout_ms: int
    state: int
    partitions: set = field(default_factory=set)     # {(topic, partition)}
    start_ms: int = -1
    last_update_ms: int = -1
    pending: int | None = None                       # the state being written, if any

    @property
    def state_name(self) -> str:
        return STATE_NAMES[self.state]

    def value(self, state: int, *, producer_id=None, epoch=None, timeout_ms=None, partitions=None,
              start_ms=None, now_ms: int) -> TxnValue:
        """The record of moving to ``state`` (fields not given keep their current values)."""
        if self.state not in VALID_PREVIOUS[state] and not (state == self.state == EMPTY):
            raise IllegalTransition(f"{self.transactional_id}: {self.state_name} -> {STATE_NAMES[state]}")
        parts = self.partitions if partitions is None else partitions
        by_topic: dict[str, list[int]] = {}
        for t, p in sorted(parts):
            by_topic.setdefault(t, []).append(p)
        return TxnValue(self.producer_id if producer_id is None else producer_id,
                        self.producer_epoch if epoch is None else epoch,
                        self.timeout_ms if timeout_ms is None else timeout_ms, state, by_topic, now_ms,
                        self.start_ms if start_ms is None else start_ms)

    def apply(self, v: TxnValue) -> None:
        """Take a written record as the current state (also used when loading the log)."""
        if v.producer_id != self.producer_id:
            self.last_producer_id = self.producer_id
            self.last_producer_epoch = NO_PRODUCER_EPOCH
        elif v.producer_epoch != self.producer_epoch:
            self.last_producer_epoch = self.producer_epoch
        self.producer_id = v.producer_id
        self.producer_epoch = v.producer_epoch
        self.timeout_ms = v.timeout_ms
        self.state = v.state
        self.partitions = {(t, p) for t, ps in v.partitions.items() for p in ps}
        self.last_update_ms = v.last_update_ms
        self.start_ms = v.start_ms

    @classmethod
    def from_value(cls, tid: str, v: TxnValue) -> "TxnMetadata":
        m = cls(tid, v.producer_id, v.previous_producer_id, v.producer_epoch, NO_PRODUCER_EPOCH, v.timeout_ms,
                v.state)
        m.apply(v)
        m.last_producer_id = v.previous_producer_id
        return m

    def is_producer_epoch_exhausted(self) -> bool:
        return self.producer_epoch >= MAX_EPOCH - 1
