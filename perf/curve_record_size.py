"""Throughput and broker CPU/GB against the record size (10 B to 512 KiB), same client everywhere.

Each point: a fresh 4-partition topic, then two ``python -m kbroker.perf.harness producer`` processes
(confluent-kafka, acks=1, linger.ms=5, batch.size=999000 so every batch stays under the 1,000,000-byte
client limit, no compression, no keys) started together after both have fetched metadata. Each is
bounded by a record count (a byte budget ÷ the record size, capped) and a time limit.

    records/s = delivery-acknowledged records ÷ (last flush − first produce)
    MB/s      = records/s × record size / 1e6 (payload bytes)
    CPU/GB    = broker CPU seconds (all threads, /proc) ÷ (payload bytes / 1e9)
"""
from __future__ import annotations

import json
import subprocess
import sys

from . import harness as H

MB, GB = 1e6, 1e9
FULL_POINTS = [10, 100, 1024, 10 * 1024, 100 * 1024, 512 * 1024]
QUICK_POINTS = [100, 100 * 1024]
BATCH_SIZE = 999_000
LINGER_MS = 5
FULL = dict(max_records=2_000_000, byte_budget=384 << 20, seconds=3.0)
QUICK = dict(max_records=40_000, byte_budget=16 << 20, seconds=1.5)


def run_point(target, topic: str, size: int, cfg: dict) -> dict:
    how = target.create_topic(topic, 4)
    records = max(8, min(cfg["max_records"], cfg["byte_budget"] // size)) // 2
    cmd = [sys.executable, "-m", "kbroker.perf.harness", "producer", "--bootstrap", target.bootstrap,
           "--topic", topic, "--records", str(records), "--size", str(size),
           "--max-seconds", str(cfg["seconds"]), "--linger-ms", str(LINGER_MS), "--batch-size", str(BATCH_SIZE)]
    procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    pid = getattr(target, "cpu_pid", target.pid)
    try:
        for p in procs:
            line = p.stdout.readline().strip()        # bounded: the worker's metadata call times out
            if line != "ready":
                raise RuntimeError(f"producer worker not ready: {line!r}")
        c0 = H.cpu_seconds(pid) if pid else None
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [json.loads(p.communicate(timeout=cfg["seconds"] + 90)[0].strip().splitlines()[-1]) for p in procs]
        c1 = H.cpu_seconds(pid) if pid else None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    delivered = sum(o["delivered"] for o in outs)
    span = max(o["t1"] for o in outs) - min(o["t0"] for o in outs)
    errors = sum(o["errors"] + o["unflushed"] for o in outs)
    if not delivered:
        raise RuntimeError(f"no record delivered: {next((o['first_error'] for o in outs if o['first_error']), None)}")
    nbytes = delivered * size
    cpu = None if c0 is None else c1 - c0
    return {"record_size": size, "topic_created_by": how, "records": delivered, "seconds": span,
            "bytes": nbytes, "records_per_s": delivered / span, "mb_per_s": nbytes / MB / span,
            "broker_cpu_s": cpu, "cpu_s_per_gb": None if cpu is None else cpu / (nbytes / GB),
            "errors": errors, "first_error": next((o["first_error"] for o in outs if o["first_error"]), None)}


def run(target, quick: bool, tag: str = "r0", points: list[int] | None = None) -> dict:
    cfg = QUICK if quick else FULL
    points = points or (QUICK_POINTS if quick else FULL_POINTS)
    out = {"client": "2 x confluent-kafka producer processes", "linger_ms": LINGER_MS, "batch_size": BATCH_SIZE,
           "config": cfg, "points": []}
    for size in points:
        try:
            res = run_point(target, f"rsize-{size}-{tag}", size, cfg)
        except Exception as e:  # noqa: BLE001 - recorded, the curve goes on
            res = {"record_size": size, "error": repr(e)}
            H.progress(f"  record size {target.name} {size} B: FAILED {e!r}")
        else:
            cpu = "" if res["cpu_s_per_gb"] is None else f", {res['cpu_s_per_gb']:.2f} CPU s/GB"
            H.progress(f"  record size {target.name} {size} B: {res['records_per_s']:,.0f} rec/s, "
                       f"{res['mb_per_s']:.1f} MB/s{cpu}")
        out["points"].append(res)
    return out
