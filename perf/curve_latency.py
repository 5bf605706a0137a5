"""End-to-end latency percentiles versus offered load (issue "Benchmark suites", item 4).

``run(target, quick) -> dict``. ``target`` is a started ``perf.targets.Target``.

How it measures
  * A fresh topic (``PARTITIONS`` partitions) per phase, so a backlog left by one phase cannot delay
    the next. A confluent-kafka consumer runs in its own process (``python -m
    kbroker.perf.curve_latency consumer``, results back over a socketpair) and reads each phase's topic
    by partition assignment from offset 0 (``enable.auto.commit=false``; confluent-kafka insists on a
    ``group.id``, but the group is never joined and nothing is committed), with
    ``fetch.wait.max.ms=FETCH_WAIT_MS`` and ``fetch.min.bytes=1``. (Tansu answered 1-2 ms fetches with
    so little data that its consumer read ~1,000 records/s; at 5 ms it keeps up.)
  * The producer (confluent-kafka, ``linger.ms=0``, acks=1) runs in the calling process; the time
    from the stamp to its delivery report is kept too ("ack"), to split produce from fetch. Every record
    is 100 B; its first 8 bytes hold ``time.monotonic_ns()`` taken just before ``produce()``, byte 8
    holds the phase id. CLOCK_MONOTONIC is one clock for every process on the machine, so the consumer
    subtracts that stamp from its own ``monotonic_ns()`` when the record reaches the application.
  * Phase 0 measures the producer's peak: unthrottled for a few seconds, records delivered divided by
    the time until the last delivery report. Then one phase per fraction of that peak, each offered by
    an open-loop rate limiter (records are due at ``t0 + i / rate``; the loop sleeps until the next due
    time and sends whatever is due, so it catches up in small bursts rather than slowing down).
  * After each phase the producer flushes and the consumer hands back that phase's latencies once it
    has seen every record of it (or a time bound passes; missing records are reported).
  * After the fractions of the target's own peak, ``rates`` offers fixed absolute rates (the same for
    every target of a comparison). Each point also reads the broker's CPU, the client's (producer
    process and consumer process) and the whole machine's busy cores over its window: a tail with the
    client short of CPU or the machine full is the machine's, not the broker's.
  * ``pin`` runs client and broker on separate cores (``sched_setaffinity`` of every broker thread, and
    of this process before the producer and the consumer start), so neither waits for the other's CPU.
``summarize(runs_by_target)`` turns per-round results into medians, ranges and the same-round peer
comparisons (kbroker ÷ mock, end to end and produce ack). Every loop is bounded by a record count and by time.
"""
from __future__ import annotations

import ctypes
import os
import socket
import struct
import subprocess
import sys
import time
import uuid
from multiprocessing.connection import Connection

from kbroker.perf.harness import cpu_seconds, machine_busy_seconds, pin_process, progress, summary

PARTITIONS = 1
RECORD_SIZE = 100
FETCH_WAIT_MS = 5
FRACTIONS = (0.10, 0.25, 0.50, 0.75, 0.90)
# Fixed absolute rates offered to every target after its fractions (records/s): the same load for the
# C mock, Tansu and kbroker, about 20% and 40% of kbroker's peak with a consumer reading.
RATES = (20_000, 40_000)
GOAL_FRACTION = 0.50
GOAL_P99_MS = 5.0
# Peer goal: kbroker's p99 at most the mock's at every point up to this fraction of kbroker's own peak.
PEER_GOAL_FRACTION = 0.75
PRIMARY = "kbroker-shm"
PEER = "mock"
STARVED_CORES = 0.9     # a producer process this busy is the bottleneck of its point
POINT_FIELDS = ("offered_records_per_s", "achieved_records_per_s", "fraction", "p50", "p99", "p99_9", "max",
                "ack_p50", "ack_p99", "broker_cpu_cores", "producer_cpu_cores", "consumer_cpu_cores",
                "others_cpu_cores", "lost")

# A point stops at ``samples`` records or ``max_point_s``, whichever comes first: ~4 s per point keeps a
# target's whole curve under a minute (three targets per suite round), with >= 30,000 samples from 10% of
# a ~90k records/s peak upward.
FULL = {"samples": 40_000, "max_point_s": 4.0, "peak_s": 3.0, "drain_s": 4.0, "fractions": FRACTIONS,
        "rates": RATES}
