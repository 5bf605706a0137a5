"""ReplicaManager: every partition replica this broker holds, and the entry points the Produce and
Fetch handlers, the group coordinator and LeaderAndIsr/StopReplica call.

- ``append_records(entries, acks, timeout_ms)``: leader appends. acks 0/1 (or nothing left to
  wait for) -> the results dict directly, with no await and no extra allocation per batch;
  acks=all -> a future resolving when the high watermark covers each batch (DelayedProduce).
  acks=all is refused before the append with NOT_ENOUGH_REPLICAS when the ISR is below
  min.insync.replicas. Compressed batches (validated on kbroker/log/appender.py's pool first),
  large ones (written on the log dir's writer thread) and batches queued behind them (same
  connection and partition, or a large write in flight) make it a future for any acks.
- ``fetch_partition`` + ``record_follower_fetch``: the Fetch handler's leader lookup with KIP-320
  epoch checks; a follower fetch's offset is that follower's LEO (HW, ISR expansion).
- ``become_leader`` / ``become_follower`` / ``stop_replica``: LeaderAndIsr and StopReplica.
  A partition state with a lower leader epoch than the one held is refused (STALE_CONTROLLER_EPOCH
  per partition, as Kafka); an equal epoch with the same ISR/replicas is a no-op.
- ISR changes (leader only): shrink after replica.lag.time.max.ms without catching up, expand
  when a follower caught up in the current epoch. Each change is a version-checked write of the
  state znode (expected version = partition_epoch) on a worker thread, then an
  isr_change_notification for the controller. A StaleVersionError means someone else (the
  controller) moved the partition: this leader stops acknowledging acks=all until LeaderAndIsr.
- ``fence_leaders``: the broker's ZooKeeper session may have expired (zk/lease.py): every partition
  led here steps down at once (waiting acks=all answered NOT_LEADER_OR_FOLLOWER, the native slots
  disarmed, Produce and Fetch refused as for any non-leader) and is led again only when a
  LeaderAndIsr says so, or (``resume_fenced``, the session survived) its state znode still does.

Leader slots of the native path (``_fast_leaders``, one ``FastLeader`` per armed partition, shared by
the native Produce and Fetch, ext/request.pyx). The policy stays here, as each slot's state:
- ``_fast_refresh(p)`` arms a partition led here, not internal, whose log does not move its HW to the
  LEO by itself, and disarms it when its ISR is one broker that is not this leader alone (leader alone =
  ISR of one, not stale, min.insync.replicas <= 1: acks=-1 answered at once, HW to the log end on each
  append; any other ISR of one needs ``maybe_increment_hw``'s full rule). ``park`` (acks=-1 appended
  natively, then parked as a ``ParkedProduce`` in ``Partition.waiters`` until the HW covers it) is on
  when the ISR has followers, is at least min.insync.replicas and the leader is not stale; otherwise
  acks=-1 stays on the reference path, which refuses before the append (NOT_ENOUGH_REPLICAS,
  NOT_LEADER_OR_FOLLOWER).
- A slot holds the Partition, its Log, LeaderAppender, the LogConfig it was armed with, the leader epoch,
  flags, and containers that are never replaced, tested O(1) per request: ``Log.append_tails``,
  ``Partition.waiters``, the notifier's waiter dict, ``_failing_dirs``, the metrics dicts.
- Writers audited (``.isr =``, ``.stale =``, ``leader_epoch =``, ``leader_id =``, ``.replicas =``,
  ``partitions[...] =``, ``partitions.pop``): ``Partition._set`` (through make_leader / make_follower,
  followed by ``_fast_refresh`` in become_leader / become_follower), ``_write_isr`` (ISR change and
  ``stale = True``, each followed by ``_fast_refresh``), ``_partition`` (a new Partition is followed by
  become_*), ``stop_replica`` (disarms; topic deletion and stale logs go through it). A new writer of any
  of these must call ``_fast_refresh``.
- Checked per request instead, because they change without a refresh: ``Log.config is slot.config``
  (AlterConfigs, topic overrides: a mismatch calls ``_fast_rearm`` and leaves the request to Python),
  ``Partition.leader_epoch`` and ``leader_id`` (a mismatch re-arms too), ``Log.offline``, a large write
  in flight (``Log._write_job`` / ``write_future``), the active segment (re-read after a roll or a
  truncation), the epoch cache's latest epoch, the batch size against
  ``kbroker.log.writer.offload.bytes`` and the codec byte when validation runs off the loop.
- Nothing read-side is copied into a slot: the HW, log start, active segment, ``Log.offline`` and
  ``Log._write_job`` are read from the Log per request, so HW moves, retention, delete_records, rolls,
  truncation and compaction swaps need no hook. ``fetch.max.bytes`` is read from the broker config's
  value dict per request.
- A follower's fetch is served natively only when every partition is armed, the follower is in the ISR
  (an expansion is the reference path's), its ``FollowerState`` exists, the leader is not stale and the
  topic has no ``leader.replication.throttled.replicas`` (the leader quota is counted here).
  ``record_follower_fetch``'s effect is then done natively (``_record_followers``): the follower's
  fields, the HW when the ISR holds min.insync.replicas, ``_complete`` when the HW moved. A caught-up
  follower's fetch is recorded natively and handed to ``fetch.handle_native`` with
  ``FetchRequest.recorded`` for its long poll, whose re-reads are native too.

Threads: the event-loop thread; ZooKeeper writes go to worker threads.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import NamedTuple

from .. import switches
from .._native.request import FastFetch, FastLeader, FastProduce, arm_leader, disarm_leader
from ..log.appender import AppendThreads, codec_of
from ..log.errors import LogAppendError
from ..log.log import AppendResult
from ..protocol.errors import Errors
from ..topics import INTERNAL_TOPICS
from .delayed import DelayedProduce
from .fetcher import ReplicaFetcher
from .partition import Partition, follower_key
from .throttle import (FOLLOWER_RATE, FOLLOWER_REPLICAS, LEADER_RATE, LEADER_REPLICAS, ReplicationQuota,
                       ThrottleConfigWatcher)

log = logging.getLogger(__name__)

UNDECIDED = -1


class PartitionResult(NamedTuple):
    error_code: int
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    error_message: str | None = None


class LeaderAndIsrState(NamedTuple):
    leader: int
    leader_epoch: int
    isr: list
    replicas: list
    partition_epoch: int
    controller_epoch: int = -1
    is_new: bool = False


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class ReplicaManager:
    def __init__(self, broker):
        self.broker = broker
        self.broker_id = broker.broker_id
        self.logs = broker.logs
        cfg = broker.config
        self.lag_ms = cfg.get("replica.lag.time.max.ms")
        self.fetch_wait_ms = cfg.get("replica.fetch.wait.max.ms")
        self.fetch_min_bytes = cfg.get("replica.fetch.min.bytes")
        self.fetch_max_bytes = cfg.get("replica.fetch.max.bytes")
        self.fetch_response_max_bytes = cfg.get("replica.fetch.response.max.bytes")
        self.fetch_backoff_ms = cfg.get("replica.fetch.backoff.ms")
        self.socket_timeout_ms = cfg.get("replica.socket.timeout.ms")
        self.partitions: dict[tuple[str, int], Partition] = {}
        self.fetchers: dict[int, ReplicaFetcher] = {}
        self.controller_epoch = -1          # highest controller epoch seen (replica_control)
        # KIP-890 part 1: None, or the transaction coordinator's async check that a partition is in a
        # producer's transaction, called before a transactional batch starts a transaction on a
        # partition led here (server/apis/produce.py _verify_first has the contract).
        self.txn_verifier = None
        self.isr_shrinks = 0
        self.isr_expands = 0
        self._tasks: set = set()
        self._isr_task = None
        self.loop = None
        self.state_lock = asyncio.Lock()    # LeaderAndIsr / StopReplica apply one at a time
        # Replication throttle (throttle.py): bounds from the broker config, then ZooKeeper's
        # dynamic /config/brokers values; throttled replicas from the topics' configs.
        samples = cfg.get("replication.quota.window.num")
        window_s = cfg.get("replication.quota.window.size.seconds")
        topic_config = self.logs.topic_configs.get
        self.leader_quota = ReplicationQuota(LEADER_RATE, LEADER_REPLICAS, self.broker_id, cfg.get(LEADER_RATE),
                                             samples, window_s, topic_config)
        self.follower_quota = ReplicationQuota(FOLLOWER_RATE, FOLLOWER_REPLICAS, self.broker_id,
                                               cfg.get(FOLLOWER_RATE), samples, window_s, topic_config)
        self._throttle_watcher = None
        self._failing_dirs: dict = {}       # log dir -> appends failed there since its error line
        self.fast = None                    # FastProduce (fast_produce), when the native path serves Produce
        self.fast_fetch_handler = None      # FastFetch (fast_fetch), when it serves the consumer's small Fetch
        self._fast_leaders: dict = {}       # the armed slots both share: topic -> {partition: FastLeader}
        self.logs.on_log_replaced = self._log_replaced

    # -- native Produce path (ext/request.pyx FastProduce; ARCHITECTURE.md "Native Produce fast path") --

    def fast_produce(self, reference_path, write_failed):
        """The Produce handler for the native request path: a FastProduce whose armed partitions
        are served without a Python frame, ``reference_path`` (produce.handle_native) for everything else;
        ``reference_path`` itself when KBROKER_FAST_PRODUCE=0. ``write_failed`` answers a request one of
        whose fast appends could not be written (produce.fast_write_failed bound to the broker: the
        server wires the handlers in, replica never imports server)."""
        if not switches.current.fast_produce:
            log.info("native Produce fast path off (KBROKER_FAST_PRODUCE=0)")
            return reference_path
        threads = self._threads or self._append_threads()
        metrics = self.broker.metrics
        notifier = self.broker.notifier
        self.fast = FastProduce(reference_path, self._fast_rearm, write_failed, self._fast_leaders,
                                metrics.messages_in, metrics.bytes_in, notifier.waiters, notifier.appended,
                                self._failing_dirs, threads.write_offload_bytes, threads.validates_off_loop,
                                metrics.produce_failed)
        self._fast_refresh_all()
        return self.fast

    def fast_fetch(self, reference_path):
        """The Fetch handler for the native request path: a FastFetch serving the small Fetch of armed
        partitions without a Python frame (ext/request.pyx; the slots are the Produce path's): a
        consumer's, and an ISR follower's (its positions recorded as ``record_follower_fetch`` does,
        the HW moved, ``_complete`` called when it moves; a caught-up follower's long poll is still
        fetch.handle_native's), ``reference_path`` (fetch.handle_native) for everything else; ``reference_path``
        itself when KBROKER_FAST_FETCH=0."""
        if not switches.current.fast_fetch:
            log.info("native Fetch fast path off (KBROKER_FAST_FETCH=0)")
            return reference_path
        from ..log import segment
        self.fast_fetch_handler = FastFetch(reference_path, self._fast_rearm, self._fast_leaders,
                                            self.broker.metrics.bytes_out, self.broker.config.values,
                                            segment.read_blocks, self.broker_id, self.logs.topic_configs,
                                            self._complete, self.broker.metrics, self.broker.metadata.topic_ids)
        self._fast_refresh_all()
        return self.fast_fetch_handler

    def _fast_refresh_all(self) -> None:
        for p in self.partitions.values():
            self._fast_refresh(p)

    def _fast_refresh(self, p: Partition) -> None:
        """Arm ``p``'s native Produce slot when its state allows, else disarm it. Called on every
        change of what the slot holds or was decided from: leadership, leader epoch, ISR, replicas,
        stale (become_leader / become_follower / _write_isr), the partition gone (stop_replica), the
        log's config (the native path sees a new LogConfig object and calls _fast_rearm). A log whose config
        has the leader rewrite batches (LogConfig.leader_rewrites: compression.type, timestamp bounds) stays
        with the reference path."""
        if self.fast is None and self.fast_fetch_handler is None:
            return
        tp = p.tp
        lg = p.log
        isr = p.isr
        cfg = lg.config
        alone = len(isr) == 1 and isr[0] == p.local_id and not p.stale and cfg.min_insync_replicas <= 1
        if (self.partitions.get(tp) is not p or p.leader_id != p.local_id or tp[0] in INTERNAL_TOPICS
                or (len(isr) == 1 and not alone) or lg.hw_follows_leo or cfg.leader_rewrites
                or p.delete_waiters):
            # an ISR of one that is not this leader alone moves the HW by maybe_increment_hw's full rule
            disarm_leader(self._fast_leaders, tp)
            return
        # acks=-1 with followers in the ISR: appended natively, then parked (ParkedProduce) until the HW
        # covers it, when append_records would do the same (not stale, ISR >= min.insync.replicas);
        # otherwise acks=-1 stays Python's (its refusals before any append)
        park = len(isr) > 1 and not p.stale and len(isr) >= cfg.min_insync_replicas
        arm_leader(self._fast_leaders, FastLeader(tp, p, lg, lg._appender, cfg, p.leader_epoch, alone,
                                                  len(p.replicas) > 1, p.follower_key, p.waiters, lg.append_tails,
                                                  lg.epoch_cache, park))

    def _fast_rearm(self, tp) -> None:
        p = self.partitions.get(tp)
        if p is None:
            disarm_leader(self._fast_leaders, tp)
        else:
            self._fast_refresh(p)

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._isr_task = self.loop.create_task(self._isr_check_loop())
        if getattr(self.broker, "zk", None) is not None:
            cfg = self.broker.config
            self._throttle_watcher = ThrottleConfigWatcher(
                self.broker.zk, self.broker_id, {LEADER_RATE: self.leader_quota, FOLLOWER_RATE: self.follower_quota},
                {LEADER_RATE: cfg.get(LEADER_RATE), FOLLOWER_RATE: cfg.get(FOLLOWER_RATE)})
            self._throttle_watcher.start()

    @property
    def throttle_watcher(self) -> ThrottleConfigWatcher | None:
        """Follows this broker's dynamic configs (DescribeConfigs/AlterConfigs of BROKER resources)."""
        return self._throttle_watcher

    async def stop(self) -> None:
        if self._isr_task is not None:
            self._isr_task.cancel()
        if self._throttle_watcher is not None:
            self._throttle_watcher.stop()
        for f in list(self.fetchers.values()):
            await f.stop()
        self.fetchers.clear()
        for t in list(self._tasks):
            t.cancel()
        for p in self.partitions.values():
            self._fail_waiters(p, Errors.NOT_LEADER_OR_FOLLOWER)

    def _spawn(self, coro) -> None:
        t = self.loop.create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    # -- produce ------------------------------------------------------------------------------

    _threads = None                         # AppendThreads, made at the first append

    def _append_threads(self):
        cfg = self.broker.config
        self._threads = AppendThreads(cfg.get("kbroker.log.validation.threads"),
                                      cfg.get("kbroker.log.writer.offload.bytes"))
        return self._threads

    def append_records(self, entries: dict, acks: int, timeout_ms: int, internal: bool = False,
                       source=None):
        """Append each partition's batch as leader. -> {tp: PartitionResult}, or an awaitable of
        it for acks=all while the high watermark has not covered every batch, and for any acks
        when a batch is compressed (validated on a worker thread first), large (written on the
        log dir's writer thread), or has to wait: behind an earlier queued batch of the same
        ``source`` (the client connection) and partition, so one connection's batches land in
        the order it sent them, or behind a large write in flight on that partition. Other
        connections' batches do not wait for a source's validation."""
        now = time.time_ns() // 1_000_000       # _now_ms() without the call: once per Produce
        results = {}
        pending = None
        deferred = None
        metrics = self.broker.metrics
        notifier = self.broker.notifier
        threads = self._threads or self._append_threads()
        big = threads.write_offload_bytes
        off_loop = threads.validates_off_loop
        for tp, records in entries.items():
            p = self.partitions.get(tp)
            if p is None or p.leader_id != p.local_id:      # not p.is_leader, minus its property call
                results[tp] = PartitionResult(Errors.NOT_LEADER_OR_FOLLOWER)
                continue
            if not internal and tp[0] in INTERNAL_TOPICS:
                # Only the broker's own coordinators write these (Kafka's InvalidTopicException).
                results[tp] = PartitionResult(Errors.INVALID_TOPIC_EXCEPTION,
                                              error_message=f"Cannot append to internal topic {tp[0]}")
                continue
            if acks == -1:
                if p.stale:
                    results[tp] = PartitionResult(Errors.NOT_LEADER_OR_FOLLOWER,
                                                  error_message="this leader's ISR write was fenced")
                    continue
                if len(p.isr) < p.min_isr:
                    results[tp] = PartitionResult(
                        Errors.NOT_ENOUGH_REPLICAS,
                        error_message=f"ISR {p.isr} is smaller than min.insync.replicas={p.min_isr}")
                    continue
            lg = p.log
            n = len(records)
            tails = lg.append_tails
            if ((tails and source in tails) or lg.write_future is not None or n >= big
                    or (off_loop and n > 22 and records[22] & 7)):
                # records[22] & 7: the batch's codec (appender.ATTRIBUTES_LOW_BYTE / CODEC_MASK)
                results[tp] = PartitionResult(UNDECIDED)
                if deferred is None:
                    deferred = []
                deferred.append((tp, p, records))
                continue
            try:
                r = lg.append_as_leader(records, p.leader_epoch, now)
            except LogAppendError as e:
                if e.error_code == Errors.KAFKA_STORAGE_ERROR:
                    self._storage_failed(tp, lg, e)
                results[tp] = PartitionResult(e.error_code, error_message=e.message)
                continue
            if self._failing_dirs:
                if lg._appender.pending:
                    # deferred in a write-behind run: while a dir fails, its outcome is learnt now (as a
                    # lone append's), not at the run's end, and only a written append ends the streak
                    try:
                        lg._appender.write_deferred()
                    except OSError as e:
                        try:                            # its log is cut back (Log.on_cut reported the dir)
                            lg._write_failed(lg.segments[-1], e)
                        except LogAppendError as le:
                            results[tp] = PartitionResult(le.error_code, error_message=le.message)
                        continue
                self._storage_ok(lg)
            if not internal:
                # metrics.produced, inline as the Fetch handler's bytes_out (a call per request)
                topic = tp[0]
                counts = metrics.messages_in
                counts[topic] = counts.get(topic, 0) + r.last_offset - r.base_offset + 1
                counts = metrics.bytes_in
                counts[topic] = counts.get(topic, 0) + n
            # Followers' long polls wake on appends, consumers' on HW moves (_complete): a
            # consumer has nothing new to read until the HW moves.
            if len(p.replicas) > 1:
                notifier.appended(p.follower_key)
            isr = p.isr
            if len(isr) == 1:
                # An ISR of this leader alone: the HW is the log end (maybe_increment_hw's rule,
                # one call instead of its six property calls); anything else takes the full rule.
                if isr[0] == p.local_id and not p.stale and lg.config.min_insync_replicas <= 1:
                    moved = lg.high_watermark_to_end()
                else:
                    moved = p.maybe_increment_hw()
                if moved:
                    if p.waiters:
                        self._complete(p)
                    else:
                        notifier.appended(tp)       # _complete with no acks=all waiter to answer
            if acks == -1 and r.last_offset >= lg.high_watermark:
                results[tp] = PartitionResult(UNDECIDED, r.base_offset, r.log_append_time_ms, r.log_start_offset)
                if pending is None:
                    pending = []
                pending.append((p, r.last_offset + 1))
            else:
                # tuple.__new__: the NamedTuple's Python-level __new__ costs twice as much (per request)
                results[tp] = tuple.__new__(PartitionResult,
                                            (0, r.base_offset, r.log_append_time_ms, r.log_start_offset, None))
        if pending is None and deferred is None:
            return results
        waiting = (len(pending) if pending else 0) + (len(deferred) if deferred else 0)
        # acks 0/1 wait only for their deferred appends: no timer (timeout_ms is the replication wait)
        d = DelayedProduce(results, waiting, self.loop or asyncio.get_running_loop(),
                           timeout_ms if acks == -1 else None, self._timed_out)
        if pending:
            for p, required in pending:
                p.waiters.append((required, d))
        if deferred:
            for tp, p, records in deferred:
                self._defer(threads, tp, p, records, acks, internal, d, source)
        return d.future

    def append_markers(self, markers, timeout_ms: int):
        """WriteTxnMarkers: append each COMMIT/ABORT marker as leader and wait, as acks=all, until the
        high watermark covers it. ``markers``: [(tp, producer_id, producer_epoch, commit,
        coordinator_epoch)], one partition once. -> {tp: PartitionResult}, or an awaitable of it."""
        results = {}
        pending = []
        for tp, pid, epoch, commit, coordinator_epoch in markers:
            p = self.partitions.get(tp)
            if p is None:
                results[tp] = PartitionResult(Errors.UNKNOWN_TOPIC_OR_PARTITION)
                continue
            if not p.is_leader or p.stale:
                results[tp] = PartitionResult(Errors.NOT_LEADER_OR_FOLLOWER)
                continue
            lg = p.log
            try:
                r = lg.append_control(pid, epoch, commit, coordinator_epoch, p.leader_epoch)
            except LogAppendError as e:
                if e.error_code == Errors.KAFKA_STORAGE_ERROR:
                    self._storage_failed(tp, lg, e)
                results[tp] = PartitionResult(e.error_code, error_message=e.message)
                continue
            if len(p.replicas) > 1:
                self.broker.notifier.appended(p.follower_key)
            if p.maybe_increment_hw():
                self._complete(p)
            if r.last_offset >= lg.high_watermark:
                results[tp] = PartitionResult(UNDECIDED, r.base_offset, r.log_append_time_ms, r.log_start_offset)
                pending.append((p, r.last_offset + 1))
            else:
                results[tp] = PartitionResult(0, r.base_offset, r.log_append_time_ms, r.log_start_offset)
                self.broker.notifier.appended(tp)       # the LSO moved for read_committed polls
        if not pending:
            return results
        d = DelayedProduce(results, len(pending), self.loop or asyncio.get_running_loop(), timeout_ms,
                           self._timed_out)
        for p, required in pending:
            p.waiters.append((required, d))
        return d.future

    def _defer(self, threads, tp, p, records, acks, internal, d, source) -> None:
        """Queue one partition's append behind the source's earlier queued append to that log
        (append_tails) and start validating it now if it is compressed: validation runs in
        parallel, a source's appends in order."""
        loop = self.loop or asyncio.get_running_loop()
        lg = p.log
        prev = lg.append_tails.get(source)
        done = loop.create_future()
        lg.append_tails[source] = done
        validation = settings = None
        if threads.validates_off_loop and codec_of(records):
            validation, settings = threads.validate(loop, lg, records)
        t = loop.create_task(self._deferred_append(threads, tp, p, lg, records, acks, internal, d, prev, done,
                                                   validation, settings, source))
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _deferred_append(self, threads, tp, p, lg, records, acks, internal, d, prev, done,
                               validation, settings, source) -> None:
        error = None
        finished = False
        try:
            if validation is not None:
                try:
                    await validation
                except LogAppendError as e:
                    error = (e.error_code, e.message)
            if prev is not None:
                await prev                  # the source's earlier batch is in the log (or refused)
            while lg.write_future is not None:
                await lg.write_future       # a large write in flight on this log
            if error is None:
                if self.partitions.get(tp) is not p or not p.is_leader or p.log is not lg:
                    error = (Errors.NOT_LEADER_OR_FOLLOWER, None)
                elif acks == -1 and p.stale:
                    error = (Errors.NOT_LEADER_OR_FOLLOWER, "this leader's ISR write was fenced")
            if error is None:
                # Settings changed while validating (AlterConfigs): validate again in the append.
                prevalidated = validation is not None and settings == threads.settings_of(lg)
                now = _now_ms()
                try:
                    if len(records) >= threads.write_offload_bytes:
                        job = lg.begin_append_as_leader(records, p.leader_epoch, now, prevalidated)
                        if type(job) is not AppendResult:
                            loop = asyncio.get_running_loop()
                            lg.write_future = wf = loop.create_future()
                            try:
                                await loop.run_in_executor(threads.writer(lg), job.run)
                                job = lg.finish_append(job)
                            finally:
                                if lg.write_future is wf:
                                    lg.write_future = None
                                wf.set_result(None)
                        r = job
                    else:
                        r = lg.append_as_leader(records, p.leader_epoch, now, prevalidated=prevalidated)
                except LogAppendError as e:
                    if e.error_code == Errors.KAFKA_STORAGE_ERROR:
                        self._storage_failed(tp, lg, e)
                    error = (e.error_code, e.message)
                else:
                    if self._failing_dirs:
                        self._storage_ok(lg)
            if error is None:
                self._after_deferred_append(tp, p, lg, r, len(records), acks, internal, d)
                finished = True
        except BaseException:
            if not finished:
                error = (Errors.UNKNOWN_SERVER_ERROR, None)
            raise
        finally:
            # (an acks=all request may have timed out meanwhile: its answer is already decided)
            if error is not None and d.results[tp].error_code == UNDECIDED:
                d.results[tp] = PartitionResult(UNDECIDED, error_message=error[1])
                d.decide(tp, error[0])
            if lg.append_tails.get(source) is done:
                del lg.append_tails[source]
            done.set_result(None)

    def _after_deferred_append(self, tp, p, lg, r, nbytes, acks, internal, d) -> None:
        """What append_records does after a synchronous append (kept inline there)."""
        if not internal:
            self.broker.metrics.produced(tp[0], r.last_offset - r.base_offset + 1, nbytes)
        if len(p.replicas) > 1:
            self.broker.notifier.appended(p.follower_key)
        if len(p.isr) == 1 and p.maybe_increment_hw():
            self._complete(p)
        if d.results[tp].error_code != UNDECIDED:
            return                          # timed out while queued: already answered
        d.results[tp] = PartitionResult(UNDECIDED, r.base_offset, r.log_append_time_ms, r.log_start_offset)
        if acks == -1 and r.last_offset >= lg.high_watermark:
            if p.leader_id != p.local_id:
                d.decide(tp, Errors.NOT_LEADER_OR_FOLLOWER)     # stepped down during a large write
            else:
                p.waiters.append((r.last_offset + 1, d))
        else:
            d.decide(tp, 0)

    def _storage_failed(self, tp, lg, e) -> None:
        """A full or failing disk: one error line per log dir until an append there succeeds
        (every producer retry would otherwise log one). The first failure of a streak probes the dir:
        a failed dir (not a full one) goes offline (LogManager.check_dir -> log_dir_failed)."""
        d = os.path.dirname(lg.dir)
        failing = self._failing_dirs
        if d in failing:
            failing[d] += 1
            return
        failing[d] = 1
        log.error("appends to log dir %s fail (first: %s-%d: %s); further failures there are not logged "
                  "until an append succeeds", d, tp[0], tp[1], e.message)
        self.logs.check_dir(d)

    def log_dir_failed(self, tps) -> None:
        """The partitions of a log dir that went offline: no longer served here (waiting produces fail
        KAFKA_STORAGE_ERROR, follower fetching stops, clients are told NOT_LEADER_OR_FOLLOWER and look
        for the leader the controller elects elsewhere)."""
        for tp in tps:
            p = self.partitions.get(tp)
            if p is not None:
                self._fail_waiters(p, Errors.KAFKA_STORAGE_ERROR)
                info = self.broker.metadata.partition(p.topic, p.index)
                if info is not None and info.leader == self.broker_id:
                    info.leader = -1        # Metadata from here: no leader known, ask elsewhere
            self.stop_replica(tp, delete=False)
            # long polls on it end now (their next fetch is refused) instead of at their timeout
            self.broker.notifier.appended(tp)
            self.broker.notifier.appended(follower_key(*tp))

    def _appends_cut(self, lg, base: int, e: LogAppendError, rows: int) -> None:
        """Log.on_cut: batches appended in a write-behind run from offset ``base`` on could not be
        written and were cut away (ext/segment.pyx). As a failed append: the dir reported
        (``_storage_failed``), each acks=all wait on one of them decided KAFKA_STORAGE_ERROR (its
        offsets will be reused; the other partitions of its request still wait for the HW), and
        produce_failed counted for the ``rows`` the request layer answers KAFKA_STORAGE_ERROR
        instead (the decided waits count theirs when answered)."""
        tp = (lg.topic, lg.partition)
        self._storage_failed(tp, lg, e)
        p = self.partitions.get(tp)
        w = p.waiters if p is not None and p.log is lg else None
        lost = [d for required, d in w if required > base] if w else ()
        if lost:
            kept = [(required, d) for required, d in w if required <= base]
            w.clear()
            w.extend(kept)
            for d in lost:
                d.decide(tp, Errors.KAFKA_STORAGE_ERROR)
        for _ in range(rows - len(lost)):
            self.broker.metrics.produce_failed(tp[0])

    def _storage_ok(self, lg) -> None:
        d = os.path.dirname(lg.dir)
        n = self._failing_dirs.pop(d, None)
        if n is not None:
            log.warning("appends to log dir %s succeed again (%d failed meanwhile)", d, n)

    def _timed_out(self, d: DelayedProduce) -> None:
        for tp in d.undecided():
            d.decide(tp, Errors.REQUEST_TIMED_OUT)

    def _complete(self, p: Partition) -> None:
        """The HW moved: acknowledge the waiters it covers and wake consumers' long polls."""
        hw = p.log.high_watermark
        w = p.waiters
        while w and w[0][0] <= hw:
            _req, d = w.popleft()
            d.decide(p.tp, 0)
        self.broker.notifier.appended(p.tp)

    def _fail_waiters(self, p: Partition, code: int) -> None:
        w = p.waiters
        while w:
            _req, d = w.popleft()
            d.decide(p.tp, code)
        deletes, p.delete_waiters = p.delete_waiters, []
        for _offset, fut in deletes:
            if not fut.done():
                fut.set_result((code, -1))

    # -- DeleteRecords ------------------------------------------------------------------------

    def wait_deleted(self, p: Partition, offset: int, timeout_ms: int):
        """DeleteRecords on the leader moved its log start to ``offset``: an awaitable of (error code, low
        watermark), done once every in-sync replica's log start reached it (Kafka's DelayedDeleteRecords),
        REQUEST_TIMED_OUT after ``timeout_ms``. The partition's native slot is disarmed meanwhile: its
        followers' fetches take the reference path, which records the log start they carry."""
        fut = asyncio.get_running_loop().create_future()
        p.delete_waiters.append((offset, fut))
        self._fast_refresh(p)
        self._check_deletes(p)

        async def wait():
            try:
                return await asyncio.wait_for(asyncio.shield(fut), timeout_ms / 1000)
            except asyncio.TimeoutError:
                return Errors.REQUEST_TIMED_OUT, p.low_watermark()
            finally:
                if (offset, fut) in p.delete_waiters:
                    p.delete_waiters.remove((offset, fut))
                    if not p.delete_waiters:
                        self._fast_refresh(p)
        return wait()

    def _check_deletes(self, p: Partition) -> None:
        low = p.low_watermark()
        done = [(o, f) for o, f in p.delete_waiters if low >= o]
        if not done:
            return
        p.delete_waiters = [w for w in p.delete_waiters if w not in done]
        for _o, fut in done:
            if not fut.done():
                fut.set_result((Errors.NONE, low))
        if not p.delete_waiters:
            self._fast_refresh(p)

    # -- fetch --------------------------------------------------------------------------------

    def fetch_partition(self, tp, current_leader_epoch: int = -1):
        """-> (Partition or None, error code) for a read from the leader (KIP-320 checks)."""
        p = self.partitions.get(tp)
        if p is None:
            return None, Errors.NOT_LEADER_OR_FOLLOWER
        if current_leader_epoch >= 0 and current_leader_epoch != p.leader_epoch:
            return p, (Errors.FENCED_LEADER_EPOCH if current_leader_epoch < p.leader_epoch
                       else Errors.UNKNOWN_LEADER_EPOCH)
        if not p.is_leader:
            return p, Errors.NOT_LEADER_OR_FOLLOWER
        return p, Errors.NONE

    def leader_throttled(self, p: Partition, replica_id: int) -> bool:
        """Leave this partition's records out of a follower's fetch answer (Kafka's
        shouldLeaderThrottle): the follower is out of the ISR, the partition is listed in
        leader.replication.throttled.replicas for this broker, and the leader quota is exceeded."""
        q = self.leader_quota
        if replica_id in p.isr or not q.is_throttled(p.tp) or not q.is_exceeded():
            return False
        q.skipped += 1
        return True

    def record_leader_bytes(self, p: Partition, size: int) -> None:
        """Bytes of ``p`` sent to a follower: counted against the leader quota when throttled."""
        q = self.leader_quota
        if q.is_throttled(p.tp):
            q.record(size)

    def record_follower_fetch(self, p: Partition, replica_id: int, fetch_offset: int, fetch_epoch: int,
                              log_start_offset: int = -1) -> None:
        if not p.update_follower(replica_id, fetch_offset, fetch_epoch, _now_ms(), log_start_offset):
            return
        if p.delete_waiters:
            self._check_deletes(p)
        # HW = min(LEO over the ISR): an ISR follower fetching at or below the HW cannot move it (the
        # fetch that long-polls at a log end the HW has reached). A follower outside the ISR still
        # tries, as before: its fetch is what re-checks an HW held by a since lowered min.insync.replicas.
        isr = p.isr
        if (fetch_offset > p.log.high_watermark or replica_id not in isr) and p.maybe_increment_hw():
            self._complete(p)
        if replica_id not in isr and not p.isr_in_flight and not p.stale and p.can_join_isr(replica_id):
            self._change_isr(p, sorted(p.isr + [replica_id]), expand=True)

    # -- LeaderAndIsr / StopReplica ------------------------------------------------------------

    def _partition(self, tp, overrides: dict | None, topic_id: bytes | None) -> Partition:
        p = self.partitions.get(tp)
        lg = self.logs.get(tp)
        if p is not None and lg is p.log:
            if overrides is not None:
                self.logs.set_topic_config(tp[0], overrides)
            return p
        if lg is None:
            lg = self.logs.get_or_create(tp[0], tp[1], overrides)
        elif overrides is not None:
            self.logs.set_topic_config(tp[0], overrides)
        lg.on_cut = self._appends_cut
        p = Partition(tp[0], tp[1], lg, self.broker_id)   # topic_id: set once partition.metadata is checked
        self.partitions[tp] = p
        return p

    def _stale_epoch(self, p: Partition | None, st: LeaderAndIsrState) -> bool:
        return p is not None and st.leader_epoch < p.leader_epoch

    def _unchanged(self, p: Partition | None, st: LeaderAndIsrState) -> bool:
        return (p is not None and st.leader_epoch == p.leader_epoch and st.leader == p.leader_id
                and sorted(st.isr) == sorted(p.isr) and list(st.replicas) == p.replicas
                and (st.leader == self.broker_id or st.leader < 0
                     or (p.tp in self.fetchers.get(st.leader, ReplicaFetcher.EMPTY).partitions)))

    def become_leader(self, tp, st: LeaderAndIsrState, overrides: dict | None = None,
                      topic_id: bytes | None = None) -> int:
        p = self.partitions.get(tp)
        if self._stale_epoch(p, st):
            return Errors.STALE_CONTROLLER_EPOCH
        if self._unchanged(p, st):
            p.partition_epoch = max(p.partition_epoch, st.partition_epoch)
            return Errors.NONE
        p = self._partition(tp, overrides, topic_id)
        self._stop_fetching(tp)
        new = p.make_leader(st, _now_ms())
        if new:
            log.info("%s-%d: leader in epoch %d (isr %s, log end %d, hw %d)", tp[0], tp[1], st.leader_epoch,
                     st.isr, p.log.log_end_offset, p.log.high_watermark)
        if p.maybe_increment_hw():
            self._complete(p)
        self._fast_refresh(p)
        return Errors.NONE

    def become_follower(self, tp, st: LeaderAndIsrState, overrides: dict | None = None,
                        topic_id: bytes | None = None) -> int:
        p = self.partitions.get(tp)
        if self._stale_epoch(p, st):
            return Errors.STALE_CONTROLLER_EPOCH
        if self._unchanged(p, st):
            p.partition_epoch = max(p.partition_epoch, st.partition_epoch)
            return Errors.NONE
        p = self._partition(tp, overrides, topic_id)
        was_leader = p.is_leader
        if was_leader:
            self._fail_waiters(p, Errors.NOT_LEADER_OR_FOLLOWER)
        changed = p.make_follower(st)
        self._fast_refresh(p)
        if changed or was_leader:
            log.info("%s-%d: follower of %d in epoch %d (log end %d)", tp[0], tp[1], st.leader,
                     st.leader_epoch, p.log.log_end_offset)
        self._stop_fetching(tp)
        if st.leader >= 0:
            f = self.fetchers.get(st.leader)
            if f is None:
                f = self.fetchers[st.leader] = ReplicaFetcher(self, st.leader)
                f.start()
            f.add(tp)
        return Errors.NONE

    def apply_leader_and_isr(self, tp, st: LeaderAndIsrState, overrides: dict | None,
                             topic_id: str | None) -> int:
        """One partition state of a LeaderAndIsr. A log left by an earlier topic of the same name
        (another topic id in partition.metadata) is deleted and the replica starts empty."""
        if self.broker_id not in st.replicas:
            return Errors.NONE
        logs = self.logs
        if logs.in_offline_dir(tp) or (logs.offline_dirs and not st.is_new and logs.get(tp) is None):
            # Kafka's offline replica: its dir failed (or may be the failed one: a replica that is not
            # new and not found while a dir is offline is not created empty elsewhere)
            return Errors.KAFKA_STORAGE_ERROR
        p = self.partitions.get(tp)
        if (st.is_new and st.leader != self.broker_id and (p is None or st.leader_epoch > p.leader_epoch)
                and (lg := self.logs.get(tp)) is not None and lg.log_end_offset > 0):
            # The controller just added this replica (reassignment): whatever log is here was left
            # by an earlier stint as a replica (removed while this broker was away). Start empty.
            log.warning("%s-%d: new replica (is_new) over a leftover log ending at %d: deleting it",
                        tp[0], tp[1], lg.log_end_offset)
            self.stop_replica(tp, delete=True)
            p = None
        if topic_id and (p is None or p.topic_id != topic_id):
            lg = self.logs.get(tp)
            have = lg.read_topic_id() if lg is not None else None
            if have is not None and have != topic_id:
                log.warning("%s-%d: the log on disk belongs to topic id %s, not %s: deleting it",
                            tp[0], tp[1], have, topic_id)
                self.stop_replica(tp, delete=True)
                p = None
        if st.leader == self.broker_id:
            code = self.become_leader(tp, st, overrides, topic_id)
        else:
            code = self.become_follower(tp, st, overrides, topic_id)
        p = self.partitions.get(tp)
        if code == Errors.NONE and topic_id and p is not None and p.topic_id != topic_id:
            if p.log.read_topic_id() is None:
                p.log.write_topic_id(topic_id)
            p.topic_id = topic_id
        return code

    def fence_leaders(self) -> list:
        """Step down from every partition led here (the session lease ran out) -> their tps."""
        fenced = []
        for p in self.partitions.values():
            if p.leader_id != p.local_id:
                continue
            p.fence()
            self._fail_waiters(p, Errors.NOT_LEADER_OR_FOLLOWER)
            self._fast_refresh(p)
            info = self.broker.metadata.partition(p.topic, p.index)
            if info is not None and info.leader == self.broker_id:
                info.leader = -1        # Metadata from here: no leader known, ask elsewhere
            fenced.append(p.tp)
            # long polls on it end now (their next fetch is refused) instead of at their timeout
            self.broker.notifier.appended(p.tp)
            self.broker.notifier.appended(p.follower_key)
        if fenced:
            log.warning("ZooKeeper session may have expired: stepped down as leader of %d partitions "
                        "until the controller's LeaderAndIsr (%s)", len(fenced),
                        ", ".join(f"{t}-{i}" for t, i in fenced[:10]))
        return fenced

    async def resume_fenced(self) -> list:
        """The lease is back in the session it ran out in: ZooKeeper never expired it, so the controller
        saw no failure and sends nothing. Each partition stepped down from whose state znode is still
        the one it was led in (leader here, same leader epoch, same znode version: the controller's last
        word, unchanged) is led again; any other waits for the LeaderAndIsr of whoever changed it.
        -> the tps led again."""
        zk = self.broker.zk

        def read(p):
            k = zk.kazoo
            k.retry(k.sync, "/brokers/topics")     # not an older state from a lagging ZooKeeper server
            return zk.get_partition_state(p.topic, p.index)

        back = []
        for p in [p for p in self.partitions.values() if p.fenced_epoch >= 0 and p.leader_id < 0]:
            try:
                st, version = await asyncio.to_thread(read, p)
            except Exception:
                log.exception("%s-%d: cannot read its state to lead again; waiting for LeaderAndIsr",
                              p.topic, p.index)
                continue
            if (self.partitions.get(p.tp) is not p or p.fenced_epoch < 0 or p.leader_id >= 0
                    or st.leader != self.broker_id or st.leader_epoch != p.fenced_epoch
                    or version != p.partition_epoch):
                continue            # a LeaderAndIsr came meanwhile, or the state moved on
            p.isr = list(st.isr)
            p.unfence(_now_ms())
            self._fast_refresh(p)
            info = self.broker.metadata.partition(p.topic, p.index)
            if info is not None and info.leader < 0 and info.leader_epoch == p.leader_epoch:
                info.leader = self.broker_id
            back.append(p.tp)
        if back:
            log.warning("ZooKeeper session kept: leading again %d partitions whose state did not change (%s)",
                        len(back), ", ".join(f"{t}-{i}" for t, i in back[:10]))
        return back

    def fenced_partitions(self) -> int:
        """Partitions this broker stepped down from on its own and no LeaderAndIsr has settled since."""
        return sum(1 for p in self.partitions.values() if p.fenced_epoch >= 0)

    def stop_replica(self, tp, delete: bool) -> int:
        self._stop_fetching(tp)
        p = self.partitions.pop(tp, None)
        disarm_leader(self._fast_leaders, tp)
        if p is not None:
            self._fail_waiters(p, Errors.NOT_LEADER_OR_FOLLOWER)
        if delete:
            self.logs.delete(tp[0], tp[1])
        return Errors.NONE

    def _log_replaced(self, tp, old, new) -> None:
        """LogManager.on_log_replaced: a replica moved to another log dir (AlterReplicaLogDirs). The
        partition reads and appends through the new Log from now on; its native slot holds the old one."""
        p = self.partitions.get(tp)
        if p is None or p.log is not old:
            return
        p.log = new
        self._fast_refresh(p)

    def _stop_fetching(self, tp) -> None:
        for f in self.fetchers.values():
            f.remove(tp)

    def broker_address(self, broker_id: int):
        b = self.broker.metadata.brokers.get(broker_id)
        return None if b is None else (b.host, b.port)

    # -- ISR ----------------------------------------------------------------------------------

    async def _isr_check_loop(self) -> None:
        interval = max(self.lag_ms / 2, 50) / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                self.check_isr(_now_ms())
            except Exception:
                log.exception("ISR check failed")

    def check_isr(self, now_ms: int) -> None:
        for p in self.partitions.values():
            if p.is_leader and not p.isr_in_flight and not p.stale:
                out = p.out_of_sync(now_ms, self.lag_ms)
                if out:
                    log.info("%s-%d: shrinking ISR %s by %s (not caught up for %d ms)", p.topic, p.index,
                             p.isr, out, self.lag_ms)
                    self._change_isr(p, [r for r in p.isr if r not in out], expand=False)

    def _change_isr(self, p: Partition, new_isr: list, expand: bool) -> None:
        p.isr_in_flight = True
        self._spawn(self._write_isr(p, new_isr, expand))

    async def _write_isr(self, p: Partition, new_isr: list, expand: bool) -> None:
        from ..zk.client import StaleVersionError
        from ..zk.layout import PartitionState

        zk = self.broker.zk
        epoch, version = p.leader_epoch, p.partition_epoch
        state = PartitionState(leader=self.broker_id, leader_epoch=epoch, isr=list(new_isr),
                               controller_epoch=max(p.controller_epoch, 0))
        try:
            new_version = await asyncio.to_thread(zk.set_partition_state, p.topic, p.index, state,
                                                  expected_version=version)
        except StaleVersionError:
            if p.leader_epoch == epoch and p.is_leader:
                p.stale = True
                self._fast_refresh(p)
                log.warning("%s-%d: ISR write at version %d refused (the state moved): not acknowledging "
                            "acks=all until LeaderAndIsr", p.topic, p.index, version)
            return
        except Exception:
            log.exception("%s-%d: ISR write failed; will retry", p.topic, p.index)
            return
        finally:
            if p.leader_epoch == epoch:
                p.isr_in_flight = False
        if p.leader_epoch != epoch or not p.is_leader or self.partitions.get(p.tp) is not p:
            return      # a LeaderAndIsr overtook the write; its state wins
        p.isr = list(new_isr)
        p.partition_epoch = new_version
        self._fast_refresh(p)
        if expand:
            self.isr_expands += 1
        else:
            self.isr_shrinks += 1
        log.info("%s-%d: ISR is now %s (version %d)", p.topic, p.index, p.isr, new_version)
        self._update_metadata_isr(p)
        if len(p.isr) < p.min_isr:
            self._fail_waiters(p, Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND)
        elif p.maybe_increment_hw():
            self._complete(p)
        try:
            await asyncio.to_thread(zk.notify_isr_change, [p.tp])
        except Exception:
            log.exception("%s-%d: ISR change notification failed", p.topic, p.index)

    def _update_metadata_isr(self, p: Partition) -> None:
        info = self.broker.metadata.partition(p.topic, p.index)
        if info is not None and info.leader_epoch == p.leader_epoch:
            info.isr = list(p.isr)
            info.zk_version = p.partition_epoch

    # -- metrics ------------------------------------------------------------------------------

    def under_replicated(self) -> int:
        return sum(1 for p in self.partitions.values() if p.is_leader and len(p.isr) < len(p.replicas))

    def under_min_isr(self) -> int:
        return sum(1 for p in self.partitions.values() if p.is_leader and len(p.isr) < p.min_isr)
