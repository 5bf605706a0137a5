"""Where a one-record Produce request's broker time goes: py-spy samples and a callgrind instruction count
of one kbroker broker serving request_bench's producer (linger.ms=0, batch.num.messages=1, acks=1, 100 B).

    python -m kbroker.perf.profile_request pyspy     [--requests 200000] [--seconds 6] [--out DIR]
    python -m kbroker.perf.profile_request callgrind [--requests 3000] [--rf3 [--acks all]] [--partitions N] [--acls N]
        [--broker-env K=V,..] [--out DIR]
    python -m kbroker.perf.profile_request capacity  [--batches 1024] [--rounds 3] [--variant NAME:k=v,..:ENV=v,..]
        [--persist write-shm --persist splice-shm --persist write-disk ...] [--storage shm|disk] [--no-profile]
    ... [--workload fetch]: small Fetch v11 requests with 1 in flight (request_bench's fetch, one ~170 B
    batch per answer) over records written first, instead of Produce requests
    ... --raw --version V / --workload fetch --version V: the raw frames (produce) or the one-partition
    fetch (as --partitions 1) at request version V (default 7 / 11; Fetch v13+ names the topic by its id)
    callgrind --workload fetch --partitions N [--data-partitions K]: each Fetch names N partitions of one
    topic, K of them (default N) with one batch to read per answer, the others at their high watermark

* ``pyspy``: ``py-spy record --native --format raw`` of the broker (all threads; samples inside blocking
  waits are counted as idle and left out) while the producer runs; prints and writes
  (``DIR/pyspy-produce.txt`` + the raw stacks) the functions with the largest share of busy samples,
  self and inclusive, for the event-loop thread and for all threads.

* ``callgrind``: the broker runs under ``valgrind --tool=callgrind --instr-atstart=no``; instrumentation is
  switched on (``callgrind_control -i on``) only for the counted requests, after start-up and a warm-up,
  and off after the last delivery report, so the profile is the request path alone. Prints instructions
  per request (user space) and ``callgrind_annotate``'s top functions, self and inclusive (``DIR/callgrind-produce.txt``).
  ``--rf3``: three brokers, the topic replicated on all of them, the profiled broker (under valgrind) its
  leader; the count then also holds the leader's share of replication (its followers' fetches)
  (``DIR/callgrind-produce-rf3.txt``). ``--partitions N`` (N > 1): raw Produce v7 frames of N partitions x one
  record, 1 in flight, instead of the producer (librdkafka sends one partition per request)
  (``DIR/callgrind-produce-Np.txt``); ``--raw`` the same frames for one partition (one frame per read: a
  steadier count than the producer's, whose frames per read vary from run to run).

* ``capacity``: where the broker's CPU per GB of the suite's capacity produce goes (``broker_bench``'s
  ~512 KiB RecordBatches as Produce v7 over two raw-socket connections). Interleaved rounds of the broker
  and of the in-memory ``recv_into`` sink (the suite's baseline, the same client code), each timed by
  ``/proc`` (user and system CPU-seconds per GB); then one run under ``strace -c -f`` (syscalls per
  request) and one under ``perf record -g`` (samples put in buckets: segment write, receive, send, epoll,
  other kernel, CRC32C, other native batch/segment/request code, interpreter), the buckets' shares
  scaled to the CPU-seconds per GB of that run (``DIR/capacity-produce.txt``). ``--variant`` runs several
  brokers side by side (settings or environment, e.g. ``PYTHONPATH`` of a changed tree), the first profiled.
  ``--persist`` adds persisting sinks to the rounds, the floors of a broker that keeps the data: ``write``
  (recv_into, then write(2) into a file: two copies) and ``splice`` (socket -> pipe -> file: one copy), on
  tmpfs (``shm``) or disk (``disk``, /var/tmp); each broker is also reported ÷ each of them, same round.
  After the rounds each broker runs once more under ``perf stat`` on the syscalls:sys_enter_* tracepoints:
  exact syscalls per request (recvfrom, epoll_wait: the loop turns of a large request) at full speed.

One broker with real ZooKeeper (``kbroker.testing.LocalCluster``), log dir on tmpfs, stopped by its PID;
every wait is bounded. Needs py-spy (in the venv) / valgrind (Debian's package) / perf and strace (capacity).
"""
from __future__ import annotations

import argparse
import collections
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from kbroker.testing import LocalCluster, api_versions_ok, controller_known, wait_until

from . import harness as H
from .request_bench import _LineReader, _stop_child


class _WrappedCluster(LocalCluster):
    """LocalCluster whose broker command runs under a wrapper (valgrind); start-up waits are longer."""

    def __init__(self, root, wrapper: list[str], wrapped=(0,), **kw):
        super().__init__(root, **kw)
        self.wrapper = wrapper
        self.wrapped = frozenset(wrapped)       # the broker ids run under the wrapper; the others as usual

    def start_broker(self, broker_id: int, timeout: float = 600.0, extra: dict | None = None):
        if broker_id not in self.wrapped:
            return super().start_broker(broker_id, extra=extra)
        b = self.brokers[broker_id]
        self.write_config(b, extra)
        with open(b.log_path, "ab") as log:
            b.proc = subprocess.Popen([*self.wrapper, sys.executable, "-m", "kbroker", "serve", "--config",
                                       str(b.config_path)], stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True, env=dict(os.environ, **(self.env or {})))

        def ready():
            if b.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {b.proc.returncode}:\n{b.log_tail()}")
            return api_versions_ok(b.port) and controller_known(b.port) is not None
        wait_until(ready, timeout, "the wrapped broker to answer", interval=1.0)
        return b


def _producer(bootstrap: str, topic: str, count: int, warmup: int, max_s: float, acks: str = "1"):
    cmd = [sys.executable, "-m", "kbroker.perf.request_bench", "produce-worker", "--bootstrap", bootstrap,
           "--topic", topic, "--count", str(count), "--warmup", str(warmup), "--max-seconds", str(max_s),
           "--acks", acks]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
    lines = _LineReader(proc)
    if lines.readline(120 + max_s) != "ready":
        _stop_child(proc)
        raise RuntimeError("producer worker did not get ready")
    return proc, lines


def _go(proc) -> None:
    proc.stdin.write(b"go\n")
    proc.stdin.flush()


def _cluster(root: Path, wrapper: list[str] | None, brokers: int = 1, env: dict | None = None,
             acls: int = 0) -> LocalCluster:
    overrides = {"auto.create.topics.enable": "false", "zookeeper.session.timeout.ms": 30000}
    if acls:
        # the cluster has no ACL (allow.everyone: the brokers' own requests pass); topics have ``acls``
        overrides.update({"authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
                          "allow.everyone.if.no.acl.found": "true"})
    if wrapper:
        return _WrappedCluster(root, wrapper, brokers=brokers, num_partitions=1, overrides=overrides, env=env)
    return LocalCluster(root, brokers=brokers, num_partitions=1, overrides=overrides, env=env)