QUICK = {"samples": 2_000, "max_point_s": 2.0, "peak_s": 1.0, "drain_s": 3.0, "fractions": (0.10, 0.50, 0.90),
         "rates": ()}

PEAK_ID, HELLO_ID = 0, 254
_STAMP = struct.Struct("<QB")
_PAD = b"x" * (RECORD_SIZE - _STAMP.size)

PR_SET_TIMERSLACK, PR_GET_TIMERSLACK = 29, 30


def _value(phase: int) -> bytes:
    return _STAMP.pack(time.monotonic_ns(), phase) + _PAD


# ---- consumer process -----------------------------------------------------------------------------
def _consumer_main(bootstrap: str, conn, max_seconds: float) -> None:
    """Keeps, per phase id, the latency (ns, int64) of every record it reads. Commands on ``conn``:
    ("assign", topic, partitions) reads that topic from offset 0 instead (earlier samples dropped);
    ("expect", phase, count, timeout_s) replies ("phase", phase, received, bytes, errors) once
    ``count`` records of that phase arrived or the timeout passed; ("stop",) ends the loop."""
    from array import array

    from confluent_kafka import Consumer, TopicPartition

    # confluent-kafka wants a group.id even for assign(); the group is never joined, nothing committed.
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"kbroker-perf-latency-{uuid.uuid4().hex[:8]}",
                  "enable.auto.commit": False, "enable.auto.offset.store": False,
                  "fetch.wait.max.ms": FETCH_WAIT_MS, "fetch.min.bytes": 1, "socket.nagle.disable": True,
                  "enable.partition.eof": False, "client.id": "kbroker-perf-latency-consumer", "log_level": 3})
    lat: dict[int, array] = {}
    errors = 0
    pending = None            # (phase, count, deadline)
    conn.send(("ready",))
    now_ns = time.monotonic_ns
    frombytes = int.from_bytes
    hard_deadline = time.monotonic() + max_seconds
    try:
        while time.monotonic() < hard_deadline:
            if conn.poll():
                cmd = conn.recv()
                if cmd[0] == "stop":
                    break
                if cmd[0] == "assign":
                    c.assign([TopicPartition(cmd[1], p, 0) for p in range(cmd[2])])
                    lat.clear()
                    pending = None
                elif cmd[0] == "expect":
                    pending = (cmd[1], cmd[2], time.monotonic() + cmd[3])
            msgs = c.consume(10_000, 0)
            if not msgs:
                m = c.poll(0.005)
                msgs = [m] if m is not None else ()
            t = now_ns()
            for m in msgs:
                if m.error() is not None:
                    errors += 1
                    continue
                v = m.value()
                a = lat.get(v[8])
                if a is None:
                    a = lat[v[8]] = array("q")
                a.append(t - frombytes(v[:8], "little"))
            if pending is not None:
                phase, count, deadline = pending
                got = lat.get(phase)
                n = len(got) if got is not None else 0
                if n >= count or time.monotonic() > deadline:
                    conn.send(("phase", phase, n, got.tobytes() if got is not None else b"", errors))
                    lat.pop(phase, None)
                    pending = None
    finally:
        c.close()
        conn.close()


# ---- producer side --------------------------------------------------------------------------------
class _Delivery:
    """Delivery reports: counts, and each record's produce-to-ack time (its stamp to the report)."""
    __slots__ = ("ok", "err", "first_error", "last_ns", "ack")

    def __init__(self):
        from array import array
        self.ok = self.err = 0
        self.first_error = None
        self.last_ns = 0
        self.ack = array("q")

    def __call__(self, err, msg):
        if err is None:
            self.ok += 1
            self.last_ns = t = time.monotonic_ns()
            self.ack.append(t - int.from_bytes(msg.value()[:8], "little"))
        else:
            self.err += 1
            if self.first_error is None:
                self.first_error = str(err)


def _produce_one(p, topic: str, phase: int, partition: int, cb) -> None:
    """One record; a full local queue is served (delivery reports) and retried, at most ~10 s."""
    for _ in range(10_000):
        try:
            p.produce(topic, _value(phase), partition=partition, on_delivery=cb)
            return
        except BufferError:
            p.poll(0.001)
    raise RuntimeError("producer queue stayed full for ~10 s")


