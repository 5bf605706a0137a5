"""Side-by-side benchmark suite: kbroker beside Tansu, librdkafka's mock and any broker you name.

    python -m kbroker.perf.suite --quick              # CI smoke: 1 round, 2 points per curve, tiny volumes
    python -m kbroker.perf.suite --full               # 5 rounds, under 20 minutes on 2 cores
        [--extra-bootstrap HOST:PORT ...] [--out docs/perf] [--rounds N] [--helper-rounds N]
        [--baseline-tree PATH [--baseline-python PATH]]

Every round starts every target fresh (kbroker with log dirs on tmpfs and on disk, Tansu with memory
storage, the mock, plus any already-running ``--extra-bootstrap`` broker, whose CPU is not measured),
then runs, visiting the targets in an order rotated from round to round:

* the foundation workloads of ``broker_bench`` (clients, clients_stress, kcat, capacity), shortened;
* the baselines (``baselines``): the loopback sink with the partition curve's frames, and disk writes
  of the same batch sizes into the kbroker log-dir filesystems, with and without fdatasync;
* the curves: record size (``curve_record_size``), partition count (``curve_partitions``), and, when
  their modules are present, latency vs offered load (``curve_latency``) and connections
  (``curve_connections``);
* peak RSS of every broker process (VmHWM from /proc/<pid>/status) before it is stopped.

With ``--baseline-tree`` every kbroker target also runs as ``<name>@base``: the same broker, config and
log-dir storage, built from that tree (e.g. a worktree of an earlier commit) and run by its interpreter,
in the same rounds and rotation, wherever its counterpart runs; the report adds a before/after table.

Writes ``suite.json``, ``README.md`` (the report) and PNG plots into ``--out`` (default docs/perf).
"""
from __future__ import annotations

import argparse
import importlib
import math
import os
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from . import baselines as BL
from . import broker_bench as BB
from . import curve_partitions as CP
from . import curve_record_size as CR
from . import harness as H
from .targets import BASE_TAG, Baseline, Target, make_targets, role

LOCAL_TARGETS = ["kbroker-shm", "kbroker-disk", "tansu", "mock"]
CURVE_TARGETS = {"record_size": ["kbroker-shm", "tansu"],
                 "partitions": ["kbroker-shm", "kbroker-disk", "tansu"],
                 # The latency curve runs beside its peers (same client, same fractions and fixed rates,
                 # in the same rounds): a tail the C mock shares is the machine's. Connections stay
                 # kbroker-only (tens of seconds per target).
                 "latency": ["kbroker-shm", "tansu", "mock"],
                 "connections": ["kbroker-shm"]}
# --quick (the smoke test in the serial pass) runs the latency curve on kbroker only: each peer adds ~10 s
QUICK_CURVE_TARGETS = dict(CURVE_TARGETS, latency=["kbroker-shm"])
HELPER_CURVES = ("latency", "connections")
LOG_DIR_FS = {"kbroker-shm": "/dev/shm", "kbroker-disk": "/var/tmp"}

FOUNDATION_FULL = dict(rounds=5, a_records=300_000, a_seconds=2.5, kcat_phase_s=3.0, kcat_file_mib=16,
                       kcat_cap_bytes=1 << 30, kcat_max_invocations=60, cap_batches=256, baseline_reps=1,
                       run_timeout=120.0)
FOUNDATION_QUICK = dict(BB.QUICK, cap_batches=8, a_seconds=1.5, a_records=10_000)
FOUNDATION_WORKLOADS = ["clients", "clients_stress", "kcat", "capacity"]


class ExternalTarget(Target):
    """An already-running Kafka-compatible broker. Its CPU is not measured: ``pid`` is this process, only
    so that code reading /proc keeps working, and every CPU figure of this target is dropped."""
    consume = True
    cpu_measured = False
    cpu_note = "not measured (external process)"

    def __init__(self, bootstrap: str, index: int):
        self.bootstrap = bootstrap
        self.name = f"extra-{index}"
        self.cpu_pid = None

    @property
    def pid(self) -> int:
        return os.getpid()

    def start(self):
        host, port = self.bootstrap.rsplit(":", 1)
        import socket
        with socket.create_connection((host, int(port)), timeout=10):
            pass

    def stop(self):
        pass


