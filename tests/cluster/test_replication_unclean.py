"""T15, unclean-election variant: proof that the history checker sees loss on that path.

Three real brokers, each advertising a TcpProxy (tests/proxy.py), so followers fetch from the leader
through its proxy. Topic RF=3 with unclean.leader.election.enable=true and min.insync.replicas=1.
The leader's proxy is cut: the followers stop replicating, the leader shrinks the ISR to itself
(replica.lag.time.max.ms 3 s) and keeps acknowledging acks=1 writes sent to its real port. Then the
leader is killed: no ISR member is alive, so the controller elects an out-of-sync follower (allowed
by the topic's unclean setting), and the records acknowledged only by the old leader are gone.
The checker must count acked-but-lost > 0 (and all of them are records written after the cut)."""
from __future__ import annotations

import time

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from checkers import PRODUCE, History, RawConn, log_end_offset, read_all_confluent
from kbroker._native.batch import BatchBuilder
from kbroker.testing import LocalCluster, wait_until
from proxy import TcpProxy
from test_replication import TOPIC, state, wait_unregistered
from test_replication_faults import zk_state

LAG_MS = 3000


def produce_acks1(conn, value: bytes) -> tuple[int, int]:
    b = BatchBuilder()
    b.append(int(time.time() * 1000), None, value)
    resp = conn.request(PRODUCE, 8, {"transactional_id": None, "acks": 1, "timeout_ms": 5000, "topic_data": [
        {"name": TOPIC, "partition_data": [{"index": 0, "records": b.build()}]}]})
    r = resp["responses"][0]["partition_responses"][0]
    return r["error_code"], r["base_offset"]


@pytest.mark.slow
def test_t15_unclean_election_of_an_out_of_sync_follower_is_seen_as_loss(tmp_path):
    c = LocalCluster(tmp_path, brokers=3, overrides={"replica.lag.time.max.ms": LAG_MS})
    proxies = {i: TcpProxy(b.port).start() for i, b in c.brokers.items()}
    try:
        for i, b in c.brokers.items():
            b.extra = {"advertised.listeners": f"PLAINTEXT://127.0.0.1:{proxies[i].port}"}
        with c:
            _unclean(c, proxies)
    finally:
        for px in proxies.values():
            px.close()


def _unclean(c, proxies):
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 3, config={"min.insync.replicas": "1",
                                                        "unclean.leader.election.enable": "true"})])[TOPIC].result(30)
    leader, epoch, isr = wait_until(lambda: (lambda s: s if len(s[2]) == 3 else None)(state(c)), 30, "ISR of 3")
    followers = [b for b in c.brokers if b != leader]
    hist = History()

    def write(conn, value):
        hist.send(value)
        err, off = produce_acks1(conn, value)
        if err == 0:
            hist.ack(value, 0, off)
        else:
            hist.fail(value, f"error {err}")

    with RawConn(f"127.0.0.1:{c.brokers[leader].port}") as conn:
        for i in range(50):
            write(conn, b"before-%03d" % i)
        # Replicated before the cut: the ISR is all three from creation, so only the leader's high
        # watermark (min log end over the ISR) shows that both followers hold the 50 records.
        leader_addr = f"127.0.0.1:{c.brokers[leader].port}"
        wait_until(lambda: log_end_offset(leader_addr, TOPIC, 0) == 50, 30, "the followers to hold the first records")
        proxies[leader].cut()
        # A follower at the leader's log end counts as caught up however long it is silent (Kafka's
        # isCaughtUp): the leader needs a record they lack before it can drop them.
        write(conn, b"after-%03d" % 0)
        shrunk = wait_until(lambda: (lambda s: s if s[2] == [leader] else None)(zk_state(c)),
                            LAG_MS / 1000 + 15, "the leader to shrink the ISR to itself")
        assert shrunk[0] == leader
        for i in range(1, 200):
            write(conn, b"after-%03d" % i)
    assert len(hist.acked) == 250, f"only {len(hist.acked)} of 250 acks=1 writes acknowledged"
    c.kill(leader)
    wait_unregistered(c, leader)
    new = wait_until(lambda: (lambda s: s if s[0] in followers else None)(zk_state(c)), 30,
                     "an out-of-sync follower to be elected (unclean)")
    # Elected from outside the last ISR ([old leader]); its ISR may have grown back since.
    assert new[1] > shrunk[1] and new[0] not in shrunk[2], (new, shrunk)
    read_all_confluent(",".join(f"127.0.0.1:{c.brokers[b].port}" for b in followers), TOPIC, 1, hist)
    report = hist.check()
    print(f"unclean election of {new[0]} (epoch {new[1]}): {report.line()}")
    lost = [e[1] for e in report.examples if e[0] == "acked but lost"]
    assert report.acked_lost > 0, report.line()
    assert all(v.startswith(b"after-") for v in lost), lost[:5]
