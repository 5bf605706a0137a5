"""``kbroker reassign-partitions``: kafka-reassign-partitions.sh's JSON and its --generate / --execute /
--verify steps, through ZooKeeper's /admin/reassign_partitions (the ZooKeeper-mode controller
carries the moves out: new replicas catch up, join the ISR, then the old ones are removed).

    --generate --topics-to-move-json-file F --broker-list 0,1,2   current and proposed assignment
    --execute  --reassignment-json-file F [--throttle B/s]        start the moves
    --verify   --reassignment-json-file F                         completed / still in progress
    --cancel   --reassignment-json-file F [--preserve-throttles]  revert to the original replicas

--throttle, as kafka-reassign-partitions.sh: every broker holding or receiving a moving partition
gets leader.replication.throttled.rate and follower.replication.throttled.rate = B
(/config/brokers/<id>), and each topic lists its moving partitions' current replicas in
leader.replication.throttled.replicas and the added ones in follower.replication.throttled.replicas.
--verify removes all of it once every listed partition has completed.
--cancel (KIP-455 in ZooKeeper mode): the pending entries of the listed partitions are rewritten to
their original replicas (the topic znode's replicas minus its adding_replicas); the controller drops
the added replicas and deletes the entries. Throttles are removed too unless --preserve-throttles.

With --bootstrap-server instead of --zookeeper the tool talks to the controller through the admin
APIs, as Kafka's tool does: --list (ListPartitionReassignments: ``Current partition reassignments:``
then ``t-0: replicas: 1,2,0. adding: 2. removing: 0.`` per partition, or ``No partition
reassignments found.``) and --cancel (AlterPartitionReassignments with no replicas for the listed
partitions still moving; throttles removed through IncrementalAlterConfigs unless
--preserve-throttles). --generate, --execute and --verify need --zookeeper.
"""
from __future__ import annotations

import argparse
import json
import sys

from kbroker.cli.tool import ToolError, run_tool, add_command_config, command_security
from kbroker.client.admin import DELETE, Admin, ConfigResource
from kbroker.controller.assignment import AssignmentError, assign_replicas
from kbroker.replica.throttle import (FOLLOWER_RATE, FOLLOWER_REPLICAS, LEADER_RATE, LEADER_REPLICAS,
                                      format_throttled_replicas)
from kbroker.zk.client import BrokerZk, StaleVersionError, TopicNotFoundError, ZkClientError


def register(subparsers) -> None:
    p = subparsers.add_parser("reassign-partitions", help="move partition replicas (kafka-reassign-partitions.sh)",
                              description="This tool helps to move topic partitions between replicas.")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--zookeeper", help="ZooKeeper connect string (host:port[/chroot]).")
    where.add_argument("--bootstrap-server", help="The server(s) to use for bootstrapping (--list, --cancel).")
    add_command_config(p)
    action = p.add_mutually_exclusive_group(required=True)
    action.add_argument("--list", action="store_true",
                        help="List all active partition reassignments (with --bootstrap-server).")
    action.add_argument("--generate", action="store_true", help="Propose an assignment for the given topics.")
    action.add_argument("--execute", action="store_true", help="Start the reassignment in the JSON file.")
    action.add_argument("--verify", action="store_true", help="Report whether the reassignment completed.")
    action.add_argument("--cancel", action="store_true", help="Cancel the reassignments in the JSON file.")
    p.add_argument("--topics-to-move-json-file", help='{"topics": [{"topic": "foo"}], "version": 1}')
    p.add_argument("--broker-list", help="Brokers to place replicas on, e.g. 0,1,2 (with --generate).")
    p.add_argument("--reassignment-json-file",
                   help="The partition reassignment JSON (with --execute/--verify/--cancel).")
    p.add_argument("--throttle", type=int, default=-1,
                   help="Inter-broker replication throttle for the moves, in B/s (with --execute).")
    p.add_argument("--preserve-throttles", action="store_true",
                   help="Do not remove the throttles (with --cancel).")
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


def _set_throttles(zk: BrokerZk, wanted, current, rate: int, out) -> None:
    """kafka-reassign-partitions.sh's --throttle: rates on every broker involved, throttled
    replica lists on every topic moved (current replicas lead-throttled, added ones follow-throttled)."""
    now = {(t, p): rs for t, p, rs in current}
    leader, follower, brokers = {}, {}, set()
    for t, p, target in wanted:
        existing = now.get((t, p), [])
        if list(target) == list(existing):
            continue
        brokers |= set(existing) | set(target)
        leader.setdefault(t, set()).update((p, b) for b in existing)
        follower.setdefault(t, set()).update((p, b) for b in target if b not in existing)
    for t in sorted(set(leader) | set(follower)):
        config = zk.get_topic_config(t)
        config[LEADER_REPLICAS] = format_throttled_replicas(leader.get(t, ()))
        config[FOLLOWER_REPLICAS] = format_throttled_replicas(follower.get(t, ()))
        zk.set_topic_config(t, config)
    for b in sorted(brokers):
        zk.alter_broker_config(str(b), {LEADER_RATE: str(rate), FOLLOWER_RATE: str(rate)})
    print("Warning: You must run --verify periodically, until the reassignment completes, to ensure the "
          "throttle is removed.", file=out)
    print(f"The inter-broker throttle limit was set to {rate} B/s", file=out)


