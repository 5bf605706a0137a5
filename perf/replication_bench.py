"""Replication benchmark (not a test): three local brokers (kbroker.testing.LocalCluster).

1. Latency at a fixed rate on an RF=3 topic (min.insync.replicas=2): confluent-kafka producer,
   acks=all vs acks=1 (idempotence off for both), time from produce() to the delivery callback;
   p50/p99 and the difference, in --pairs alternating pairs.
2. Leader CPU per GB: the leader process's user+system CPU (/proc/<pid>/stat) while a producer
   pushes --gb of data at full speed (acks=1), on an RF=3 and on an RF=1 topic led by the same
   broker; plus the whole cluster's CPU per GB for RF=3.

3. Follower catch-up: a follower stopped (SIGTERM), --catchup-mb produced to an RF=3 topic with
   acks=all (ISR 2 still meets min.insync.replicas=2), the follower restarted; its copy rate (bytes
   on its disk over time from its first new byte to equality with the leader's log) and the time
   until it is back in the ISR.
4. Failover split (--failovers rounds, kill -9 of the leader under a retrying idempotent acks=all
   producer at --probe-rate records/s): kill -> /brokers/ids/<id> gone (session expiry), expiry ->
   another leader in Metadata, new leader -> first acknowledged acks=all write after the expiry.
   Then a SIGTERM bounce of the leader (controlled shutdown, restart, back in the ISR): the longest
   gap between two acknowledgements of that producer (unavailability) and its failed records.

--rate 0 (default) runs the latency pair at half of RF=1's peak rate, measured first in the same run
(acks=1, RF=1, --peak-records records of 100 B at full speed).

--compare K=V[,K=V...] starts a second three-broker cluster with those broker settings (and
--compare-env K=V,... with that environment, e.g. PYTHONPATH of a changed copy of the tree) beside the
first (Kafka's defaults) and interleaves the two in every CPU round (A RF=3, A RF=1, B RF=3, B RF=1,
then reversed), so a setting such as replica.fetch.min.bytes / replica.fetch.wait.max.ms is judged
against the defaults under the same load; --pairs then also runs the latency pairs on both.

    .venv/bin/python perf/replication_bench.py [--rate 0] [--seconds 10] [--pairs 3] [--mb 256] [--catchup-mb 200]
        [--failovers 3] [--probe-rate 200] [--skip-cpu] [--cpu-rounds 3] [--compare K=V,K=V]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kbroker.protocol import api
from kbroker.testing import LocalCluster, wait_until

TICK = os.sysconf("SC_CLK_TCK")


def cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICK, int(fields[12]) / TICK   # utime, stime


def cpu_seconds(pid: int) -> float:
    return sum(cpu_split(pid))


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
    # Idempotence off for both settings (it requires acks=all and changes in-flight limits): only acks differs.
    p = Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 0, "enable.idempotence": False})
    lat = []
    errors = []
    sent = 0
    payload = b"x" * size

    def cb(err, msg, t0):
        if err is None:
            lat.append(time.perf_counter() - t0)
        else:
            errors.append(err)
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
        sent += per
        nxt += step
        # Serve delivery callbacks while waiting for the next step (a sleep would add its time).
        p.poll(0)
        while (left := nxt - time.monotonic()) > 0:
            p.poll(left)
    left = p.flush(30)
    lat.sort()
    return lat, sent, len(errors) + left


def pct(sorted_vals, q):
    return sorted_vals[min(len(sorted_vals) - 1, int(q * len(sorted_vals)))] * 1000


def cpu_run(c, bootstrap, topic, leader, mb, size=1000):
    p = Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 5, "batch.size": 262144,
                  "queue.buffering.max.kbytes": 262144})
    n = mb * 1024 * 1024 // size
    payload = b"y" * size
    pids = {b: c.brokers[b].pid for b in c.brokers}
    before = {b: cpu_seconds(pid) for b, pid in pids.items()}
    leader_before = cpu_split(pids[leader])
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
    leader_after = cpu_split(pids[leader])
    gb = n * size / 1e9
    used = {b: after[b] - before[b] for b in pids}
    cpu_run.leader_user_sys = tuple((a - b) / gb for a, b in zip(leader_after, leader_before))
    return used[leader] / gb, sum(used.values()) / gb, wall


def metadata_state(c, topic, partition=0):
    """(leader, leader_epoch, isr) from the first live broker answering Metadata v8; None if none does."""
    for b in c.brokers.values():
        if not b.running():
            continue
        try:
            with socket.create_connection(("127.0.0.1", b.port), timeout=2) as s:
                s.sendall(api.encode_request(3, 8, 1, "replbench", {
                    "topics": [{"name": topic}], "allow_auto_topic_creation": False,
                    "include_cluster_authorized_operations": False, "include_topic_authorized_operations": False}))
                size = int.from_bytes(s.recv(4, socket.MSG_WAITALL), "big")
                frame = s.recv(size, socket.MSG_WAITALL)
            _, body = api.decode_response(3, 8, memoryview(frame))
        except (OSError, ValueError):
            continue
        for t in body["topics"]:
            for p in t["partitions"]:
                if t["error_code"] == 0 and p["partition_index"] == partition:
                    return p["leader_id"], p["leader_epoch"], sorted(p["isr_nodes"])
    return None


def raw_produce_ok(port, topic, value=b"raw"):
    """One acks=all Produce v8 straight to a broker (no client discovery): True when acknowledged."""
    from kbroker._native.batch import BatchBuilder

    b = BatchBuilder()
    b.append(int(time.time() * 1000), None, value)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(api.encode_request(0, 8, 1, "replbench", {
                "transactional_id": None, "acks": -1, "timeout_ms": 5000,
                "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": b.build()}]}]}))
            size = int.from_bytes(s.recv(4, socket.MSG_WAITALL), "big")
            frame = s.recv(size, socket.MSG_WAITALL)
        _, body = api.decode_response(0, 8, memoryview(frame))
    except (OSError, ValueError):
        return False
    return body["responses"][0]["partition_responses"][0]["error_code"] == 0


def wait_isr(c, topic, size, timeout=90.0):
    return wait_until(lambda: (lambda s: s if s and s[0] >= 0 and len(s[2]) == size else None)(
        metadata_state(c, topic)), timeout, f"{topic}: ISR of {size}")


def peak_rate(bootstrap, topic, records, size=100):
    """Records/s acknowledged by an acks=1 producer at full speed (same callback path as latency_run)."""
    # Same client settings as latency_run, so half of this is a rate that client can keep.
    p = Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 0})
    payload = b"p" * size
    done = [0]

    def cb(err, msg):
        if err is None:
            done[0] += 1
    p.produce(topic, payload, partition=0)
    p.flush(10)
    t0 = time.perf_counter()
    for _ in range(records):
        while True:
            try:
                p.produce(topic, payload, partition=0, on_delivery=cb)
                break
            except BufferError:
                p.poll(0.001)
        p.poll(0)
    p.flush(120)
    return done[0] / (time.perf_counter() - t0)


def log_bytes(data_dir, topic, partition=0):
    d = Path(data_dir) / f"{topic}-{partition}"
    try:
        return sum(f.stat().st_size for f in d.glob("*.log"))
    except OSError:         # a segment rolled or removed between glob and stat
        return -1


def produce_mb(bootstrap, topic, mb, size=1000):
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 5,
                  "batch.size": 262144, "queue.buffering.max.kbytes": 262144})
    payload = b"c" * size
    failed = [0]

    def cb(err, msg):
        if err is not None:
            failed[0] += 1
    for _ in range(mb * 1024 * 1024 // size):
        while True:
            try:
                p.produce(topic, payload, partition=0, on_delivery=cb)
                break
            except BufferError:
                p.poll(0.01)
        p.poll(0)
    assert p.flush(300) == 0 and failed[0] == 0, f"{failed[0]} failed writes while building the lag"


def catch_up(c, admin, mb):
    topic = "catchup"
    leader = create(admin, topic, 3, leader=0)
    follower = 2
    c.stop_broker(follower)
    wait_until(lambda: follower not in (metadata_state(c, topic) or (0, 0, [follower]))[2], 60, "ISR without follower")
    t0 = time.monotonic()
    produce_mb(c.bootstrap, topic, mb)
    print(f"catch-up: produced {mb} MB (acks=all, ISR 2) in {time.monotonic() - t0:.1f} s")
    lead_dir, fol_dir = c.brokers[leader].data_dir, c.brokers[follower].data_dir
    target = log_bytes(lead_dir, topic)
    base = log_bytes(fol_dir, topic)
    samples = []                                   # (time, follower bytes)
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            samples.append((time.monotonic(), log_bytes(fol_dir, topic)))
            time.sleep(0.02)
    th = threading.Thread(target=sample, daemon=True)
    t_start = time.monotonic()
    th.start()
    c.start_broker(follower)
    t_ready = time.monotonic()
    try:
        wait_until(lambda: samples and samples[-1][1] >= target, 600, "follower log to equal the leader's", 0.02)
        t_equal = samples[-1][0]
        wait_until(lambda: follower in metadata_state(c, topic)[2], 120, "follower back in the ISR", 0.02)
        t_isr = time.monotonic()
    finally:
        stop.set()
        th.join()
    first = next(t for t, n in samples if n > base)
    copied = (target - base) / 1e6
    print(f"catch-up: {copied:.0f} MB behind; process start -> ready {t_ready - t_start:.1f} s; "
          f"first new byte -> log equal {t_equal - first:.2f} s = {copied / max(t_equal - first, 1e-9):.1f} MB/s; "
          f"process start -> back in ISR {t_isr - t_start:.1f} s "
          f"(= {copied / (t_isr - t_start):.1f} MB/s including the restart)")


class Probe:
    """Idempotent acks=all producer at a fixed rate in a thread; the monotonic time of every
    acknowledgement (delivery callbacks served promptly by poll) and every failure."""

    def __init__(self, bootstrap, topic, rate):
        self.p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                           "linger.ms": 0, "message.timeout.ms": 120000, "retry.backoff.ms": 50,
                           "reconnect.backoff.max.ms": 200, "topic.metadata.refresh.interval.ms": 1000})
        self.topic, self.rate = topic, rate
        self.acks, self.failed = [], []
        self.stop_flag = threading.Event()
        self.th = threading.Thread(target=self._run, daemon=True)
        self.th.start()

    def _cb(self, err, msg):
        (self.acks if err is None else self.failed).append(time.monotonic())

    def _run(self):
        step = 1.0 / self.rate
        nxt = time.monotonic()
        while not self.stop_flag.is_set():
            self.p.produce(self.topic, b"probe", partition=0, on_delivery=self._cb)
            nxt += step
            while (left := nxt - time.monotonic()) > 0:
                self.p.poll(left)
            self.p.poll(0)

    def close(self):
        self.stop_flag.set()
        self.th.join()
        self.p.flush(120)

    def first_ack_after(self, t):
        return next((a for a in list(self.acks) if a > t), None)

    def max_gap(self, t0, t1):
        acks = [a for a in list(self.acks) if t0 <= a <= t1]
        return max((b - a for a, b in zip(acks, acks[1:])), default=float("nan")), len(acks)


def failovers(c, admin, rounds, rate):
    from kazoo.client import KazooClient

    topic = "failover"
    create(admin, topic, 3)
    zk = KazooClient(hosts=c.zk.connect_string, timeout=10)
    zk.start(timeout=10)
    probe = Probe(c.bootstrap, topic, rate)
    rows = []
    try:
        wait_until(lambda: len(probe.acks) >= rate, 30, "the probe producer running")
        for _ in range(rounds):
            leader, _epoch, _isr = wait_isr(c, topic, 3)
            before = len(probe.acks)
            wait_until(lambda: len(probe.acks) >= before + rate // 2, 30, "probe acks before the kill")
            t_kill = time.monotonic()
            os.kill(c.brokers[leader].pid, signal.SIGKILL)
            wait_until(lambda: zk.exists(f"/brokers/ids/{leader}") is None, 60, "session expiry", 0.01)
            t_exp = time.monotonic()
            wait_until(lambda: (lambda s: s and s[0] >= 0 and s[0] != leader)(metadata_state(c, topic)), 60,
                       "a new leader in Metadata", 0.01)
            t_lead = time.monotonic()
            # The broker side alone: a raw acks=all write sent straight to the new leader.
            new_port = c.brokers[metadata_state(c, topic)[0]].port
            wait_until(lambda: raw_produce_ok(new_port, topic), 60, "a raw acks=all write on the new leader", 0.01)
            t_raw = time.monotonic()
            wait_until(lambda: probe.first_ack_after(t_exp), 60, "an acks=all write acknowledged", 0.01)
            t_ack = probe.first_ack_after(t_exp)
            rows.append((t_exp - t_kill, t_lead - t_exp, t_ack - t_lead, t_ack - t_kill, t_raw - t_lead))
            print(f"failover: kill->expiry {rows[-1][0]:.2f} s, expiry->new leader {rows[-1][1]:.2f} s, "
                  f"new leader->first ack {rows[-1][2]:+.2f} s (kill->first ack {rows[-1][3]:.2f} s); "
                  f"new leader->first raw acks=all write {rows[-1][4]:.2f} s")
            c.brokers[leader].proc.wait(30)
            c.start_broker(leader)
        if rows:
            n = len(rows)
            print("failover mean of %d: kill->expiry %.2f s, expiry->new leader %.2f s, new leader->first ack "
                  "%+.2f s, kill->first ack %.2f s; new leader->first raw write %.2f s"
                  % ((n,) + tuple(sum(r[i] for r in rows) / n for i in range(5))))
        # SIGTERM bounce: controlled shutdown moves leadership before the process exits.
        leader, _epoch, _isr = wait_isr(c, topic, 3)
        t_quiet = time.monotonic()
        wait_until(lambda: len([a for a in probe.acks if a > t_quiet]) >= rate * 2, 30, "2 s of steady acks")
        base_gap, _n = probe.max_gap(t_quiet, time.monotonic())
        failed_before = len(probe.failed)
        t0 = time.monotonic()
        c.stop_broker(leader)
        t_down = time.monotonic()
        c.start_broker(leader)
        wait_isr(c, topic, 3)
        t_back = time.monotonic()
        wait_until(lambda: probe.first_ack_after(t_back + 2), 30, "2 s of acks after the bounce")
        gap, n = probe.max_gap(t0, t_back + 2)
        print(f"SIGTERM bounce of leader {leader}: shutdown took {t_down - t0:.2f} s, back in ISR after "
              f"{t_back - t0:.1f} s; longest ack gap {gap * 1000:.0f} ms over {n} acks "
              f"(steady-state longest gap {base_gap * 1000:.0f} ms at {rate}/s); "
              f"failed writes {len(probe.failed) - failed_before}")
    finally:
        probe.close()
        zk.stop()
        zk.close()
    print(f"probe totals: {len(probe.acks)} acknowledged, {len(probe.failed)} failed")


def latency_pairs(clusters, rate, pairs, seconds):
    """Alternating acks=1 / acks=all pairs on an RF=3 topic, each pair on every cluster of ``clusters``
    ({label: (cluster, admin)}) in turn -> {label: [(p50 diff, p99 diff)]}."""
    for c, admin in clusters.values():
        create(admin, "lat", 3)
    # Alternating pairs: one run alone is at the mercy of whatever else the 2 cores were doing.
    diffs = {label: [] for label in clusters}
    for pair in range(pairs):
        for label, (c, _admin) in clusters.items():
            res = {}
            for acks in ("1", "all"):
                lat, sent, failed = latency_run(c.bootstrap, "lat", acks, rate, seconds)
                res[acks] = (pct(lat, 0.5), pct(lat, 0.99), len(lat))
                print(f"pair {pair + 1}{label} acks={acks:>3} RF=3: {res[acks][2]} of {sent} sent acknowledged "
                      f"({failed} failed or unconfirmed), target {rate}/s, sent {sent / seconds:.0f}/s: p50 "
                      f"{res[acks][0]:.2f} ms, p90 {pct(lat, 0.9):.2f} ms, p99 {res[acks][1]:.2f} ms, "
                      f"max {lat[-1] * 1000:.1f} ms")
            diffs[label].append((res["all"][0] - res["1"][0], res["all"][1] - res["1"][1]))
            print(f"pair {pair + 1}{label} acks=all minus acks=1: p50 {diffs[label][-1][0]:+.2f} ms, "
                  f"p99 {diffs[label][-1][1]:+.2f} ms")
    for label, d in diffs.items():
        if d:
            print(f"acks=all minus acks=1{label} at {rate}/s, mean of {len(d)} pairs: "
                  f"p50 {sum(x[0] for x in d) / len(d):+.2f} ms, p99 {sum(x[1] for x in d) / len(d):+.2f} ms")
    return diffs


def cpu_rounds(clusters, rounds, mb):
    """Leader CPU per GB at RF=3 and RF=1 (topics led by broker 0) for each cluster in ``clusters``
    ({label: (cluster, admin)}), every round running all of them, the order reversed each round."""
    leader = 0
    for c, admin in clusters.values():
        create(admin, "cpu3", 3, leader=leader)
        create(admin, "cpu1", 1, leader=leader)
    # Interleaved rounds (RF=3, RF=1, RF=1, RF=3, ...): the 2 cores are shared, so only
    # same-round ratios are compared; the median and the range are reported.
    ratios = {label: [] for label in clusters}
    cluster3 = {label: [] for label in clusters}
    runs = [(label, name) for label in clusters for name in ("cpu3", "cpu1")]
    for rnd in range(rounds):
        got, split = {}, {}
        for label, name in (runs if rnd % 2 == 0 else runs[::-1]):
            c, _admin = clusters[label]
            got[label, name] = cpu_run(c, c.bootstrap, name, leader, mb)
            split[label, name] = cpu_run.leader_user_sys
        for label in clusters:
            (l3, total3, wall3), (l1, total1, wall1) = got[label, "cpu3"], got[label, "cpu1"]
            ratios[label].append(l3 / l1)
            cluster3[label].append(total3)
            s3, s1 = split[label, "cpu3"], split[label, "cpu1"]
            print(f"round {rnd + 1}{label}: leader CPU per GB: RF=3 {l3:.2f} s, RF=1 {l1:.2f} s, ratio {l3 / l1:.2f} "
                  f"({mb} MB each, {wall3:.1f} s / {wall1:.1f} s); cluster CPU per GB: RF=3 {total3:.2f} s, "
                  f"RF=1 {total1:.2f} s; leader user/system per GB: RF=3 {s3[0]:.2f}/{s3[1]:.2f} s, "
                  f"RF=1 {s1[0]:.2f}/{s1[1]:.2f} s")
    for label in clusters:
        srt = sorted(ratios[label])
        if srt:
            print(f"leader CPU per GB RF=3 / RF=1{label} over {len(srt)} interleaved rounds: median "
                  f"{srt[len(srt) // 2]:.2f} (range {srt[0]:.2f}-{srt[-1]:.2f}); cluster CPU per GB at RF=3: "
                  f"median {sorted(cluster3[label])[len(srt) // 2]:.2f} s")
    return ratios


def parse_settings(text: str) -> dict[str, str]:
    out = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--compare: {item!r} is not key=value")
        out[key.strip()] = value.strip()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=int, default=0,
                    help="records/s for the latency runs; 0 (default): half of RF=1's peak, measured first")
    ap.add_argument("--peak-records", type=int, default=200000, help="records (100 B) for the RF=1 peak (200000)")
    ap.add_argument("--seconds", type=float, default=10, help="seconds per latency run (10)")
    ap.add_argument("--pairs", type=int, default=3, help="alternating acks=1/acks=all latency pairs (3)")
    ap.add_argument("--mb", type=int, default=256, help="MB produced per CPU run (256)")
    ap.add_argument("--skip-cpu", action="store_true", help="skip the CPU-per-GB runs")
    ap.add_argument("--cpu-rounds", type=int, default=3, help="interleaved RF=3/RF=1 CPU rounds (3)")
    ap.add_argument("--catchup-mb", type=int, default=200, help="MB of follower lag to catch up (200; 0 skips)")
    ap.add_argument("--failovers", type=int, default=3, help="kill -9 failover rounds (3; 0 skips, and the bounce)")
    ap.add_argument("--probe-rate", type=int, default=200, help="records/s of the failover probe producer (200)")
    ap.add_argument("--compare", default="", metavar="K=V,K=V",
                    help="broker settings of a second cluster run beside the first in the latency pairs and "
                         "CPU rounds (e.g. replica.fetch.min.bytes=1048576,replica.fetch.wait.max.ms=20)")
    ap.add_argument("--compare-env", default="", metavar="K=V,K=V",
                    help="environment of the second cluster's brokers (e.g. PYTHONPATH=<a copy of the tree "
                         "with a change>, to compare code side by side); implies the second cluster")
    args = ap.parse_args(argv)
    base = {"log.segment.bytes": 256 << 20}
    compare = parse_settings(args.compare)
    compare_env = parse_settings(args.compare_env)
    with contextlib.ExitStack() as stack:
        root = stack.enter_context(tempfile.TemporaryDirectory(prefix="replbench-"))
        c = stack.enter_context(LocalCluster(Path(root) / "a", brokers=3, overrides=base))
        clusters = {"": (c, AdminClient({"bootstrap.servers": c.bootstrap}))}
        if compare or compare_env:
            print(f"[B] = a second cluster with settings {compare} and environment {compare_env}; "
                  "unlabelled = Kafka's defaults")
            cb = stack.enter_context(LocalCluster(Path(root) / "b", brokers=3, overrides={**base, **compare},
                                                  env=compare_env or None))
            clusters[" [B]"] = (cb, AdminClient({"bootstrap.servers": cb.bootstrap}))
        admin = clusters[""][1]
        rate = args.rate
        if rate <= 0 and args.pairs > 0:
            create(admin, "peak1", 1, leader=0)
            peak = peak_rate(c.bootstrap, "peak1", args.peak_records)
            rate = int(peak / 2)
            print(f"RF=1 peak (acks=1, 100 B, one producer): {peak:.0f} records/s; latency runs at half: {rate}/s")
        if args.pairs > 0:
            latency_pairs(clusters, rate, args.pairs, args.seconds)
        if not args.skip_cpu:
            cpu_rounds(clusters, args.cpu_rounds, args.mb)
        if args.catchup_mb > 0:
            catch_up(c, admin, args.catchup_mb)
        if args.failovers > 0:
            failovers(c, admin, args.failovers, args.probe_rate)
    return 0


if __name__ == "__main__":
    sys.exit(main())