def _seed_acls(c: LocalCluster, topic: str, n: int) -> None:
    """``n`` ACL entries, as a busy cluster has them: 40% on other literal topics, 50% on prefixed
    patterns (10 each), the rest on ``topic`` for other principals and hosts, one of them letting
    User:ANONYMOUS write it; then wait until the broker applied them all (DescribeAcls)."""
    from kazoo.client import KazooClient

    from kbroker.security.acl import AclEntry, Operation, PatternType, Permission, ResourcePattern, ResourceType
    from kbroker.security.authorizer import AclAuthorizer
    from kbroker.zk.acls import AclZk
    import asyncio
    T = ResourceType.TOPIC
    plan: dict = {}
    literal, prefixed = n * 4 // 10, n // 2 // 10
    for i in range(literal):
        plan[ResourcePattern(T, f"other-{i}", PatternType.LITERAL)] = {
            AclEntry(f"User:u{i}", "*", Operation.READ, Permission.ALLOW)}
    for i in range(prefixed):
        plan[ResourcePattern(T, f"pre{i}-", PatternType.PREFIXED)] = {
            AclEntry(f"User:p{j}", "*", Operation.WRITE, Permission.ALLOW) for j in range(10)}
    rest = n - literal - prefixed * 10
    plan[ResourcePattern(T, topic, PatternType.LITERAL)] = {
        AclEntry(f"User:t{j}", f"10.0.0.{j % 250}", Operation.WRITE, Permission.ALLOW) for j in range(rest - 1)} | {
        AclEntry("User:ANONYMOUS", "*", Operation.WRITE, Permission.ALLOW)}
    zk = KazooClient(hosts=c.zk_connect)
    zk.start(30)
    loop = asyncio.new_event_loop()
    try:
        auth = AclAuthorizer()
        auth.store, auth.loop = AclZk(zk), loop
        auth.store.ensure_paths()
        for r, entries in plan.items():
            auth.update(r, lambda cur, entries=entries: cur | entries)
    finally:
        zk.stop()
        zk.close()
        loop.close()
    from kbroker.client.admin import Admin

    async def count():
        async with Admin(c.bootstrap, client_id="kbroker-perf-acls") as admin:
            conn = await admin.cluster.any_connection()
            _, resp = await conn.send(29, {"resource_type_filter": 1, "resource_name_filter": None,
                                           "pattern_type_filter": 1, "principal_filter": None, "host_filter": None,
                                           "operation": 1, "permission_type": 1})
            return sum(len(r["acls"]) for r in resp["resources"])
    wait_until(lambda: asyncio.run(count()) >= n, 600, "the broker applied the ACLs", interval=1.0)


def _topic(c: LocalCluster, partitions: int = 1) -> str:
    """``partitions`` partitions (default one); with several brokers replicated on all of them, broker 0
    their (preferred) leader."""
    from .targets import admin_create, wait_topic
    topic = f"profile-{uuid.uuid4().hex[:8]}"
    if len(c.brokers) > 1:
        from confluent_kafka.admin import AdminClient, NewTopic
        admin = AdminClient({"bootstrap.servers": c.bootstrap, "client.id": "kbroker-perf-setup"})
        admin.create_topics([NewTopic(topic, partitions, replica_assignment=[sorted(c.brokers)] * partitions)],
                            operation_timeout=60, request_timeout=60)[topic].result(timeout=120)
    elif not admin_create(c.bootstrap, topic, partitions):
        raise RuntimeError(f"could not create {topic}")
    wait_topic(c.bootstrap, topic, partitions, timeout=120)
    return topic


def _raw_produce(bootstrap: str, topic: str, partitions: int, count: int, max_s: float, seq: int = -1,
                 version: int = 7) -> int:
    """``count`` Produce v``version`` requests (acks=1) each carrying ``partitions`` partitions x one 100 B record,
    one in flight over a raw socket (librdkafka sends one partition per request) -> requests answered
    without error. The same frame every time (the broker stamps its own receive buffer), unless ``seq``
    >= 0: then idempotent batches (producer id 1, epoch 0) at sequences ``seq``, ``seq`` + 1, ... (each
    frame patched: its sequence and CRC)."""
    import socket
    import struct

    from kbroker._native.batch import BatchBuilder
    from kbroker.protocol import api
    b = BatchBuilder()
    b.append(int(time.time() * 1000), None, (b"0123456789abcdef" * 7)[:100])
    batch = b.build()
    body = {"transactional_id": None, "acks": 1, "timeout_ms": 30000, "topic_data": [
        {"name": topic, "partition_data": [{"index": p, "records": batch} for p in range(partitions)]}]}
    frame = api.encode_request(0, version, 1, "kbroker-perf-request", body)
    if seq >= 0:
        from kbroker._native.crc import crc32c
        frame = bytearray(frame)
        at = [i for i in range(len(frame) - len(batch) + 1) if frame[i:i + len(batch)] == batch]
        for i in at:
            struct.pack_into(">qh", frame, i + 43, 1, 0)
    host, port = bootstrap.rsplit(":", 1)
    deadline = time.monotonic() + max_s
    ok = 0
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for k in range(count):
            if seq >= 0:
                for i in at:
                    struct.pack_into(">i", frame, i + 53, seq + k)
                    struct.pack_into(">I", frame, i + 17, crc32c(bytes(frame[i + 21:i + len(batch)])))
            s.sendall(frame)
            head = s.recv(4, socket.MSG_WAITALL)
            data = s.recv(struct.unpack(">i", head)[0], socket.MSG_WAITALL)
            _cid, resp = api.decode_response(0, version, data)
            if all(p["error_code"] == 0 for t in resp["responses"] for p in t["partition_responses"]):
                ok += 1
            if time.monotonic() > deadline:
                break
    return ok


# py-spy --native cannot tell a waiting thread from a running one (its idle filter needs the Python-only
# view), so samples inside these blocking calls are counted as idle and left out.
_WAITS = frozenset(("epoll_wait", "select_epoll_poll", "PyThread_acquire_lock_timed", "pthread_cond_wait",
                    "pthread_cond_timedwait", "sem_clockwait", "sem_timedwait", "__select", "select", "poll",
                    "__poll", "accept4", "select_select_impl", "select_poll_poll_impl", "nanosleep",
                    "clock_nanosleep", "time_sleep"))


