"""Broker throughput, CPU and memory versus the number of client connections (issue "Benchmark
suites", item 4).

``run(target, quick) -> dict``. ``target`` is a started ``perf.targets.Target``.

How it measures
  * One fresh topic of ``PARTITIONS`` partitions, and one small RecordBatch built once with the
    native ``BatchBuilder`` (``RECORDS_PER_BATCH`` records of ``RECORD_SIZE`` B, no compression).
  * Per point, N connections are opened from this one asyncio process with kbroker's own client
    (``kbroker.client.connection.BrokerConnection.open``: TCP connect + ApiVersions), at most
    ``OPEN_CONCURRENCY`` opening at once. Connection i sends Produce (acks=1) of that batch to
    partition i % PARTITIONS in a loop, one request in flight.
  * After a warm-up, a window of fixed length counts the Produce responses that arrived in it.
    Records/s and MB/s (record-batch bytes) come from that count; broker CPU is the broker process's
    utime+stime over the window (all threads), client CPU this thread's CPU time (the asyncio loop) —
    near 1 core means the client, not the broker, set the pace. Request round trips are timed.
  * Memory: the broker's VmRSS sampled during the window (max) and VmHWM after it, from
    /proc/<pid>/status; open descriptors from /proc/<pid>/fd.
  * File descriptors: this process's RLIMIT_NOFILE soft limit is raised (up to the hard limit) to fit
    the largest point; the broker's own "Max open files" is read from /proc/<pid>/limits and a point
    it cannot hold is skipped and named in the notes rather than failing.
Every loop is bounded by count and by time.
"""
from __future__ import annotations

import asyncio
import os
import resource
import threading
import time
import uuid

from kbroker.perf.harness import cpu_seconds, progress

PARTITIONS = 8
RECORDS_PER_BATCH = 10
RECORD_SIZE = 100
OPEN_CONCURRENCY = 64
FD_MARGIN = 128          # descriptors the broker needs besides client sockets (logs, indexes, ZooKeeper)

FULL = {"connections": (1, 10, 100, 1000), "warmup_s": 1.5, "window_s": 8.0}
QUICK = {"connections": (1, 10), "warmup_s": 0.3, "window_s": 1.5}

PRODUCE = 0


# ---- /proc readers --------------------------------------------------------------------------------
def open_files_limit(pid: int) -> tuple[int | None, int | None]:
    """(soft, hard) "Max open files" of a process; None for unlimited or unreadable."""
    def num(x):
        return None if x == "unlimited" else int(x)
    try:
        with open(f"/proc/{pid}/limits") as f:
            for line in f:
                if line.startswith("Max open files"):
                    soft, hard = line[len("Max open files"):].split()[:2]
                    return num(soft), num(hard)
    except (OSError, ValueError):
        pass
    return None, None


def memory_kib(pid: int) -> dict:
    """VmRSS and VmHWM (KiB) from /proc/<pid>/status."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    key, val = line.split(":", 1)
                    out[key] = int(val.split()[0])
    except (OSError, ValueError):
        pass
    return out


def open_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def raise_nofile(wanted: int) -> tuple[int, int]:
    """Raise this process's soft RLIMIT_NOFILE toward ``wanted`` (never above the hard limit, never
    lowered); returns the (soft, hard) now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    cap = hard if hard != resource.RLIM_INFINITY else wanted
    new = min(max(soft, wanted), cap)
    if new > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


# ---- one point ------------------------------------------------------------------------------------
def _build_batch() -> bytes:
    from kbroker._native.batch import BatchBuilder
    b = BatchBuilder(codec=0, batch_size=1 << 20)
    now = int(time.time() * 1000)
    value = b"v" * RECORD_SIZE
    for _ in range(RECORDS_PER_BATCH):
        b.append(now, None, value)
    return b.build()


