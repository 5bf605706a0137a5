"""Broker MB/s and CPU/GB against the partition count, with the per-partition batch size held fixed.

One RecordBatch of 1 KiB records (``BATCH_BYTES``, built once with ``BatchBuilder``) is framed as a
Produce v7 request per partition (one partition per request, acks=1). Two raw-socket connections
(``harness.produce_frames``: 5 requests in flight each) send the same number of requests at every point,
round-robin over the partitions (connection c takes the partitions p with p % 2 == c, both take partition
0 when there is only one). Request size, request count, bytes and client code are identical at every
point; only the number of partitions the broker spreads them over changes. So the curve measures the
broker (per-partition state, files, lookups), not client batching.

    MB/s   = request bytes ÷ time to the last response
    CPU/GB = broker CPU seconds (all threads, /proc) ÷ (request bytes / 1e9)

Goal: MB/s at 1,000 partitions ÷ MB/s at 1 partition >= 0.7.
"""
from __future__ import annotations

import time

from . import harness as H

MB, GB = 1e6, 1e9
BATCH_BYTES = 128 * 1024
RECORD = 1024
FULL_POINTS = [1, 10, 100, 1000]
QUICK_POINTS = [1, 10]
FULL_REQUESTS = 2048          # 2048 x 128 KiB = 256 MiB per point
QUICK_REQUESTS = 96


def build_batch(batch_bytes: int = BATCH_BYTES) -> tuple[bytes, int]:
    from kbroker._native.batch import BatchBuilder
    b = BatchBuilder(codec=0, batch_size=batch_bytes)
    value = (b"partitions-" * (RECORD // 11 + 1))[:RECORD]
    ts = int(time.time() * 1000)
    while b.append(ts, None, value):
        pass
    return b.build(), b.record_count


def frame_sets(topic: str, batch: bytes, partitions: int, requests: int) -> list[list[bytearray]]:
    """Two connections, ``requests`` frames in all, round-robin over the partitions. Every frame object
    is used by one connection only (the sender rewrites its correlation id in place)."""
    from kbroker.protocol.api import encode_request

    def frame(p):
        return bytearray(encode_request(0, 7, 0, "kbroker-perf", {
            "transactional_id": None, "acks": 1, "timeout_ms": 30000,
            "topic_data": [{"name": topic, "partition_data": [{"index": p, "records": batch}]}]}))

    sets = []
    for c in range(2):
        mine = [p for p in range(partitions) if p % 2 == c] or [0]
        frames = {p: frame(p) for p in mine}
        n = requests // 2
        sets.append([frames[mine[i % len(mine)]] for i in range(n)])
    return sets


def check_responses(responses, per_batch: int) -> int:
    """Raises on any partition error; returns the number of partition acknowledgements."""
    from .broker_bench import produce_partition_responses
    return sum(1 for _ in produce_partition_responses(responses))


def run_point(target, topic: str, partitions: int, requests: int, batch: bytes, per_batch: int,
              timeout: float = 120.0) -> dict:
    t0 = time.monotonic()
    how = target.create_topic(topic, partitions)
    setup_s = time.monotonic() - t0
    sets = frame_sets(topic, batch, partitions, requests)
    host, port = target.bootstrap.rsplit(":", 1)
    pid = getattr(target, "cpu_pid", target.pid)
    c0 = H.cpu_seconds(pid) if pid else None
    r = H.produce_frames((host, int(port)), sets, timeout=timeout)
    c1 = H.cpu_seconds(pid) if pid else None
    acks = check_responses(r["responses"], per_batch)
    if acks != sum(len(s) for s in sets):
        raise RuntimeError(f"{acks} partition acknowledgements for {sum(len(s) for s in sets)} requests")
    cpu = None if c0 is None else c1 - c0
    return {"partitions": partitions, "topic_created_by": how, "topic_setup_s": setup_s,
            "requests": acks, "batch_bytes": len(batch), "records_per_batch": per_batch,
            "bytes": r["bytes"], "seconds": r["seconds"], "mb_per_s": r["bytes"] / MB / r["seconds"],
            "broker_cpu_s": cpu, "cpu_s_per_gb": None if cpu is None else cpu / (r["bytes"] / GB)}


def run(target, quick: bool, tag: str = "r0", points: list[int] | None = None, requests: int | None = None,
        batch=None) -> dict:
    """All points of the curve against one running target; failures are recorded per point."""
    points = points or (QUICK_POINTS if quick else FULL_POINTS)
    requests = requests or (QUICK_REQUESTS if quick else FULL_REQUESTS)
    batch, per_batch = batch or build_batch()
    out = {"batch_bytes": len(batch), "requests_per_point": requests, "points": []}
    for p in points:
        try:
            res = run_point(target, f"parts-{p}-{tag}", p, requests, batch, per_batch)
        except Exception as e:  # noqa: BLE001 - recorded, the curve goes on
            res = {"partitions": p, "error": repr(e)}
            H.progress(f"  partitions {target.name} P={p}: FAILED {e!r}")
        else:
            cpu = "" if res["cpu_s_per_gb"] is None else f", {res['cpu_s_per_gb']:.2f} CPU s/GB"
            H.progress(f"  partitions {target.name} P={p}: {res['mb_per_s']:.0f} MB/s{cpu} "
                       f"(topic setup {res['topic_setup_s']:.1f} s)")
        out["points"].append(res)
    return out
