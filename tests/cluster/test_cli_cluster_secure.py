"""`kbroker cluster up --security sasl_ssl|ssl|sasl_plaintext`: a secured local cluster, used with its
DIR/client.properties by kbroker's own tools (--command-config, console producer/consumer, perf tool's
--producer.config) and by confluent-kafka, kafka-python and kcat; clients without credentials are
refused. Every test runs `cluster down` in a finally block."""
from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from kbroker.client.security import jaas_options
from kbroker.config import parse_properties
from checkers import tcp_ports

TIMEOUT_S = 120


def kbroker(*args, input=None, timeout=TIMEOUT_S):
    return subprocess.run([sys.executable, "-m", "kbroker", *args], capture_output=True, timeout=timeout,
                          input=input)


@pytest.fixture(scope="module")
def sasl_ssl(tmp_path_factory):
    root = tmp_path_factory.mktemp("secure") / "c"
    up = kbroker("cluster", "up", "--dir", str(root), "--brokers", "2", "--port", "0", "--zk-port", "0",
                 "--security", "sasl_ssl", timeout=240)
    try:
        assert up.returncode == 0, up.stdout.decode() + up.stderr.decode()
        last = up.stdout.decode().strip().splitlines()[-1]
        assert last.startswith("bootstrap.servers=")
        yield root, last.split("=", 1)[1]
    finally:
        kbroker("cluster", "down", "--dir", str(root))


def test_client_properties_as_kafka_writes_them(sasl_ssl):
    root, _ = sasl_ssl
    props = parse_properties((root / "client.properties").read_text())
    assert props["security.protocol"] == "SASL_SSL"
    assert props["sasl.mechanism"] == "SCRAM-SHA-512"
    assert props["ssl.truststore.type"] == "PEM" and props["ssl.truststore.location"] == str(root / "ca.pem")
    assert jaas_options(props["sasl.jaas.config"])["username"] == "admin"
    assert (root / "client.properties").stat().st_mode & 0o077 == 0
    server = parse_properties((root / "broker-0" / "server.properties").read_text())
    assert server["security.inter.broker.protocol"] == "SASL_SSL"
    assert server["super.users"] == "User:admin"


def test_own_tools_with_command_config(sasl_ssl):
    root, bootstrap = sasl_ssl
    cc = ["--command-config", str(root / "client.properties")]
    topic = f"sec-{uuid.uuid4().hex[:8]}"
    r = kbroker("topics", "--bootstrap-server", bootstrap, *cc, "--create", "--topic", topic,
                "--partitions", "1", "--replication-factor", "2")
    assert r.returncode == 0, r.stderr
    r = kbroker("console-producer", "--bootstrap-server", bootstrap, *cc, "--topic", topic, input=b"a\nb\nc\n")
    assert r.returncode == 0, r.stderr
    r = kbroker("console-consumer", "--bootstrap-server", bootstrap, *cc, "--topic", topic, "--from-beginning",
                "--max-messages", "3")
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"a\nb\nc\n"
    r = kbroker("producer-perf-test", "--topic", topic, "--num-records", "2000", "--record-size", "100",
                "--throughput", "-1", "--producer.config", str(root / "client.properties"),
                "--producer-props", f"bootstrap.servers={bootstrap}")
    assert r.returncode == 0, r.stderr
    assert b"2000 records sent" in r.stdout
    # without credentials: refused
    r = kbroker("topics", "--bootstrap-server", bootstrap, "--list", timeout=60)
    assert r.returncode != 0