def summarize_raw(raw_path: Path, top: int = 30) -> str:
    """py-spy raw output ("frame;frame;... count" lines) -> self and inclusive shares per function, over
    the busy samples of all threads and over the event-loop thread's busy samples alone."""
    counts = {"all": (collections.Counter(), collections.Counter()),
              "loop": (collections.Counter(), collections.Counter())}
    totals = {"all": 0, "loop": 0}
    idle = 0
    for line in raw_path.read_text(errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        n = int(n)
        frames = [f.split(" (")[0].strip() for f in stack.split(";")]
        if any(f in _WAITS for f in frames):
            idle += n
            continue
        which = ["all"]
        if any(f == "BaseEventLoop._run_once" for f in frames):
            which.append("loop")
        for w in which:
            self_c, incl_c = counts[w]
            totals[w] += n
            self_c[frames[-1]] += n
            for f in set(frames):
                incl_c[f] += n
    if not totals["all"]:
        return "no samples\n"
    out = [f"{totals['all']} busy samples ({idle} idle ones left out: threads inside blocking waits), "
           f"{totals['loop']} of them on the event-loop thread"]
    for w, title in (("loop", "event-loop thread"), ("all", "all threads")):
        self_c, incl_c = counts[w]
        t = totals[w] or 1
        out += ["", f"== {title}: self % ==", "------  --------"]
        out += [f"{100 * n / t:5.1f}%  {f}" for f, n in self_c.most_common(top)]
        out += ["", f"== {title}: inclusive % ==", "------  --------"]
        out += [f"{100 * n / t:5.1f}%  {f}" for f, n in incl_c.most_common(top)]
    return "\n".join(out) + "\n"


def _fill_for_fetch(c: LocalCluster, topic: str, count: int) -> None:
    """Write ``count`` + 500 one-record batches (the producer worker), for small fetches to read."""
    proc, lines = _producer(c.bootstrap, topic, count, 500, 600)
    try:
        _go(proc)
        import json
        r = json.loads(lines.readline(900))
    finally:
        _stop_child(proc)
    if r.get("delivered") != count:
        raise RuntimeError(f"fill for the fetch profile: {r}")


def _fetch(c: LocalCluster, topic: str, count: int, warmup: int, max_s: float, depth: int = 1) -> dict:
    from .request_bench import fetch_run
    b = c.brokers[0]
    return fetch_run(f"127.0.0.1:{b.port}", topic, b.pid, 500, count, warmup, depth, max_s)


def _fill_partitions(c: LocalCluster, topic: str, parts: int, count: int) -> None:
    """``count`` one-record batches (100 B values) in each of partitions 0..parts-1 (confluent-kafka,
    one record per Produce request), for ``_fetch_partitions`` to read."""
    from confluent_kafka import Producer
    prod = Producer({"bootstrap.servers": c.bootstrap, "linger.ms": 0, "batch.num.messages": 1, "acks": 1,
                     "client.id": "kbroker-perf-setup"})
    errors = []
    deadline = time.monotonic() + 900
    for i in range(count):
        for k in range(parts):
            prod.produce(topic, value=b"x" * 100, partition=k,
                         on_delivery=lambda err, _m: errors.append(err) if err else None)
        prod.poll(0)
        if time.monotonic() > deadline:
            raise TimeoutError(f"fill for the fetch profile over 900 s after {i} rounds")
    if prod.flush(300) or errors:
        raise RuntimeError(f"fill for the fetch profile: {len(errors)} errors, e.g. {errors[:1]}")


def _fetch_partitions(c: LocalCluster, topic: str, parts: int, data_parts: int, count: int, warmup: int,
                      max_s: float, version: int = 0) -> int:
    """``warmup`` then ``count`` Fetch requests (v11, or ``version``; v13+ by the topic's id; 1 in flight)
    each naming partitions 0..parts-1: the
    first ``data_parts`` (filled by ``_fill_partitions``) at the next offset, one batch each (partition
    limit 1.5 batches: the first partition's batch whole as KIP-74, each later one's within its limit),
    the others at their high watermark (empty rows, as most partitions of a consumer's fetch).
    Every 50th answer is checked. -> the counted requests."""
    from kbroker._native.batch import iter_batches
    from kbroker.protocol.api import decode_response, encode_request
    from .request_bench import FETCH_VERSION

    b = c.brokers[0]
    version = version or FETCH_VERSION
    sock = H.connect("127.0.0.1", b.port, timeout=max_s)
    head = bytearray(4)
    topic_id = _topic_id(f"127.0.0.1:{b.port}", topic) if version >= 13 else None

    def frame(corr: int, offset: int, limit: int) -> bytes:
        return encode_request(1, version, corr, "kbroker-perf-request", {
            "replica_id": -1, "max_wait_ms": 500, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
            "topics": [{"topic": topic, "topic_id": topic_id, "partitions": [{
                "partition": k, "current_leader_epoch": -1, "fetch_offset": offset if k < data_parts else 0,
                "last_fetched_epoch": -1, "log_start_offset": -1, "partition_max_bytes": limit}
                for k in range(parts)]}]})

    def answer(corr: int) -> list:
        resp = H.recv_frame(sock, head)
        if int.from_bytes(resp[:4], "big") != corr:
            raise RuntimeError(f"fetch answer {corr} carries correlation id {int.from_bytes(resp[:4], 'big')}")
        return resp

    def check(resp, offset: int) -> None:
        _, body = decode_response(1, version, memoryview(resp))
        rows = body["responses"][0]["partitions"]
        got = [(r["error_code"], [(x.base_offset, x.record_count) for x in iter_batches(r["records"] or b"")])
               for r in rows]
        want = [(0, [(offset, 1)] if k < data_parts else []) for k in range(parts)]
        if got != want:
            raise RuntimeError(f"fetch at {offset}: (error, [(base offset, records)]) per partition {got}, "
                               f"wanted {want}")

    try:
        sock.sendall(frame(0, 0, 1))
        _, body = decode_response(1, version, memoryview(answer(0)))
        size = len(body["responses"][0]["partitions"][0]["records"] or b"")
        if not size:
            raise RuntimeError("fetch profile: partition 0 holds no batch")
        limit = size + size // 2
        deadline = time.monotonic() + max_s
        for i in range(warmup + count):
            if i == warmup:
                _instrument("on", b.pid)
            sock.sendall(frame(i + 1, i, limit))
            resp = answer(i + 1)
            if i % 50 == 0 or i == warmup + count - 1:
                check(resp, i)
            if time.monotonic() > deadline:
                raise TimeoutError(f"fetch loop over its {max_s} s bound after {i} answers")
        _instrument("off", b.pid)
    finally:
        sock.close()
    return count


def _topic_id(bootstrap: str, topic: str) -> bytes:
    """The topic's id (Metadata v12)."""
    import socket
    import struct

    from kbroker.protocol import api
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(api.encode_request(3, 12, 1, "kbroker-perf-request", {"topics": [{"name": topic,
                                                                                   "topic_id": bytes(16)}]}))
        head = s.recv(4, socket.MSG_WAITALL)
        _cid, resp = api.decode_response(3, 12, s.recv(struct.unpack(">i", head)[0], socket.MSG_WAITALL))
    return bytes(resp["topics"][0]["topic_id"])


def _instrument(state: str, pid: int) -> None:
    subprocess.run([shutil.which("callgrind_control"), "-i", state, str(pid)], check=True, capture_output=True,
                   timeout=120)


def _what(workload: str, partitions: int = 1, raw: bool = False, data_parts: int = 1, acks: str = "1",
          version: int = 0) -> str:
    if workload == "fetch":
        v = version or 11
        if partitions > 1:
            return (f"small Fetch v{v} requests naming {partitions} partitions, 1 in flight ({data_parts} of them "
                    f"with one ~170 B batch each per answer"
                    + (", the others at their high watermark)" if data_parts < partitions else ")"))
        return f"small Fetch v{v} requests, 1 in flight (one ~170 B batch per answer)"
    if partitions > 1 or raw:
        return (f"Produce v{version or 7} requests of {partitions} partitions x one 100 B record (acks=1, 1 in "
                "flight, raw socket)")
    if acks != "1":
        return ("one-record Produce requests (acks=all, 1 in flight: each answered once both followers "
                "fetched it, two follower fetches per request)")
    return "one-record Produce requests (acks=1, linger.ms=0, batch.num.messages=1)"


def _acks_all_one_in_flight(c: LocalCluster, topic: str, requests: int, pid: int, ctl: str) -> int:
    """``requests`` one-record acks=all requests with one in flight, instrumented (callgrind_control on
    ``pid``) after a warm-up of 200. -> requests delivered."""
    from .replication_fetch_cost import acks_all_producer
    p = acks_all_producer(c)
    failed = []

    def sent(err, _msg):
        if err:
            failed.append(err)
    for _ in range(200):
        p.produce(topic, b"w" * 100, partition=0, on_delivery=sent)
    if p.flush(600):
        raise RuntimeError("warm-up not delivered")
    subprocess.run([ctl, "-i", "on", str(pid)], check=True, capture_output=True, timeout=120)
    for _ in range(requests):
        p.produce(topic, b"x" * 100, partition=0, on_delivery=sent)
        p.poll(0)
    left = p.flush(900)
    subprocess.run([ctl, "-i", "off", str(pid)], check=True, capture_output=True, timeout=120)
    if left or failed:
        raise RuntimeError(f"acks=all run: {left} undelivered, {len(failed)} failed")
    return requests


def pyspy(out: Path, requests: int, seconds: float, workload: str = "produce") -> str:
    spy = Path(sys.executable).parent / "py-spy"
    if not spy.exists():
        raise SystemExit(f"py-spy not found next to {sys.executable}")
    root = Path(tempfile.mkdtemp(prefix="kbroker-profile-", dir="/dev/shm"))
    raw = out / f"pyspy-{workload}.raw.txt"
    spy_cmd = [str(spy), "record", "--native", "--rate", "500", "--format", "raw", "--duration",
               str(int(seconds)), "-o", str(raw), "-p"]
    try:
        with _cluster(root, None) as c:
            pid = c.brokers[0].pid
            topic = _topic(c)
            if workload == "produce":
                proc, lines = _producer(c.bootstrap, topic, requests, 2000, seconds + 30)
                try:
                    cpu0 = H.cpu_seconds(pid)
                    _go(proc)
                    spy_run = subprocess.run([*spy_cmd, str(pid)], capture_output=True, text=True,
                                             timeout=seconds + 120)
                    import json
                    r = json.loads(lines.readline(2 * seconds + 120))
                    cpu = H.cpu_seconds(pid) - cpu0
                finally:
                    _stop_child(proc)
                n, secs = r["delivered"], r["seconds"]
            else:
                _fill_for_fetch(c, topic, requests)
                spy_proc = subprocess.Popen([*spy_cmd, str(pid)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                            text=True)
                try:
                    f = _fetch(c, topic, requests, 500, seconds + 60)
                finally:
                    try:
                        _, err = spy_proc.communicate(timeout=seconds + 120)
                    except subprocess.TimeoutExpired:
                        spy_proc.kill()
                        _, err = spy_proc.communicate(timeout=30)
                spy_run = subprocess.CompletedProcess(spy_proc.args, spy_proc.returncode, "", err)
                n, secs, cpu = f["requests"], f["seconds"], f["broker_cpu_s"]
            if spy_run.returncode != 0:
                raise RuntimeError(f"py-spy failed: {spy_run.stderr[-2000:]}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    head = (f"py-spy --native --rate 500 for {int(seconds)} s of a broker serving {_what(workload)}: "
            f"{n:,} requests in {secs:.2f} s, broker CPU {cpu:.2f} s = {cpu / max(1, n) * 1e6:.1f} µs/request "
            f"over the whole run (with py-spy attached)\n\n")
    text = head + summarize_raw(raw)
    (out / f"pyspy-{workload}.txt").write_text(text)
    return text


def callgrind(out: Path, requests: int, workload: str = "produce", rf3: bool = False, depth: int = 1,
              partitions: int = 1, raw: bool = False, data_parts: int = 0, idempotent: bool = False,
              acks: str = "1", env: dict | None = None, acls: int = 0, version: int = 0) -> str:
    vg, ctl, ann = shutil.which("valgrind"), shutil.which("callgrind_control"), shutil.which("callgrind_annotate")
    if not (vg and ctl and ann):
        raise SystemExit("valgrind (with callgrind_control, callgrind_annotate) is not installed")
    root = Path(tempfile.mkdtemp(prefix="kbroker-profile-", dir="/dev/shm"))
    data_parts = data_parts or partitions
    name = (f"callgrind-{workload}" + ("-rf3" if rf3 else "") + ("-acksall" if acks in ("all", "-1") else "")
            + (f"-depth{depth}" if depth != 1 else "")
            + (f"-{partitions}p" if workload == "produce" and (partitions != 1 or raw) else "")
            + ("-idempotent" if workload == "produce" and idempotent else "")
            + (f"-p{partitions}d{data_parts}" if workload == "fetch" and partitions > 1 else "")
            + (f"-acls{acls}" if acls else "")
            + (f"-v{version}" if version else ""))
    for old in out.glob(f"{name}.out*"):
        old.unlink()
    cg_out = out / f"{name}.out"
    wrapper = [vg, "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={cg_out}"]
    try:
        c = _cluster(root, wrapper, 3 if rf3 else 1, env, acls)
        try:
            c.start()
            pid = c.brokers[0].pid
            topic = _topic(c, partitions)
            if acls:
                _seed_acls(c, topic, acls)
            if workload == "produce" and (partitions > 1 or raw or idempotent):
                # warm-up, not instrumented (idempotent: the new producer id's first batch among them)
                _raw_produce(c.bootstrap, topic, partitions, 500, 600, 0 if idempotent else -1, version or 7)
                _instrument("on", pid)
                n = _raw_produce(c.bootstrap, topic, partitions, requests, 900, 500 if idempotent else -1,
                                 version or 7)
                _instrument("off", pid)
            elif workload == "fetch" and (partitions > 1 or version):
                _fill_partitions(c, topic, data_parts, requests + 210)
                n = _fetch_partitions(c, topic, partitions, data_parts, requests, 200, 1800, version)
            elif workload == "produce" and acks != "1":
                n = _acks_all_one_in_flight(c, topic, requests, pid, ctl)
            elif workload == "produce":
                proc, lines = _producer(c.bootstrap, topic, requests, 500, 600, acks)
                try:
                    subprocess.run([ctl, "-i", "on", str(pid)], check=True, capture_output=True, timeout=120)
                    _go(proc)
                    import json
                    n = json.loads(lines.readline(900))["delivered"]
                    subprocess.run([ctl, "-i", "off", str(pid)], check=True, capture_output=True, timeout=120)
                finally:
                    _stop_child(proc)
            else:
                _fill_for_fetch(c, topic, requests)
                _fetch(c, topic, 200, 0, 600)            # warm-up, not instrumented
                subprocess.run([ctl, "-i", "on", str(pid)], check=True, capture_output=True, timeout=120)
                n = _fetch(c, topic, requests, 0, 900, depth)["requests"]
                subprocess.run([ctl, "-i", "off", str(pid)], check=True, capture_output=True, timeout=120)
        finally:
            c.stop()        # SIGTERM: callgrind writes its profile as the broker exits
    finally:
        shutil.rmtree(root, ignore_errors=True)
    outs = sorted(out.glob(f"{name}.out*"))
    if not outs:
        raise RuntimeError("callgrind wrote no profile")
    total = 0
    for f in outs:
        for line in f.read_text(errors="replace").splitlines():
            if line.startswith("totals:") or line.startswith("summary:"):
                total = max(total, int(line.split()[1]))
    self_t = subprocess.run([ann, "--threshold=99", str(outs[0])], capture_output=True, text=True, timeout=300).stdout
    incl_t = subprocess.run([ann, "--inclusive=yes", "--threshold=99", str(outs[0])], capture_output=True,
                            text=True, timeout=300).stdout
    n = max(1, n)
    head = (f"callgrind of the broker while it served {n:,} "
            f"{_what(workload, partitions, raw or idempotent, data_parts, acks, version)}"
            + (" (idempotent: producer id 1, each batch the next sequence)" if idempotent else "")
            + (" as the leader of an RF=3 partition (followers running, not profiled)" if rf3 else "")
            + (f" ({depth} in flight, not 1)" if depth != 1 else "")
            + (f" with the AclAuthorizer holding {acls:,} ACL entries" if acls else "")
            + "; instrumentation on for those "
            f"requests only, all threads, user space only (no kernel): {total:,} instructions = "
            f"{total / n:,.0f} per request\n\n")
    text = head + "== self ==\n" + _top(self_t, 40) + "\n== inclusive ==\n" + _top(incl_t, 40)
    (out / f"{name}.txt").write_text(text)
    return text


def _top(annotate: str, n: int) -> str:
    """The function table of callgrind_annotate's output, first n rows."""
    lines = annotate.splitlines()
    start = next((i for i, ln in enumerate(lines) if "file:function" in ln), None)
    if start is None:
        return annotate[:4000] + "\n"
    rows = [ln for ln in lines[start + 1:] if ln.strip() and not ln.startswith("-")][:n]
    return "\n".join(lines[start - 1:start + 1] + rows) + "\n"


# ---- capacity: CPU per GB of the suite's large-batch produce, by where it goes -----------------------
# Buckets of a perf sample, by the first rule whose frame is in its stack (syscall entry points are
# matched anywhere in the stack: softirq work run inside a syscall is charged to that syscall, as the
# kernel charges it to the process), else by the sampled (top) frame's object.
_SYSCALL_BUCKETS = (
    ("segment write (page-cache allocation + copy)", ("ksys_write", "__x64_sys_write")),
    ("index pwrite", ("ksys_pwrite64", "__x64_sys_pwrite64")),
    ("recv (copy + loopback TCP, ACKs)", ("__sys_recvfrom", "__x64_sys_recvfrom", "sock_recvmsg")),
    ("send (answers)", ("__sys_sendto", "__x64_sys_sendto", "tcp_sendmsg")),
    ("epoll", ("do_epoll_wait", "do_epoll_ctl", "__x64_sys_epoll_wait", "__x64_sys_epoll_ctl")),
)
CAPACITY_BUCKETS = (*(b for b, _ in _SYSCALL_BUCKETS), "other kernel", "crc32c", "other native (ext/*.so)",
                    "interpreter (libpython)", "other user")


def bucket_of(frames: list[tuple[str, str]]) -> str:
    """One perf sample's stack, [(symbol, object)] sampled frame first -> its CAPACITY_BUCKETS name."""
    syms = {s for s, _ in frames}
    for name, entries in _SYSCALL_BUCKETS:
        if not syms.isdisjoint(entries):
            return name
    if not frames:
        return "other user"
    sym, obj = frames[0]
    if obj == "[kernel.kallsyms]" or obj.startswith("[kernel"):
        return "other kernel"
    if sym.startswith("crc32c"):
        return "crc32c"
    base = os.path.basename(obj)
    if base.startswith(("batch.", "segment.", "request.", "codec.", "crc.")):
        return "other native (ext/*.so)"
    if base.startswith("libpython"):
        return "interpreter (libpython)"
    return "other user"


def bucket_perf_script(text: str, loop_tid: int) -> dict:
    """``perf script -F tid,ip,sym,dso`` output (a "tid" line, then one tab-indented "ip sym (object)" line per frame,
    samples separated by blank lines) -> {"all": Counter(bucket -> samples), "loop": the same for the
    thread ``loop_tid`` (the event loop: the process's main thread)}."""
    out = {"all": collections.Counter(), "loop": collections.Counter()}

    def flush(tid, frames):
        if tid is None:
            return
        b = bucket_of(frames)
        out["all"][b] += 1
        if tid == loop_tid:
            out["loop"][b] += 1

    tid, frames = None, []
    for line in text.splitlines():
        if not line.strip():
            flush(tid, frames)
            tid, frames = None, []
        elif not line.startswith("\t"):          # a sample's header: the tid, right-aligned
            flush(tid, frames)
            head = line.split()
            tid, frames = (int(head[0]) if head[0].isdigit() else -1), []
        else:
            _ip, _, rest = line.strip().partition(" ")
            sym, _, obj = rest.rpartition(" (")
            frames.append((sym.split("+0x")[0], obj.rstrip(")")))
    flush(tid, frames)
    return out


# ---- persisting baselines: the recv_into sink plus the copy a broker cannot avoid ----------------------
# Served like harness's ``sink --mode produce`` (a thread per connection, blocking sockets, a canned
# answer carrying the request's correlation id), but each request's bytes also go into a file in the log
# directory's file system, one file per connection, unlinked when the connection closes:
#   * ``write``: recv_into one reused buffer, then os.write of the request to the file (O_APPEND): the
#     two-copy floor (socket -> user buffer -> page cache) of any broker that writes with write(2);
#   * ``splice``: the request header (size, api key/version, correlation id) by recv_into, the rest
#     socket -> pipe (F_SETPIPE_SZ 1 MiB) -> file with splice(2): the one-copy floor (the socket's pages
#     move into the pipe; the only copy is into the page cache).
#   * ``write1``: ``write`` with every connection on one thread (an epoll loop, non-blocking sockets, one
#     recv per readiness event as asyncio does): the floor of a broker whose loop does all the work;
#   * ``recv1``: ``write1`` without the write (no file): the recv sink on one thread, to tell the cost of
#     one thread from the cost of keeping the data.
# No Kafka work in either: no parse, no CRC, no index.
PERSIST_SINKS = ("write", "splice", "write1", "recv1")
_STORAGE_DIRS = {"shm": "/dev/shm", "disk": "/var/tmp"}      # as perf/targets.py's KbrokerTarget
_PIPE_BYTES = 1 << 20
_F_SETPIPE_SZ = 1031


def _serve_persist(conn, kind: str, path: Path, deadline: float, canned: bytes) -> None:
    from .harness import recv_exact
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_APPEND if kind == "write" else 0), 0o644)
    head = bytearray(12)                       # size, api key, api version, correlation id
    hv = memoryview(head)
    resp = bytearray(canned)
    buf = bytearray(1 << 20)
    pr = pw = -1
    try:
        if kind == "splice":
            import fcntl
            pr, pw = os.pipe()
            fcntl.fcntl(pw, _F_SETPIPE_SZ, _PIPE_BYTES)
        sfd = conn.fileno()
        while time.monotonic() < deadline:
            try:
                recv_exact(conn, hv)
            except (ConnectionError, OSError):
                return
            size = int.from_bytes(head[:4], "big") - 8
            if kind == "write":             # one write of the whole request, as the broker's one per batch
                if size + 12 > len(buf):
                    buf = bytearray(size + 12)
                view = memoryview(buf)[:size + 12]
                view[:12] = hv
                recv_exact(conn, view[12:])
                done = 0
                while done < len(view):
                    done += os.write(fd, view[done:])
            else:
                os.write(fd, hv)
                left = size
                while left:
                    n = os.splice(sfd, pw, min(left, _PIPE_BYTES))
                    if n == 0:
                        return
                    left -= n
                    while n:
                        n -= os.splice(pr, fd, n)
            resp[4:8] = head[8:12]             # the request's correlation id
            conn.sendall(resp)
    finally:
        for f in (fd, pr, pw):
            if f >= 0:
                os.close(f)
        path.unlink(missing_ok=True)
        conn.close()


