"""One broker's ZooKeeper path cut: the broker reaches ZooKeeper only through a TcpProxy
(tests/proxy.py; LocalCluster on our own ZooKeeper, that broker's zookeeper.connect = the proxy) and
the proxy is cut while the broker leads the partition and keeps talking to clients and followers.

Three real brokers, ZooKeeper session timeout 6 s, topic RF=3 with min.insync.replicas=2,
replica.lag.time.max.ms 3 s; an idempotent acks=all confluent-kafka producer through the bootstrap
(~500 records/s) and a raw pipelined acks=all sender on the cut broker's own port (so requests keep
reaching it whatever it is). Sequence: cut -> its session expires on the server -> the controller
elects a new leader from the ISR (higher epoch) -> heal -> the broker learns its session is LOST,
re-registers, follows, truncates by epoch and rejoins the ISR.

Invariants (counted, asserted 0): acks=all answers the cut broker gave after it was replaced whose
record is not in the final log at the acknowledged offset; acked-but-lost over every send; inconsistent
offsets; duplicates (idempotent producer). Also printed: how many acks it gave after the replacement
at all (it may only have been answering with what its followers had fetched before they moved)."""
from __future__ import annotations

import time

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from checkers import History, read_all_confluent
from kbroker.testing import LocalCluster, wait_until
from kbroker.zk.local import start_zookeeper
from proxy import TcpProxy
from test_replication import TOPIC, LoadProducer, wait_acks_grow
from test_replication_faults import RawAcksAllSender, logs_identical, offsets_in_log, zk_state

LAG_MS = 3000
SESSION_MS = 6000
VICTIM = 2


@pytest.mark.slow
def test_broker_cut_from_zookeeper_is_replaced_and_loses_nothing(tmp_path):
    c = LocalCluster(tmp_path, brokers=3, overrides={"replica.lag.time.max.ms": LAG_MS},
                     session_timeout_ms=SESSION_MS)
    zk = start_zookeeper(tmp_path / "zookeeper", port=0, tick_time_ms=1000, die_with_parent=True,
                         avoid_ports={b.port for b in c.brokers.values()})
    px = None
    try:
        c.external_zk = zk.connect_string
        px = TcpProxy(zk.port).start()
        c.brokers[VICTIM].extra = {"zookeeper.connect": f"127.0.0.1:{px.port}"}
        with c:
            _cut(c, px)
    finally:
        if px is not None:
            px.close()
        zk.stop()


def _cut(c, px):
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, replica_assignment=[[VICTIM, 0, 1]],
                                  config={"min.insync.replicas": "2"})])[TOPIC].result(30)
    leader, epoch, isr = wait_until(lambda: (lambda s: s if len(s[2]) == 3 else None)(zk_state(c)), 30, "ISR of 3")
    assert leader == VICTIM
    hist = History()
    load = LoadProducer(c.bootstrap, hist, rate=500, **{
        "enable.idempotence": True, "acks": "all", "request.timeout.ms": 5000, "socket.timeout.ms": 5000}).start()
    raw = RawAcksAllSender(c.brokers[VICTIM].port, hist, b"cut-", interval=0.004, max_requests=6000,
                           timeout_ms=3000).start()
    healed = False
    after = None
    try:
        wait_until(lambda: sum(1 for a in raw.answers if a[2] == 0) >= 300, 30, "300 acks from the leader")
        czxid = c.registration_czxid(VICTIM)
        px.cut()
        cut_at = time.monotonic()
        wait_until(lambda: c.registration_czxid(VICTIM) is None, SESSION_MS / 1000 + 15,
                   "the cut broker's session to expire")
        expired_at = time.monotonic()
        new = wait_until(lambda: (lambda s: s if s[0] not in (VICTIM, -1) else None)(zk_state(c)), 30,
                         "a new leader")
        replaced_at = time.monotonic()
        assert new[1] > epoch and new[0] in isr, (new, epoch, isr)
        # acks=all goes on at the new leader. (Clients that ask the cut broker for metadata hear its
        # stale view until it learns of its expiry, as with Kafka: the bootstrap producer may stall.)
        after = RawAcksAllSender(c.brokers[new[0]].port, hist, b"new-", interval=0.002, max_requests=2000).start()
        wait_until(lambda: sum(1 for a in after.answers if a[2] == 0) >= 300, 30, "300 acks from the new leader")
        px.heal()
        healed = True
        wait_until(lambda: (lambda z: z is not None and z != czxid)(c.registration_czxid(VICTIM)), 60,
                   "the cut broker to re-register (new session)")
        wait_until(lambda: len(zk_state(c)[2]) == 3, 60, "the cut broker to rejoin the ISR")
        wait_acks_grow(load, 500, timeout=45)
        raw.finish()
        after.finish()
    finally:
        if not healed:
            px.heal()
        for s in (raw, after):
            if s is not None and not s.closed.is_set():
                s.finish()
        load.finish()
    late = raw.acked_after(replaced_at)
    read_all_confluent(c.bootstrap, TOPIC, 1, hist)
    report = hist.check()
    wrong_late = offsets_in_log(hist, [v for v, _o in late])
    errors = sorted({e for _t, _v, e, _o in raw.answers if e})
    print(report.line())
    print(f"ZooKeeper cut: session expired {expired_at - cut_at:.1f}s after the cut, new leader {new[0]} "
          f"(epoch {new[1]}) {replaced_at - expired_at:.1f}s later; the cut broker acked {len(late)} after its "
          f"replacement, {wrong_late} of them not in the final log at that offset; its error codes {errors}")
    assert wrong_late == 0, late[:5]
    assert offsets_in_log(hist, [v for _t, v, _e, _o in raw.answers]) == 0
    assert report.acked > 1000
    assert report.acked_lost == 0, report.line()
    assert report.inconsistent_offsets == 0, report.line()
    assert report.duplicates == 0, report.line()
    wait_until(lambda: logs_identical(c), 30, "identical logs on all three brokers")
