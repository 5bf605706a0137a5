"""Replication end to end on three real brokers (LocalCluster, ZooKeeper session timeout 6 s), topic
RF=3 with min.insync.replicas=2, real clients and real faults (kill -9, SIGSTOP).

Invariants are counted by the shared history checker (tests/checkers.py History): every send,
acknowledgement and read is logged, and the report counts acked-but-lost, duplicates and
inconsistent offsets. T15 shows the checker sees a real loss (acks=1 and a leader kill).
replica.lag.time.max.ms is 3000 here (Kafka's default is 30 s) so ISR changes happen within a test.
"""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from confluent_kafka import Producer

from checkers import FETCH, METADATA, PRODUCE, History, RawConn, all_batches, read_all_confluent
from kbroker._native.batch import BatchBuilder
from kbroker.testing import LocalCluster, wait_until
from kbroker.protocol.errors import Errors

LAG_MS = 3000
TOPIC = "rep"
NOT_ENOUGH_REPLICAS = Errors.NOT_ENOUGH_REPLICAS
NOT_LEADER_OR_FOLLOWER = Errors.NOT_LEADER_OR_FOLLOWER


@pytest.fixture
def cluster(tmp_path):
    with LocalCluster(tmp_path, brokers=3, overrides={"replica.lag.time.max.ms": LAG_MS}) as c:
        yield c


def live_ports(c):
    return [b.port for b in c.brokers.values() if b.running()]


def state(c, topic=TOPIC, partition=0):
    """(leader, leader_epoch, isr) as a live broker's Metadata v8 reports it."""
    last = None
    for port in live_ports(c):
        try:
            with RawConn(f"127.0.0.1:{port}") as conn:
                resp = conn.request(METADATA, 8, {"topics": [{"name": topic}], "allow_auto_topic_creation": False,
                                                    "include_cluster_authorized_operations": False,
                                                    "include_topic_authorized_operations": False})
        except OSError as e:
            last = e
            continue
        for t in resp["topics"]:
            for p in t["partitions"]:
                if p["partition_index"] == partition and t["error_code"] == 0:
                    return p["leader_id"], p["leader_epoch"], sorted(p["isr_nodes"])
    raise RuntimeError(f"no live broker answered Metadata for {topic}: {last}")


def wait_isr(c, size, timeout=30.0):
    return wait_until(lambda: (lambda s: s if len(s[2]) == size and s[0] >= 0 else None)(state(c)),
                      timeout, f"ISR of size {size}")


def make_topic(c, rf=3):
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    fut = admin.create_topics([NewTopic(TOPIC, 1, rf, config={"min.insync.replicas": "2"})])[TOPIC]
    fut.result(30)
    return wait_isr(c, rf)


class LoadProducer:
    """confluent-kafka at a fixed rate (~rate records/s) in a thread, every send logged in History."""

    def __init__(self, bootstrap, history: History, rate=1000, **conf):
        self.history = history
        self.rate = rate
        self.p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "message.timeout.ms": 60000,
                           "retry.backoff.ms": 100, **conf})
        self.stop_flag = threading.Event()
        self.n = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _cb(self, err, msg):
        if err is None:
            self.history.ack(msg.value(), msg.partition(), msg.offset())
        else:
            self.history.fail(msg.value(), err)

    def _run(self):
        step = 0.01
        per_step = max(1, int(self.rate * step))
        nxt = time.monotonic()
        while not self.stop_flag.is_set():
            for _ in range(per_step):
                v = b"v%09d" % self.n
                self.n += 1
                self.history.send(v)
                while True:
                    try:
                        self.p.produce(TOPIC, value=v, partition=0, on_delivery=self._cb)
                        break
                    except BufferError:
                        self.p.poll(0.05)
            self.p.poll(0)
            nxt += step
            time.sleep(max(0.0, nxt - time.monotonic()))

    def start(self):
        self.thread.start()
        return self

    def finish(self, timeout=90):
        self.stop_flag.set()
        self.thread.join()
        left = self.p.flush(timeout)
        assert left == 0, f"{left} records still unconfirmed after {timeout}s"

    def acked_count(self):
        return len(self.history.acked)


def wait_acks_grow(load, by=200, timeout=30.0):
    start = load.acked_count()
    wait_until(lambda: load.acked_count() >= start + by, timeout, f"{by} more acknowledgements")


