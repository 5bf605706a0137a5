"""Baselines measured in the same run as the broker figures they are compared with.

* ``loopback(frame_sets)``: the capacity client's socket code (``harness.produce_frames``: blocking
  sockets, a sender and a receiver thread per connection, 5 requests in flight) moving the very same
  Produce frames into ``broker_bench``'s ``recv_into`` sink server, which answers a canned response.
  Nothing a broker could do with those frames is faster over loopback with this client.
* ``disk(directory, batch_bytes)``: the broker's write path without the broker: ``os.write`` of
  buffers of the same batch size into a file in the log-dir filesystem, once without syncing and once
  with ``os.fdatasync`` after every write. MB/s = bytes written ÷ wall time (including the final
  close; the unsynced figure is the page cache's speed, the synced one the device's).

Every loop is bounded by a byte count and a time limit.
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

from . import harness as H

MB = 1e6


def loopback(frame_sets: list[list[bytearray]], reps: int = 1, timeout: float = 60.0) -> dict:
    """Median MB/s over ``reps`` runs of the same frames into the in-memory sink (plus its CPU)."""
    from .broker_bench import start_sink, stop_proc
    sink, port = start_sink("produce")
    runs = []
    try:
        for _ in range(max(1, reps)):
            c0 = H.cpu_seconds(sink.pid)
            r = H.produce_frames(("127.0.0.1", port), frame_sets, timeout=timeout)
            runs.append({"bytes": r["bytes"], "seconds": r["seconds"], "mb_per_s": r["bytes"] / MB / r["seconds"],
                         "server_cpu_s": H.cpu_seconds(sink.pid) - c0})
    finally:
        stop_proc(sink)
    return {"mb_per_s": statistics.median(x["mb_per_s"] for x in runs), "repetitions": runs,
            "frame_bytes": len(frame_sets[0][0]) if frame_sets and frame_sets[0] else None,
            "connections": len(frame_sets)}


def _write_run(path: Path, buf: bytes, max_bytes: int, max_seconds: float, sync: bool) -> dict:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    written, writes = 0, 0
    t0 = time.monotonic()
    deadline = t0 + max_seconds
    try:
        while written + len(buf) <= max_bytes:
            n = os.write(fd, buf)
            if n != len(buf):
                raise OSError(f"short write: {n} of {len(buf)}")
            if sync:
                os.fdatasync(fd)
            written += n
            writes += 1
            if time.monotonic() > deadline:
                break
    finally:
        os.close(fd)
    t1 = time.monotonic()
    os.unlink(path)
    return {"bytes": written, "writes": writes, "seconds": t1 - t0, "mb_per_s": written / MB / (t1 - t0)}


def disk(directory: str | Path, batch_bytes: int, max_bytes: int = 256 << 20, max_seconds: float = 3.0,
         sync_max_bytes: int = 256 << 20, sync_max_seconds: float = 3.0) -> dict:
    """os.write of ``batch_bytes`` buffers into a file in ``directory``, without and with fdatasync."""
    directory = Path(directory)
    buf = os.urandom(batch_bytes)       # incompressible, like the broker's batches are to the kernel
    fd, name = tempfile.mkstemp(prefix="kbroker-perf-disk-", dir=directory)
    os.close(fd)
    path = Path(name)
    fs = os.statvfs(directory)
    out = {"directory": str(directory), "batch_bytes": batch_bytes,
           "filesystem_free_gib": round(fs.f_bavail * fs.f_frsize / 2**30, 1)}
    try:
        out["write"] = _write_run(path, buf, max_bytes, max_seconds, sync=False)
        out["write_fdatasync"] = _write_run(path, buf, sync_max_bytes, sync_max_seconds, sync=True)
    finally:
        path.unlink(missing_ok=True)
    return out
