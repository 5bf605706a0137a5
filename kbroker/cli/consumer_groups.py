"""``kbroker consumer-groups``: kafka-consumer-groups.sh's everyday surface with its output.

--list; --describe (offsets with CURRENT-OFFSET / LOG-END-OFFSET / LAG, or --members [--verbose] or
--state); --reset-offsets (--to-earliest | --to-latest | --to-offset N | --to-datetime T | --shift-by N,
--dry-run or --execute; only for a group without active members); --delete; --delete-offsets
(kbroker.cli.delete_offsets).
"""
from __future__ import annotations

import asyncio
import datetime as dt
import sys

from kbroker.cli.tool import add_command_config, command_security
from kbroker.cli.delete_offsets import delete_offsets
from kbroker.client.cluster import Cluster
from kbroker.client.connection import KafkaError
from kbroker.client.consumer import Consumer
from kbroker.client.group import GroupClient, decode_assignment
from kbroker.protocol.errors import Errors


class CommandError(Exception):
    pass


def register(subparsers) -> None:
    p = subparsers.add_parser("consumer-groups", help="list, describe, reset or delete consumer groups "
                                                      "(kafka-consumer-groups.sh)")
    p.add_argument("--bootstrap-server", required=True, help="REQUIRED: The server(s) to connect to.")
    add_command_config(p)
    action = p.add_mutually_exclusive_group(required=True)
    action.add_argument("--list", action="store_true", help="List all consumer groups.")
    action.add_argument("--describe", action="store_true", help="Describe consumer group and list offset lag.")
    action.add_argument("--reset-offsets", action="store_true", help="Reset offsets of consumer group.")
    action.add_argument("--delete", action="store_true", help="Pass in groups to delete topic partition offsets.")
    action.add_argument("--delete-offsets", action="store_true", help="Delete offsets of consumer group. Supports "
                        "one consumer group at the time, and multiple topics.")
    p.add_argument("--group", action="append", default=[], help="The consumer group we wish to act on.")
    p.add_argument("--all-groups", action="store_true", help="Apply to all consumer groups.")
    p.add_argument("--topic", action="append", default=[],
                   help="The topic whose offsets should be reset (topic or topic:0,1,2).")
    p.add_argument("--all-topics", action="store_true", help="Consider all topics assigned to a group.")
    view = p.add_mutually_exclusive_group()
    view.add_argument("--members", action="store_true", help="Describe members of the group.")
    view.add_argument("--state", action="store_true", help="Describe the group state.")
    view.add_argument("--offsets", action="store_true", help="Describe the group and list all topic partitions.")
    p.add_argument("--verbose", action="store_true", help="Provide additional information (with --members).")
    to = p.add_mutually_exclusive_group()
    to.add_argument("--to-earliest", action="store_true", help="Reset offsets to earliest offset.")
    to.add_argument("--to-latest", action="store_true", help="Reset offsets to latest offset.")
    to.add_argument("--to-offset", type=int, help="Reset offsets to a specific offset.")
    to.add_argument("--to-datetime", help="Reset offsets to offset from datetime. Format: 'YYYY-MM-DDTHH:mm:SS.sss'")
    to.add_argument("--shift-by", type=int, help="Reset offsets shifting current offset by 'n'.")
    to.add_argument("--to-current", action="store_true", help="Reset offsets to current offset.")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="Only show results without executing changes.")
    mode.add_argument("--execute", action="store_true", help="Execute this operation.")
    p.set_defaults(func=run)


def run(args) -> int:
    try:
        return asyncio.run(_run(args))
    except CommandError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    except KafkaError as e:
        print(f"Error: Executing consumer group command failed due to {e}", file=sys.stderr)
        return 1