def wait_unregistered(c, broker_id, timeout=30.0):
    wait_until(lambda: c.registration_czxid(broker_id) is None, timeout,
               f"/brokers/ids/{broker_id} to vanish (session expiry)")


# ---- acks=all writes reach every replica; consumers stop at the high watermark ----------------------

def test_acks_all_replicated_to_every_log_and_consumers_stop_at_hw(cluster):
    c = cluster
    leader, epoch, isr = make_topic(c)
    assert isr == [0, 1, 2]
    hist = History()
    p = Producer({"bootstrap.servers": c.bootstrap, "acks": "all", "linger.ms": 2})
    for i in range(3000):
        v = b"a%06d" % i
        hist.send(v)
        p.produce(TOPIC, value=v, partition=0,
                  on_delivery=lambda err, m: hist.ack(m.value(), m.partition(), m.offset()) if err is None
                  else hist.fail(m.value(), err))
        if i % 500 == 0:
            p.poll(0)
    assert p.flush(60) == 0
    assert len(hist.acked) == 3000 and not hist.failed

    # Every acked record is in all three logs: the same batches, byte for byte (offsets and CRCs).
    def stored(b):
        return [(s.base_offset, s.last_offset, s.crc) for _path, s in all_batches(c.brokers[b].data_dir, TOPIC, 0)]
    leader_batches = stored(leader)
    assert leader_batches and leader_batches[-1][1] == 2999
    wait_until(lambda: all(stored(b) == leader_batches for b in c.brokers), 20, "followers to hold the leader's batches")
    # Reading past the HW is for assigned replicas only: a Fetch with another broker id is refused.
    body = {"replica_id": 7, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
            "topics": [{"topic": TOPIC, "partitions": [{"partition": 0, "current_leader_epoch": -1,
                                                        "fetch_offset": 0, "log_start_offset": -1,
                                                        "partition_max_bytes": 1 << 20}]}]}
    with RawConn(f"127.0.0.1:{c.brokers[leader].port}") as conn:
        resp = conn.request(FETCH, 11, body)
    assert resp["responses"][0]["partitions"][0]["error_code"] == NOT_LEADER_OR_FOLLOWER

    # Followers stopped: acks=1 writes land on the leader only, and no consumer sees them.
    followers = [b for b in c.brokers if b != leader]
    for b in followers:
        os.kill(c.brokers[b].pid, signal.SIGSTOP)
    try:
        p1 = Producer({"bootstrap.servers": f"127.0.0.1:{c.brokers[leader].port}", "acks": 1, "linger.ms": 0})
        for i in range(20):
            p1.produce(TOPIC, value=b"u%03d" % i, partition=0)
        assert p1.flush(20) == 0
        wait_until(lambda: stored(leader)[-1][1] >= 3019, 10, "the acks=1 records on the leader")
        seen = History()
        ends = read_all_confluent(f"127.0.0.1:{c.brokers[leader].port}", TOPIC, 1, seen, timeout=30)
        assert ends[0] == 3000, f"high watermark {ends[0]} moved past what the followers hold"
        assert max(off for _p, off, _v in seen.polls) == 2999
    finally:
        for b in followers:
            os.kill(c.brokers[b].pid, signal.SIGCONT)
    after = History()
    wait_until(lambda: read_all_confluent(c.bootstrap, TOPIC, 1, History(), timeout=30)[0] == 3020, 30,
               "the high watermark to cover the acks=1 records once followers are back")
    read_all_confluent(c.bootstrap, TOPIC, 1, after)
    assert len(after.polls) == 3020


# ---- min.insync.replicas ---------------------------------------------------------------------------

def raw_produce(port, value, acks=-1):
    b = BatchBuilder()
    b.append(int(time.time() * 1000), None, value)
    with RawConn(f"127.0.0.1:{port}") as conn:
        resp = conn.request(PRODUCE, 8, {"transactional_id": None, "acks": acks, "timeout_ms": 5000, "topic_data": [
            {"name": TOPIC, "partition_data": [{"index": 0, "records": b.build()}]}]})
    return resp["responses"][0]["partition_responses"][0]


