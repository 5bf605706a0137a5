"""Attack benchmark: steady clients' latency during each attack beside their latency without it,
and what validating compressed batches costs on compressed produce. Not a timed test.

``python -m kbroker.perf.attack_bench [--phase-s 10] [--only NAME,...] [--json out.json]``

Part 1, per attack: a confluent-kafka producer (acks=all, linger.ms=2) sends one 100 B record every
~5 ms on its own connection and records each record's produce-to-ack latency; a consumer (fetch.wait.max.ms
100) records its largest gap. Each attack runs for ``phase_s`` right after a quiet phase of the same
length; the report gives p50/p99/max ack latency and the consumer's largest gap in both phases.
Attacks: ``stalled-frames`` (213 connections announce 8 MiB frames and send 2 KB), ``pool-real-bytes``
(40 connections send 1 MiB of 8 MiB frames), ``metadata-100k`` (Metadata requests naming 100,000
topics, back to back), ``zstd-bombs`` (Produce of a zstd batch inflating past the 64 MiB cap, back to
back), ``fuzz`` (kbroker.fuzz, one connection at a time).

Part 2, ``validation-cost``: kcat produces 1 KiB text records with ``-z lz4`` and ``-z zstd`` into two
brokers side by side, one validating compressed sections by streaming decompression (the default) and
one by the general path (``KBROKER_CODEC_STREAMING=0``: decompress the whole section, then walk), in
interleaved rounds; each broker's CPU for its run is read from /proc. Every stored batch of a run is
then validated again in this process, with that run's path: by the header checks alone (header + CRC:
``read_batch(check_crc=True)``) and by ``validate_and_stamp`` (adds decompression and the record walk).
Added CPU = the difference, reported per KiB of records and as a share of the broker CPU of that
produce run (which includes the broker's own validation; goal: below 25 %) and of the broker CPU of the
same records produced uncompressed (``-z none``, run first). Not counted: the hand-off of each batch to
a validation thread and back.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

from kbroker.perf.harness import cpu_seconds, kcat_env
from kbroker.protocol import api
from kbroker.protocol.types import varint_bytes
from kbroker.testing import LocalCluster

MAX_REQUEST = 8 << 20
POOL = 32 << 20


def _pct(values, q):
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


class Steady:
    def __init__(self, bootstrap, topic):
        import confluent_kafka as ck

        self.p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 2, "acks": "all"})
        self.c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "fetch.wait.max.ms": 100,
                              "enable.auto.commit": False})
        self.c.assign([ck.TopicPartition(topic, 0, ck.OFFSET_END)])
        self.topic = topic
        self.lat = []          # (ack time, latency)
        self.recv = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._produce, daemon=True),
                        threading.Thread(target=self._consume, daemon=True)]
        for t in self.threads:
            t.start()

    def _produce(self):
        while not self.stop.is_set():
            t0 = time.monotonic()
            self.p.produce(self.topic, b"x" * 100,
                           on_delivery=lambda err, m, t0=t0: err or self.lat.append((time.monotonic(), time.monotonic() - t0)))
            self.p.poll(0.005)
        self.p.flush(30)

    def _consume(self):
        while not self.stop.is_set():
            m = self.c.poll(0.1)
            if m is not None and not m.error():
                self.recv.append(time.monotonic())
        self.c.close()

    def window(self, t0, t1):
        lat = [l for t, l in self.lat if t0 <= t <= t1]
        pts = [t0] + [t for t in self.recv if t0 <= t <= t1] + [t1]
        return {"acks": len(lat), "p50_ms": round(_pct(lat, 0.5) * 1000, 1), "p99_ms": round(_pct(lat, 0.99) * 1000, 1),
                "max_ms": round(max(lat, default=float("nan")) * 1000, 1),
                "consumer_max_gap_ms": round(max(b - a for a, b in zip(pts, pts[1:])) * 1000, 1)}

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join(60)


# ---- attacks: each runs until ``until`` ----------------------------------------------------------------
def _stalled(bootstrap, until, n, payload):
    host, port = bootstrap.rsplit(":", 1)
    socks = []
    try:
        for _ in range(n):
            s = socket.create_connection((host, int(port)), timeout=5)
            s.settimeout(0.2)
            try:
                s.sendall(struct.pack(">i", MAX_REQUEST - 100) + payload)
            except (socket.timeout, BlockingIOError):
                pass
            socks.append(s)
        while time.monotonic() < until:
            time.sleep(0.1)
    finally:
        for s in socks:
            s.close()


def attack_stalled_frames(bootstrap, topic, until):
    _stalled(bootstrap, until, 213, b"\x07" * 2000)


def attack_pool_real_bytes(bootstrap, topic, until):
    _stalled(bootstrap, until, 40, b"\x07" * (1 << 20))


def _roundtrip(bootstrap, key, version, body, timeout=60):
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(api.encode_request(key, version, 1, "bench", body))
        size = struct.unpack(">i", _recv(s, 4))[0]
        return _recv(s, size)


def _recv(s, n):
    out = bytearray()
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return bytes(out)


def attack_metadata_100k(bootstrap, topic, until):
    names = [{"name": f"nope-{i:06d}"} for i in range(100_000)]
    while time.monotonic() < until:
        _roundtrip(bootstrap, 3, 4, {"topics": names, "allow_auto_topic_creation": False})


def attack_zstd_bombs(bootstrap, topic, until):
    from kbroker._native.crc import crc32c
    from kbroker.record.compression import compress

    value = b"\0" * (70 << 20)
    rec = b"\0" + b"\0" + b"\0" + b"\x01" + varint_bytes(len(value)) + value + b"\0"
    section = compress(4, varint_bytes(len(rec)) + rec)
    after = struct.pack(">hiqqqhii", 4, 0, 0, 0, -1, -1, -1, 1) + section
    batch = struct.pack(">qiibI", 0, 9 + len(after), -1, 2, crc32c(after)) + after
    body = {"transactional_id": None, "acks": -1, "timeout_ms": 5000,
            "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}]}]}
    while time.monotonic() < until:
        _roundtrip(bootstrap, 0, 7, body)


def attack_fuzz(bootstrap, topic, until):
    from kbroker.fuzz import Fuzzer
    Fuzzer(bootstrap, seed=7).run(max(until - time.monotonic(), 0.1))


ATTACKS = {"stalled-frames": attack_stalled_frames, "pool-real-bytes": attack_pool_real_bytes,
           "metadata-100k": attack_metadata_100k, "zstd-bombs": attack_zstd_bombs, "fuzz": attack_fuzz}


def run_attacks(phase_s, only):
    out = {}
    with tempfile.TemporaryDirectory(prefix="attack-bench-") as root:
        with LocalCluster(root, num_partitions=1, overrides={
                "socket.request.max.bytes": MAX_REQUEST, "queued.max.request.bytes": POOL,
                "kbroker.socket.request.frame.timeout.ms": 3000}) as c:
            topic = f"steady-{uuid.uuid4().hex[:6]}"
            _roundtrip(c.bootstrap, 3, 4, {"topics": [{"name": topic}], "allow_auto_topic_creation": True})
            time.sleep(1.0)
            steady = Steady(c.bootstrap, topic)
            time.sleep(3.0)
            try:
                for name, fn in ATTACKS.items():
                    if only and name not in only:
                        continue
                    q0 = time.monotonic()
                    time.sleep(phase_s)
                    quiet = steady.window(q0, time.monotonic())
                    a0 = time.monotonic()
                    fn(c.bootstrap, topic, a0 + phase_s)
                    a1 = time.monotonic()
                    time.sleep(0.5)       # acks of records sent during the attack
                    out[name] = {"quiet": quiet, "attack": steady.window(a0, a1)}
                    print(f"{name:16s} quiet p99={quiet['p99_ms']}ms max={quiet['max_ms']}ms "
                          f"gap={quiet['consumer_max_gap_ms']}ms | attack p99={out[name]['attack']['p99_ms']}ms "
                          f"max={out[name]['attack']['max_ms']}ms gap={out[name]['attack']['consumer_max_gap_ms']}ms",
                          flush=True)
            finally:
                steady.close()
    return out


# ---- compressed produce: the cost of validation -------------------------------------------------------
VARIANTS = {"streaming": {}, "general": {"KBROKER_CODEC_STREAMING": "0"}}


def _validation_seconds(batches, data, streaming):
    """(header + CRC only, full validation) CPU seconds of this thread over the stored batches, the least
    of three (thread CPU time, not wall time: the machine is shared, and the work runs on this thread
    with the GIL released)."""
    from kbroker._native import codec
    from kbroker._native.batch import read_batch, validate_and_stamp

    old = codec.set_streaming(streaming)
    try:
        before = after = float("inf")
        for _rep in range(3):            # the least of three: the machine is shared
            tb = ta = 0.0
            for b in batches:
                raw = bytearray(data[b.position:b.position + b.size])
                raw[0:8] = bytes(8)                   # a producer batch: baseOffset 0
                t = time.thread_time()
                read_batch(raw, 0, True)
                tb += time.thread_time() - t
                t = time.thread_time()
                validate_and_stamp(raw, 0, 0, 1 << 30, -1)
                ta += time.thread_time() - t
            before, after = min(before, tb), min(after, ta)
    finally:
        codec.set_streaming(old)
    return before, after


def validation_cost(records=200_000, rounds=3):
    """Compressed produce by kcat into two brokers side by side, one validating by streaming
    decompression (kbroker._native.codec) and one by the general path (KBROKER_CODEC_STREAMING=0:
    decompress the whole section, then walk), in interleaved rounds (the order alternates)."""
    from kbroker._native.batch import iter_batches

    out = {"records": records, "runs": []}
    with tempfile.TemporaryDirectory(prefix="attack-bench-cost-", dir="/dev/shm") as root:
        words = [b"alpha", b"beta", b"gamma", b"delta", b"kafka", b"broker", b"record", b"value"]
        import random
        r = random.Random(1)
        kfile = Path(root) / "records.txt"
        with open(kfile, "wb") as f:
            for i in range(records):
                line = b" ".join(r.choice(words) for _ in range(200))[:1023]
                f.write(line.ljust(1024 - 1, b".") + b"\n")
        env = kcat_env(Path(root))
        with LocalCluster(Path(root) / "s", num_partitions=1, env=VARIANTS["streaming"]) as cs, \
                LocalCluster(Path(root) / "g", num_partitions=1, env=VARIANTS["general"]) as cg:
            clusters = {"streaming": cs, "general": cg}

            def produce(c, codec, topic):
                _roundtrip(c.bootstrap, 3, 4, {"topics": [{"name": topic}], "allow_auto_topic_creation": True})
                time.sleep(1.0)
                pid = c.brokers[0].pid
                cpu0, t0 = cpu_seconds(pid), time.monotonic()
                subprocess.run(["kcat", "-P", "-b", c.bootstrap, "-t", topic, "-p", "0", "-z", codec, "-l",
                                str(kfile), "-X", "acks=1", "-X", "linger.ms=20"], env=env, check=True,
                               capture_output=True, timeout=300)
                return time.monotonic() - t0, cpu_seconds(pid) - cpu0

            # The same records uncompressed: the broker CPU the validation is also compared with.
            wall, plain_cpu = produce(cs, "none", "cost-none")
            out["none"] = {"wall_s": round(wall, 2), "broker_cpu_s": round(plain_cpu, 3)}
            print(f"validation-cost none: {json.dumps(out['none'])}", flush=True)
            for rnd in range(rounds):
                for codec in ("lz4", "zstd"):
                    order = list(VARIANTS) if rnd % 2 == 0 else list(VARIANTS)[::-1]
                    for variant in order:
                        c = clusters[variant]
                        topic = f"cost-{codec}-{rnd}"
                        wall, broker_cpu = produce(c, codec, topic)
                        data = b"".join(p.read_bytes()
                                        for p in sorted((c.brokers[0].data_dir / f"{topic}-0").glob("*.log")))
                        batches = iter_batches(data)
                        before, after = _validation_seconds(batches, data, variant == "streaming")
                        added = after - before
                        run = {"round": rnd, "codec": codec, "variant": variant, "batches": len(batches),
                               "stored_codecs": sorted({b.codec for b in batches}), "wall_s": round(wall, 2),
                               "broker_cpu_s": round(broker_cpu, 3), "validation_before_s": round(before, 4),
                               "validation_after_s": round(after, 4), "added_s": round(added, 4),
                               "added_ns_per_kib": round(added / records * 1e9),
                               "added_share_of_broker_cpu": round(added / broker_cpu, 4),
                               "added_share_of_uncompressed_broker_cpu": round(added / plain_cpu, 4)}
                        out["runs"].append(run)
                        print(f"validation-cost {json.dumps(run)}", flush=True)
    summary = {}
    for codec in ("lz4", "zstd"):
        for variant in VARIANTS:
            runs = [x for x in out["runs"] if x["codec"] == codec and x["variant"] == variant]
            shares = [x["added_share_of_broker_cpu"] for x in runs]
            ns = [x["added_ns_per_kib"] for x in runs]
            cpu = [x["broker_cpu_s"] for x in runs]
            summary[f"{codec} {variant}"] = {"share": [min(shares), max(shares)], "ns_per_kib": [min(ns), max(ns)],
                                             "broker_cpu_s": [min(cpu), max(cpu)]}
            print(f"validation-cost {codec:4s} {variant:9s} share of broker CPU {min(shares):.3f}-{max(shares):.3f} "
                  f"(goal < 0.25), {min(ns)}-{max(ns)} ns per KiB of records, broker CPU "
                  f"{min(cpu):.2f}-{max(cpu):.2f} s", flush=True)
    out["summary"] = summary
    return out


def _cost_batches(codec, n=8):
    """n producer batches of about 1 MiB of 1 KiB text records (validation-cost's records), built with
    kbroker's BatchBuilder for ``codec`` (frames as librdkafka writes them: independent 64 KiB lz4
    blocks, a zstd frame, a gzip member)."""
    import random

    from kbroker._native.batch import BatchBuilder

    words = [b"alpha", b"beta", b"gamma", b"delta", b"kafka", b"broker", b"record", b"value"]
    r = random.Random(1)
    out = []
    for _ in range(n):
        b = BatchBuilder(codec, 1 << 20)
        while b.append(1_700_000_000_000, None,
                       b" ".join(r.choice(words) for _ in range(200))[:1023].ljust(1023, b".")):
            pass
        out.append(bytearray(b.build()))
    return out


_IR_SCRIPT = """
import sys
from kbroker._native import batch as B, codec as N
from kbroker.perf.attack_bench import _cost_batches
mode, codec = sys.argv[1], int(sys.argv[2])
N.set_streaming(mode == "streaming")
batches = _cost_batches(codec)
for _ in range(2):
    for b in batches:
        B.validate_batch(b, 1 << 30)
