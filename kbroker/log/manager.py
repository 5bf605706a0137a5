"""LogManager: every partition log in the broker's log directories.

Per log dir (Kafka's names):
- ``.lock``: flock held for the process lifetime; a second broker (or a second LogManager in
  this process) on the same dir is refused with LogDirError.
- ``meta.properties``: ``version=0``, ``broker.id``, ``cluster.id``; written on first start,
  checked on every later one (a mismatch is refused, naming both values).
- ``recovery-point-offset-checkpoint``, ``replication-offset-checkpoint`` (high watermarks),
  ``log-start-offset-checkpoint``: text ``0\\n<n>\\n<topic> <partition> <offset>\\n`` (checkpoint.py).
- ``cleaner-offset-checkpoint``: per compacted partition, the offset below which it is cleaned
  (the log cleaner's next pass starts its dedupe map there; cleaner.py).
- ``.kafka_cleanshutdown``: written last by ``shutdown()``; present at startup means no recovery
  scan is needed. It is removed once the logs are loaded, so a crash after startup is unclean.
- ``<topic>-<partition>/``: one Log; ``<topic>-<partition>.<uuid>-delete/`` while being deleted;
  ``<topic>-<partition>.<uuid>-future/`` a future replica being filled in another dir (below).

Threads: the broker's event-loop thread. ``cleanup_expired``, ``flush_dirty`` and
``checkpoint`` are plain methods the broker schedules (fsync-heavy: keep them periodic). The broker
splits the periodic checkpoint: ``checkpoint_snapshot`` on the loop (reads the logs), then
``write_checkpoints`` on its checkpoint thread, as Kafka's scheduler thread does: eight fsyncs on the
loop every few seconds stalled every connection for their duration (tens of ms on a real disk).
One lock serialises the writers of the files (temp + rename).

Failed dirs (Kafka's JBOD): an I/O error in a dir other than a full disk (EIO, EROFS, EACCES, ...)
takes the dir offline: its logs are marked offline (appends and reads refused) and no longer flushed,
checkpointed or cleaned; ``on_dir_failure(dir, tps)`` tells the broker, on the loop. A full disk
(ENOSPC, EDQUOT) is not a failed dir: appends are refused until space returns, reads and deletions go
on. At start-up a dir that cannot be read is offline from the start; only when every dir is, the
broker cannot start. Start-up writes nothing it needs before serving: a checkpoint it cannot write on a
full disk is retried by the periodic checkpoint.

Moving a replica between dirs (AlterReplicaLogDirs, Kafka's future replica): ``alter_dir(tp, dir)``
creates ``<t>-<p>.<uuid>-future`` in the target dir, starting at the current log's start offset, and a
mover task on the loop copies the current log's batches into it as a follower appends them (epochs,
producer state and the transaction index follow the batches), while the current log keeps taking
appends. The future follows the current log's truncations (by leader epoch, as a follower) and log
start. Once it holds the same log end and no append to the current log is in flight, the swap runs in
one loop callback (no append can interleave): the future is flushed and closed, the target dir's
checkpoints written with it, the current dir renamed ``-delete``, the future renamed
``<t>-<p>``, reopened and given to ``on_log_replaced(tp, old, new)`` (the replica layer repoints its
partition). A crash before the first rename leaves the current log and a future that start-up loads
and keeps filling (Kafka resumes the move the same way); a crash between the renames leaves only the
complete future, which start-up renames into place, unless a dir is offline (the current log may be
there: the future then waits, unserved). The future is not served, cleaned or subject to retention.

Crash: checkpoints are atomic (temp + fsync + rename). Without the marker each Log CRC-scans
from its recovery point (log.py). A leftover ``-delete`` directory is removed at startup.
"""
import asyncio
import errno
import fcntl
import logging
import os
import shutil
import threading
import uuid

from .checkpoint import OffsetCheckpoint, fsync_dir
from .cleaner import CleanerConfig, LogCleaner
from .errors import LogDirError
from .log import Log, LogConfig, now_ms

RECOVERY_POINT_FILE = "recovery-point-offset-checkpoint"
CLEANER_FILE = "cleaner-offset-checkpoint"
HW_FILE = "replication-offset-checkpoint"
LOG_START_FILE = "log-start-offset-checkpoint"
META_FILE = "meta.properties"
LOCK_FILE = ".lock"
CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
DELETE_SUFFIX = "-delete"
FUTURE_SUFFIX = "-future"
# Copy step of a replica move: bytes read from the current log per loop turn (one pread + append).
MOVE_CHUNK_BYTES = 1 << 20
# Caught up but an append to the current log is in flight: look again after this long (seconds).
MOVE_RETRY_S = 0.005

