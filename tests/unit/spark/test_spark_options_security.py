"""The Spark source and sink options: security options (kafka.security.protocol, kafka.ssl.*,
kafka.sasl.*) pass through to kbroker's client; any other unknown kafka.* option is refused with a
message, never dropped."""
from __future__ import annotations

import pytest

from kbroker.security.certs import CA
from kbroker.spark.kafka import _cluster
from kbroker.spark.options import OptionError, client_config


def test_security_options_pass_through(tmp_path):
    (tmp_path / "ca.pem").write_bytes(CA.create().pem())
    opts = {"kafka.bootstrap.servers": "127.0.0.1:9093", "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "SCRAM-SHA-512",
            "kafka.sasl.jaas.config": 'x required username="admin" password="pw";',
            "kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.location": str(tmp_path / "ca.pem")}
    cfg = client_config(opts)
    assert cfg.security["security.protocol"] == "SASL_SSL"
    sec = _cluster(cfg).security
    assert sec.tls and sec.sasl and sec.sasl_mechanism == "SCRAM-SHA-512"
    assert (sec.username, sec.password) == ("admin", "pw")
    assert sec.ssl_context.check_hostname          # Kafka clients' default https identification


def test_unknown_and_bad_kafka_options_are_refused():
    base = {"kafka.bootstrap.servers": "127.0.0.1:9092"}
    with pytest.raises(OptionError, match="kafka.metadata.max.age.ms' is not supported"):
        client_config(base | {"kafka.metadata.max.age.ms": "1000"})
    # sink-only options are refused by the source
    with pytest.raises(OptionError, match="kafka.acks"):
        client_config(base | {"kafka.acks": "all"})
    assert client_config(base | {"kafka.acks": "all"}, write=True).producer["acks"] == -1
    with pytest.raises(OptionError, match="security.protocol"):
        client_config(base | {"kafka.security.protocol": "TLS"})
    with pytest.raises(OptionError, match="sasl.jaas.config"):
        client_config(base | {"kafka.security.protocol": "SASL_PLAINTEXT", "kafka.sasl.mechanism": "PLAIN"})
    assert client_config(base).security == {}