print(sum(len(b) for b in batches), sum(B.read_batch(b).record_count for b in batches))
"""


def validation_instructions():
    """Instructions (callgrind, user space) inside batch.check_compressed (callees included) per KiB of
    records, per codec, streaming vs the general path: a figure that does not depend on the machine's
    load. Each batch is validated twice; first-call costs (pools, scratch growth) are included."""
    import shutil
    import sys

    if not shutil.which("valgrind"):
        print("validation-ir: valgrind not installed", flush=True)
        return {}
    out = {}
    with tempfile.TemporaryDirectory(prefix="attack-bench-ir-") as root:
        for codec, name in ((1, "gzip"), (3, "lz4"), (4, "zstd")):
            for mode in ("streaming", "general"):
                cg = Path(root) / f"cg-{name}-{mode}"
                res = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={cg}",
                                      "--collect-atstart=no", "--toggle-collect=*5batch_check_compressed*",
                                      sys.executable, "-c", _IR_SCRIPT, mode, str(codec)],
                                     capture_output=True, text=True, timeout=900, check=True)
                _size, records = map(int, res.stdout.split())
                totals = [line for line in cg.read_text().splitlines() if line.startswith(("totals:", "summary:"))]
                ir = int(totals[0].split()[1])
                out[f"{name} {mode}"] = {"instructions": ir, "per_kib_of_records": round(ir / (2 * records))}
                print(f"validation-ir {name:4s} {mode:9s} {ir / (2 * records):,.0f} instructions per KiB of records",
                      flush=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m kbroker.perf.attack_bench", description=__doc__.split("\n")[0])
    p.add_argument("--phase-s", type=float, default=10.0)
    p.add_argument("--only", default="", help="comma-separated attack names (and/or validation-cost, validation-ir)")
    p.add_argument("--json")
    a = p.parse_args(argv)
    only = set(filter(None, a.only.split(",")))
    result = {}
    phases = {"validation-cost", "validation-ir"}
    if not only or only - phases:
        result["attacks"] = run_attacks(a.phase_s, only - phases)
    if not only or "validation-cost" in only:
        result["validation_cost"] = validation_cost()
    if not only or "validation-ir" in only:
        result["validation_ir"] = validation_instructions()
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