class _LoopConn:
    """One connection of the ``write1`` sink: the 12-byte request header, then the rest, then one write
    (none for ``recv1``: ``path`` None)."""

    def __init__(self, conn, path: Path | None, canned: bytes):
        self.conn, self.path, self.resp = conn, path, bytearray(canned)
        self.fd = -1 if path is None else os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        self.buf = bytearray(1 << 20)
        self.pos, self.need = 0, 12

    def readable(self) -> bool:
        """One recv; False once the peer closed."""
        try:
            k = self.conn.recv_into(memoryview(self.buf)[self.pos:self.need])
        except BlockingIOError:
            return True
        except OSError:
            return False
        if k == 0:
            return False
        self.pos += k
        if self.pos < self.need:
            return True
        if self.need == 12:
            self.need = 4 + int.from_bytes(self.buf[:4], "big")
            if self.need > len(self.buf):
                self.buf = self.buf[:12] + bytearray(self.need - 12)
            if self.need > 12:
                return True
        view = memoryview(self.buf)[:self.need]
        done = 0 if self.fd >= 0 else len(view)
        while done < len(view):
            done += os.write(self.fd, view[done:])
        self.resp[4:8] = self.buf[8:12]
        self.conn.sendall(self.resp)
        self.pos, self.need = 0, 12
        return True

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.path.unlink(missing_ok=True)
        self.conn.close()