def _unthrottled(p, topic: str, phase: int, seconds: float, max_records: int, partitions: int) -> dict:
    cb = _Delivery()
    t0 = time.monotonic_ns()
    end = t0 + int(seconds * 1e9)
    sent = 0
    while sent < max_records:
        _produce_one(p, topic, phase, sent % partitions, cb)
        sent += 1
        if not sent & 255:
            p.poll(0)
            if time.monotonic_ns() > end:
                break
    left = p.flush(60)
    span = ((cb.last_ns or time.monotonic_ns()) - t0) / 1e9
    return {"sent": sent, "delivered": cb.ok, "errors": cb.err, "unflushed": left, "first_error": cb.first_error,
            "seconds": span, "rate": cb.ok / span if span > 0 else 0.0, "ack": cb.ack.tobytes()}


def _throttled(p, topic: str, phase: int, rate: float, count: int, max_s: float, partitions: int,
               quantum_ns: int = 0) -> dict:
    """``quantum_ns``: the limiter's shortest sleep (0: it sleeps until the next record is due, one sleep
    per record at high rates; docs/perf/latency-tail.md measures what those sleeps cost the producer)."""
    cb = _Delivery()
    ns_per = 1e9 / rate
    t0 = time.monotonic_ns()
    end = t0 + int(max_s * 1e9)
    sent = 0
    behind_max = 0
    now = t0
    while sent < count and now < end:
        due = min(count, int((now - t0) / ns_per) + 1)
        if due - sent > behind_max:
            behind_max = due - sent
        while sent < due:
            _produce_one(p, topic, phase, sent % partitions, cb)
            sent += 1
        p.poll(0)
        wait = t0 + sent * ns_per - time.monotonic_ns()
        if wait > 0:
            time.sleep((wait if wait > quantum_ns else quantum_ns) / 1e9)
        now = time.monotonic_ns()
    t_last = time.monotonic_ns()
    left = p.flush(60)
    secs = (t_last - t0) / 1e9
    return {"sent": sent, "delivered": cb.ok, "errors": cb.err, "unflushed": left, "first_error": cb.first_error,
            "seconds": secs, "achieved_rate": sent / secs if secs > 0 else 0.0, "max_burst": behind_max,
            "ack": cb.ack.tobytes()}


