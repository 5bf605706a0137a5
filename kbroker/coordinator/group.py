"""One consumer group: members, generation, chosen protocol, committed offsets, and its state.

States (Kafka's classic group state machine):
  Empty --join--> PreparingRebalance --all joined / rebalance timeout--> CompletingRebalance
  CompletingRebalance --leader's SyncGroup stored--> Stable
  Stable / CompletingRebalance --join of a new member, leave, session expiry--> PreparingRebalance
  PreparingRebalance --no member left--> Empty;  Empty --deleted / expired--> Dead
"""
from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass, field

EMPTY = "Empty"
PREPARING_REBALANCE = "PreparingRebalance"
COMPLETING_REBALANCE = "CompletingRebalance"
STABLE = "Stable"
DEAD = "Dead"


@dataclass(slots=True)
class OffsetEntry:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp: int
    expire_timestamp: int = -1


@dataclass(eq=False)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: list                      # [(name, metadata bytes)] in the member's preference order
    assignment: bytes = b""
    join_future: asyncio.Future | None = None
    sync_future: asyncio.Future | None = None
    heartbeat_handle: asyncio.TimerHandle | None = None
    is_new: bool = True

    def metadata_for(self, protocol: str) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        return b""

    def awaiting_join(self) -> bool:
        return self.join_future is not None and not self.join_future.done()

    def awaiting_sync(self) -> bool:
        return self.sync_future is not None and not self.sync_future.done()

    def same_protocols(self, protocols) -> bool:
        return [(n, bytes(m)) for n, m in protocols] == [(n, bytes(m)) for n, m in self.protocols]


@dataclass(eq=False)
class Group:
    group_id: str
    state: str = EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict = field(default_factory=dict)          # member_id -> Member
    static_members: dict = field(default_factory=dict)   # group_instance_id -> member_id
    pending_members: dict = field(default_factory=dict)  # member ids handed out with MEMBER_ID_REQUIRED -> timer
    offsets: dict = field(default_factory=dict)          # (topic, partition) -> OffsetEntry
    # TxnOffsetCommit offsets waiting for their transaction's marker: producer id -> {(topic, partition): entry}
    pending_txn_offsets: dict = field(default_factory=dict)
    state_timestamp: int = -1
    rebalance_handle: asyncio.TimerHandle | None = None
    initial_delay: bool = False                          # group.initial.rebalance.delay.ms still running
    new_member_added: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def transition(self, state: str, now_ms: int) -> None:
        self.state = state
        self.state_timestamp = now_ms

    def all_protocols_supported(self, protocol_type: str, protocols) -> bool:
        """A joining member must share the protocol type and at least one protocol with every
        current member (Kafka's GroupMetadata.supportsProtocols)."""
        if not self.members:
            return bool(protocol_type) and bool(protocols)
        if protocol_type != self.protocol_type:
            return False
        names = {n for n, _ in protocols}
        return bool(names & self.candidate_protocols())

    def candidate_protocols(self) -> set:
        sets = [set(n for n, _ in m.protocols) for m in self.members.values()]
        return set.intersection(*sets) if sets else set()

    def select_protocol(self) -> str:
        """Each member votes for its first protocol that every member supports; most votes wins
        (ties: the first candidate in the order of the first member's preferences)."""
        candidates = self.candidate_protocols()
        votes: dict = {}
        for m in self.members.values():
            for name, _ in m.protocols:
                if name in candidates:
                    votes[name] = votes.get(name, 0) + 1
                    break
        best = max(votes.values())
        for m in self.members.values():
            for name, _ in m.protocols:
                if votes.get(name) == best:
                    return name
        return next(iter(votes))

    def all_joined(self) -> bool:
        return not self.pending_members and all(m.awaiting_join() for m in self.members.values())

    def max_rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def subscribed_topics(self) -> set | None:
        """Topics the members subscribe to, from the consumer protocol's subscription (None if
        the group does not use the consumer protocol or a subscription does not parse)."""
        if self.protocol_type != "consumer" or not self.protocol_name:
            return None
        topics: set = set()
        for m in self.members.values():
            got = parse_subscription_topics(m.metadata_for(self.protocol_name))
            if got is None:
                return None
            topics |= got
        return topics


def parse_subscription_topics(meta: bytes) -> set | None:
    """Topics of a ConsumerProtocolSubscription (any version: version int16, then topics[])."""
    try:
        pos = 2
        (n,) = struct.unpack_from(">i", meta, pos)
        pos += 4
        topics = set()
        for _ in range(n):
            (ln,) = struct.unpack_from(">h", meta, pos)
            pos += 2
            topics.add(bytes(meta[pos:pos + ln]).decode())
            pos += ln
        return topics
    except (struct.error, UnicodeDecodeError):
        return None
