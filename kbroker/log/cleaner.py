"""Log compaction (cleanup.policy=compact and compact,delete), after Kafka's LogCleaner.

What survives a cleaning: per key, the record with the latest offset; records keep their
offsets (never renumbered) and their bytes. A tombstone (null value) stays for
delete.retention.ms after the first cleaning that saw it (KIP-534: that cleaning stamps the
batch's delete horizon into baseTimestamp and sets attribute bit 6), then the next cleaning
drops it. Keyless records are dropped (the leader refuses them on compacted topics). The last
batch of every producer id stays, emptied of records if need be, so idempotent producer state
survives restarts. Control batches are copied as they are. Compressed batches are decompressed
under the capped decompression and recompressed with their own codec.

Transactions (as Kafka): nothing at or past the last stable offset is cleaned. Batches of aborted
transactions (the aborted-transaction index says which) are not mapped and are dropped (a producer's last
batch stays, emptied). A COMMIT/ABORT marker whose transaction has no data left in the log is kept for
delete.retention.ms: the first cleaning that finds it so stamps its delete horizon (as a tombstone's), a
later one drops it. Markers of transactions with data left are copied as they are. Other control batches
are copied as they are.

One pass over a log (``clean_log``):
1. snapshot (on the log's owner thread): the closed segments, each with a dup'ed read
   descriptor, the high watermark, the first dirty offset (cleaner-offset-checkpoint), the
   offsets of each producer's last batch;
2. cleanable range: from the log start up to the first segment that is active, reaches past
   the high watermark or is younger than min.compaction.lag.ms; dirty = from the first dirty
   offset on. Cleaned when dirty/total >= min.cleanable.dirty.ratio, when the oldest dirty
   record is older than max.compaction.lag.ms, or when a tombstone horizon has passed;
3. dedupe map over the dirty batches (``kbroker._native.cleaner.OffsetMap``), bounded by
   log.cleaner.dedupe.buffer.size / log.cleaner.threads: when it fills, the pass ends at the
   batch that did not fit and the next pass goes on from there;
4. the segments below that end are grouped (a group fits in segment.bytes and a u32 offset
   range) and each group is rewritten into one segment named after its first base offset.

Crash safety (Kafka's steps): each group is written to ``<base>.log.cleaned`` (+ ``.index``,
``.timeindex``); once all groups of the pass are written they are fsynced together (one journal
commit, not one per file: fsync storms stall the broker's appends); then, per group, on the owner
thread, renamed to ``.swap`` (indexes first,
the log last: ``<base>.log.swap`` existing is the commit point), the old segments renamed to
``.deleted`` (their read descriptors stay open for file.delete.delay.ms, so in-flight reads and
sendfiles finish), and the ``.swap`` files renamed to their final names (the log last).
Recovery (``recover_swaps``, called by Log's loader): ``.cleaned`` files and ``.swap`` indexes
without a ``.log.swap`` are rolled back (deleted); a ``.log.swap`` is completed: the old
segments inside its offset range are deleted and the swap files renamed into place.

Threads: ``LogCleaner`` runs ``log.cleaner.threads`` threads. Reading, filtering and writing
run there (the byte work is native and releases the GIL); anything touching a Log's state
(snapshot, swap) runs on the log's owner thread through ``runner`` (the broker's event loop),
so Log needs no lock for its readers and appenders.
"""
import logging
import os
import threading
import time
import weakref

from kbroker._native import cleaner as _native
from kbroker._native.batch import LAYOUT
from kbroker._native import segment as _segment
from kbroker.record.compression import decompress, compress

from . import txn_index as _txn
from .checkpoint import fsync_dir
from .index import OffsetIndex, TimeIndex
from .segment import MAX_RELATIVE_OFFSET, file_name

log = logging.getLogger(__name__)

# The header layout comes from the native definition (ext/layout.pxd).
HEADER_SIZE = LAYOUT["HEADER_SIZE"]
ATTR_CODEC_MASK = LAYOUT["ATTR_CODEC_MASK"]
ATTR_LOG_APPEND_TIME = LAYOUT["ATTR_LOG_APPEND_TIME"]
ATTR_CONTROL = LAYOUT["ATTR_CONTROL"]
ATTR_DELETE_HORIZON = LAYOUT["ATTR_DELETE_HORIZON"]
ATTR_TRANSACTIONAL = LAYOUT["ATTR_TRANSACTIONAL"]
SLOT_BYTES = 24            # one OffsetMap slot: 16-byte hash + 8-byte offset

