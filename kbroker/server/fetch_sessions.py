"""Fetch sessions (KIP-227): the broker's cache of incremental fetch sessions and what each remembers.

A full fetch with session epoch 0 asks for a session: when the cache has a slot (``max.incremental.
fetch.session.cache.slots``), or can free one, the answer carries a new random non-zero id and the session
remembers each partition's request fields (fetch offset, log start, max bytes, current leader epoch) and
the answer's high watermark, last stable offset and log start offset. An incremental fetch (that id, the
session's next epoch) lists only the partitions whose request fields changed (added or updated) and those
to drop (``forgotten_topics_data``); its answer lists only the partitions with something to say: records,
a high watermark, last stable offset or log start offset other than the client last saw, an error.

Eviction is Kafka's: a session unused for EVICTION_MS goes first (least recently used); else a new
follower (privileged) session may take the slot of a consumer session or of one created more than
EVICTION_MS ago, a new consumer session only the latter, and only from a session with no more
partitions (sessions compare by privileged, then partition count, then id: the smallest is evicted).

Cheap idle fetches: a session does not re-read every partition per fetch. Standing waiters
(longpoll.StandingWaiter) on its partitions' notifier keys mark a partition dirty when an append (a
follower's key) or a high watermark / last stable offset move (the partition's key) reaches it, and wake
the session's long poll. A fetch reads only the partitions its request lists, the dirty ones, and those
that had an error or unread data at its last read (``carry``); all of them when the broker's metadata
changed (leadership moves come with an UpdateMetadata), when the topics refused by the ACLs changed, and at
least every ``sweep_ms`` (what no notification reports: a log start moved by retention or DeleteRecords; a
follower's caught-up time kept fresh for the ISR rule, which Kafka renews at every fetch).

A session unused for DORMANT_MS (its client gone, or not fetching) drops its standing waiters, so that
appends stop calling into it; its next fetch registers them again and reads every partition.

Sessions belong to the broker process: a restart loses them, and clients fall back to a full fetch on
FETCH_SESSION_ID_NOT_FOUND.

Threads: the event-loop thread.
"""
from __future__ import annotations

import random
import time
from operator import attrgetter

from ..replica.longpoll import StandingWaiter
from ..replica.partition import follower_key

INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0
FINAL_EPOCH = -1
EVICTION_MS = 120_000           # Kafka's minimum idle time before a session may be evicted as stale
DORMANT_MS = 30_000             # unused this long: a session's standing waiters are dropped until it is used
_MAX_ID = 0x7FFFFFFF
SEQ = attrgetter("seq")      # a CachedPartition's place in its session


def now_ms() -> int:
    """The sessions' clock (last use, creation, eviction ages): monotonic milliseconds."""
    return int(time.monotonic() * 1000)


def next_epoch(epoch: int) -> int:
    """The epoch after ``epoch`` (it wraps to 1, never to the initial 0)."""
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch == _MAX_ID else epoch + 1


class CachedPartition:
    """One partition of a session: the request fields the client last sent for it and the offsets of
    the last answer that listed it (``hw`` -1 after an error, so the partition is answered again)."""
    __slots__ = ("topic", "index", "topic_id", "fetch_offset", "log_start", "max_bytes", "leader_epoch",
                 "hw", "lso", "local_log_start", "waiters", "seq")

    def __init__(self, topic, index, topic_id, fields, seq):
        self.topic, self.index, self.topic_id, self.seq = topic, index, topic_id, seq
        self.hw = self.lso = self.local_log_start = -1
        self.waiters = ()
        self.update(fields)

    def update(self, fields) -> None:
        # fields: (partition, current_leader_epoch, fetch_offset, log_start_offset, partition_max_bytes)
        _index, self.leader_epoch, self.fetch_offset, self.log_start, self.max_bytes = fields

    def request_fields(self) -> tuple:
        return self.index, self.leader_epoch, self.fetch_offset, self.log_start, self.max_bytes


