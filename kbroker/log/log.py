"""One partition's log: an ordered list of segments in ``<log.dir>/<topic>-<partition>/``.

Files: ``%020d.log/.index/.timeindex`` per segment (segment.py, index.py), ``%020d.txnindex``
the aborted transactions whose markers are in that segment (txn_index.py), ``%020d.snapshot``
producer-state snapshots (producer_state.py), ``leader-epoch-checkpoint`` (epoch_cache.py).

Transactions: producer state tracks each producer's ongoing transaction; ``last_stable_offset`` is
min(HW, first offset of the earliest ongoing one); ``append_control`` writes a COMMIT/ABORT marker as
leader (followers and recovery replay the markers they find, ``_replay_marker``); aborts are indexed.
The log-dir checkpoints (recovery point, high watermark, log start) are written by LogManager
from this object's attributes.

Offsets: ``log_start_offset`` <= ``high_watermark`` <= ``log_end_offset`` (LEO: the next offset
to assign). A leader append stamps the batch with base offset = LEO (native
validate_and_stamp), checks idempotent-producer state, rolls if needed and writes the batch
with one write to the active segment.

Threads: every method runs on the broker's event-loop thread; the byte work (validation, CRC,
writes, index search, header walks) is native and releases the GIL. Exception: a large leader
append's bytes are written by WriteJob.run on the log dir's writer thread (appender.py) between
begin_append_as_leader and finish_append; until then the log's state is the one before the batch,
and whatever else changes the log first settles that write (_settle).

Write-behind (``run_begin`` / ``run_end`` of ext/segment.pyx, opened by the connection's native read
around consecutive Produce frames of one receive chunk, on that thread only): a plain leader append is
stamped in the receive chunk and committed to the state at once (offsets, LEO, the HW of an ISR of one),
but its bytes are written by ``run_end``, one writev per log, before any other frame is served, before
any answer can leave and before the chunk can be reused. The rules:
- Every other write path of the log writes the pending bytes first (``_settle_writes``). A lone Produce
  frame is written as it is handled.
- A failed write of deferred bytes (at ``run_end``, or earlier when another write path writes them
  first) cuts the log back to the first of them (``_deferred_write_failed``) and the run answers as a
  failed append is answered; the connection stays open. Each deferred batch carries its request's run
  tag, so ``run_lost()`` names the requests whose batches were cut away; their answers are rewritten
  natively (ext/request.pyx), acks=0 closes the connection.
- ``on_cut`` (the replica manager's ``_appends_cut``) is told at the failure itself: the dir is reported
  once per streak, every acks=all wait on a batch at or after the cut is decided KAFKA_STORAGE_ERROR
  (the other partitions of its request still wait for the HW; the cut offsets will be reused), and
  produce_failed counts each cut-away row of the requests other than the one being handled.
- While a dir is failing, an append that would be deferred is written at once, so its outcome is a lone
  append's and only a written append ends the streak (the native path leaves such requests to Python).
- An idempotent batch is never deferred: the log's pending bytes are written first, then the batch, and
  only a successful write records it in producer state, so a retry after a failed write is appended, not
  answered as a duplicate of lost data (tests/test_write_behind.py).
The reference path's appends in a run (``append_as_leader`` -> ``LeaderAppender.append``) defer and are
tagged the same way.

Crash: see ``_load``. Without the clean-shutdown marker every segment from the one holding the
recovery point onwards is CRC-scanned, the first invalid batch and everything after it are
removed, indexes rebuilt, the epoch cache re-derived and clamped, producer state replayed (the
aborted-transaction index past the snapshot it starts from rebuilt with it), the high watermark
clamped to the new log end. With the marker only index sanity checks and a
header read after the last index entry run.
"""
import bisect
import logging
import os
import threading
import time
from typing import NamedTuple

from kbroker._native import batch as _batch
from kbroker._native import segment as _native

from .cleaner import recover_swaps
from ..config import TOPIC_CONFIGS, broker_synonym_value
from .checkpoint import write_text
from .epoch_cache import UNDEFINED_EPOCH, LeaderEpochCache
from .errors import (CORRUPT_MESSAGE, INVALID_RECORD, KAFKA_STORAGE_ERROR, LogAppendError,
                     OffsetOutOfRange)
from .producer_state import ProducerStateManager
from . import txn_index as _txn
from .segment import INT64_MAX, LogSegment

_log = logging.getLogger(__name__)

LONG_MAX = INT64_MAX
PARTITION_METADATA = "partition.metadata"
SNAPSHOTS_KEPT = 3

# The topic keys the storage layer acts on. Their defaults and broker-level synonyms come from the
# one table of topic settings, kbroker.config.TOPIC_CONFIGS (DescribeConfigs, CreateTopics and the
# broker's topic_defaults() read the same table).
LOG_KEYS = ("segment.bytes", "segment.ms", "retention.ms", "retention.bytes", "max.message.bytes",
            "message.timestamp.type", "index.interval.bytes", "segment.index.bytes", "flush.messages",
            "flush.ms", "min.insync.replicas", "cleanup.policy", "file.delete.delay.ms",
            # Compaction (cleaner.py).
            "delete.retention.ms", "min.compaction.lag.ms", "max.compaction.lag.ms",
            "min.cleanable.dirty.ratio")

DEFAULTS = {k: TOPIC_CONFIGS[k].default for k in LOG_KEYS}

_STRING_KEYS = {"message.timestamp.type", "cleanup.policy"}
_FLOAT_KEYS = {"min.cleanable.dirty.ratio"}