def test_other_clients_with_the_admin_credentials(sasl_ssl):
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient
    root, bootstrap = sasl_ssl
    props = parse_properties((root / "client.properties").read_text())
    creds = jaas_options(props["sasl.jaas.config"])
    conf = {"bootstrap.servers": bootstrap, "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": creds["username"], "sasl.password": creds["password"],
            "ssl.ca.location": props["ssl.truststore.location"]}
    assert set(AdminClient(conf).list_topics(timeout=30).brokers) == {0, 1}
    topic = f"sec-{uuid.uuid4().hex[:8]}"
    p = Producer(conf)
    for i in range(10):
        p.produce(topic, b"x%d" % i)
    assert p.flush(30) == 0
    x = ["-X", "security.protocol=SASL_SSL", "-X", "sasl.mechanisms=SCRAM-SHA-512",
         "-X", f"sasl.username={creds['username']}", "-X", f"sasl.password={creds['password']}",
         "-X", f"ssl.ca.location={props['ssl.truststore.location']}"]
    out = subprocess.run(["kcat", "-b", bootstrap, *x, "-C", "-t", topic, "-o", "beginning", "-e", "-q"],
                         capture_output=True, timeout=60, check=True).stdout
    assert sorted(out.split()) == sorted(b"x%d" % i for i in range(10))
    from kafka import KafkaConsumer
    from kafka.errors import KafkaError
    with pytest.raises(KafkaError):
        KafkaConsumer(bootstrap_servers=bootstrap, security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
                      sasl_plain_username="admin", sasl_plain_password="wrong",
                      ssl_cafile=props["ssl.truststore.location"], request_timeout_ms=5000).topics()


@pytest.mark.parametrize("mode", ["ssl", "sasl_plaintext"])
def test_other_modes(tmp_path, mode):
    root = tmp_path / "c"
    up = kbroker("cluster", "up", "--dir", str(root), "--port", "0", "--zk-port", "0", "--security", mode,
                 timeout=240)
    try:
        assert up.returncode == 0, up.stdout.decode() + up.stderr.decode()
        bootstrap = up.stdout.decode().strip().splitlines()[-1].split("=", 1)[1]
        cc = ["--command-config", str(root / "client.properties")]
        topic = f"sec-{uuid.uuid4().hex[:8]}"
        r = kbroker("console-producer", "--bootstrap-server", bootstrap, *cc, "--topic", topic, input=b"one\n")
        assert r.returncode == 0, r.stderr
        r = kbroker("console-consumer", "--bootstrap-server", bootstrap, *cc, "--topic", topic, "--from-beginning",
                    "--max-messages", "1")
        assert r.returncode == 0 and r.stdout == b"one\n", r.stderr
        # a second `up` of the same directory keeps its security and is refused another one
        again = kbroker("cluster", "up", "--dir", str(root), "--security", "plaintext")
        assert again.returncode == 1 and b"holds a " + mode.encode() in again.stderr
    finally:
        kbroker("cluster", "down", "--dir", str(root))