class FetchSession:
    __slots__ = ("id", "privileged", "uses_topic_ids", "creation_ms", "last_used_ms", "epoch", "parts",
                 "dirty", "carry", "_waiter", "metadata_updates", "refused", "swept_ms", "notify", "loop", "_seq",
                 "names", "sweep_ms", "dormant", "fresh")

    def __init__(self, session_id, privileged, uses_topic_ids, now_ms, notify, loop, sweep_ms):
        self.id = session_id
        self.privileged = privileged
        self.uses_topic_ids = uses_topic_ids
        self.creation_ms = self.last_used_ms = self.swept_ms = now_ms
        self.epoch = next_epoch(INITIAL_EPOCH)     # the epoch of the next incremental fetch
        self.parts: dict = {}           # (topic, index) -> CachedPartition, in answer order
        self._seq = 0                   # CachedPartition.seq: the order of ``parts`` as numbers
        self.dirty: set = set()         # (topic, index) told of an append / HW move since the last read
        self.carry: set = set()         # (topic, index) with an error or unread data at the last read
        self._waiter = None             # the future a long poll of this session waits on
        self.metadata_updates = -1
        self.refused = frozenset()
        self.notify = notify            # AppendNotifier.waiters: the standing waiters' registry
        self.loop = loop
        self.names: dict = {}           # topic -> how many of its partitions the session has
        self.sweep_ms = sweep_ms        # every partition is read at least this often
        self.dormant = False            # standing waiters dropped (DORMANT_MS unused)
        self.fresh = True               # no incremental fetch yet: only the full fetch's answer names it

    def __len__(self) -> int:
        return len(self.parts)

    # ---- partitions ------------------------------------------------------------------------------
    def add(self, topic, fields, topic_id=None) -> None:
        """Add a partition (or update its request fields): it is read at the next fetch."""
        tp = (topic, fields[0])
        cp = self.parts.get(tp)
        if cp is None:
            self._seq += 1
            cp = self.parts[tp] = CachedPartition(topic, fields[0], topic_id, fields, self._seq)
            self.names[topic] = self.names.get(topic, 0) + 1
            if not self.dormant:
                cp.waiters = self._waiters_of(tp)
        else:
            cp.update(fields)
        self.dirty.add(tp)

    def drop(self, tp) -> None:
        cp = self.parts.pop(tp, None)
        if cp is not None:
            n = self.names[cp.topic] - 1
            if n:
                self.names[cp.topic] = n
            else:
                del self.names[cp.topic]
            for w in cp.waiters:
                w.cancel()
            self.dirty.discard(tp)
            self.carry.discard(tp)

    def _waiters_of(self, tp) -> tuple:
        # a consumer waits for HW moves (the partition's key); a follower for appends too
        keys = (tp, follower_key(*tp)) if self.privileged else (tp,)
        return tuple(StandingWaiter(self.notify, key, tp, self._woken) for key in keys)

    def sleep(self) -> None:
        """Unused for DORMANT_MS: the standing waiters go (the next fetch reads every partition)."""
        self.dormant = True
        for cp in self.parts.values():
            for w in cp.waiters:
                w.cancel()
            cp.waiters = ()

    def resume(self) -> None:
        """Used again: the standing waiters back (the caller reads every partition this time)."""
        if self.dormant:
            self.dormant = False
            for tp, cp in self.parts.items():
                cp.waiters = self._waiters_of(tp)

    def close(self) -> None:
        """Out of the cache: its standing waiters go, and a long poll of it ends at once."""
        for tp in list(self.parts):
            self.drop(tp)
        self._wake()

    def _woken(self, tp) -> None:
        self.dirty.add(tp)
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    # ---- a long poll's wake-ups: the notifier interface replica.longpoll.long_poll uses ----------
    def waiter(self, _tps=None):
        """A future done at the next append / HW move of any of the session's partitions."""
        fut = self._waiter = self.loop.create_future()
        if self.dirty:
            fut.set_result(None)
        return fut

    def forget(self, _tps, fut) -> None:
        if self._waiter is fut:
            self._waiter = None

    # ---- what a fetch reads ------------------------------------------------------------------------
    def candidates(self, full: bool) -> list:
        """The partitions the next read covers, in session order (all of them when ``full``); the dirty
        set is taken."""
        if full:
            self.dirty = set()
            return list(self.parts.values())
        marked = self.dirty
        if self.carry:
            marked |= self.carry
        self.dirty = set()
        parts = self.parts
        if len(marked) * 4 < len(parts):
            # a few partitions: in session order without walking the session
            got = [cp for cp in map(parts.get, marked) if cp is not None]
            got.sort(key=SEQ)
            return got
        return [cp for tp, cp in parts.items() if tp in marked]

    def settle(self, read: list, rows: list, bound, full: bool = False) -> list:
        """Keep the rows of ``rows`` (the answer rows of ``read``'s partitions, grouped by topic as
        fetch._read gives them) the client must see (all of them when ``full``: a full fetch's answer),
        remember what they tell it, and move partitions that returned records to the end of the
        session (the next answer's budget reaches the others first). ``bound(cp, row)``: the offset up
        to which the partition can be read now: one left below it is read again at the next fetch, as
        is one with an error. -> the rows to answer."""
        out = []
        moved = []
        carry = self.carry
        i = 0
        for name, prows in rows:
            keep = prows if full else []
            for row in prows:
                cp = read[i]
                i += 1
                tp = (cp.topic, cp.index)
                must = False
                if row[1]:
                    must = True
                    cp.hw = -1
                    carry.add(tp)
                else:
                    records = row[5]
                    if records is not None and len(records):
                        must = True
                        moved.append(tp)
                    if cp.hw != row[2]:
                        cp.hw = row[2]
                        must = True
                    if cp.lso != row[3]:
                        cp.lso = row[3]
                        must = True
                    if cp.local_log_start != row[4]:
                        cp.local_log_start = row[4]
                        must = True
                    if len(row) > 7 and row[7] is not None and row[7] >= 0:
                        must = True      # KIP-392: a preferred read replica named
                    if cp.fetch_offset < bound(cp, row):
                        carry.add(tp)
                    else:
                        carry.discard(tp)
                if must and not full:
                    keep.append(row)
            if keep:
                out.append((name, keep))
        if moved and not full:
            parts = self.parts
            for tp in moved:
                cp = parts.pop(tp, None)
                if cp is not None:
                    self._seq += 1
                    cp.seq = self._seq
                    parts[tp] = cp
        return out