async def _point(host: str, port: int, topic: str, batch: bytes, n: int, warmup_s: float, window_s: float,
                 broker_pid: int) -> dict:
    from kbroker.client.connection import BrokerConnection, KafkaError

    loop = asyncio.get_running_loop()
    sem = asyncio.Semaphore(OPEN_CONCURRENCY)
    open_errors: list[str] = []

    async def open_one(i):
        async with sem:
            try:
                return await BrokerConnection.open(host, port, client_id=f"kbroker-perf-conn-{i}",
                                                   request_timeout_ms=30000)
            except (KafkaError, OSError) as e:
                open_errors.append(str(e))
                return None

    rss_before = memory_kib(broker_pid).get("VmRSS")
    t_open = time.monotonic()
    conns = [c for c in await asyncio.gather(*(open_one(i) for i in range(n))) if c is not None]
    open_s = time.monotonic() - t_open
    if not conns:
        raise RuntimeError(f"no connection could be opened: {open_errors[:1]}")
    version = conns[0].version_for(PRODUCE)
    bodies = [{"transactional_id": None, "acks": 1, "timeout_ms": 30000,
               "topic_data": [{"name": topic, "partition_data": [{"index": p, "records": batch}]}]}
              for p in range(PARTITIONS)]

    state = {"measuring": False, "stop": False, "count": 0, "errors": 0, "first_error": None,
             "dropped": 0}
    rtts: list[float] = []
    hard_deadline = time.monotonic() + warmup_s + window_s + 60

    async def worker(i, conn):
        body = bodies[i % PARTITIONS]
        perf = time.perf_counter
        while not state["stop"] and time.monotonic() < hard_deadline:
            t = perf()
            try:
                _, resp = await conn.send(PRODUCE, body, version=version)
            except KafkaError as e:
                state["dropped"] += 1
                if state["first_error"] is None:
                    state["first_error"] = str(e)
                return
            code = resp["responses"][0]["partition_responses"][0]["error_code"]
            if code:
                state["errors"] += 1
                if state["first_error"] is None:
                    state["first_error"] = f"Produce error code {code}"
                await asyncio.sleep(0.01)
                continue
            if state["measuring"]:
                state["count"] += 1
                rtts.append(perf() - t)

    rss_max = 0

    async def sample_rss():
        nonlocal rss_max
        while state["measuring"]:
            rss_max = max(rss_max, memory_kib(broker_pid).get("VmRSS", 0))
            await asyncio.sleep(0.25)

    tasks = [loop.create_task(worker(i, c)) for i, c in enumerate(conns)]
    try:
        await asyncio.sleep(warmup_s)
        fds = open_fds(broker_pid)
        state["measuring"] = True
        sampler = loop.create_task(sample_rss())
        b0, c0, w0 = cpu_seconds(broker_pid), time.thread_time(), time.monotonic()
        await asyncio.sleep(window_s)
        state["measuring"] = False
        b1, c1, w1 = cpu_seconds(broker_pid), time.thread_time(), time.monotonic()
        count = state["count"]
        await sampler
    finally:
        state["stop"] = True
        await asyncio.wait(tasks, timeout=40)
        for c in conns:
            c.close()
        await asyncio.wait([loop.create_task(c.wait_closed()) for c in conns], timeout=20)

    window = w1 - w0
    records = count * RECORDS_PER_BATCH
    rtts.sort()

    def pct(q):
        return round(rtts[min(len(rtts) - 1, int(q * len(rtts)))] * 1000, 3) if rtts else None
    mem = memory_kib(broker_pid)
    broker_cpu = b1 - b0
    return {
        "connections": n, "connections_open": len(conns), "open_failures": len(open_errors),
        "open_seconds": round(open_s, 3), "window_s": round(window, 3),
        "requests": count, "records_per_s": round(records / window, 1),
        "mb_per_s": round(count * len(batch) / window / 1e6, 3),
        "broker_cpu_cores": round(broker_cpu / window, 3),
        "broker_cpu_s_per_million": round(broker_cpu / records * 1e6, 3) if records else None,
        "client_cpu_cores": round((c1 - c0) / window, 3),
        "rtt_ms_p50": pct(0.50), "rtt_ms_p99": pct(0.99),
        "broker_rss_before_kib": rss_before, "broker_rss_max_kib": rss_max or mem.get("VmRSS"), "broker_rss_after_kib": mem.get("VmRSS"),
        "broker_hwm_kib": mem.get("VmHWM"), "broker_open_fds": fds,
        "produce_errors": state["errors"], "connections_dropped": state["dropped"],
        "first_error": state["first_error"] or (open_errors[0] if open_errors else None),
    }