def test_scram_credentials_through_configs(sasl_ssl):
    """kafka-configs.sh's way: AlterUserScramCredentials adds bob, who can then log in with SCRAM-SHA-512 (the cluster's mechanism);
    DescribeUserScramCredentials shows the iterations; out-of-range iterations are refused; a deleted
    credential no longer logs in."""
    from confluent_kafka.admin import AdminClient
    root, bootstrap = sasl_ssl
    cc = ["--bootstrap-server", bootstrap, "--command-config", str(root / "client.properties"),
          "--entity-type", "users", "--entity-name", "bob"]
    r = kbroker("configs", *cc, "--alter", "--add-config", "SCRAM-SHA-512=[iterations=8192,password=bob-pw]")
    assert r.returncode == 0 and b"Completed updating config for user bob." in r.stdout, r.stderr
    r = kbroker("configs", *cc, "--describe")
    assert r.stdout.strip() == b"SCRAM credential configs for user-principal 'bob' are SCRAM-SHA-512=iterations=8192"
    ca = str(root / "ca.pem")

    def login(password):
        conf = {"bootstrap.servers": bootstrap, "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                "sasl.username": "bob", "sasl.password": password, "ssl.ca.location": ca}
        try:
            return bool(AdminClient(conf).list_topics(timeout=10).brokers)
        except Exception:
            return False
    assert login("bob-pw")
    assert not login("wrong")
    r = kbroker("configs", *cc, "--alter", "--add-config", "SCRAM-SHA-256=[iterations=100,password=x]")
    assert r.returncode == 1 and b"UNACCEPTABLE_CREDENTIAL" in r.stderr
    r = kbroker("configs", *cc, "--alter", "--delete-config", "SCRAM-SHA-512")
    assert r.returncode == 0, r.stderr
    assert not login("bob-pw")
    r = kbroker("configs", *cc, "--alter", "--delete-config", "SCRAM-SHA-512")
    assert r.returncode == 1 and b"RESOURCE_NOT_FOUND" in r.stderr


def test_zookeeper_serves_tls_only(sasl_ssl, tmp_path):
    """The cluster's ZooKeeper listens on one client port, its TLS one: the brokers registered through it
    (their sessions are TLS), a plaintext client and a TLS client without the cluster's client certificate
    get no session, kazoo with DIR/zk-tls.properties does, and so does a ZooKeeper tool given the file as
    --zk-tls-config-file; `cluster status` reads the registrations over TLS. The brokers' znodes carry
    ZooKeeper ACLs: all for that client certificate's x509 identity, read for others except on secrets."""
    import json

    from kazoo.client import KazooClient
    from kazoo.retry import KazooRetry

    from kbroker.zk.client import kazoo_tls_from_properties
    from kbroker.zk.local import find_running

    root, _ = sasl_ssl
    zk = find_running(root / "zookeeper")
    assert zk is not None and zk.secure_port == zk.port
    assert tcp_ports(zk.pid, "0A") == {zk.port}     # LISTEN
    cfg = (root / "zookeeper" / "zoo.cfg").read_text()
    assert "secureClientPort=" in cfg and "\nclientPort=" not in cfg
    server = parse_properties((root / "broker-0" / "server.properties").read_text())
    assert server["zookeeper.connect"] == f"127.0.0.1:{zk.port}"
    assert server["zookeeper.ssl.client.enable"] == "true"
    assert server["zookeeper.ssl.truststore.location"] == str(root / "ca.pem")

    def session(**kw) -> KazooClient | None:
        z = KazooClient(hosts=zk.connect_string, timeout=3, connection_retry=KazooRetry(max_tries=1), **kw)
        try:
            z.start(timeout=5)
            return z
        except Exception:
            z.stop()
            z.close()
            return None

    assert session() is None
    assert session(use_ssl=True, ca=str(root / "ca.pem")) is None
    tls = parse_properties((root / "zk-tls.properties").read_text())
    z = session(**kazoo_tls_from_properties(tls))
    assert z is not None
    try:
        assert sorted(z.get_children("/brokers/ids")) == ["0", "1"]
        # zookeeper.set.acl: what a broker made is changed only by the client certificate's identity
        # (ZooKeeper's x509 scheme); secrets are not even readable by others
        assert server["zookeeper.set.acl"] == "true"
        for path, others in (("/brokers/ids/0", {"world:anyone:1"}), ("/brokers/topics", {"world:anyone:1"}),
                             ("/controller", {"world:anyone:1"}), ("/config/users", set())):
            acls = {f"{a.id.scheme}:{a.id.id}:{a.perms}" for a in z.get_acls(path)[0]}
            mine = {a for a in acls if a.startswith("x509:") and a.endswith(":31")}
            assert len(mine) == 1 and "CN=zookeeper-client" in mine.pop() and acls - others - \
                {a for a in acls if a.startswith("x509:")} == set(), (path, acls)
            assert {a for a in acls if not a.startswith("x509:")} == others, (path, acls)
    finally:
        z.stop()
        z.close()
    status = kbroker("cluster", "status", "--dir", str(root))
    assert status.returncode == 0 and b"registered" in status.stdout, status.stdout + status.stderr
    topic = f"zk-{uuid.uuid4().hex[:8]}"
    cc = ["--command-config", str(root / "client.properties")]
    r = kbroker("topics", "--bootstrap-server", sasl_ssl[1], *cc, "--create", "--topic", topic,
                "--partitions", "1", "--replication-factor", "2")
    assert r.returncode == 0, r.stderr
    moves = tmp_path / "move.json"
    moves.write_text(json.dumps({"version": 1, "topics": [{"topic": topic}]}))
    r = kbroker("reassign-partitions", "--zookeeper", zk.connect_string, "--zk-tls-config-file",
                str(root / "zk-tls.properties"), "--generate", "--topics-to-move-json-file", str(moves),
                "--broker-list", "0,1")
    assert r.returncode == 0, r.stderr
    assert b"Current partition replica assignment" in r.stdout and topic.encode() in r.stdout