def test_min_insync_refuses_acks_all_with_one_replica_left(cluster):
    c = cluster
    leader = make_topic(c)[0]
    # A client retries until the leader has applied its LeaderAndIsr; so does this one.
    wait_until(lambda: raw_produce(c.brokers[leader].port, b"first")["error_code"] == 0, 10, "the first write")
    # Stop the two other brokers; the survivor leads with ISR [itself] < min.insync.replicas=2.
    survivor = leader
    for b in c.brokers:
        if b != survivor:
            c.kill(b)
            wait_unregistered(c, b)
    wait_until(lambda: state(c)[2] == [survivor] and state(c)[0] == survivor, 30, "ISR to shrink to the survivor")
    hist = History()
    for i in range(5):
        r = raw_produce(c.brokers[survivor].port, b"refused-%d" % i)
        assert r["error_code"] == NOT_ENOUGH_REPLICAS, r
        assert r["base_offset"] == -1
        hist.send(b"refused-%d" % i)
    # Nothing of them was appended: the survivor's log holds only the first record.
    stored = [s for _p, s in all_batches(c.brokers[survivor].data_dir, TOPIC, 0)]
    assert [(s.base_offset, s.last_offset) for s in stored] == [(0, 0)]
    # acks=1 is still accepted (Kafka's rule), but the HW does not move below min.insync.
    assert raw_produce(c.brokers[survivor].port, b"acks1", acks=1)["error_code"] == 0


# ---- T1: kill -9 the leader while an idempotent acks=all producer runs ------------------------------

@pytest.mark.slow
def test_t1_kill_leader_repeatedly_loses_no_acked_record(cluster):
    """Invariant: acked-but-lost 0 of N, inconsistent offsets 0, duplicates 0 (idempotence); each new
    leader was in the ISR before the kill; the leader epoch strictly increases."""
    c = cluster
    epochs = [make_topic(c)[1]]
    hist = History()
    load = LoadProducer(c.bootstrap, hist, rate=1000, **{"enable.idempotence": True, "acks": "all"}).start()
    try:
        for _round in range(5):            # the five leader kills
            wait_acks_grow(load, 300)
            leader, epoch, isr = wait_isr(c, 3, timeout=60)
            assert epoch >= epochs[-1]
            if epoch > epochs[-1]:
                epochs.append(epoch)
            c.kill(leader)
            wait_unregistered(c, leader)
            new_leader, new_epoch, new_isr = wait_until(
                lambda: (lambda s: s if s[0] >= 0 and s[0] != leader else None)(state(c)), 30, "a new leader")
            assert new_leader in isr, f"new leader {new_leader} was not in the ISR {isr}"
            assert new_epoch > epoch
            epochs.append(new_epoch)
            wait_acks_grow(load, 300)          # acks=all continues with two replicas
            c.start_broker(leader)
    finally:
        load.finish()
    wait_isr(c, 3, timeout=60)
    read_all_confluent(c.bootstrap, TOPIC, 1, hist)
    report = hist.check()
    print(report.line())
    assert epochs == sorted(set(epochs)), f"leader epochs not strictly increasing: {epochs}"
    assert report.acked > 2000
    assert report.acked_lost == 0, report.line()
    assert report.inconsistent_offsets == 0, report.line()
    assert report.duplicates == 0, report.line()


# ---- T2: kill -9 a follower ------------------------------------------------------------------------

@pytest.mark.slow
def test_t2_kill_follower_produce_continues_isr_shrinks_then_expands(cluster):
    c = cluster
    make_topic(c)
    hist = History()
    load = LoadProducer(c.bootstrap, hist, rate=1000, **{"enable.idempotence": True, "acks": "all"}).start()
    try:
        for _round in range(5):            # the five follower kills
            wait_acks_grow(load, 300)
            leader, _epoch, isr = wait_isr(c, 3, timeout=60)
            follower = next(b for b in isr if b != leader)
            c.kill(follower)
            s = wait_until(lambda: (lambda s: s if follower not in s[2] else None)(state(c)), 30,
                           "the ISR to drop the killed follower")
            assert len(s[2]) == 2
            wait_acks_grow(load, 500)          # ISR 2 >= min.insync.replicas: acks=all goes on
            wait_unregistered(c, follower)
            c.start_broker(follower)
            wait_until(lambda: follower in state(c)[2], 60, "the restarted follower to rejoin the ISR")
    finally:
        load.finish()
    read_all_confluent(c.bootstrap, TOPIC, 1, hist)
    report = hist.check()
    print(report.line())
    assert report.acked_lost == 0 and report.duplicates == 0 and report.inconsistent_offsets == 0, report.line()
    assert not hist.failed, list(hist.failed.items())[:3]


# ---- T15: acks=1 and a leader kill while followers lag: the checker must report loss ---------------

