"""Scale-out on one host: one kbroker broker against two, on the same machine, at saturation.

    python -m kbroker.perf.scaleout_bench [--rounds 3] [--batches 1024] [--fetch-s 4] [--out docs/perf]
                                         [--stem scale-out] [--quick]

A kbroker process drives one event loop, so a many-core host runs several brokers. This measures what a
second broker on the same host adds, with the load generators on the same cores:

* two clusters side by side (``LocalCluster``, real ZooKeeper, log dirs on tmpfs): ``one`` (1 broker)
  and ``two`` (2 brokers); per round a fresh 4-partition topic on each, partitions 0-1 led by broker 0
  and 2-3 by the last broker (so on ``two`` half the partitions live on each broker);
* capacity produce: ``--batches`` pre-built ~512 KiB RecordBatches of 1 KiB records as raw Produce v7
  (``broker_bench``'s frames and raw-socket client, 5 in flight), two connections sending at once, each
  to the leader of its two partitions; MB/s = request bytes ÷ time from the start to the last answer;
* kcat fetch: four ``kcat -C -p P -o beginning -e`` loops at once (one per partition), each repeated for
  ``--fetch-s``; MB/s = record value bytes read ÷ the time to the last exit;
* per window: every broker's CPU (cores), the load generators' (this process's client threads; the kcat
  children), and the whole machine's busy cores (``/proc/stat``), to say what limits the ratio.

The two configurations alternate within a round (order rotated per round); the figure is the per-round
ratio two ÷ one of total MB/s (goal >= 1.5), median and range. Every loop is bounded by a count and a
time. Output: ``<out>/<stem>.json`` and ``<out>/<stem>.md``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from kbroker.testing import LocalCluster

from . import broker_bench as BB
from . import harness as H
from .targets import wait_topic

GOAL = 1.5
PARTITIONS = 4
FULL = {"rounds": 3, "batches": 1024, "fetch_s": 4.0}
QUICK = {"rounds": 1, "batches": 16, "fetch_s": 0.5}
RUN_TIMEOUT = 120.0


class _Window:
    def __init__(self, pids: dict[int, int]):
        self.pids = pids
        self.t0 = time.monotonic()
        self.c0 = ({b: H.cpu_seconds(p) for b, p in pids.items()}, time.process_time(), H.children_cpu_seconds(),
                   H.machine_busy_seconds())

    def close(self) -> dict:
        wall = time.monotonic() - self.t0
        brokers0, client0, kids0, busy0 = self.c0
        brokers = {b: round((H.cpu_seconds(p) - brokers0[b]) / wall, 3) for b, p in self.pids.items()}
        return {"seconds": wall, "broker_cpu_cores": brokers, "brokers_cpu_cores": round(sum(brokers.values()), 3),
                "client_cpu_cores": round((time.process_time() - client0) / wall, 3),
                "kcat_cpu_cores": round((H.children_cpu_seconds() - kids0) / wall, 3),
                "machine_busy_cores": round((H.machine_busy_seconds() - busy0) / wall, 3)}


def _create(cluster: LocalCluster, topic: str) -> list[int]:
    """A 4-partition RF=1 topic, partitions 0-1 on the first broker and 2-3 on the last; returns each
    partition's leader id."""
    from confluent_kafka.admin import AdminClient, NewTopic
    ids = sorted(cluster.brokers)
    leaders = [ids[0], ids[0], ids[-1], ids[-1]]
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "client.id": "kbroker-perf-setup"})
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS,
                                   replica_assignment=[[b] for b in leaders])])[topic].result(30)
    wait_topic(cluster.bootstrap, topic, PARTITIONS)
    return leaders


def _produce(cluster: LocalCluster, topic: str, leaders: list[int], batch: bytes, per_batch: int,
             nbatches: int) -> dict:
    sets = BB.produce_frame_sets(topic, batch, nbatches)      # connection i writes partitions 2i and 2i+1
    addrs = [("127.0.0.1", cluster.brokers[leaders[2 * i]].port) for i in range(len(sets))]
    results, errors = [None] * len(sets), []

    def one(i):
        try:
            results[i] = H.produce_frames(addrs[i], [sets[i]], timeout=RUN_TIMEOUT)
        except Exception as e:  # noqa: BLE001 - raised below
            errors.append(e)

    win = _Window({b: cluster.brokers[b].pid for b in cluster.brokers})
    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(sets))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(RUN_TIMEOUT + 10)
    w = win.close()
    if errors or any(r is None for r in results):
        raise RuntimeError(f"capacity produce failed: {errors[:1]!r}")
    for res in results:
        for _pr in BB.produce_partition_responses(res["responses"]):
            pass
    nbytes = sum(r["bytes"] for r in results)
    return dict(w, bytes=nbytes, mb_per_s=nbytes / BB.MB / w["seconds"], records=per_batch * nbatches)


