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
