"""Replication seen from the other clients: three real brokers (LocalCluster,
ZooKeeper session timeout 6 s), topic RF=3 with min.insync.replicas=2, real kill -9 of the leader.

- T1 with kafka-python's defaults (3.0: idempotent, acks=all, unbounded retries): acked-but-lost 0,
  duplicates 0, inconsistent offsets 0 by the shared history checker (tests/checkers.py History).
- kcat, kafka-python and aiokafka consumers reading the partition while its leader is killed and a
  follower takes over: each ends with every acknowledged record exactly once, at its acknowledged
  offset, in offset order from 0 (no gap, no skip), and each read records after the move.
"""
from __future__ import annotations

import asyncio
import subprocess
import tempfile
import threading
import time

import pytest
from kafka import KafkaProducer

from checkers import History, log_end_offset, offset_gaps, read_all_confluent
from kbroker.testing import LocalCluster, wait_until
from test_replication import LAG_MS, TOPIC, LoadProducer, make_topic, state, wait_isr, wait_unregistered

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(tmp_path):
    with LocalCluster(tmp_path, brokers=3, session_timeout_ms=6000,
                      overrides={"replica.lag.time.max.ms": LAG_MS}) as c:
        yield c


def kill_leader_and_wait_for_successor(c):
    """kill -9 the current leader (ISR 3 first), wait for its registration to expire and a former ISR
    member to lead; returns (old leader, new leader)."""
    leader, epoch, isr = wait_isr(c, 3, timeout=60)
    c.kill(leader)
    wait_unregistered(c, leader)
    new = wait_until(lambda: (lambda s: s if s[0] >= 0 and s[0] != leader else None)(state(c)), 30, "a new leader")
    assert new[0] in isr and new[1] > epoch, (leader, epoch, isr, new)
    return leader, new[0]


# ---- T1 with kafka-python's defaults -------------------------------------------------------------

class KafkaPythonLoad:
    """kafka-python KafkaProducer with its default configuration (idempotent, acks=all in 3.0) at
    ~rate records/s from a thread, bounded to ``limit`` sends; every send/ack/failure in History."""

    def __init__(self, bootstrap, history: History, rate=1000, limit=60000):
        self.history = history
        self.rate = rate
        self.limit = limit
        self.p = KafkaProducer(bootstrap_servers=bootstrap)
        cfg = self.p.config
        assert cfg["enable_idempotence"] and cfg["acks"] == -1, "kafka-python defaults are not idempotent acks=all"
        self.stop_flag = threading.Event()
        self.futures = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        step = 0.01
        per_step = max(1, int(self.rate * step))
        nxt = time.monotonic()
        n = 0
        while not self.stop_flag.is_set() and n < self.limit:
            for _ in range(per_step):
                v = b"k%09d" % n
                n += 1
                self.history.send(v)
                f = self.p.send(TOPIC, value=v, partition=0)
                f.add_callback(lambda md, v=v: self.history.ack(v, md.partition, md.offset))
                f.add_errback(lambda e, v=v: self.history.fail(v, e))
                self.futures.append(f)
            nxt += step
            time.sleep(max(0.0, nxt - time.monotonic()))

    def start(self):
        self.thread.start()
        return self

    def acked_count(self):
        return len(self.history.acked)

    def finish(self, timeout=90):
        self.stop_flag.set()
        self.thread.join()
        self.p.flush(timeout=timeout)
        assert all(f.is_done for f in self.futures), "records still unconfirmed after flush"
        self.p.close(timeout=10)


def test_t1_kafka_python_defaults_kill_leader_loses_nothing(cluster):
    """Invariant: acked-but-lost 0 of N, duplicates 0, inconsistent offsets 0 across five leader kills
    (the issue's T1 count)."""
    c = cluster
    make_topic(c)
    hist = History()
    load = KafkaPythonLoad(c.bootstrap, hist, rate=1000, limit=100000).start()
    try:
        for _round in range(5):
            start = load.acked_count()
            wait_until(lambda: load.acked_count() >= start + 300, 30, "300 more acknowledgements")
            old, _new = kill_leader_and_wait_for_successor(c)
            start = load.acked_count()
            wait_until(lambda: load.acked_count() >= start + 300, 30, "acks=all to continue on two replicas")
            c.start_broker(old)
    finally:
        load.finish()
    wait_isr(c, 3, timeout=60)
    read_all_confluent(c.bootstrap, TOPIC, 1, hist)
    report = hist.check()
    print(report.line())
    assert report.acked > 1500, report.line()
    assert report.acked_lost == 0, report.line()
    assert report.duplicates == 0, report.line()
    assert report.inconsistent_offsets == 0, report.line()