# Broker keys (server.properties names) and Kafka's defaults.
CLEANER_DEFAULTS = {
    "log.cleaner.enable": True,
    "log.cleaner.threads": 1,
    "log.cleaner.dedupe.buffer.size": 128 * 1024 * 1024,
    "log.cleaner.io.buffer.size": 512 * 1024,
    "log.cleaner.io.buffer.load.factor": 0.9,
    "log.cleaner.backoff.ms": 15000,
    "log.cleaner.io.max.bytes.per.second": float("inf"),
}

# Tests set this to a callable(step) to kill the process at a cleaning step
# ("cleaned", "swap", "mid_rename", "renamed_indexes").
crash_hook = None


def _step(name: str) -> None:
    if crash_hook is not None:
        crash_hook(name)


class CleanerStopped(Exception):
    """The cleaner is shutting down; the pass in progress is abandoned (and rolled back)."""


class CleanerConfig:
    def __init__(self, values: dict | None = None):
        v = dict(CLEANER_DEFAULTS)
        v.update({k: x for k, x in (values or {}).items() if k in CLEANER_DEFAULTS})
        enable = v["log.cleaner.enable"]
        self.enable = enable if isinstance(enable, bool) else str(enable).lower() == "true"
        self.threads = int(v["log.cleaner.threads"])
        self.dedupe_buffer_size = int(v["log.cleaner.dedupe.buffer.size"])
        self.io_buffer_size = int(v["log.cleaner.io.buffer.size"])
        self.load_factor = float(v["log.cleaner.io.buffer.load.factor"])
        self.backoff_ms = int(v["log.cleaner.backoff.ms"])
        self.max_io_bytes_per_second = float(v["log.cleaner.io.max.bytes.per.second"])
        if self.threads < 0:
            raise ValueError("log.cleaner.threads must be >= 0")
        if not 0 < self.load_factor <= 1:
            raise ValueError("log.cleaner.io.buffer.load.factor must be in (0, 1]")
        per_thread = self.dedupe_buffer_size // max(self.threads, 1)
        if per_thread < SLOT_BYTES * 2:
            raise ValueError("log.cleaner.dedupe.buffer.size is too small "
                             f"({self.dedupe_buffer_size} bytes for {self.threads} threads)")
        self.max_slots = per_thread // SLOT_BYTES


def is_compacted(lg) -> bool:
    return "compact" in lg.config.cleanup_policy


# ------------------------------------------------------------------------------------------
# Recovery (called by Log._load before segments are opened)

def recover_swaps(dir_path: str) -> None:
    """Roll back or complete an interrupted swap in a partition directory (see module doc)."""
    names = os.listdir(dir_path)
    for n in names:
        if n.endswith(".cleaned"):
            os.unlink(os.path.join(dir_path, n))
    swaps = sorted(n for n in names if n.endswith(".log.swap") and n[:20].isdigit())
    for n in names:
        if n.endswith((".index.swap", ".timeindex.swap")) and f"{n[:20]}.log.swap" not in swaps:
            os.unlink(os.path.join(dir_path, n))      # the commit point was not reached
    for n in swaps:
        base = int(n[:20])
        path = os.path.join(dir_path, n)
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            _end, batches, _reason = _segment.scan_batches(fd, 0, size, base, base, False)
        finally:
            os.close(fd)
        end = batches[-1].last_offset + 1 if batches else base + 1
        # The old segments inside the swap's range are what it replaces.
        for other in os.listdir(dir_path):
            if other.endswith(".log") and len(other) == 24 and other[:20].isdigit():
                ob = int(other[:20])
                if base <= ob < end:
                    for suffix in (".log", ".index", ".timeindex"):
                        try:
                            os.unlink(os.path.join(dir_path, file_name(ob, suffix)))
                        except FileNotFoundError:
                            pass
        for suffix in (".index", ".timeindex"):
            p = os.path.join(dir_path, file_name(base, suffix))
            if os.path.exists(p + ".swap"):
                os.replace(p + ".swap", p)
        os.replace(path, os.path.join(dir_path, file_name(base, ".log")))
    if swaps:
        fsync_dir(dir_path)


# ------------------------------------------------------------------------------------------
# Owner-thread steps