def _persist_loop(srv, directory: Path | None, deadline: float, canned: bytes) -> None:
    import selectors
    import socket
    sel = selectors.DefaultSelector()
    srv.setblocking(False)
    sel.register(srv, selectors.EVENT_READ, None)
    n = 0
    while time.monotonic() < deadline:
        for key, _ in sel.select(1.0):
            if key.data is None:
                try:
                    conn, _ = srv.accept()
                except BlockingIOError:
                    continue
                conn.setblocking(False)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                n += 1
                path = None if directory is None else directory / f"conn-{n}.log"
                sel.register(conn, selectors.EVENT_READ, _LoopConn(conn, path, canned))
            elif not key.data.readable():
                sel.unregister(key.fileobj)
                key.data.close()


def persist_sink_worker(kind: str, directory: Path, max_seconds: float) -> int:
    """``python -m kbroker.perf.profile_request persist-sink --kind write|splice --dir DIR``: prints its
    port, serves until ``max_seconds`` pass or stdin closes (its parent went away)."""
    import socket
    import threading
    from .harness import _canned_produce_response
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    canned = _canned_produce_response()
    print(srv.getsockname()[1], flush=True)
    deadline = time.monotonic() + max_seconds
    if kind in ("write1", "recv1"):
        _persist_loop(srv, directory if kind == "write1" else None, deadline, canned)
        return 0
    srv.settimeout(1.0)
    n = 0
    while time.monotonic() < deadline:
        try:
            conn, _ = srv.accept()
        except socket.timeout:
            continue
        conn.setblocking(True)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        n += 1
        threading.Thread(target=_serve_persist, args=(conn, kind, directory / f"conn-{n}.log", deadline, canned),
                         daemon=True).start()
    return 0


