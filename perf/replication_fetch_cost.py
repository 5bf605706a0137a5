"""Leader cost per follower fetch (not a test): two three-broker clusters side by side, A with the
environment of this process, B with --env-b (e.g. PYTHONPATH=<a copy of the tree with a change>),
interleaved rounds of a full-speed acks=1 run of --mb MB on an RF=3 and an RF=1 topic led by broker 0
(A RF=3, A RF=1, B RF=3, B RF=1, then reversed).

Per run: the leader's user/system CPU (/proc), its Fetch requests (the metrics endpoint's request
counter; at RF=1 the only fetches are the idle polls of the other topic's followers) and, with
--py-spy, the leader's event-loop samples outside the selector's wait (py-spy record --nonblocking). Per round
and variant: (RF=3 - RF=1) leader user µs, loop-thread CPU µs (schedstat) and busy samples per follower fetch added by RF=3 — figures
that depend on the machine's load far less than a ratio of CPU seconds.

    .venv/bin/python -m kbroker.perf.replication_fetch_cost --env-b PYTHONPATH=/tmp/copy --mb 256 --rounds 3

``--acks-all N``: instead, per round and cluster (A, B, then B, A), N one-record acks=all requests with
one in flight (confluent-kafka, the steady state of a replicated partition: each request answered
once both followers fetched it) on the RF=3 topic: the leader's CPU (user+sys), its loop thread's
(schedstat) and its Fetch requests per request (hardware counters, perf stat's instructions, are not
available on the development VM: callgrind counts instructions, profile_request callgrind --rf3); per round B ÷ A. ``--env-a`` sets cluster A's
environment (e.g. the base tree's PYTHONPATH) so that this tool can run from the new tree:

    PYTHONPATH=$PWD .venv/bin/python -m kbroker.perf.replication_fetch_cost --acks-all 3000 \
        --env-a PYTHONPATH=/tmp/base --env-b PYTHONPATH=$PWD --rounds 5
"""
from __future__ import annotations

import argparse
import contextlib
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from kbroker.testing import LocalCluster, free_port

from .replication_bench import TICK, cpu_run, cpu_split, create, parse_settings

RATE = 500          # py-spy samples per second
IDLE = ("EpollSelector.select", "select (selectors.py")   # the loop's wait (py-spy --idle off is not enough)


def fetch_requests(port: int) -> int:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(int(float(m.group(1))) for m in
               re.finditer(r'^kafka_network_requestmetrics_requests_total\{[^}]*"Fetch"[^}]*\}\s+(\S+)', text, re.M))


def spy_start(pid: int, out: Path):
    return subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--nonblocking",
                             "-r", str(RATE),
                             "-f", "raw", "-o", str(out), "-p", str(pid)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def spy_stop(proc, out: Path) -> int:
    """Busy samples of the broker's event-loop (main) thread: those not waiting in the selector."""
    proc.send_signal(signal.SIGINT)
    proc.wait(60)
    n = 0
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        # The loop thread's stacks start at the process's entry (runpy / kbroker __main__).
        if "_run_module_as_main" in stack.split(";", 2)[0] or "(runpy" in stack.split(";", 1)[0]:
            if not stack.rsplit(";", 1)[-1].startswith(IDLE):
                n += int(count)
    return n