_log = logging.getLogger(__name__)


def is_dir_failure(e: OSError) -> bool:
    """An I/O error that takes a log dir offline: anything but a full disk (which only refuses
    appends until space returns)."""
    return e.errno not in (errno.ENOSPC, errno.EDQUOT)


def parse_dir_name(name: str):
    """(topic, partition) from ``<topic>-<partition>``, or None for anything else."""
    topic, sep, part = name.rpartition("-")
    if not sep or not topic or not part.isdigit() or name.startswith("."):
        return None
    return topic, int(part)


def parse_future_name(name: str):
    """(topic, partition) from ``<topic>-<partition>.<uuid>-future``, or None."""
    if not name.endswith(FUTURE_SUFFIX):
        return None
    base, dot, tag = name[:-len(FUTURE_SUFFIX)].rpartition(".")
    if not dot or len(tag) != 32:
        return None
    return parse_dir_name(base)


def _suffixed_name(topic: str, partition: int, suffix: str) -> str:
    """``<topic>-<partition>.<uuid><suffix>``, the topic part cut so the name fits in 255 bytes (Kafka's
    rule: a 249-character topic plus the suffix would not, and the rename would fail with ENAMETOOLONG)."""
    tail = f"-{partition}.{uuid.uuid4().hex}{suffix}"
    return topic.encode()[:255 - len(tail)].decode(errors="ignore") + tail


def read_properties(path: str) -> dict:
    out = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith(("#", "!")):
                continue
            k, sep, v = line.partition("=")
            if sep:
                out[k.strip()] = v.strip()
    return out