def start_persist_sink(kind: str, directory: Path, max_seconds: float = 3600.0):
    """-> (process, port) of a persisting sink writing under ``directory``."""
    p = subprocess.Popen([sys.executable, "-m", "kbroker.perf.profile_request", "persist-sink", "--kind", kind,
                          "--dir", str(directory), "--max-seconds", str(max_seconds)],
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, start_new_session=True)
    line = p.stdout.readline().strip()
    if not line.isdigit():
        p.kill()
        p.wait(timeout=10)
        raise RuntimeError(f"the {kind} sink did not start (said {line!r})")
    return p, int(line)


COUNTED_SYSCALLS = ("recvfrom", "read", "epoll_wait", "epoll_pwait", "write", "writev", "pwrite64", "sendto", "futex")


def parse_perf_stat(text: str, requests: int) -> dict:
    """``perf stat -x,`` output over the syscalls:sys_enter_* tracepoints -> {syscall: calls per request}."""
    out = {}
    for ln in text.splitlines():
        f = ln.split(",")
        if len(f) >= 3 and f[2].startswith("syscalls:sys_enter_") and f[0].strip().isdigit():
            out[f[2][len("syscalls:sys_enter_"):]] = int(f[0]) / max(1, requests)
    return out


def _timed_produce(pid: int, addr: tuple[str, int], sets: list) -> dict:
    """One capacity produce run against ``addr`` -> MB/s and the user / system CPU-seconds per GB that
    ``pid`` spent over it."""
    u0, s0 = H.cpu_user_system(pid)
    r = H.produce_frames(addr, sets, timeout=300)
    u1, s1 = H.cpu_user_system(pid)
    gb = r["bytes"] / 1e9
    return {"mb_per_s": r["bytes"] / 1e6 / r["seconds"], "user_s_per_gb": (u1 - u0) / gb,
            "system_s_per_gb": (s1 - s0) / gb}


