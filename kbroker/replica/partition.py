"""One partition replica on this broker: who leads, in which epoch, who is in sync, and the rules
that move the high watermark (Kafka's Partition, ZooKeeper mode).

Leader side:
- ``followers[r]`` tracks each follower's log end offset (the fetch offset of its last fetch) and
  the last time it was caught up (Kafka's rule: a fetch at the leader's LEO, or at the LEO the
  leader had at the follower's previous fetch, means caught up as of then).
- HW = min(LEO over the ISR). It never decreases, and does not advance while the ISR is smaller
  than min.insync.replicas or after a failed ISR write (``stale``: another writer moved the
  state znode, so this leader may be deposed; it waits for LeaderAndIsr).
- A follower may join the ISR when a fetch made in the current leader epoch shows its LEO >=
  max(HW, start offset of the current epoch) (KAFKA-7128); it leaves when it has not been caught
  up for replica.lag.time.max.ms.
Follower side: HW = min(leader's HW, own LEO), set by the fetcher.

ZooKeeper session SUSPENDED (disconnected, not yet expired): the broker keeps serving, as Kafka does.
Nothing on the produce/fetch path reads ZooKeeper, and a leader keeps acknowledging acks=all while the
ISR is unchanged (that needs no ZooKeeper write). What fences a cut-off leader is the conditional ISR
write: a shrink it cannot write (no quorum, or the controller moved the state znode) leaves the HW where
it is, so acks=all writes that need the shrink time out instead of being acknowledged by one copy. On
LOST the broker re-registers and re-runs the election; by then the controller has moved leadership, and
LeaderAndIsr with the new epoch demotes the old leader, which truncates by leader epoch
(tests/test_replication_faults.py, tests/test_replication_zk_cut.py).

Threads: the event-loop thread only.
"""
from __future__ import annotations

from collections import deque


class FollowerState:
    __slots__ = ("broker_id", "leo", "last_caught_up_ms", "last_fetch_leader_leo", "last_fetch_ms",
                 "fetch_epoch", "log_start_offset")

    def __init__(self, broker_id: int, last_caught_up_ms: int):
        self.broker_id = broker_id
        self.leo = -1                       # unknown until its first fetch in this epoch
        self.last_caught_up_ms = last_caught_up_ms
        self.last_fetch_leader_leo = -1
        self.last_fetch_ms = 0
        self.fetch_epoch = -1               # current_leader_epoch its last fetch carried
        self.log_start_offset = -1          # its log start as its last Python-path fetch told (DeleteRecords)


def follower_key(topic: str, index: int) -> tuple:
    return (topic, index, "follower")


