"""End-to-end latency beside the peers: ``curve_latency`` on kbroker, librdkafka's mock and Tansu in
interleaved rounds, optionally with client and broker pinned to separate cores.

    python -m kbroker.perf.latency_peers [--rounds 3] [--targets kbroker-shm,mock,tansu]
        [--fractions 0.1,0.25,0.5,0.75,0.9] [--rates 20000,40000,60000] [--pin off|on|both]
        [--samples N] [--max-point-s S] [--out docs/perf] [--stem latency-peers] [--quick]

Every round starts every target fresh and runs its curve (its own unthrottled peak, the fractions of
that peak, then the fixed rates, all with the same client: ``curve_latency``'s confluent-kafka producer
and consumer), visiting the targets in an order rotated per round. ``--pin on`` runs every curve with
the client (producer process and consumer process) on CPU 0 and every broker thread on CPU 1; ``both``
runs each target twice per round, as ``NAME`` (shared cores) and ``NAME+pinned``, so the two are
compared in the same rounds. Ratios kbroker ÷ mock are taken within a round (``curve_latency.summarize``).

Output: ``<out>/<stem>.json`` (every point of every round, the summary) and ``<out>/<stem>.md`` with
``<stem>.png``. Progress lines go to stderr; exit status 1 when a curve failed.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from . import broker_bench as BB
from . import curve_latency as CL
from . import harness as H
from .targets import make_targets

PIN = {"client": [0], "broker": [1]}
PINNED = "+pinned"


def _plan(names: list[str], pin: str) -> list[tuple[str, bool]]:
    """(target, pinned) pairs of one round."""
    if pin == "both":
        return [(n, p) for n in names for p in (False, True)]
    return [(n, pin == "on") for n in names]


def run(args) -> dict:
    names = args.targets.split(",")
    plan = _plan(names, args.pin)
    if args.pin != "off" and os.cpu_count() < 2:
        raise SystemExit("--pin needs two CPUs")
    cfg = dict(CL.QUICK if args.quick else CL.FULL)
    if args.fractions:
        cfg["fractions"] = tuple(float(x) for x in args.fractions.split(","))
    if args.rates is not None:
        cfg["rates"] = tuple(float(x) for x in args.rates.split(",") if x)
    for key in ("samples", "max_point_s", "drain_s"):
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    raw = {f"{n}{PINNED if p else ''}": [] for n, p in plan}
    failures, load = [], []
    workdir = Path(tempfile.mkdtemp(prefix="kbroker-latency-peers-", dir="/dev/shm"))
    t_start, load_start = time.monotonic(), os.getloadavg()
    try:
        for rnd in range(args.rounds):
            k = rnd % len(plan)
            order = plan[k:] + plan[:k]
            load.append({"round": rnd, "at_start": os.getloadavg()})
            for name, pinned in order:
                label = f"{name}{PINNED if pinned else ''}"
                t = make_targets(workdir, [name])[0]
                res = None
                try:
                    t.start()
                    t.name = label
                    res = CL.run(t, args.quick, dict(cfg, pin=PIN if pinned else None))
                    res["round"] = rnd
                except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                    failures.append({"round": rnd, "target": label, "error": repr(e)})
                    H.progress(f"round {rnd + 1} {label}: FAILED {e!r}")
                finally:
                    try:
                        t.stop()
                    except Exception as e:  # noqa: BLE001
                        failures.append({"round": rnd, "target": f"stop {label}", "error": repr(e)})
                raw[label].append(res)
            load[-1]["at_end"] = os.getloadavg()
            H.progress(f"round {rnd + 1}/{args.rounds} done; load average {load[-1]['at_end'][0]:.2f}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    summaries = {"shared": CL.summarize({k: v for k, v in raw.items() if not k.endswith(PINNED)})}
    pinned = {k[:-len(PINNED)]: v for k, v in raw.items() if k.endswith(PINNED)}
    if pinned:
        summaries["pinned"] = CL.summarize(pinned)
    if args.pin == "both":
        # the same target with and without pinning, same rounds: pinned ÷ shared p99 per point
        summaries["pinned_vs_shared"] = {n: CL.summarize({n + PINNED: raw[n + PINNED], n: raw[n]},
                                                         primary=n + PINNED, peer=n)["peer"] for n in names}
    return {"meta": {"command": "python -m kbroker.perf.latency_peers " + " ".join(args.argv),
                     "mode": "quick" if args.quick else "full", "rounds": args.rounds, "plan": plan,
                     "config": {k: v for k, v in cfg.items()}, "pin": PIN if args.pin != "off" else None,
                     "machine": H.machine_facts(), "git_commit": BB.git_commit(), "tree_dirty": BB.tree_dirty(),
                     "started_load_avg": load_start, "finished_load_avg": os.getloadavg(), "load_avg": load,
                     "finished_utc": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                     "wall_seconds": time.monotonic() - t_start},
            "failures": failures, "raw": raw, "summary": summaries}


def write_markdown(path: Path, doc: dict, plots: dict) -> None:
    from . import report
    meta, summ = doc["meta"], doc["summary"]
    la0, la1 = meta["started_load_avg"], meta["finished_load_avg"]
    L = ["# End-to-end latency beside the peers\n",
         f"Generated by `{meta['command']}` on {meta['finished_utc']} ({meta['mode']} mode, {meta['rounds']} "
         f"round(s), {meta['wall_seconds']:.0f} s wall, tree `{meta['git_commit']}`). Load average "
         f"{la0[0]:.2f} at the start, {la1[0]:.2f} at the end; per round: "
         + ", ".join(f"{x['at_start'][0]:.2f}→{x.get('at_end', [float('nan')])[0]:.2f}" for x in meta["load_avg"])
         + ". Medians with the min–max over rounds; ratios within the same round.\n"]
    if meta["pin"]:
        L.append(f"Pinned runs: client (producer process with its librdkafka threads, consumer process) on CPU "
                 f"{meta['pin']['client']}, every broker thread on CPU {meta['pin']['broker']} "
                 "(`sched_setaffinity`); ZooKeeper unpinned (idle on the data path).\n")
    for key, title in (("shared", "Client and broker sharing both cores"), ("pinned", "Client and broker pinned apart")):
        if key not in summ:
            continue
        L.append(f"\n## {title}\n")
        if summ[key]["goals"]:
            L.append("| goal | wanted | median | per-round range | status |\n|---|---|---|---|---|")
            for g in summ[key]["goals"]:
                st = "n/a" if g["met"] is None else ("**met**" if g["met"] else "**missed**")
                rng = "–" if g["per_round_min"] is None else \
                    f"{report._fmt(g['per_round_min'])}–{report._fmt(g['per_round_max'])}"
                L.append(f"| {g['goal']} | {g['target']} | {report._fmt(g['value'])} | {rng} | {st} "
                         f"({g['rounds_met']} rounds) |")
            L.append("")
        raw = {k: v for k, v in doc["raw"].items() if k.endswith(PINNED) == (key == "pinned")}
        L.extend(report.latency_section(summ[key], raw, "no run"))
        if key in plots:
            L.append(f"\n![{key}]({plots[key]})\n")
    if summ.get("pinned_vs_shared"):
        L.append("\n## Pinned ÷ shared, same target, same round\n")
        L.append("| target | point | end-to-end p99 | per-round range | produce-ack p99 | per-round range |")
        L.append("|---|---|---|---|---|---|")
        for t, rows in summ["pinned_vs_shared"].items():
            for lab, row in rows.items():
                cells = []
                for r in (row.get("p99"), row.get("ack_p99")):
                    cells += ([report._fmt(r["of_medians"]),
                               f"{report._fmt(r['per_round_min'])}–{report._fmt(r['per_round_max'])}"]
                              if r else ["–", "–"])
                L.append(f"| {t} | {lab} | " + " | ".join(cells) + " |")
    if doc["failures"]:
        L.append("\n## Failures\n")
        L.extend(f"- round {f['round'] + 1}, {f['target']}: `{f['error']}`" for f in doc["failures"])
    path.write_text("\n".join(L) + "\n")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m kbroker.perf.latency_peers", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--targets", default="kbroker-shm,mock,tansu")
    ap.add_argument("--fractions", help="fractions of each target's own peak (default: curve_latency's)")
    ap.add_argument("--rates", help="fixed records/s offered to every target ('' for none; default: curve_latency's)")
    ap.add_argument("--pin", choices=("off", "on", "both"), default="off")
    ap.add_argument("--samples", type=int)
    ap.add_argument("--max-point-s", type=float)
    ap.add_argument("--drain-s", type=float)
    ap.add_argument("--quick", action="store_true", help="curve_latency's quick settings (smoke run)")
    ap.add_argument("--out", default=None, help="output folder (default docs/perf in the repo)")
    ap.add_argument("--stem", default="latency-peers")
    args = ap.parse_args(argv)
    args.argv = argv
    out = Path(args.out) if args.out else BB.default_out()
    out.mkdir(parents=True, exist_ok=True)
    doc = run(args)
    from . import report
    plots = {}
    for key in ("shared", "pinned"):
        name = f"{args.stem}-{key}.png"
        if key in doc["summary"] and report.plot_latency(
                out, doc["summary"][key], doc["meta"]["finished_utc"], name,
                f"End-to-end latency vs offered load, {'client and broker pinned apart' if key == 'pinned' else 'shared cores'}"
                f" (median, min–max over rounds) — {doc['meta']['finished_utc']}"):
            plots[key] = name
    doc["meta"]["plots"] = plots
    (out / f"{args.stem}.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    write_markdown(out / f"{args.stem}.md", doc, plots)
    for key, s in doc["summary"].items():
        for g in s.get("goals", []) if isinstance(s, dict) else []:
            H.progress(f"[{key}] goal {g['goal']}: {BB._fmt(g['value'])} ({g['rounds_met']} rounds) "
                       f"{'n/a' if g['met'] is None else ('met' if g['met'] else 'MISSED')}")
    H.progress(f"wrote {out / (args.stem + '.md')}" + (f"; {len(doc['failures'])} failures" if doc["failures"] else ""))
    return 1 if doc["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