def _kcat_fetch(cluster: LocalCluster, topic: str, expected: int, seconds: float, env: dict) -> dict:
    """Four kcat consumers at once, one per partition, each re-reading its partition for ``seconds``."""
    per = [0] * PARTITIONS
    errors = []
    deadline = time.monotonic() + seconds

    def loop(p):
        try:
            for _ in range(1000):
                r = subprocess.run(["kcat", "-C", "-b", cluster.bootstrap, "-t", topic, "-p", str(p), "-o", "beginning",
                                    "-e", "-X", "client.id=kbroker-perf"], env=env, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=RUN_TIMEOUT)
                if r.returncode != 0:
                    raise RuntimeError(f"kcat consume failed ({r.returncode}): {r.stderr[-300:]!r}")
                ends = {int(q): int(o) for q, o in BB.END_RE.findall(r.stderr.decode(errors="replace"))}
                if ends.get(p) != expected:
                    raise RuntimeError(f"kcat read partition {p} to {ends.get(p)}, expected {expected}")
                per[p] += expected
                if time.monotonic() >= deadline:
                    return
        except Exception as e:  # noqa: BLE001 - raised below
            errors.append(e)

    win = _Window({b: cluster.brokers[b].pid for b in cluster.brokers})
    threads = [threading.Thread(target=loop, args=(p,), daemon=True) for p in range(PARTITIONS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + RUN_TIMEOUT + 10)
    w = win.close()
    if errors:
        raise RuntimeError(f"kcat fetch failed: {errors[0]!r}")
    nbytes = sum(per) * BB.RECORD_KCAT
    return dict(w, records=sum(per), bytes=nbytes, mb_per_s=nbytes / BB.MB / w["seconds"])


def _delete(cluster: LocalCluster, topic: str) -> None:
    from confluent_kafka.admin import AdminClient
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "client.id": "kbroker-perf-setup"})
    try:
        admin.delete_topics([topic])[topic].result(30)
    except Exception as e:  # noqa: BLE001 - tmpfs space only; the cluster is removed at the end anyway
        H.progress(f"delete {topic}: {e!r}")


def summarize(rounds: list[dict]) -> dict:
    out = {}
    for phase in ("produce", "fetch"):
        fig = {}
        for conf in ("one", "two"):
            vals = [r.get(conf, {}).get(phase) for r in rounds]
            fig[conf] = {k: H.summary([v[k] if v else None for v in vals])
                         for k in ("mb_per_s", "brokers_cpu_cores", "client_cpu_cores", "kcat_cpu_cores",
                                   "machine_busy_cores")}
        per = [r["two"][phase]["mb_per_s"] / r["one"][phase]["mb_per_s"] for r in rounds
               if r.get("one", {}).get(phase) and r.get("two", {}).get(phase)]
        s = H.summary(per)
        fig["ratio_two_over_one"] = s
        fig["goal"] = {"goal": f"{phase}: total MB/s, 2 brokers ÷ 1 broker (same host, same load generators)",
                       "target": f">= {GOAL}", "value": s["median"], "per_round_min": s["min"],
                       "per_round_max": s["max"], "met": None if s["median"] is None else s["median"] >= GOAL}
        out[phase] = fig
    return out