class FetchSessionCache:
    """The broker's sessions by id, at most ``slots`` of them. The broker builds it at start
    (``start``: the dormant check every DORMANT_MS / 2 on ``loop``) and closes it at stop."""

    def __init__(self, slots: int, notify, loop, sweep_ms: int, rng=None):
        self.slots = slots
        self.sweep_ms = sweep_ms
        self.notify = notify
        self.loop = loop
        self.sessions: dict[int, FetchSession] = {}
        self.evictions = 0
        self._rng = rng or random.SystemRandom()
        self._timer = None

    def start(self) -> None:
        """Sessions unused for DORMANT_MS go dormant (``check_dormant``), checked every DORMANT_MS / 2."""
        self._timer = self.loop.call_later(DORMANT_MS / 2000, self._check)

    def _check(self) -> None:
        self.check_dormant(now_ms())
        self._timer = self.loop.call_later(DORMANT_MS / 2000, self._check)

    def close(self) -> None:
        """The broker stops: no more checks, every session closed (its standing waiters dropped)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for s in self.sessions.values():
            s.close()
        self.sessions.clear()

    def __len__(self) -> int:
        return len(self.sessions)

    def get(self, session_id: int) -> FetchSession | None:
        return self.sessions.get(session_id)

    def remove(self, session_id: int) -> FetchSession | None:
        s = self.sessions.pop(session_id, None)
        if s is not None:
            s.close()
        return s

    def touch(self, session: FetchSession, now_ms: int) -> None:
        """An incremental fetch uses ``session``."""
        session.last_used_ms = now_ms
        session.fresh = False

    def check_dormant(self, now_ms: int) -> int:
        """Put the sessions unused for DORMANT_MS, with no fetch waiting, to sleep -> how many."""
        n = 0
        for s in self.sessions.values():
            if not s.dormant and s._waiter is None and now_ms - s.last_used_ms >= DORMANT_MS:
                s.sleep()
                n += 1
        return n

    def create(self, privileged: bool, size: int, uses_topic_ids: bool, now_ms: int) -> FetchSession | None:
        """A new session when there is a slot or one can be freed (Kafka's eviction), else None."""
        if self.slots <= 0:
            return None
        if len(self.sessions) >= self.slots and not self._evict(privileged, size, now_ms):
            return None
        sid = 0
        while sid == INVALID_SESSION_ID or sid in self.sessions:
            sid = self._rng.randint(1, _MAX_ID - 1)
        s = self.sessions[sid] = FetchSession(sid, privileged, uses_topic_ids, now_ms, self.notify, self.loop,
                                                  self.sweep_ms)
        return s

    def _evict(self, privileged: bool, size: int, now_ms: int) -> bool:
        sessions = self.sessions.values()
        lru = min(sessions, key=lambda s: (s.last_used_ms, s.id))
        if now_ms - lru.last_used_ms > EVICTION_MS:
            victim = lru
        else:
            # evictable: a consumer session (by a follower) or any session created over EVICTION_MS ago
            pool = [s for s in sessions
                    if now_ms - s.creation_ms > EVICTION_MS or (privileged and not s.privileged)]
            if not pool:
                return False
            victim = min(pool, key=lambda s: (s.privileged, len(s.parts), s.id))
            if (privileged, size, 0) < (victim.privileged, len(victim.parts), victim.id):
                return False
        self.remove(victim.id)
        self.evictions += 1
        return True
