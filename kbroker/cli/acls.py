"""``kbroker acls``: kafka-acls.sh with ``--bootstrap-server`` — add, remove and list ACLs through
CreateAcls, DeleteAcls and DescribeAcls.

The flags are Kafka's (``--add/--remove/--list``, ``--allow-principal/--deny-principal``,
``--allow-host/--deny-host``, ``--operation``, ``--topic/--group/--cluster/--transactional-id``,
``--resource-pattern-type``, ``--producer/--consumer``, ``--idempotent``, ``--force``, ``--principal``
to filter a list), and so is the output: ``Adding ACLs for resource `ResourcePattern(resourceType=TOPIC,
name=t, patternType=LITERAL)`:`` followed by one ``(principal=User:a, host=*, operation=READ,
permissionType=ALLOW)`` line per entry, then the resource's current ACLs. ``--remove`` without
``--force`` asks for confirmation, as Kafka's does. Where an option is missing Kafka's defaults apply:
host ``*``, operation All, pattern type LITERAL.
"""
from __future__ import annotations

import sys

from kbroker.cli.tool import ToolError, run_tool
from kbroker.client.admin import Admin
from kbroker.client.connection import KafkaError
from kbroker.security.acl import (CLUSTER_NAME, AclBinding, AclEntry, Operation, PatternType, Permission,
                                  ResourcePattern, ResourceType, parse_enum)

DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS = 29, 30, 31


def register(subparsers) -> None:
    p = subparsers.add_parser("acls", help="add, remove and list ACLs (kafka-acls.sh)",
                              description="This tool helps to manage acls on kafka.")
    p.add_argument("--bootstrap-server", required=True, help="REQUIRED: the server(s) to connect to")
    p.add_argument("--command-config", help="client properties file (accepted; PLAINTEXT needs none)")
    action = p.add_mutually_exclusive_group(required=True)
    action.add_argument("--add", action="store_true", help="Indicates you are trying to add ACLs.")
    action.add_argument("--remove", action="store_true", help="Indicates you are trying to remove ACLs.")
    action.add_argument("--list", action="store_true", help="List ACLs for the specified resource.")
    p.add_argument("--topic", action="append", default=[], help="topic to which ACLs should be added or removed")
    p.add_argument("--group", action="append", default=[], help="Consumer Group to which the ACLs should be added")
    p.add_argument("--cluster", action="store_true", help="Add/Remove cluster ACLs.")
    p.add_argument("--transactional-id", action="append", default=[], help="The transactionalId to which ACLs "
                   "should be added or removed")
    p.add_argument("--resource-pattern-type", default="LITERAL", help="LITERAL, PREFIXED (add); ANY, MATCH, "
                   "LITERAL, PREFIXED (list, remove). Default: LITERAL")
    p.add_argument("--allow-principal", action="append", default=[], help="principal in PrincipalType:name format")
    p.add_argument("--deny-principal", action="append", default=[], help="principal in PrincipalType:name format")
    p.add_argument("--principal", action="append", default=[], help="List ACLs for the specified principal")
    p.add_argument("--allow-host", action="append", default=[], help="Host for principals in --allow-principal")
    p.add_argument("--deny-host", action="append", default=[], help="Host for principals in --deny-principal")
    p.add_argument("--operation", action="append", default=[], help="Operation that is being allowed or denied "
                   "(Read, Write, Create, Delete, Alter, Describe, ClusterAction, DescribeConfigs, AlterConfigs, "
                   "IdempotentWrite, All). Default: All")
    p.add_argument("--producer", action="store_true", help="Convenience option to add/remove ACLs for producer "
                   "role (Write, Describe, Create on the topics)")
    p.add_argument("--consumer", action="store_true", help="Convenience option to add/remove ACLs for consumer "
                   "role (Read, Describe on the topics, Read on the group)")
    p.add_argument("--idempotent", action="store_true", help="With --producer: IdempotentWrite on the cluster")
    p.add_argument("--force", action="store_true", help="Assume Yes to all queries and do not prompt.")
    p.set_defaults(func=lambda args: run_tool(run, args))


