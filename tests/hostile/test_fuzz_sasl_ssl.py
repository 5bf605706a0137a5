"""The protocol fuzzer (kbroker/fuzz.py) against a SASL_SSL listener: every fuzzed connection and the
probe first complete TLS and a SCRAM-SHA-512 login, so the mutated requests reach the request path of
authenticated TLS connections.

Invariants (asserted zero, as for the plaintext run): no crash, no hang (each request answered or its
connection closed within the bound), RSS growth bounded, and the probe's ApiVersions + Metadata over
its own SASL_SSL connection answered within 3 s every second throughout (other clients not slowed).
"""
from __future__ import annotations

import ssl

import pytest
from kazoo.client import KazooClient

from kbroker.fuzz import FUZZ_BROKER, Fuzzer, sasl_ssl_connector
from kbroker.security.certs import loopback_pki
from kbroker.security.sasl.scram import ScramCredential
from kbroker.testing import LocalCluster, free_port
from kbroker.zk.credentials import alter_user_config

SECONDS = 20
RSS_BOUND_MIB = 256
MECHANISM, USER, PASSWORD = "SCRAM-SHA-512", "fuzzer", "fuzzer-pw"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_fuzz_after_the_sasl_ssl_login(tmp_path):
    loopback_pki(tmp_path)
    overrides = dict(FUZZ_BROKER, **{
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL",
        "inter.broker.listener.name": "PLAINTEXT", "sasl.enabled.mechanisms": MECHANISM,
        "ssl.keystore.type": "PEM", "ssl.keystore.location": str(tmp_path / "broker.pem")})
    c = LocalCluster(tmp_path / "cluster", num_partitions=1, overrides=overrides)
    port = free_port()
    for b in c.brokers.values():
        b.extra = {"listeners": f"PLAINTEXT://127.0.0.1:{b.port},SASL_SSL://127.0.0.1:{port}"}
    with c:
        zk = KazooClient(hosts=c.zk_connect)
        zk.start(10)
        try:
            alter_user_config(zk, USER, {MECHANISM: ScramCredential.from_password(MECHANISM, PASSWORD, 4096).encode()})
        finally:
            zk.stop()
            zk.close()
        context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        connect = sasl_ssl_connector(("127.0.0.1", port), context, MECHANISM, USER, PASSWORD)
        fz = Fuzzer(f"127.0.0.1:{port}", seed=11, rss_pid=c.brokers[0].pid, rss_bound_mib=RSS_BOUND_MIB,
                    connect=connect)
        stats = fz.run(SECONDS)
        alive = c.brokers[0].running()
    print("T-fuzz-sasl-ssl " + " ".join(f"{k}={v}" for k, v in stats.items() if k != "samples"))
    assert alive and not stats["crashed"]
    assert stats["hangs"] == 0, stats["samples"]
    assert stats["probe_failures"] == 0, stats["samples"]
    assert stats["rss_violations"] == 0, stats["samples"]
    assert stats["answered"] > 30 and stats["closed"] > 30, stats     # both outcomes, even on a loaded machine
    assert stats["apis"] >= 50, stats