def scrub_cpu(obj):
    """Drop every CPU figure (for targets whose CPU is not measured)."""
    if isinstance(obj, dict):
        return {k: (None if "cpu" in k and not isinstance(v, (dict, list)) else scrub_cpu(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [scrub_cpu(v) for v in obj]
    return obj


def peak_rss_kib(pid: int | None) -> int | None:
    if not pid:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def helper_module(name: str):
    """``kbroker.perf.curve_<name>`` if it is present, else None (imported lazily)."""
    try:
        return importlib.import_module(f"kbroker.perf.curve_{name}")
    except ModuleNotFoundError as e:
        if e.name and e.name.endswith(f"curve_{name}"):
            return None
        raise


def curve_targets(quick: bool) -> dict:
    return QUICK_CURVE_TARGETS if quick else CURVE_TARGETS


def plan(quick: bool, cfg: dict, names: list[str], extras: list[str], helpers: dict) -> list[dict]:
    """The points of one round with an estimate of the seconds each takes (setup included)."""
    all_names = names + extras
    pts = []
    for wl in FOUNDATION_WORKLOADS:
        for n in all_names:
            if wl == "capacity" and not role(n).startswith("kbroker"):
                continue
            est = {"clients": cfg["a_seconds"] + 2, "clients_stress": cfg["a_seconds"] + 2,
                   "kcat": 2 * cfg["kcat_phase_s"] + 2, "capacity": 3 if quick else 8}[wl]
            pts.append({"point": f"{wl} @ {n}", "est_s": est})
    for n in names:
        if n in LOG_DIR_FS:
            pts.append({"point": f"disk baseline @ {LOG_DIR_FS[n]} ({n})", "est_s": 1 if quick else 3})
    pts.append({"point": "loopback baseline (partition-curve frames)", "est_s": 1})
    rs = CR.QUICK_POINTS if quick else CR.FULL_POINTS
    for n in [x for x in all_names if role(x) in CURVE_TARGETS["record_size"] or x in extras]:
        for s in rs:
            pts.append({"point": f"record size {s} B @ {n}", "est_s": CR.QUICK["seconds"] + 1 if quick else
                        CR.FULL["seconds"] + 1})
    ps = CP.QUICK_POINTS if quick else CP.FULL_POINTS
    for n in [x for x in all_names if role(x) in CURVE_TARGETS["partitions"] or x in extras]:
        for p in ps:
            pts.append({"point": f"partitions {p} @ {n}", "est_s": 1 if quick else (2 if p < 1000 else 5)})
    for h, mod in helpers.items():
        if mod is None:
            continue
        for n in [x for x in all_names if role(x) in curve_targets(quick)[h] or x in extras]:
            pts.append({"point": f"{h} curve @ {n} (helper rounds only)",
                        "est_s": 8 if quick else (75 if h == "latency" else 40)})
    return pts


def run(args) -> dict:
    quick = args.quick
    fcfg = dict(FOUNDATION_QUICK if quick else FOUNDATION_FULL)
    rounds = args.rounds or (1 if quick else 5)
    fcfg["rounds"] = rounds
    names = [n for n in (args.targets.split(",") if args.targets else LOCAL_TARGETS)]
    baseline = Baseline(args.baseline_tree, args.baseline_python) if args.baseline_tree else None
    if baseline is not None:
        names += [n + BASE_TAG for n in names if n in LOG_DIR_FS]
    extras = [f"extra-{i + 1}" for i in range(len(args.extra_bootstrap or []))]
    helpers = {h: helper_module(h) for h in HELPER_CURVES}
    helper_rounds = args.helper_rounds or (1 if quick else 2)
    step = max(1, math.ceil(rounds / max(1, helper_rounds)))
    helper_round_set = {r for r in range(rounds) if r % step == 0 and r // step < helper_rounds}
    points = plan(quick, fcfg, names, extras, helpers)
    per_round_est = sum(p["est_s"] for p in points)
    H.progress(f"suite mode={'quick' if quick else 'full'} rounds={rounds} targets={names + extras}; "
               f"helper curves in rounds {sorted(r + 1 for r in helper_round_set)}: "
               + ", ".join(f"{h}={'present' if m else 'absent (not run)'}" for h, m in helpers.items()))
    H.progress(f"points per round ({len(points)}), estimated seconds each:")
    for p in points:
        H.progress(f"    {p['est_s']:5.1f} s  {p['point']}")
    H.progress(f"estimated ~{per_round_est:.0f} s per round (+ target start-up), ~{per_round_est * rounds / 60:.1f} min")

    workdir = Path(tempfile.mkdtemp(prefix="kbroker-suite-", dir="/dev/shm"))
    raw = {"foundation": {w: {n: [] for n in names + extras} for w in FOUNDATION_WORKLOADS},
           "record_size": {}, "partitions": {}, "latency": {}, "connections": {},
           "baselines": {"loopback": [], "disk": {n: [] for n in names if n in LOG_DIR_FS}},
           "rss_kib": {n: [] for n in names}, "load_avg": [], "timings": []}
    failures = []
    t_start = time.monotonic()
    load_start = os.getloadavg()
    try:
        env = H.kcat_env(workdir)
        kfile = workdir / "records-1k.txt"
        lines = BB.make_kcat_file(kfile, fcfg["kcat_file_mib"])
        cap_batch, cap_per_batch = BB.build_batch()
        part_batch = CP.build_batch()
        for rnd in range(rounds):
            targets = make_targets(workdir, names, baseline) + [ExternalTarget(b, i + 1)
                                                      for i, b in enumerate(args.extra_bootstrap or [])]
            k = rnd % len(targets)
            order = targets[k:] + targets[:k]
            started = []
            r0 = time.monotonic()
            raw["load_avg"].append({"round": rnd, "at_start": os.getloadavg()})

            def timed(label, fn, t=None):
                s0 = time.monotonic()
                try:
                    res = fn()
                    if t is not None and not getattr(t, "cpu_measured", True):
                        res = scrub_cpu(res)
                    return res
                except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                    failures.append({"round": rnd, "point": label, "error": repr(e)})
                    H.progress(f"round {rnd + 1} {label}: FAILED {e!r}")
                    return None
                finally:
                    raw["timings"].append({"round": rnd, "point": label, "seconds": time.monotonic() - s0})

            try:
                for t in order:
                    t.start()
                    started.append(t)
                H.progress(f"round {rnd + 1}/{rounds}: started " +
                           ", ".join(f"{t.name}@{t.bootstrap}" + (f" pid {t.pid}" if getattr(t, 'cpu_measured', True)
                                                                  else " (external)") for t in order))
                # -- foundation workloads
                for wl in FOUNDATION_WORKLOADS:
                    for t in order:
                        if wl == "capacity" and not role(t.name).startswith("kbroker"):
                            continue
                        topic = f"suite-{wl.replace('_', '-')}-r{rnd}"
                        if wl in BB.A_VARIANTS:
                            fn = lambda t=t, topic=topic: BB.run_clients(t, topic, BB.A_VARIANTS[wl], fcfg)  # noqa: E731
                        elif wl == "kcat":
                            fn = lambda t=t, topic=topic: BB.run_kcat(t, topic, fcfg, env, kfile, lines)  # noqa: E731
                        else:
                            fn = lambda t=t, topic=topic: BB.run_capacity(t, topic, fcfg, cap_batch,  # noqa: E731
                                                                          cap_per_batch, workdir)
                        res = timed(f"{wl} @ {t.name}", fn, t)
                        if res is not None:
                            res["round"] = rnd
                            H.progress(f"round {rnd + 1} {wl:<14} {t.name:<12} {_brief(wl, res)}")
                        raw["foundation"][wl][t.name].append(res)
                # -- baselines
                for t in order:
                    if t.name in LOG_DIR_FS:
                        d = Path(t.root)      # the kbroker log-dir filesystem (the target's own folder)
                        res = timed(f"disk baseline @ {t.name}", lambda d=d: {
                            str(sz): BL.disk(d, sz, max_bytes=(32 << 20) if quick else (256 << 20),
                                             sync_max_bytes=(16 << 20) if quick else (256 << 20),
                                             max_seconds=3.0, sync_max_seconds=3.0)
                            for sz in (len(cap_batch), len(part_batch[0]))})
                        if res:
                            H.progress(f"round {rnd + 1} disk baseline {t.name}: " + "; ".join(
                                f"{int(sz) // 1024} KiB writes {v['write']['mb_per_s']:.0f} MB/s, +fdatasync "
                                f"{v['write_fdatasync']['mb_per_s']:.0f} MB/s" for sz, v in res.items()))
                        raw["baselines"]["disk"][t.name].append(res)
                req = CP.QUICK_REQUESTS if quick else CP.FULL_REQUESTS
                res = timed("loopback baseline", lambda: BL.loopback(
                    CP.frame_sets("loopback", part_batch[0], 1, req), reps=1 if quick else 2))
                if res:
                    H.progress(f"round {rnd + 1} loopback baseline (partition-curve frames): {res['mb_per_s']:.0f} MB/s")
                raw["baselines"]["loopback"].append(res)
                # -- curves
                for t in order:
                    if role(t.name) in CURVE_TARGETS["record_size"] or t.name.startswith("extra-"):
                        res = timed(f"record size @ {t.name}", lambda t=t: CR.run(t, quick, tag=f"r{rnd}"), t)
                        raw["record_size"].setdefault(t.name, []).append(res)
                for t in order:
                    if role(t.name) in CURVE_TARGETS["partitions"] or t.name.startswith("extra-"):
                        res = timed(f"partitions @ {t.name}",
                                    lambda t=t: CP.run(t, quick, tag=f"r{rnd}", batch=part_batch), t)
                        raw["partitions"].setdefault(t.name, []).append(res)
                if rnd in helper_round_set:
                    for h, mod in helpers.items():
                        if mod is None:
                            continue
                        for t in order:
                            if role(t.name) in curve_targets(quick)[h] or t.name.startswith("extra-"):
                                res = timed(f"{h} @ {t.name}", lambda t=t, mod=mod: mod.run(t, quick), t)
                                if res is not None:
                                    res["round"] = rnd
                                raw[h].setdefault(t.name, []).append(res)
            finally:
                for t in started:
                    if t.name in raw["rss_kib"]:
                        raw["rss_kib"][t.name].append(peak_rss_kib(t.pid))
                    try:
                        t.stop()
                    except Exception as e:  # noqa: BLE001
                        failures.append({"round": rnd, "point": f"stop {t.name}", "error": repr(e)})
            raw["load_avg"][-1]["at_end"] = os.getloadavg()
            H.progress(f"round {rnd + 1}/{rounds} done in {time.monotonic() - r0:.0f} s; "
                       f"load average {raw['load_avg'][-1]['at_end'][0]:.2f}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    wall = time.monotonic() - t_start
    argv = " ".join(args.argv)
    doc = {
        "meta": {"command": "python -m kbroker.perf.suite" + (f" {argv}" if argv else ""),
                 "mode": "quick" if quick else "full", "rounds": rounds,
                 "targets": names + extras, "extra_bootstrap": dict(zip(extras, args.extra_bootstrap or [])),
                 "baseline": baseline.facts() if baseline else None,
                 "helper_curves": {h: ("run in rounds " + ",".join(str(r + 1) for r in sorted(helper_round_set))
                                       if m else "not run: module kbroker.perf.curve_" + h + " absent")
                                   for h, m in helpers.items()},
                 "curve_targets": curve_targets(quick),
                 "config": {"foundation": fcfg, "record_size": CR.QUICK if quick else CR.FULL,
                            "record_size_points": CR.QUICK_POINTS if quick else CR.FULL_POINTS,
                            "partitions_points": CP.QUICK_POINTS if quick else CP.FULL_POINTS,
                            "partitions_requests": CP.QUICK_REQUESTS if quick else CP.FULL_REQUESTS,
                            "partitions_batch_bytes": len(part_batch[0]),
                            "capacity_batch_bytes": len(cap_batch)},
                 "points_per_round": points,
                 "machine": H.machine_facts(), "git_commit": BB.git_commit(), "tree_dirty": BB.tree_dirty(),
                 "started_load_avg": load_start, "finished_load_avg": os.getloadavg(),
                 "finished_utc": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                 "wall_seconds": wall},
        "failures": failures,
        "raw": raw,
    }
    from .report import summarize
    doc["summary"] = summarize(doc)
    return doc


def _brief(wl: str, res: dict) -> str:
    def c(v, fmt):
        return "n/a" if v is None else format(v, fmt)
    if wl in BB.A_VARIANTS:
        return f"{res['records_per_s']:,.0f} rec/s, broker {c(res['cpu_s_per_million'], '.2f')} CPU s/M"
    if wl == "kcat":
        s = f"produce {res['produce']['mb_per_s']:.1f} MB/s {c(res['produce']['cpu_s_per_gb'], '.2f')} CPU s/GB"
        if res.get("fetch"):
            s += f"; fetch {res['fetch']['mb_per_s']:.1f} MB/s {c(res['fetch']['cpu_s_per_gb'], '.2f')} CPU s/GB"
        return s
    return (f"produce {res['produce']['mb_per_s']:.0f} MB/s (x{res['produce_ratio']:.2f} of loopback); "
            f"fetch {res['fetch']['mb_per_s']:.0f} MB/s (x{res['fetch_ratio']:.2f} of replay)")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m kbroker.perf.suite", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--quick", action="store_true", help="CI smoke: 1 round, 2 points per curve, tiny volumes")
    mode.add_argument("--full", action="store_true", help="5 rounds, every point (under 20 minutes on 2 cores)")
    ap.add_argument("--extra-bootstrap", action="append", metavar="HOST:PORT",
                    help="an already-running Kafka-compatible broker to include (CPU not measured); repeatable")
    ap.add_argument("--out", default=None, help="output folder (default docs/perf in the repo)")
    ap.add_argument("--rounds", type=int, help="override the number of rounds")
    ap.add_argument("--helper-rounds", type=int, help="rounds in which the latency/connections curves run")
    ap.add_argument("--targets", help=f"comma list from {','.join(LOCAL_TARGETS)} (default: all)")
    ap.add_argument("--baseline-tree", metavar="PATH",
                    help="also run every kbroker target as <name>@base, built from this tree (before/after table)")
    ap.add_argument("--baseline-python", metavar="PATH",
                    help="the baseline tree's interpreter (default PATH/.venv/bin/python)")
    ap.add_argument("--notes", help="a Markdown file whose text goes into the report's Findings section")
    ap.add_argument("--render-only", action="store_true", help="re-render README.md and plots from suite.json")
    args = ap.parse_args(argv)
    args.argv = argv
    out = Path(args.out) if args.out else BB.default_out()
    out.mkdir(parents=True, exist_ok=True)
    from . import report
    notes = Path(args.notes).read_text() if args.notes else ""
    if args.render_only:
        import json
        doc = json.loads((out / "suite.json").read_text())
        report.write_all(out, doc, notes, json_too=False)
        H.progress(f"re-rendered {out / 'README.md'} and plots from suite.json")
        return 0
    doc = run(args)
    files = report.write_all(out, doc, notes)
    for g in doc["summary"]["goals"]:
        st = "n/a" if g["met"] is None else ("met" if g["met"] else "MISSED")
        H.progress(f"goal {g['goal']}: {BB._fmt(g['value'])} (want {g['target']}) {st}")
    H.progress(f"wrote {', '.join(str(f) for f in files)}"
               + (f"; {len(doc['failures'])} failures" if doc["failures"] else ""))
    return 1 if doc["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
