"""Measurement plumbing for the foundation benchmark, and the worker processes it starts.

Library side (imported by ``broker_bench``):
  * ``cpu_seconds(pid)``: user + system CPU of a whole process (all threads) from ``/proc/<pid>/stat``.
  * ``summary(values)``: median with min and max, the shape every figure is reported in.
  * ``kcat_env()``: an environment that runs Debian's kcat with the newer librdkafka bundled in the
    confluent-kafka wheel (a private folder holding a ``librdkafka.so.1`` link, on LD_LIBRARY_PATH).
  * ``machine_busy_seconds()``: busy CPU seconds of the whole machine (``/proc/stat``), to show what else ran.
  * ``children_cpu_seconds()``: CPU of the waited-for child processes (the load generators kcat, ...).
  * ``pin_process(pid, cpus)``: every thread of a process on a CPU set (client and broker apart).
  * ``machine_facts()``, ``progress()``.
  * the capacity client (``produce_frames`` / ``fetch_all``): raw sockets, the same code for the broker
    and for the in-memory baseline servers.

Worker side (``python -m kbroker.perf.harness <command>``):
  * ``producer``: one confluent-kafka producer process; says ``ready``, waits for a line on stdin,
    produces a bounded number of records for a bounded time, prints one JSON line.
  * ``mock``: hosts librdkafka's mock cluster (``test.mock.num.brokers=1``), prints its address and
    stays alive until stdin closes.
  * ``sink``: the capacity baselines. ``--mode produce`` reads request frames with ``recv_into`` into
    one reused buffer and answers each with a canned Produce response; ``--mode fetch`` answers each
    request with the next recorded Fetch response, served from memory.

Every loop here is bounded in count and in time.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import resource
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")
_SIZE = struct.Struct(">i")
_CORR = struct.Struct(">i")


# ---- measurement helpers --------------------------------------------------------------------------
def cpu_user_system(pid: int) -> tuple[float, float]:
    """(utime, stime) of the process (the kernel sums them over all its threads), in seconds."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        raw = f.read()
    # The command name (field 2) may hold spaces: split after its closing parenthesis.
    fields = raw[raw.rindex(b")") + 2:].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK   # fields 14 and 15 of stat(5)


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process, in seconds."""
    user, system = cpu_user_system(pid)
    return user + system


def machine_busy_seconds() -> float:
    """CPU seconds every core of the machine spent busy so far (``/proc/stat``: user, nice, system,
    irq, softirq, steal); over a window, the machine's busy cores are its difference ÷ the wall time."""
    with open("/proc/stat", "rb") as f:
        fields = f.readline().split()
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def children_cpu_seconds() -> float:
    """CPU seconds of this process's children that have been waited for (e.g. each finished kcat run)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def pin_process(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` on ``cpus`` (threads it starts later inherit their creator's mask)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, FileNotFoundError):
            pass            # the thread ended meanwhile


def run_ns(pid: int) -> int:
    """On-CPU time of every live thread of ``pid`` in ns (/proc/<pid>/task/*/schedstat, the scheduler's
    own accounting): /proc/<pid>/stat's utime/stime come in 10 ms ticks, sampled, so a few thousand
    20 µs requests can read as 0 there. A thread that ended between two reads drops out of the sum
    (the brokers measured here keep their threads)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass        # a thread that ended in between
    return total


def run_seconds(pid: int) -> float:
    """run_ns in seconds."""
    return run_ns(pid) / 1e9


def parse_variant(spec: str) -> tuple[str, dict, dict]:
    """A broker variant on a benchmark's command line, ``NAME[:key=value,...[:ENV=value,...]]`` ->
    (name, broker config overrides, environment)."""
    name, overrides, env = (spec.split(":", 2) + ["", ""])[:3]
    if not name:
        raise ValueError(f"variant {spec!r} has no name")
    return (name, dict(kv.split("=", 1) for kv in overrides.split(",") if kv),
            dict(kv.split("=", 1) for kv in env.split(",") if kv))


def summary(values) -> dict:
    vals = [v for v in values if v is not None]
    if not vals:
        return {"median": None, "min": None, "max": None, "n": 0, "values": []}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals),
            "values": list(values)}


_T0 = time.monotonic()


def progress(msg: str) -> None:
    print(f"[{time.monotonic() - _T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def machine_facts() -> dict:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_kib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    except OSError:
        pass
    import confluent_kafka
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "mem_total_gib": round(mem_kib / 1024 / 1024, 1) if mem_kib else None,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "confluent_kafka": importlib.metadata.version("confluent-kafka"),
        "librdkafka": confluent_kafka.libversion()[0],
    }


def bundled_librdkafka() -> Path:
    import confluent_kafka
    libs = Path(confluent_kafka.__file__).resolve().parent.parent / "confluent_kafka.libs"
    found = sorted(libs.glob("librdkafka-*.so.1"))
    if not found:
        raise RuntimeError(f"no bundled librdkafka in {libs}")
    return found[0]


def kcat_env(workdir: Path) -> dict:
    """Environment for kcat with the confluent-kafka wheel's librdkafka (Debian's 2.0.2 cannot parse
    Tansu's ApiVersions v3 reply, and one binary for every target keeps the client constant)."""
    libdir = workdir / "kcat-lib"
    libdir.mkdir(parents=True, exist_ok=True)
    link = libdir / "librdkafka.so.1"
    if not link.exists():
        link.symlink_to(bundled_librdkafka())
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = str(libdir) + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    return env


# ---- raw framing ----------------------------------------------------------------------------------
def recv_exact(sock: socket.socket, view: memoryview) -> None:
    got, n = 0, len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("peer closed the connection")
        got += k


def recv_frame(sock: socket.socket, head: bytearray) -> bytearray:
    """One size-prefixed frame; returns its body (size prefix removed) in a new buffer."""
    recv_exact(sock, memoryview(head))
    (size,) = _SIZE.unpack(head)
    body = bytearray(size)
    recv_exact(sock, memoryview(body))
    return body


def exit_with_parent() -> None:
    """A helper server's process ends when its parent closes its stdin or exits (a thread waits for the
    EOF), whatever its main thread is blocked in."""
    def watch():
        sys.stdin.read()
        os._exit(0)
    threading.Thread(target=watch, daemon=True).start()


def connect(host: str, port: int, timeout: float = 60.0) -> socket.socket:
    s = socket.create_connection((host, port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


# ---- capacity client: the same code against the broker and against the baselines ----------------
def produce_frames(addr: tuple[str, int], frame_sets: list[list[bytearray]], max_in_flight: int = 5,
                   timeout: float = 120.0) -> dict:
    """Send each connection's frames in order (one connection per frame set, ``max_in_flight``
    requests outstanding on each) and read every response. Frames are reused buffers whose correlation
    id is rewritten before each send. Returns timing and the raw responses."""
    socks = [connect(*addr) for _ in frame_sets]
    results = [None] * len(frame_sets)
    errors = []
    start = threading.Barrier(len(frame_sets) * 2 + 1)
    deadline = time.monotonic() + timeout

    def sender(i, sock, frames, sem):
        try:
            start.wait()
            for n, frame in enumerate(frames):
                while not sem.acquire(timeout=1.0):
                    if time.monotonic() > deadline or errors:
                        raise TimeoutError("produce capacity run over its time bound")
                _CORR.pack_into(frame, 8, n)
                sock.sendall(frame)
        except Exception as e:  # noqa: BLE001 - reported by the caller
            errors.append(e)

    def receiver(i, sock, count, sem):
        head = bytearray(4)
        out = []
        try:
            start.wait()
            sock.settimeout(max(1.0, deadline - time.monotonic()))
            for _ in range(count):
                out.append(recv_frame(sock, head))
                sem.release()
            results[i] = (out, time.monotonic())
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = []
    for i, (sock, frames) in enumerate(zip(socks, frame_sets)):
        sem = threading.Semaphore(max_in_flight)
        threads.append(threading.Thread(target=sender, args=(i, sock, frames, sem), daemon=True))
        threads.append(threading.Thread(target=receiver, args=(i, sock, len(frames), sem), daemon=True))
    for t in threads:
        t.start()
    start.wait()
    t0 = time.monotonic()
    for t in threads:
        t.join(timeout=max(0.1, deadline - time.monotonic() + 5))
    for s in socks:
        s.close()
    if errors:
        raise RuntimeError(f"produce capacity run failed: {errors[0]!r}")
    if any(r is None for r in results):
        raise RuntimeError("produce capacity run did not finish")
    t1 = max(r[1] for r in results)
    return {"seconds": t1 - t0, "responses": [r[0] for r in results],
            "bytes": sum(len(f) for fs in frame_sets for f in fs)}


def fetch_all(addr: tuple[str, int], topic: str, plans: list[dict[int, int]], partition_max_bytes: int,
              version: int = 11, timeout: float = 120.0, isolation_level: int = 0) -> dict:
    """One connection per plan ({partition: end_offset}); each fetches its partitions from offset 0 to
    the end offset with one request outstanding, finding the next offset from the batch headers.
    Returns timing, record bytes received, and the raw response frames (for the replay baseline).
    ``isolation_level`` 1: read_committed (the end offsets must then be at most the LSO)."""
    from kbroker._native.batch import iter_batches
    from kbroker.protocol.api import decode_response, encode_request

    socks = [connect(*addr) for _ in plans]
    results = [None] * len(plans)
    errors = []
    start = threading.Barrier(len(plans) + 1)
    deadline = time.monotonic() + timeout

    def run(i, sock, plan):
        head = bytearray(4)
        offsets = {p: 0 for p in plan}
        frames, nbytes, corr = [], 0, 0
        try:
            start.wait()
            sock.settimeout(max(1.0, deadline - time.monotonic()))
            while any(offsets[p] < end for p, end in plan.items()):
                if time.monotonic() > deadline:
                    raise TimeoutError("fetch capacity run over its time bound")
                parts = [{"partition": p, "current_leader_epoch": -1, "fetch_offset": offsets[p],
                          "log_start_offset": -1, "partition_max_bytes": partition_max_bytes}
                         for p, end in plan.items() if offsets[p] < end]
                req = encode_request(1, version, corr, "kbroker-perf", {
                    "replica_id": -1, "max_wait_ms": 500, "min_bytes": 1, "max_bytes": 64 << 20,
                    "isolation_level": isolation_level, "session_id": 0, "session_epoch": -1,
                    "topics": [{"topic": topic, "partitions": parts}], "forgotten_topics_data": [],
                    "rack_id": ""})
                sock.sendall(req)
                frame = recv_frame(sock, head)
                frames.append(frame)
                _corr, body = decode_response(1, version, memoryview(frame))
                for t in body["responses"]:
                    for p in t["partitions"]:
                        if p["error_code"]:
                            raise RuntimeError(f"fetch error {p['error_code']} on partition {p['partition_index']}")
                        recs = p["records"]
                        if recs is None or len(recs) == 0:
                            continue
                        batches = iter_batches(recs)
                        if batches:
                            offsets[p["partition_index"]] = batches[-1].next_offset
                            nbytes += sum(b.size for b in batches)
                corr += 1
            results[i] = (frames, nbytes, time.monotonic())
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i, s, plan), daemon=True)
               for i, (s, plan) in enumerate(zip(socks, plans))]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.monotonic()
    for t in threads:
        t.join(timeout=max(0.1, deadline - time.monotonic() + 5))
    for s in socks:
        s.close()
    if errors:
        raise RuntimeError(f"fetch capacity run failed: {errors[0]!r}")
    if any(r is None for r in results):
        raise RuntimeError("fetch capacity run did not finish")
    return {"seconds": max(r[2] for r in results) - t0, "record_bytes": sum(r[1] for r in results),
            "frames": [r[0] for r in results], "requests": sum(len(r[0]) for r in results)}


def write_replay(path: Path, frame_sets: list[list[bytearray]]) -> None:
    """Store recorded response frames (bodies) for the fetch baseline: per connection a count, then
    each frame size-prefixed exactly as it travelled."""
    with open(path, "wb") as f:
        f.write(_SIZE.pack(len(frame_sets)))
        for frames in frame_sets:
            f.write(_SIZE.pack(len(frames)))
            for fr in frames:
                f.write(_SIZE.pack(len(fr)))
                f.write(fr)


def _read_replay(path: Path) -> list[list[memoryview]]:
    data = memoryview(Path(path).read_bytes())
    (nconn,) = _SIZE.unpack_from(data, 0)
    pos, sets = 4, []
    for _ in range(nconn):
        (n,) = _SIZE.unpack_from(data, pos)
        pos += 4
        frames = []
        for _ in range(n):
            (size,) = _SIZE.unpack_from(data, pos)
            frames.append(data[pos:pos + 4 + size])   # with its size prefix: sent as is
            pos += 4 + size
        sets.append(frames)
    return sets


# ---- workers --------------------------------------------------------------------------------------
def _producer_worker(a) -> int:
    from confluent_kafka import Producer

    conf = {"bootstrap.servers": a.bootstrap, "acks": "1", "linger.ms": a.linger_ms,
            "batch.size": a.batch_size, "compression.type": "none", "message.timeout.ms": 60000,
            "queue.buffering.max.messages": 500000, "queue.buffering.max.kbytes": 1048576,
            "client.id": "kbroker-perf"}
    p = Producer(conf)
    md = p.list_topics(a.topic, timeout=30)
    if a.topic not in md.topics or md.topics[a.topic].error is not None:
        print(json.dumps({"error": f"topic {a.topic} not available"}), flush=True)
        return 1
    payload = (b"0123456789abcdef" * ((a.size + 15) // 16))[:a.size]
    counts = {"ok": 0, "err": 0, "first_error": None}

    def delivered(err, _msg):
        if err is None:
            counts["ok"] += 1
        else:
            counts["err"] += 1
            if counts["first_error"] is None:
                counts["first_error"] = str(err)

    print("ready", flush=True)
    sys.stdin.readline()
    t0 = time.monotonic()
    deadline = t0 + a.max_seconds
    produce, poll, topic = p.produce, p.poll, a.topic
    sent = 0
    while sent < a.records:
        try:
            produce(topic, payload, on_delivery=delivered)
            sent += 1
            if not sent & 1023:
                poll(0)
                if time.monotonic() > deadline:
                    break
        except BufferError:
            poll(0.002)
    left = p.flush(max(5.0, a.max_seconds))
    t1 = time.monotonic()
    print(json.dumps({"sent": sent, "delivered": counts["ok"], "errors": counts["err"], "unflushed": left,
                      "first_error": counts["first_error"], "t0": t0, "t1": t1}), flush=True)
    return 0


def _mock_worker(a) -> int:
    from confluent_kafka import Producer

    p = Producer({"test.mock.num.brokers": 1, "client.id": "kbroker-perf-mock-host", "log_level": 4})
    md = p.list_topics(timeout=10)
    addrs = ",".join(f"{b.host}:{b.port}" for b in md.brokers.values())
    print(addrs, flush=True)
    sys.stdin.read()          # returns when the parent closes our stdin (or dies)
    return 0


def _canned_produce_response() -> bytes:
    from kbroker.protocol.api import encode_response
    chunks = encode_response(0, 7, 0, {"responses": [{"name": "capacity", "partition_responses": [
        {"index": 0, "error_code": 0, "base_offset": 0, "log_append_time_ms": -1, "log_start_offset": 0}]}],
        "throttle_time_ms": 0})
    return b"".join(bytes(c) for c in chunks)


def _sink_worker(a) -> int:
    """Baseline servers. Each connection is served by its own thread, blocking sockets."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    replay = _read_replay(Path(a.replay)) if a.mode == "fetch" else None
    canned = bytearray(_canned_produce_response())
    print(srv.getsockname()[1], flush=True)
    deadline = time.monotonic() + a.max_seconds

    def serve_produce(conn):
        head = bytearray(4)
        hv = memoryview(head)
        buf = bytearray(1 << 20)
        resp = bytearray(canned)
        while time.monotonic() < deadline:
            try:
                recv_exact(conn, hv)
            except (ConnectionError, OSError):
                return
            (size,) = _SIZE.unpack(head)
            if size > len(buf):
                buf = bytearray(size)
            view = memoryview(buf)[:size]
            recv_exact(conn, view)
            resp[4:8] = view[4:8]              # the request's correlation id
            conn.sendall(resp)

    def serve_fetch(conn, frames):
        head = bytearray(4)
        hv = memoryview(head)
        buf = bytearray(1 << 16)
        for fr in frames:
            if time.monotonic() > deadline:
                return
            try:
                recv_exact(conn, hv)
                (size,) = _SIZE.unpack(head)
                if size > len(buf):
                    buf = bytearray(size)
                recv_exact(conn, memoryview(buf)[:size])
            except (ConnectionError, OSError):
                return
            conn.sendall(fr)

    n = 0
    srv.settimeout(1.0)
    while time.monotonic() < deadline:
        try:
            conn, _ = srv.accept()
        except socket.timeout:
            continue
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if a.mode == "produce":
            t = threading.Thread(target=serve_produce, args=(conn,), daemon=True)
        else:
            t = threading.Thread(target=serve_fetch, args=(conn, replay[n % len(replay)]), daemon=True)
        n += 1
        t.start()
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kbroker.perf.harness")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("producer")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--records", type=int, required=True)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--max-seconds", type=float, default=30.0)
    p.add_argument("--linger-ms", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=1000000)
    sub.add_parser("mock")
    s = sub.add_parser("sink")
    s.add_argument("--mode", choices=("produce", "fetch"), required=True)
    s.add_argument("--replay")
    s.add_argument("--max-seconds", type=float, default=600.0)
    a = ap.parse_args(argv)
    return {"producer": _producer_worker, "mock": _mock_worker, "sink": _sink_worker}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
