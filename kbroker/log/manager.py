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
- ``<topic>-<partition>/``: one Log; ``<topic>-<partition>.<uuid>-delete/`` while being deleted.

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

    def _config_for(self, topic: str) -> LogConfig:
        merged = dict(self.defaults)
        merged.update(self.topic_configs.get(topic, {}))
        return LogConfig(merged)

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
        for (t, _p), log in self.logs.items():
            if t == topic:
                log.config = self._config_for(topic)

    def delete(self, topic: str, partition: int, now: int | None = None) -> bool:
        """Remove a partition: rename its dir to ``<t>-<p>.<uuid>-delete``, then remove it.
        The read descriptors stay open until file.delete.delay.ms has passed (they may be in
        a sendfile right now; closing would let the fd number be reused under it)."""
        tp = (topic, partition)
        log = self.logs.pop(tp, None)
        if log is None:
            return False
        d = self._dir_of.pop(tp)
        log.epoch_cache.close()        # nothing of it may land in a recreated dir
        # Kafka's rule: the topic part is cut so the name fits in 255 bytes (a 249-character topic
        # plus the suffix would not, and the delete would fail with ENAMETOOLONG).
        suffix = f"-{partition}.{uuid.uuid4().hex}{DELETE_SUFFIX}"
        doomed = os.path.join(d, topic.encode()[:255 - len(suffix)].decode(errors="ignore") + suffix)
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
        self._dir_of.clear()
        self._unlock()
        self.started = False
