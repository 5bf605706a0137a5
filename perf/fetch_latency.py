"""Broker CPU per small Fetch, side by side: A/B of event loops or of two trees, in one run.

    python -m kbroker.perf.fetch_latency [--targets asyncio,uvloop] [--rounds 5] [--count 5000]
        [--base-tree /path/to/worktree] [--strace] [--perf-record OUT_DIR] [--py-spy OUT_DIR]

Every target is one ``kbroker serve`` (``LocalCluster``, tmpfs log dir) started once; all of them stay up
for the whole run and are visited in a rotated order every round, so a round's figures share the
machine's load. One topic per target is filled with one-record batches by a confluent-kafka producer
(``request_bench.produce_run``); each round then runs ``request_bench.fetch_run`` (raw Fetch v11, one
~170 B batch per answer) with 1 and with 8 requests in flight and reports broker CPU (every thread's
run time from schedstat, ns) per fetch. (This VM's perf has no hardware counters: no instruction
counts; ``profile_request callgrind --workload fetch`` counts them.) The figures to read are the
same-round ratios against the first target.

Targets: ``asyncio`` / ``uvloop`` (``kbroker.event.loop``), ``base-asyncio`` / ``base-uvloop`` (the
``--base-tree`` checkout's kbroker/ through PYTHONPATH; the native modules stay this tree's, which the
editable install maps: A/B of Python changes; run from a folder without a kbroker/ in it, e.g. /tmp);
``mock``: librdkafka's mock cluster (C) in its own confluent-kafka host process, as request_bench starts it
(its topic has the 4 partitions the mock auto-creates; partition 0 is filled and fetched; CPU is that whole
process's, the mock broker threads plus the host's idle client threads); ``floor-block`` / ``floor-epoll``:
perf/fetch_floor.py, a server that answers every fetch from one precomputed answer with no broker work (the
machine's price of the round trip itself: what no broker can go below; blocking recv/send, or an epoll loop).

``--strace``: after the rounds, one more depth-1 pass per target under ``strace -c -f`` (syscalls per
fetch; strace slows the broker, so no CPU figure is taken from it). ``--perf-record DIR``: one more
depth-1 pass per target under ``perf record -g`` (DIR/<target>.data); ``--py-spy DIR``: the same under
``py-spy record --nonblocking`` (Python frames, collapsed stacks in DIR/<target>.txt).

Every loop is bounded in count and time; every process is started here and stopped by its PID.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from . import harness as H
from .fetch_floor import FloorTarget
from .request_bench import fetch_run, produce_run
from .targets import KbrokerTarget, MockTarget

DEPTHS = (1, 8)


def make_targets(names: list[str], base_tree: str | None, workdir: Path) -> list:
    out = []
    for name in names:
        if name in ("floor-block", "floor-epoll"):
            out.append(FloorTarget(name.split("-")[1]))
            continue
        if name == "mock":
            mock = MockTarget(workdir)
            mock.partitions = 4         # the only topic shape the mock creates; partition 0 is fetched
            out.append(mock)
            continue
        base, _, loop = name.rpartition("-")
        if loop not in ("asyncio", "uvloop") or base not in ("", "base"):
            raise SystemExit(f"unknown target {name!r}: asyncio, uvloop, base-asyncio, base-uvloop, mock, "
                             f"floor-block, floor-epoll")
        env = {}
        if base:
            if not base_tree:
                raise SystemExit(f"{name} needs --base-tree")
            env["PYTHONPATH"] = str(Path(base_tree).resolve())
        out.append(KbrokerTarget("shm", workdir, name=name, overrides={"kbroker.event.loop": loop}, env=env))
    return out


def _stop_tracer(proc: subprocess.Popen) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)     # our own child, by its PID: strace/perf write their summary
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return proc.stderr.read().decode(errors="replace")


cpu_ns = H.run_ns     # schedstat ns of every thread: ticks are too coarse for a few thousand fetches


def counted_pass(t, topic: str, count: int, depth: int, max_s: float) -> dict:
    """Warm-up connection first, then ``count`` fetches on a fresh one: broker CPU per fetch (µs)."""
    fetch_run(t.bootstrap, topic, t.pid, 100, 200, 0, depth, max_s)
    c0, t0 = cpu_ns(t.pid), time.monotonic()
    fetch_run(t.bootstrap, topic, t.pid, 100, count, 0, depth, max_s)
    c1, t1 = cpu_ns(t.pid), time.monotonic()
    return {"us_per_fetch": (c1 - c0) / count / 1000, "fetches_per_s": count / (t1 - t0)}


def _ratio(values: list, ref_values: list, ref: str) -> str:
    ratios = [x / y for x, y in zip(values, ref_values) if y]
    if not ratios:
        return ""
    return f"  ÷ {ref}: median {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})"


def traced_pass(target, topic: str, first: int, count: int, cmd: list[str], max_s: float) -> str:
    tracer = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    time.sleep(1.0)                          # strace/perf attach (no readiness signal to wait for)
    try:
        fetch_run(target.bootstrap, topic, target.pid, first, count, 10, 1, max_s)
    finally:
        text = _stop_tracer(tracer)
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--targets", default="asyncio,uvloop")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--count", type=int, default=5000, help="counted fetches per depth and round")
    ap.add_argument("--max-seconds", type=float, default=60.0)
    ap.add_argument("--base-tree")
    ap.add_argument("--strace", action="store_true")
    ap.add_argument("--perf-record")
    ap.add_argument("--py-spy", help="one more depth-1 pass per target under py-spy (collapsed stacks)")
    ap.add_argument("--json", help="write every measurement here")
    a = ap.parse_args(argv)
    names = [n for n in a.targets.split(",") if n]
    workdir = Path(tempfile.mkdtemp(prefix="kbroker-fetch-latency-"))
    targets = make_targets(names, a.base_tree, workdir)
    need = a.count + 300
    results = {t.name: {d: [] for d in DEPTHS} for t in targets}
    try:
        topics = {}
        for t in targets:
            t.start()
            topic = f"fetch-latency-{uuid.uuid4().hex[:8]}"
            t.create_topic(topic, getattr(t, "partitions", 1))
            if not getattr(t, "synthetic", False):
                produce_run(t.bootstrap, topic, {"broker": t.pid}, need, 100, a.max_seconds)
            topics[t.name] = topic
            H.progress(f"{t.name}: pid {t.pid}, {need} one-record batches in {topic}")
        for rnd in range(a.rounds):
            order = targets[rnd % len(targets):] + targets[:rnd % len(targets)]
            for t in order:
                for d in DEPTHS:
                    r = counted_pass(t, topics[t.name], a.count, d, a.max_seconds)
                    results[t.name][d].append(r)
                    H.progress(f"round {rnd} {t.name:14s} depth {d}: {r['us_per_fetch']:7.2f} µs/fetch "
                               f"{r['fetches_per_s']:>9,.0f} fetches/s")
        print(f"load average at the end: {os.getloadavg()}")
        # same-round ratios against the first target, and against the C mock when it ran
        refs = [targets[0].name] + (["mock"] if "mock" in results and targets[0].name != "mock" else [])
        keys = ["us_per_fetch", "fetches_per_s"]
        for d in DEPTHS:
            for key in keys:
                for t in targets:
                    v = [r.get(key, 0.0) for r in results[t.name][d]]
                    line = (f"depth {d} {key:12s} {t.name:14s} median {statistics.median(v):7.2f} "
                            f"({min(v):.2f}-{max(v):.2f})")
                    for other in refs:
                        if t.name != other:
                            line += _ratio(v, [r.get(key, 0.0) for r in results[other][d]], other)
                    print(line)
        if a.strace:
            for t in targets:
                n = min(a.count, 3000)
                text = traced_pass(t, topics[t.name], 100, n,
                                   ["strace", "-c", "-f", "-p", str(t.pid)], a.max_seconds)
                print(f"--- strace -c -f, {t.name}, {n} depth-1 fetches (+10 warm-up)\n{text}")
        if a.py_spy:
            Path(a.py_spy).mkdir(parents=True, exist_ok=True)
            for t in targets:
                out = str(Path(a.py_spy) / f"{t.name}.txt")
                traced_pass(t, topics[t.name], 100, a.count,
                            [str(Path(sys.executable).parent / "py-spy"), "record", "--nonblocking", "-r", "1000", "-f", "raw", "-o", out,
                             "-p", str(t.pid)], a.max_seconds)
                print(f"py-spy collapsed stacks: {out}")
        if a.perf_record:
            Path(a.perf_record).mkdir(parents=True, exist_ok=True)
            for t in targets:
                out = str(Path(a.perf_record) / f"{t.name}.data")
                traced_pass(t, topics[t.name], 100, a.count,
                            ["perf", "record", "-g", "-o", out, "-p", str(t.pid)], a.max_seconds)
                print(f"perf data: {out}")
        if a.json:
            Path(a.json).write_text(json.dumps(results, indent=1))
    finally:
        for t in targets:
            t.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
