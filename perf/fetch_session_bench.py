"""Idle fetches at many partitions with and without fetch sessions (KIP-227): request and answer bytes and
the broker's CPU per fetch (not a test).

Two brokers; a topic of --partitions partitions with replicas [0, 1] led by broker 0, with one record in
each; broker 1 is then stopped, so that the only fetches broker 0 serves are this tool's. Four clients
fetch the idle partitions from broker 0 over their own connections, one request outstanding, each
request long-polling --max-wait-ms (nothing arrives): a consumer (replica_id -1) and a follower
(replica_id 1, a replica of every partition: its fetches record its position as a follower's do), each
sessionless (session epoch -1, every partition listed, as before sessions) and with a session (a full
fetch with epoch 0 first, then incremental fetches that list nothing). Per round, each of the four runs
--fetches requests in turn (the order reversed every other round); the broker's on-CPU time (schedstat,
every thread) over a run, minus what an idle stretch of the same length cost it just before, divided by
the fetches, is its CPU per fetch. Reported per round and as the median of the rounds: bytes per request
and answer, µs per fetch, and session ÷ sessionless per client (goal: <= 0.2).

    .venv/bin/python -m kbroker.perf.fetch_session_bench --partitions 1000 --rounds 5
"""
from __future__ import annotations

import argparse
import socket
import tempfile
import time

from confluent_kafka.admin import AdminClient, NewTopic

from kbroker.protocol.api import decode_response, encode_request
from kbroker.record import BatchBuilder
from kbroker.testing import LocalCluster

from .harness import recv_frame, run_ns

TOPIC = "fsess-bench"
FETCH_VERSION = 11


class Client:
    """One fetching client: its connection, its session (id, next epoch) when it uses one."""

    def __init__(self, addr, replica_id: int, partitions: int, session: bool, max_wait_ms: int):
        self.sock = socket.create_connection(addr)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.replica_id, self.partitions, self.session = replica_id, partitions, session
        self.max_wait_ms = max_wait_ms
        self.corr = 0
        self.session_id, self.epoch = 0, (0 if session else -1)

    def _body(self, all_partitions: bool) -> dict:
        parts = [{"partition": p, "current_leader_epoch": -1, "fetch_offset": 1,
                  "log_start_offset": 0, "partition_max_bytes": 1 << 20}
                 for p in range(self.partitions)] if all_partitions else []
        return {"replica_id": self.replica_id, "max_wait_ms": self.max_wait_ms, "min_bytes": 1,
                "max_bytes": 50 << 20, "isolation_level": 0, "session_id": self.session_id,
                "session_epoch": self.epoch, "topics": [{"topic": TOPIC, "partitions": parts}] if parts else [],
                "forgotten_topics_data": [], "rack_id": ""}

    def fetch(self) -> tuple[int, int, dict]:
        """One request -> (request bytes, answer bytes, the answer)."""
        full = not self.session or self.epoch == 0
        self.corr += 1
        frame = encode_request(1, FETCH_VERSION, self.corr, "fsess-bench", self._body(full))
        self.sock.sendall(frame)
        answer = recv_frame(self.sock, bytearray(4))
        _c, resp = decode_response(1, FETCH_VERSION, memoryview(answer))
        if resp["error_code"]:
            raise RuntimeError(f"fetch error {resp['error_code']}")
        for t in resp["responses"]:
            for p in t["partitions"]:
                if p["error_code"]:
                    raise RuntimeError(f"partition {p['partition_index']}: error {p['error_code']}")
        if self.session:
            if self.epoch == 0:
                if not resp["session_id"]:
                    raise RuntimeError("no session was created")
                self.session_id, self.epoch = resp["session_id"], 1
            else:
                self.epoch += 1
        return len(frame), len(answer) + 4, resp

    def close(self):
        self.sock.close()


def _call(sock, api_key, version, body, corr=[0]):
    corr[0] += 1
    sock.sendall(encode_request(api_key, version, corr[0], "fsess-bench", body))
    _c, resp = decode_response(api_key, version, memoryview(recv_frame(sock, bytearray(4))))
    return resp


def setup(c, partitions: int) -> None:
    """The topic (replicas [0, 1]), a record in each partition, then broker 1 stopped."""
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    admin.create_topics([NewTopic(TOPIC, partitions, replica_assignment=[[0, 1]] * partitions)])[TOPIC].result(60)
    addr = ("127.0.0.1", c.brokers[0].port)
    with socket.create_connection(addr) as sock:
        deadline = time.monotonic() + 120
        while True:
            t = _call(sock, 3, 4, {"topics": [{"name": TOPIC}], "allow_auto_topic_creation": False})["topics"][0]
            if len(t["partitions"]) == partitions and all(p["leader_id"] == 0 for p in t["partitions"]):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{TOPIC} not led by broker 0")
            time.sleep(0.2)
        b = BatchBuilder(0)
        b.append(int(time.time() * 1000), b"k", b"v")
        batch = b.build()
        for start in range(0, partitions, 200):
            r = _call(sock, 0, 7, {"transactional_id": None, "acks": 1, "timeout_ms": 30000, "topic_data": [
                {"name": TOPIC, "partition_data": [{"index": p, "records": batch}
                                                   for p in range(start, min(start + 200, partitions))]}]})
            for pr in r["responses"][0]["partition_responses"]:
                if pr["error_code"]:
                    raise RuntimeError(f"produce to {pr['index']}: error {pr['error_code']}")
    c.stop_broker(1)


