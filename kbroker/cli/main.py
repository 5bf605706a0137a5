"""The ``kbroker`` command: ``kbroker <subcommand> ...``.

Each subcommand lives in its own module exposing ``register(subparsers)``, which adds its parser and
sets ``func`` (``args -> exit code``). Adding a subcommand is one line in :data:`SUBCOMMANDS`.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from kbroker import __version__

SUBCOMMANDS = (
    "kbroker.cli.serve",
    "kbroker.cli.cluster",
    "kbroker.cli.topics",
    "kbroker.cli.leader_election",
    "kbroker.cli.reassign_partitions",
    "kbroker.cli.configs",
    "kbroker.cli.acls",
    "kbroker.cli.console",
    "kbroker.cli.consumer_groups",
    "kbroker.cli.delete_records",
    "kbroker.cli.log_dirs",
    "kbroker.cli.get_offsets",
    "kbroker.cli.broker_api_versions",
    "kbroker.cli.dump_log",
    "kbroker.cli.perf_test",
    "kbroker.cli.transactions",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kbroker", description="A Kafka-compatible broker (ZooKeeper mode) and its tools.")
    parser.add_argument("--version", action="version", version=f"kbroker {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in SUBCOMMANDS:
        importlib.import_module(module).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from kbroker.cli.tool import ToolError, command_security
    try:
        command_security(args)      # a bad --command-config is reported before the tool starts
    except ToolError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