# ---- consumers follow a leader move -----------------------------------------------------------------

class ConsumerRun:
    """A consumer reading partition 0 from offset 0 in the background until told the final end
    offset and it has read up to it; every record logged in its own poll list."""

    def __init__(self, name):
        self.name = name
        self.polls: list = []                # (partition, offset, value) in read order
        self.end = None                      # set when the producer is done
        self.error = None
        self.thread = threading.Thread(target=self._guarded, daemon=True)

    def _guarded(self):
        try:
            self.run()
        except BaseException as e:          # reported by the test
            self.error = e

    def done(self):
        return self.end is not None and self.polls and self.polls[-1][1] >= self.end - 1

    def progress(self):
        last = self.polls[-1][1] if self.polls else None
        return f"{self.name}: {len(self.polls)} read, last offset {last}, error {self.error!r}"

    def start(self):
        self.thread.start()
        return self


class KcatRun(ConsumerRun):
    def __init__(self, bootstrap):
        super().__init__("kcat")
        # stderr to a file: kcat reports every end of partition there, and a pipe nobody reads would
        # fill and stop it
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(["kcat", "-b", bootstrap, "-C", "-t", TOPIC, "-p", "0", "-o", "beginning",
                                      "-u", "-f", "%p %o %s\n"],
                                     stdout=subprocess.PIPE, stderr=self.stderr)

    def progress(self):
        self.stderr.seek(0, 2)
        n = self.stderr.tell()
        self.stderr.seek(max(0, n - 300))
        return f"{super().progress()}, exit {self.proc.poll()}, stderr ...{self.stderr.read()!r}"

    def run(self):
        for line in self.proc.stdout:
            p, o, v = line.rstrip(b"\n").split(b" ", 2)
            self.polls.append((int(p), int(o), v))

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.thread.join(10)
        self.stderr.close()


class KafkaPythonRun(ConsumerRun):
    def __init__(self, bootstrap):
        super().__init__("kafka-python")
        self.bootstrap = bootstrap
        self.stop_flag = threading.Event()

    def run(self):
        from kafka import KafkaConsumer, TopicPartition

        cons = KafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest", fetch_max_wait_ms=100)
        try:
            tp = TopicPartition(TOPIC, 0)
            cons.assign([tp])
            cons.seek_to_beginning(tp)
            while not self.stop_flag.is_set() and not self.done():
                for _tp, msgs in cons.poll(timeout_ms=200, max_records=2000).items():
                    self.polls.extend((m.partition, m.offset, m.value) for m in msgs)
        finally:
            cons.close()

    def stop(self):
        self.stop_flag.set()
        self.thread.join(30)


class AiokafkaRun(ConsumerRun):
    def __init__(self, bootstrap):
        super().__init__("aiokafka")
        self.bootstrap = bootstrap
        self.stop_flag = threading.Event()

    def run(self):
        from aiokafka import AIOKafkaConsumer, TopicPartition

        async def go():
            cons = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None, enable_auto_commit=False,
                                    auto_offset_reset="earliest", fetch_max_wait_ms=100)
            await cons.start()
            try:
                tp = TopicPartition(TOPIC, 0)
                cons.assign([tp])
                await cons.seek_to_beginning(tp)
                while not self.stop_flag.is_set() and not self.done():
                    for _tp, msgs in (await cons.getmany(timeout_ms=200, max_records=2000)).items():
                        self.polls.extend((m.partition, m.offset, m.value) for m in msgs)
            finally:
                await cons.stop()

        asyncio.run(go())

    def stop(self):
        self.stop_flag.set()
        self.thread.join(30)


def wait_runs(predicate, timeout, what, runs):
    """wait_until, and on a timeout each consumer's progress in the error (which one stalled, and why)."""
    try:
        wait_until(predicate, timeout, what)
    except TimeoutError as e:
        raise TimeoutError(f"{e}; " + "; ".join(r.progress() for r in runs)) from None


