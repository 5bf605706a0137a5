"""What the admin tools share: run a tool's coroutine, turning a failure into Kafka's tools' exit."""
from __future__ import annotations

import asyncio
import sys

from kbroker.client.connection import KafkaError


class ToolError(Exception):
    """A failure the tool reports in one line (bad input, a refused request)."""


def run_tool(run, args) -> int:
    """``asyncio.run(run(args, stdout))``; a failure prints ``Error: <why>`` on stderr and exits 1."""
    try:
        return asyncio.run(run(args, sys.stdout))
    except (ToolError, KafkaError, OSError, ValueError) as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1


def add_command_config(p) -> None:
    """``--command-config FILE``: Kafka client properties (security.protocol, ssl.*, sasl.*) for the
    tool's connections, as Kafka's tools take them."""
    p.add_argument("--command-config", dest="command_config", metavar="FILE",
                   help="Kafka client properties (security.protocol, ssl.*, sasl.mechanism, sasl.jaas.config) "
                        "for connecting to a secured listener")


def command_security(args):
    """The ClientSecurity of ``--command-config`` (None without one), read once and cached on ``args``;
    ToolError for a file that cannot be read or used (``kbroker.cli.main`` reports it before the tool runs)."""
    if hasattr(args, "_security"):
        return args._security
    path = getattr(args, "command_config", None)
    security = None
    if path:
        from kbroker.client.security import ClientSecurity
        from kbroker.config import ConfigError, parse_properties
        try:
            with open(path, encoding="utf-8") as f:
                props = parse_properties(f.read())
            security = ClientSecurity.from_properties(props)
        except OSError as e:
            raise ToolError(f"cannot read --command-config {path}: {e.strerror}") from None
        except ConfigError as e:
            raise ToolError(f"--command-config {path}: {e}") from None
    args._security = security
    return security


def add_zk_tls_config(p) -> None:
    """``--zk-tls-config-file FILE``: Kafka's zookeeper.ssl.* client properties for a tool that talks to
    ZooKeeper itself (zookeeper.ssl.client.enable=true to use them)."""
    p.add_argument("--zk-tls-config-file", dest="zk_tls_config_file", metavar="FILE",
                   help="ZooKeeper client TLS properties (zookeeper.ssl.client.enable, zookeeper.clientCnxnSocket, "
                        "zookeeper.ssl.keystore.*, zookeeper.ssl.truststore.*, "
                        "zookeeper.ssl.endpoint.identification.algorithm); other keys are ignored")


def zk_tls(args) -> dict | None:
    """kazoo's TLS arguments from ``--zk-tls-config-file`` (None without one, or with TLS not enabled in
    it); ToolError for a file that cannot be read or used."""
    path = getattr(args, "zk_tls_config_file", None)
    if not path:
        return None
    from kbroker.config import parse_properties
    from kbroker.zk.client import kazoo_tls_from_properties
    try:
        with open(path, encoding="utf-8") as f:
            return kazoo_tls_from_properties(parse_properties(f.read()))
    except OSError as e:
        raise ToolError(f"cannot read --zk-tls-config-file {path}: {e.strerror}") from None
    except ValueError as e:
        raise ToolError(f"--zk-tls-config-file {path}: {e}") from None