async def _run(args) -> int:
    cluster = Cluster(args.bootstrap_server, client_id="kbroker-consumer-groups",
                      security=command_security(args))
    gc = GroupClient(cluster=cluster)
    consumer = Consumer(cluster=cluster)
    try:
        if args.list:
            for g in sorted(x["group_id"] for x in await gc.list_groups()):
                print(g)
            return 0
        groups = list(args.group)
        if args.all_groups:
            groups = sorted(x["group_id"] for x in await gc.list_groups())
        if not groups:
            raise CommandError("Option [--describe/--reset-offsets/--delete] takes one of these options: "
                               "[all-groups], [group]")
        if args.describe:
            for g in groups:
                await _describe(gc, consumer, g, args)
            return 0
        if args.delete:
            return await _delete(gc, groups)
        if args.delete_offsets:
            if len(groups) != 1 or not args.topic:
                raise CommandError("Option [delete-offsets] takes the following options: [group], [topic]")
            return await delete_offsets(gc, groups[0], args.topic, sys.stdout)
        return await _reset(gc, consumer, groups, args)
    finally:
        await cluster.close()


def _table(rows, header, fixed=None):
    """Left-aligned columns as the Java tool prints them (``%-Ns`` with N = max(15, widest))."""
    fixed = fixed or {}
    widths = []
    for i, h in enumerate(header):
        w = fixed.get(i)
        if w is None:
            w = max([15, len(h)] + [len(str(r[i])) for r in rows])
        widths.append(w)
    lines = []
    for r in [header] + rows:
        cells = [f"{str(c):<{widths[i]}}" if i < len(r) - 1 else str(c) for i, c in enumerate(r)]
        lines.append(" ".join(cells).rstrip())
    return "\n".join(lines)


async def _describe(gc: GroupClient, consumer: Consumer, group: str, args) -> None:
    d = await gc.describe_group(group)
    state = d["group_state"]
    if state == "Dead":
        raise CommandError(f"Consumer group '{group}' does not exist.")
    members = d["members"]
    if args.state:
        coord = await gc.coordinator(group)
        b = gc.cluster.brokers.get(coord)
        where = f"{b.host}:{b.port} ({coord})" if b else f"({coord})"
        print()
        print(_table([[group, where, d["protocol_data"] or "", state, len(members)]],
                     ["GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"]))
        print()
        return
    if args.members:
        if not members:
            print(f"\nConsumer group '{group}' has no active members.\n")
            return
        rows = []
        for m in members:
            a = decode_assignment(m["member_assignment"])
            row = [group, m["member_id"], m["client_host"], m["client_id"], sum(len(v) for v in a.values())]
            if args.verbose:
                row.append(",".join(f"{t}({','.join(map(str, sorted(ps)))})" for t, ps in sorted(a.items())) or "-")
            rows.append(row)
        header = ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS"] + (["ASSIGNMENT"] if args.verbose else [])
        print()
        print(_table(rows, header))
        print()
        return
    owners = {}
    for m in members:
        for t, ps in decode_assignment(m["member_assignment"]).items():
            for p in ps:
                owners[(t, p)] = m
    committed = await gc.fetch_offsets(group)
    tps = sorted(set(owners) | set(committed))
    if not members:
        print(f"\nConsumer group '{group}' has no active members.")
    rows = []
    for t, p in tps:
        end = await consumer.list_offsets(t, p, "latest")
        cur = committed.get((t, p))
        m = owners.get((t, p))
        rows.append([group, t, p, cur[0] if cur else "-", end, (end - cur[0]) if cur else "-",
                     m["member_id"] if m else "-", m["client_host"] if m else "-", m["client_id"] if m else "-"])
    print()
    print(_table(rows, ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID",
                        "HOST", "CLIENT-ID"], {2: 10}))
    print()


