"""``kbroker delete-records``: kafka-delete-records.sh — move partitions' log start offsets up
(DeleteRecords to each leader).

The offset JSON file is the Kafka tool's: ``{"partitions": [{"topic": "t", "partition": 0,
"offset": 3}], "version": 1}`` (offset -1: up to the high watermark). Output as Kafka's
DeleteRecordsCommand: ``Executing records delete operation``, ``Records delete operation completed:``,
then per partition ``partition: t-0\\tlow_watermark: 3`` or ``partition: t-0\\terror: <exception>``.
"""
from __future__ import annotations

import json

from kbroker.cli.topics import describe_error
from kbroker.client.admin import Admin
from kbroker.client.connection import KafkaError
from kbroker.cli.tool import ToolError, run_tool, add_command_config, command_security


def register(subparsers) -> None:
    p = subparsers.add_parser("delete-records", help="delete records below given offsets (kafka-delete-records.sh)",
                              description="This tool helps to delete records of the given partitions down to "
                                          "the specified offset.")
    p.add_argument("--bootstrap-server", required=True, help="REQUIRED: The server to connect to.")
    add_command_config(p)
    p.add_argument("--offset-json-file", required=True,
                   help='REQUIRED: The JSON file with offset per partition. The format to use is: '
                        '{"partitions": [{"topic": "foo", "partition": 1, "offset": 1}], "version": 1}')
    p.set_defaults(func=main)


def parse_offset_json(text: str) -> dict[tuple[str, int], int]:
    """The tool's JSON -> {(topic, partition): offset}; version 1 only, no partition twice."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ToolError(f"The input string is not a valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ToolError("The input string is not a valid JSON")
    version = doc.get("version", 1)
    if version != 1:
        raise ToolError(f"Not supported version field value {version}")
    if "partitions" not in doc:
        raise ToolError("Missing partitions field")
    out: dict[tuple[str, int], int] = {}
    duplicates = []
    for e in doc["partitions"]:
        try:
            tp, offset = (str(e["topic"]), int(e["partition"])), int(e["offset"])
        except (KeyError, TypeError, ValueError) as err:
            raise ToolError(f"Invalid partition entry {json.dumps(e)}: {err}") from None
        if tp in out:
            duplicates.append(f"{tp[0]}-{tp[1]}")
        out[tp] = offset
    if duplicates:
        raise ToolError(f"Offset json file contains duplicate topic partitions: {','.join(duplicates)}")
    return out


async def run(args, out) -> int:
    with open(args.offset_json_file) as f:
        offsets = parse_offset_json(f.read())
    async with Admin(args.bootstrap_server, client_id="kbroker-delete-records", security=command_security(args)) as admin:
        print("Executing records delete operation", file=out)
        results = await admin.delete_records(offsets)
    print("Records delete operation completed:", file=out)
    # Per-partition errors are printed, and the exit code stays 0, as Kafka's tool does.
    for (topic, partition), r in results.items():
        if isinstance(r, KafkaError):
            message, cls = describe_error(r)
            print(f"partition: {topic}-{partition}\terror: {cls}: {message}", file=out)
        else:
            print(f"partition: {topic}-{partition}\tlow_watermark: {r}", file=out)
    return 0


def main(args) -> int:
    return run_tool(run, args)
