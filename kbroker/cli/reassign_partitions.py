"""``kbroker reassign-partitions``: kafka-reassign-partitions.sh's JSON and its --generate / --execute /
--verify steps, through ZooKeeper's /admin/reassign_partitions (the ZooKeeper-mode controller
carries the moves out: new replicas catch up, join the ISR, then the old ones are removed).

    --generate --topics-to-move-json-file F --broker-list 0,1,2   current and proposed assignment
    --execute  --reassignment-json-file F                         start the moves
    --verify   --reassignment-json-file F                         completed / still in progress
"""
from __future__ import annotations

import argparse
import json
import sys

from kbroker.controller.assignment import AssignmentError, assign_replicas
from kbroker.zk.client import BrokerZk, TopicNotFoundError, ZkClientError


def register(subparsers) -> None:
    p = subparsers.add_parser("reassign-partitions", help="move partition replicas (kafka-reassign-partitions.sh)",
                              description="This tool helps to move topic partitions between replicas.")
    p.add_argument("--zookeeper", required=True, help="ZooKeeper connect string (host:port[/chroot]).")
    action = p.add_mutually_exclusive_group(required=True)
    action.add_argument("--generate", action="store_true", help="Propose an assignment for the given topics.")
    action.add_argument("--execute", action="store_true", help="Start the reassignment in the JSON file.")
    action.add_argument("--verify", action="store_true", help="Report whether the reassignment completed.")
    p.add_argument("--topics-to-move-json-file", help='{"topics": [{"topic": "foo"}], "version": 1}')
    p.add_argument("--broker-list", help="Brokers to place replicas on, e.g. 0,1,2 (with --generate).")
    p.add_argument("--reassignment-json-file", help="The partition reassignment JSON (with --execute/--verify).")
    p.set_defaults(func=main)


def _doc(entries) -> str:
    return json.dumps({"version": 1, "partitions": [
        {"topic": t, "partition": p, "replicas": rs, "log_dirs": ["any"] * len(rs)} for t, p, rs in entries]},
        separators=(",", ":"))


def _read_reassignment(path) -> list[tuple[str, int, list[int]]]:
    with open(path) as f:
        doc = json.load(f)
    return [(e["topic"], int(e["partition"]), [int(r) for r in e["replicas"]]) for e in doc.get("partitions", [])]


def _current(zk: BrokerZk, topics) -> list[tuple[str, int, list[int]]]:
    out = []
    for t in topics:
        a, _ = zk.get_topic_assignment(t)
        out += [(t, p, list(rs)) for p, rs in sorted(a.partitions.items())]
    return out


def run(args, out) -> int:
    zk = BrokerZk(args.zookeeper, -1)
    zk.start()
    try:
        if args.generate:
            if not args.topics_to_move_json_file or not args.broker_list:
                raise ValueError("--generate needs --topics-to-move-json-file and --broker-list")
            with open(args.topics_to_move_json_file) as f:
                topics = [e["topic"] for e in json.load(f).get("topics", [])]
            brokers = [int(b) for b in args.broker_list.split(",") if b.strip()]
            live = zk.get_live_brokers()
            racks = {b: live[b][0].rack if b in live else None for b in brokers}
            current = _current(zk, topics)
            proposed = []
            for t in topics:
                parts = [(p, rs) for tt, p, rs in current if tt == t]
                placed = assign_replicas(brokers, len(parts), len(parts[0][1]), racks=racks)
                proposed += [(t, p, placed[p]) for p, _ in parts]
            print(f"Current partition replica assignment\n{_doc(current)}\n", file=out)
            print(f"Proposed partition reassignment configuration\n{_doc(proposed)}", file=out)
            return 0
        if not args.reassignment_json_file:
            raise ValueError("--execute and --verify need --reassignment-json-file")
        wanted = _read_reassignment(args.reassignment_json_file)
        if args.execute:
            current = _current(zk, sorted({t for t, _, _ in wanted}))
            print(f"Current partition replica assignment\n\n{_doc(current)}\n\n"
                  f"Save this to use as the --reassignment-json-file option during rollback", file=out)
            zk.request_reassignments(wanted)
            print("Successfully started partition reassignments for "
                  + ",".join(f"{t}-{p}" for t, p, _ in wanted), file=out)
            return 0
        pending = zk.get_reassignments()
        in_progress = {(t, p) for t, p, _ in (pending[0] if pending else [])}
        print("Status of partition reassignment:", file=out)
        complete = True
        for t, p, rs in wanted:
            a, _ = zk.get_topic_assignment(t)
            if (t, p) not in in_progress and a.partitions.get(p) == rs:
                print(f"Reassignment of partition {t}-{p} is completed.", file=out)
            else:
                complete = False
                print(f"Reassignment of partition {t}-{p} is still in progress.", file=out)
        return 0 if complete else 1
    finally:
        zk.close()


def main(args: argparse.Namespace) -> int:
    try:
        return run(args, sys.stdout)
    except (AssignmentError, ZkClientError, TopicNotFoundError, ValueError, OSError, KeyError) as e:
        message = e.message if isinstance(e, AssignmentError) else str(e)
        print(f"Error: {message}", file=sys.stderr)
        return 1
