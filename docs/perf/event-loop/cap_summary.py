"""Summarise cap_exp.sh's runs: each figure per loop (median, min-max over runs) and uvloop ÷ asyncio per
pair (median, range). Writes the per-run values as JSON (argument 1) and prints a Markdown table."""
import json
import statistics
import sys
from pathlib import Path


def figures(path: Path) -> dict:
    raw = json.loads(path.read_text())["raw"]
    cap, kcat = raw["capacity"]["kbroker-shm"][0], raw["kcat"]["kbroker-shm"][0]
    out = {"capacity.produce.mb_per_s": cap["produce"]["mb_per_s"], "capacity.produce_ratio": cap["produce_ratio"],
           "capacity.fetch.mb_per_s": cap["fetch"]["mb_per_s"], "capacity.fetch_ratio": cap["fetch_ratio"],
           "capacity.fetch.cpu_s_per_gb": cap["fetch"]["broker_cpu_s"] / (cap["fetch"]["bytes"] / 1e9)}
    for side in ("produce", "fetch"):
        out[f"kcat.{side}.mb_per_s"] = kcat[side]["mb_per_s"]
        out[f"kcat.{side}.cpu_s_per_gb"] = kcat[side]["cpu_s_per_gb"]
    return out


def fmt(x):
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


runs = {loop: [] for loop in ("asyncio", "uvloop")}
i = 1
while all(Path(f"/tmp/cap-{loop}-{i}/foundation.json").exists() for loop in runs):
    for loop in runs:
        runs[loop].append(figures(Path(f"/tmp/cap-{loop}-{i}/foundation.json")))
    i += 1
Path(sys.argv[1]).write_text(json.dumps(runs, indent=1) + "\n")
print(f"{len(runs['asyncio'])} pairs\n")
print("| figure | asyncio | uvloop | uvloop ÷ asyncio per pair (median, range) |\n|---|---|---|---|")
for k in runs["asyncio"][0]:
    a = [r[k] for r in runs["asyncio"]]
    u = [r[k] for r in runs["uvloop"]]
    q = [y / x for x, y in zip(a, u) if x]
    print(f"| {k} | {fmt(statistics.median(a))} ({fmt(min(a))}–{fmt(max(a))}) | {fmt(statistics.median(u))} "
          f"({fmt(min(u))}–{fmt(max(u))}) | {statistics.median(q):.2f} ({min(q):.2f}–{max(q):.2f}) |")
