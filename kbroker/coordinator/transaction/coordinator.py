"""TransactionCoordinator: Kafka's transaction protocol (KIP-98 with KIP-360 epoch bumps) for the
transactional ids whose ``__transaction_state`` partition this broker leads.

Ownership works as the group coordinator's: a periodic reconcile (and any request) loads a newly led
state partition from its log (COORDINATOR_LOAD_IN_PROGRESS meanwhile) and unloads one no longer led
(NOT_COORDINATOR). The leader epoch of the state partition is the coordinator epoch sent with every
marker, so a partition leader can refuse a deposed coordinator.

Every transition is written (acks=all) before it is acted on: EndTxn answers once PrepareCommit or
PrepareAbort is durable, then markers go to every partition's leader (WriteTxnMarkers, retried until
each leader has it), then CompleteCommit / CompleteAbort is written. A coordinator that loads a state
partition finishes every Prepare* it finds the same way. Ongoing transactions older than their timeout
are aborted with an epoch bump (the producer is fenced); ids idle past ``transactional.id.expiration.ms``
are removed with a tombstone. Everything runs on the broker's loop.
"""
from __future__ import annotations

import asyncio
import logging
import re

from ...protocol.api import ApiKey
from ...protocol.errors import Errors
from ...topics import GROUP_METADATA_TOPIC, TRANSACTION_STATE_TOPIC
from ..group_coordinator import partition_for
from ..ownership import LoadedPartition, PartitionLoader, periodic
from ..store import OffsetsStore
from . import records as txnlog
from .peers import PeerRequests
from .metadata import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, IllegalTransition, TxnMetadata
from .records import (COMPLETE_ABORT, COMPLETE_COMMIT, DEAD, EMPTY, ONGOING, PREPARE_ABORT, PREPARE_COMMIT,
                      PREPARE_EPOCH_FENCE, STATE_NAMES)

log = logging.getLogger(__name__)

E = Errors
MARKER_RETRY_MIN_S, MARKER_RETRY_MAX_S = 0.05, 1.0

# Per-partition WriteTxnMarkers answers worth another try (the leader moved, is catching up, or the
# write timed out); anything else ends the attempt for that partition as Kafka's marker handler does.
_RETRY_MARKER = {int(E.NOT_LEADER_OR_FOLLOWER), int(E.UNKNOWN_TOPIC_OR_PARTITION), int(E.NOT_ENOUGH_REPLICAS),
                 int(E.NOT_ENOUGH_REPLICAS_AFTER_APPEND), int(E.REQUEST_TIMED_OUT), int(E.KAFKA_STORAGE_ERROR),
                 int(E.LEADER_NOT_AVAILABLE), int(E.BROKER_NOT_AVAILABLE), int(E.NETWORK_EXCEPTION),
                 int(E.COORDINATOR_LOAD_IN_PROGRESS), int(E.UNKNOWN_SERVER_ERROR)}
# A leader that refuses the marker's producer epoch or our coordinator epoch: a newer coordinator or
# producer took over, so this coordinator stops sending.
_FENCED_MARKER = {int(E.INVALID_PRODUCER_EPOCH), int(E.TRANSACTION_COORDINATOR_FENCED)}


# How a verification's coordinator errors reach the producer (Kafka's AddPartitionsToTxnManager).
_FOR_PRODUCER = {int(E.COORDINATOR_NOT_AVAILABLE): int(E.NOT_ENOUGH_REPLICAS),
                 int(E.NOT_COORDINATOR): int(E.NOT_ENOUGH_REPLICAS),
                 int(E.COORDINATOR_LOAD_IN_PROGRESS): int(E.NOT_ENOUGH_REPLICAS),
                 int(E.PRODUCER_FENCED): int(E.INVALID_PRODUCER_EPOCH)}