async def _delete(gc: GroupClient, groups) -> int:
    codes = await gc.delete_groups(groups)
    ok = [g for g, c in codes.items() if c == 0]
    failed = {g: c for g, c in codes.items() if c != 0}
    if ok:
        print("Deletion of requested consumer groups (" + ", ".join(f"'{g}'" for g in ok) + ") was successful.")
    if failed:
        print("Deletion of some consumer groups failed:")
        for g, c in failed.items():
            why = {Errors.NON_EMPTY_GROUP: "The group is not empty.",
                   Errors.GROUP_ID_NOT_FOUND: "The group id does not exist."}.get(c, Errors(c).name)
            print(f"* Group '{g}' could not be deleted due to: {why}")
        return 1
    return 0


def _parse_datetime(s: str) -> int:
    for fmt in ("%Y-%m-%dT%H:%M:%S.%f%z", "%Y-%m-%dT%H:%M:%S.%f", "%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%dT%H:%M:%S"):
        try:
            t = dt.datetime.strptime(s, fmt)
        except ValueError:
            continue
        if t.tzinfo is None:
            t = t.astimezone()   # the Java tool reads a datetime without zone in local time
        return int(t.timestamp() * 1000)
    raise CommandError(f"Error parsing timestamp '{s}': expected 'YYYY-MM-DDTHH:mm:SS.sss'")


async def _reset(gc: GroupClient, consumer: Consumer, groups, args) -> int:
    scenarios = [args.to_earliest, args.to_latest, args.to_offset is not None, args.to_datetime is not None,
                 args.shift_by is not None, args.to_current]
    if sum(bool(s) for s in scenarios) != 1:
        raise CommandError("Option [reset-offsets] takes one of these options: [to-datetime], [by-duration], "
                           "[to-earliest], [to-latest], [shift-by], [from-file], [to-current], [to-offset]")
    if not args.topic and not args.all_topics:
        raise CommandError("Option [reset-offsets] takes one of these options: [all-topics], [topic]")
    if not args.execute and not args.dry_run:
        print("WARN: No action will be performed as the --execute option is missing. "
              "In a future major release, the default behavior of this command will be to prompt the user "
              "before executing the reset rather than doing a dry run. You should add the --dry-run option "
              "explicitly if you are scripting this command and want to keep the current default behavior "
              "without prompting.")
    for group in groups:
        d = await gc.describe_group(group)
        if d["group_state"] not in ("Empty", "Dead"):
            raise CommandError(f"Assignments can only be reset if the group '{group}' is inactive, but the "
                               f"current state is {d['group_state']}.")
        committed = await gc.fetch_offsets(group)
        tps = []
        if args.all_topics:
            tps = sorted(committed)
        for spec in args.topic:
            topic, _, parts = spec.partition(":")
            if parts:
                tps += [(topic, int(x)) for x in parts.split(",")]
            else:
                tps += [(topic, p) for p in await consumer.partitions(topic)]
        new = {}
        for t, p in sorted(set(tps)):
            lo = await consumer.list_offsets(t, p, "earliest")
            hi = await consumer.list_offsets(t, p, "latest")
            cur = committed.get((t, p), (None,))[0]
            if args.to_earliest:
                off = lo
            elif args.to_latest:
                off = hi
            elif args.to_offset is not None:
                off = args.to_offset
            elif args.to_datetime is not None:
                off = await consumer.list_offsets(t, p, _parse_datetime(args.to_datetime))
                off = hi if off is None or off < 0 else off
            elif args.shift_by is not None:
                off = (cur if cur is not None else lo) + args.shift_by
            else:
                off = cur if cur is not None else hi
            new[(t, p)] = min(max(off, lo), hi)
        if args.execute:
            codes = await gc.commit_offsets(group, {tp: (o, -1, "") for tp, o in new.items()})
            bad = {tp: c for tp, c in codes.items() if c}
            if bad:
                raise CommandError(f"Failed to reset offsets of group '{group}': " +
                                   ", ".join(f"{t}-{p}: {Errors(c).name}" for (t, p), c in sorted(bad.items())))
        print()
        print(_table([[group, t, p, o] for (t, p), o in sorted(new.items())],
                     ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"], {0: 30, 1: 30, 2: 10, 3: 15}))
    return 0