def _pattern(text: str) -> PatternType:
    try:
        return parse_enum(PatternType, text)
    except ValueError:
        raise ToolError(f"Invalid resource-pattern-type {text!r}") from None


def _resources(args, pattern: PatternType) -> list[ResourcePattern]:
    out = [ResourcePattern(ResourceType.TOPIC, t, pattern) for t in args.topic]
    out += [ResourcePattern(ResourceType.GROUP, g, pattern) for g in args.group]
    out += [ResourcePattern(ResourceType.TRANSACTIONAL_ID, t, pattern) for t in args.transactional_id]
    if args.cluster or (args.producer and args.idempotent):
        out.append(ResourcePattern(ResourceType.CLUSTER, CLUSTER_NAME, PatternType.LITERAL))
    return out


def _operations(args, rtype: ResourceType) -> list[Operation]:
    """The operations an --add/--remove applies to a resource (the role shortcuts, else --operation)."""
    if args.producer or args.consumer:
        ops = []
        if args.producer:
            ops += {ResourceType.TOPIC: [Operation.WRITE, Operation.DESCRIBE, Operation.CREATE],
                    ResourceType.TRANSACTIONAL_ID: [Operation.WRITE, Operation.DESCRIBE],
                    ResourceType.CLUSTER: [Operation.IDEMPOTENT_WRITE]}.get(rtype, [])
        if args.consumer:
            ops += {ResourceType.TOPIC: [Operation.READ, Operation.DESCRIBE],
                    ResourceType.GROUP: [Operation.READ]}.get(rtype, [])
        return list(dict.fromkeys(ops))
    try:
        return [parse_enum(Operation, o) for o in (args.operation or ["All"])]
    except ValueError as e:
        raise ToolError(str(e)) from None


def _entries(args, ops) -> list[AclEntry]:
    out = []
    for principals, hosts, perm in ((args.allow_principal, args.allow_host, Permission.ALLOW),
                                    (args.deny_principal, args.deny_host, Permission.DENY)):
        for principal in principals:
            for host in hosts or ["*"]:
                out += [AclEntry(principal, host, op, perm) for op in ops]
    return out


def show_pattern(r: ResourcePattern) -> str:
    return f"ResourcePattern(resourceType={r.type.name}, name={r.name}, patternType={r.pattern.name})"


def show_entry(e: AclEntry) -> str:
    return (f"(principal={e.principal}, host={e.host}, operation={e.operation.name}, "
            f"permissionType={e.permission.name})")


async def _send(admin, api_key: int, body: dict) -> dict:
    conn = await admin.cluster.any_connection()
    _, resp = await conn.send(api_key, body)
    return resp


async def _describe(admin, rtype, name, pattern, principal=None) -> dict[ResourcePattern, list[AclEntry]]:
    resp = await _send(admin, DESCRIBE_ACLS, {
        "resource_type_filter": int(rtype), "resource_name_filter": name, "pattern_type_filter": int(pattern),
        "principal_filter": principal, "host_filter": None, "operation": int(Operation.ANY),
        "permission_type": int(Permission.ANY)})
    if resp["error_code"]:
        raise KafkaError(resp["error_code"], resp["error_message"], "describe ACLs")
    return {ResourcePattern(ResourceType(r["resource_type"]), r["resource_name"], PatternType(r["pattern_type"])):
            [AclEntry(a["principal"], a["host"], Operation(a["operation"]), Permission(a["permission_type"]))
             for a in r["acls"]] for r in resp["resources"]}


def _print_acls(out, header: str, acls: dict) -> None:
    for r, entries in acls.items():
        print(f"{header} `{show_pattern(r)}`: ", file=out)
        for e in entries:
            print(f" \t{show_entry(e)} ", file=out)
        print("", file=out)


