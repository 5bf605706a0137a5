"""A 3-broker cluster replicating over a SASL_SSL inter-broker listener survives kill -9 of the leader:
kafka-python's idempotent acks=all producer writes over SASL_SSL with SCRAM-SHA-512 while the leader
of the RF=3 partition is killed twice; the shared history checker finds acked-but-lost 0, duplicates 0,
inconsistent offsets 0. (Each broker also has a PLAINTEXT listener, which LocalCluster's readiness
probes and the final read use; the load and all broker-to-broker traffic go over SASL_SSL.)"""
from __future__ import annotations

import threading
import time

import pytest
from kafka import KafkaProducer
from kazoo.client import KazooClient

from checkers import History, read_all_confluent
from kbroker.security.certs import loopback_pki
from kbroker.security.sasl.scram import ScramCredential
from kbroker.testing import LocalCluster, free_port, wait_until
from kbroker.zk.credentials import alter_user_config
from test_replication import LAG_MS, TOPIC, make_topic, state, wait_isr, wait_unregistered

pytestmark = pytest.mark.slow

PLAIN_JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="broker" '
              'password="broker-pw" user_broker="broker-pw";')


@pytest.fixture
def cluster(tmp_path):
    loopback_pki(tmp_path)
    c = LocalCluster(tmp_path / "c", brokers=3, session_timeout_ms=6000, overrides={
        "replica.lag.time.max.ms": LAG_MS,
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL",
        "security.inter.broker.protocol": "SASL_SSL", "sasl.mechanism.inter.broker.protocol": "PLAIN",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
        "listener.name.sasl_ssl.plain.sasl.jaas.config": PLAIN_JAAS,
        "ssl.keystore.type": "PEM", "ssl.keystore.location": str(tmp_path / "broker.pem"),
        "ssl.truststore.type": "PEM", "ssl.truststore.location": str(tmp_path / "ca.pem")})
    c.sasl_ports = {}
    for b in c.brokers.values():
        c.sasl_ports[b.broker_id] = p = free_port()
        b.extra = {"listeners": f"PLAINTEXT://127.0.0.1:{b.port},SASL_SSL://127.0.0.1:{p}"}
    c.ca = tmp_path / "ca.pem"
    with c:
        zk = KazooClient(hosts=c.zk_connect, timeout=5)
        zk.start(timeout=5)
        try:
            alter_user_config(zk, "alice", {"SCRAM-SHA-512": ScramCredential.from_password(
                "SCRAM-SHA-512", "alice-pw", 4096).encode()})
        finally:
            zk.stop()
            zk.close()
        yield c


class Load:
    """kafka-python's defaults (idempotent, acks=all) over SASL_SSL at ~rate records/s from a thread."""

    def __init__(self, c, history: History, rate=800):
        self.history, self.rate = history, rate
        self.p = KafkaProducer(
            bootstrap_servers=",".join(f"127.0.0.1:{p}" for p in c.sasl_ports.values()),
            security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="alice",
            sasl_plain_password="alice-pw", ssl_cafile=str(c.ca))
        assert self.p.config["enable_idempotence"] and self.p.config["acks"] == -1
        self.stop_flag = threading.Event()
        self.futures = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        n, nxt = 0, time.monotonic()
        while not self.stop_flag.is_set():
            for _ in range(max(1, self.rate // 100)):
                v = b"s%09d" % n
                n += 1
                self.history.send(v)
                f = self.p.send(TOPIC, value=v, partition=0)
                f.add_callback(lambda md, v=v: self.history.ack(v, md.partition, md.offset))
                f.add_errback(lambda e, v=v: self.history.fail(v, e))
                self.futures.append(f)
            nxt += 0.01
            time.sleep(max(0.0, nxt - time.monotonic()))

    def acked(self):
        return len(self.history.acked)

    def finish(self):
        self.stop_flag.set()
        self.thread.join()
        self.p.flush(timeout=90)
        assert all(f.is_done for f in self.futures), "records still unconfirmed after flush"
        self.p.close(timeout=10)


def test_leader_kill_over_sasl_ssl_loses_nothing(cluster):
    c = cluster
    make_topic(c)
    hist = History()
    load = Load(c, hist)
    load.thread.start()
    try:
        for _round in range(2):
            start = load.acked()
            wait_until(lambda: load.acked() >= start + 300, 30, "300 more acknowledgements")
            leader, epoch, isr = wait_isr(c, 3, timeout=60)
            c.kill(leader)
            wait_unregistered(c, leader)
            wait_until(lambda: (lambda s: s if s[0] >= 0 and s[0] != leader else None)(state(c)), 30, "a new leader")
            start = load.acked()
            wait_until(lambda: load.acked() >= start + 300, 30, "acks=all to continue on two replicas")
            c.start_broker(leader)
    finally:
        load.finish()
    wait_isr(c, 3, timeout=60)
    read_all_confluent(c.bootstrap, TOPIC, 1, hist)
    report = hist.check()
    print(report.line())
    assert report.acked > 1200, report.line()
    assert report.acked_lost == 0, report.line()
    assert report.duplicates == 0, report.line()
    assert report.inconsistent_offsets == 0, report.line()
