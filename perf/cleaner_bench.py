"""Produce latency while the log cleaner runs, divided by the same without it (the target is at most 2).

Each phase starts a fresh one-broker LocalCluster (real ZooKeeper) and runs, for ``--seconds``:
- churn: a confluent-kafka producer in a child process writing 200 B values over 1000 keys at
  ``--churn-rate`` records/s (default 40000, about 10 MB/s; linger.ms=5, acks=1) to a compacted topic (segment.bytes 1 MiB, min.cleanable.dirty.ratio
  0.01, log.cleaner.backoff.ms 100), so the cleaner always has dirty segments;
- probe: a second confluent-kafka producer sending one 100 B record every 5 ms (linger.ms=0, acks=1)
  to a plain topic; latency = delivery report time - send time.
Phase "off" sets log.cleaner.enable=false, phase "on" true; the load is otherwise the same. The run
prints p50/p99/max per phase, p99(on) / p99(off), and, for "on", the cleaner's progress from the
broker's cleaner-offset-checkpoint and the compacted partition's size on disk.

    python -m kbroker.perf.cleaner_bench [--seconds 10] [--rounds 8] [--churn-rate 40000] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import tempfile
import time
import uuid

CHURN_TOPIC_CONFIG = {"cleanup.policy": "compact", "segment.bytes": 1 << 20,
                      "min.cleanable.dirty.ratio": 0.01, "segment.ms": 1000}


def _churn(bootstrap: str, topic: str, seconds: float, rate: int, counter) -> None:
    import confluent_kafka as ck

    p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": 1,
                     "queue.buffering.max.messages": 200000})
    value = b"v" * 200
    start = time.monotonic()
    deadline = start + seconds
    n = 0
    while time.monotonic() < deadline:
        if n >= rate * (time.monotonic() - start):
            p.poll(0.001)               # paced: the same offered load in both phases
            continue
        try:
            p.produce(topic, key=b"key-%d" % (n % 1000), value=value)
            n += 1
        except BufferError:
            p.poll(0.01)
        if n % 1000 == 0:
            p.poll(0)
    p.flush(30)
    counter.value = n


def _probe(bootstrap: str, topic: str, seconds: float) -> list[float]:
    import confluent_kafka as ck

    p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": 1})
    lat: list[float] = []

    def done(err, _msg, sent):
        if err is None:
            lat.append((time.perf_counter() - sent) * 1000)

    payload = b"p" * 100
    deadline = time.monotonic() + seconds
    next_send = time.perf_counter()
    while time.monotonic() < deadline:
        now = time.perf_counter()
        if now >= next_send:
            p.produce(topic, value=payload, on_delivery=lambda e, m, s=now: done(e, m, s))
            next_send += 0.005
        p.poll(max(0.0, min(0.005, next_send - time.perf_counter())))
    p.flush(30)
    return lat


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _create(bootstrap: str, topic: str, config: dict) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config={k: str(v) for k, v in config.items()})])[topic].result(30)


def phase(cleaner: bool, seconds: float, rate: int) -> dict:
    root = tempfile.mkdtemp(prefix=f"cleaner-bench-{'on' if cleaner else 'off'}-", dir="/var/tmp")
    overrides = {"log.cleaner.enable": str(cleaner).lower(), "log.cleaner.backoff.ms": 100}
    try:
        return _phase(root, overrides, cleaner, seconds, rate)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _phase(root, overrides, cleaner, seconds, rate) -> dict:
    from kbroker.testing import LocalCluster, wait_until

    with LocalCluster(root, overrides=overrides) as cluster:
        bs = cluster.bootstrap
        churn_topic, probe_topic = f"churn-{uuid.uuid4().hex[:6]}", f"probe-{uuid.uuid4().hex[:6]}"
        _create(bs, churn_topic, CHURN_TOPIC_CONFIG)
        _create(bs, probe_topic, {})
        _probe(bs, probe_topic, 1.0)            # warm-up: metadata, connections
        counter = multiprocessing.Value("q", 0)
        child = multiprocessing.Process(target=_churn, args=(bs, churn_topic, seconds + 1, rate, counter))
        child.start()
        try:
            lat = _probe(bs, probe_topic, seconds)
        finally:
            child.join(120)
        fds = len(os.listdir(f"/proc/{cluster.brokers[0].pid}/fd"))
        data = os.path.join(root, "broker-0", "data")
        cleaned = 0
        ckpt = os.path.join(data, "cleaner-offset-checkpoint")
        if cleaner:
            wait_until(lambda: os.path.exists(ckpt), timeout=30, what="cleaner-offset-checkpoint")
            for line in open(ckpt).read().splitlines()[2:]:
                t, _p, off = line.split()
                if t == churn_topic:
                    cleaned = int(off)
        part = os.path.join(data, f"{churn_topic}-0")
        disk = sum(os.path.getsize(os.path.join(part, f)) for f in os.listdir(part) if f.endswith(".log"))
    return {"cleaner": cleaner, "samples": len(lat), "p50_ms": statistics.median(lat),
            "p99_ms": _pct(lat, 0.99), "max_ms": max(lat), "churn_records": counter.value,
            "cleaned_up_to_offset": cleaned, "churn_log_bytes_on_disk": disk, "broker_open_fds": fds}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--churn-rate", type=int, default=40000, help="records/s to the compacted topic")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    results = []
    for r in range(args.rounds):
        for cleaner in ((False, True) if r % 2 == 0 else (True, False)):
            res = phase(cleaner, args.seconds, args.churn_rate)
            res["round"] = r
            res["loadavg_1m"] = os.getloadavg()[0]
            results.append(res)
            print(json.dumps(res), flush=True)
    p99 = {c: statistics.median(x["p99_ms"] for x in results if x["cleaner"] is c) for c in (False, True)}
    ratio = p99[True] / p99[False]
    # Phases of one round run back to back, under the same background load: their ratio is the
    # steadier estimate on a shared machine.
    per_round = [next(x["p99_ms"] for x in results if x["round"] == r and x["cleaner"])
                 / next(x["p99_ms"] for x in results if x["round"] == r and not x["cleaner"])
                 for r in range(args.rounds)]
    print(f"produce p99 with cleaner {p99[True]:.2f} ms / without {p99[False]:.2f} ms = {ratio:.2f} "
          f"(target <= 2; medians of {args.rounds} rounds); per-round ratios "
          f"{', '.join(f'{x:.2f}' for x in per_round)}, median {statistics.median(per_round):.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "p99_ratio": ratio, "per_round_ratios": per_round}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
