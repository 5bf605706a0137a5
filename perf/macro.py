"""Macro-benchmarks: produce and fetch through real sockets against a running kbroker (pyperf).

Run:

    python -m kbroker.perf.macro --fast -o macro.json          # starts its own broker (see below)
    python -m kbroker.perf.macro --rigorous -o macro.json
    python -m kbroker.perf.macro --bootstrap-server 127.0.0.1:9092 --fast -o macro.json
    python -m pyperf show macro.json
    python -m pyperf compare_to before.json after.json --table

Without ``--bootstrap-server`` the parent process starts ZooKeeper and one broker with
``kbroker.testing.LocalCluster`` in a directory on /dev/shm (so the log is on tmpfs and the figure
has no disk in it), runs the benchmarks, and stops both by PID at the end. With it, the broker must
lead all 4 partitions of the two topics (a single broker, as here); only loopback addresses are
meant to be used. The parent creates the topics (4 partitions; ``kbroker-perf-produce`` keeps 64
MiB per partition, ``retention.bytes``) and fills ``kbroker-perf-fetch`` once with 16 requests.

Benchmarks (pyperf values are **seconds per request**; ``payload_bytes`` in each benchmark's
metadata is the record bytes one request carries, so MiB/s = payload_bytes / 2**20 / value):

  produce_req_1MiB_4x256KiB_1KiB_records
      One Produce v8 request (acks=1) carrying 1 MiB: 4 partitions × one pre-built, uncompressed
      256 KiB batch of 1 KiB records. Timed from the first byte sent to the last byte of the
      response read: the broker's framing, decode, validate+stamp, append and encode, plus loopback.
  fetch_req_1MiB_4x256KiB_1KiB_records
      One Fetch v11 request (partition_max_bytes 256 KiB) that returns exactly one of those batches
      per partition, ~1 MiB, sent by the broker with sendfile. Timed the same way; the offsets
      cycle over the 16 batches each partition holds.

One request is in flight at a time on one connection (a latency-bound, single-client figure, not
the broker's capacity; perf/broker_bench.py measures that). The client is a minimal blocking
socket client: frames are encoded before timing, the response is read with ``recv_into`` into a
reused buffer, and it is decoded and checked (error codes, correlation id, batch offsets) after
the timer stops, so client-side Python work stays out of the figure as far as possible.
"""
from __future__ import annotations

import atexit
import os
import shutil
import socket
import struct
import sys
import tempfile
import time

import pyperf

from kbroker._native.batch import iter_batches
from kbroker.perf import inputs
from kbroker.perf.inputs import KiB, MiB, SINK
from kbroker.protocol import api
from kbroker.protocol.errors import Errors

PRODUCE, FETCH, METADATA, CREATE_TOPICS = 0, 1, 3, 19
PRODUCE_V, FETCH_V, METADATA_V, CREATE_TOPICS_V = 8, 11, 8, 4
TOPIC_ALREADY_EXISTS = Errors.TOPIC_ALREADY_EXISTS

PARTITIONS = 4
BATCH_BYTES = 256 * KiB          # per partition: 4 × 256 KiB = 1 MiB per request
RECORD_BYTES = KiB
DISTINCT_REQUESTS = 4            # different pre-built payloads, cycled
FETCH_FILL_REQUESTS = 16         # batches per partition in the fetch topic (16 MiB in all)
PRODUCE_TOPIC = "kbroker-perf-produce"
FETCH_TOPIC = "kbroker-perf-fetch"
TOPIC_CONFIGS = {"retention.bytes": str(64 * MiB), "segment.bytes": str(16 * MiB)}
IO_TIMEOUT_S = 30.0
_SIZE = struct.Struct(">i")
_clock = time.perf_counter


# ---- a minimal blocking client -----------------------------------------------------------------
class Conn:
    """One blocking TCP connection speaking raw Kafka frames; one request in flight."""

    def __init__(self, bootstrap: str):
        host, _, port = bootstrap.split(",")[0].rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=IO_TIMEOUT_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray(4 * MiB)
        self.view = memoryview(self.buf)
        self.correlation_id = 0

    def close(self) -> None:
        self.sock.close()

    def _recv_exact(self, n: int) -> None:
        view, recv_into, got = self.view, self.sock.recv_into, 0
        while got < n:
            k = recv_into(view[got:n])
            if not k:
                raise ConnectionError("broker closed the connection")
            got += k

    def roundtrip(self, frame) -> int:
        """Send one request frame and read its whole response into ``buf``; returns its size."""
        self.sock.sendall(frame)
        self._recv_exact(4)
        size = _SIZE.unpack_from(self.buf, 0)[0]
        if size > len(self.buf):
            self.buf = bytearray(size)
            self.view = memoryview(self.buf)
        self._recv_exact(size)
        return size

    def frame(self, api_key: int, version: int, body: dict) -> tuple[int, bytes]:
        self.correlation_id += 1
        return self.correlation_id, api.encode_request(api_key, version, self.correlation_id,
                                                       "kbroker-perf-macro", body)

    def decode(self, api_key: int, version: int, size: int, correlation_id: int) -> dict:
        got, body = api.decode_response(api_key, version, self.view[:size])
        if got != correlation_id:
            raise RuntimeError(f"correlation id {got}, expected {correlation_id}")
        return body

    def call(self, api_key: int, version: int, body: dict) -> dict:
        cid, frame = self.frame(api_key, version, body)
        return self.decode(api_key, version, self.roundtrip(frame), cid)


