"""Transactions benchmark: what a transaction costs the producer, and EndTxn's latency.

1. Producer throughput: ``producer_perf`` (kbroker's client) on one broker, the same records with
   ``--transaction-duration-ms`` (transactional, one commit per duration) and without (idempotent);
   reported as records/s of each and their ratio, per round (the machine's noise shows in the spread).
2. EndTxn on RF=3: three brokers, ``__transaction_state`` with RF=3 and min ISR 2; each transaction adds
   two partitions of an RF=3 topic and commits. Reported: EndTxn's round trip (the PrepareCommit write,
   acks=all) and the time until DescribeTransactions shows CompleteCommit (markers written and
   replicated on both partitions, then CompleteCommit), p50 / p99.

Run: ``python -m kbroker.perf.txn_bench [--records N] [--rounds R] [--duration-ms D] [--endtxn N]``.
A benchmark, not a test: nothing is asserted.
"""
from __future__ import annotations

import argparse
import asyncio
import io
import tempfile
import time
from pathlib import Path

from kbroker.client import Admin, NewTopic
from kbroker.client.connection import BrokerConnection
from kbroker.protocol.api import ApiKey
from kbroker.protocol.errors import Errors
from kbroker.testing import LocalCluster

from . import producer_perf as pp

_RETRY = {Errors.COORDINATOR_LOAD_IN_PROGRESS, Errors.COORDINATOR_NOT_AVAILABLE, Errors.NOT_COORDINATOR,
          Errors.CONCURRENT_TRANSACTIONS}


async def _create(bootstrap: str, topic: str, partitions: int, rf: int) -> None:
    async with Admin(bootstrap) as a:
        await a.create_topics([NewTopic(topic, partitions, rf)])


async def _produce(bootstrap: str, topic: str, records: int, size: int, tid: str | None, duration_ms: int) -> float:
    props = {"bootstrap.servers": bootstrap, "linger.ms": "5"}
    if tid:
        props["transactional.id"] = tid
    cfg = pp.RunConfig(topic=topic, num_records=records, throughput=-1, settings=pp.settings_from(props),
                       record_size=size, transaction_duration_ms=duration_ms if tid else 0)
    out = io.StringIO()
    await pp.run(cfg, out=out, err=io.StringIO())
    # The tool's summary line: "N records sent, R records/sec (...)".
    return float(out.getvalue().splitlines()[-1].split(",")[1].split()[0])


def producer_ratio(root: Path, records: int, size: int, rounds: int, duration_ms: int) -> list[tuple[float, float]]:
    out = []
    with LocalCluster(root / "one", brokers=1, num_partitions=3) as c:
        for i in range(rounds):
            asyncio.run(_create(c.bootstrap, f"idem{i}", 3, 1))
            asyncio.run(_create(c.bootstrap, f"txn{i}", 3, 1))
            idem = asyncio.run(_produce(c.bootstrap, f"idem{i}", records, size, None, 0))
            txn = asyncio.run(_produce(c.bootstrap, f"txn{i}", records, size, f"bench-{i}", duration_ms))
            out.append((idem, txn))
    return out


async def _call(conn: BrokerConnection, api_key: int, body: dict, version: int, code_of) -> dict:
    while True:
        _, r = await conn.send(api_key, body, version=version)
        if code_of(r) not in _RETRY:
            return r
        await asyncio.sleep(0.001)


async def _endtxn(bootstrap: str, n: int) -> tuple[list[float], list[float]]:
    host, port = bootstrap.split(",")[0].split(":")
    boot = await BrokerConnection.open(host, int(port))
    tid = "bench-endtxn"
    while True:
        _, r = await boot.send(ApiKey.FIND_COORDINATOR, {"key": tid, "key_type": 1}, version=3)
        if r["error_code"] == 0:
            break
        await asyncio.sleep(0.1)
    boot.close()
    conn = await BrokerConnection.open(r["host"], r["port"])
    try:
        init = await _call(conn, ApiKey.INIT_PRODUCER_ID, {"transactional_id": tid, "transaction_timeout_ms": 60000},
                           4, lambda r: r["error_code"])
        pid, epoch = init["producer_id"], init["producer_epoch"]
        add = {"v3_and_below_transactional_id": tid, "v3_and_below_producer_id": pid,
               "v3_and_below_producer_epoch": epoch, "v3_and_below_topics": [{"name": "lat", "partitions": [0, 1]}]}
        end = {"transactional_id": tid, "producer_id": pid, "producer_epoch": epoch, "committed": True}
        rtt, complete = [], []
        for _ in range(n):
            await _call(conn, ApiKey.ADD_PARTITIONS_TO_TXN, add, 3, lambda r: max(
                p["partition_error_code"] for t in r["results_by_topic_v3_and_below"] for p in t["results_by_partition"]))
            t0 = time.perf_counter()
            r = await _call(conn, ApiKey.END_TXN, end, 3, lambda r: r["error_code"])
            t1 = time.perf_counter()
            if r["error_code"]:
                raise RuntimeError(f"EndTxn failed: {Errors(r['error_code']).name}")
            while True:
                _, d = await conn.send(ApiKey.DESCRIBE_TRANSACTIONS, {"transactional_ids": [tid]}, version=0)
                if d["transaction_states"][0]["transaction_state"] == "CompleteCommit":
                    break
            rtt.append((t1 - t0) * 1000)
            complete.append((time.perf_counter() - t0) * 1000)
        return rtt, complete
    finally:
        conn.close()


def endtxn_latency(root: Path, n: int) -> tuple[list[float], list[float]]:
    with LocalCluster(root / "three", brokers=3, num_partitions=1,
                      overrides={"transaction.state.log.num.partitions": 1,
                                 "transaction.state.log.replication.factor": 3,
                                 "transaction.state.log.min.isr": 2}) as c:
        asyncio.run(_create(c.bootstrap, "lat", 2, 3))
        return asyncio.run(_endtxn(c.bootstrap, n))


def _pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(int(p * len(s)), len(s) - 1)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=300_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration-ms", type=int, default=100)
    ap.add_argument("--endtxn", type=int, default=300, help="EndTxn samples on RF=3 (0: skip)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for i, (idem, txn) in enumerate(producer_ratio(root, args.records, args.size, args.rounds, args.duration_ms)):
            print(f"round {i}: idempotent {idem:.0f} records/s, transactional ({args.duration_ms} ms) {txn:.0f} "
                  f"records/s, ratio {txn / idem:.2f}")
        if args.endtxn:
            rtt, complete = endtxn_latency(root, args.endtxn)
            print(f"EndTxn RF=3 n={len(rtt)}: p50 {_pct(rtt, .5):.2f} ms p99 {_pct(rtt, .99):.2f} ms; "
                  f"to CompleteCommit: p50 {_pct(complete, .5):.2f} ms p99 {_pct(complete, .99):.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