async def run(args, out) -> int:
    pattern = _pattern(args.resource_pattern_type)
    if args.add and pattern not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise ToolError(f"A '--resource-pattern-type' value of '{pattern.name}' is not valid when adding acls.")
    if (args.producer or args.consumer) and not args.add and not args.remove:
        raise ToolError("With --producer or --consumer you must specify one of --add or --remove")
    if args.consumer and not args.group and (args.add or args.remove):
        raise ToolError("With --consumer you must specify a --group")
    resources = _resources(args, pattern)
    async with Admin(args.bootstrap_server, client_id="kbroker-acls") as admin:
        if args.list:
            return await _list(admin, args, resources, pattern, out)
        if not resources:
            raise ToolError("You must specify one of: --topic, --cluster, --group, --transactional-id")
        if args.add:
            return await _add(admin, args, resources, out)
        return await _remove(admin, args, resources, pattern, out)


async def _list(admin, args, resources, pattern, out) -> int:
    principals = args.principal or [None]
    if not resources:
        for principal in principals:
            _print_acls(out, "Current ACLs for resource", await _describe(
                admin, ResourceType.ANY, None, PatternType.ANY, principal))
        return 0
    for r in resources:
        for principal in principals:
            _print_acls(out, "Current ACLs for resource", await _describe(admin, r.type, r.name, pattern, principal))
    return 0


async def _add(admin, args, resources, out) -> int:
    bindings = []
    for r in resources:
        entries = _entries(args, _operations(args, r.type))
        if not entries:
            raise ToolError("You must specify one of: --allow-principal, --deny-principal when trying to add ACLs.")
        print(f"Adding ACLs for resource `{show_pattern(r)}`: ", file=out)
        for e in entries:
            print(f" \t{show_entry(e)} ", file=out)
        print("", file=out)
        bindings += [AclBinding(r, e) for e in entries]
    resp = await _send(admin, CREATE_ACLS, {"creations": [
        {"resource_type": int(b.resource.type), "resource_name": b.resource.name,
         "resource_pattern_type": int(b.resource.pattern), "principal": b.entry.principal, "host": b.entry.host,
         "operation": int(b.entry.operation), "permission_type": int(b.entry.permission)} for b in bindings]})
    failed = [(b, r) for b, r in zip(bindings, resp["results"]) if r["error_code"]]
    for b, r in failed:
        print(f"Error while adding ACLs: {KafkaError(r['error_code'], r['error_message'], show_entry(b.entry))}",
              file=sys.stderr)
    for r in resources:
        _print_acls(out, "Current ACLs for resource", await _describe(admin, r.type, r.name, r.pattern))
    return 1 if failed else 0


async def _remove(admin, args, resources, pattern, out) -> int:
    filters = []
    for r in resources:
        entries = _entries(args, _operations(args, r.type))
        if not args.force:
            what = "the listed ACLs" if entries else "all ACLs"
            answer = input(f"Are you sure you want to remove {what} for resource filter "
                           f"`{show_pattern(r)}`? (y/n)")
            if answer.strip().lower() != "y":
                continue
        base = {"resource_type_filter": int(r.type), "resource_name_filter": r.name, "pattern_type_filter": int(pattern)}
        if entries:
            filters += [dict(base, principal_filter=e.principal, host_filter=e.host, operation=int(e.operation),
                             permission_type=int(e.permission)) for e in entries]
        else:
            filters.append(dict(base, principal_filter=None, host_filter=None, operation=int(Operation.ANY),
                                permission_type=int(Permission.ANY)))
    if not filters:
        return 0
    resp = await _send(admin, DELETE_ACLS, {"filters": filters})
    failed = [r for r in resp["filter_results"] if r["error_code"]]
    for r in failed:
        print(f"Error while removing ACLs: {KafkaError(r['error_code'], r['error_message'], 'delete ACLs')}",
              file=sys.stderr)
    for r in resources:
        _print_acls(out, "Current ACLs for resource", await _describe(admin, r.type, r.name, pattern))
    return 1 if failed else 0
