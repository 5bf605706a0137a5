"""A rolling restart of a 3-broker cluster under load: each broker in turn is stopped with SIGTERM
(controlled shutdown: the controller moves its leaderships first) and started again as a new process on
the same data dirs, while an idempotent acks=all producer and a group consumer run. The history checker
then reads every partition: acked-but-lost 0, duplicates 0, inconsistent offsets 0; the consumer group
went on consuming through every restart."""
from __future__ import annotations

import threading
import time

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic

from checkers import History, read_all_confluent
from kbroker.testing import LocalCluster, wait_until
from test_replication import TOPIC, LoadProducer, state, wait_acks_grow


class GroupConsumer:
    """A confluent-kafka group member (subscribe) polling in a thread; each record logged in History."""

    def __init__(self, bootstrap, history: History):
        self.history = history
        self.c = Consumer({"bootstrap.servers": bootstrap, "group.id": "rolling", "auto.offset.reset": "earliest",
                           "session.timeout.ms": 10000, "enable.auto.commit": True})
        self.c.subscribe([TOPIC])
        self.polled = 0
        self.stop_flag = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stop_flag.is_set():
            m = self.c.poll(0.2)
            if m is not None and not m.error():
                self.history.poll(m.partition(), m.offset(), m.value())
                self.polled += 1

    def start(self):
        self.thread.start()
        return self

    def finish(self):
        self.stop_flag.set()
        self.thread.join()
        self.c.close()


def rf3_load(c) -> tuple[History, LoadProducer]:
    """TOPIC with 3 replicas (min.insync.replicas 2) in sync, and an idempotent acks=all producer on it."""
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 3, config={"min.insync.replicas": "2"})])[TOPIC].result(30)
    wait_until(lambda: len(state(c)[2]) == 3, 30, "ISR of 3")
    hist = History()
    return hist, LoadProducer(c.bootstrap, hist, rate=300, **{
        "enable.idempotence": True, "acks": "all", "request.timeout.ms": 10000}).start()


def test_rolling_restart_under_acks_all_load_loses_and_duplicates_nothing(tmp_path):
    with LocalCluster(tmp_path, brokers=3, overrides={"replica.lag.time.max.ms": 5000,
                                                      "group.initial.rebalance.delay.ms": 0,
                                                      "offsets.topic.replication.factor": 3}) as c:
        hist, load = rf3_load(c)
        consumer = GroupConsumer(c.bootstrap, hist).start()
        restarts = []
        try:
            wait_acks_grow(load, 300, timeout=60)
            for b in sorted(c.brokers):
                t0 = time.monotonic()
                c.stop_broker(b)                    # SIGTERM: controlled shutdown
                assert c.brokers[b].proc.returncode == 0
                c.start_broker(b)                   # a new process, the same data dirs
                wait_until(lambda: len(state(c)[2]) == 3, 60, f"broker {b} back in the ISR")
                restarts.append(time.monotonic() - t0)
                polled = consumer.polled
                wait_acks_grow(load, 300, timeout=60)
                wait_until(lambda: consumer.polled > polled, 60, "the group consumer to go on")
        finally:
            load.finish()
            consumer.finish()
        read_all_confluent(c.bootstrap, TOPIC, 1, hist)
        report = hist.check()
        print(report.line(), "; restarts took", ", ".join(f"{s:.1f}s" for s in restarts))
        assert report.acked >= 1200
        assert report.acked_lost == 0, report.line()
        assert report.duplicates == 0, report.line()
        assert report.inconsistent_offsets == 0, report.line()
        assert not hist.failed, list(hist.failed.items())[:5]
