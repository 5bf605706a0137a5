"""Kafka's text checkpoint files.

Format (OffsetCheckpointFile / LeaderEpochCheckpointFile, version 0):
    0\\n<entry count>\\n<entry>\\n...
where an entry is ``<topic> <partition> <offset>`` for the log-dir checkpoints
(recovery-point-offset-checkpoint, replication-offset-checkpoint, log-start-offset-checkpoint)
and ``<epoch> <start offset>`` for a partition's leader-epoch-checkpoint.

Threads: called from the broker's event-loop thread only (writes fsync, so keep them to the
periodic jobs and to shutdown).

Crash: a checkpoint is written to ``<name>.tmp``, fsynced, renamed over the old file and the
directory fsynced, so a crash leaves the old or the new file, never a torn one (a stale .tmp
is ignored and overwritten). A missing file reads as empty; a malformed one raises
ValueError, because guessing offsets would silently lose or replay data.
"""
import os

VERSION = 0


def write_lines(path: str, lines: list) -> None:
    """Atomically replace ``path`` with the version/count header and ``lines``."""
    write_text(path, f"{VERSION}\n{len(lines)}\n" + "".join(f"{line}\n" for line in lines))


def write_text(path: str, body: str) -> None:
    """Atomically replace ``path`` with ``body`` (temp file, fsync, rename, directory fsync)."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        data = body.encode()
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")


def read_lines(path: str) -> list:
    """Entry lines of a checkpoint file (split on whitespace); [] if the file is missing."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return []
    rows = text.split("\n")
    if len(rows) < 2 or rows[0].strip() != str(VERSION):
        raise ValueError(f"{path}: unsupported checkpoint version {rows[0]!r}")
    count = int(rows[1])
    entries = [r.split() for r in rows[2:2 + count]]
    if len(entries) != count or any(not e for e in entries):
        raise ValueError(f"{path}: expected {count} entries, found {len(entries)}")
    return entries


def fsync_dir(path: str) -> None:
    """fsync a directory so a rename or unlink inside it is durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class OffsetCheckpoint:
    """A log-dir checkpoint mapping (topic, partition) -> offset."""

    def __init__(self, path: str):
        self.path = path

    def write(self, offsets: dict) -> None:
        lines = [f"{t} {p} {o}" for (t, p), o in sorted(offsets.items())]
        write_lines(self.path, lines)

    def read(self) -> dict:
        out = {}
        for e in read_lines(self.path):
            if len(e) != 3:
                raise ValueError(f"{self.path}: malformed entry {' '.join(e)!r}")
            out[(e[0], int(e[1]))] = int(e[2])
        return out