def capacity(out: Path, batches: int, rounds: int, variants: list[str] | None = None,
             persist: list[str] | None = None, storage: str = "shm", profile: bool = True) -> str:
    """The broker variants (the first is profiled; default one broker as configured, named "kbroker"),
    the sink and the persisting sinks ``persist`` (KIND-STORAGE: write|splice - shm|disk), in interleaved
    rounds, then strace and perf runs of the first variant (unless ``profile`` is false)."""
    from . import broker_bench as B
    from .targets import KbrokerTarget
    perf, strace = shutil.which("perf"), shutil.which("strace")
    if not (perf and strace):
        raise SystemExit("capacity needs perf and strace")
    specs = [H.parse_variant(v) for v in (variants or ["kbroker"])]
    if len({n for n, _, _ in specs} | {"sink"}) != len(specs) + 1:
        raise SystemExit("variant names must differ from each other and from 'sink'")
    persist = list(persist or [])
    for p in persist:
        kind, _, where = p.partition("-")
        if kind not in PERSIST_SINKS or where not in _STORAGE_DIRS:
            raise SystemExit(f"--persist {p!r}: want KIND-STORAGE, KIND in {PERSIST_SINKS}, STORAGE in shm, disk")
    work = Path(tempfile.mkdtemp(prefix="kbroker-profile-", dir="/dev/shm"))
    batch, _per = B.build_batch()
    targets = {n: KbrokerTarget(storage, work, name=n, overrides=ov, env=env) for n, ov, env in specs}
    sink_names = {p: f"{p}-sink" for p in persist}
    rows = {**{n: [] for n in targets}, "sink": [], **{n: [] for n in sink_names.values()}}
    extra = {}
    sink = None
    psinks = {}
    pdirs = []
    counts = {}
    n_topics = 0

    def broker_run(t, tool: list[str] | None = None):
        nonlocal n_topics
        n_topics += 1
        topic = f"capacity-{n_topics}-{uuid.uuid4().hex[:6]}"
        t.create_topic(topic, B.PARTITIONS)
        host, port = t.bootstrap.split(":")
        addr = (host, int(port))
        sets = B.produce_frame_sets(topic, batch, batches)
        H.produce_frames(addr, [s[:2] for s in sets], timeout=120)    # open the segments, warm up
        proc = None
        if tool:
            with open(work / "tool.log", "ab") as log:
                proc = subprocess.Popen([*tool, "-p", str(t.pid)], stdin=subprocess.DEVNULL, stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True)
            time.sleep(1.0)         # attach (perf and strace give no readiness signal)
        try:
            return {**_timed_produce(t.pid, addr, sets), "requests": sum(map(len, sets))}
        finally:
            if proc is not None:
                proc.send_signal(2)
                try:
                    proc.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)

    try:
        for t in targets.values():
            t.start()
        sink, sport = B.start_sink("produce")
        for p, name in sink_names.items():
            d = Path(tempfile.mkdtemp(prefix="kbroker-persist-sink-", dir=_STORAGE_DIRS[p.partition("-")[2]]))
            pdirs.append(d)
            psinks[name] = start_persist_sink(p.partition("-")[0], d)
        order = [*targets, "sink", *psinks]
        for i in range(rounds):
            k = i % len(order)
            for side in order[k:] + order[:k]:
                if side == "sink":
                    rows[side].append(_timed_produce(sink.pid, ("127.0.0.1", sport),
                                                     B.produce_frame_sets("sink", batch, batches)))
                elif side in psinks:
                    proc, port = psinks[side]
                    rows[side].append(_timed_produce(proc.pid, ("127.0.0.1", port),
                                                     B.produce_frame_sets("sink", batch, batches)))
                else:
                    rows[side].append(broker_run(targets[side]))
                H.progress(f"round {i + 1}/{rounds} {side}: {rows[side][-1]['mb_per_s']:.0f} MB/s, "
                           f"{rows[side][-1]['user_s_per_gb'] + rows[side][-1]['system_s_per_gb']:.2f} CPU-s/GB")
        for name, t in targets.items():          # syscalls per request, each variant: kernel tracepoints
            cfile = work / f"count-{name}.csv"
            r = broker_run(t, [perf, "stat", "-x,", "-o", str(cfile),
                               "-e", ",".join(f"syscalls:sys_enter_{c}" for c in COUNTED_SYSCALLS)])
            counts[name] = parse_perf_stat(cfile.read_text(), r["requests"])
        first = targets[specs[0][0]]
        if profile:
            st_file = work / "strace.txt"
            extra["strace"] = broker_run(first, [strace, "-c", "-f", "-o", str(st_file)])
            extra["strace_text"] = st_file.read_text()
            data = work / "perf.data"
            extra["perf"] = broker_run(first, [perf, "record", "-g", "-F", "999", "-o", str(data)])
            script = subprocess.run([perf, "script", "-i", str(data), "-F", "tid,ip,sym,dso"], capture_output=True,
                                    text=True, timeout=600)
            extra["buckets"] = bucket_perf_script(script.stdout, first.pid)
            if not extra["buckets"]["all"]:
                log = (work / "tool.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"perf recorded no samples (perf script exit {script.returncode}: "
                                   f"{script.stderr[-1000:]}; perf record said: {log})")
    finally:
        if sink is not None:
            B.stop_proc(sink)
        for proc, _port in psinks.values():
            B.stop_proc(proc)
        for d in pdirs:
            shutil.rmtree(d, ignore_errors=True)
        for t in targets.values():
            t.stop()
        shutil.rmtree(work, ignore_errors=True)
    text = _capacity_report(rows, extra or None, batches, len(batch), specs, list(psinks), counts)
    (out / "capacity-produce.txt").write_text(text)
    return text


def _capacity_report(rows: dict, extra: dict | None, batches: int, batch_bytes: int, specs: list,
                     persist: list[str] = (), counts: dict | None = None) -> str:
    def rng(v):
        return f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})"

    def med(side, key):
        return rng([r[key] for r in rows[side]])

    def cpu(r):
        return r["user_s_per_gb"] + r["system_s_per_gb"]

    names = [n for n, _, _ in specs]
    lines = [f"Produce capacity, {batches} Produce v7 requests of one {batch_bytes:,} B RecordBatch (1 KiB records) "
             f"per run over 2 connections, {len(rows['sink'])} interleaved rounds; median (min-max)", ""]
    for n, ov, env in specs:
        if ov or env:
            lines.append(f"- {n}: broker settings {ov or '{}'}, environment {env or '{}'}")
    lines += ["", "| side | MB/s | user CPU-s/GB | system CPU-s/GB | MB/s ÷ sink, same round |",
              "|---|---|---|---|---|"]
    for side in [*names, "sink", *persist]:
        ratio = rng([k["mb_per_s"] / s["mb_per_s"] for k, s in zip(rows[side], rows["sink"])])
        lines.append(f"| {side} | {med(side, 'mb_per_s')} | {med(side, 'user_s_per_gb')} | "
                     f"{med(side, 'system_s_per_gb')} | {ratio} |")

    def versus(a_name, b_name):
        a_rows, b_rows = rows[a_name], rows[b_name]
        return (f"{a_name} ÷ {b_name}, same round: MB/s "
                f"{rng([a['mb_per_s'] / b['mb_per_s'] for a, b in zip(a_rows, b_rows)])}, "
                f"CPU-s/GB {rng([cpu(a) / cpu(b) for a, b in zip(a_rows, b_rows)])}")
    lines += [""] + [versus(n, names[0]) for n in names[1:]]
    lines += [versus(n, p) for p in persist for n in names]
    lines.append("")
    if counts:
        lines += ["Syscalls per request (perf stat on the syscalls:sys_enter_* tracepoints, one more run of each "
                  "broker; counts are exact and the run keeps its speed):", "",
                  "| broker | " + " | ".join(COUNTED_SYSCALLS) + " |", "|---|" + "---|" * len(COUNTED_SYSCALLS)]
        for n in names:
            lines.append(f"| {n} | " + " | ".join(f"{counts[n].get(c, 0):.2f}" for c in COUNTED_SYSCALLS) + " |")
        lines.append("")
    if extra is None:
        return "\n".join(lines) + "\n"
    st = extra["strace"]
    calls = []
    for ln in extra["strace_text"].splitlines():
        f = ln.split()
        if len(f) >= 5 and f[-1].isidentifier() and f[3].isdigit() and f[-1] != "total":
            calls.append((f[-1], int(f[3])))
    req = st["requests"]
    lines += [f"Syscalls per request of {names[0]} (strace -c -f over {req} requests; strace slows the run, counts are exact):",
              "  " + ", ".join(f"{name} {n / req:.2f}" for name, n in sorted(calls, key=lambda x: -x[1])[:10]), ""]
    pr = extra["perf"]
    total_s = pr["user_s_per_gb"] + pr["system_s_per_gb"]
    tables = [("all", "all threads")]
    if sum(extra["buckets"]["loop"].values()) < 0.99 * sum(extra["buckets"]["all"].values()):
        tables.append(("loop", "event-loop thread"))      # other threads (writer, validation) ran too
    for which, title in tables:
        cnt = extra["buckets"][which]
        n = sum(cnt.values()) or 1
        lines += [f"perf record -g -F 999 ({title}: {sum(cnt.values())} samples; the run: "
                  f"{pr['mb_per_s']:.0f} MB/s, {total_s:.2f} CPU-s/GB of {names[0]}); share, and CPU-s/GB "
                  f"as that share of the whole process's CPU:", "", "| bucket | share | CPU-s/GB |", "|---|---|---|"]
        all_n = sum(extra["buckets"]["all"].values()) or 1
        for b in CAPACITY_BUCKETS:
            if cnt[b]:
                lines.append(f"| {b} | {100 * cnt[b] / n:.1f}% | {total_s * cnt[b] / all_n:.3f} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kbroker.perf.profile_request", description=__doc__.split("\n")[0])
    ap.add_argument("tool", choices=("pyspy", "callgrind", "capacity", "persist-sink"))
    ap.add_argument("--workload", choices=("produce", "fetch"), default="produce",
                    help="one-record Produce requests (default) or small fetches with 1 in flight")
    ap.add_argument("--requests", type=int, help="counted one-record Produce requests "
                                                 "(default 200000 for pyspy, 3000 for callgrind)")
    ap.add_argument("--seconds", type=float, default=6.0, help="py-spy sampling time")
    ap.add_argument("--rf3", action="store_true", help="callgrind: the profiled broker leads an RF=3 partition")
    ap.add_argument("--acls", type=int, default=0, help="callgrind: the broker runs the AclAuthorizer holding this "
                    "many ACL entries (kafka.security.authorizer.AclAuthorizer), the producer allowed to write")
    ap.add_argument("--acks", default="1", help="callgrind, produce workload: the producer's acks (1, or all: "
                    "one request in flight, the replicated steady state; with --rf3)")
    ap.add_argument("--broker-env", default="", metavar="K=V,K=V",
                    help="callgrind: the brokers' environment (e.g. PYTHONPATH of another tree, for an A/B)")
    ap.add_argument("--depth", type=int, default=1,
                    help="callgrind --workload fetch: fetches in flight (default 1; request_bench also reports 8)")
    ap.add_argument("--partitions", type=int, default=1,
                    help="callgrind: partitions per request (default 1: request_bench's producer / fetch); "
                         "--workload produce: raw Produce v7 frames of that many partitions x one record; "
                         "--workload fetch: a Fetch naming that many partitions")
    ap.add_argument("--raw", action="store_true",
                    help="callgrind --workload produce: raw frames (as --partitions N) for one partition too: "
                         "one frame per read, so the count does not depend on how the producer's frames group")
    ap.add_argument("--idempotent", action="store_true",
                    help="callgrind --workload produce: raw frames (as --raw) of idempotent batches, each the "
                         "producer's next sequence (the native path's steady idempotent case)")
    ap.add_argument("--data-partitions", type=int, default=0,
                    help="callgrind --workload fetch --partitions N: how many of them have a batch to read in "
                         "every answer (default all N; the others sit at their high watermark)")
    ap.add_argument("--version", type=int, default=0,
                    help="callgrind: the request version (--raw produce frames, default 7; --workload fetch, "
                         "default 11: the one-partition fetch as --partitions 1)")
    ap.add_argument("--batches", type=int, default=1024, help="capacity: Produce requests per run (~512 KiB each)")
    ap.add_argument("--rounds", type=int, default=3, help="capacity: interleaved broker/sink rounds")
    ap.add_argument("--variant", action="append", help="capacity: a broker to run side by side, "
                    "NAME[:key=value,...[:ENV=value,...]] (repeatable; the first is profiled; e.g. "
                    "base::PYTHONPATH=<a tree's folder> for a Python A/B); default one broker as configured")
    ap.add_argument("--persist", action="append", default=[], help="capacity: a persisting sink to run in "
                    "the rounds, KIND-STORAGE with KIND write (recv_into + write(2), a thread per connection), "
                    "write1 (the same, all connections on one epoll thread), recv1 (write1 without the write: "
                    "STORAGE unused) or splice (socket -> pipe -> file) "
                    "and STORAGE shm (tmpfs) or disk (/var/tmp) (repeatable)")
    ap.add_argument("--storage", choices=tuple(_STORAGE_DIRS), default="shm", help="capacity: the brokers' log dirs")
    ap.add_argument("--no-profile", action="store_true", help="capacity: the rounds only, no strace/perf runs")
    ap.add_argument("--kind", choices=PERSIST_SINKS, help="persist-sink: what it does with each request")
    ap.add_argument("--dir", help="persist-sink: where its files go")
    ap.add_argument("--max-seconds", type=float, default=3600.0, help="persist-sink: lifetime bound")
    ap.add_argument("--out", help="output folder (default docs/perf/profile)")
    a = ap.parse_args(argv)
    if a.tool == "persist-sink":
        return persist_sink_worker(a.kind, Path(a.dir), a.max_seconds)
    out = Path(a.out) if a.out else Path(__file__).resolve().parent.parent / "docs" / "perf" / "profile"
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    if a.tool == "pyspy":
        text = pyspy(out, a.requests or (200_000 if a.workload == "produce" else 40_000), a.seconds, a.workload)
    elif a.tool == "capacity":
        text = capacity(out, a.batches, a.rounds, a.variant, a.persist, a.storage, not a.no_profile)
    else:
        env = dict(kv.split("=", 1) for kv in a.broker_env.split(",") if kv) if a.broker_env else None
        text = callgrind(out, a.requests or 3_000, a.workload, a.rf3, a.depth, a.partitions, a.raw,
                         a.data_partitions, a.idempotent, a.acks, env, a.acls, a.version)
    print(text)
    H.progress(f"{a.tool} done in {time.monotonic() - t0:.0f} s; output in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