def _clear_throttles(zk: BrokerZk, topics) -> None:
    """Remove the throttle rates from every registered broker and the throttled replica lists from
    ``topics`` (what --verify does once the reassignment is complete)."""
    for b in sorted(zk.get_broker_ids()):
        if set(zk.get_broker_config(str(b))) & {LEADER_RATE, FOLLOWER_RATE}:
            zk.alter_broker_config(str(b), {}, delete=(LEADER_RATE, FOLLOWER_RATE))
    for t in sorted(topics):
        config = zk.get_topic_config(t)
        if set(config) & {LEADER_REPLICAS, FOLLOWER_REPLICAS}:
            zk.set_topic_config(t, {k: v for k, v in config.items() if k not in (LEADER_REPLICAS, FOLLOWER_REPLICAS)})


def _cancel(zk: BrokerZk, wanted, out) -> list[tuple[str, int]]:
    """Rewrite the listed pending entries to their original replicas; -> the partitions cancelled."""
    asked = {(t, p) for t, p, _ in wanted}
    for _ in range(20):
        pending = zk.get_reassignments()
        if pending is None:
            return []
        entries, version = pending
        cancelled = []
        new = []
        for t, p, target in entries:
            if (t, p) in asked:
                a, _ = zk.get_topic_assignment(t)
                adding = set(a.adding_replicas.get(p, []))
                original = [r for r in a.partitions.get(p, []) if r not in adding]
                new.append((t, p, original))
                cancelled.append((t, p))
            else:
                new.append((t, p, target))
        if not cancelled:
            return []
        try:
            zk.replace_reassignments(new, version)
        except StaleVersionError:
            continue        # the controller moved on meanwhile: read again
        return cancelled
    raise StaleVersionError("the pending reassignments kept changing")


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
            raise ValueError("--execute, --verify and --cancel need --reassignment-json-file")
        wanted = _read_reassignment(args.reassignment_json_file)
        topics = sorted({t for t, _, _ in wanted})
        if args.cancel:
            cancelled = _cancel(zk, wanted, out)
            if cancelled:
                print("Successfully cancelled partition reassignments for: "
                      + ",".join(f"{t}-{p}" for t, p in cancelled), file=out)
            else:
                print("None of the specified partition reassignments are active.", file=out)
            if not args.preserve_throttles:
                _clear_throttles(zk, topics)
            return 0
        if args.execute:
            current = _current(zk, topics)
            print(f"Current partition replica assignment\n\n{_doc(current)}\n\n"
                  f"Save this to use as the --reassignment-json-file option during rollback", file=out)
            if zk.get_reassignments() is not None:
                raise ZkClientError("There is an existing assignment running.")
            if args.throttle >= 0:
                _set_throttles(zk, wanted, current, args.throttle, out)
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
        if complete:
            _clear_throttles(zk, topics)
            print("Throttle was removed.", file=out)
        return 0 if complete else 1
    finally:
        zk.close()


def _tp_list(parts) -> str:
    return ",".join(f"{t}-{p}" for t, p in sorted(parts))


def format_reassignments(found: dict) -> str:
    """Kafka's curReassignmentsToString."""
    lines = []
    for (t, p), (replicas, adding, removing) in sorted(found.items()):
        line = f"{t}-{p}: replicas: {','.join(map(str, replicas))}."
        if adding:
            line += f" adding: {','.join(map(str, adding))}."
        if removing:
            line += f" removing: {','.join(map(str, removing))}."
        lines.append(line)
    return "Current partition reassignments:\n" + "\n".join(lines) if lines else "No partition reassignments found."


async def _clear_throttles_api(admin: Admin, topics) -> None:
    brokers = sorted((await admin.describe_cluster()).brokers)
    changes = {ConfigResource.broker(b): {LEADER_RATE: (DELETE, None), FOLLOWER_RATE: (DELETE, None)}
               for b in brokers}
    changes.update({ConfigResource.topic(t): {LEADER_REPLICAS: (DELETE, None), FOLLOWER_REPLICAS: (DELETE, None)}
                    for t in sorted(topics)})
    await admin.incremental_alter_configs(changes)


async def run_api(args, out) -> int:
    async with Admin(args.bootstrap_server, client_id="kbroker-reassign-partitions",
                     security=command_security(args)) as admin:
        if args.list:
            print(format_reassignments(await admin.list_partition_reassignments()), file=out)
            return 0
        if not args.cancel:
            raise ToolError("--generate, --execute and --verify need --zookeeper")
        if not args.reassignment_json_file:
            raise ToolError("--cancel needs --reassignment-json-file")
        wanted = _read_reassignment(args.reassignment_json_file)
        moving = await admin.list_partition_reassignments([(t, p) for t, p, _ in wanted])
        if moving:
            errors = {tp: e for tp, e in (await admin.alter_partition_reassignments(
                {tp: None for tp in moving})).items() if e is not None}
            if errors:
                raise ToolError(f"Error cancelling partition reassignment{'' if len(errors) == 1 else 's'} for:\n"
                                + "\n".join(f"{t}-{p}: {errors[(t, p)]}" for t, p in sorted(errors)))
            print(f"Successfully cancelled partition reassignments for: {_tp_list(moving)}", file=out)
        else:
            print("None of the specified partition reassignments are active.", file=out)
        if not args.preserve_throttles:
            await _clear_throttles_api(admin, {t for t, _, _ in wanted})
    return 0


def main(args: argparse.Namespace) -> int:
    if args.bootstrap_server:
        return run_tool(run_api, args)
    if args.list:
        print("Error: --list needs --bootstrap-server", file=sys.stderr)
        return 1
    try:
        return run(args, sys.stdout)
    except (AssignmentError, ZkClientError, TopicNotFoundError, ValueError, OSError, KeyError) as e:
        message = e.message if isinstance(e, AssignmentError) else str(e)
        print(f"Error: {message}", file=sys.stderr)
        return 1