class LogConfig:
    """Typed topic config. Values may be ints or the strings a config file or a CreateTopics
    request carries."""

    def __init__(self, values: dict | None = None):
        merged = dict(DEFAULTS)
        for k, v in (values or {}).items():
            if k in DEFAULTS:
                merged[k] = v
        for k, v in merged.items():
            if k == "cleanup.policy":
                # A list from the broker config/ZooKeeper, or Kafka's comma-separated text.
                items = v.split(",") if isinstance(v, str) else v
                merged[k] = ",".join(str(x).strip() for x in items if str(x).strip())
            else:
                merged[k] = str(v) if k in _STRING_KEYS else float(v) if k in _FLOAT_KEYS else int(v)
        if merged["message.timestamp.type"] not in ("CreateTime", "LogAppendTime"):
            raise ValueError(f"message.timestamp.type: {merged['message.timestamp.type']!r}")
        if merged["segment.bytes"] < 14:
            raise ValueError("segment.bytes must be at least 14")
        if merged["index.interval.bytes"] < 0:
            raise ValueError("index.interval.bytes must be >= 0")
        self.values = merged
        self.segment_bytes = merged["segment.bytes"]
        self.segment_ms = merged["segment.ms"]
        self.retention_ms = merged["retention.ms"]
        self.retention_bytes = merged["retention.bytes"]
        self.max_message_bytes = merged["max.message.bytes"]
        self.log_append_time = merged["message.timestamp.type"] == "LogAppendTime"
        self.index_interval_bytes = merged["index.interval.bytes"]
        self.segment_index_bytes = merged["segment.index.bytes"]
        self.flush_messages = merged["flush.messages"]
        self.flush_ms = merged["flush.ms"]
        self.min_insync_replicas = merged["min.insync.replicas"]
        self.cleanup_policy = frozenset(merged["cleanup.policy"].split(","))
        self.compact = "compact" in self.cleanup_policy     # keyed records required (per append)
        self.file_delete_delay_ms = merged["file.delete.delay.ms"]

    @staticmethod
    def from_broker(props: dict) -> dict:
        """Translate broker-level keys (log.retention.hours, ...) to topic-level ones; of several
        synonyms the most specific wins, as in Kafka (ms over minutes over hours)."""
        out = {k: v for k, v in props.items() if k in DEFAULTS}
        for key in LOG_KEYS:
            value = broker_synonym_value(key, props.get)
            if value is not None:
                out[key] = value
        return out


class AppendResult(NamedTuple):
    base_offset: int
    last_offset: int
    log_append_time_ms: int       # -1 unless the topic uses LogAppendTime
    log_start_offset: int


class FetchData(NamedTuple):
    regions: list                 # [(fd, position, length)] into read-only segment fds
    size: int                     # sum of the region lengths
    high_watermark: int
    log_start_offset: int
    log_end_offset: int


def now_ms() -> int:
    return int(time.time() * 1000)


def validate_batch(buf, max_message_bytes: int, compact: bool) -> None:
    """Record-level validation of one producer batch as append_as_leader does it (header, CRC,
    and for a compressed batch the decompressed records: count, offset deltas, keys when
    ``compact``), without stamping or touching any log: a pure function of the bytes, safe on
    any thread, the byte work (decompression included) without the GIL. Lets the produce path
    run the expensive part on an executor and then append with ``prevalidated=True``. Raises
    LogAppendError with the codes append_as_leader would give."""
    try:
        _batch.validate_batch(buf, max_message_bytes, compact)
    except _batch.BatchError as e:
        raise LogAppendError(e.error_code, str(e)) from None


class WriteJob:
    """One batch's bytes to write on a log dir's writer thread (Log.begin_append_as_leader).
    ``run`` touches only the segment's append descriptor and this object; ``done`` is set when
    the bytes are written (or the write failed), after which the loop may finish the append."""
    __slots__ = ("log", "segment", "buf", "info", "base", "last", "leader_epoch", "append_time", "now",
                 "position", "written", "error", "done", "outcome")

    def __init__(self, log, segment, buf, info, base, last, leader_epoch, append_time, now):
        self.log, self.segment, self.buf, self.info = log, segment, buf, info
        self.base, self.last, self.leader_epoch, self.append_time, self.now = base, last, leader_epoch, append_time, now
        self.position = segment.size
        self.written = 0
        self.error = None
        self.done = threading.Event()
        self.outcome = None             # AppendResult or LogAppendError, set on the loop

    def run(self) -> None:
        try:
            self.written = self.segment.write_bytes(self.buf)
        except OSError as e:
            self.error = e
        finally:
            self.done.set()