def produce_body(topic: str, batches: list[bytes], acks: int = 1) -> dict:
    return {"transactional_id": None, "acks": acks, "timeout_ms": 30000, "topic_data": [{
        "name": topic, "partition_data": [{"index": p, "records": b} for p, b in enumerate(batches)]}]}


def fetch_body(topic: str, offsets: list[int]) -> dict:
    return {"replica_id": -1, "max_wait_ms": 500, "min_bytes": 1, "max_bytes": 2 * MiB,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1, "topics": [{
                "topic": topic, "partitions": [{
                    "partition": p, "current_leader_epoch": -1, "fetch_offset": off,
                    "log_start_offset": -1, "partition_max_bytes": BATCH_BYTES}
                    for p, off in enumerate(offsets)]}],
            "forgotten_topics_data": [], "rack_id": ""}


def check_produce(body: dict) -> None:
    for t in body["responses"]:
        for p in t["partition_responses"]:
            if p["error_code"]:
                raise RuntimeError(f"produce {t['name']}-{p['index']}: error {p['error_code']}")


def request_batches(seed: int) -> list[bytes]:
    """One request's payload: a 256 KiB batch of 1 KiB records per partition (baseOffset 0)."""
    return [inputs.fill_batch(BATCH_BYTES, RECORD_BYTES, f"macro/{seed}/{p}") for p in range(PARTITIONS)]


# ---- setup in the parent process ---------------------------------------------------------------
def ensure_topics(bootstrap: str) -> None:
    conn = Conn(bootstrap)
    try:
        res = conn.call(CREATE_TOPICS, CREATE_TOPICS_V, {"topics": [{
            "name": name, "num_partitions": PARTITIONS, "replication_factor": 1, "assignments": [],
            "configs": [{"name": k, "value": v} for k, v in TOPIC_CONFIGS.items()]}
            for name in (PRODUCE_TOPIC, FETCH_TOPIC)], "timeout_ms": 30000, "validate_only": False})
        for t in res["topics"]:
            if t["error_code"] not in (0, TOPIC_ALREADY_EXISTS):
                raise RuntimeError(f"create {t['name']}: error {t['error_code']}")
        deadline = time.monotonic() + 30
        while True:       # bounded wait for leaders on every partition
            md = conn.call(METADATA, METADATA_V, {"topics": [{"name": PRODUCE_TOPIC}, {"name": FETCH_TOPIC}],
                                                  "allow_auto_topic_creation": False})
            ready = all(t["error_code"] == 0 and len(t["partitions"]) == PARTITIONS
                        and all(p["leader_id"] >= 0 for p in t["partitions"]) for t in md["topics"])
            if ready:
                leaders = {p["leader_id"] for t in md["topics"] for p in t["partitions"]}
                if len(leaders) != 1 or len(md["brokers"]) != 1:
                    raise RuntimeError("the macro suite expects one broker leading every partition")
                break
            if time.monotonic() > deadline:
                raise TimeoutError("topics have no leaders after 30 s")
            time.sleep(0.1)
        fetched = conn.call(FETCH, FETCH_V, fetch_body(FETCH_TOPIC, [0] * PARTITIONS))
        if fetched["responses"][0]["partitions"][0]["high_watermark"] == 0:
            frames = [produce_body(FETCH_TOPIC, request_batches(i % DISTINCT_REQUESTS))
                      for i in range(FETCH_FILL_REQUESTS)]
            for body in frames:
                check_produce(conn.call(PRODUCE, PRODUCE_V, body))
    finally:
        conn.close()


def start_cluster():
    """ZooKeeper + one broker on /dev/shm; stopped (by PID, in LocalCluster) at exit."""
    from kbroker.testing import LocalCluster
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    root = tempfile.mkdtemp(prefix="kbroker-macro-", dir=base)
    cluster = LocalCluster(root, brokers=1, num_partitions=PARTITIONS, overrides={
        "log.retention.check.interval.ms": 2000,
        "log.segment.delete.delay.ms": 1000,
    })
    atexit.register(shutil.rmtree, root, True)
    cluster.start()
    atexit.register(cluster.stop)
    return cluster


