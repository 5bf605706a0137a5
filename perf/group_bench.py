"""Group coordinator benchmark: failure detection and Join->Sync times, commit throughput
and latency. Not a timed test; run it by hand:

    .venv/bin/python -m perf.group_bench [--seconds 10] [--committers 8] [--partitions-per-commit 10]

Fixed configuration: one broker (LocalCluster), offsets.topic.num.partitions=3,
group.initial.rebalance.delay.ms=0, session.timeout.ms=6000, members heartbeat every 100 ms.
Members speak the protocol directly (kbroker's BrokerConnection), so the figures are the
coordinator's, not a client library's timers:

- crash: member B of a stable 2-member group stops heartbeating (as after kill -9). Failure
  detection = B's crash -> A's first heartbeat answered REBALANCE_IN_PROGRESS (bounded below by the
  session timeout); Join->Sync = A's JoinGroup sent -> its SyncGroup answered (new generation).
- join: member C joins a stable group. Detection = C's JoinGroup sent -> A's first heartbeat answered
  REBALANCE_IN_PROGRESS; Join->Sync as above, measured on C (it waits for A's rejoin).
- commits: N committers, each on its own connection, commit M partitions per OffsetCommit (v7,
  standalone, acks=-1 through the store) back to back for S seconds: commits/s (requests and
  offsets) and latency p50/p99/max.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time

from kbroker.client.connection import BrokerConnection
from kbroker.client.group import encode_assignment, encode_subscription
from kbroker.protocol.errors import Errors
from kbroker.testing import LocalCluster

SESSION_MS = 6000
HB_S = 0.1


class Member:
    def __init__(self, conn, group):
        self.conn, self.group, self.member_id, self.generation = conn, group, "", -1

    async def join(self):
        t0 = time.monotonic()
        while True:
            _, r = await self.conn.send(11, {
                "group_id": self.group, "session_timeout_ms": SESSION_MS, "rebalance_timeout_ms": 10000,
                "member_id": self.member_id, "protocol_type": "consumer",
                "protocols": [{"name": "range", "metadata": encode_subscription(["t"], version=0)}]}, 5,
                timeout=30)
            if r["error_code"] == Errors.MEMBER_ID_REQUIRED:
                self.member_id = r["member_id"]
                continue
            assert r["error_code"] == 0, r
            break
        self.member_id, self.generation = r["member_id"], r["generation_id"]
        assignments = []
        if r["leader"] == self.member_id:
            ms = [m["member_id"] for m in r["members"]]
            assignments = [{"member_id": m, "assignment": encode_assignment({"t": [i]})} for i, m in enumerate(ms)]
        _, s = await self.conn.send(14, {"group_id": self.group, "generation_id": self.generation,
                                         "member_id": self.member_id, "assignments": assignments}, 3, timeout=30)
        assert s["error_code"] == 0, s
        return time.monotonic() - t0

    async def heartbeat(self):
        _, r = await self.conn.send(12, {"group_id": self.group, "generation_id": self.generation,
                                         "member_id": self.member_id}, 3)
        return r["error_code"]

    async def beat_until_rebalance(self):
        while True:
            code = await self.heartbeat()
            if code == 27:
                return time.monotonic()
            assert code == 0, code
            await asyncio.sleep(HB_S)


async def _conn(port):
    return await BrokerConnection.open("127.0.0.1", port)


async def _ready(port, group):
    c = await _conn(port)
    try:
        while True:
            _, r = await c.send(10, {"key": group, "key_type": 0}, 1)
            if r["error_code"] == 0:
                _, f = await c.send(9, {"group_id": group, "topics": None}, 5)
                if f["error_code"] == 0:
                    return
            await asyncio.sleep(0.1)
    finally:
        c.close()


async def rebalance_times(port, rounds):
    crash, join = [], []
    for i in range(rounds):
        group = f"bench-crash-{i}"
        await _ready(port, group)
        a, b = Member(await _conn(port), group), Member(await _conn(port), group)
        await a.join()
        ta = asyncio.ensure_future(a.beat_until_rebalance())
        tb = asyncio.ensure_future(b.join())
        await ta                            # B's join makes A rejoin; then both are stable
        await a.join()
        await tb
        hb_b = asyncio.ensure_future(b.beat_until_rebalance())
        await asyncio.sleep(0.5)
        hb_b.cancel()                      # B "crashes": no heartbeat, no LeaveGroup
        b.conn.close()
        t_crash = time.monotonic()
        t_detect = await a.beat_until_rebalance()
        js = await a.join()
        crash.append((t_detect - t_crash, js))
        # join: C joins the stable one-member group
        c = Member(await _conn(port), group)
        beat = asyncio.ensure_future(a.beat_until_rebalance())
        t_join = time.monotonic()
        jc = asyncio.ensure_future(c.join())
        t_detect = await beat
        await a.join()
        await jc
        join.append((t_detect - t_join, time.monotonic() - t_join))
        for m in (a, c):
            m.conn.close()
    return crash, join


async def commit_load(port, seconds, committers, per_commit):
    group_topic = "bench-commits"
    c = await _conn(port)
    from kbroker.client.admin import Admin, NewTopic
    async with Admin(f"127.0.0.1:{port}") as admin:
        try:
            await admin.create_topics([NewTopic(group_topic, per_commit, 1)])
        except Exception:
            pass
    c.close()
    lat = []
    stop = time.monotonic() + seconds

    async def committer(i):
        group = f"bench-committer-{i}"
        await _ready(port, group)
        conn = await _conn(port)
        n = 0
        while time.monotonic() < stop:
            n += 1
            body = {"group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
                    "topics": [{"name": group_topic, "partitions": [
                        {"partition_index": p, "committed_offset": n, "committed_metadata": "bench"}
                        for p in range(per_commit)]}]}
            t0 = time.monotonic()
            _, r = await conn.send(8, body, 7)
            lat.append(time.monotonic() - t0)
            assert all(p["error_code"] == 0 for t in r["topics"] for p in t["partitions"]), r
        conn.close()
    t0 = time.monotonic()
    await asyncio.gather(*(committer(i) for i in range(committers)))
    wall = time.monotonic() - t0
    lat.sort()
    return {"requests": len(lat), "commits_per_s": len(lat) / wall, "offsets_per_s": len(lat) * per_commit / wall,
            "p50_ms": 1000 * lat[len(lat) // 2], "p99_ms": 1000 * lat[int(len(lat) * 0.99) - 1],
            "max_ms": 1000 * lat[-1]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--committers", type=int, default=8)
    ap.add_argument("--partitions-per-commit", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    with LocalCluster(tempfile.mkdtemp(prefix="group-bench-"), brokers=1, num_partitions=1,
                      overrides={"offsets.topic.num.partitions": 3, "group.initial.rebalance.delay.ms": 0}) as c:
        port = c.brokers[0].port
        crash, join = asyncio.run(rebalance_times(port, args.rounds))
        commits = asyncio.run(commit_load(port, args.seconds, args.committers, args.partitions_per_commit))
    out = {
        "config": {"session_timeout_ms": SESSION_MS, "heartbeat_interval_ms": int(HB_S * 1000),
                   "committers": args.committers, "partitions_per_commit": args.partitions_per_commit,
                   "seconds": args.seconds, "rounds": args.rounds},
        "crash_detection_s": statistics.median(x for x, _ in crash),
        "crash_join_to_sync_s": statistics.median(y for _, y in crash),
        "join_detection_s": statistics.median(x for x, _ in join),
        "join_to_sync_s": statistics.median(y for _, y in join),
        "commits": commits,
    }
    print(json.dumps(out, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