class Log(_native.LogState):
    # LogState (ext/segment.pyx) holds the fields the native Produce/Fetch paths touch per request as C
    # fields: config, segments, offline, dirty, log_start_offset, _high_watermark, write_future, _write_job.
    def __init__(self, dir_path: str, topic: str, partition: int, config: LogConfig, *,
                 clean_shutdown: bool = True, recovery_point: int = 0, log_start_offset: int = 0,
                 high_watermark: int = 0, now: int | None = None, hw_follows_leo: bool = True):
        self.dir = dir_path
        self.topic = topic
        self.partition = partition
        self.config = config
        os.makedirs(dir_path, exist_ok=True)
        self.segments: list = []           # sorted by base offset; the last one is active
        self._bases: list = []             # their base offsets, for bisect
        self._pending_delete: list = []    # (due_ms, segment): renamed, fds still open
        self.producer_state = ProducerStateManager(dir_path)
        self.txn_index = _txn.TxnIndex(dir_path)         # aborted transactions (``.txnindex`` files)
        self.epoch_cache = LeaderEpochCache(dir_path)
        self.log_start_offset = log_start_offset
        self.recovery_point = recovery_point
        self._high_watermark = high_watermark
        # Single broker: the high watermark follows the log end (the leader is the whole ISR,
        # so everything it holds is committed, also right after a restart); replication passes
        # False and moves it with ``high_watermark = ...``.
        self.hw_follows_leo = hw_follows_leo
        self._appender = _native.LeaderAppender()     # leader appends' limits and unflushed count
        self._appender.log = self                     # told when deferred bytes cannot be written
        # on_cut(log, base, error, rows): told after deferred bytes that could not be written were cut
        # away from offset ``base`` (the replica layer fails what waits on them and reports the dir);
        # None: the cut is logged here.
        self.on_cut = None
        self.last_flush_ms = now_ms() if now is None else now
        self.dirty = False                 # appended since the last flush
        self.offline = False
        self.recovered_segments = 0        # segments CRC-scanned by the last load
        # Compaction: offsets below this were cleaned (cleaner-offset-checkpoint, LogManager).
        self.cleaner_checkpoint = 0
        self._epoch_write_failing = False
        # Produce path ordering (kbroker/log/appender.py): per source (a client connection), the
        # done-future of its last append still queued on this log (validating off the loop or
        # written on the dir's writer thread). A source's next append goes behind it, so its
        # batches land in the order it sent them; other sources are not held up by its queue.
        self.append_tails: dict = {}
        # While a large append's bytes are being written: a future done when it is finished
        # (every other append to this log waits for it; set and cleared by the append's task).
        self.write_future = None
        self._write_job = None             # WriteJob whose bytes the writer thread is writing
        self._load(clean_shutdown, now_ms() if now is None else now)

    # -- properties -------------------------------------------------------------------------

    @property
    def active_segment(self) -> LogSegment:
        return self.segments[-1]

    @property
    def log_end_offset(self) -> int:
        return self.segments[-1].next_offset

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    @high_watermark.setter
    def high_watermark(self, offset: int) -> None:
        self._high_watermark = min(max(offset, self.log_start_offset), self.log_end_offset)

    def high_watermark_to_end(self) -> bool:
        """Move the high watermark to the log end offset (a leader whose ISR is itself alone):
        what ``high_watermark = log_end_offset`` does, as one call on the append path. Returns
        whether it moved."""
        return self.advance_hw_alone(self.segments[-1].next_offset)

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    # -- load / recovery --------------------------------------------------------------------

    def _load(self, clean: bool, now: int) -> None:
        recover_swaps(self.dir)            # complete or roll back an interrupted compaction swap
        self._remove_leftovers()
        bases = sorted(int(n[:20]) for n in os.listdir(self.dir)
                       if n.endswith(".log") and len(n) == 24 and n[:20].isdigit())
        cfg = self.config
        for b in bases:
            self.segments.append(LogSegment(self.dir, b, cfg.index_interval_bytes,
                                            cfg.segment_index_bytes, active=False, now_ms=now))
        recovered = []          # batch headers from CRC-scanned segments, in order
        i = 0
        while i < len(self.segments):
            seg = self.segments[i]
            holds_rp = i + 1 == len(self.segments) or self.segments[i + 1].base_offset > self.recovery_point
            must_scan = not clean and holds_rp
            if not must_scan and seg.load():
                i += 1
                continue
            prev_end = self.segments[i - 1].next_offset if i else seg.base_offset
            batches, truncated = seg.recover(max(prev_end, seg.base_offset))
            self.recovered_segments += 1
            recovered.extend(batches)
            if truncated:
                # Everything after the first invalid batch is suspect: drop later segments.
                later_segs = self.segments[i + 1:]
                later_bytes = sum(s.size for s in later_segs)
                for later in later_segs:
                    later.mark_deleted()
                    later.remove()
                del self.segments[i + 1:]
                # Said once per truncation, as Kafka does: what went, from where, and why.
                _log.warning(
                    "%s: recovery truncated the log at offset %d: %d bytes of segment %020d.log from byte %d "
                    "(reason: first batch there failed the size/CRC/offset check or was incomplete)%s",
                    self.name, seg.next_offset, truncated, seg.base_offset, seg.size,
                    "" if not later_segs else "; dropped %d later segment(s) with base offsets %d..%d (%d bytes)"
                    % (len(later_segs), later_segs[0].base_offset, later_segs[-1].base_offset, later_bytes))
            i += 1
        if not self.segments:
            start = self.log_start_offset
            self.segments.append(LogSegment(self.dir, start, cfg.index_interval_bytes,
                                            cfg.segment_index_bytes, active=True, now_ms=now))
        self._bases = [s.base_offset for s in self.segments]
        leo = self.log_end_offset
        if leo < self.log_start_offset:
            # The log start checkpoint is ahead of everything on disk (e.g. delete_records
            # then a crash): nothing here is readable, start over at the log start.
            for s in self.segments:
                s.mark_deleted()
                s.remove()
            self.segments = [LogSegment(self.dir, self.log_start_offset, cfg.index_interval_bytes,
                                        cfg.segment_index_bytes, active=True, now_ms=now)]
            self._bases = [self.log_start_offset]
            recovered = []
        self.log_start_offset = max(self.log_start_offset, self.segments[0].base_offset)
        self.active_segment.make_active()
        leo = self.log_end_offset
        # Leader epochs from the recovered batches, then clamp to the surviving range.
        before = list(self.epoch_cache.entries)
        for b in recovered:
            self.epoch_cache.assign(b.partition_leader_epoch, b.base_offset, flush=False)
        self.epoch_cache.truncate_from_end(leo, flush=False)
        self.epoch_cache.truncate_from_start(self.log_start_offset, flush=False)
        epochs_durable = self.epoch_cache.entries == before or self._write_epochs()
        if self.recovered_segments and epochs_durable:
            # The scanned bytes are now the truth; make them durable before the recovery
            # point moves past them (KAFKA-10101). Not while the epochs derived from them
            # are only in memory (full disk): the next restart must scan them again.
            for s in self.segments:
                s.flush()
            self.recovery_point = leo
        self.recovery_point = min(self.recovery_point, leo)
        self.txn_index.load()
        self._rebuild_producer_state(clean and not self.recovered_segments)
        if self.hw_follows_leo:
            self._high_watermark = leo
        self._high_watermark = min(max(self._high_watermark, self.log_start_offset), leo)

    def _remove_leftovers(self) -> None:
        # Half-finished deletes and temp files from a previous run; orphan indexes.
        names = os.listdir(self.dir)
        logs = {n[:20] for n in names if n.endswith(".log")}
        for n in names:
            orphan = n.endswith((".index", ".timeindex")) and n[:20] not in logs
            if n.endswith((".deleted", ".tmp", ".cleaned", ".swap")) or orphan:
                os.unlink(os.path.join(self.dir, n))

    def _rebuild_producer_state(self, clean: bool) -> None:
        ps = self.producer_state
        leo = self.log_end_offset
        ps.delete_snapshots(above=leo)
        if clean and ps.load_snapshot(leo):
            self.txn_index.retain(self._bases)
            return
        # Newest usable snapshot at or below the log end, then replay headers after it; the aborted
        # transactions whose markers are replayed are rebuilt with it.
        start = self.log_start_offset
        ps.clear()
        for off in reversed(ps.snapshot_offsets()):
            if off >= self.log_start_offset and ps.load_snapshot(off):
                start = off
                break
        self.txn_index.truncate_from(start, self._bases)
        self.txn_index.retain(self._bases)
        i = max(bisect.bisect_right(self._bases, start) - 1, 0)
        for seg in self.segments[i:]:
            pos = 0
            if seg.base_offset < start:
                r = seg.translate_offset(start)
                if r is None:
                    continue
                pos = r[0]
            for h in seg.headers(pos):
                if h.base_offset >= start:
                    if h.attributes & _txn.ATTR_CONTROL:
                        head = os.pread(seg.read_fd, min(h.size, 256), h.position)
                        self._replay_marker(h, head, seg.base_offset, h.max_timestamp)
                    else:
                        ps.replay(h)

    def _replay_marker(self, info, batch, segment_base: int, timestamp: int, write: bool = True) -> None:
        """Producer state and the aborted-transaction index after the control batch ``info``
        (``batch``: its bytes from the start) is in the log: a COMMIT/ABORT ends the producer's
        transaction, an ABORT is indexed."""
        if info.producer_id < 0:
            return
        kind, coordinator_epoch = _txn.control_type(batch)
        if kind not in (_txn.ABORT, _txn.COMMIT):
            return
        self._completed(self.producer_state.complete_txn(
            info.producer_id, info.producer_epoch, coordinator_epoch, info.base_offset, kind == _txn.COMMIT,
            timestamp), segment_base, write)

    def _completed(self, done, segment_base: int, write: bool = True) -> None:
        if done.aborted:
            # The LSO once this transaction is complete (Kafka's ProducerStateManager.lastStableOffset).
            first = self.producer_state.first_unstable_offset()
            lso = first if first is not None else done.last_offset + 1
            self.txn_index.append(_txn.AbortedTxn(done.producer_id, done.first_offset, done.last_offset, lso),
                                  segment_base, write)

    # -- transactions -----------------------------------------------------------------------

    @property
    def last_stable_offset(self) -> int:
        """min(high watermark, first offset of the earliest ongoing transaction): what a
        read_committed consumer may read up to."""
        first = self.producer_state.first_unstable_offset()
        hw = self._high_watermark
        return hw if first is None or first > hw else first

    def aborted_transactions(self, start: int, end: int) -> list:
        """The aborted transactions that may hold data in [start, end) of the segment holding ``start``
        (a read_committed fetch from ``start``, ``end`` its LSO: a read serves one segment)."""
        if not self.txn_index.entries:
            return []
        bases = self._bases
        i = bisect.bisect_right(bases, start)
        if i < len(bases) and bases[i] < end:
            end = bases[i]
        return self.txn_index.overlapping(start, end)

    def append_control(self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
                       leader_epoch: int, now: int | None = None) -> AppendResult:
        """Append a COMMIT or ABORT marker as leader (WriteTxnMarkers): checks the producer's epoch
        and the coordinator epoch (LogAppendError 47 / 52), writes the control batch, ends the
        producer's transaction and indexes an abort. -> the marker's offsets."""
        self._settle_writes()
        if self.offline:
            raise LogAppendError(KAFKA_STORAGE_ERROR, f"log {self.name} is offline")
        self.producer_state.check_marker(producer_id, producer_epoch, coordinator_epoch)
        now = now_ms() if now is None else now
        base = self.log_end_offset
        buf = _txn.control_batch(producer_id, producer_epoch, commit, coordinator_epoch, base, leader_epoch, now)
        self._append(buf, len(buf), base, base, now, now)
        if leader_epoch > self.epoch_cache.latest_epoch:
            self.epoch_cache.assign(leader_epoch, base)
        self._completed(self.producer_state.complete_txn(producer_id, producer_epoch, coordinator_epoch, base,
                                                          commit, now),
                        self.segments[-1].base_offset)
        self.unflushed_messages += 1
        if self.unflushed_messages >= self.config.flush_messages:
            self.flush(now)
        return AppendResult(base, base, now if self.config.log_append_time else -1, self.log_start_offset)

    # -- append -----------------------------------------------------------------------------

    def append_as_leader(self, buf, leader_epoch: int, now: int, prevalidated: bool = False) -> AppendResult:
        """Validate, stamp and append one producer batch (a writable buffer holding exactly
        one RecordBatch v2). ``prevalidated``: validate_batch already passed on these bytes
        (with this log's max.message.bytes and cleanup.policy), so the decompressing record
        walk is skipped; header checks, CRC and stamping still run. Returns the assigned
        offsets, or the original offsets of an idempotent duplicate; raises LogAppendError."""
        # The one-record Produce path: check + roll decision + stamp + write + the segment's state
        # + the unflushed count are one native call (LeaderAppender.append, limits read once per
        # LogConfig); policy stays here: roll, producer state, errors, flush.
        if self._write_job is not None:
            self._settle()
        if self.offline:
            raise LogAppendError(KAFKA_STORAGE_ERROR, f"log {self.name} is offline")
        seg = self.segments[-1]
        base = seg.next_offset
        try:
            last = self._appender.append(seg._st, buf, leader_epoch, self.config, prevalidated, now)
        except _batch.BatchError as e:
            raise LogAppendError(e.error_code, str(e)) from None
        except OSError as e:
            self._write_failed(seg, e)
        if last < 0:
            return self._append_leader_other(last, seg, base, buf, leader_epoch, now, prevalidated)
        self.dirty = True
        if self.hw_follows_leo:
            self._high_watermark = last + 1
        epochs = self.epoch_cache.entries      # latest_epoch without its property call (per request)
        if leader_epoch > (epochs[-1][0] if epochs else UNDEFINED_EPOCH):
            self.epoch_cache.assign(leader_epoch, base)
        # tuple.__new__: the NamedTuple's Python-level __new__ costs twice as much (per request)
        return tuple.__new__(AppendResult, (base, last, now if self.config.log_append_time else -1,
                                            self.log_start_offset))

    def _append_leader_other(self, code, seg, base, buf, leader_epoch, now, prevalidated) -> AppendResult:
        """append_as_leader when LeaderAppender.append did not finish the batch: a flush is due, the
        segment must roll first, or the batch is idempotent (stamped, not yet written)."""
        cfg = self.config
        append_time = now if cfg.log_append_time else -1
        if code == _native.APPENDED_FLUSH_DUE:
            last = self._appender.last
            counted = True
        else:
            info = (self._appender.info if code == _native.APPEND_IDEMPOTENT else
                    self._roll_and_append_leader(buf, leader_epoch, append_time, cfg.compact, prevalidated, now))
            seg = self.segments[-1]
            base = info.base_offset
            last = base + info.last_offset_delta
            counted = False
            if info.position < 0:
                # Idempotent: stamped, not yet written; a retried batch is answered from producer state.
                pid = info.producer_id
                dup = self._duplicate(info)
                if dup is not None:
                    return dup
                try:
                    # Roll check + write + the segment's state, natively (as append_leader's second half).
                    written = seg._st.append_stamped(buf, cfg.segment_bytes, cfg.segment_ms, now)
                except OSError as e:
                    self._write_failed(seg, e)
                if written < 0:
                    self._roll_and_append_stamped(buf, now)
                self.producer_state.update(pid, info.producer_epoch, info.base_sequence,
                                           info.last_offset_delta, base, info.max_timestamp,
                                           bool(info.attributes & _txn.ATTR_TRANSACTIONAL))
        self.dirty = True
        if self.hw_follows_leo:
            self._high_watermark = last + 1
        if leader_epoch > self.epoch_cache.latest_epoch:
            self.epoch_cache.assign(leader_epoch, base)
        if not counted:
            self.unflushed_messages += info.record_count
        if self.unflushed_messages >= cfg.flush_messages:
            self.flush(now)
        return AppendResult(base, last, append_time, self.log_start_offset)

    def _duplicate(self, info) -> AppendResult | None:
        """An idempotent batch (stamped ``info``) that producer state has already appended: the
        original append's result (Kafka answers a retried batch with its first offsets); else None."""
        dup = self.producer_state.check(info.producer_id, info.producer_epoch, info.base_sequence,
                                        info.last_offset_delta)
        if dup is None:
            return None
        return AppendResult(dup.first_offset, dup.last_offset,
                            dup.timestamp if self.config.log_append_time else -1, self.log_start_offset)

    @property
    def unflushed_messages(self) -> int:
        """Messages appended since the last flush (kept in the native LeaderAppender)."""
        return self._appender.unflushed

    @unflushed_messages.setter
    def unflushed_messages(self, value: int) -> None:
        self._appender.unflushed = value

    def _roll_and_append_leader(self, buf, leader_epoch, append_time, compact, prevalidated, now):
        """append_as_leader's second try, on a new segment, when the active one had to roll first."""
        cfg = self.config
        seg = self.roll(now)
        try:
            return seg._st.append_leader(buf, leader_epoch, cfg.max_message_bytes, append_time, compact,
                                         prevalidated, cfg.segment_bytes, cfg.segment_ms, now)
        except _batch.BatchError as e:
            raise LogAppendError(e.error_code, str(e)) from None
        except OSError as e:
            self._write_failed(seg, e)

    def _roll_and_append_stamped(self, buf, now):
        """append_as_leader's write of an idempotent batch when the active segment had to roll first."""
        cfg = self.config
        seg = self.roll(now)
        try:
            seg._st.append_stamped(buf, cfg.segment_bytes, cfg.segment_ms, now)     # an empty segment: no roll
        except OSError as e:
            self._write_failed(seg, e)

    def _settle_writes(self) -> None:
        """Before anything but a plain leader append changes this log or its files: finish the large
        write in flight (``_settle``) and write the leader appends deferred in the current write-behind
        run (LeaderAppender); LogAppendError (KAFKA_STORAGE_ERROR) when that failed (the log was cut
        back to the first of them). Nothing to do outside a run with no write in flight."""
        if self._write_job is not None:
            self._settle()
        if self._appender.pending:
            try:
                self._appender.write_deferred()
            except OSError as e:
                raise LogAppendError(KAFKA_STORAGE_ERROR, f"write to {self.name} failed: {e.strerror}") from None

    def _deferred_write_failed(self, seg, position: int, base: int, e: OSError, rows: int = 0) -> str:
        """LeaderAppender could not write the batches it deferred from file ``position`` (offset
        ``base``) of ``seg`` on: they were committed but are not (all) in the file. Cut the log back
        to before them, as a failed synchronous write leaves it (the first of them is the new log
        end); when the file cannot be cut the log goes offline. ``rows``: how many of them belong to
        requests other than the one being handled (whose own append raises). -> the error message
        their answers carry: the request layer answers them KAFKA_STORAGE_ERROR (ext/request.pyx
        dispatch_frames), and ``on_cut`` fails the acks=all waits on them."""
        err = LogAppendError(KAFKA_STORAGE_ERROR, f"write to {seg.log_path} failed: {e.strerror}")
        try:
            seg.cut(position, base)
        except OSError:
            self.offline = True
        if seg.size != os.fstat(seg.read_fd).st_size or seg.next_offset != base:
            self.offline = True       # the unwritten bytes could not be removed
        self._after_truncation()
        if self.on_cut is None:
            _log.error("%s: write of appended batches from offset %d failed (%s); cut back to it",
                       self.name, base, e.strerror)
        else:
            try:
                self.on_cut(self, base, err, rows)
            except Exception:     # noqa: BLE001 - the cut is done; the answers are still corrected
                _log.exception("%s: handling the cut back to offset %d failed", self.name, base)
        return err.message

    def _write_failed(self, seg, e: OSError):
        """A leader append's write failed: cut the partial bytes away (or, when that fails too,
        take the log offline) and raise LogAppendError (KAFKA_STORAGE_ERROR)."""
        try:
            seg.write_failed(e)
        finally:
            if seg.size != os.fstat(seg.read_fd).st_size:
                self.offline = True       # the partial write could not be removed

    def _stamp(self, buf, leader_epoch, now, prevalidated):
        """Native validate + stamp at the log end; an idempotent duplicate -> its AppendResult."""
        if self.offline:
            raise LogAppendError(KAFKA_STORAGE_ERROR, f"log {self.name} is offline")
        cfg = self.config
        append_time = now if cfg.log_append_time else -1
        base = self.log_end_offset
        try:
            info = _batch.validate_and_stamp(buf, base, leader_epoch, cfg.max_message_bytes, append_time,
                                             cfg.compact, prevalidated=prevalidated)
        except _batch.BatchError as e:
            raise LogAppendError(e.error_code, str(e)) from None
        if info.producer_id >= 0:
            dup = self._duplicate(info)
            if dup is not None:
                return dup
        return info, base, base + info.last_offset_delta, append_time

    def _appended(self, info, base, last, leader_epoch, append_time, now) -> AppendResult:
        """In-memory state after the batch's bytes are in the segment."""
        pid = info.producer_id
        if pid >= 0:
            self.producer_state.update(pid, info.producer_epoch, info.base_sequence,
                                       info.last_offset_delta, base, info.max_timestamp,
                                       bool(info.attributes & _txn.ATTR_TRANSACTIONAL))
        if leader_epoch > self.epoch_cache.latest_epoch:
            self.epoch_cache.assign(leader_epoch, base)
        self.unflushed_messages += info.record_count
        if self.unflushed_messages >= self.config.flush_messages:
            self.flush(now)
        return AppendResult(base, last, append_time, self.log_start_offset)

    # -- appends whose bytes are written on the log dir's writer thread ---------------------
    #
    # begin_append_as_leader stamps the batch on the loop (offsets from the LEO, roll if due) and
    # returns a WriteJob; WriteJob.run() writes the bytes on another thread (GIL released); then
    # finish_append(job) on the loop moves size, indexes, LEO, HW and producer state. Until then
    # readers see the log as it was before the batch (fetch never sees bytes not yet written).
    # The caller keeps other appends to this log behind the job (write_future); anything else that
    # changes the log's files or offsets first settles the job (_settle: waits for the write,
    # which is bounded by one batch, and finishes it).

    def begin_append_as_leader(self, buf, leader_epoch: int, now: int, prevalidated: bool = False):
        """-> WriteJob to run on a writer thread, or the AppendResult of an idempotent duplicate."""
        self._settle_writes()
        r = self._stamp(buf, leader_epoch, now, prevalidated)
        if type(r) is AppendResult:
            return r
        info, base, last, append_time = r
        cfg = self.config
        seg = self.active_segment
        if seg.should_roll(info.size, last, info.max_timestamp, now, cfg.segment_bytes, cfg.segment_ms):
            seg = self.roll(now)
        job = WriteJob(self, seg, buf, info, base, last, leader_epoch, append_time, now)
        self._write_job = job
        return job

    def finish_append(self, job: "WriteJob") -> AppendResult:
        """After job.run() returned (or from _settle): the append's outcome; raises LogAppendError."""
        if job.outcome is None:
            self._complete_job(job)
        if isinstance(job.outcome, LogAppendError):
            raise job.outcome
        return job.outcome

    def _complete_job(self, job) -> None:
        if self._write_job is job:
            self._write_job = None
        seg = job.segment
        if job.error is not None:
            e = job.error
            seg._truncate_file(job.position)
            if seg.size != os.fstat(seg.read_fd).st_size:
                self.offline = True       # the partial write could not be removed
            job.outcome = LogAppendError(KAFKA_STORAGE_ERROR, f"write to {seg.log_path} failed: {e.strerror}")
            return
        info = job.info
        seg.committed_write(job.position, job.written, job.last, info.max_timestamp)
        self.dirty = True
        if self.hw_follows_leo:
            self._high_watermark = job.last + 1
        try:
            job.outcome = self._appended(info, job.base, job.last, job.leader_epoch, job.append_time, job.now)
        except LogAppendError as e:
            job.outcome = e

    def _settle(self) -> None:
        """Wait for the write in flight (if any) and finish it, before changing the log otherwise."""
        job = self._write_job
        if job is not None:
            job.done.wait()
            self._complete_job(job)

    def append_as_follower(self, buf, now: int | None = None):
        """Append batches exactly as the leader stamped them (a fetch response's records).

        Every complete batch is CRC-checked; offsets must only grow: each batch starts at or past
        the log end offset (a compacted leader serves batches with offset gaps, as in Kafka) and
        never overlaps what is already here (a trailing partial batch is ignored, as the leader
        may cut one at the fetch size). The leader epoch cache follows the batches'
        partitionLeaderEpoch and producer state is rebuilt from their headers, so a producer
        retrying on this replica once it leads gets its original offsets. Returns
        (first offset, last offset) or None when ``buf`` holds no complete batch; raises
        LogAppendError (CORRUPT_MESSAGE for bad bytes, INVALID_RECORD for offsets that go
        backwards)."""
        self._settle_writes()
        if self.offline:
            raise LogAppendError(KAFKA_STORAGE_ERROR, f"log {self.name} is offline")
        try:
            infos = _batch.iter_batches(buf, 0, True)
        except _batch.BatchError as e:
            raise LogAppendError(e.error_code, f"{self.name}: {e}") from None
        if not infos:
            return None
        expected = self.log_end_offset
        for info in infos:
            if info.base_offset < expected or info.last_offset_delta < 0:
                raise LogAppendError(INVALID_RECORD,
                                     f"{self.name}: batch at offset {info.base_offset} overlaps the "
                                     f"log (log end {expected})")
            expected = info.last_offset + 1
        now = now_ms() if now is None else now
        end = infos[-1].position + infos[-1].size
        view = memoryview(buf)[:end] if end != len(buf) else buf
        cfg = self.config
        seg = self.active_segment
        first = infos[0]
        last = infos[-1].last_offset
        if seg.should_roll(end, last, infos[-1].max_timestamp, now, cfg.segment_bytes, cfg.segment_ms):
            seg = self.roll(now)
        if seg.size + end > cfg.segment_bytes and len(infos) > 1:
            # Too much for one segment: batch by batch, each may roll.
            for info in infos:
                self._append(memoryview(view)[info.position:info.position + info.size], info.size,
                             info.base_offset, info.last_offset, info.max_timestamp, now)
        else:
            try:
                seg.append_batches(view, infos)
            except LogAppendError:
                if seg.size != os.fstat(seg.read_fd).st_size:
                    self.offline = True
                raise
            self.dirty = True
            if self.hw_follows_leo:
                self._high_watermark = last + 1
        ps = self.producer_state
        cache = self.epoch_cache
        records = 0
        for info in infos:
            epoch = info.partition_leader_epoch
            if epoch > cache.latest_epoch:
                cache.assign(epoch, info.base_offset)
            if info.producer_id >= 0:
                if info.attributes & _txn.ATTR_CONTROL:
                    # the marker's bytes (in this segment or a later one if it rolled)
                    self._replay_marker(info, view[info.position:info.position + info.size],
                                        self._bases[bisect.bisect_right(self._bases, info.base_offset) - 1],
                                        info.max_timestamp)
                else:
                    ps.update(info.producer_id, info.producer_epoch, info.base_sequence,
                              info.last_offset_delta, info.base_offset, info.max_timestamp,
                              bool(info.attributes & _txn.ATTR_TRANSACTIONAL))
            records += info.record_count
        self.unflushed_messages += records
        if self.unflushed_messages >= cfg.flush_messages:
            self.flush(now)
        return first.base_offset, last

    def _append(self, buf, size, base, last, max_timestamp, now):
        cfg = self.config
        seg = self.active_segment
        if seg.should_roll(size, last, max_timestamp, now, cfg.segment_bytes, cfg.segment_ms):
            seg = self.roll(now)
        try:
            seg.append(buf, base, last, max_timestamp)
        except LogAppendError:
            if seg.size != os.fstat(seg.read_fd).st_size:
                self.offline = True       # the partial write could not be removed
            raise
        self.dirty = True
        if self.hw_follows_leo:
            self._high_watermark = last + 1

    def roll(self, now: int | None = None) -> LogSegment:
        """Close the active segment and start a new one at the log end offset."""
        self._settle_writes()
        now = now_ms() if now is None else now
        old = self.active_segment
        leo = old.next_offset
        if old.size == 0:
            return old
        cfg = self.config
        # Create the new segment before retiring the old one: if the disk is full the old
        # segment stays active and the append fails cleanly.
        try:
            seg = LogSegment(self.dir, leo, cfg.index_interval_bytes, cfg.segment_index_bytes,
                             active=True, now_ms=now)
        except OSError as e:
            for suffix in (".log", ".index", ".timeindex"):
                try:
                    os.unlink(os.path.join(self.dir, f"{leo:020d}{suffix}"))
                except FileNotFoundError:
                    pass
            raise LogAppendError(KAFKA_STORAGE_ERROR,
                                 f"cannot roll {self.name} at offset {leo}: {e.strerror}") from e
        old.on_become_inactive()
        self.segments.append(seg)
        self._bases.append(leo)
        # Kafka snapshots producer state at every roll so a restart replays one segment at most;
        # a few older ones stay for restarts that truncate back past the newest. A snapshot is
        # an optimisation: failing to write one only makes the next restart replay more.
        try:
            self.producer_state.write_snapshot(leo)
        except OSError:
            pass
        offsets = self.producer_state.snapshot_offsets()
        if len(offsets) > SNAPSHOTS_KEPT:
            self.producer_state.delete_snapshots(below=offsets[-SNAPSHOTS_KEPT])
        return seg

    # -- partition.metadata (topic id) --------------------------------------------------------

    def read_topic_id(self) -> str | None:
        """The topic id (base64 text) in ``partition.metadata``, None if the file is absent."""
        try:
            with open(os.path.join(self.dir, PARTITION_METADATA), encoding="utf-8") as f:
                for line in f:
                    key, _, value = line.partition(":")
                    if key.strip() == "topic_id":
                        return value.strip()
        except FileNotFoundError:
            pass
        return None

    def write_topic_id(self, topic_id: str) -> None:
        """Kafka's ``partition.metadata`` (version 0), written atomically."""
        write_text(os.path.join(self.dir, PARTITION_METADATA), f"version: 0\ntopic_id: {topic_id}\n")

    # -- truncation (followers) -------------------------------------------------------------

    def truncate_to(self, offset: int, now: int | None = None) -> bool:
        """Remove every batch at or after ``offset`` (a batch holding it goes whole, so the new
        log end may be a little lower). Segments, indexes, the epoch cache, producer state,
        recovery point and high watermark all follow. Returns whether anything was removed."""
        self._settle_writes()
        if offset >= self.log_end_offset:
            return False
        now = now_ms() if now is None else now
        if offset <= self.log_start_offset or offset <= self.segments[0].base_offset:
            self.truncate_fully(offset, now)
            return True
        i = bisect.bisect_right(self._bases, offset) - 1
        if self.segments[i].base_offset == offset and i > 0:
            i -= 1          # nothing of that segment stays: truncate the one before it at its end
        gone = self.segments[i + 1:]
        del self.segments[i + 1:]
        del self._bases[i + 1:]
        for s in gone:
            s.mark_deleted()
            self._pending_delete.append((now + self.config.file_delete_delay_ms, s))
        seg = self.segments[-1]
        seg.make_active()
        seg.truncate_to(offset)
        self._after_truncation()
        return True

    def truncate_fully(self, offset: int, now: int | None = None) -> None:
        """Drop every segment and start the log empty at ``offset`` (the follower is so far
        behind or diverged that nothing of its log is usable)."""
        self._settle_writes()
        now = now_ms() if now is None else now
        for s in self.segments:
            s.mark_deleted()
            self._pending_delete.append((now + self.config.file_delete_delay_ms, s))
        cfg = self.config
        self.segments = [LogSegment(self.dir, offset, cfg.index_interval_bytes, cfg.segment_index_bytes,
                                    active=True, now_ms=now)]
        self._bases = [offset]
        self.log_start_offset = offset
        self.epoch_cache.clear()
        self.producer_state.clear()
        self.producer_state.delete_snapshots(above=-1)
        self.txn_index.clear()
        self.recovery_point = offset
        self._high_watermark = offset
        self.unflushed_messages = 0

    def _after_truncation(self) -> None:
        leo = self.log_end_offset
        self.epoch_cache.truncate_from_end(leo)
        self._rebuild_producer_state(False)
        self.recovery_point = min(self.recovery_point, leo)
        self._high_watermark = min(self._high_watermark, leo)

    # -- read -------------------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int, max_offset: int | None = None,
             min_one_batch: bool = True) -> FetchData:
        """Whole batches starting with the one holding ``offset``, from a single segment.

        Never returns a batch whose last offset >= ``max_offset`` (default: the high
        watermark); returns at most ``max_bytes`` unless ``min_one_batch`` lets the first batch
        through whole (KIP-74). Raises OffsetOutOfRange outside [log_start, log_end]."""
        # Attributes and compares, not the property and builtin min(): every small fetch comes here.
        leo = self.segments[-1].next_offset
        if offset < self.log_start_offset or offset > leo:
            raise OffsetOutOfRange(offset, self.log_start_offset, leo)
        if max_offset is None:
            max_offset = self._high_watermark
        if max_offset > leo:
            max_offset = leo
        regions = []
        size = 0
        if offset < max_offset:
            i = bisect.bisect_right(self._bases, offset) - 1
            while i < len(self.segments):
                seg = self.segments[i]
                start = seg.batch_position(offset)
                if start >= 0:
                    end = seg.end_position(start, max_bytes, max_offset, min_one_batch)
                    if end > start:
                        regions.append((seg.read_fd, start, end - start))
                        size = end - start
                    break
                i += 1
        return FetchData(regions, size, self._high_watermark, self.log_start_offset, leo)

    def offset_for_timestamp(self, timestamp: int):
        """(offset, timestamp) of the first record whose timestamp >= ``timestamp`` (Kafka's
        ListOffsets semantics) at or above the log start, or None. The time index finds the batch;
        that batch is read and its records decoded (decompressed under the max.message.bytes-derived
        cap), and the next ones while they only hold records below the log start."""
        from ..record import decode_records

        for seg in self.segments:
            if seg.max_timestamp >= 0 and seg.max_timestamp < timestamp:
                continue
            r = seg.find_timestamp(timestamp, self.log_start_offset)
            while r is not None:
                _base, _max_ts, position, size = r
                data = os.pread(seg.read_fd, size, position)
                cap = max(64 << 20, 16 * self.config.max_message_bytes)
                for offset, ts, *_rest in decode_records(data, max_decompressed=cap):
                    if ts >= timestamp and offset >= self.log_start_offset:
                        return offset, ts
                # every record of that batch is below the log start (DeleteRecords): the next one
                r = seg.find_timestamp(timestamp, position=position + size)
        return None

    def end_offset_for_epoch(self, epoch: int):
        """(epoch, end_offset) for OffsetsForLeaderEpoch."""
        return self.epoch_cache.end_offset_for_epoch(epoch, self.log_end_offset)

    # -- retention --------------------------------------------------------------------------

    def delete_old_segments(self, now: int | None = None) -> int:
        """Apply retention.ms and retention.bytes to closed segments (never the active one)
        and segments wholly below the log start offset. Returns the number deleted."""
        self._settle_writes()
        now = now_ms() if now is None else now
        cfg = self.config
        if "delete" not in cfg.cleanup_policy:
            return 0
        doomed = 0
        closed = self.segments[:-1]
        # Below the log start (delete_records moved it past whole segments).
        while doomed < len(closed) and closed[doomed].next_offset <= self.log_start_offset:
            doomed += 1
        if cfg.retention_ms >= 0:
            while doomed < len(closed) and now - closed[doomed].largest_timestamp > cfg.retention_ms:
                doomed += 1
        if cfg.retention_bytes >= 0:
            excess = self.size_bytes - sum(s.size for s in closed[:doomed]) - cfg.retention_bytes
            while doomed < len(closed) and excess - closed[doomed].size >= 0:
                excess -= closed[doomed].size
                doomed += 1
        if doomed:
            self._delete_segments(doomed, now)
        return doomed

    def _delete_segments(self, count: int, now: int) -> None:
        gone = self.segments[:count]
        del self.segments[:count]
        del self._bases[:count]
        self.log_start_offset = max(self.log_start_offset, self.segments[0].base_offset)
        self._high_watermark = max(self._high_watermark, self.log_start_offset)
        self.recovery_point = max(self.recovery_point, self.log_start_offset)
        for s in gone:
            s.mark_deleted()
            self._pending_delete.append((now + self.config.file_delete_delay_ms, s))
        self.epoch_cache.truncate_from_start(self.log_start_offset)
        self.producer_state.delete_snapshots(below=self.segments[0].base_offset)
        self.txn_index.retain(self._bases)

    def delete_records(self, offset: int, now: int | None = None) -> int:
        """Move the log start offset up to ``offset`` (DeleteRecords); whole segments below it
        are removed by the next retention pass. Returns the new log start offset."""
        if offset > self._high_watermark:
            raise OffsetOutOfRange(offset, self.log_start_offset, self._high_watermark)
        if offset > self.log_start_offset:
            self.log_start_offset = offset
            self.epoch_cache.truncate_from_start(offset)
        return self.log_start_offset

    def remove_deleted_files(self, now: int | None = None, force: bool = False) -> None:
        """Close and unlink segments whose file.delete.delay.ms has passed."""
        now = now_ms() if now is None else now
        keep = []
        for due, seg in self._pending_delete:
            if force or due <= now:
                seg.remove()
            else:
                keep.append((due, seg))
        self._pending_delete = keep

    # -- flush / close ----------------------------------------------------------------------

    def flush(self, now: int | None = None) -> None:
        """fsync every segment at or after the recovery point, then advance it to the LEO."""
        now = now_ms() if now is None else now
        leo = self.log_end_offset
        for s in self.segments:
            if s.next_offset > self.recovery_point or s.active:
                s.flush()
        # Epochs assigned since the last write must be on disk before the recovery point passes
        # their batches: recovery re-derives epochs only from the batches after it.
        if self._write_epochs():
            self.recovery_point = leo
        self.unflushed_messages = 0
        self.last_flush_ms = now
        self.dirty = False

    def _write_epochs(self) -> bool:
        """Write the leader-epoch checkpoint if it is behind; False (said once per failure
        streak) when the disk refuses: the cache stays dirty and the recovery point stays put."""
        try:
            self.epoch_cache.flush()
        except OSError as e:
            if not self._epoch_write_failing:
                _log.error("%s: cannot write the leader-epoch checkpoint (%s); the recovery point "
                           "stays at %d until it can be written", self.name, e, self.recovery_point)
            self._epoch_write_failing = True
            return False
        self._epoch_write_failing = False
        return True

    def maybe_flush(self, now: int) -> bool:
        """flush.ms policy, called by LogManager.flush_dirty."""
        if self.dirty and now - self.last_flush_ms >= self.config.flush_ms:
            self.flush(now)
            return True
        return False

    def close(self) -> None:
        """Clean shutdown: flush, snapshot producer state at the LEO, trim indexes, close fds."""
        self._settle_writes()
        self.flush()
        self.producer_state.write_snapshot(self.log_end_offset)
        self.remove_deleted_files(force=True)
        for s in self.segments:
            s.close()
        self.epoch_cache.close()

    def close_for_delete(self) -> None:
        """Close every descriptor without flushing (the partition is being deleted)."""
        self._settle_writes()
        self.epoch_cache.close()
        self.remove_deleted_files(force=True)
        for s in self.segments:
            s.close(trim=False)