class Partition:
    def __init__(self, topic: str, index: int, log, local_id: int):
        self.topic = topic
        self.index = index
        self.tp = (topic, index)
        self.follower_key = follower_key(topic, index)   # AppendNotifier key of follower long polls
        self.log = log
        self.local_id = local_id
        self.leader_id = -1
        self.leader_epoch = -1
        self.partition_epoch = -1           # ZooKeeper version of the state znode
        self.controller_epoch = -1
        self.replicas: list[int] = []
        self.isr: list[int] = []
        self.followers: dict[int, FollowerState] = {}
        self.epoch_start_offset = 0         # LEO when this broker became leader of this epoch
        self.isr_in_flight = False          # an ISR write is on its way to ZooKeeper
        self.stale = False                  # an ISR write found the znode moved
        self.fenced_epoch = -1              # leader epoch it stepped down from (session lost), else -1
        self.waiters: deque = deque()       # (required offset, DelayedProduce) in append order
        # DeleteRecords answers waiting for the ISR's log starts: [(required offset, future)]. While any
        # waits the partition has no native slot, so its follower fetches report their log start here.
        self.delete_waiters: list = []
        self.topic_id: bytes | None = None

    def low_watermark(self) -> int:
        """The lowest log start offset of this leader and its in-sync followers (-1: a follower's is not
        known yet): what DeleteRecords answers once it reached the asked offset (Kafka's lowWatermark)."""
        low = self.log.log_start_offset
        for r in self.isr:
            if r != self.local_id:
                f = self.followers.get(r)
                start = -1 if f is None else f.log_start_offset
                if start < 0:
                    return -1
                low = min(low, start)
        return low

    def __repr__(self):
        return (f"Partition({self.topic}-{self.index} leader={self.leader_id} epoch={self.leader_epoch} "
                f"isr={self.isr} hw={self.log.high_watermark} leo={self.log.log_end_offset})")

    @property
    def is_leader(self) -> bool:
        return self.leader_id == self.local_id

    @property
    def min_isr(self) -> int:
        return self.log.config.min_insync_replicas

    @property
    def under_min_isr(self) -> bool:
        return len(self.isr) < self.min_isr

    # -- state changes ------------------------------------------------------------------------

    def make_leader(self, st, now_ms: int) -> bool:
        """Become (or stay) leader with LeaderAndIsr state ``st``. Returns whether this is a new
        leadership (new epoch or was not leader)."""
        new = not self.is_leader or st.leader_epoch != self.leader_epoch
        self._set(st)
        self.stale = False
        self.fenced_epoch = -1
        self.isr_in_flight = False
        log = self.log
        if new:
            self.epoch_start_offset = log.log_end_offset
            # Later OffsetForLeaderEpoch answers need the epoch even before the first append.
            log.epoch_cache.assign(st.leader_epoch, log.log_end_offset)
            # Everyone in the ISR counts as caught up now, or it would be dropped at once.
            self.followers = {r: FollowerState(r, now_ms if r in self.isr else 0)
                              for r in self.replicas if r != self.local_id}
        else:
            for r in self.replicas:
                if r != self.local_id and r not in self.followers:
                    self.followers[r] = FollowerState(r, now_ms if r in self.isr else 0)
            for r in list(self.followers):
                if r not in self.replicas:
                    del self.followers[r]
        return new

    def make_follower(self, st) -> bool:
        """Follow ``st.leader``. Returns whether leader or epoch changed (truncation needed)."""
        changed = self.leader_id != st.leader or st.leader_epoch != self.leader_epoch
        self._set(st)
        self.followers = {}
        self.stale = False
        self.fenced_epoch = -1
        return changed

    def fence(self) -> None:
        """Stop leading on this broker's own word (its ZooKeeper session may be gone): no leader
        here until a LeaderAndIsr names one, so every leader check refuses."""
        self.fenced_epoch = self.leader_epoch
        self.leader_id = -1
        self.followers = {}

    def unfence(self, now_ms: int) -> None:
        """Lead again in the epoch ``fence`` left (the state it was led in is still ZooKeeper's):
        the ISR counts as caught up now, as at the start of an epoch."""
        self.leader_id = self.local_id
        self.fenced_epoch = -1
        self.followers = {r: FollowerState(r, now_ms if r in self.isr else 0)
                          for r in self.replicas if r != self.local_id}

    def _set(self, st) -> None:
        self.leader_id = st.leader
        self.leader_epoch = st.leader_epoch
        self.partition_epoch = st.partition_epoch
        self.controller_epoch = st.controller_epoch
        self.replicas = list(st.replicas)
        self.isr = list(st.isr)

    # -- leader: follower progress, HW, ISR ---------------------------------------------------

    def update_follower(self, replica_id: int, fetch_offset: int, fetch_epoch: int, now_ms: int,
                        log_start_offset: int = -1) -> bool:
        """Record a follower fetch. Returns False for a broker that is not a replica."""
        f = self.followers.get(replica_id)
        if f is None:
            if replica_id not in self.replicas or replica_id == self.local_id:
                return False
            f = self.followers[replica_id] = FollowerState(replica_id, 0)
        leo = self.log.log_end_offset
        if fetch_offset >= leo:
            f.last_caught_up_ms = max(f.last_caught_up_ms, now_ms)
        elif fetch_offset >= f.last_fetch_leader_leo >= 0:
            f.last_caught_up_ms = max(f.last_caught_up_ms, f.last_fetch_ms)
        f.last_fetch_leader_leo = leo
        f.last_fetch_ms = now_ms
        f.leo = fetch_offset
        f.fetch_epoch = fetch_epoch
        if log_start_offset >= 0:
            f.log_start_offset = log_start_offset
        return True

    def maybe_increment_hw(self) -> bool:
        """Advance the HW to the smallest LEO in the ISR (LogState.advance_hw, the rule the native Fetch
        path applies too). Returns whether it moved."""
        if self.stale or not self.is_leader:
            return False
        log = self.log
        return log.advance_hw(self.isr, self.followers, self.local_id, self.min_isr, log.log_end_offset)

    def can_join_isr(self, replica_id: int) -> bool:
        f = self.followers.get(replica_id)
        return (f is not None and replica_id not in self.isr and replica_id in self.replicas
                and f.fetch_epoch == self.leader_epoch
                and f.leo >= max(self.log.high_watermark, self.epoch_start_offset))

    def out_of_sync(self, now_ms: int, max_lag_ms: int) -> list[int]:
        """ISR followers not caught up for ``max_lag_ms`` (Kafka's isCaughtUp)."""
        leo = self.log.log_end_offset
        out = []
        for r in self.isr:
            if r == self.local_id:
                continue
            f = self.followers.get(r)
            if f is None:
                out.append(r)
            elif f.leo != leo and now_ms - f.last_caught_up_ms > max_lag_ms:
                out.append(r)
        return out

    def leader_hw_ready(self) -> bool:
        """A new leader's HW has reached its epoch's start (ListOffsets may answer)."""
        return self.log.high_watermark >= self.epoch_start_offset
