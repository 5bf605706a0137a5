"""ReplicaFetcher: one asyncio task per source (leader) broker, copying its partitions' batches.

Loop: connect (kbroker.client BrokerConnection to the leader's registered endpoint); for the
partitions that just became followers, truncate by leader epoch (below); then Fetch v11 with
replica_id = this broker's id, current_leader_epoch, fetch_offset = own LEO,
replica.fetch.wait.max.ms / replica.fetch.min.bytes / replica.fetch.max.bytes /
replica.fetch.response.max.bytes. The leader's batches are appended as they are
(Log.append_as_follower); the follower HW = min(leader HW, own LEO).

Truncation (KIP-101/279): send OffsetForLeaderEpoch (replica_id = own id) for the latest epoch
in the local epoch cache. The leader answers its largest epoch <= ours and where it ends. If we
hold that epoch too, truncate to min(leader's end, our end for it); otherwise ask again with our
largest epoch below it, until the epochs agree. Without any local epoch, truncate to the HW.

Throttle (throttle.py): a partition listed in follower.replication.throttled.replicas for this
broker is left out of the Fetch while the follower quota is exceeded, unless it had caught up with
the leader's high watermark at its last fetch (Kafka's isReplicaInSync); the bytes appended for
throttled partitions count against the quota. When only throttled partitions are left, the
fetcher waits THROTTLE_WAIT_S and looks again.

Fetch session (KIP-227, ``FetchSession`` below, as Kafka's follower keeps one per leader) when the
follower fetches SESSION_MIN_PARTITIONS or more partitions from the leader: the first
Fetch is full (session epoch 0) and the leader answers with a session id; later ones are incremental,
naming only the partitions whose fetch fields changed (offset, log start, leader epoch) and those no
longer fetched (parked, truncating, moved: ``forgotten_topics_data``), and the leader answers only the
partitions with something new. FETCH_SESSION_ID_NOT_FOUND (e.g. the leader restarted) starts a new
session; any other session error, or a failed connection, closes it and fetches in full again.

Errors: connection failures back off replica.fetch.backoff.ms; FENCED_LEADER_EPOCH,
UNKNOWN_LEADER_EPOCH, NOT_LEADER_OR_FOLLOWER park the partition for the backoff (a LeaderAndIsr
will move it); OFFSET_OUT_OF_RANGE truncates again (or restarts the log at the leader's log start).

Threads: the event-loop thread.
"""
from __future__ import annotations

import asyncio
import logging
import time

from ..client.connection import BrokerConnection
from ..log.errors import LogAppendError
from ..protocol.errors import Errors

log = logging.getLogger(__name__)

FETCH, OFFSET_FOR_LEADER_EPOCH = 1, 23
FETCH_VERSION = 11            # replica_id in the body, current_leader_epoch, no topic ids
OFFSET_FOR_LEADER_EPOCH_VERSION = 3
MAX_EPOCH_ROUNDS = 16
THROTTLE_WAIT_S = 0.05
# A follower with fewer partitions from a leader fetches sessionless: the leader's native path answers
# such a fetch (records, positions, HW) without Python, cheaper than a session's Python bookkeeping; with
# more, the session's incremental fetches (only what changed, both ways) cost the leader less.
SESSION_MIN_PARTITIONS = 32