class TransactionCoordinator:
    def __init__(self, broker):
        self.broker = broker
        self.store = OffsetsStore(broker, TRANSACTION_STATE_TOPIC, "request.timeout.ms")
        self.peers = PeerRequests(broker)
        self.txns: dict[str, TxnMetadata] = {}
        # Its epoch (the state partition's leader epoch) is the coordinator epoch; keys: transactional ids.
        self.owned = PartitionLoader(broker, TRANSACTION_STATE_TOPIC, self.store,
                                     "transaction.state.log.load.buffer.size", "transactional ids",
                                     self._read_record, self._install, self._drop_partition,
                                     txnlog.RecordFormatError)
        self.partitions = self.owned.partitions
        self._completing: dict[str, asyncio.Task] = {}
        self._tasks: list[asyncio.Task] = []
        self.loop: asyncio.AbstractEventLoop | None = None

    def _cfg(self, key):
        return self.broker.config.get(key)

    def now_ms(self) -> int:
        return self.broker.now_ms()

    # ---- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        if self.loop is not None:
            return
        self.loop = self.owned.loop = asyncio.get_running_loop()
        what = "transaction coordinator"
        self._tasks.append(self.loop.create_task(periodic(1.0, self.reconcile, what)))
        abort_s = self._cfg("transaction.abort.timed.out.transaction.cleanup.interval.ms") / 1000
        expire_s = self._cfg("transaction.remove.expired.transaction.cleanup.interval.ms") / 1000
        self._tasks.append(self.loop.create_task(periodic(abort_s, self.abort_timed_out, what)))
        self._tasks.append(self.loop.create_task(periodic(expire_s, self.expire_ids, what)))

    def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        self._tasks.clear()
        self.owned.unload_all()
        self.peers.close()

    def _ensure_started(self) -> None:
        if self.loop is None:
            self.start()

    # ---- state partitions --------------------------------------------------------------------------
    def partition_count(self) -> int:
        t = self.broker.metadata.topics.get(TRANSACTION_STATE_TOPIC)
        if t is not None and t.partitions:
            return len(t.partitions)
        return self._cfg("transaction.state.log.num.partitions")

    def partition_of(self, transactional_id: str) -> int:
        return partition_for(transactional_id, self.partition_count())

    def reconcile(self) -> None:
        self.owned.reconcile()

    @staticmethod
    def _read_record(found: dict, key, value, _pending_pid: int) -> None:
        """Fold one ``__transaction_state`` record into ``found`` {transactional id: TxnMetadata}."""
        tid = txnlog.decode_key(key)
        if value is None:
            found.pop(tid, None)
            return
        v = txnlog.decode_value(value)
        m = found.get(tid)
        if m is None:
            found[tid] = TxnMetadata.from_value(tid, v)
        else:
            m.apply(v)

    def _install(self, ps: LoadedPartition, found: dict) -> None:
        for tid, m in found.items():
            self.txns[tid] = m
            ps.keys.add(tid)
        # A Prepare* found here was decided by a previous coordinator: finish it (the task runs once the
        # partition is marked loaded).
        for tid in ps.keys:
            m = self.txns[tid]
            if m.state in (PREPARE_COMMIT, PREPARE_ABORT):
                self._start_completion(ps, m)

    def _unload(self, p: int) -> None:
        self.owned.unload(p)

    def _drop_partition(self, ps: LoadedPartition) -> None:
        for tid in ps.keys:
            self.txns.pop(tid, None)
            t = self._completing.pop(tid, None)
            if t is not None:
                t.cancel()

    def _owner(self, tid: str) -> tuple[int, LoadedPartition | None]:
        """(error, state partition) for coordinating ``tid`` here."""
        self._ensure_started()
        t = self.broker.metadata.topics.get(TRANSACTION_STATE_TOPIC)
        if t is None or not t.partitions:
            return int(E.COORDINATOR_NOT_AVAILABLE), None
        return self.owned.owner(partition_for(tid, len(t.partitions)))

    def _still_owned(self, ps: LoadedPartition, m: TxnMetadata) -> bool:
        return self.partitions.get(ps.index) is ps and self.txns.get(m.transactional_id) is m

    async def _write(self, ps: LoadedPartition, m: TxnMetadata, v: txnlog.TxnValue) -> int:
        """Write ``v`` for ``m`` and apply it once durable; the error as the transaction APIs report it."""
        m.pending = v.state
        try:
            record = (txnlog.encode_key(m.transactional_id), txnlog.encode_value(v))
            code, _ = await self.store.append(ps.index, [record], for_commit=False)
        finally:
            if m.pending == v.state:
                m.pending = None
        if not self._still_owned(ps, m):
            return int(E.NOT_COORDINATOR)
        if code:
            log.warning("writing %s of transactional id %s failed: %s", STATE_NAMES[v.state], m.transactional_id,
                        E(code).name)
            return code
        m.apply(v)
        return 0

    # ---- InitProducerId ----------------------------------------------------------------------------
    async def init_producer_id(self, tid: str, timeout_ms: int, expected_pid: int = NO_PRODUCER_ID,
                               expected_epoch: int = NO_PRODUCER_EPOCH) -> tuple[int, int, int]:
        """-> (error, producer id, epoch)."""
        fail = (NO_PRODUCER_ID, NO_PRODUCER_EPOCH)
        if not tid:
            return (int(E.INVALID_REQUEST), *fail)
        if timeout_ms <= 0 or timeout_ms > self._cfg("transaction.max.timeout.ms"):
            return (int(E.INVALID_TRANSACTION_TIMEOUT), *fail)
        err, ps = self._owner(tid)
        if err:
            return (err, *fail)
        m = self.txns.get(tid)
        if m is None:
            try:
                pid = await self.broker.producer_ids.allocate()
            except Exception:
                log.exception("producer id block allocation failed")
                return (int(E.COORDINATOR_NOT_AVAILABLE), *fail)
            err, ps = self._owner(tid)
            if err:
                return (err, *fail)
            m = self.txns.get(tid)
            if m is None:
                m = self.txns[tid] = TxnMetadata(tid, pid, NO_PRODUCER_ID, NO_PRODUCER_EPOCH, NO_PRODUCER_EPOCH,
                                                 timeout_ms, EMPTY, last_update_ms=self.now_ms())
                ps.keys.add(tid)
        if m.pending is not None:
            return (int(E.CONCURRENT_TRANSACTIONS), *fail)
        if expected_pid != NO_PRODUCER_ID and not self._valid_expected(m, expected_pid, expected_epoch):
            return (int(E.PRODUCER_FENCED), *fail)
        if m.state in (PREPARE_COMMIT, PREPARE_ABORT, DEAD):
            return (int(E.CONCURRENT_TRANSACTIONS), *fail)
        if m.state == ONGOING:
            # Fence the producer of the ongoing transaction and abort it; the client retries.
            await self._fence_and_abort(ps, m)
            return (int(E.CONCURRENT_TRANSACTIONS), *fail)
        # Empty, CompleteCommit, CompleteAbort: a new epoch (or a new id when the epoch is used up).
        now = self.now_ms()
        if m.is_producer_epoch_exhausted():
            try:
                new_pid = await self.broker.producer_ids.allocate()
            except Exception:
                log.exception("producer id block allocation failed")
                return (int(E.COORDINATOR_NOT_AVAILABLE), *fail)
            if not self._still_owned(ps, m) or m.pending is not None:
                return (int(E.CONCURRENT_TRANSACTIONS), *fail)
            v = m.value(EMPTY, producer_id=new_pid, epoch=0, timeout_ms=timeout_ms, partitions=set(), start_ms=-1,
                        now_ms=now)
        else:
            if expected_pid == NO_PRODUCER_ID or m.producer_epoch == NO_PRODUCER_EPOCH \
                    or expected_epoch == m.producer_epoch:
                epoch = m.producer_epoch + 1
            elif expected_epoch == m.last_producer_epoch and expected_pid == m.producer_id:
                # A retry of a bump whose answer was lost: the current epoch is the answer.
                epoch = m.producer_epoch
            else:
                return (int(E.PRODUCER_FENCED), *fail)
            v = m.value(EMPTY, epoch=epoch, timeout_ms=timeout_ms, partitions=set(), start_ms=-1, now_ms=now)
        err = await self._write(ps, m, v)
        if err:
            return (err, *fail)
        return 0, m.producer_id, m.producer_epoch

    @staticmethod
    def _valid_expected(m: TxnMetadata, pid: int, epoch: int) -> bool:
        # Kafka's isValidProducerId: a just-created id, the current id (its epoch is checked when
        # bumped), or the previous id whose epoch ran out (a retry after a new id was issued).
        return (m.producer_epoch == NO_PRODUCER_EPOCH or pid == m.producer_id
                or (pid == m.last_producer_id and epoch >= 32765))

    async def _fence_and_abort(self, ps: LoadedPartition, m: TxnMetadata) -> int:
        """Bump the epoch of ``m``'s ongoing transaction and abort it (a fenced or timed-out producer)."""
        m.pending = PREPARE_EPOCH_FENCE
        try:
            return await self.end_txn(m.transactional_id, m.producer_id, m.producer_epoch + 1, False,
                                       from_client=False)
        finally:
            if m.pending == PREPARE_EPOCH_FENCE:
                m.pending = None

    # ---- AddPartitionsToTxn / AddOffsetsToTxn ------------------------------------------------------------
    def _check_producer(self, tid: str, pid: int, epoch: int) -> tuple[int, LoadedPartition | None,
                                                                        TxnMetadata | None]:
        if not tid:
            return int(E.INVALID_REQUEST), None, None
        err, ps = self._owner(tid)
        if err:
            return err, None, None
        m = self.txns.get(tid)
        if m is None or m.producer_id != pid:
            return int(E.INVALID_PRODUCER_ID_MAPPING), None, None
        if m.producer_epoch != epoch:
            return int(E.PRODUCER_FENCED), None, None
        return 0, ps, m

    async def add_partitions(self, tid: str, pid: int, epoch: int, tps) -> int:
        err, ps, m = self._check_producer(tid, pid, epoch)
        if err:
            return err
        if m.pending is not None or m.state in (PREPARE_COMMIT, PREPARE_ABORT):
            return int(E.CONCURRENT_TRANSACTIONS)
        if m.state in (DEAD, PREPARE_EPOCH_FENCE):
            return int(E.INVALID_TXN_STATE)
        wanted = set(tps)
        if m.state == ONGOING and wanted <= m.partitions:
            return 0
        now = self.now_ms()
        start = m.start_ms if m.state == ONGOING else now
        v = m.value(ONGOING, partitions=m.partitions | wanted, start_ms=start, now_ms=now)
        return await self._write(ps, m, v)

    def verify_partitions(self, tid: str, pid: int, epoch: int, tps) -> dict:
        """AddPartitionsToTxn v4 verify_only (KIP-890): is each partition in the ongoing transaction?"""
        err, _ps, m = self._check_producer(tid, pid, epoch)
        if err:
            return {tp: err for tp in tps}
        return {tp: 0 if (m.state == ONGOING and tp in m.partitions) else int(E.INVALID_TXN_STATE) for tp in tps}

    async def verify_for_leader(self, tid: str, pid: int, epoch: int, tps) -> dict:
        """ReplicaManager.txn_verifier (KIP-890 part 1): a partition leader asks the coordinator of ``tid``
        (this broker's own, or another's over AddPartitionsToTxn v4 verify_only) whether each partition is
        in the producer's ongoing transaction. Errors as Kafka maps them for the producer: a coordinator
        that cannot answer is NOT_ENOUGH_REPLICAS (retriable for every client version), a fenced producer
        INVALID_PRODUCER_EPOCH."""
        tps = list(tps)
        t = self.broker.metadata.topics.get(TRANSACTION_STATE_TOPIC)
        info = t.partitions.get(partition_for(tid, len(t.partitions))) if t is not None and t.partitions else None
        if info is None or info.leader is None or info.leader < 0:
            codes = {tp: int(E.COORDINATOR_NOT_AVAILABLE) for tp in tps}
        elif info.leader == self.broker.broker_id:
            codes = self.verify_partitions(tid, pid, epoch, tps)
        else:
            topics: dict[str, list[int]] = {}
            for tp in tps:
                topics.setdefault(tp[0], []).append(tp[1])
            # v4 is the broker-to-broker version (batched, verify_only); clients stop at v3.
            resp = await self.peers.request(info.leader, ApiKey.ADD_PARTITIONS_TO_TXN, {"transactions": [
                {"transactional_id": tid, "producer_id": pid, "producer_epoch": epoch, "verify_only": True,
                 "topics": [{"name": n, "partitions": ps_} for n, ps_ in topics.items()]}]}, version=4)
            codes = {tp: int(E.COORDINATOR_NOT_AVAILABLE) for tp in tps}
            if resp is not None and not resp.get("error_code"):
                for r in resp["results_by_transaction"]:
                    for tr in r["topic_results"]:
                        for pr in tr["results_by_partition"]:
                            codes[(tr["name"], pr["partition_index"])] = pr["partition_error_code"]
            elif resp is not None:
                codes = {tp: resp["error_code"] for tp in tps}
        return {tp: _FOR_PRODUCER.get(c, c) for tp, c in codes.items()}

    def offsets_partition(self, group_id: str) -> tuple[str, int]:
        t = self.broker.metadata.topics.get(GROUP_METADATA_TOPIC)
        n = len(t.partitions) if t is not None and t.partitions else self._cfg("offsets.topic.num.partitions")
        return GROUP_METADATA_TOPIC, partition_for(group_id, n)

    async def add_offsets(self, tid: str, pid: int, epoch: int, group_id: str) -> int:
        return await self.add_partitions(tid, pid, epoch, [self.offsets_partition(group_id)])

    # ---- EndTxn ----------------------------------------------------------------------------------------
    async def end_txn(self, tid: str, pid: int, epoch: int, commit: bool, from_client: bool = True) -> int:
        if not tid:
            return int(E.INVALID_REQUEST)
        err, ps = self._owner(tid)
        if err:
            return err
        m = self.txns.get(tid)
        if m is None or m.producer_id != pid:
            return int(E.INVALID_PRODUCER_ID_MAPPING)
        if (from_client and epoch != m.producer_epoch) or epoch < m.producer_epoch:
            return int(E.PRODUCER_FENCED)
        fencing = m.pending == PREPARE_EPOCH_FENCE and not from_client
        if m.pending is not None and not fencing:
            return int(E.CONCURRENT_TRANSACTIONS)
        state = m.state
        if state == ONGOING:
            target = PREPARE_COMMIT if commit else PREPARE_ABORT
            if target == PREPARE_ABORT and fencing:
                m.pending = None
                m.last_producer_epoch = NO_PRODUCER_EPOCH
            try:
                v = m.value(target, epoch=epoch, now_ms=self.now_ms())
            except IllegalTransition:
                return int(E.INVALID_TXN_STATE)
            err = await self._write(ps, m, v)
            if err:
                return err
            self._start_completion(ps, m)
            return 0
        if fencing:
            m.pending = None
        if state == COMPLETE_COMMIT:
            return 0 if commit else int(E.INVALID_TXN_STATE)
        if state == COMPLETE_ABORT:
            return 0 if not commit else int(E.INVALID_TXN_STATE)
        if state == PREPARE_COMMIT:
            return int(E.CONCURRENT_TRANSACTIONS) if commit else int(E.INVALID_TXN_STATE)
        if state == PREPARE_ABORT:
            return int(E.CONCURRENT_TRANSACTIONS) if not commit else int(E.INVALID_TXN_STATE)
        return int(E.INVALID_TXN_STATE)

    def _start_completion(self, ps: LoadedPartition, m: TxnMetadata) -> None:
        old = self._completing.get(m.transactional_id)
        if old is not None and not old.done():
            return
        self._completing[m.transactional_id] = self.loop.create_task(self._complete(ps, m))

    async def _complete(self, ps: LoadedPartition, m: TxnMetadata) -> None:
        """Markers to every partition of a Prepare* transaction, then Complete*."""
        tid = m.transactional_id
        try:
            commit = m.state == PREPARE_COMMIT
            pid, epoch = m.producer_id, m.producer_epoch
            if not await self._send_markers(ps, m, pid, epoch, commit, set(m.partitions)):
                return
            target = COMPLETE_COMMIT if commit else COMPLETE_ABORT
            delay = MARKER_RETRY_MIN_S
            while self._still_owned(ps, m):
                if m.pending is None and m.state in (PREPARE_COMMIT, PREPARE_ABORT):
                    err = await self._write(ps, m, m.value(target, partitions=set(), now_ms=self.now_ms()))
                    if not err:
                        log.debug("transaction of %s (producer %d epoch %d) %s", tid, pid, epoch,
                                  STATE_NAMES[target])
                        return
                    if err == E.NOT_COORDINATOR:
                        return
                else:
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, MARKER_RETRY_MAX_S)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("completing the transaction of %s failed", tid)
        finally:
            if self._completing.get(tid) is asyncio.current_task():
                del self._completing[tid]

    async def _send_markers(self, ps: LoadedPartition, m: TxnMetadata, pid: int, epoch: int, commit: bool,
                            left: set) -> bool:
        """WriteTxnMarkers until every partition in ``left`` has its marker; False if this coordinator
        lost the transaction meanwhile (a new coordinator finishes it)."""
        delay = MARKER_RETRY_MIN_S
        md = self.broker.metadata
        while left:
            if not self._still_owned(ps, m):
                return False
            by_leader: dict[int, list] = {}
            for tp in list(left):
                t = md.topics.get(tp[0])
                if t is None:
                    log.info("dropping the %s marker of %s for %s-%d: the topic is gone",
                             "COMMIT" if commit else "ABORT", m.transactional_id, *tp)
                    left.discard(tp)
                    continue
                info = t.partitions.get(tp[1])
                if info is None:
                    left.discard(tp)
                    continue
                if info.leader is None or info.leader < 0:
                    continue
                by_leader.setdefault(info.leader, []).append(tp)
            if not left:
                break
            sends = []
            for leader, tps in by_leader.items():
                topics: dict[str, list[int]] = {}
                for t, p in tps:
                    topics.setdefault(t, []).append(p)
                marker = {"producer_id": pid, "producer_epoch": epoch, "transaction_result": commit,
                          "coordinator_epoch": ps.epoch,
                          "topics": [{"name": t, "partition_indexes": ps_} for t, ps_ in topics.items()]}
                sends.append(self.peers.send_markers(leader, [marker]))
            for answer in await asyncio.gather(*sends):
                if answer is None:
                    continue
                for (apid, t, p), code in answer.items():
                    if apid != pid:
                        continue
                    if code == 0:
                        left.discard((t, p))
                    elif code in _FENCED_MARKER:
                        log.warning("marker for %s-%d of %s refused (%s): stopping", t, p, m.transactional_id,
                                    E(code).name)
                        return False
                    elif code not in _RETRY_MARKER:
                        log.warning("marker for %s-%d of %s failed (%s): not retried", t, p, m.transactional_id,
                                    E(code).name if code in E._value2member_map_ else code)
                        left.discard((t, p))
            if left:
                await asyncio.sleep(delay)
                delay = min(delay * 2, MARKER_RETRY_MAX_S)
        return self._still_owned(ps, m)

    # ---- timeouts and expiration ---------------------------------------------------------------------------
    async def abort_timed_out(self) -> int:
        """Abort (with an epoch bump that fences the producer) every ongoing transaction past its timeout."""
        now = self.now_ms()
        n = 0
        for m in list(self.txns.values()):
            if m.state != ONGOING or m.pending is not None or m.start_ms + m.timeout_ms > now:
                continue
            err, ps = self._owner(m.transactional_id)
            if err or self.txns.get(m.transactional_id) is not m:
                continue
            if m.is_producer_epoch_exhausted():
                continue   # Kafka leaves these for the producer's InitProducerId to resolve
            log.info("aborting the transaction of %s (producer %d epoch %d): older than its timeout %d ms",
                     m.transactional_id, m.producer_id, m.producer_epoch, m.timeout_ms)
            if not await self._fence_and_abort(ps, m):
                n += 1
        return n

    async def expire_ids(self) -> int:
        """Remove ids idle for ``transactional.id.expiration.ms`` with no transaction open (a tombstone)."""
        now = self.now_ms()
        expiry = self._cfg("transactional.id.expiration.ms")
        n = 0
        for m in list(self.txns.values()):
            if m.state not in (EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT) or m.pending is not None:
                continue
            if m.last_update_ms + expiry > now:
                continue
            err, ps = self._owner(m.transactional_id)
            if err or self.txns.get(m.transactional_id) is not m:
                continue
            m.pending = DEAD
            try:
                code, _ = await self.store.append(ps.index, [(txnlog.encode_key(m.transactional_id), None)],
                                                  for_commit=False)
            finally:
                m.pending = None
            if code or not self._still_owned(ps, m):
                continue
            m.state = DEAD
            del self.txns[m.transactional_id]
            ps.keys.discard(m.transactional_id)
            n += 1
            log.info("transactional id %s expired", m.transactional_id)
        return n

    # ---- DescribeTransactions / ListTransactions -------------------------------------------------------------
    def describe(self, tid: str) -> dict:
        out = {"error_code": 0, "transactional_id": tid, "transaction_state": "", "transaction_timeout_ms": 0,
               "transaction_start_time_ms": -1, "producer_id": -1, "producer_epoch": -1, "topics": []}
        err, _ps = self._owner(tid)
        m = self.txns.get(tid) if not err else None
        if err or m is None:
            out["error_code"] = err or int(E.TRANSACTIONAL_ID_NOT_FOUND)
            return out
        by_topic: dict[str, list[int]] = {}
        for t, p in sorted(m.partitions):
            by_topic.setdefault(t, []).append(p)
        out.update(transaction_state=m.state_name, transaction_timeout_ms=m.timeout_ms,
                   transaction_start_time_ms=m.start_ms, producer_id=m.producer_id, producer_epoch=m.producer_epoch,
                   topics=[{"topic": t, "partitions": ps} for t, ps in by_topic.items()])
        return out

    async def list_transactions(self, states, pids, duration_ms: int = -1, pattern: str | None = None):
        """-> (error, unknown state filters, [(transactional id, producer id, state name)])."""
        self._ensure_started()
        if not await self.owned.all_loaded():
            return int(E.COORDINATOR_LOAD_IN_PROGRESS), [], []
        names = {n.lower(): i for i, n in enumerate(STATE_NAMES)}
        unknown = [s for s in states if s.lower() not in names]
        wanted = {names[s.lower()] for s in states if s.lower() in names}
        if states and not wanted:
            return 0, unknown, []
        pids = set(pids)
        rx = re.compile(pattern) if pattern else None
        now = self.now_ms()
        out = []
        for tid, m in self.txns.items():
            if wanted and m.state not in wanted:
                continue
            if pids and m.producer_id not in pids:
                continue
            if duration_ms >= 0 and (m.state != ONGOING or now - m.start_ms < duration_ms):
                continue
            if rx is not None and not rx.search(tid):
                continue
            out.append((tid, m.producer_id, m.state_name))
        return 0, unknown, out
