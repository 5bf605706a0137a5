"""The secured local cluster of ``kbroker cluster up --security ssl|sasl_plaintext|sasl_ssl``.

Files in DIR, made once (a later ``up`` reuses them):

    ca.pem               the cluster's CA certificate (its key is not kept: nothing more is signed)
    broker.pem           the brokers' key and certificate (subjectAltName 127.0.0.1 and localhost, so
                         clients verify the host name with their defaults) - TLS modes
    admin.pem            the admin's client certificate and key (CN=admin) - ssl mode (mTLS)
    client.properties    Kafka client properties for the admin (security.protocol, sasl.mechanism,
                         sasl.jaas.config, ssl.truststore.type=PEM, ssl.truststore.location=DIR/ca.pem)
    zookeeper.pem        ZooKeeper's key and certificate (127.0.0.1, localhost): it serves TLS clients only
    zk-client.pem        the client certificate and key every ZooKeeper client of the cluster presents
                         (brokers, cluster up/status, tools), as ZooKeeper's ssl.clientAuth=need asks
    zk-tls.properties    Kafka's zookeeper.ssl.* client keys for those: the brokers' server.properties carry
                         them, tools take the file as --zk-tls-config-file

The admin is a super user (``super.users=User:admin``): SCRAM-SHA-512 credentials in ZooKeeper
(``/config/users/admin``) in the SASL modes, the certificate's CN through ssl.principal.mapping.rules
in ssl mode. Brokers talk to each other over the same secured listener, as the admin (SASL) or with
their certificate (ssl; User:broker is a super user too). In every secured mode (sasl_plaintext too)
ZooKeeper has no plaintext port, so only holders of a certificate from the cluster's CA reach it, and
the brokers set ZooKeeper ACLs (zookeeper.set.acl) naming zk-client.pem's identity: another
certificate of the CA reads what is not secret and changes nothing.
"""
from __future__ import annotations

import asyncio
import os
import secrets
from pathlib import Path

MODES = ("plaintext", "ssl", "sasl_plaintext", "sasl_ssl")
ADMIN = "admin"
MECHANISM = "SCRAM-SHA-512"
CLIENT_PROPERTIES = "client.properties"
ZK_TLS_PROPERTIES = "zk-tls.properties"
AUTHORIZER = "kafka.security.authorizer.AclAuthorizer"


def _jaas(user: str, password: str) -> str:
    return f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{user}" password="{password}";'


def prepare(root: Path, mode: str) -> None:
    """The CA, certificates, admin password and client.properties of ``mode``; kept when present."""
    if mode == "plaintext" or (root / CLIENT_PROPERTIES).exists():
        return
    from kbroker.security.certs import LOOPBACK, loopback_pki
    from kbroker.zk.client import NETTY_SOCKET
    props = [f"security.protocol={mode.upper()}"]
    ca = loopback_pki(root, name="zookeeper", ca_name="kbroker local cluster CA")
    ca.issue_to(root / "zk-client.pem", {"CN": "zookeeper-client"}, client=True)
    (root / ZK_TLS_PROPERTIES).write_text(
        "# ZooKeeper client TLS of the local cluster (brokers' server.properties, tools' --zk-tls-config-file).\n"
        f"zookeeper.ssl.client.enable=true\nzookeeper.clientCnxnSocket={NETTY_SOCKET}\n"
        f"zookeeper.ssl.keystore.type=PEM\nzookeeper.ssl.keystore.location={root / 'zk-client.pem'}\n"
        f"zookeeper.ssl.truststore.type=PEM\nzookeeper.ssl.truststore.location={root / 'ca.pem'}\n")
    if "ssl" in mode:
        ca.issue_to(root / "broker.pem", {"CN": "broker"}, list(LOOPBACK))
        props += ["ssl.truststore.type=PEM", f"ssl.truststore.location={root / 'ca.pem'}"]
        if mode == "ssl":
            ca.issue_to(root / "admin.pem", {"CN": ADMIN}, client=True)
            props += ["ssl.keystore.type=PEM", f"ssl.keystore.location={root / 'admin.pem'}"]
    if mode.startswith("sasl"):
        props += [f"sasl.mechanism={MECHANISM}", f"sasl.jaas.config={_jaas(ADMIN, secrets.token_urlsafe(18))}"]
    path = root / CLIENT_PROPERTIES
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)   # it holds the admin's password
    with os.fdopen(fd, "w") as f:
        f.write("# The local cluster's admin (a super user), for --command-config and Kafka clients.\n")
        f.write("\n".join(props) + "\n")


def client_properties(root: Path) -> dict[str, str]:
    from kbroker.config import parse_properties
    return parse_properties((root / CLIENT_PROPERTIES).read_text(encoding="utf-8"))


def zk_tls_properties(root: Path) -> dict[str, str]:
    """The zookeeper.ssl.* client keys of a secured cluster ({} for a plaintext one, or one made before
    its ZooKeeper served TLS)."""
    from kbroker.config import parse_properties
    try:
        return parse_properties((root / ZK_TLS_PROPERTIES).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}