class FetchSession:
    """The follower's side of its fetch session with one leader: what the leader's session holds for
    each partition (``sent``), and the id and epoch of the next request. Below ``min_partitions``
    partitions the follower fetches sessionless (session epoch -1): the leader's native path serves
    such a fetch for less than the session's bookkeeping costs it."""
    __slots__ = ("id", "epoch", "sent", "min_partitions", "sessionless")

    def __init__(self, min_partitions: int = 0):
        self.id = 0
        self.epoch = 0          # 0: the next fetch is full (and asks for a session)
        self.sent: dict = {}    # tp -> (fetch_offset, current_leader_epoch, log_start_offset, max_bytes)
        self.min_partitions = min_partitions
        self.sessionless = False    # the request being answered had no session

    def next(self, wanted: dict) -> tuple[dict, list, int, int]:
        """The partitions to fetch (tp -> fields) -> (the ones this request lists, the ones it forgets,
        its session id, its session epoch)."""
        self.sessionless = len(wanted) < self.min_partitions
        if self.sessionless:
            sid, self.id, self.epoch, self.sent = self.id, 0, 0, {}
            return wanted, [], sid, -1          # (an id with epoch -1 ends that session)
        if self.epoch == 0:
            self.sent = wanted
            return wanted, [], self.id, 0
        sent = self.sent
        changed = {tp: f for tp, f in wanted.items() if sent.get(tp) != f}
        forgotten = [tp for tp in sent if tp not in wanted]
        self.sent = wanted
        return changed, forgotten, self.id, self.epoch

    def answered(self, error_code: int, session_id: int) -> bool:
        """The answer's top-level error code and session id -> whether its partitions are to be used."""
        if error_code:
            if error_code == Errors.FETCH_SESSION_ID_NOT_FOUND:
                self.id = 0
            self.epoch = 0
            return False
        if self.sessionless:
            pass
        elif self.epoch == 0:
            self.id = session_id
            self.epoch = 1 if session_id else 0
        elif session_id == 0:
            self.id = self.epoch = 0        # the leader ended the session
        else:
            self.epoch = 1 if self.epoch == 0x7FFFFFFF else self.epoch + 1
        return True

    def close(self) -> None:
        """After a failure: the next fetch is full, and ends the session the leader may still hold."""
        self.epoch = 0


class _State:
    __slots__ = ("truncating", "parked_until", "caught_up")

    def __init__(self):
        self.truncating = True
        self.parked_until = 0.0
        self.caught_up = False      # own LEO reached the leader's HW at the last fetch


def truncation_step(lg, asked_epoch: int, leader_epoch: int, leader_end: int):
    """One OffsetForLeaderEpoch answer (KIP-101/279) -> (truncation offset, None) when decided, or
    (None, epoch to ask about next). The leader answered with its largest epoch <= ``asked_epoch``
    and that epoch's end. If we hold that epoch too, the logs agree up to the smaller of the two
    ends; if not, we ask about our own largest epoch below it. No answer -> the high watermark."""
    if leader_epoch < 0 or leader_end < 0:
        return lg.high_watermark, None
    mine, my_end = lg.end_offset_for_epoch(leader_epoch)
    if mine != leader_epoch and 0 <= mine < asked_epoch:
        return None, mine
    return min(leader_end, my_end if my_end >= 0 else leader_end, lg.log_end_offset), None