def _percentiles(raw: bytes) -> dict:
    import numpy as np
    a = np.frombuffer(raw, dtype=np.int64)
    if a.size == 0:
        return {"p50": None, "p90": None, "p99": None, "p99_9": None, "max": None, "mean": None,
                "p50_first_tenth": None, "p50_last_tenth": None}
    q = np.percentile(a, [50, 90, 99, 99.9]) / 1e6
    tenth = max(1, a.size // 10)
    # Samples are in arrival order (per partition): a median that climbs from the first tenth to the
    # last means a queue grew during the phase, i.e. the offered load was above what is sustained.
    return {"p50": round(float(q[0]), 4), "p90": round(float(q[1]), 4), "p99": round(float(q[2]), 4),
            "p99_9": round(float(q[3]), 4), "max": round(float(a.max()) / 1e6, 4),
            "mean": round(float(a.mean()) / 1e6, 4),
            "p50_first_tenth": round(float(np.median(a[:tenth])) / 1e6, 4),
            "p50_last_tenth": round(float(np.median(a[-tenth:])) / 1e6, 4)}


def _set_timerslack(ns: int) -> int | None:
    """Lower this thread's timer slack so short sleeps of the limiter are not stretched by ~50 µs;
    returns the previous value (None when prctl is unavailable)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        old = libc.prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0)
        libc.prctl(PR_SET_TIMERSLACK, ctypes.c_ulong(ns), 0, 0, 0)
        return old if old > 0 else None
    except (OSError, AttributeError):
        return None


class _ConsumerProc:
    """The consumer in its own interpreter (``python -m kbroker.perf.curve_latency consumer``), talking
    over a socketpair wrapped in ``multiprocessing.connection.Connection``. A plain subprocess rather
    than a multiprocessing spawn: it does not re-import the caller's ``__main__``."""

    def __init__(self, bootstrap: str, max_seconds: float):
        parent, child = socket.socketpair()
        cmd = [sys.executable, "-m", "kbroker.perf.curve_latency", "consumer", bootstrap,
               str(child.fileno()), str(max_seconds)]
        self.proc = subprocess.Popen(cmd, pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        child.close()
        self.conn = Connection(parent.detach())
        if not self.conn.poll(60):
            self.stop()
            raise RuntimeError("latency consumer did not start within 60 s")
        self.conn.recv()

    def assign(self, topic: str, partitions: int) -> None:
        self.conn.send(("assign", topic, partitions))

    def collect(self, phase: int, count: int, timeout: float) -> tuple[int, bytes, int]:
        self.conn.send(("expect", phase, count, timeout))
        if not self.conn.poll(timeout + 30):
            raise RuntimeError(f"latency consumer gave no answer for phase {phase}")
        _, got_phase, n, raw, errors = self.conn.recv()
        if got_phase != phase:
            raise RuntimeError(f"latency consumer answered phase {got_phase}, expected {phase}")
        return n, raw, errors

    def stop(self):
        try:
            self.conn.send(("stop",))
        except (OSError, ValueError):
            pass
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.terminate()       # our own child, by its PID
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.conn.close()


def _phase_topic(target, producer, consumer, base: str, phase: int) -> str:
    """A fresh topic for one phase, read by the consumer from offset 0: a backlog left by an earlier
    phase (a consumer that could not keep up) cannot delay this one. Ready once a few records made it
    through (metadata fetched by the producer, fetches running)."""
    topic = f"{base}-{phase}"
    # librdkafka's mock cluster auto-creates 4 partitions and refuses any other count; the first
    # PARTITIONS of them are written and read, as on every other target.
    target.create_topic(topic, target.fixed_partitions or PARTITIONS)
    consumer.assign(topic, PARTITIONS)
    hello = _Delivery()
    for i in range(10):
        _produce_one(producer, topic, HELLO_ID, i % PARTITIONS, hello)
    producer.flush(30)
    n, _, _ = consumer.collect(HELLO_ID, 10, 30)
    if n < 10:
        raise RuntimeError(f"latency consumer saw {n} of the first 10 records of {topic} within 30 s")
    return topic


class _Window:
    """CPU of the broker, this process (the producer and its librdkafka threads), the consumer process
    and the whole machine over one phase, as cores (CPU seconds ÷ wall seconds)."""

    def __init__(self, broker_pid: int, consumer_pid: int):
        self.pids = broker_pid, consumer_pid
        self.t0 = time.monotonic()
        self.c0 = (cpu_seconds(broker_pid), time.process_time(), cpu_seconds(consumer_pid), machine_busy_seconds())

    def cores(self) -> dict:
        c1 = (cpu_seconds(self.pids[0]), time.process_time(), cpu_seconds(self.pids[1]), machine_busy_seconds())
        wall = time.monotonic() - self.t0
        b, p, c, m = ((y - x) / wall for x, y in zip(self.c0, c1))
        # "others": busy cores of the machine not spent by the broker, the producer or the consumer
        return {"broker_cpu_cores": round(b, 3), "producer_cpu_cores": round(p, 3), "consumer_cpu_cores": round(c, 3),
                "machine_busy_cores": round(m, 3), "others_cpu_cores": round(max(0.0, m - b - p - c), 3)}


def _label(fraction: float | None, rate: float | None) -> str:
    return f"{rate:,.0f}/s" if rate is not None else f"{fraction:.0%}"


def run(target, quick: bool, cfg: dict | None = None) -> dict:
    """``cfg`` (keys of FULL) replaces the mode's settings, e.g. request_bench's single 50% point.
    ``cfg["quantum_us"]``: the limiter's shortest sleep (default 0). ``cfg["rate"]`` (records/s), when
    set, is the one point offered instead of the fractions of the peak: the same offered load for every
    target of a comparison (each target's own peak is still measured and reported, and the point's
    ``fraction`` is that rate over it). ``cfg["rates"]``: fixed rates offered after the fractions.
    ``cfg["pin"]``: ``{"client": CPUS, "broker": CPUS}`` runs them on separate cores."""
    from confluent_kafka import Producer

    cfg = dict(QUICK if quick else FULL, **(cfg or {}))
    fixed_rate = cfg.get("rate")
    fractions = () if fixed_rate else cfg["fractions"]
    rates = (fixed_rate,) if fixed_rate else tuple(cfg.get("rates") or ())
    pin = cfg.get("pin")
    base = f"curve-latency-{uuid.uuid4().hex[:10]}"
    budget = cfg["peak_s"] + (len(fractions) + len(rates)) * (cfg["max_point_s"] + cfg["drain_s"] + 60) + 120
    load_before = os.getloadavg()
    affinity_before = os.sched_getaffinity(0)
    if pin:
        # the consumer process and librdkafka's threads inherit this process's mask when they start
        pin_process(target.pid, set(pin["broker"]))
        os.sched_setaffinity(0, set(pin["client"]))
    progress(f"latency[{target.name}]: consumer starting" + (f" (client on CPUs {sorted(pin['client'])}, broker "
                                                           f"on {sorted(pin['broker'])})" if pin else ""))
    consumer = _ConsumerProc(target.bootstrap, budget)
    p = Producer({"bootstrap.servers": target.bootstrap, "acks": "1", "linger.ms": 0,
                  "compression.type": "none", "socket.nagle.disable": True, "message.timeout.ms": 60000,
                  "queue.buffering.max.messages": 200_000, "client.id": "kbroker-perf-latency-producer",
                  "log_level": 3})
    old_slack = _set_timerslack(1000)
    points = []
    try:
        topic = _phase_topic(target, p, consumer, base, PEAK_ID)
        win = _Window(target.pid, consumer.proc.pid)
        peak = _unthrottled(p, topic, PEAK_ID, cfg["peak_s"], 5_000_000, PARTITIONS)
        n, raw, cerr = consumer.collect(PEAK_ID, peak["delivered"], cfg["drain_s"])
        peak_cores = win.cores()
        if peak["delivered"] == 0:
            raise RuntimeError(f"peak phase delivered nothing: {peak['first_error']}")
        peak_rate = peak["rate"]
        peak_out = {"records_per_s": round(peak_rate, 1), "seconds": round(peak["seconds"], 3),
                    "delivered": peak["delivered"], "received": n, "errors": peak["errors"],
                    **peak_cores, **_percentiles(raw), "ack": _percentiles(peak["ack"])}
        progress(f"latency[{target.name}]: peak {peak_rate:,.0f} rec/s (unthrottled: p99 {peak_out['p99']} ms, "
                 f"{n} of {peak['delivered']} seen by the consumer)")

        plan = [(frac, None, peak_rate * frac) for frac in fractions] + [(None, r, r) for r in rates]
        for i, (own_frac, fixed, rate) in enumerate(plan, start=1):
            frac = own_frac if own_frac is not None else round(rate / peak_rate, 3)
            topic = _phase_topic(target, p, consumer, base, i)
            count = cfg["samples"]
            win = _Window(target.pid, consumer.proc.pid)
            r = _throttled(p, topic, i, rate, count, cfg["max_point_s"], PARTITIONS,
                           int(cfg.get("quantum_us", 0) * 1000))
            n, raw, cerr = consumer.collect(i, r["delivered"], cfg["drain_s"])
            pt = {"label": _label(own_frac, fixed), "fraction": frac, "fixed_rate": fixed is not None,
                  "offered_records_per_s": round(rate, 1),
                  "achieved_records_per_s": round(r["achieved_rate"], 1), "samples": n,
                  "samples_target": count, "sent": r["sent"], "delivered": r["delivered"],
                  "produce_errors": r["errors"], "consumer_errors": cerr, "lost": r["delivered"] - n,
                  "max_burst": r["max_burst"], **win.cores(), **_percentiles(raw),
                  "ack": _percentiles(r["ack"])}
            pt["ack_p50"], pt["ack_p99"] = pt["ack"]["p50"], pt["ack"]["p99"]
            points.append(pt)
            progress(f"latency[{target.name}]: {pt['label']} ({frac:.0%} of peak) = {rate:,.0f} rec/s: n={n} "
                     f"p50 {pt['p50']} p99 {pt['p99']} p99.9 {pt['p99_9']} max {pt['max']} ms "
                     f"(produce ack p50 {pt['ack']['p50']} p99 {pt['ack']['p99']} ms); cores: broker "
                     f"{pt['broker_cpu_cores']}, producer {pt['producer_cpu_cores']}, consumer "
                     f"{pt['consumer_cpu_cores']}, others {pt['others_cpu_cores']}")
    finally:
        if old_slack is not None:
            _set_timerslack(old_slack)
        p.flush(10)
        consumer.stop()
        if pin:
            os.sched_setaffinity(0, affinity_before)

    goal_pt = points[0] if fixed_rate else next(pt for pt in points if not pt["fixed_rate"]
                                                 and pt["fraction"] == GOAL_FRACTION)
    where = (f"a fixed {fixed_rate:,.0f} records/s ({goal_pt['fraction']:.0%} of this target's peak)" if fixed_rate
             else f"{GOAL_FRACTION:.0%} of the producer's peak rate")
    goal = {"text": f"p99 <= {GOAL_P99_MS} ms at {where}",
            "p99_ms": goal_pt["p99"], "offered_records_per_s": goal_pt["offered_records_per_s"],
            "met": goal_pt["p99"] is not None and goal_pt["lost"] == 0 and goal_pt["p99"] <= GOAL_P99_MS}
    notes = (
        f"confluent-kafka producer (linger.ms=0, acks=1, no compression) in the calling process; "
        f"confluent-kafka consumer in its own process (assign from offset 0, no group use, "
        f"fetch.wait.max.ms={FETCH_WAIT_MS}, fetch.min.bytes=1). A fresh {PARTITIONS}-partition topic per "
        f"phase. {RECORD_SIZE} B records carry time.monotonic_ns() taken at produce(); latency = the "
        f"consumer's monotonic_ns() when the record reaches the application minus that stamp "
        f"(ack = the same stamp to the producer's delivery report). Peak = unthrottled produce for "
        f"{cfg['peak_s']} s with the consumer reading (records delivered / time to the last delivery "
        f"report). Points are {'a fixed rate' if fixed_rate else 'fractions of that peak'}"
        f"{f' then fixed rates of {list(rates)} records/s' if rates and not fixed_rate else ''} offered by an "
        f"open-loop limiter (shortest sleep {cfg.get('quantum_us', 0)} µs; {cfg['samples']} records per "
        f"point, at most {cfg['max_point_s']} s; a consumer gets {cfg['drain_s']} s after the "
        f"last delivery to see them). "
        + (f"Client (producer and consumer) pinned to CPUs {sorted(pin['client'])}, broker to {sorted(pin['broker'])} "
           if pin else "Producer, consumer and broker share the machine ")
        + f"({os.cpu_count()} CPUs; load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after). "
        f"Goal {goal['text']}: p99 {goal['p99_ms']} ms -> {'met' if goal['met'] else 'missed'}.")
    growing = [pt["label"] for pt in points if pt["p50_last_tenth"] is not None
               and pt["p50_last_tenth"] > max(5.0, 2 * pt["p50_first_tenth"])]
    if growing:
        notes += (f" Latency climbed during the phase (median of the last tenth > 2x the first and > 5 ms: a "
                  f"queue grew, the offered load was above what this setup sustains) at points {growing}.")
    starved = [pt["label"] for pt in points if pt["producer_cpu_cores"] >= STARVED_CORES]
    if starved:
        notes += (f" The producer process used >= {STARVED_CORES} core at points {starved}: the client, not the "
                  f"broker, bounds those points.")
    short = [pt["label"] for pt in points if pt["sent"] < pt["samples_target"]]
    if short:
        notes += f" Points below the sample target (time bound hit): {short}."
    lost = [(pt["label"], pt["lost"]) for pt in points if pt["lost"]]
    if lost:
        notes += f" Records the consumer did not see in time (point, count): {lost}."
    return {"name": "latency", "unit": "ms", "target": target.name, "peak": peak_out, "goal": goal,
            "pinned": pin or None, "loadavg": [round(x, 2) for x in load_before], "points": points, "notes": notes}


# ---- summary over rounds -----------------------------------------------------------------------
def _point(run_: dict | None, label: str) -> dict | None:
    return next((p for p in (run_ or {}).get("points", []) if p.get("label", _label(p["fraction"], None)) == label),
                None)


def _ratios(num: list, den: list) -> dict | None:
    """Ratio of the medians and the per-round ratios, over the rounds that have both figures."""
    pairs = [(a, b) for a, b in zip(num, den) if a is not None and b]
    if not pairs:
        return None
    per = [a / b for a, b in pairs]
    sn, sd = summary([a for a, _ in pairs]), summary([b for _, b in pairs])
    return {"of_medians": sn["median"] / sd["median"] if sd["median"] else None,
            "per_round": per, "per_round_min": min(per), "per_round_max": max(per)}


def summarize(runs_by_target: dict, primary: str = PRIMARY, peer: str = PEER) -> dict:
    """``{target: [result of run() or None, one per round]}`` (index i = the same round for every target)
    -> per target and point (its label: a fraction of the target's own peak, or a fixed rate) the median
    and min-max of every figure; the same-round ratios ``primary`` ÷ ``peer`` of end-to-end and produce-ack
    p99 at every point both ran; and the peer goal: primary's p99 ≤ the peer's at every point up to
    PEER_GOAL_FRACTION of primary's own peak (fixed rates count when they are at most that share of the
    peak primary measured in the same round)."""
    labels: list[str] = []
    for runs in runs_by_target.values():
        for r in runs:
            for p in (r or {}).get("points", []):
                lab = p.get("label", _label(p["fraction"], None))
                if lab not in labels:
                    labels.append(lab)
    # fractions of the own peak first (ascending), then fixed rates (ascending)
    labels.sort(key=lambda x: (x.endswith("/s"), float(x.rstrip("%/s").replace(",", ""))))
    targets = {}
    for t, runs in runs_by_target.items():
        pts = {}
        for lab in labels:
            got = [_point(r, lab) for r in runs]
            if any(got):
                pts[lab] = {k: summary([g.get(k) if g else None for g in got]) for k in POINT_FIELDS}
        targets[t] = {"peak_records_per_s": summary([(r or {}).get("peak", {}).get("records_per_s") for r in runs]),
                      "pinned": next((r.get("pinned") for r in runs if r), None), "points": pts}
    out = {"labels": labels, "targets": targets, "peer": {}, "goals": []}
    if primary not in runs_by_target or peer not in runs_by_target:
        return out
    prim, other = runs_by_target[primary], runs_by_target[peer]
    rounds = min(len(prim), len(other))
    for lab in labels:
        a = [_point(prim[i], lab) for i in range(rounds)]
        b = [_point(other[i], lab) for i in range(rounds)]
        row = {}
        for key in ("p99", "ack_p99", "p50"):
            r = _ratios([x.get(key) if x else None for x in a], [y.get(key) if y else None for y in b])
            if r:
                row[key] = r
        if row:
            out["peer"][lab] = row
    for key, what in (("p99", "end-to-end p99"), ("ack_p99", "produce-ack p99")):
        worst, mets = [], []
        for i in range(rounds):
            peak = (prim[i] or {}).get("peak", {}).get("records_per_s")
            if not prim[i] or not other[i] or not peak:
                continue
            ratios = []
            for p in prim[i]["points"]:
                share = p["offered_records_per_s"] / peak
                if share > PEER_GOAL_FRACTION + 1e-9:
                    continue
                q = _point(other[i], p.get("label", _label(p["fraction"], None)))
                if q and p.get(key) is not None and q.get(key):
                    ratios.append(p[key] / q[key])
            if ratios:
                worst.append(max(ratios))
                mets.append(max(ratios) <= 1.0)
        sw = summary(worst)
        out["goals"].append({
            "goal": f"latency: {what}, {primary} ÷ {peer} in the same round, the worst of the points (fractions "
                    f"of each one's own peak, fixed rates) up to {PEER_GOAL_FRACTION:.0%} of {primary}'s peak",
            "target": "<= 1.0", "value": sw["median"], "per_round_min": sw["min"], "per_round_max": sw["max"],
            "met": None if not mets else all(mets), "rounds_met": f"{sum(mets)}/{len(mets)}", "source": "latency"})
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 4 or argv[0] != "consumer":
        print("usage: python -m kbroker.perf.curve_latency consumer BOOTSTRAP FD MAX_SECONDS", file=sys.stderr)
        return 2
    _, bootstrap, fd, max_seconds = argv
    _consumer_main(bootstrap, Connection(int(fd)), float(max_seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
