"""Broker CPU per GB served to read_committed consumers ÷ read_uncommitted ones (not a test).

One broker; a one-partition topic filled with transactional batches (--batch-kb each, --txn-batches per
transaction, every --abort-every-th transaction aborted) written with our own wire requests (transactional
Produce, then WriteTxnMarkers as the coordinator sends them). Rounds alternate read_uncommitted and
read_committed full reads of the partition (one connection, one request outstanding, the harness's
fetch_all) and take the broker's user+system CPU (/proc) per GB of record bytes received.
--partition-max-bytes below the sendfile threshold (64 KiB) measures the native Fetch path; above it,
the reference path with sendfile.

    .venv/bin/python -m kbroker.perf.txn_fetch_cost --mb 256 --rounds 3 --partition-max-bytes 32768
"""
from __future__ import annotations

import argparse
import socket
import tempfile
import time

from kbroker.protocol.api import decode_response, encode_request
from kbroker.record import BatchBuilder
from kbroker.testing import LocalCluster

from .harness import cpu_seconds, fetch_all, recv_frame

TOPIC = "txn-fetch"


def _call(sock, api_key, version, body, corr=[0]):
    corr[0] += 1
    sock.sendall(encode_request(api_key, version, corr[0], "kbroker-perf", body))
    _c, resp = decode_response(api_key, version, memoryview(recv_frame(sock, bytearray(4))))
    return resp


def fill(addr, mb: int, batch_kb: int, txn_batches: int, abort_every: int) -> tuple[int, int]:
    """-> (log end offset, transactions written)."""
    sock = socket.create_connection(addr)
    r = _call(sock, 22, 1, {"transactional_id": None, "transaction_timeout_ms": 60000})
    pid, epoch = r["producer_id"], r["producer_epoch"]
    value = b"v" * 100
    per_batch = max(1, batch_kb * 1024 // 110)
    seq = 0
    written = 0
    txns = 0
    now = int(time.time() * 1000)
    while written < mb << 20:
        for _ in range(txn_batches):
            b = BatchBuilder(0, batch_size=1 << 22)
            for i in range(per_batch):
                b.append(now, b"k%d" % i, value)
            data = b.build(producer_id=pid, producer_epoch=epoch, base_sequence=seq, is_transactional=True)
            seq += per_batch
            r = _call(sock, 0, 7, {"transactional_id": "perf", "acks": 1, "timeout_ms": 30000, "topic_data": [
                {"name": TOPIC, "partition_data": [{"index": 0, "records": data}]}]})
            code = r["responses"][0]["partition_responses"][0]["error_code"]
            if code:
                raise RuntimeError(f"produce error {code}")
            written += len(data)
        txns += 1
        r = _call(sock, 27, 1, {"markers": [{"producer_id": pid, "producer_epoch": epoch,
                                              "transaction_result": txns % abort_every != 0, "coordinator_epoch": 0,
                                              "topics": [{"name": TOPIC, "partition_indexes": [0]}]}]})
        if r["markers"][0]["topics"][0]["partitions"][0]["error_code"]:
            raise RuntimeError("marker refused")
    r = _call(sock, 2, 2, {"replica_id": -1, "isolation_level": 1, "topics": [
        {"name": TOPIC, "partitions": [{"partition_index": 0, "timestamp": -1}]}]})
    sock.close()
    return r["topics"][0]["partitions"][0]["offset"], txns


def run(mb: int = 256, batch_kb: int = 16, txn_batches: int = 10, abort_every: int = 10, rounds: int = 3,
        partition_max_bytes: int = 32768, out=print) -> dict:
    """-> {"rounds": [{isolation: (record bytes, CPU seconds)}], "ratios": [...], "median": float}."""
    # This tool writes the markers itself, as a coordinator would: the leader must not ask one whether a
    # transactional batch's partition was added (KIP-890 verification off).
    with tempfile.TemporaryDirectory() as d, LocalCluster(
            d, brokers=1, overrides={"transaction.partition.verification.enable": False}) as c:
        b = c.brokers[0]
        addr = ("127.0.0.1", b.port)
        with socket.create_connection(addr) as sock:
            _call(sock, 19, 2, {"topics": [
                {"name": TOPIC, "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []}],
                "timeout_ms": 30000, "validate_only": False})
            deadline = time.monotonic() + 60
            while True:         # until the partition has its leader
                t = _call(sock, 3, 4, {"topics": [{"name": TOPIC}], "allow_auto_topic_creation": False})["topics"][0]
                if t["partitions"] and t["partitions"][0]["leader_id"] >= 0:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{TOPIC} has no leader: {t}")
                time.sleep(0.1)
        end, txns = fill(addr, mb, batch_kb, txn_batches, abort_every)
        out(f"filled {mb} MB: {end} offsets, {txns} transactions ({txns // abort_every} aborted)")
        ratios, runs = [], []
        for r in range(rounds):
            seen = {}
            for iso in ((0, 1) if r % 2 == 0 else (1, 0)):
                cpu0 = cpu_seconds(b.pid)
                got = fetch_all(addr, TOPIC, [{0: end}], partition_max_bytes, isolation_level=iso)
                cpu = cpu_seconds(b.pid) - cpu0
                seen[iso] = (got["record_bytes"], cpu)
                out(f"round {r + 1} isolation={iso}: {got['record_bytes'] / 1e6:.0f} MB in {got['requests']} "
                    f"requests, {got['seconds']:.2f} s, broker CPU {cpu:.2f} s = "
                    f"{cpu / (got['record_bytes'] / 1e9):.2f} s/GB")
            runs.append(seen)
            per_gb = {iso: cpu / (n / 1e9) for iso, (n, cpu) in seen.items()}
            ratios.append(per_gb[1] / per_gb[0] if per_gb[0] > 0 else float("nan"))
            out(f"round {r + 1}: read_committed ÷ read_uncommitted CPU per GB = {ratios[-1]:.3f}")
        median = sorted(ratios)[len(ratios) // 2]
        out(f"median ratio over {rounds} rounds: {median:.3f} (goal <= 1.1)")
        return {"rounds": runs, "ratios": ratios, "median": median}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--batch-kb", type=int, default=16)
    ap.add_argument("--txn-batches", type=int, default=10)
    ap.add_argument("--abort-every", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--partition-max-bytes", type=int, default=32768)
    a = ap.parse_args(argv)
    run(a.mb, a.batch_kb, a.txn_batches, a.abort_every, a.rounds, a.partition_max_bytes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