# ---- benchmarks (run in pyperf's worker processes) ---------------------------------------------
def produce_bench(bootstrap: str):
    conn = Conn(bootstrap)
    frames = []
    for i in range(DISTINCT_REQUESTS):
        cid, frame = conn.frame(PRODUCE, PRODUCE_V, produce_body(PRODUCE_TOPIC, request_batches(100 + i)))
        frames.append((cid, frame))
    payload = sum(len(b) for b in request_batches(100))

    def time_func(loops):
        elapsed = 0.0
        roundtrip = conn.roundtrip
        for i in range(loops):
            cid, frame = frames[i % DISTINCT_REQUESTS]
            t0 = _clock()
            size = roundtrip(frame)
            elapsed += _clock() - t0
            check_produce(conn.decode(PRODUCE, PRODUCE_V, size, cid))      # untimed
        SINK.put(size)
        return elapsed
    return time_func, payload


def fetch_bench(bootstrap: str):
    conn = Conn(bootstrap)
    # Untimed: walk the fetch topic once to learn every batch's base offset per partition.
    starts = [[] for _ in range(PARTITIONS)]
    offsets = [0] * PARTITIONS
    for _ in range(FETCH_FILL_REQUESTS * 2):
        body = conn.call(FETCH, FETCH_V, fetch_body(FETCH_TOPIC, offsets))
        progressed = False
        for p in body["responses"][0]["partitions"]:
            records = p["records"]
            if p["error_code"] or not records:
                continue
            i = p["partition_index"]
            for info in iter_batches(records):
                starts[i].append(info.base_offset)
                offsets[i] = info.next_offset
                progressed = True
        if not progressed:
            break
    rounds = min(len(s) for s in starts)
    if rounds == 0:
        raise RuntimeError(f"{FETCH_TOPIC} holds no data")
    frames = []
    for j in range(rounds):
        cid, frame = conn.frame(FETCH, FETCH_V, fetch_body(FETCH_TOPIC, [s[j] for s in starts]))
        frames.append((cid, frame, [s[j] for s in starts]))
    payload = sum(len(b) for b in request_batches(0))

    def check(size, cid, expect):
        body = conn.decode(FETCH, FETCH_V, size, cid)
        for p in body["responses"][0]["partitions"]:
            infos = iter_batches(p["records"]) if p["records"] else []
            if p["error_code"] or len(infos) != 1 or infos[0].base_offset != expect[p["partition_index"]]:
                raise RuntimeError(f"fetch partition {p['partition_index']}: error {p['error_code']}, "
                                   f"{len(infos)} batches")

    def time_func(loops):
        elapsed = 0.0
        roundtrip = conn.roundtrip
        for i in range(loops):
            cid, frame, expect = frames[i % rounds]
            t0 = _clock()
            size = roundtrip(frame)
            elapsed += _clock() - t0
            check(size, cid, expect)                                        # untimed
        SINK.put(size)
        return elapsed
    return time_func, payload


BENCHMARKS = {
    "produce_req_1MiB_4x256KiB_1KiB_records": produce_bench,
    "fetch_req_1MiB_4x256KiB_1KiB_records": fetch_bench,
}


def _lazy(make, bootstrap):
    state = {}

    def time_func(loops):
        fn = state.get("fn")
        if fn is None:
            fn = state["fn"] = make(bootstrap)[0]
        return fn(loops)
    return time_func


def _forward_args(cmd, args):
    cmd.extend(("--bootstrap-server", args.bootstrap_server))
    if args.select:
        cmd.extend(("--select", args.select))


def main() -> None:
    import re
    runner = pyperf.Runner(program_args=("-m", "kbroker.perf.macro"), add_cmdline_args=_forward_args)
    runner.argparser.add_argument("--bootstrap-server", metavar="HOST:PORT",
                                  help="a running kbroker broker (default: start one on /dev/shm)")
    runner.argparser.add_argument("--select", metavar="REGEX", help="run only matching benchmarks")
    runner.argparser.add_argument("--list", action="store_true", help="print the benchmark names")
    args = runner.parse_args()
    names = [n for n in BENCHMARKS if not args.select or re.search(args.select, n)]
    if args.list:
        print("\n".join(names))
        return
    if not names:
        sys.exit(f"no benchmark matches {args.select!r}")
    if not args.worker:
        if not args.bootstrap_server:
            args.bootstrap_server = start_cluster().bootstrap
        ensure_topics(args.bootstrap_server)
    runner.metadata["description"] = "kbroker macro-benchmarks over loopback (seconds per request)"
    payload = sum(len(b) for b in request_batches(0))
    for name in names:
        runner.bench_time_func(name, _lazy(BENCHMARKS[name], args.bootstrap_server),
                               metadata={"payload_bytes": payload})


if __name__ == "__main__":
    main()