class _SegInfo:
    __slots__ = ("seg", "base", "next_offset", "size", "fd", "largest_ts", "first_ts")

    def __init__(self, seg):
        self.seg = seg
        self.base = seg.base_offset
        self.next_offset = seg.next_offset
        self.size = seg.size
        self.fd = os.dup(seg.read_fd)
        self.largest_ts = seg.largest_timestamp
        self.first_ts = seg.first_batch_ms if seg.first_batch_ms is not None else -1


class _Snapshot:
    def __init__(self, lg, now: int):
        cfg = lg.config
        self.config = cfg
        self.now = now
        self.segments = []
        closed = lg.segments[:-1]
        self.log_start = lg.log_start_offset
        self.high_watermark = lg.high_watermark
        self.last_stable = lg.last_stable_offset
        # producer id -> whether its transaction being read kept data (the pass reads from the log start)
        self.txn_data = {}
        min_lag = cfg.values.get("min.compaction.lag.ms", 0)
        # producer id -> [(first, last)] of its aborted transactions, in order
        self.aborted = {}
        for e in lg.txn_index.entries:
            self.aborted.setdefault(e.producer_id, []).append((e.first_offset, e.last_offset))
        try:
            for seg in closed:
                # Kafka's firstUncleanableOffset: nothing at or past the last stable offset (<= the
                # high watermark), nothing younger than min.compaction.lag.ms, never the active segment.
                if seg.next_offset > self.last_stable:
                    break
                if _too_young(seg, now, min_lag):
                    break
                self.segments.append(_SegInfo(seg))
        except BaseException:
            self.close()
            raise
        self.end = (self.segments[-1].next_offset if self.segments else lg.log_start_offset)
        if self.segments and len(self.segments) < len(lg.segments):
            self.end = lg.segments[len(self.segments)].base_offset
        first_dirty = getattr(lg, "cleaner_checkpoint", 0)
        if first_dirty < self.log_start or first_dirty > lg.log_end_offset:
            first_dirty = self.log_start       # Kafka resets an out-of-range checkpoint
        self.first_dirty = first_dirty
        self.producer_last = {pid: e.batches[-1].last_offset
                              for pid, e in lg.producer_state.producers.items() if e.batches}

    def close(self):
        for s in self.segments:
            if s.fd >= 0:
                os.close(s.fd)
                s.fd = -1

    def in_aborted(self, h) -> bool:
        """Whether data batch ``h`` belongs to an aborted transaction."""
        if not h.attributes & ATTR_TRANSACTIONAL:
            return False
        for first, last in self.aborted.get(h.producer_id, ()):
            if first <= h.base_offset < last:
                return True
        return False


def _too_young(seg, now: int, min_lag: int) -> bool:
    # An empty segment (cleaned away) has no record time; its mtime must not hold cleaning up.
    return min_lag > 0 and seg.size > 0 and now - seg.largest_timestamp < min_lag


def swap_in(lg, old_segments: list, base: int, now: int) -> bool:
    """Owner thread: replace ``old_segments`` (contiguous, closed) with the cleaned segment
    written at ``<base>.log.cleaned``. False (nothing changed) if they are no longer in the
    log (retention, truncation or deletion got there first)."""
    segs = lg.segments
    try:
        i = next(k for k, s in enumerate(segs) if s is old_segments[0])
    except StopIteration:
        return False
    if (segs[i:i + len(old_segments)] != old_segments or i + len(old_segments) >= len(segs)
            or any(s.deleted or s.active for s in old_segments)):
        return False
    d = lg.dir
    paths = {sfx: os.path.join(d, file_name(base, sfx)) for sfx in (".log", ".index", ".timeindex")}
    for sfx in (".index", ".timeindex", ".log"):
        os.replace(paths[sfx] + ".cleaned", paths[sfx] + ".swap")
    _step("swap")
    try:
        _finish_swap(lg, old_segments, i, base, paths, now)
    except BaseException:
        # Past the commit point the files on disk are right (a restart completes the swap) but
        # this Log's segment list is not: stop serving it, as Kafka takes a failing dir offline.
        lg.offline = True
        raise
    return True


