"""``kbroker configs``: kafka-configs.sh for topics and brokers, through the admin API.

    kbroker configs --bootstrap-server H:P --entity-type brokers --entity-name 1 --describe [--all]
    kbroker configs --bootstrap-server H:P --entity-type brokers --entity-default --alter \\
        --add-config follower.replication.throttled.rate=1000000 [--delete-config k1,k2]
    kbroker configs --bootstrap-server H:P --entity-type topics --entity-name t --alter --add-config 'k=[a,b]'
    kbroker configs --bootstrap-server H:P --entity-type users --entity-name alice --alter \
        --add-config 'SCRAM-SHA-512=[iterations=8192,password=alice-secret]'   (kbroker.cli.configs_users)

Describe prints Kafka's ConfigCommand layout: ``Dynamic configs for broker 1 are:`` (``All configs`` with
--all, ``Default configs for brokers in the cluster are:`` for --entity-default) and one line per key,
``  key=value sensitive=false synonyms={SOURCE:key=value, ...}``. Alter sends IncrementalAlterConfigs
(SET for --add-config, DELETE for --delete-config) to the broker named (a broker resource goes to that
broker, the default to any) and prints ``Completed updating config for broker 1.``; an error answer
is printed with its message and exits 1.
"""
from __future__ import annotations

import argparse
import asyncio
import sys

from kbroker.cli.tool import add_command_config, command_security
from kbroker.client.admin import Admin, ConfigResource
from kbroker.client.connection import KafkaError

DESCRIBE_CONFIGS = 32
TOPIC, BROKER = 2, 4
SET, DELETE = 0, 1
SOURCES = {0: "UNKNOWN", 1: "DYNAMIC_TOPIC_CONFIG", 2: "DYNAMIC_BROKER_CONFIG", 3: "DYNAMIC_DEFAULT_BROKER_CONFIG",
           4: "STATIC_BROKER_CONFIG", 5: "DEFAULT_CONFIG", 6: "DYNAMIC_BROKER_LOGGER_CONFIG"}
DYNAMIC = {1, 2, 3, 6}


def register(subparsers) -> None:
    p = subparsers.add_parser("configs", help="describe and alter topic, broker, user and client configs "
                              "(kafka-configs.sh)",
                              description="Change configs for topics, brokers, users and clients, or describe them.")
    p.add_argument("--bootstrap-server", required=True, help="The broker to connect to.")
    add_command_config(p)
    # Repeatable as kafka-configs.sh's: "--entity-type users --entity-name alice --entity-type clients
    # --entity-name app" is alice's quota with client-id app; names and defaults pair with types in order.
    p.add_argument("--entity-type", dest="entity_types", action="append", required=True,
                   choices=("topics", "brokers", "users", "clients", "ips"), help="Type of entity.")
    p.add_argument("--entity-name", dest="entity_names", action="append",
                   help="Name of the entity (topic name / broker id / user / client-id / ip).")
    p.add_argument("--entity-default", dest="entity_names", action="append_const", const=None,
                   help="The default entity (/config/brokers|users|clients|ips/<default>).")
    action = p.add_mutually_exclusive_group(required=True)
    action.add_argument("--describe", action="store_true", help="List configs for the given entity.")
    action.add_argument("--alter", action="store_true", help="Alter the configuration for the entity.")
    p.add_argument("--all", action="store_true", help="With --describe: every config, not only the dynamic ones.")
    p.add_argument("--add-config", default="",
                   help="k1=v1,k2=[v1,v2,v2],... : keys to set (square brackets group a list value).")
    p.add_argument("--delete-config", default="", help="k1,k2,... : keys to remove.")
    p.set_defaults(func=main)


def parse_add_config(text: str) -> dict[str, str]:
    """Kafka's --add-config syntax: comma-separated k=v, a value in [...] may hold commas."""
    out, i, n = {}, 0, len(text)
    while i < n:
        eq = text.find("=", i)
        if eq < 0:
            raise ValueError(f"--add-config: {text[i:]!r} is not key=value")
        key = text[i:eq].strip()
        if not key:
            raise ValueError(f"--add-config: an entry has no key in {text!r}")
        j = eq + 1
        if j < n and text[j] == "[":
            close = text.find("]", j)
            if close < 0:
                raise ValueError(f"--add-config: unclosed '[' in the value of {key}")
            value, i = text[j + 1:close], close + 1
            if i < n and text[i] != ",":
                raise ValueError(f"--add-config: ',' expected after the value of {key}")
            i += 1
        else:
            comma = text.find(",", j)
            comma = n if comma < 0 else comma
            value, i = text[j:comma], comma + 1
        out[key] = value.strip()
    return out