def measure(pid: int, client: Client, fetches: int) -> dict:
    """``fetches`` requests of ``client`` -> bytes and broker CPU per fetch (idle-corrected)."""
    t0 = time.monotonic()
    cpu0 = run_ns(pid)
    req = ans = 0
    for _ in range(fetches):
        q, a, _resp = client.fetch()
        req += q
        ans += a
    wall = time.monotonic() - t0
    busy = run_ns(pid) - cpu0
    # the broker's own background over the same wall time (timers, ZooKeeper pings), just after
    i0, c0 = time.monotonic(), run_ns(pid)
    time.sleep(min(wall, 5.0))
    idle_rate = (run_ns(pid) - c0) / (time.monotonic() - i0)
    net = max(busy - idle_rate * wall, 0)
    return {"request_bytes": req / fetches, "answer_bytes": ans / fetches, "us_per_fetch": net / fetches / 1e3,
            "raw_us_per_fetch": busy / fetches / 1e3}


def run(partitions: int = 1000, rounds: int = 5, fetches: int = 20, max_wait_ms: int = 500, out=print) -> dict:
    with tempfile.TemporaryDirectory() as d, LocalCluster(d, brokers=2) as c:
        setup(c, partitions)
        pid = c.brokers[0].pid
        addr = ("127.0.0.1", c.brokers[0].port)
        kinds = [("consumer", -1, False), ("consumer", -1, True), ("follower", 1, False), ("follower", 1, True)]
        clients = {(who, s): Client(addr, rid, partitions, s, max_wait_ms) for who, rid, s in kinds}
        for cl in clients.values():
            cl.fetch()              # warm: a session's full fetch; the follower's first position recorded
        per_round = []
        try:
            for r in range(rounds):
                order = kinds if r % 2 == 0 else kinds[::-1]
                got = {}
                for who, _rid, s in order:
                    got[(who, s)] = measure(pid, clients[(who, s)], fetches)
                per_round.append(got)
                for who in ("consumer", "follower"):
                    a, b = got[(who, False)], got[(who, True)]
                    ratio = b["us_per_fetch"] / a["us_per_fetch"] if a["us_per_fetch"] else float("nan")
                    out(f"round {r + 1} {who}: sessionless {a['request_bytes']:.0f} B/request "
                        f"{a['answer_bytes']:.0f} B/answer {a['us_per_fetch']:.0f} µs/fetch "
                        f"(raw {a['raw_us_per_fetch']:.0f}); session {b['request_bytes']:.0f} B/request "
                        f"{b['answer_bytes']:.0f} B/answer {b['us_per_fetch']:.0f} µs/fetch "
                        f"(raw {b['raw_us_per_fetch']:.0f}); ratio {ratio:.3f}")
        finally:
            for cl in clients.values():
                cl.close()
        summary = {}
        for who in ("consumer", "follower"):
            ratios = sorted(g[(who, True)]["us_per_fetch"] / g[(who, False)]["us_per_fetch"]
                            for g in per_round if g[(who, False)]["us_per_fetch"])
            med = {s: sorted(g[(who, s)]["us_per_fetch"] for g in per_round)[rounds // 2] for s in (False, True)}
            summary[who] = {"median_ratio": ratios[len(ratios) // 2] if ratios else float("nan"),
                            "sessionless_us": med[False], "session_us": med[True],
                            "request_bytes": (per_round[0][(who, False)]["request_bytes"],
                                              per_round[0][(who, True)]["request_bytes"])}
            out(f"{who}: median over {rounds} rounds: sessionless {med[False]:.0f} µs/fetch, session "
                f"{med[True]:.0f} µs/fetch, ratio {summary[who]['median_ratio']:.3f} (goal <= 0.2); request "
                f"{summary[who]['request_bytes'][0]:.0f} -> {summary[who]['request_bytes'][1]:.0f} bytes")
        return {"rounds": per_round, "summary": summary}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--fetches", type=int, default=20, help="fetches per client and round")
    ap.add_argument("--max-wait-ms", type=int, default=500)
    a = ap.parse_args(argv)
    run(a.partitions, a.rounds, a.fetches, a.max_wait_ms)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
