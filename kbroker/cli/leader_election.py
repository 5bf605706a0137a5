"""``kbroker leader-election``: kafka-leader-election.sh — ask the controller (ElectLeaders) to give
partitions back to their preferred replica, or to elect any live replica of leaderless partitions.

Output follows Kafka's LeaderElectionCommand: ``Successfully completed leader election (PREFERRED)
for partitions t-0, t-1``, ``Valid replica already elected for partitions t-2``, and on failures
``Error completing leader election (PREFERRED) for partition: t-3: <exception>`` with exit code 1.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys

from kbroker.cli.tool import add_command_config, command_security
from kbroker.client.admin import Admin
from kbroker.client.connection import KafkaError
from kbroker.protocol.errors import Errors

ELECT_LEADERS = 43
TYPES = {"PREFERRED": 0, "UNCLEAN": 1}


def register(subparsers) -> None:
    p = subparsers.add_parser("leader-election", help="elect preferred or unclean leaders (kafka-leader-election.sh)",
                              description="This tool attempts to elect a new leader for a set of topic partitions.")
    p.add_argument("--bootstrap-server", required=True, help="A hostname and port for the broker to connect to.")
    add_command_config(p)
    p.add_argument("--election-type", required=True, type=str.upper, choices=sorted(TYPES),
                   help="Type of election to attempt: PREFERRED or UNCLEAN.")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--all-topic-partitions", action="store_true", help="Elect leaders for every partition.")
    which.add_argument("--topic", help="Name of the topic (with --partition: one partition of it).")
    which.add_argument("--path-to-json-file",
                       help='JSON file {"partitions": [{"topic": "t", "partition": 0}, ...]}.')
    p.add_argument("--partition", type=int, help="The partition of --topic.")
    p.set_defaults(func=main)


def _requested(args):
    if args.all_topic_partitions:
        return None
    if args.path_to_json_file:
        with open(args.path_to_json_file) as f:
            doc = json.load(f)
        pairs = [(e["topic"], int(e["partition"])) for e in doc.get("partitions", [])]
    elif args.partition is not None:
        pairs = [(args.topic, args.partition)]
    else:
        pairs = None   # every partition of the topic: filled in from Metadata
    return pairs


async def run(args, out) -> int:
    etype = TYPES[args.election_type]
    async with Admin(args.bootstrap_server, client_id="kbroker-leader-election", security=command_security(args)) as admin:
        pairs = _requested(args)
        if pairs is None and args.topic:
            desc = await admin.describe_topics([args.topic])
            pairs = [(args.topic, p.partition) for p in desc[args.topic].partitions]
        body = {"election_type": etype, "timeout_ms": 30000,
                "topic_partitions": None if pairs is None else [
                    {"topic": t, "partitions": sorted(p for tt, p in pairs if tt == t)}
                    for t in sorted({t for t, _ in pairs})]}
        conn = await admin.cluster.controller_connection()
        version = min(2, conn.broker_versions.get(ELECT_LEADERS, (0, -1))[1])
        if version < 0:
            raise KafkaError(Errors.UNSUPPORTED_VERSION, "the broker does not serve ElectLeaders")
        _, resp = await conn.send(ELECT_LEADERS, body, version=version)
    if resp.get("error_code"):
        raise KafkaError(resp["error_code"], None, "ElectLeaders")
    done, not_needed, failed = [], [], []
    for r in resp["replica_election_results"]:
        for pr in r["partition_result"]:
            name = f"{r['topic']}-{pr['partition_id']}"
            if pr["error_code"] == 0:
                done.append(name)
            elif pr["error_code"] == Errors.ELECTION_NOT_NEEDED:
                not_needed.append(name)
            else:
                failed.append((name, KafkaError(pr["error_code"], pr["error_message"])))
    if done:
        print(f"Successfully completed leader election ({args.election_type}) for partitions {', '.join(done)}",
              file=out)
    if not_needed:
        print(f"Valid replica already elected for partitions {', '.join(not_needed)}", file=out)
    for name, err in failed:
        print(f"Error completing leader election ({args.election_type}) for partition: {name}: {err}", file=out)
    if failed:
        print(f"{len(failed)} replica(s) could not be elected", file=sys.stderr)
        return 1
    return 0


def main(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(run(args, sys.stdout))
    except (KafkaError, OSError, ValueError) as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
