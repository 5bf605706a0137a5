"""KIP-368 re-authentication with a real client: librdkafka re-authenticates on its own before the
session the broker gave it (connections.max.reauth.ms) ends.

Invariants (sessions of 1.5 s):
- a confluent-kafka producer (SCRAM-SHA-256) producing for 5 s re-authenticates at least twice on one
  connection (one connection attempt to the broker in its statistics), every record delivered;
- a producer whose credential is deleted from ZooKeeper meanwhile fails its next re-authentication:
  the client reports an authentication error and the broker closes the connection, within two
  session lifetimes of the deletion.
"""
from __future__ import annotations

import json
import logging
import time

import pytest
from confluent_kafka import KafkaError, Producer
from kazoo.client import KazooClient

from kbroker.security.sasl.scram import ScramCredential
from kbroker.testing import wait_until
from kbroker.zk.credentials import alter_user_config
from test_acl_matrix import SCRAM, with_scram_listener

REAUTH_MS = 1500
USERS = {"alice": "alice-pw", "carol": "carol-pw"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with with_scram_listener(tmp_path_factory.mktemp("reauth"), {"connections.max.reauth.ms": REAUTH_MS}) as c:
        zk = KazooClient(hosts=c.zk_connect)
        zk.start(10)
        for user, pw in USERS.items():
            alter_user_config(zk, user, {SCRAM: ScramCredential.from_password(SCRAM, pw, 4096).encode()})
        c.zk = zk
        yield c
        zk.stop()
        zk.close()


class Client:
    """A producer as ``user`` with what it reports: librdkafka's log lines, statistics and errors."""

    def __init__(self, cluster, user):
        self.lines, self.stats, self.errors, self.delivered, self.failed = [], {}, [], 0, []
        log = logging.getLogger(f"rdkafka-{user}-{id(self)}")
        log.propagate = False
        log.setLevel(logging.DEBUG)
        handler = logging.Handler()
        handler.emit = lambda r: self.lines.append(r.getMessage())
        log.addHandler(handler)
        self.producer = Producer({
            "bootstrap.servers": f"127.0.0.1:{cluster.sasl_port}", "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": SCRAM, "sasl.username": user, "sasl.password": USERS[user], "debug": "security,broker",
            "statistics.interval.ms": 500, "linger.ms": 5, "message.timeout.ms": 20000},
            logger=log, stats_cb=self._stats, error_cb=self.errors.append)

    def _stats(self, text):
        self.stats = json.loads(text)

    def _acked(self, err, _msg):
        if err is None:
            self.delivered += 1
        else:
            self.failed.append(err)

    def produce_for(self, topic, seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.producer.produce(topic, b"x" * 100, callback=self._acked)
            self.producer.poll(0.01)

    def connects(self) -> int:
        """Connection attempts to the broker itself (the bootstrap connection left out)."""
        return sum(b["connects"] for name, b in self.stats.get("brokers", {}).items() if name.endswith("/0"))

    def reauths(self) -> int:
        return sum("Received REAUTH op" in line for line in self.lines)


def test_producer_keeps_its_connection_across_reauthentications(cluster):
    client = Client(cluster, "alice")
    client.produce_for("reauth-t", 5.0)
    assert client.producer.flush(15) == 0
    client.producer.poll(1.0)            # the last statistics
    assert client.failed == [] and client.delivered > 0
    assert client.reauths() >= 2, client.reauths()
    assert client.connects() == 1, client.stats.get("brokers")


def test_deleted_credential_is_refused_at_the_next_reauthentication(cluster):
    client = Client(cluster, "carol")
    client.produce_for("reauth-c", 0.5)
    assert client.producer.flush(10) == 0 and client.delivered > 0
    mark = len(client.lines)
    alter_user_config(cluster.zk, "carol", {}, [SCRAM])
    t0 = time.monotonic()
    def refused():
        client.producer.poll(0.1)
        return any(e.code() == KafkaError._AUTHENTICATION for e in client.errors)
    wait_until(refused, 2 * REAUTH_MS / 1000 + 2, "authentication error reported")
    assert time.monotonic() - t0 <= 2 * REAUTH_MS / 1000 + 1
    assert any(e.code() == KafkaError._AUTHENTICATION for e in client.errors), client.errors
    # the connection is gone: the client's broker handle left UP for a new connection (or its removal)
    assert any("/0: Broker changed state" in line and ("-> TRY_CONNECT" in line or "-> DOWN" in line)
               for line in client.lines[mark:])
    client.producer.purge()
    client.producer.flush(0)
