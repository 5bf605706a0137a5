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

With --bootstrap-server the tool talks to the brokers through the admin APIs, as Kafka 3's tool does
(a --zookeeper given too is then used for --generate only): --list (ListPartitionReassignments:
``Current partition reassignments:`` then ``t-0: replicas: 1,2,0. adding: 2. removing: 0.`` per
partition, or ``No partition reassignments found.``), --cancel (AlterPartitionReassignments with no
replicas for the listed partitions still moving; throttles removed through IncrementalAlterConfigs unless
--preserve-throttles), --execute (AlterPartitionReassignments, then the JSON's ``log_dirs``: each replica
whose entry is not ``any`` is moved to that dir of its broker with AlterReplicaLogDirs, retried while the
broker answers REPLICA_NOT_AVAILABLE, i.e. the new replica is not created yet, up to --timeout) and
--verify (the partitions' states, then each log-dir move's: ``Reassignment of replica t-0-1 completed
successfully.`` or ``... is still in progress.``, from DescribeLogDirs; Kafka's TopicPartitionReplica
prints topic-partition-broker). A JSON with log dirs needs --bootstrap-server, as Kafka's ZooKeeper path
refused it. --throttle is served on the --zookeeper path only.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from kbroker.cli.tool import ToolError, run_tool, add_command_config, add_zk_tls_config, command_security, zk_tls
from kbroker.client.admin import DELETE, Admin, ConfigResource
from kbroker.protocol.errors import Errors
from kbroker.controller.assignment import AssignmentError, assign_replicas
from kbroker.replica.throttle import (FOLLOWER_RATE, FOLLOWER_REPLICAS, LEADER_RATE, LEADER_REPLICAS,
                                      format_throttled_replicas)
from kbroker.zk.client import BrokerZk, StaleVersionError, TopicNotFoundError, ZkClientError


def register(subparsers) -> None:
    p = subparsers.add_parser("reassign-partitions", help="move partition replicas (kafka-reassign-partitions.sh)",
                              description="This tool helps to move topic partitions between replicas.")
    p.add_argument("--zookeeper", help="ZooKeeper connect string (host:port[/chroot]).")
    add_zk_tls_config(p)
    p.add_argument("--bootstrap-server", help="The server(s) to use for bootstrapping.")
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
                   help="Do not remove the throttles (with --cancel, --verify).")
    p.add_argument("--timeout", type=int, default=10000,
                   help="The maximum time in ms to wait for log directory replica assignment to begin.")
    p.set_defaults(func=main)


def _doc(entries) -> str:
    return json.dumps({"version": 1, "partitions": [
        {"topic": t, "partition": p, "replicas": rs, "log_dirs": ["any"] * len(rs)} for t, p, rs in entries]},
        separators=(",", ":"))


def _read_reassignment(path) -> list[tuple[str, int, list[int]]]:
    with open(path) as f:
        doc = json.load(f)
    return [(e["topic"], int(e["partition"]), [int(r) for r in e["replicas"]]) for e in doc.get("partitions", [])]


ANY_LOG_DIR = "any"


def _read_log_dirs(path) -> dict[tuple[str, int, int], str]:
    """The JSON's ``log_dirs``: (topic, partition, broker) -> dir, for every entry that is not ``any``."""
    with open(path) as f:
        doc = json.load(f)
    out = {}
    for e in doc.get("partitions", []):
        dirs = e.get("log_dirs")
        if dirs is None:
            continue
        if len(dirs) != len(e["replicas"]):
            raise ToolError(f"Partition {e['topic']}-{e['partition']} has {len(e['replicas'])} replicas "
                            f"but {len(dirs)} log dirs: the two lists must have the same length")
        out.update({(e["topic"], int(e["partition"]), int(b)): d
                    for b, d in zip(e["replicas"], dirs) if d != ANY_LOG_DIR})
    return out


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
    zk = BrokerZk(args.zookeeper, -1, tls=zk_tls(args))
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
        if _read_log_dirs(args.reassignment_json_file):
            raise ValueError("bootstrap-server needs to be provided when replica reassignments are present.")
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


def _replica(t: str, p: int, b: int) -> str:
    return f"{t}-{p}-{b}"       # Kafka's TopicPartitionReplica.toString


def _sorted_replicas(keys) -> list:
    return sorted(keys, key=lambda k: (k[2], k[0], k[1]))     # by broker, topic, partition (Kafka's order)


async def _move_log_dirs(admin: Admin, moves: dict, timeout_ms: int, out) -> None:
    """Start each move; a replica not created yet (REPLICA_NOT_AVAILABLE) is asked again until the timeout."""
    pending = dict(moves)
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        results = await admin.alter_replica_log_dirs(pending)
        started = [k for k, e in results.items() if e is None]
        failed = {k: e for k, e in results.items() if e is not None and e.code != Errors.REPLICA_NOT_AVAILABLE}
        if failed:
            k = _sorted_replicas(failed)[0]
            raise ToolError(f"Failed to alter dir for {_replica(*k)}: {failed[k]}")
        if started:
            print(f"Successfully started log directory move{'' if len(started) == 1 else 's'} for: "
                  + ",".join(_replica(*k) for k in _sorted_replicas(started)), file=out)
        for k in started:
            del pending[k]
        if not pending:
            return
        if time.monotonic() >= deadline:
            raise ToolError("Timed out before log directories were assigned. Failed to start the log "
                            "directory move for: " + ",".join(_replica(*k) for k in _sorted_replicas(pending)))
        await asyncio.sleep(0.1)


async def _assignment(admin: Admin, topics) -> dict[tuple[str, int], list[int]]:
    described = await admin.describe_topics(sorted(topics))
    return {(t, pm.partition): list(pm.replicas) for t, d in described.items() for pm in d.partitions}