def _run_async(coro):
    """asyncio.run here, or in a helper thread when the caller already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box = {}

    def runner():
        try:
            box["v"] = asyncio.run(coro)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller
            box["e"] = e
    t = threading.Thread(target=runner, name="kbroker-perf-connections")
    t.start()
    t.join()
    if "e" in box:
        raise box["e"]
    return box["v"]


def run(target, quick: bool) -> dict:
    cfg = QUICK if quick else FULL
    topic = f"curve-connections-{uuid.uuid4().hex[:10]}"
    target.create_topic(topic, PARTITIONS)
    host, port = target.bootstrap.rsplit(":", 1)
    batch = _build_batch()
    most = max(cfg["connections"])
    client_limit = raise_nofile(most + 256)
    broker_soft, broker_hard = open_files_limit(target.pid)
    notes_extra, skipped, points = [], [], []
    for n in cfg["connections"]:
        if client_limit[0] < n + 64:
            skipped.append({"connections": n, "reason": f"client RLIMIT_NOFILE {client_limit[0]} too low"})
            continue
        if broker_soft is not None and broker_soft < n + FD_MARGIN:
            skipped.append({"connections": n, "reason": f"broker 'Max open files' soft limit {broker_soft} "
                                                        f"< {n} + {FD_MARGIN}"})
            continue
        progress(f"connections[{target.name}]: {n} connection(s)")
        pt = _run_async(_point(host, int(port), topic, batch, n, cfg["warmup_s"], cfg["window_s"], target.pid))
        points.append(pt)
        progress(f"connections[{target.name}]: {n}: {pt['records_per_s']:,.0f} rec/s {pt['mb_per_s']} MB/s, "
                 f"broker {pt['broker_cpu_cores']} cores, client {pt['client_cpu_cores']} cores, "
                 f"rtt p50 {pt['rtt_ms_p50']} ms, broker RSS {pt['broker_rss_max_kib']} KiB")
    for s in skipped:
        notes_extra.append(f"skipped {s['connections']} connections: {s['reason']}")
    client_bound = [p["connections"] for p in points if p["client_cpu_cores"] >= 0.85]
    if client_bound:
        notes_extra.append(f"the one-process client used >= 0.85 core at {client_bound} connections: "
                           f"those points are bounded by the client, not the broker")
    bad = [p["connections"] for p in points
           if p["produce_errors"] or p["connections_dropped"] or p["open_failures"]]
    if bad:
        notes_extra.append(f"errors, dropped or unopened connections at {bad} (see the points)")
    notes = (
        f"One asyncio process, kbroker's BrokerConnection opened N times ({OPEN_CONCURRENCY} opening at once); "
        f"each sends Produce (acks=1) of one pre-built {len(batch)} B RecordBatch ({RECORDS_PER_BATCH} x "
        f"{RECORD_SIZE} B records, no compression) to partition i % {PARTITIONS} in a loop, 1 in flight. "
        f"{cfg['warmup_s']} s warm-up, then a {cfg['window_s']} s window: responses counted in it; MB/s counts "
        f"record-batch bytes. Broker CPU = broker process utime+stime over the window; client CPU = the "
        f"client's event-loop thread. Broker RSS: VmRSS before the connections open, sampled every 0.25 s "
        f"in the window (max), VmHWM after it; a broker holding records in memory (Tansu's memory:// "
        f"storage) grows with the data written as well as with connections. Client RLIMIT_NOFILE soft {client_limit[0]} (hard {client_limit[1]}); broker Max open "
        f"files soft {broker_soft} (hard {broker_hard}). {os.cpu_count()} CPUs shared by client and broker "
        f"(load average {os.getloadavg()[0]:.1f} at the end).")
    if notes_extra:
        notes += " " + "; ".join(notes_extra) + "."
    return {"name": "connections", "unit": "records/s", "target": target.name,
            "batch_bytes": len(batch), "broker_nofile": [broker_soft, broker_hard],
            "client_nofile": list(client_limit), "skipped": skipped, "points": points, "notes": notes}