def _finish_swap(lg, old_segments, i, base, paths, now):
    from .segment import LogSegment

    d = lg.dir
    for s in old_segments:
        s.mark_deleted()
        lg._pending_delete.append((now + lg.config.file_delete_delay_ms, s))
    _step("mid_rename")
    for sfx in (".index", ".timeindex"):
        os.replace(paths[sfx] + ".swap", paths[sfx])
    _step("renamed_indexes")
    os.replace(paths[".log"] + ".swap", paths[".log"])
    cfg = lg.config
    new = LogSegment(d, base, cfg.index_interval_bytes, cfg.segment_index_bytes, active=False, now_ms=now)
    if not new.load():
        new.recover(base)
    lg.segments[i:i + len(old_segments)] = [new]
    lg._bases[i:i + len(old_segments)] = [base]
    lg.txn_index.retain(lg._bases)      # the merged segments' aborted transactions go to its file
    # Close what earlier swaps left whose delay has passed: a busy cleaner would otherwise pile
    # up open descriptors until the next retention check.
    lg.remove_deleted_files(now)


# ------------------------------------------------------------------------------------------
# The cleaner

class CleanResult:
    def __init__(self):
        self.bytes_read = 0
        self.bytes_written = 0
        self.records_read = 0
        self.records_kept = 0
        self.segments_in = 0
        self.segments_out = 0
        self.end_offset = -1
        self.min_horizon = None       # earliest delete horizon left in the cleaned segments

    def __repr__(self):
        return (f"CleanResult(read={self.bytes_read}B/{self.records_read} records, "
                f"written={self.bytes_written}B/{self.records_kept} records, "
                f"segments {self.segments_in}->{self.segments_out}, end={self.end_offset})")


def _direct(fn):
    return fn()


