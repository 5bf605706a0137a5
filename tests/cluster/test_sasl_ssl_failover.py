"""A 3-broker cluster replicating over a SASL_SSL inter-broker listener survives kill -9 of the leader:
an idempotent acks=all producer (librdkafka) writes over SASL_SSL with SCRAM-SHA-512 while the leader
of the RF=3 partition is killed twice; the shared history checker finds acked-but-lost 0, duplicates 0,
inconsistent offsets 0. (Each broker also has a PLAINTEXT listener, which LocalCluster's readiness
probes and the final read use; the load and all broker-to-broker traffic go over SASL_SSL.)

The load is not kafka-python's: in 3.0.12 its SSL transport hands a reset socket's raw OSError to the
metadata refresh loop, which only survives KafkaError, so when the kill resets an in-flight Metadata
request the loop ends and the producer retries the dead leader until it is closed. kafka-python over
SASL_SSL is covered against live brokers in test_sasl_clients and test_cli_cluster_secure."""
from __future__ import annotations


import pytest
from kazoo.client import KazooClient

from checkers import History, read_all_confluent
from kbroker.security.certs import loopback_pki
from kbroker.security.sasl.scram import ScramCredential
from kbroker.testing import LocalCluster, free_port, wait_until
from kbroker.zk.credentials import alter_user_config
from test_replication import LAG_MS, TOPIC, LoadProducer, make_topic, state, wait_isr, wait_unregistered

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


def test_leader_kill_over_sasl_ssl_loses_nothing(cluster):
    c = cluster
    make_topic(c)
    hist = History()
    load = LoadProducer(",".join(f"127.0.0.1:{p}" for p in c.sasl_ports.values()), hist, rate=800, **{
        "enable.idempotence": True, "acks": "all", "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "alice", "sasl.password": "alice-pw",
        "ssl.ca.location": str(c.ca)}).start()
    try:
        for _round in range(2):
            start = load.acked_count()
            wait_until(lambda: load.acked_count() >= start + 300, 30, "300 more acknowledgements")
            leader, epoch, isr = wait_isr(c, 3, timeout=60)
            c.kill(leader)
            wait_unregistered(c, leader)
            wait_until(lambda: (lambda s: s if s[0] >= 0 and s[0] != leader else None)(state(c)), 30, "a new leader")
            start = load.acked_count()
            wait_until(lambda: load.acked_count() >= start + 300, 30, "acks=all to continue on two replicas")
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