def zookeeper_lines(root: Path) -> list[str]:
    """The server.properties lines for the cluster's ZooKeeper: its TLS client keys and, with them,
    zookeeper.set.acl: every znode a broker makes can then be changed only by the holder of the
    cluster's ZooKeeper client certificate (ZooKeeper's x509 identity), others may read the
    non-secret ones."""
    props = zk_tls_properties(root)
    return [f"{k}={v}" for k, v in props.items()] + (["zookeeper.set.acl=true"] if props else [])


def zookeeper_tls(root: Path):
    """ZooKeeper's TLS-only client port (kbroker.zk.local.ServerTls), None without zk_tls_properties."""
    if not zk_tls_properties(root):
        return None
    from kbroker.zk.local import ServerTls
    return ServerTls(str(root / "zookeeper.pem"), str(root / "ca.pem"), probe_keystore=str(root / "zk-client.pem"))


def kazoo_tls(root: Path) -> dict:
    """kazoo's keyword arguments for the cluster's ZooKeeper ({}: plaintext)."""
    from kbroker.zk.client import kazoo_tls_from_properties
    return kazoo_tls_from_properties(zk_tls_properties(root)) or {}


def admin_password(root: Path) -> str:
    from kbroker.client.security import jaas_options
    return jaas_options(client_properties(root)["sasl.jaas.config"])["password"]


def broker_lines(root: Path, mode: str, port: int) -> list[str]:
    """The server.properties lines of a broker's listener in ``mode``."""
    name = mode.upper()
    endpoint = f"{name}://127.0.0.1:{port}"
    lines = [f"listeners={endpoint}", f"advertised.listeners={endpoint}"]
    if mode == "plaintext":
        return lines
    lines += [f"security.inter.broker.protocol={name}", f"authorizer.class.name={AUTHORIZER}"]
    if "ssl" in mode:
        lines += ["ssl.keystore.type=PEM", f"ssl.keystore.location={root / 'broker.pem'}",
                  "ssl.truststore.type=PEM", f"ssl.truststore.location={root / 'ca.pem'}"]
    if mode == "ssl":
        lines += ["ssl.client.auth=required", "ssl.principal.mapping.rules=RULE:^CN=([^,]+).*$/$1/,DEFAULT",
                  f"super.users=User:{ADMIN};User:broker"]
    else:
        prefix = f"listener.name.{mode}"
        lines += [f"sasl.enabled.mechanisms={MECHANISM}", f"sasl.mechanism.inter.broker.protocol={MECHANISM}",
                  f"{prefix}.{MECHANISM.lower()}.sasl.jaas.config={_jaas(ADMIN, admin_password(root))}",
                  f"super.users=User:{ADMIN}"]
    return lines


def register_admin(kazoo, root: Path, mode: str) -> None:
    """The admin's SCRAM-SHA-512 credential in /config/users/admin (SASL modes), before any broker
    needs it for its inter-broker connections."""
    if not mode.startswith("sasl"):
        return
    from kbroker.security.sasl.scram import ScramCredential
    from kbroker.zk.credentials import alter_user_config, get_user_config
    if MECHANISM not in get_user_config(kazoo, ADMIN):
        alter_user_config(kazoo, ADMIN, {MECHANISM: ScramCredential.from_password(
            MECHANISM, admin_password(root), 4096).encode()})


def client_security(root: Path, mode: str):
    if mode == "plaintext":
        return None
    from kbroker.client.security import ClientSecurity
    return ClientSecurity.from_properties(client_properties(root))


def probe_api_versions(port: int, security, timeout: float = 2.0) -> str | None:
    """A secured listener's readiness: TLS handshake, SASL login, ApiVersions; None when it answered."""
    from kbroker.client.connection import BrokerConnection, KafkaError

    async def go():
        conn = await BrokerConnection.open("127.0.0.1", port, client_id="kbroker-cluster-up",
                                           request_timeout_ms=int(timeout * 1000), security=security)
        conn.close()
    try:
        asyncio.run(go())
    except (KafkaError, OSError, asyncio.TimeoutError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def probe_metadata(port: int, security, timeout: float = 2.0) -> tuple[set[int], int] | None:
    """(broker ids, controller id) from a secured listener's Metadata answer, None when it has none."""
    from kbroker.client.connection import BrokerConnection, KafkaError

    async def go():
        conn = await BrokerConnection.open("127.0.0.1", port, client_id="kbroker-cluster-up",
                                           request_timeout_ms=int(timeout * 1000), security=security)
        try:
            _, body = await conn.send(3, {"topics": []}, version=1)
        finally:
            conn.close()
        return {b["node_id"] for b in body["brokers"]}, body["controller_id"]
    try:
        return asyncio.run(go())
    except (KafkaError, OSError, asyncio.TimeoutError):
        return None