def _resource(args) -> ConfigResource:
    rtype = BROKER if args.entity_type == "brokers" else TOPIC
    if args.entity_default:
        if rtype != BROKER:
            raise ValueError("--entity-default is for --entity-type brokers only")
        return ConfigResource(BROKER, "")
    if rtype == BROKER and not args.entity_name.isdigit():
        raise ValueError(f"--entity-name of a broker must be its id, not {args.entity_name!r}")
    return ConfigResource(rtype, args.entity_name)


def _title(res: ConfigResource, all_: bool) -> str:
    kind = "All" if all_ else "Dynamic"
    if res.type == BROKER and res.name == "":
        return "Default configs for brokers in the cluster are:"
    return f"{kind} configs for {'broker' if res.type == BROKER else 'topic'} {res.name} are:"


async def describe(admin: Admin, res: ConfigResource, all_: bool, out) -> int:
    conn = await (admin.cluster.connection(int(res.name)) if res.type == BROKER and res.name
                  else admin.cluster.any_connection())
    version = min(conn.version_for(DESCRIBE_CONFIGS), 3)
    if version < 1:
        raise KafkaError(-1, "the broker does not answer DescribeConfigs v1 (synonyms)", "describe")
    _, resp = await conn.send(DESCRIBE_CONFIGS, {
        "resources": [{"resource_type": res.type, "resource_name": res.name, "configuration_keys": None}],
        "include_synonyms": True, "include_documentation": False}, version)
    r = resp["results"][0]
    if r["error_code"]:
        raise KafkaError(r["error_code"], r.get("error_message"), f"describe configs {res.name}")
    print(_title(res, all_), file=out)
    for c in sorted(r["configs"], key=lambda c: c["name"]):
        if not all_ and c["config_source"] not in DYNAMIC:
            continue
        value = "" if c["value"] is None else c["value"]
        syns = ", ".join(f"{SOURCES.get(s['source'], s['source'])}:{s['name']}={'' if s['value'] is None else s['value']}"
                         for s in c["synonyms"])
        print(f"  {c['name']}={value} sensitive={'true' if c['is_sensitive'] else 'false'} synonyms={{{syns}}}",
              file=out)
    return 0


async def alter(admin: Admin, res: ConfigResource, add: dict[str, str], delete: list[str], out) -> int:
    ops = {k: (SET, v) for k, v in add.items()}
    for k in delete:
        if k in ops:
            raise ValueError(f"{k} is both added and deleted")
        ops[k] = (DELETE, None)
    if not ops:
        raise ValueError("--alter needs --add-config and/or --delete-config")
    await admin.incremental_alter_configs({res: ops})
    if res.type == BROKER and res.name == "":
        print("Completed updating default config for brokers in the cluster.", file=out)
    else:
        print(f"Completed updating config for {'broker' if res.type == BROKER else 'topic'} {res.name}.", file=out)
    return 0


async def run(args, out) -> int:
    types, names = args.entity_types, args.entity_names or []
    if not names:
        raise ValueError("--entity-name or --entity-default is required")
    args.entity_type, args.entity_name = types[0], names[0]
    args.entity_default = names[0] is None
    if types[0] in ("users", "clients", "ips"):
        from kbroker.cli.configs_quotas import is_quota_command, run_quotas
        from kbroker.cli.configs_users import run_users
        add = parse_add_config(args.add_config) if args.add_config else {}
        delete = [k.strip() for k in args.delete_config.split(",") if k.strip()]
        async with Admin(args.bootstrap_server, client_id="kbroker-configs", security=command_security(args)) as admin:
            if is_quota_command(types, add, delete):
                return await run_quotas(admin, args, types, names, out)
            if args.describe and not args.entity_default:
                await run_quotas(admin, args, types, names, out)    # a user's quotas, then its credentials
            return await run_users(admin, args, out)
    if len(types) != 1 or len(names) != 1:
        raise ValueError(f"--entity-type {types[0]} names one entity")
    res = _resource(args)
    async with Admin(args.bootstrap_server, client_id="kbroker-configs", security=command_security(args)) as admin:
        if args.describe:
            return await describe(admin, res, args.all, out)
        add = parse_add_config(args.add_config) if args.add_config else {}
        delete = [k.strip() for k in args.delete_config.split(",") if k.strip()]
        return await alter(admin, res, add, delete, out)


def main(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(run(args, sys.stdout))
    except (KafkaError, OSError, ValueError) as e:
        print(f"Error while executing config command with args '{' '.join(sys.argv[1:])}': {e}", file=sys.stderr)
        return 1