class LogManager:
    def __init__(self, log_dirs, defaults: dict | None = None, hw_follows_leo: bool = True,
                 cleaner_config: dict | None = None):
        # False under replication: the partition's leader moves the high watermark (ISR rule)
        # and a restart keeps the checkpointed one (clamped to the log end).
        self.hw_follows_leo = hw_follows_leo
        self.log_dirs = [os.path.abspath(d) for d in ([log_dirs] if isinstance(log_dirs, str) else log_dirs)]
        if not self.log_dirs:
            raise ValueError("at least one log dir is required")
        self.defaults = LogConfig.from_broker(defaults or {})
        self.topic_configs: dict = {}      # topic -> overrides dict
        self._log_configs: dict = {}       # topic -> (the overrides it was built from, LogConfig)
        self.logs: dict = {}               # (topic, partition) -> Log
        self._dir_of: dict = {}            # (topic, partition) -> log dir
        self._lock_fds: list = []
        self._closing: list = []           # (due_ms, Log) deleted partitions with open fds
        self._failing_dirs: set = set()    # dirs whose checkpoints last failed (reported once)
        self.offline_dirs: dict = {}       # failed dir -> what failed (Kafka's offline log dirs)
        self.on_dir_failure = None         # (dir, [tp]) -> None, called on the loop once per failed dir
        self._loop = None                  # the loop owning the logs (checkpoint threads report to it)
        self._checkpoint_due: set = set()  # dirs whose checkpoints still list deleted partitions
        self._checkpoint_lock = threading.Lock()   # one writer of the checkpoint files at a time
        self.clean_startup = None          # per startup: were all dirs shut down cleanly
        self.futures: dict = {}            # (topic, partition) -> future Log being filled in another dir
        self._movers: dict = {}            # (topic, partition) -> its mover task
        self._found_futures: list = []     # start-up: future dirs seen, placed once every dir is loaded
        self.preferred_dirs: dict = {}     # (topic, partition) -> dir asked for before the replica existed
        # (tp, old Log, new Log) -> None: a move swapped the future in (on the loop); the replica layer
        # repoints its partition. None: no swap happens (the future waits, caught up).
        self.on_log_replaced = None
        self.started = False
        # Compaction threads (log.cleaner.* keys); started by startup() when it runs on an
        # event loop (the broker), else by start_cleaner().
        self.cleaner = LogCleaner(CleanerConfig(cleaner_config),
                                  logs=lambda: [lg for lg in self.logs.values() if not lg.offline])

    # -- startup ----------------------------------------------------------------------------

    def startup(self, broker_id: int, cluster_id: str, topic_configs: dict | None = None) -> None:
        """Lock the dirs, check or write meta.properties, load and recover every partition."""
        self.topic_configs.update(topic_configs or {})
        try:
            for d in self.log_dirs:
                self._starting(d, lambda d: (os.makedirs(d, exist_ok=True), self._lock(d)))
            for d in self.log_dirs:
                self._starting(d, lambda d: self._check_meta(d, broker_id, cluster_id))
            clean_all = True
            for d in self.log_dirs:
                clean_all &= bool(self._starting(d, self._load_dir))
            self._place_futures()
            if len(self.offline_dirs) == len(self.log_dirs):
                raise LogDirError("every log dir failed at start-up: " + "; ".join(
                    f"{d}: {why}" for d, why in self.offline_dirs.items()))
            self.clean_startup = clean_all
        except BaseException:
            self._unlock()
            for log in self.logs.values():
                log.close_for_delete()
            self.logs.clear()
            raise
        self.started = True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not None:
            self._loop = loop
            self.start_cleaner(loop)
            for tp in self.futures:
                self._start_mover(tp)

    def _starting(self, d: str, step):
        """One start-up step on dir ``d``: an I/O error (not a full disk) takes the dir offline instead
        of stopping the broker; LogDirError (locked, another broker's or cluster's dir) still stops it."""
        if d in self.offline_dirs:
            return None
        try:
            return step(d)
        except OSError as e:
            if not is_dir_failure(e):
                raise
            self.offline_dirs[d] = f"{e.strerror} ({e.filename or d})"
            for tp in [tp for tp, x in self._dir_of.items() if x == d]:
                self.logs[tp].offline = True
            _log.error("log dir %s failed at start-up (%s): offline, its partitions are not served by this "
                       "broker", d, self.offline_dirs[d])
            return None

    def start_cleaner(self, loop=None) -> None:
        """Start the log cleaner threads (log.cleaner.enable); ``loop`` is the thread owning the
        logs, through which the cleaner takes snapshots and swaps segments in."""
        if loop is not None:
            self.cleaner.run_on_loop(loop)
        self.cleaner.start()

    def _lock(self, d: str) -> None:
        fd = os.open(os.path.join(d, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LogDirError(f"log dir {d} is locked by another broker process "
                              f"(could not lock {os.path.join(d, LOCK_FILE)})") from None
        self._lock_fds.append(fd)

    def _unlock(self) -> None:
        for fd in self._lock_fds:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        self._lock_fds = []

    def _check_meta(self, d: str, broker_id: int, cluster_id: str) -> None:
        path = os.path.join(d, META_FILE)
        if os.path.exists(path):
            props = read_properties(path)
            if props.get("version", "0") != "0":
                raise LogDirError(f"{path}: unsupported version {props.get('version')}")
            have_id = props.get("broker.id")
            if have_id is not None and int(have_id) != int(broker_id):
                raise LogDirError(f"{path} has broker.id={have_id} but this broker is "
                                  f"configured with broker.id={broker_id}")
            have_cluster = props.get("cluster.id")
            if have_cluster is not None and cluster_id is not None and have_cluster != cluster_id:
                raise LogDirError(f"{path} has cluster.id={have_cluster} but the cluster's id is "
                                  f"{cluster_id}: this log dir belongs to another cluster")
            return
        body = f"#\n#kbroker meta\nversion=0\nbroker.id={int(broker_id)}\ncluster.id={cluster_id}\n"
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(d)

    def _load_dir(self, d: str) -> bool:
        marker = os.path.join(d, CLEAN_SHUTDOWN_FILE)
        clean = os.path.exists(marker)
        rps = OffsetCheckpoint(os.path.join(d, RECOVERY_POINT_FILE)).read()
        hws = OffsetCheckpoint(os.path.join(d, HW_FILE)).read()
        starts = OffsetCheckpoint(os.path.join(d, LOG_START_FILE)).read()
        cleaned = OffsetCheckpoint(os.path.join(d, CLEANER_FILE)).read()
        now = now_ms()
        for name in sorted(os.listdir(d)):
            path = os.path.join(d, name)
            if not os.path.isdir(path):
                continue
            if name.endswith(DELETE_SUFFIX):
                shutil.rmtree(path, ignore_errors=True)   # finish an interrupted delete
                continue
            ftp = parse_future_name(name)
            if ftp is not None:
                self._found_futures.append((d, path, ftp, clean, rps.get(ftp, 0), starts.get(ftp, 0),
                                            hws.get(ftp, 0)))
                continue
            tp = parse_dir_name(name)
            if tp is None:
                continue
            if tp in self.logs:
                raise LogDirError(f"partition {tp[0]}-{tp[1]} exists in both "
                                  f"{self._dir_of[tp]} and {d}")
            log = Log(path, tp[0], tp[1], self._config_for(tp[0]), clean_shutdown=clean,
                      recovery_point=rps.get(tp, 0), log_start_offset=starts.get(tp, 0),
                      high_watermark=hws.get(tp, 0), now=now, hw_follows_leo=self.hw_follows_leo)
            log.cleaner_checkpoint = cleaned.get(tp, 0)
            self.logs[tp] = log
            self._dir_of[tp] = d
        if clean:
            os.unlink(marker)
            fsync_dir(d)
        # Not needed to serve: on a full disk the periodic checkpoint writes it once space returns.
        self._checkpoint_dir(d)
        return clean

    def _place_futures(self) -> None:
        """Start-up, every dir loaded: each future dir found is loaded as the future of its current
        log, or (its current log gone: a crash between the swap's two renames) renamed into place and
        loaded as the log; with a dir offline the current log may be there, so it stays unloaded."""
        found, self._found_futures = self._found_futures, []
        for d, path, tp, clean, rp, start, hw in found:
            if d in self.offline_dirs:
                continue
            if tp in self.futures:
                raise LogDirError(f"partition {tp[0]}-{tp[1]} has two future replicas: "
                                  f"{self.futures[tp].dir} and {path}")
            if tp not in self.logs:
                if self.offline_dirs:
                    _log.warning("future replica %s kept unloaded: its current log may be in an offline dir", path)
                    continue
                final = os.path.join(d, f"{tp[0]}-{tp[1]}")
                os.replace(path, final)
                fsync_dir(d)
                _log.warning("%s-%d: the move to %s was interrupted after the old replica was removed; "
                             "the complete future replica is now the log", tp[0], tp[1], d)
                self.logs[tp] = self._open(final, tp, clean, rp, start, hw)
                self._dir_of[tp] = d
                continue
            if d == self._dir_of[tp]:
                shutil.rmtree(path, ignore_errors=True)     # a future in its own log's dir serves nothing
                continue
            self.futures[tp] = self._open(path, tp, clean, rp, start, hw)

    def _open(self, path: str, tp, clean: bool, rp: int, start: int, hw: int) -> Log:
        return Log(path, tp[0], tp[1], self._config_for(tp[0]), clean_shutdown=clean, recovery_point=rp,
                   log_start_offset=start, high_watermark=hw, hw_follows_leo=self.hw_follows_leo)

    # -- moving a replica between dirs (AlterReplicaLogDirs) -----------------------------------

    def future_dir(self, tp) -> str | None:
        fut = self.futures.get(tp)
        return None if fut is None else self.dir_of(fut)

    def alter_dir(self, tp, d: str) -> None:
        """Move ``tp``'s replica to log dir ``d`` (a configured, online dir): a future replica there,
        filled and swapped in by the mover. Its current dir: nothing to move (a future elsewhere is
        dropped). Raises KeyError when the replica is not here (then ``d`` is remembered for its
        creation, as Kafka's preferred dir)."""
        d = os.path.abspath(d)
        cur = self.logs.get(tp)
        if cur is None:
            self.preferred_dirs[tp] = d
            raise KeyError(tp)
        if self.future_dir(tp) == d:
            self._start_mover(tp)       # asked again: a mover stopped by an error starts over
            return
        self._drop_future(tp)
        if self._dir_of[tp] == d:
            return
        path = os.path.join(d, _suffixed_name(tp[0], tp[1], FUTURE_SUFFIX))
        fut = Log(path, tp[0], tp[1], self._config_for(tp[0]), hw_follows_leo=self.hw_follows_leo)
        fsync_dir(d)
        fut.truncate_fully(cur.log_start_offset)
        topic_id = cur.read_topic_id()
        if topic_id is not None:
            fut.write_topic_id(topic_id)
        self.futures[tp] = fut
        _log.info("%s: moving from %s to %s (future replica %s)", cur.name, self._dir_of[tp], d, path)
        self._start_mover(tp)

    def _start_mover(self, tp) -> None:
        if self._loop is None or tp in self._movers:
            return
        task = self._loop.create_task(self._move(tp, self.futures[tp]))
        self._movers[tp] = task
        task.add_done_callback(lambda t, tp=tp: self._mover_done(tp, t))

    def _mover_done(self, tp, task) -> None:
        if self._movers.get(tp) is task:
            del self._movers[tp]
        if not task.cancelled() and task.exception() is not None:
            _log.error("moving %s-%d between log dirs failed: %r", tp[0], tp[1], task.exception())

    def _drop_future(self, tp) -> None:
        """Stop a move and remove its future replica (asked elsewhere, partition deleted)."""
        task = self._movers.pop(tp, None)
        if task is not None:
            task.cancel()
        fut = self.futures.pop(tp, None)
        if fut is None:
            return
        fut.close_for_delete()
        self._remove_future_dir(tp, fut)

    def _remove_future_dir(self, tp, fut: Log) -> None:
        d = self.dir_of(fut)
        doomed = os.path.join(d, _suffixed_name(tp[0], tp[1], DELETE_SUFFIX))
        try:
            os.replace(fut.dir, doomed)
            fsync_dir(d)
        except OSError as e:
            _log.error("cannot remove the future replica %s: %s", fut.dir, e)
            return
        shutil.rmtree(doomed, ignore_errors=True)
        self._checkpoint_due.add(d)

    async def _move(self, tp, fut: Log) -> None:
        """Fill ``fut`` from the current log until it holds the same, then swap it in."""
        while self.futures.get(tp) is fut:
            cur = self.logs.get(tp)
            if cur is None or cur.offline or fut.offline:
                return          # the partition went away or a dir failed: the move stops here
            if self._catch_up_step(cur, fut):
                await asyncio.sleep(0)
            elif self._can_swap(cur, fut):
                self._swap(tp, cur, fut)
                return
            else:
                await asyncio.sleep(MOVE_RETRY_S)

    def _catch_up_step(self, cur: Log, fut: Log) -> bool:
        """One copy step (truncating first where the current log diverged). -> whether it changed ``fut``."""
        epoch = fut.epoch_cache.latest_epoch
        if fut.log_end_offset > fut.log_start_offset and epoch >= 0:
            # As a follower after a leader change: keep only what the current log has under that epoch.
            _cur_epoch, end = cur.end_offset_for_epoch(epoch)
            if end < 0:             # the current log no longer has that epoch or any before it
                fut.truncate_fully(cur.log_start_offset)
                return True
            if min(end, cur.log_end_offset) < fut.log_end_offset:
                fut.truncate_to(min(end, cur.log_end_offset))
                return True
        if cur.log_start_offset > fut.log_end_offset or cur.log_end_offset < fut.log_start_offset:
            fut.truncate_fully(cur.log_start_offset)
            return True
        leo = fut.log_end_offset
        if leo < cur.log_end_offset:
            data = cur.read(leo, MOVE_CHUNK_BYTES, max_offset=cur.log_end_offset)
            if data.size:
                buf = b"".join(os.pread(fd, n, pos) for fd, pos, n in data.regions)
                base = int.from_bytes(buf[:8], "big")
                if base < leo and fut.log_end_offset == fut.log_start_offset:
                    # The log start is inside a batch (DeleteRecords): start at the batch, as Kafka's
                    # follower does; the log start follows below once the high watermark allows.
                    fut.truncate_fully(base)
                fut.append_as_follower(buf)
        fut.high_watermark = min(cur.high_watermark, fut.log_end_offset)
        if cur.log_start_offset > fut.log_start_offset:
            fut.delete_records(min(cur.log_start_offset, fut.high_watermark))
        return fut.log_end_offset != leo

    def _can_swap(self, cur: Log, fut: Log) -> bool:
        # No append to the current log may be queued or being written: it would land in the old files.
        return (self.on_log_replaced is not None and fut.log_end_offset == cur.log_end_offset
                and fut.log_start_offset == cur.log_start_offset and cur.write_future is None
                and cur._write_job is None and not cur.append_tails)

    def _swap(self, tp, cur: Log, fut: Log) -> None:
        """The future replaces the current log; one loop callback, crash-safe at every step (module doc)."""
        src, dst = self._dir_of[tp], self.dir_of(fut)
        fut.high_watermark = cur.high_watermark
        hw, start, leo = fut.high_watermark, fut.log_start_offset, fut.log_end_offset
        doomed = os.path.join(src, _suffixed_name(tp[0], tp[1], DELETE_SUFFIX))
        final = os.path.join(dst, f"{tp[0]}-{tp[1]}")
        renamed = False
        try:
            fut.close()                               # flushed: the recovery point is the log end
            self._write_checkpoints(dst)              # lists the future: a restart loads it from here
            os.replace(cur.dir, doomed)
            renamed = True
            fsync_dir(src)
            os.replace(fut.dir, final)
            fsync_dir(dst)
        except OSError:
            # The current log stays (put back under its name); the closed future goes, a new request
            # starts the move again.
            if renamed:
                os.replace(doomed, cur.dir)
                fsync_dir(src)
            del self.futures[tp]
            self._remove_future_dir(tp, fut)
            raise
        new = self._open(final, tp, True, leo, start, hw)
        new.cleaner_checkpoint = 0                    # the copy holds what the old log's cleaner removed
        new.on_cut = cur.on_cut
        del self.futures[tp]
        self.logs[tp] = new
        self._dir_of[tp] = dst
        cur.epoch_cache.close()
        shutil.rmtree(doomed, ignore_errors=True)
        # Readers may be in a sendfile from the old files right now: their descriptors close later.
        self._closing.append((now_ms() + cur.config.file_delete_delay_ms, cur))
        self._checkpoint_due.add(src)
        _log.info("%s: moved from %s to %s at log end %d", new.name, src, dst, leo)
        self.on_log_replaced(tp, cur, new)

    def _config_for(self, topic: str) -> LogConfig:
        # One LogConfig per topic, shared by its partitions (nothing mutates one: a change builds a
        # new one), rebuilt when the topic's overrides differ from the ones it was built from.
        overrides = self.topic_configs.get(topic, {})
        cached = self._log_configs.get(topic)
        if cached is not None and cached[0] == overrides:
            return cached[1]
        merged = dict(self.defaults)
        merged.update(overrides)
        config = LogConfig(merged)
        self._log_configs[topic] = (dict(overrides), config)
        return config

    # -- partitions -------------------------------------------------------------------------

    def get_or_create(self, topic: str, partition: int, topic_config: dict | None = None) -> Log:
        """The partition's log, created (in the least loaded dir) if absent. A given
        topic_config replaces the topic's overrides."""
        tp = (topic, partition)
        if topic_config is not None:
            self.topic_configs[topic] = dict(topic_config)
        log = self.logs.get(tp)
        if log is not None:
            if topic_config is not None:
                log.config = self._config_for(topic)
            return log
        if not self.started:
            raise RuntimeError("LogManager.startup() has not run")
        if not topic or "/" in topic or topic in (".", ".."):
            raise ValueError(f"invalid topic name {topic!r}")
        online = [d for d in self.log_dirs if d not in self.offline_dirs]
        if not online:
            raise LogDirError(f"no online log dir to create {topic}-{partition} in")
        d = self.preferred_dirs.pop(tp, None)
        if d not in online:
            counts = {d: 0 for d in online}
            for k, d in self._dir_of.items():
                if d in counts:
                    counts[d] += 1
            d = min(online, key=lambda x: counts[x])
        log = Log(os.path.join(d, f"{topic}-{partition}"), topic, partition, self._config_for(topic),
                  hw_follows_leo=self.hw_follows_leo)
        fsync_dir(d)
        self.logs[tp] = log
        self._dir_of[tp] = d
        return log

    def get(self, tp):
        return self.logs.get(tp)

    def all_logs(self):
        return list(self.logs.values())

    def set_topic_config(self, topic: str, topic_config: dict) -> None:
        """Apply new overrides to every partition of ``topic`` (AlterConfigs)."""
        self.topic_configs[topic] = dict(topic_config)
        for (t, _p), log in [*self.logs.items(), *self.futures.items()]:
            if t == topic:
                log.config = self._config_for(topic)

    def forget_topic(self, topic: str) -> None:
        """``topic`` left the cluster (deleted): its overrides and shared LogConfig go. Logs of it still
        open keep the LogConfig they hold until they are deleted; a topic created again under the name
        gets its overrides anew (LeaderAndIsr passes them to get_or_create)."""
        self.topic_configs.pop(topic, None)
        self._log_configs.pop(topic, None)

    def delete(self, topic: str, partition: int, now: int | None = None) -> bool:
        """Remove a partition: rename its dir to ``<t>-<p>.<uuid>-delete``, then remove it.
        The read descriptors stay open until file.delete.delay.ms has passed (they may be in
        a sendfile right now; closing would let the fd number be reused under it)."""
        tp = (topic, partition)
        self._drop_future(tp)
        self.preferred_dirs.pop(tp, None)
        log = self.logs.pop(tp, None)
        if log is None:
            return False
        d = self._dir_of.pop(tp)
        log.epoch_cache.close()        # nothing of it may land in a recreated dir
        doomed = os.path.join(d, _suffixed_name(topic, partition, DELETE_SUFFIX))
        os.replace(log.dir, doomed)
        fsync_dir(d)
        shutil.rmtree(doomed, ignore_errors=True)
        now = now_ms() if now is None else now
        self._closing.append((now + log.config.file_delete_delay_ms, log))
        # The checkpoints no longer list it once rewritten; that waits for the file-delete timer
        # (<= 200 ms) so deleting a topic's N partitions writes (and fsyncs) them once, not N times on
        # the request path. A crash before then is harmless: entries without a dir are ignored.
        self._checkpoint_due.add(d)
        return True

    # -- periodic jobs ----------------------------------------------------------------------

    def cleanup_expired(self, now: int | None = None) -> int:
        """Retention pass over every log plus delayed closes. Returns segments deleted."""
        now = now_ms() if now is None else now
        deleted = 0
        for log in self.logs.values():
            if not log.offline:
                deleted += log.delete_old_segments(now)
        self.remove_due_files(now)
        return deleted

    def remove_due_files(self, now: int | None = None) -> None:
        """Close and unlink what waited file.delete.delay.ms (log.segment.delete.delay.ms): segments
        of retention and truncation, and the descriptors of deleted partitions. The broker runs this
        on its own short timer so the space comes back when the delay ends, not at the next retention
        pass (on a full disk that difference is minutes of failed appends)."""
        now = now_ms() if now is None else now
        while self._checkpoint_due:
            self._checkpoint_dir(self._checkpoint_due.pop())
        for log in self.logs.values():
            if log._pending_delete:
                log.remove_deleted_files(now)
        if self._closing:
            keep = []
            for due, log in self._closing:
                if due <= now:
                    log.close_for_delete()
                else:
                    keep.append((due, log))
            self._closing = keep

    def flush_dirty(self, now: int | None = None) -> int:
        """flush.ms policy. Returns the number of logs flushed."""
        now = now_ms() if now is None else now
        return sum(1 for log in self.logs.values() if not log.offline and self._flushed(log, now))

    def _flushed(self, log, now: int) -> bool:
        try:
            return log.maybe_flush(now)
        except OSError as e:
            if not is_dir_failure(e):
                raise
            self.dir_failed(self.dir_of(log), e)
            return False

    def checkpoint(self) -> None:
        """Write the offset checkpoints of every dir, now, on this thread. A dir that cannot be
        written (ENOSPC, EIO) is reported once when it starts failing and once when it works again, not
        on every attempt: the checkpoints are retried on each call and nothing else depends on them
        succeeding now. Leader-epoch files are not written here: the logs write them when they flush
        (before the recovery point moves) and at close; writing a thousand of them here measurably
        competed with produce (perf.curve_partitions on disk: ~2 CPU s/GB more at 1,000 partitions)."""
        self.write_checkpoints(self.checkpoint_snapshot())

    def checkpoint_snapshot(self) -> list:
        """What every dir's checkpoints hold now: [(dir, [(path, {tp: offset})])]. Cheap; taken on the
        thread that owns the logs, so ``write_checkpoints`` can run on another."""
        return [(d, self._snapshot_dir(d)) for d in self.log_dirs if d not in self.offline_dirs]

    def write_checkpoints(self, snapshot: list) -> None:
        """Write a snapshot's files (temp + fsync + rename each); any thread."""
        for d, files in snapshot:
            self._checkpoint_dir(d, files)

    def _snapshot_dir(self, d: str) -> list:
        mine = [(tp, log) for tp, log in self.logs.items() if self._dir_of[tp] == d]
        mine += [(tp, fut) for tp, fut in self.futures.items() if self.dir_of(fut) == d]
        return [
            (os.path.join(d, RECOVERY_POINT_FILE), {tp: log.recovery_point for tp, log in mine}),
            (os.path.join(d, HW_FILE), {tp: log.high_watermark for tp, log in mine}),
            (os.path.join(d, LOG_START_FILE), {tp: log.log_start_offset for tp, log in mine}),
            (os.path.join(d, CLEANER_FILE),
             {tp: log.cleaner_checkpoint for tp, log in mine if log.cleaner_checkpoint > 0}),
        ]

    def _checkpoint_dir(self, d: str, files: list | None = None) -> None:
        if d in self.offline_dirs:
            return
        try:
            self._write_checkpoints(d, files)
        except OSError as e:
            if is_dir_failure(e):
                self._report_failure(d, e)
                return
            if d not in self._failing_dirs:
                self._failing_dirs.add(d)
                _log.error("cannot write checkpoints in log dir %s: %s (retrying quietly until it works)", d, e)
        else:
            if d in self._failing_dirs:
                self._failing_dirs.discard(d)
                _log.warning("checkpoints in log dir %s are written again", d)

    def _write_checkpoints(self, d: str, files: list | None = None) -> None:
        if files is None:
            files = self._snapshot_dir(d)
        with self._checkpoint_lock:
            for path, offsets in files:
                OffsetCheckpoint(path).write(offsets)

    # -- failed dirs --------------------------------------------------------------------------

    def dir_of(self, log) -> str:
        return os.path.dirname(log.dir)

    def probe_dir(self, d: str) -> OSError | None:
        """Write, fsync and remove a small file in ``d``: the error when the dir cannot take it."""
        path = os.path.join(d, ".kbroker-probe")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, b"probe")
                os.fsync(fd)
            finally:
                os.close(fd)
            os.unlink(path)
        except OSError as e:
            return e
        return None

    def check_dir(self, d: str) -> bool:
        """After a failed append in ``d``: probe it; a dir failure (not a full disk) takes it offline.
        -> True when the dir is (now) offline."""
        if d in self.offline_dirs:
            return True
        e = self.probe_dir(d)
        if e is not None and is_dir_failure(e):
            self.dir_failed(d, e)
            return True
        return False

    def _report_failure(self, d: str, e: OSError) -> None:
        """A dir failure seen on any thread: handled on the loop owning the logs."""
        loop = self._loop
        if loop is None:
            self.dir_failed(d, e)
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self.dir_failed(d, e)
        elif not loop.is_closed():
            loop.call_soon_threadsafe(self.dir_failed, d, e)

    def dir_failed(self, d: str, e: OSError) -> list:
        """Take dir ``d`` offline (once): its logs refuse appends and reads from now on. -> its
        partitions (also given to ``on_dir_failure``)."""
        if d in self.offline_dirs or d not in self.log_dirs:
            return []
        self.offline_dirs[d] = f"{e.strerror} ({e.filename or d})"
        tps = sorted(tp for tp, x in self._dir_of.items() if x == d)
        for tp in tps:
            self.logs[tp].offline = True
        for fut in self.futures.values():
            if self.dir_of(fut) == d:
                fut.offline = True      # its mover stops; the current log stays where it is
        _log.error("log dir %s failed (%s): offline, with its %d partition(s); %d of %d log dirs remain online",
                   d, self.offline_dirs[d], len(tps), len(self.log_dirs) - len(self.offline_dirs),
                   len(self.log_dirs))
        if self.on_dir_failure is not None:
            self.on_dir_failure(d, tps)
        return tps

    def in_offline_dir(self, tp) -> bool:
        d = self._dir_of.get(tp)
        return d is not None and d in self.offline_dirs

    # -- shutdown ---------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Flush and close every log, write checkpoints, then the clean-shutdown marker."""
        if not self.started:
            return
        self.cleaner.stop()
        for task in self._movers.values():
            task.cancel()
        self._movers.clear()
        for fut in self.futures.values():
            if self.dir_of(fut) not in self.offline_dirs:
                fut.close()         # the next start loads it and the move goes on
        for tp, log in self.logs.items():
            if self._dir_of[tp] in self.offline_dirs:
                continue        # its files cannot be trusted to take a write: the next start recovers it
            log.close()
        for _due, log in self._closing:
            log.close_for_delete()
        self._closing = []
        for d in self.log_dirs:
            if d in self.offline_dirs:
                continue        # no clean-shutdown marker: recovered at the next start
            self._write_checkpoints(d)
            stale = [log.name for tp, log in self.logs.items() if self._dir_of[tp] == d and log.epoch_cache.dirty]
            if stale:
                # A clean start trusts the epoch files; these could not be written (full disk),
                # so the next start must recover their epochs from the batches.
                _log.error("log dir %s: no clean-shutdown marker, the leader-epoch checkpoints of %d "
                           "partition(s) (first %s) could not be written", d, len(stale), stale[0])
                continue
            with open(os.path.join(d, CLEAN_SHUTDOWN_FILE), "wb") as f:
                f.flush()
                os.fsync(f.fileno())
            fsync_dir(d)
        self.logs.clear()
        self.futures.clear()
        self._dir_of.clear()
        self._unlock()
        self.started = False