async def _execute_api(admin: Admin, args, out) -> int:
    wanted = _read_reassignment(args.reassignment_json_file)
    moves = _read_log_dirs(args.reassignment_json_file)
    if args.throttle >= 0:
        raise ToolError("--throttle is served with --zookeeper only")
    now = await _assignment(admin, {t for t, _, _ in wanted})
    missing = [(t, p) for t, p, _ in wanted if (t, p) not in now]
    if missing:
        raise ToolError("Topic or partition not found: " + _tp_list(missing))
    print(f"Current partition replica assignment\n\n{_doc([(t, p, now[(t, p)]) for t, p, _ in wanted])}\n\n"
          f"Save this to use as the --reassignment-json-file option during rollback", file=out)
    if await admin.list_partition_reassignments():
        raise ToolError("Cannot execute because there is an existing partition assignment.")
    targets = {(t, p): rs for t, p, rs in wanted if now[(t, p)] != rs}
    if targets:
        errors = {tp: e for tp, e in (await admin.alter_partition_reassignments(targets)).items() if e is not None}
        if errors:
            raise ToolError("Error reassigning partition(s):\n"
                            + "\n".join(f"{t}-{p}: {errors[(t, p)]}" for t, p in sorted(errors)))
        print(f"Successfully started partition reassignment{'' if len(targets) == 1 else 's'} for "
              f"{_tp_list(targets)}", file=out)
    if moves:
        await _move_log_dirs(admin, moves, args.timeout, out)
    return 0


def _move_state(replica, target: str, dirs: dict) -> tuple[bool, str]:
    """(done, Kafka's line) of one log-dir move from the broker's DescribeLogDirs answer."""
    t, p, b = replica
    current = future = None
    for path, d in dirs.items():
        info = d.replicas.get((t, p))
        if info is not None:
            if info.is_future:
                future = path
            else:
                current = path
    if current is None:
        return False, (f"Partition {t}-{p} is not found in any live log dir on broker {b}. There is likely an "
                       f"offline log directory on the broker.")
    if future is not None:
        if future == target:
            return False, f"Reassignment of replica {_replica(*replica)} is still in progress."
        return False, f"Partition {t}-{p} on broker {b} is being moved to log dir {future} instead of {target}."
    if current == target:
        return True, f"Reassignment of replica {_replica(*replica)} completed successfully."
    return True, f"Partition {t}-{p} on broker {b} is not being moved from log dir {current} to {target}."


async def _verify_api(admin: Admin, args, out) -> int:
    wanted = _read_reassignment(args.reassignment_json_file)
    moves = _read_log_dirs(args.reassignment_json_file)
    ongoing = await admin.list_partition_reassignments()
    now = await _assignment(admin, {t for t, p, _ in wanted if (t, p) not in ongoing})
    lines = ["Status of partition reassignment:"]
    for t, p, target in sorted(wanted):
        if (t, p) in ongoing:
            lines.append(f"Reassignment of partition {t}-{p} is still in progress.")
        elif now.get((t, p), []) == target:
            lines.append(f"Reassignment of partition {t}-{p} is complete.")
        else:
            lines.append(f"There is no active reassignment of partition {t}-{p}, but replica set is "
                         f"{','.join(map(str, now.get((t, p), [])))} rather than {','.join(map(str, target))}.")
    print("\n".join(lines), file=out)
    brokers = sorted({b for _, _, b in moves})
    live = set((await admin.describe_cluster()).brokers)
    logdirs = await admin.describe_log_dirs([b for b in brokers if b in live])
    states = []
    for k in _sorted_replicas(moves):
        if k[2] not in logdirs:
            states.append((False, f"Partition {k[0]}-{k[1]} cannot be found in any live log directory on "
                                  f"broker {k[2]}."))
        else:
            states.append(_move_state(k, moves[k], logdirs[k[2]]))
    print("\n".join(line for _, line in states), file=out)
    complete = not ongoing and all(done for done, _ in states)
    if complete and not args.preserve_throttles:
        brokers = sorted(live | {b for _, _, rs in wanted for b in rs})
        topics = sorted({t for t, _, _ in wanted})
        print(f"Clearing broker-level throttles on broker{'' if len(brokers) == 1 else 's'} "
              f"{','.join(map(str, brokers))}", file=out)
        print(f"Clearing topic-level throttles on topic{'' if len(topics) == 1 else 's'} {','.join(topics)}",
              file=out)
        await _clear_throttles_api(admin, topics)
    return 0 if complete else 1


async def run_api(args, out) -> int:
    async with Admin(args.bootstrap_server, client_id="kbroker-reassign-partitions",
                     security=command_security(args)) as admin:
        if args.list:
            print(format_reassignments(await admin.list_partition_reassignments()), file=out)
            return 0
        if args.generate:
            raise ToolError("--generate needs --zookeeper")
        if not args.reassignment_json_file:
            raise ToolError("--execute, --verify and --cancel need --reassignment-json-file")
        if args.execute:
            return await _execute_api(admin, args, out)
        if args.verify:
            return await _verify_api(admin, args, out)
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
    if not args.bootstrap_server and not args.zookeeper:
        print("Error: one of --bootstrap-server or --zookeeper is required", file=sys.stderr)
        return 1
    if args.bootstrap_server and not (args.generate and args.zookeeper):
        return run_tool(run_api, args)
    if args.list:
        print("Error: --list needs --bootstrap-server", file=sys.stderr)
        return 1
    try:
        return run(args, sys.stdout)
    except (AssignmentError, ZkClientError, TopicNotFoundError, ToolError, ValueError, OSError, KeyError) as e:
        message = e.message if isinstance(e, AssignmentError) else str(e)
        print(f"Error: {message}", file=sys.stderr)
        return 1
