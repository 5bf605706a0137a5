"""Replication benchmark (not a test): three local brokers (kbroker.testing.LocalCluster).

1. Latency at a fixed rate on an RF=3 topic (min.insync.replicas=2): confluent-kafka producer,
   acks=all vs acks=1, time from produce() to the delivery callback; p50/p99 and the difference.
2. Leader CPU per GB: the leader process's user+system CPU (/proc/<pid>/stat) while a producer
   pushes --gb of data at full speed (acks=1), on an RF=3 and on an RF=1 topic led by the same
   broker; plus the whole cluster's CPU per GB for RF=3.

    .venv/bin/python perf/replication_bench.py [--rate 2000] [--seconds 10] [--mb 256]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kbroker.testing import LocalCluster, wait_until

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK      # utime + stime


def create(admin, name, rf, leader=None, brokers=3):
    replicas = None
    if leader is not None:
        others = [b for b in range(brokers) if b != leader][:rf - 1]
        replicas = {0: [leader] + others}
    topic = (NewTopic(name, num_partitions=1, replica_assignment=[replicas[0]], config={"min.insync.replicas": str(min(rf, 2))})
             if replicas else NewTopic(name, 1, rf, config={"min.insync.replicas": str(min(rf, 2))}))
    admin.create_topics([topic])[name].result(30)
    md = wait_until(lambda: (lambda p: p if p.leader >= 0 and len(p.isrs) == rf else None)(
        admin.list_topics(name, timeout=10).topics[name].partitions.get(0)), 30, f"{name} ready")
    return md.leader


def latency_run(bootstrap, topic, acks, rate, seconds, size=100):
    p = Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 0, "enable.idempotence": acks == "all"})
    lat = []
    payload = b"x" * size

    def cb(err, msg, t0):
        if err is None:
            lat.append(time.perf_counter() - t0)
    p.produce(topic, payload, partition=0)
    p.flush(10)
    step = 0.005
    per = max(1, int(rate * step))
    end = time.monotonic() + seconds
    nxt = time.monotonic()
    while time.monotonic() < end:
        for _ in range(per):
            t0 = time.perf_counter()
            p.produce(topic, payload, partition=0, on_delivery=lambda e, m, t0=t0: cb(e, m, t0))
        nxt += step
        # Serve delivery callbacks while waiting for the next step (a sleep would add its time).
        p.poll(0)
        while (left := nxt - time.monotonic()) > 0:
            p.poll(left)
    p.flush(30)
    lat.sort()
    return lat


def pct(sorted_vals, q):
    return sorted_vals[min(len(sorted_vals) - 1, int(q * len(sorted_vals)))] * 1000


def cpu_run(c, bootstrap, topic, leader, mb, size=1000):
    p = Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 5, "batch.size": 262144,
                  "queue.buffering.max.kbytes": 262144})
    n = mb * 1024 * 1024 // size
    payload = b"y" * size
    pids = {b: c.brokers[b].pid for b in c.brokers}
    before = {b: cpu_seconds(pid) for b, pid in pids.items()}
    t0 = time.monotonic()
    for _ in range(n):
        while True:
            try:
                p.produce(topic, payload, partition=0)
                break
            except BufferError:
                p.poll(0.01)
        p.poll(0)
    p.flush(120)
    # Let the followers finish copying before reading the CPU counters.
    time.sleep(2)
    wall = time.monotonic() - t0
    after = {b: cpu_seconds(pid) for b, pid in pids.items()}
    gb = n * size / 1e9
    used = {b: after[b] - before[b] for b in pids}
    return used[leader] / gb, sum(used.values()) / gb, wall


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=int, default=2000, help="records/s for the latency runs")
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--mb", type=int, default=256, help="MB produced per CPU run")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="replbench-") as root, \
            LocalCluster(root, brokers=3, overrides={"log.segment.bytes": 256 << 20}) as c:
        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        create(admin, "lat", 3)
        res = {}
        for acks in ("1", "all"):
            lat = latency_run(c.bootstrap, "lat", acks, args.rate, args.seconds)
            res[acks] = (pct(lat, 0.5), pct(lat, 0.99), len(lat))
            print(f"acks={acks:>3}: {res[acks][2]} records at {args.rate}/s: p50 {res[acks][0]:.2f} ms, "
                  f"p90 {pct(lat, 0.9):.2f} ms, p99 {res[acks][1]:.2f} ms, max {lat[-1] * 1000:.1f} ms")
        print(f"acks=all minus acks=1: p50 {res['all'][0] - res['1'][0]:+.2f} ms, "
              f"p99 {res['all'][1] - res['1'][1]:+.2f} ms")
        leader = 0
        create(admin, "cpu3", 3, leader=leader)
        create(admin, "cpu1", 1, leader=leader)
        l3, total3, wall3 = cpu_run(c, c.bootstrap, "cpu3", leader, args.mb)
        l1, total1, wall1 = cpu_run(c, c.bootstrap, "cpu1", leader, args.mb)
        print(f"leader CPU per GB: RF=3 {l3:.2f} s, RF=1 {l1:.2f} s, ratio {l3 / l1:.2f} "
              f"({args.mb} MB each, {wall3:.1f} s / {wall1:.1f} s)")
        print(f"cluster CPU per GB: RF=3 {total3:.2f} s, RF=1 {total1:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