def loop_cpu_ns(pid: int) -> int:
    """On-CPU nanoseconds of the process's main (event-loop) thread (schedstat: ns, not ticks)."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def loop_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of the process's main (event-loop) thread alone."""
    with open(f"/proc/{pid}/task/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICK, int(fields[12]) / TICK


def strace_start(pid: int, out: Path):
    return subprocess.Popen(["strace", "-c", "-f", "-o", str(out), "-p", str(pid)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def strace_stop(proc, out: Path) -> dict:
    """strace -c's table -> {syscall: (calls, errors)}."""
    proc.send_signal(signal.SIGINT)
    proc.wait(60)
    counts = {}
    for line in out.read_text().splitlines():
        f = line.split()
        if len(f) >= 5 and f[0][0].isdigit() and f[-1] != "total":
            calls = int(f[3])
            errors = int(f[4]) if len(f) == 6 else 0
            counts[f[-1]] = (calls, errors)
    return counts


def one_run(c, metrics_port, topic, mb, spy: bool, tmp: Path, trace: bool = False):
    pid = c.brokers[0].pid
    f0 = fetch_requests(metrics_port)
    u0, s0 = cpu_split(pid)
    n0 = loop_cpu_ns(pid)
    lu0, ls0 = loop_split(pid)
    out = tmp / f"spy-{one_run.n}-{topic}.txt"
    one_run.n += 1
    proc = spy_start(pid, out) if spy else None
    tr = strace_start(pid, tmp / f"strace-{one_run.n}-{topic}.txt") if trace else None
    if proc or tr:
        time.sleep(1.0)         # py-spy / strace attached
    cpu_run(c, c.bootstrap, topic, 0, mb)
    samples = spy_stop(proc, out) if proc else 0
    syscalls = strace_stop(tr, tmp / f"strace-{one_run.n}-{topic}.txt") if tr else {}
    u1, s1 = cpu_split(pid)
    n1 = loop_cpu_ns(pid)
    lu1, ls1 = loop_split(pid)
    f1 = fetch_requests(metrics_port)
    return {"user": u1 - u0, "sys": s1 - s0, "loop": (n1 - n0) / 1e9, "loop_user": lu1 - lu0, "loop_sys": ls1 - ls0, "fetches": f1 - f0, "samples": samples,
            "syscalls": syscalls}



one_run.n = 0        # profile file numbering


def acks_all_producer(c):
    return Producer({"bootstrap.servers": c.bootstrap, "acks": "all", "linger.ms": 0, "batch.num.messages": 1,
                     "max.in.flight.requests.per.connection": 1, "enable.idempotence": False,
                     "socket.nagle.disable": True, "message.timeout.ms": 60000})


def acks_all_run(c, p, metrics_port, topic, n):
    """n one-record acks=all requests, one in flight, from producer ``p`` to ``topic`` (led by broker
    0) -> the leader's CPU and Fetch requests over them."""
    pid = c.brokers[0].pid
    failed = []

    def sent(err, _msg):
        if err:
            failed.append(err)
    for _ in range(50):                 # warm: connections, metadata
        p.produce(topic, b"w" * 100, partition=0, on_delivery=sent)
    if p.flush(60):
        raise RuntimeError("warm-up not delivered")
    f0 = fetch_requests(metrics_port)
    u0, s0 = cpu_split(pid)
    n0 = loop_cpu_ns(pid)
    t0 = time.monotonic()
    for _ in range(n):
        p.produce(topic, b"x" * 100, partition=0, on_delivery=sent)
        p.poll(0)
    if p.flush(max(60.0, n / 100)):
        raise RuntimeError("acks=all run not delivered")
    wall = time.monotonic() - t0
    u1, s1 = cpu_split(pid)
    n1 = loop_cpu_ns(pid)
    f1 = fetch_requests(metrics_port)
    if failed:
        raise RuntimeError(f"{len(failed)} failed deliveries: {failed[0]}")
    return {"cpu": (u1 - u0) + (s1 - s0), "user": u1 - u0, "loop": (n1 - n0) / 1e9, "fetches": f1 - f0,
            "requests": n, "wall": wall}


def _median_range(vals) -> str:
    v = sorted(vals)
    return f"median {v[len(v) // 2]:.2f} (range {v[0]:.2f}-{v[-1]:.2f})"


def acks_all_rounds(clusters, n, rounds) -> None:
    per = {label: [] for label in clusters}
    ratios = []
    labels = list(clusters)
    producers = {label: acks_all_producer(c) for label, (c, _port) in clusters.items()}
    try:
        for rnd in range(rounds):
            got = {}
            for label in (labels if rnd % 2 == 0 else labels[::-1]):
                c, port = clusters[label]
                got[label] = r = acks_all_run(c, producers[label], port, "cpu3", n)
                per[label].append(r)
                k = r["requests"]
                print(f"round {rnd + 1} {label}: {k} acks=all requests in {r['wall']:.2f} s, leader CPU "
                      f"{r['cpu'] * 1e6 / k:.1f} us/request (user {r['user'] * 1e6 / k:.1f}), loop thread "
                      f"{r['loop'] * 1e6 / k:.1f} us/request, {r['fetches'] / k:.2f} fetches/request", flush=True)
            if len(labels) == 2:
                a, b = got[labels[0]], got[labels[1]]
                ratios.append((b["loop"] / a["loop"], b["cpu"] / a["cpu"], b["user"] / max(a["user"], 1e-9)))
                print(f"round {rnd + 1}: {labels[1]} / {labels[0]} loop thread {ratios[-1][0]:.3f}, process CPU "
                      f"{ratios[-1][1]:.3f}, user CPU {ratios[-1][2]:.3f}", flush=True)
    finally:
        for p in producers.values():
            p.flush(30)
        producers.clear()
    for label, rs in per.items():
        print(f"{label}: loop thread us/request {_median_range([r['loop'] * 1e6 / r['requests'] for r in rs])}; "
              f"process CPU us/request {_median_range([r['cpu'] * 1e6 / r['requests'] for r in rs])}; "
              f"user CPU us/request {_median_range([r['user'] * 1e6 / r['requests'] for r in rs])}; "
              f"fetches/request {_median_range([r['fetches'] / r['requests'] for r in rs])}")
    if ratios:
        print(f"{labels[1]} / {labels[0]} same-round ratio: loop thread {_median_range([x[0] for x in ratios])}; "
              f"process CPU {_median_range([x[1] for x in ratios])}; user CPU {_median_range([x[2] for x in ratios])}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env-a", default="", metavar="K=V,K=V", help="environment of cluster A's brokers")
    ap.add_argument("--env-b", default="", metavar="K=V,K=V", help="environment of cluster B's brokers")
    ap.add_argument("--acks-all", type=int, default=0, metavar="N",
                    help="N one-record acks=all requests per run instead of the acks=1 MB runs")
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--py-spy", action="store_true", help="also count the leader's busy loop samples")
    ap.add_argument("--strace", action="store_true",
                    help="count the leader's syscalls (strace -c -f; slows it: CPU figures of such a run mean little)")
    ap.add_argument("--keep", default="", help="directory to keep the py-spy raw profiles in")
    args = ap.parse_args(argv)
    base = {"log.segment.bytes": 256 << 20}
    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fetchcost-")))
        spy_dir = Path(args.keep) if args.keep else root
        clusters = {}
        for label, env in (("A", parse_settings(args.env_a) or None), ("B", parse_settings(args.env_b) or None)):
            c = LocalCluster(root / label, brokers=3, overrides=base, env=env)
            port = free_port()
            c.brokers[0].extra = {"kbroker.metrics.port": port}
            stack.enter_context(c)
            admin = AdminClient({"bootstrap.servers": c.bootstrap})
            create(admin, "cpu3", 3, leader=0)
            create(admin, "cpu1", 1, leader=0)
            clusters[label] = (c, port)
        if args.acks_all:
            acks_all_rounds(clusters, args.acks_all, args.rounds)
            return 0
        for c, _port in clusters.values():           # warm-up: segments, page cache, first connections
            cpu_run(c, c.bootstrap, "cpu3", 0, 32)
        runs = [(label, t) for label in clusters for t in ("cpu3", "cpu1")]
        per = {label: [] for label in clusters}
        for rnd in range(args.rounds):
            got = {}
            for label, topic in (runs if rnd % 2 == 0 else runs[::-1]):
                c, port = clusters[label]
                got[label, topic] = one_run(c, port, topic, args.mb, args.py_spy, spy_dir, args.strace)
            for label in clusters:
                r3, r1 = got[label, "cpu3"], got[label, "cpu1"]
                extra = r3["fetches"] - r1["fetches"]
                du = (r3["user"] - r1["user"]) * 1e6 / extra
                dl = (r3["loop"] - r1["loop"]) * 1e6 / extra
                ds = (r3["samples"] - r1["samples"]) / extra if args.py_spy else float("nan")
                per[label].append((du, ds, dl, r3["user"] / r1["user"]))
                print(f"round {rnd + 1} {label}: RF=3 user/sys {r3['user']:.2f}/{r3['sys']:.2f} s, loop thread "
                      f"{r3['loop']:.3f} s, {r3['fetches']} fetches, {r3['samples']} busy samples; RF=1 user/sys "
                      f"{r1['user']:.2f}/{r1['sys']:.2f} s, loop thread {r1['loop']:.3f} s, {r1['fetches']} fetches, "
                      f"{r1['samples']} busy samples; added per follower fetch: user {du:.1f} us, loop thread "
                      f"{dl:.1f} us, busy samples {ds:.4f} ({ds * 1e6 / RATE:.1f} us); loop thread user/sys RF=3 "
                      f"{r3['loop_user']:.2f}/{r3['loop_sys']:.2f} s, RF=1 {r1['loop_user']:.2f}/{r1['loop_sys']:.2f} s",
                      flush=True)
                if args.strace:
                    names = sorted(set(r3["syscalls"]) | set(r1["syscalls"]),
                                   key=lambda k: -r3["syscalls"].get(k, (0, 0))[0])
                    print("  syscalls RF=3 / RF=1 / added per follower fetch (errors): " + ", ".join(
                        f"{k} {r3['syscalls'].get(k, (0, 0))[0]} / {r1['syscalls'].get(k, (0, 0))[0]} / "
                        f"{(r3['syscalls'].get(k, (0, 0))[0] - r1['syscalls'].get(k, (0, 0))[0]) / extra:.2f} "
                        f"({r3['syscalls'].get(k, (0, 0))[1]})" for k in names[:10]), flush=True)
        for label, vals in per.items():
            ls = sorted(v[2] for v in vals)
            ur = sorted(v[3] for v in vals)
            print(f"{label}: added loop-thread CPU (user+sys) per follower fetch median {ls[len(ls) // 2]:.1f} us "
                  f"(range {ls[0]:.1f}-{ls[-1]:.1f}); leader user RF=3/RF=1 median {ur[len(ur) // 2]:.2f} "
                  f"(range {ur[0]:.2f}-{ur[-1]:.2f})")
            us = sorted(v[0] for v in vals)
            ss = sorted(v[1] for v in vals)
            print(f"{label}: added leader user per follower fetch median {us[len(us) // 2]:.1f} us "
                  f"(range {us[0]:.1f}-{us[-1]:.1f}); busy loop samples per fetch median {ss[len(ss) // 2]:.4f} "
                  f"= {ss[len(ss) // 2] * 1e6 / RATE:.1f} us (range {ss[0] * 1e6 / RATE:.1f}-{ss[-1] * 1e6 / RATE:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
