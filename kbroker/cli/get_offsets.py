"""``kbroker get-offsets``: kafka-get-offsets.sh — the offset of each partition at a time
(ListOffsets to each leader).

--time -1 / latest (default), -2 / earliest, -3 / max-timestamp, or a timestamp in ms (the first
offset whose timestamp is at or after it). --topic is a regular expression matched against the
whole name (all topics without it), --partitions a comma-separated list. Output as Kafka's
GetOffsetShell: ``topic:partition:offset`` per partition, sorted by topic then partition; a
partition whose lookup fails is skipped with a line on stderr.
"""
from __future__ import annotations

import re
import sys

from kbroker.cli.tool import ToolError, run_tool, add_command_config, command_security
from kbroker.client.connection import KafkaError
from kbroker.client.consumer import Consumer

TIME_NAMES = {"latest": "latest", "-1": "latest", "earliest": "earliest", "-2": "earliest",
              "max-timestamp": "max_timestamp", "-3": "max_timestamp"}


def register(subparsers) -> None:
    p = subparsers.add_parser("get-offsets", help="offsets of partitions at a time (kafka-get-offsets.sh)",
                              description="An interactive shell for getting topic-partition offsets.")
    p.add_argument("--bootstrap-server", required=True, help="REQUIRED. The server(s) to connect to.")
    add_command_config(p)
    p.add_argument("--topic", help="The topic to get the offsets for. It also accepts a regular expression. "
                                   "If not present, all authorized topics are queried.")
    p.add_argument("--partitions", help="Comma separated list of partition ids to be queried. If not "
                                        "specified, all partitions of the matched topics are queried.")
    p.add_argument("--time", default="-1", help="timestamp of the offsets before that: -1 or latest, -2 or "
                                               "earliest, -3 or max-timestamp, or a timestamp in ms")
    p.add_argument("--exclude-internal-topics", action="store_true",
                   help="By default, internal topics are included. If specified, internal topics are excluded.")
    p.set_defaults(func=main)


def _spec(text: str):
    name = TIME_NAMES.get(text.strip().lower())
    if name is not None:
        return name
    try:
        return int(text)
    except ValueError:
        raise ToolError(f"Malformed time argument {text}. Please use -1 or latest / -2 or earliest / "
                        "-3 or max-timestamp, or a specified long format timestamp") from None


async def run(args, out) -> int:
    spec = _spec(args.time)
    try:
        wanted_parts = None if not args.partitions else {int(p) for p in args.partitions.split(",") if p.strip()}
    except ValueError:
        raise ToolError(f"Invalid partition list: {args.partitions}") from None
    pattern = re.compile(args.topic) if args.topic else None
    async with Consumer(args.bootstrap_server, client_id="kbroker-get-offsets",
                        security=command_security(args)) as consumer:
        await consumer.cluster.fetch_metadata(None, allow_auto_topic_creation=False)
        topics = consumer.cluster.topics
        parts = sorted((name, p) for name, tm in topics.items()
                       if (pattern is None or pattern.fullmatch(name))
                       and not (args.exclude_internal_topics and tm.is_internal)
                       for p in tm.partitions if wanted_parts is None or p in wanted_parts)
        if not parts:
            raise ToolError("Could not match any topic-partitions with the specified filters")
        for topic, partition in parts:
            try:
                offset = await consumer.list_offsets(topic, partition, spec)
            except KafkaError as e:
                print(f"Skip getting offsets for topic-partition {topic}-{partition} due to error: {e}",
                      file=sys.stderr)
                continue
            print(f"{topic}:{partition}:{offset}", file=out)
    return 0


def main(args) -> int:
    return run_tool(run, args)
