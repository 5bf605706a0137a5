"""``kbroker serve --config FILE [--override key=value ...]``: run one broker in the foreground.

Exit status: 2 for a config error (the message, naming the key, goes to stderr), otherwise whatever
the broker returns (0 after a clean SIGTERM/SIGINT shutdown).
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from kbroker import __version__
from kbroker.config import EVENT_LOOP_KEY, UVLOOP_MISSING, BrokerConfig, ConfigError
from kbroker.logging_setup import LEVELS, level_number, setup_logging

log = logging.getLogger("kbroker.server")


def _log_level(text: str) -> str:
    try:
        level_number(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def install_event_loop(name: str) -> None:
    """Make asyncio.run() (the broker's entry point) build the configured loop (kbroker.event.loop).
    ImportError when uvloop is chosen and cannot be imported (the caller reports it as a config error)."""
    if name == "uvloop":
        import uvloop
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    else:
        asyncio.set_event_loop_policy(None)     # the standard library's default policy: selector loop
    log.info("event loop: %s (%s)", name, EVENT_LOOP_KEY)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run one broker in the foreground",
                       description="Run one broker until SIGTERM or SIGINT.")
    p.add_argument("--config", required=True, metavar="FILE", help="server.properties file")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="set a config key, winning over the file (repeatable)")
    p.add_argument("--log-level", type=_log_level, default="INFO", metavar="LEVEL",
                   help=f"one of {', '.join(LEVELS)} (default INFO)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    try:
        config = BrokerConfig.from_file(args.config, args.override)
    except ConfigError as e:
        print(f"kbroker serve: config error in {args.config}: {e}", file=sys.stderr)
        return 2
    log.info("kbroker %s, config %s values:\n\t%s", __version__, config.source, "\n\t".join(config.describe()))
    try:
        install_event_loop(config.event_loop)
    except ImportError as e:
        # the default is not validated at config time: a Python without uvloop is told here
        why = UVLOOP_MISSING if e.name == "uvloop" else f"needs the {e.name} package (not importable)"
        print(f"kbroker serve: config error: {EVENT_LOOP_KEY}={config.event_loop}: {why}", file=sys.stderr)
        return 2
    # Imported here so the CLI (and config errors) work without loading the whole broker.
    from kbroker.server.broker import run as run_broker

    return run_broker(config)