def run(args) -> dict:
    cfg = dict(QUICK if args.quick else FULL)
    for k in ("rounds", "batches", "fetch_s"):
        if getattr(args, k) is not None:
            cfg[k] = getattr(args, k)
    cfg["batches"] -= cfg["batches"] % 4          # whole batches per partition
    root = Path(tempfile.mkdtemp(prefix="kbroker-scaleout-", dir="/dev/shm"))
    overrides = {"auto.create.topics.enable": "false", "socket.receive.buffer.bytes": "-1"}
    clusters = {"one": LocalCluster(root / "one", brokers=1, num_partitions=PARTITIONS, overrides=overrides),
                "two": LocalCluster(root / "two", brokers=2, num_partitions=PARTITIONS, overrides=overrides)}
    batch, per_batch = BB.build_batch()
    rounds, failures = [], []
    t_start, load0 = time.monotonic(), os.getloadavg()
    try:
        for c in clusters.values():
            c.start()
        env = H.kcat_env(root)
        order = list(clusters)
        for rnd in range(cfg["rounds"]):
            row = {"round": rnd, "load_at_start": os.getloadavg()}
            for conf in (order if rnd % 2 == 0 else order[::-1]):
                c = clusters[conf]
                topic = f"scaleout-r{rnd}"
                try:
                    leaders = _create(c, topic)
                    prod = _produce(c, topic, leaders, batch, per_batch, cfg["batches"])
                    fet = _kcat_fetch(c, topic, per_batch * cfg["batches"] // PARTITIONS, cfg["fetch_s"], env)
                    row[conf] = {"leaders": leaders, "produce": prod, "fetch": fet}
                    H.progress(f"round {rnd + 1} {conf}: produce {prod['mb_per_s']:.0f} MB/s (brokers "
                               f"{prod['brokers_cpu_cores']} cores, client {prod['client_cpu_cores']}, machine "
                               f"{prod['machine_busy_cores']}); kcat fetch {fet['mb_per_s']:.0f} MB/s (brokers "
                               f"{fet['brokers_cpu_cores']}, kcat {fet['kcat_cpu_cores']}, machine "
                               f"{fet['machine_busy_cores']})")
                except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                    failures.append({"round": rnd, "config": conf, "error": repr(e)})
                    H.progress(f"round {rnd + 1} {conf}: FAILED {e!r}")
                finally:
                    _delete(c, topic)
            row["load_at_end"] = os.getloadavg()
            rounds.append(row)
    finally:
        for c in clusters.values():
            try:
                c.stop()
            except Exception as e:  # noqa: BLE001
                failures.append({"round": None, "config": "stop", "error": repr(e)})
        shutil.rmtree(root, ignore_errors=True)
    return {"meta": {"command": "python -m kbroker.perf.scaleout_bench " + " ".join(args.argv),
                     "mode": "quick" if args.quick else "full", "config": cfg, "batch_bytes": len(batch),
                     "records_per_batch": per_batch, "machine": H.machine_facts(), "git_commit": BB.git_commit(),
                     "tree_dirty": BB.tree_dirty(), "started_load_avg": load0, "finished_load_avg": os.getloadavg(),
                     "finished_utc": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                     "wall_seconds": time.monotonic() - t_start},
            "failures": failures, "rounds": rounds, "summary": summarize(rounds)}


def write_markdown(path: Path, doc: dict) -> None:
    meta, summ = doc["meta"], doc["summary"]
    f = BB._fmt

    def cell(s):
        return "–" if s["median"] is None else f"{f(s['median'])} ({f(s['min'])}–{f(s['max'])})"
    L = ["# Scale-out on one host: one broker against two\n",
         f"Generated by `{meta['command']}` on {meta['finished_utc']} ({meta['config']['rounds']} round(s), "
         f"{meta['wall_seconds']:.0f} s wall, tree `{meta['git_commit']}`, {meta['machine']['nproc']} CPUs; load "
         f"average {meta['started_load_avg'][0]:.2f} at the start, {meta['finished_load_avg'][0]:.2f} at the end). "
         "Medians with the min–max over rounds; the ratio is taken within each round.\n",
         "| goal | wanted | median | per-round range | status |\n|---|---|---|---|---|"]
    for phase in ("produce", "fetch"):
        g = summ[phase]["goal"]
        st = "n/a" if g["met"] is None else ("**met**" if g["met"] else "**missed**")
        rng = "–" if g["per_round_min"] is None else f"{f(g['per_round_min'])}–{f(g['per_round_max'])}"
        L.append(f"| {g['goal']} | {g['target']} | {f(g['value'])} | {rng} | {st} |")
    L.append("\n| workload | brokers | total MB/s | brokers' CPU, cores | load generators, cores | "
             "machine busy, cores |\n|---|---|---|---|---|---|")
    for phase, gen in (("produce", "client_cpu_cores"), ("fetch", "kcat_cpu_cores")):
        for conf, n in (("one", 1), ("two", 2)):
            s = summ[phase][conf]
            L.append(f"| {'capacity produce' if phase == 'produce' else 'kcat fetch'} | {n} | {cell(s['mb_per_s'])} | "
                     f"{cell(s['brokers_cpu_cores'])} | {cell(s[gen])} | {cell(s['machine_busy_cores'])} |")
    L.append(f"\nMethod: see `perf/scaleout_bench.py`. {meta['config']['batches']} batches of "
             f"{meta['batch_bytes']:,} B ({meta['records_per_batch']} records of 1 KiB) per configuration and round; "
             f"kcat fetch phases of {meta['config']['fetch_s']} s. The machine's busy cores include the load "
             "generators: where they reach the core count, the host, not a broker, is the limit.\n")
    if doc["failures"]:
        L.append("## Failures\n")
        L.extend(f"- round {'–' if x['round'] is None else x['round'] + 1}, {x['config']}: `{x['error']}`"
                 for x in doc["failures"])
    path.write_text("\n".join(L) + "\n")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m kbroker.perf.scaleout_bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--batches", type=int, help="capacity batches (~512 KiB) per configuration and round")
    ap.add_argument("--fetch-s", type=float, help="seconds of each kcat fetch phase")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 round, tiny volumes")
    ap.add_argument("--out", default=None, help="output folder (default docs/perf in the repo)")
    ap.add_argument("--stem", default="scale-out")
    args = ap.parse_args(argv)
    args.argv = argv
    out = Path(args.out) if args.out else BB.default_out()
    out.mkdir(parents=True, exist_ok=True)
    doc = run(args)
    (out / f"{args.stem}.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    write_markdown(out / f"{args.stem}.md", doc)
    for phase in ("produce", "fetch"):
        g = doc["summary"][phase]["goal"]
        H.progress(f"goal {g['goal']}: {BB._fmt(g['value'])} "
                   f"{'n/a' if g['met'] is None else ('met' if g['met'] else 'MISSED')}")
    return 1 if doc["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
