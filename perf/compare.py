"""Before/after table of two benchmark JSON files (``suite.json`` from ``perf.suite``, or ``request_bench``'s).

    python -m kbroker.perf.compare BEFORE.json AFTER.json [--threshold 0.05] [--md OUT.md] [--all]

Every figure summarized in both files (a median with its min–max over rounds) becomes one row: before,
after, after ÷ before, and a verdict. Whether higher or lower is better is read from the figure's name
(CPU, latency, RSS, seconds: lower; records/s, MB/s, ratios to a baseline: higher; offered rates and
counts: neither). A row is a **regression** when the median moved by at least the threshold the wrong
way; ``overlap`` says whether the two min–max ranges overlap, i.e. whether the change is inside the
round-to-round spread of a shared machine. Exit status 0 (the table is information, not a gate).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

LOWER = ("cpu", "rss", "_ms", "p50", "p90", "p99", "max", "seconds", "setup_s", "us_per", "hwm", "rtt")
HIGHER = ("records_per_s", "mb_per_s", "requests_per_s", "_ratio", "fetches", "met")
# leaves (exact, or by prefix) that are load settings or counts, not results
NEUTRAL_EXACT = ("requests", "samples", "window_s", "connections_open", "open_fds", "produce_errors",
                 "open_failures", "connections_dropped")
NEUTRAL_PREFIX = ("offered", "achieved", "response_bytes", "client_cpu")


def _is_summary(d) -> bool:
    return isinstance(d, dict) and "median" in d and "min" in d and "max" in d


def flatten(node, prefix: str = "") -> dict:
    """{path: summary} for every median/min/max summary in the tree; goals lists by their text."""
    out = {}
    if _is_summary(node):
        out[prefix] = node
    elif isinstance(node, dict):
        for k, v in node.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(node, list) and prefix.endswith("goals"):
        for g in node:
            if isinstance(g, dict) and isinstance(g.get("value"), (int, float)):
                lo = g.get("per_round_min", (g.get("range") or [None, None])[0])
                hi = g.get("per_round_max", (g.get("range") or [None, None])[1])
                name = g.get("goal", "?") + (f" [{g['figure']}]" if g.get("figure") else "")
                out[f"{prefix}.{name}"] = {"median": g["value"], "min": lo, "max": hi}
    return out


def direction(path: str) -> int:
    """+1 higher is better, -1 lower is better, 0 neither."""
    p = path.lower()
    leaf = p.rsplit(".", 1)[-1]
    if leaf in NEUTRAL_EXACT or leaf.startswith(NEUTRAL_PREFIX):
        return 0
    if p.startswith("goals.") or ".goals." in p:
        # goal values: "÷" ratios of throughput are higher-better, CPU/latency ones lower-better
        return -1 if any(k in p for k in ("cpu", "p99", "µs", "latency")) else 1
    if any(k in leaf for k in HIGHER):
        return 1
    if any(k in leaf for k in LOWER) or any(k in p for k in (".cpu", "peak_rss")):
        return -1
    return 0


def compare(before: dict, after: dict, threshold: float = 0.05) -> list[dict]:
    fb, fa = flatten(before.get("summary", before)), flatten(after.get("summary", after))
    rows = []
    for path in sorted(set(fb) & set(fa)):
        b, a = fb[path], fa[path]
        if not isinstance(b.get("median"), (int, float)) or not isinstance(a.get("median"), (int, float)):
            continue
        ratio = a["median"] / b["median"] if b["median"] else None
        d = direction(path)
        verdict = ""
        if ratio is not None and d:
            change = (ratio - 1.0) * d          # > 0: better
            if change <= -threshold:
                verdict = "regression"
            elif change >= threshold:
                verdict = "better"
            else:
                verdict = "same"
        overlap = None
        if None not in (b.get("min"), b.get("max"), a.get("min"), a.get("max")):
            overlap = not (a["max"] < b["min"] or a["min"] > b["max"])
        rows.append({"figure": path, "before": b, "after": a, "ratio": ratio, "direction": d,
                     "verdict": verdict, "ranges_overlap": overlap})
    return rows


def _f(v) -> str:
    if v is None:
        return "–"
    av = abs(v)
    if av >= 1000:
        return f"{v:,.0f}"
    if av >= 100:
        return f"{v:.0f}"
    if av >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}"


def _cell(s: dict) -> str:
    if s.get("min") is None or s.get("max") is None or s["min"] == s["max"]:
        return _f(s["median"])
    return f"{_f(s['median'])} ({_f(s['min'])}–{_f(s['max'])})"


def markdown(rows: list[dict], before_name: str, after_name: str, threshold: float, only_directed: bool) -> str:
    shown = [r for r in rows if r["direction"] or not only_directed]
    regressions = [r for r in shown if r["verdict"] == "regression"]
    solid = [r for r in regressions if r["ranges_overlap"] is False]
    lines = [f"Before: `{before_name}`; after: `{after_name}`. Medians with min–max over rounds; "
             f"after ÷ before; verdict at a {threshold:.0%} threshold in the figure's better direction "
             f"(↑ higher is better, ↓ lower); 'ranges overlap' = the change is inside the round-to-round spread.",
             "",
             f"{len(shown)} figures: {sum(r['verdict'] == 'better' for r in shown)} better, "
             f"{sum(r['verdict'] == 'same' for r in shown)} within ±{threshold:.0%}, {len(regressions)} worse by "
             f"≥ {threshold:.0%} (of which {len(solid)} with non-overlapping ranges).", "",
             "| figure | | before | after | after ÷ before | verdict | ranges overlap |",
             "|---|---|---|---|---|---|---|"]
    for r in shown:
        arrow = {1: "↑", -1: "↓", 0: ""}[r["direction"]]
        verdict = f"**{r['verdict']}**" if r["verdict"] == "regression" else r["verdict"]
        ov = {True: "yes", False: "no", None: "–"}[r["ranges_overlap"]]
        lines.append(f"| {r['figure']} | {arrow} | {_cell(r['before'])} | {_cell(r['after'])} | "
                     f"{_f(r['ratio'])} | {verdict} | {ov} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kbroker.perf.compare", description=__doc__.split("\n")[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--threshold", type=float, default=0.05, help="relative change that counts (default 0.05)")
    ap.add_argument("--md", help="also write the table to this Markdown file")
    ap.add_argument("--all", action="store_true", help="also list figures with no better direction")
    a = ap.parse_args(argv)
    before, after = json.loads(Path(a.before).read_text()), json.loads(Path(a.after).read_text())
    rows = compare(before, after, a.threshold)
    text = markdown(rows, a.before, a.after, a.threshold, not a.all)
    print(text)
    if a.md:
        Path(a.md).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