class LogCleaner:
    """Compacts the logs ``logs()`` returns. ``runner(fn)`` runs fn on the logs' owner thread
    and returns its result (default: call it here, for single-threaded use and tests)."""

    def __init__(self, config: CleanerConfig | dict | None = None, logs=None, runner=None):
        self.config = config if isinstance(config, CleanerConfig) else CleanerConfig(config)
        self._logs = logs or (lambda: [])
        self.runner = runner or _direct
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._threads: list = []
        self._busy: set = set()              # id(log) being cleaned
        self._lock = threading.Lock()
        self.stats = {"passes": 0, "bytes_read": 0, "bytes_written": 0, "errors": 0}
        self._horizons: dict = {}            # id(log) -> earliest delete horizon left
        # Logs whose cleaning failed (e.g. a corrupt batch): skipped from then on, as Kafka
        # marks such partitions uncleanable, instead of failing every backoff.
        self.uncleanable = weakref.WeakSet()
        self._local = threading.local()      # per thread: [pass start, bytes read + written]

    def run_on_loop(self, loop) -> None:
        """Route owner-thread steps through ``loop`` (the broker's event loop). A step still
        queued when the cleaner stops is cancelled, so stop() called on the loop never waits
        for the loop."""

        def runner(fn):
            box = {}
            lock = threading.Lock()
            done = threading.Event()

            def call():
                with lock:
                    if box.get("cancelled"):
                        return
                    box["running"] = True
                try:
                    box["result"] = fn()
                except BaseException as e:       # handed to the cleaner thread
                    box["error"] = e
                finally:
                    done.set()

            loop.call_soon_threadsafe(call)
            while not done.wait(0.05):
                if self._stop.is_set():
                    with lock:
                        if not box.get("running"):
                            box["cancelled"] = True
                            raise CleanerStopped()
            if "error" in box:
                raise box["error"]
            return box["result"]

        self.runner = runner

    # -- threads ----------------------------------------------------------------------------

    def start(self) -> None:
        if not self.config.enable or self._threads:
            return
        self._stop.clear()
        for i in range(self.config.threads):
            t = threading.Thread(target=self._run, name=f"kafka-log-cleaner-thread-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        for t in self._threads:
            t.join()
        self._threads = []

    def wakeup(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        try:
            # Below the event loop in the CPU scheduler (Linux: per-thread nice value).
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        except (AttributeError, OSError):
            pass
        while not self._stop.is_set():
            cleaned = False
            try:
                cleaned = self._clean_one()
            except CleanerStopped:
                return
            except Exception:
                self.stats["errors"] += 1
                log.exception("log cleaner pass failed")
            if not cleaned:
                self._wake.wait(self.config.backoff_ms / 1000)
                self._wake.clear()

    def _clean_one(self) -> bool:
        """Clean the dirtiest cleanable log; False when none needed cleaning."""
        now = int(time.time() * 1000)
        best, best_ratio = None, -1.0
        for lg in self.runner(lambda: [x for x in self._logs() if is_compacted(x) and not x.offline]):
            if self._stop.is_set():
                raise CleanerStopped()
            with self._lock:
                if id(lg) in self._busy or lg in self.uncleanable:
                    continue
            if id(lg) not in self._horizons:
                self._horizons[id(lg)] = self._discover_horizon(lg, now)
            ratio = self.runner(lambda lg=lg: self._dirty_ratio(lg, now))
            if ratio is not None and ratio > best_ratio:
                best, best_ratio = lg, ratio
        if best is None:
            return False
        with self._lock:
            if id(best) in self._busy:
                return False
            self._busy.add(id(best))
        try:
            result = self.clean_log(best, now)
        except CleanerStopped:
            raise
        except Exception:
            if best in self.runner(self._logs):     # a deleted partition is no error
                self.uncleanable.add(best)
            log.exception("cleaning %s failed; it is not cleaned again until restart", best.name)
            raise
        finally:
            with self._lock:
                self._busy.discard(id(best))
        return result is not None and result.segments_in > 0

    def _dirty_ratio(self, lg, now: int):
        """Owner thread: how much of the cleanable part of ``lg`` is dirty, or None when it
        needs no cleaning now (Kafka's needsCompaction rules)."""
        cfg = lg.config
        closed = lg.segments[:-1]
        hw = lg.high_watermark
        min_lag = cfg.values.get("min.compaction.lag.ms", 0)
        first_dirty = getattr(lg, "cleaner_checkpoint", 0)
        if first_dirty < lg.log_start_offset or first_dirty > lg.log_end_offset:
            first_dirty = lg.log_start_offset
        total = dirty = 0
        oldest_dirty_ts = None
        for seg in closed:
            if seg.next_offset > hw or _too_young(seg, now, min_lag):
                break
            total += seg.size
            if seg.next_offset > first_dirty:
                dirty += seg.size
                if oldest_dirty_ts is None and seg.first_batch_ms is not None:
                    oldest_dirty_ts = seg.first_batch_ms
        if total == 0:
            return None
        horizon = self._horizons.get(id(lg))
        if horizon is not None and horizon <= now:
            return 1.0 + dirty / total
        ratio = dirty / total
        if dirty and ratio >= float(cfg.values.get("min.cleanable.dirty.ratio", 0.5)):
            return ratio
        max_lag = cfg.values.get("max.compaction.lag.ms", (1 << 63) - 1)
        if dirty and oldest_dirty_ts is not None and oldest_dirty_ts >= 0 and now - oldest_dirty_ts > max_lag:
            return ratio
        return None

    def _discover_horizon(self, lg, now: int):
        """Earliest delete horizon stamped in ``lg``'s cleanable batches (None if none): after
        a restart this says when tombstones fall due without rewriting the log to find out."""
        snap = self.runner(lambda: _Snapshot(lg, now))
        try:
            horizon = None
            for s in snap.segments:
                _e, headers, _r = _segment.scan_batches(s.fd, 0, s.size, s.base, s.base, False)
                for h in headers:
                    if h.attributes & ATTR_DELETE_HORIZON:
                        ts = h.first_timestamp      # KIP-534: the base timestamp is the horizon
                        horizon = ts if horizon is None else min(horizon, ts)
            return horizon
        finally:
            snap.close()

    # -- one pass ---------------------------------------------------------------------------

    def clean_log(self, lg, now: int | None = None) -> CleanResult | None:
        """One cleaning pass over ``lg`` (any thread); None when nothing was cleanable."""
        now = int(time.time() * 1000) if now is None else now
        self._local.io = [time.monotonic(), 0]
        snap = self.runner(lambda: _Snapshot(lg, now))
        try:
            if not snap.segments:
                return None
            result = CleanResult()
            end = self._build_map(lg, snap, result)
            if end is None:
                return None
            offset_map, end_offset = end
            result.end_offset = end_offset
            todo = [s for s in snap.segments if s.base < end_offset]
            self._clean_groups(lg, snap, list(self._groups(todo, snap.config)), offset_map, now, result)
            self.runner(lambda: _advance_checkpoint(lg, end_offset))
            self._horizons[id(lg)] = result.min_horizon
            self.stats["passes"] += 1
            self.stats["bytes_read"] += result.bytes_read
            self.stats["bytes_written"] += result.bytes_written
            return result
        finally:
            snap.close()

    def _check_stop(self):
        """Called per batch: stop if asked, and hand the GIL over. A thread waiting for the GIL
        otherwise waits up to sys.getswitchinterval() (5 ms) per hand-off, which the event loop
        would pay on every request while this thread runs Python code."""
        if self._stop.is_set():
            raise CleanerStopped()
        time.sleep(0)

    def _throttle(self, nbytes: int) -> None:
        """log.cleaner.io.max.bytes.per.second: sleep when this thread's read + written bytes
        run ahead of the rate (measured over the current pass)."""
        limit = self.config.max_io_bytes_per_second
        if limit == float("inf"):
            return
        t = self._local.io
        t[1] += nbytes
        ahead = t[1] / limit - (time.monotonic() - t[0])
        if ahead > 0:
            self._stop.wait(min(ahead, 1.0))
            self._check_stop()

    def _cap(self, cfg) -> int:
        return max(64 << 20, 16 * cfg.max_message_bytes)

    def _batches(self, info: _SegInfo, start_offset: int = -1):
        """(header, batch bytes) of a segment from the batch holding ``start_offset``,
        read log.cleaner.io.buffer.size at a time."""
        _end, headers, _reason = _segment.scan_batches(info.fd, 0, info.size, info.base, info.base, False)
        chunk_size = max(self.config.io_buffer_size, 1)
        buf, buf_pos = b"", 0
        for h in headers:
            if h.last_offset < start_offset:
                continue
            pos, size = h.position, h.size
            if pos < buf_pos or pos + size > buf_pos + len(buf):
                buf = os.pread(info.fd, max(chunk_size, size), pos)
                buf_pos = pos
            yield h, memoryview(buf)[pos - buf_pos:pos - buf_pos + size]

    def _section(self, batch, h, cfg):
        codec = h.attributes & ATTR_CODEC_MASK
        body = batch[HEADER_SIZE:]
        return decompress(codec, body, self._cap(cfg)) if codec else body

    def _build_map(self, lg, snap: _Snapshot, result: CleanResult):
        """Map the dirty batches; returns (map, end offset of the mapped range) or None."""
        dirty = [s for s in snap.segments if s.next_offset > snap.first_dirty]
        if not dirty:
            horizon = self._horizons.get(id(lg), 0)
            if horizon is None or horizon > snap.now:
                return None
            # Nothing dirty but tombstones may have expired: a pass with an empty map.
            return _native.OffsetMap(1, self.config.load_factor), snap.end
        needed = 0
        headers_by_seg = []
        for s in dirty:
            _e, hs, _r = _segment.scan_batches(s.fd, 0, s.size, s.base, s.base, False)
            headers_by_seg.append(hs)
            needed += sum(h.record_count for h in hs if h.last_offset >= snap.first_dirty)
        slots = min(self.config.max_slots, max(16, int(needed / self.config.load_factor) + 1))
        m = _native.OffsetMap(slots, self.config.load_factor)
        cfg = snap.config
        for s in dirty:
            for h, batch in self._batches(s, snap.first_dirty):
                self._check_stop()
                self._throttle(h.size)
                if h.attributes & ATTR_CONTROL or snap.in_aborted(h):
                    m.mark(h.last_offset)       # markers and aborted data never shadow a key
                    continue
                if m.room < h.record_count:
                    if m.size == 0:
                        raise RuntimeError(
                            f"log.cleaner.dedupe.buffer.size too small: a batch of {h.record_count} records "
                            f"does not fit in {m.max_entries} map entries")
                    return m, h.base_offset              # the map is full: clean up to this batch
                m.put_section(self._section(batch, h, cfg), h.record_count, h.base_offset)
                m.mark(h.last_offset)
        return m, snap.end

    def _groups(self, segments: list, cfg):
        group, size = [], 0
        for s in segments:
            if group and (size + s.size > cfg.segment_bytes
                          or s.next_offset - 1 - group[0].base > MAX_RELATIVE_OFFSET):
                yield group
                group, size = [], 0
            group.append(s)
            size += s.size
        if group:
            yield group

    def _clean_groups(self, lg, snap: _Snapshot, groups: list, offset_map, now: int, result: CleanResult):
        """Write every group's ``.cleaned`` files, make them all durable (one journal commit
        covers them: fsync per file after all are written, one directory fsync), then swap
        each in. Whatever is not swapped in is deleted again."""
        d = lg.dir
        written = []            # (group, paths) with files written and closed
        swapped = set()
        try:
            for group in groups:
                paths = self._write_group(d, snap, group, offset_map, now, result)
                written.append((group, paths))
            for _group, paths in written:
                for p in paths.values():
                    fd = os.open(p, os.O_RDONLY)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
            fsync_dir(d)
            _step("cleaned")
            for group, paths in written:
                self._check_stop()
                olds = [s.seg for s in group]
                if self.runner(lambda: swap_in(lg, olds, group[0].base, now)):
                    swapped.add(id(group))
                    result.segments_out += 1
            if swapped:
                fsync_dir(d)
        finally:
            for group, paths in written:
                if id(group) not in swapped:
                    for p in paths.values():   # roll back: the old segments stay
                        try:
                            os.unlink(p)
                        except FileNotFoundError:
                            pass

    def _write_group(self, d: str, snap: _Snapshot, group: list, offset_map, now: int,
                     result: CleanResult) -> dict:
        """Write one group's cleaned segment to ``<base>.{log,index,timeindex}.cleaned``
        (not yet fsynced); returns the three paths."""
        cfg = snap.config
        base = group[0].base
        paths = {sfx: os.path.join(d, file_name(base, sfx) + ".cleaned")
                 for sfx in (".log", ".index", ".timeindex")}
        for p in paths.values():
            if os.path.exists(p):
                os.unlink(p)
        fd = os.open(paths[".log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        index = tindex = None
        ok = False
        try:
            index = OffsetIndex(paths[".index"], base, cfg.segment_index_bytes, True)
            tindex = TimeIndex(paths[".timeindex"], base, cfg.segment_index_bytes, True)
            out = bytearray()
            position = 0
            since_index = 0
            max_ts, max_ts_offset = -1, base
            delete_retention = cfg.values.get("delete.retention.ms", 86400000)
            for s in group:
                result.segments_in += 1
                result.bytes_read += s.size
                for h, batch in self._batches(s):
                    self._check_stop()
                    new = self._clean_batch(h, batch, offset_map, snap, now, delete_retention, result)
                    self._throttle(h.size + (len(new) if new is not None else 0))
                    if new is None:
                        continue
                    last_offset = h.last_offset
                    batch_max_ts = _max_ts(new)
                    if batch_max_ts > max_ts:
                        max_ts, max_ts_offset = batch_max_ts, last_offset
                    if since_index > cfg.index_interval_bytes:
                        try:
                            index.append(last_offset, position)
                            tindex.maybe_append(max_ts, max_ts_offset)
                        except Exception:
                            pass            # sparse index: a missing entry only costs a longer walk
                        since_index = 0
                    since_index += len(new)
                    position += len(new)
                    out += new
                    if len(out) >= self.config.io_buffer_size:
                        _segment.write_all(fd, out)
                        out = bytearray()
            if out:
                _segment.write_all(fd, out)
            if max_ts >= 0:
                try:
                    tindex.maybe_append(max_ts, max_ts_offset)
                except Exception:
                    pass
            index.close(trim=True)
            tindex.close(trim=True)
            index = tindex = None
            result.bytes_written += position
            ok = True
            return paths
        finally:
            os.close(fd)
            for ix in (index, tindex):
                if ix is not None:
                    ix.close(trim=False)
            if not ok:
                for p in paths.values():
                    try:
                        os.unlink(p)
                    except FileNotFoundError:
                        pass

    def _clean_batch(self, h, batch, offset_map, snap: _Snapshot, now: int, delete_retention: int,
                     result: CleanResult):
        """The cleaned batch (bytes, or the original memoryview when unchanged), or None
        when it is dropped."""
        attributes = h.attributes
        if attributes & ATTR_CONTROL:
            return self._clean_marker(h, batch, snap, now, delete_retention, result)
        pid = h.producer_id
        if attributes & ATTR_TRANSACTIONAL and snap.in_aborted(h):
            result.records_read += h.record_count
            if snap.producer_last.get(pid) == h.last_offset:
                # A producer's last batch stays (empty) so its sequence state survives.
                return _native.finish_batch(batch[:HEADER_SIZE], b"", 0, attributes & ~ATTR_CODEC_MASK,
                                            h.first_timestamp, h.max_timestamp)
            return None
        new = self._clean_data(h, batch, offset_map, snap, now, delete_retention, result)
        if attributes & ATTR_TRANSACTIONAL and new is not None and (new is batch or _count(new)):
            snap.txn_data[pid] = True
        return new

    def _clean_marker(self, h, batch, snap: _Snapshot, now: int, delete_retention: int, result: CleanResult):
        """A control batch: a COMMIT/ABORT marker whose transaction kept no data in this pass is kept
        until its delete horizon (stamped by the first such pass), then dropped."""
        if h.producer_id < 0:
            return batch
        had_data = snap.txn_data.pop(h.producer_id, False)
        kind, coordinator_epoch = _txn.control_type(batch)
        if had_data or kind not in (_txn.ABORT, _txn.COMMIT):
            return batch
        if h.attributes & ATTR_DELETE_HORIZON:
            if now >= h.first_timestamp:
                return None
            result.min_horizon = (h.first_timestamp if result.min_horizon is None
                                  else min(result.min_horizon, h.first_timestamp))
            return batch
        horizon = now + delete_retention
        result.min_horizon = horizon if result.min_horizon is None else min(result.min_horizon, horizon)
        # the record keeps its timestamp: its delta is rewritten against the new base (the horizon)
        section = _txn.control_section(kind, coordinator_epoch, h.first_timestamp - horizon)
        return _native.finish_batch(batch[:HEADER_SIZE], section, 1, h.attributes | ATTR_DELETE_HORIZON,
                                    horizon, h.max_timestamp)

    def _clean_data(self, h, batch, offset_map, snap: _Snapshot, now: int, delete_retention: int,
                    result: CleanResult):
        attributes = h.attributes
        count = h.record_count
        base_ts = h.first_timestamp
        has_horizon = bool(attributes & ATTR_DELETE_HORIZON)
        retain_tombstones = not has_horizon or now < base_ts
        section = self._section(batch, h, snap.config)
        new_section, kept, tombstones, kept_max_ts = _native.filter_section(
            offset_map, section, count, h.base_offset, base_ts, retain_tombstones)
        result.records_read += count
        result.records_kept += kept
        if has_horizon and tombstones:
            result.min_horizon = base_ts if result.min_horizon is None else min(result.min_horizon, base_ts)
        if kept == count and (tombstones == 0 or has_horizon):
            return batch
        pid = h.producer_id
        codec = attributes & ATTR_CODEC_MASK
        max_ts = h.max_timestamp if attributes & ATTR_LOG_APPEND_TIME else kept_max_ts
        if kept == 0:
            if pid >= 0 and snap.producer_last.get(pid) == h.last_offset:
                # A producer's last batch stays (empty) so its sequence state survives.
                return _native.finish_batch(batch[:HEADER_SIZE], b"", 0, attributes & ~ATTR_CODEC_MASK,
                                            base_ts, h.max_timestamp)
            return None
        if tombstones and not has_horizon:
            horizon = now + delete_retention
            new_section, kept, tombstones, kept_max_ts = _native.filter_section(
                offset_map, section, count, h.base_offset, base_ts, True, horizon)
            attributes |= ATTR_DELETE_HORIZON
            base_ts = horizon
            result.min_horizon = horizon if result.min_horizon is None else min(result.min_horizon, horizon)
        if codec:
            new_section = compress(codec, new_section)
        return _native.finish_batch(batch[:HEADER_SIZE], new_section, kept, attributes, base_ts, max_ts)


_OFF_MAX_TS = LAYOUT["OFF_MAX_TIMESTAMP"]
_OFF_RECORDS_COUNT = LAYOUT["OFF_RECORDS_COUNT"]


def _count(batch) -> int:
    return int.from_bytes(bytes(batch[_OFF_RECORDS_COUNT:_OFF_RECORDS_COUNT + 4]), "big", signed=True)


def _max_ts(batch) -> int:
    return int.from_bytes(bytes(batch[_OFF_MAX_TS:_OFF_MAX_TS + 8]), "big", signed=True)


def _advance_checkpoint(lg, end_offset: int) -> None:
    if end_offset > getattr(lg, "cleaner_checkpoint", 0):
        lg.cleaner_checkpoint = end_offset
