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