@pytest.mark.slow
def test_t15_acks1_leader_kill_with_lagging_followers_is_seen_as_loss(cluster):
    c = cluster
    leader, _epoch, isr = make_topic(c)
    hist = History()
    followers = [b for b in c.brokers if b != leader]
    p = Producer({"bootstrap.servers": f"127.0.0.1:{c.brokers[leader].port}", "acks": 1, "linger.ms": 0})
    p.produce(TOPIC, value=b"warm-up", partition=0)     # connection and metadata ready beforehand
    assert p.flush(10) == 0
    # Followers held back (SIGSTOP) for less than replica.lag.time.max.ms: they stay in the ISR.
    for b in followers:
        os.kill(c.brokers[b].pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        # The followers' fetches already waiting at the leader would carry the next append out
        # (into their socket buffers) even while they are stopped: a probe record answers them,
        # and the stopped followers send no new fetch.
        p.produce(TOPIC, value=b"probe", partition=0)
        assert p.flush(10) == 0
        for i in range(200):
            v = b"t15-%04d" % i
            hist.send(v)
            p.produce(TOPIC, value=v, partition=0,
                      on_delivery=lambda err, m: hist.ack(m.value(), m.partition(), m.offset()) if err is None
                      else hist.fail(m.value(), err))
        assert p.flush(10) == 0
        c.kill(leader)
    finally:
        for b in followers:
            os.kill(c.brokers[b].pid, signal.SIGCONT)
    assert time.monotonic() - stopped < LAG_MS / 1000, "followers were held past the lag time: premise broken"
    assert len(hist.acked) == 200
    wait_unregistered(c, leader)
    wait_until(lambda: state(c)[0] in followers, 30, "a follower to take over")
    c.start_broker(leader)                       # it truncates the unreplicated tail by epoch
    wait_isr(c, 3, timeout=60)
    read_all_confluent(c.bootstrap, TOPIC, 1, hist)
    report = hist.check()
    print(report.line())
    assert report.acked_lost > 0, report.line()
    # KIP-101: the old leader's divergent tail is gone; all three logs hold the same batches.
    new_leader = state(c)[0]

    def stored(b):
        return [(s.base_offset, s.last_offset, s.crc) for _p, s in all_batches(c.brokers[b].data_dir, TOPIC, 0)]
    wait_until(lambda: all(stored(b) == stored(new_leader) for b in c.brokers), 20, "identical logs")


# ---- leader-made ISR changes: a lagging follower leaves the ISR and rejoins ---------------------------

@pytest.mark.slow
def test_leader_shrinks_isr_for_a_lagging_follower_and_expands_it_back(tmp_path):
    """A follower held (SIGSTOP) past replica.lag.time.max.ms but inside its ZooKeeper session is
    removed by the leader itself (same leader epoch: leader-made ISR changes do not bump it), and
    rejoins once it has caught up in the current epoch. acks=all keeps going with ISR 2.
    replica.lag.time.max.ms 1500 here, well inside the 6 s session the stopped follower keeps."""
    with LocalCluster(tmp_path, brokers=3, overrides={"replica.lag.time.max.ms": 1500}) as c:
        _lagging_follower(c, 1500)


def _lagging_follower(c, lag_ms):
    leader, epoch, isr = make_topic(c)
    hist = History()
    load = LoadProducer(c.bootstrap, hist, rate=500, **{"enable.idempotence": True, "acks": "all"}).start()
    follower = next(b for b in isr if b != leader)
    try:
        wait_acks_grow(load, 200)
        os.kill(c.brokers[follower].pid, signal.SIGSTOP)
        try:
            shrunk = wait_until(lambda: (lambda s: s if follower not in s[2] else None)(state(c)),
                                lag_ms / 1000 + 10, "the leader to drop the lagging follower")
        finally:
            os.kill(c.brokers[follower].pid, signal.SIGCONT)
        assert shrunk[0] == leader and shrunk[1] == epoch, f"not a leader-made change: {shrunk}"
        wait_acks_grow(load, 200)
        back = wait_until(lambda: (lambda s: s if follower in s[2] else None)(state(c)), 30,
                          "the follower to rejoin")
        assert back[0] == leader and back[1] == epoch
    finally:
        load.finish()
    read_all_confluent(c.bootstrap, TOPIC, 1, hist)
    report = hist.check()
    print(report.line())
    assert report.acked_lost == 0 and report.duplicates == 0 and report.inconsistent_offsets == 0, report.line()