def judge(run: ConsumerRun, producer_hist: History):
    """Checker counts for one consumer: its polls against the producer's acknowledgements, plus
    offset order from 0 (gaps counts a skipped, repeated or out-of-order offset)."""
    h = History()
    h.sent, h.acked, h.failed = producer_hist.sent, producer_hist.acked, producer_hist.failed
    h.polls = list(run.polls)
    return h.check(), offset_gaps({0: [o for _p, o, _v in run.polls]})


def test_checker_sees_a_skipped_record_in_a_consumer_run():
    """The per-consumer judgement is able to fail: a skip shows as acked-but-lost and a gap, a re-read
    as a duplicate offset read (gap count), a misplaced value as an inconsistent offset."""
    hist = History()
    for i in range(5):
        hist.send(b"v%d" % i)
        hist.ack(b"v%d" % i, 0, i)
    run = ConsumerRun("fake")
    run.polls = [(0, 0, b"v0"), (0, 1, b"v1"), (0, 3, b"v3"), (0, 4, b"v4")]
    report, gaps = judge(run, hist)
    assert report.acked_lost == 1 and gaps == 1
    run.polls = [(0, 0, b"v0"), (0, 1, b"v1"), (0, 2, b"v2"), (0, 2, b"v2"), (0, 3, b"v3"), (0, 4, b"v4")]
    assert judge(run, hist)[1] == 1
    run.polls = [(0, 0, b"v0"), (0, 1, b"v1"), (0, 2, b"v3"), (0, 3, b"v2"), (0, 4, b"v4")]
    assert judge(run, hist)[0].inconsistent_offsets == 2


def test_kcat_kafka_python_aiokafka_consumers_follow_a_leader_move(cluster):
    """Invariant per consumer: acked-but-lost 0 of N, duplicates 0, inconsistent offsets 0, offset
    gaps 0 (read in order from 0, nothing skipped), and records read after the new leader took over."""
    c = cluster
    make_topic(c)
    hist = History()
    load = LoadProducer(c.bootstrap, hist, rate=1000, **{"enable.idempotence": True, "acks": "all"}).start()
    runs = [KcatRun(c.bootstrap).start(), KafkaPythonRun(c.bootstrap).start(), AiokafkaRun(c.bootstrap).start()]
    try:
        start = len(hist.acked)
        wait_until(lambda: len(hist.acked) >= start + 500, 30, "500 acknowledgements")
        wait_runs(lambda: all(len(r.polls) >= 300 for r in runs), 30, "every consumer reading", runs)
        old, _new = kill_leader_and_wait_for_successor(c)
        # Each consumer must move on to the new leader: it reads records acknowledged after the move.
        moved_at = len(hist.sent)
        wait_runs(lambda: all(any(v >= b"v%09d" % moved_at for _p, _o, v in r.polls[-50:]) for r in runs),
                  40, "every consumer to read records produced after the leader move", runs)
        c.start_broker(old)
        start = len(hist.acked)
        wait_until(lambda: len(hist.acked) >= start + 300, 30, "300 more acknowledgements")
    finally:
        load.finish()
    try:
        leader, _epoch, _isr = wait_isr(c, 3, timeout=60)
        # ListOffsets is answered by the partition's leader only (the first bootstrap broker may not be it).
        end = log_end_offset(f"127.0.0.1:{c.brokers[leader].port}", TOPIC, 0)
        for r in runs:
            r.end = end
        wait_runs(lambda: all(r.done() or r.error for r in runs), 60, f"every consumer to reach offset {end}", runs)
    finally:
        for r in runs:
            r.stop()
    lines = []
    for r in runs:
        assert r.error is None, f"{r.name}: {r.error!r}"
        report, gaps = judge(r, hist)
        lines.append(f"{r.name}: read {len(r.polls)} of end {end}; {report.line()}; offset gaps {gaps}")
    print("\n".join(lines))
    assert len(hist.acked) > 1000 and not hist.failed, (len(hist.acked), list(hist.failed.items())[:3])
    for r in runs:
        report, gaps = judge(r, hist)
        polled = [o for _p, o, _v in r.polls]
        assert report.acked_lost == 0, f"{r.name}: {report.line()}"
        assert report.duplicates == 0 and report.inconsistent_offsets == 0, f"{r.name}: {report.line()}"
        assert gaps == 0 and polled == list(range(end)), f"{r.name}: offset gaps {gaps}, read {len(polled)} of {end}"