class ReplicaFetcher:
    EMPTY = None      # set below: a fetcher-shaped object with no partitions

    def __init__(self, rm, source_id: int):
        self.rm = rm
        self.source_id = source_id
        self.partitions: dict = {}          # tp -> _State
        self._wake = asyncio.Event()
        self._task = None
        self._conn = None
        self.session = FetchSession(SESSION_MIN_PARTITIONS)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        self._close()

    def add(self, tp) -> None:
        self.partitions[tp] = _State()
        self._wake.set()

    def remove(self, tp) -> None:
        self.partitions.pop(tp, None)

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def _run(self) -> None:
        rm = self.rm
        backoff = rm.fetch_backoff_ms / 1000
        while True:
            if not self.partitions:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                if self._conn is None or self._conn.closed:
                    self._close()
                    addr = rm.broker_address(self.source_id)
                    if addr is None:
                        raise ConnectionError(f"broker {self.source_id} has no known endpoint")
                    self._conn = await BrokerConnection.open(
                        addr[0], addr[1], node_id=self.source_id, client_id=f"broker-{rm.broker_id}-fetcher",
                        request_timeout_ms=rm.socket_timeout_ms, security=rm.broker.inter_broker_security)
                if any(s.truncating for s in self.partitions.values()):
                    await self._truncate()
                fetched = await self._fetch()
                if fetched is None:
                    await asyncio.sleep(THROTTLE_WAIT_S)     # only throttled partitions left
                elif not fetched:
                    await self._park_wait()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("fetcher from broker %d: %s; retrying in %.1f s", self.source_id, e, backoff)
                self.session.close()
                self._close()
                await asyncio.sleep(backoff)

    async def _park_wait(self) -> None:
        """Every partition is parked: sleep until the first comes back (or one is added)."""
        now = time.monotonic()
        due = min((s.parked_until for s in self.partitions.values()), default=now)
        self._wake.clear()
        try:
            await asyncio.wait_for(self._wake.wait(), max(due - now, 0.01))
        except asyncio.TimeoutError:
            pass

    def _park(self, tp) -> None:
        s = self.partitions.get(tp)
        if s is not None:
            s.parked_until = time.monotonic() + self.rm.fetch_backoff_ms / 1000

    # -- truncation ---------------------------------------------------------------------------

    async def _truncate(self) -> None:
        rm = self.rm
        queries = {}     # tp -> epoch to ask about
        now = time.monotonic()
        for tp, s in self.partitions.items():
            if not s.truncating or s.parked_until > now:
                continue
            p = rm.partitions.get(tp)
            if p is None:
                continue
            epoch = p.log.epoch_cache.latest_epoch
            if epoch < 0:
                self._truncate_to(p, p.log.high_watermark, "no local leader epochs")
                s.truncating = False
            else:
                queries[tp] = epoch
        for _round in range(MAX_EPOCH_ROUNDS):
            if not queries:
                return
            asked = {tp: (rm.partitions[tp], e) for tp, e in queries.items() if tp in rm.partitions}
            body = {"replica_id": rm.broker_id, "topics": []}
            by_topic = {}
            for (t, i), (p, e) in asked.items():
                by_topic.setdefault(t, []).append({"partition": i, "current_leader_epoch": p.leader_epoch,
                                                   "leader_epoch": e})
            body["topics"] = [{"topic": t, "partitions": ps} for t, ps in by_topic.items()]
            _v, resp = await self._conn.send(OFFSET_FOR_LEADER_EPOCH, body, OFFSET_FOR_LEADER_EPOCH_VERSION)
            queries = {}
            for t in resp["topics"]:
                for r in t["partitions"]:
                    tp = (t["topic"], r["partition"])
                    if tp not in asked or tp not in self.partitions:
                        continue
                    p, asked_epoch = asked[tp]
                    if r["error_code"]:
                        self._park(tp)
                        continue
                    leader_epoch, end = r["leader_epoch"], r["end_offset"]
                    target, again = truncation_step(p.log, asked_epoch, leader_epoch, end)
                    if again is not None:
                        queries[tp] = again             # ask again about our epoch below theirs
                        continue
                    self._truncate_to(p, target, f"leader {self.source_id} epoch {leader_epoch} ends at {end}")
                    self.partitions[tp].truncating = False

    def _truncate_to(self, p, offset: int, why: str) -> None:
        lg = p.log
        if offset < lg.log_end_offset:
            log.info("%s-%d: truncating from %d to %d (%s)", p.topic, p.index, lg.log_end_offset, offset, why)
            lg.truncate_to(offset)

    # -- fetch --------------------------------------------------------------------------------

    async def _fetch(self) -> bool | None:
        """One Fetch round. Returns False when every partition is parked or truncating, None when
        the rest are held back by the follower throttle."""
        rm = self.rm
        quota = rm.follower_quota
        now = time.monotonic()
        wanted = {}
        sent = {}
        throttled = set()
        held_back = False
        max_bytes = rm.fetch_max_bytes
        for tp, s in self.partitions.items():
            if s.truncating or s.parked_until > now:
                continue
            p = rm.partitions.get(tp)
            if p is None or p.leader_id != self.source_id:
                continue
            if quota.is_throttled(tp):
                if not s.caught_up and quota.is_exceeded(now):
                    quota.skipped += 1
                    held_back = True
                    continue
                throttled.add(tp)
            lg = p.log
            leo = lg.log_end_offset
            sent[tp] = (p, p.leader_epoch, leo)
            wanted[tp] = (leo, p.leader_epoch, lg.log_start_offset, max_bytes)
        if not sent:
            return None if held_back else False
        session = self.session
        listed, forgotten, session_id, session_epoch = session.next(wanted)
        by_topic = {}
        for (t, i), (offset, epoch, start, most) in listed.items():
            by_topic.setdefault(t, []).append({"partition": i, "current_leader_epoch": epoch, "fetch_offset": offset,
                                               "log_start_offset": start, "partition_max_bytes": most})
        gone = {}
        for t, i in forgotten:
            gone.setdefault(t, []).append(i)
        body = {"replica_id": rm.broker_id, "max_wait_ms": rm.fetch_wait_ms, "min_bytes": rm.fetch_min_bytes,
                "max_bytes": rm.fetch_response_max_bytes, "isolation_level": 0, "session_id": session_id,
                "session_epoch": session_epoch, "topics": [{"topic": t, "partitions": ps} for t, ps in by_topic.items()],
                "forgotten_topics_data": [{"topic": t, "partitions": ps} for t, ps in gone.items()], "rack_id": ""}
        try:
            _v, resp = await self._conn.send(FETCH, body, FETCH_VERSION,
                                             timeout=(rm.fetch_wait_ms + rm.socket_timeout_ms) / 1000)
        except BaseException:
            session.close()     # the leader may or may not have taken this epoch
            raise
        code = resp.get("error_code") or 0
        if not session.answered(code, resp.get("session_id") or 0):
            if code in (Errors.FETCH_SESSION_ID_NOT_FOUND, Errors.INVALID_FETCH_SESSION_EPOCH,
                        Errors.FETCH_SESSION_TOPIC_ID_ERROR):
                log.info("fetcher from broker %d: fetch session error %d; fetching in full", self.source_id, code)
                return True
            raise ConnectionError(f"fetch failed with error {code}")
        for t in resp["responses"]:
            for r in t["partitions"]:
                tp = (t["topic"], r["partition_index"])
                got = sent.get(tp)
                s = self.partitions.get(tp)
                if got is None or s is None:
                    continue
                p, epoch, offset = got
                if rm.partitions.get(tp) is not p or p.leader_epoch != epoch or p.log.log_end_offset != offset:
                    continue        # moved on while the fetch was out (new epoch, truncation)
                code = r["error_code"]
                lg = p.log
                if code == 0:
                    records = r["records"]
                    if records is not None and len(records):
                        try:
                            lg.append_as_follower(records)
                        except LogAppendError as e:
                            log.warning("%s-%d: follower append failed (%s); truncating again", tp[0], tp[1], e)
                            s.truncating = True
                            continue
                        rm.broker.metrics.replication_bytes_in += len(records)
                        if tp in throttled:
                            quota.record(len(records))
                    lg.high_watermark = min(r["high_watermark"], lg.log_end_offset)
                    # The leader's log start moved (DeleteRecords, retention): follow, never past our HW.
                    start = min(r["log_start_offset"], lg.high_watermark)
                    if start > lg.log_start_offset:
                        lg.delete_records(start)
                    s.caught_up = lg.log_end_offset >= r["high_watermark"]
                elif code == Errors.OFFSET_OUT_OF_RANGE:
                    start = r["log_start_offset"]
                    if 0 <= offset < start:
                        log.info("%s-%d: log end %d is below the leader's log start %d: starting over there",
                                 tp[0], tp[1], offset, start)
                        lg.truncate_fully(start)
                    else:
                        s.truncating = True
                else:
                    self._park(tp)
        return True


class _NoFetcher:
    partitions: dict = {}


ReplicaFetcher.EMPTY = _NoFetcher()
