"""``kbroker configs --entity-type users|clients|ips``: client quotas as kafka-configs.sh manages them
over the admin API (DescribeClientQuotas / AlterClientQuotas).

    --entity-type users --entity-name alice --alter --add-config producer_byte_rate=1048576
    --entity-type users --entity-name alice --entity-type clients --entity-name app --alter \\
        --add-config consumer_byte_rate=2097152,request_percentage=50
    --entity-type clients --entity-default --alter --delete-config producer_byte_rate
    --entity-type users --entity-name alice --describe
        ->  Quota configs for user-principal 'alice' are producer_byte_rate=1048576.0
    --entity-type ips --entity-name 10.0.0.7 --alter --add-config connection_creation_rate=10

An entity is the ordered pairs of --entity-type with --entity-name / --entity-default (a default is
a null name on the wire, ``<default>`` in ZooKeeper).
"""
from __future__ import annotations

from kbroker.cli.configs import parse_add_config
from kbroker.client.connection import KafkaError

DESCRIBE_CLIENT_QUOTAS, ALTER_CLIENT_QUOTAS = 48, 49
QUOTA_KEYS = ("producer_byte_rate", "consumer_byte_rate", "request_percentage", "controller_mutation_rate")
IP_KEYS = ("connection_creation_rate",)
WIRE_TYPES = {"users": "user", "clients": "client-id", "ips": "ip"}
_LABELS = {"user": "user-principal", "client-id": "client-id", "ip": "ip"}
EXACT, DEFAULT = 0, 1


def _label(entity) -> str:
    return ", ".join(f"the default {_LABELS[t]}" if n is None else f"{_LABELS[t]} '{n}'" for t, n in entity)


async def _send(admin, key, body):
    conn = await admin.cluster.any_connection()
    _, resp = await conn.send(key, body, min(conn.version_for(key), 1))
    return resp


async def describe(admin, entity, out) -> int:
    components = [{"entity_type": t, "match_type": EXACT if n is not None else DEFAULT, "match": n}
                  for t, n in entity]
    resp = await _send(admin, DESCRIBE_CLIENT_QUOTAS, {"components": components, "strict": True})
    if resp["error_code"]:
        raise KafkaError(resp["error_code"], resp.get("error_message"), "describe client quotas")
    for e in resp["entries"] or []:
        got = [(x["entity_type"], x["entity_name"]) for x in e["entity"]]
        values = ", ".join(f"{v['key']}={v['value']}" for v in e["values"])
        print(f"Quota configs for {_label(got)} are {values}", file=out)
    return 0


async def alter(admin, entity, add: dict[str, str], delete: list[str], out) -> int:
    ops = []
    for k, v in add.items():
        try:
            ops.append({"key": k, "value": float(v), "remove": False})
        except ValueError:
            raise ValueError(f"{k}: {v!r} is not a number") from None
    ops += [{"key": k, "value": 0.0, "remove": True} for k in delete]
    if not ops:
        raise ValueError("--alter needs --add-config and/or --delete-config")
    resp = await _send(admin, ALTER_CLIENT_QUOTAS, {"entries": [{
        "entity": [{"entity_type": t, "entity_name": n} for t, n in entity], "ops": ops}], "validate_only": False})
    for e in resp["entries"]:
        if e["error_code"]:
            raise KafkaError(e["error_code"], e.get("error_message"), "alter client quotas")
    kinds = {"user": "user", "client-id": "client", "ip": "ip"}
    names = ", ".join(f"{kinds[t]} {'<default>' if n is None else n}" for t, n in entity)
    print(f"Completed updating config for {names}.", file=out)
    return 0


def is_quota_command(types, add: dict, delete: list) -> bool:
    """Quotas unless it is a users-only command about SCRAM credentials (configs_users)."""
    if types != ["users"]:
        return True
    keys = [*add, *delete]
    return bool(keys) and all(k in QUOTA_KEYS for k in keys)


async def run_quotas(admin, args, entity_types, entity_names, out) -> int:
    if len(entity_types) != len(entity_names):
        raise ValueError("each --entity-type needs its --entity-name or --entity-default")
    if len(set(entity_types)) != len(entity_types) or any(t not in WIRE_TYPES for t in entity_types) or \
            ("ips" in entity_types and len(entity_types) > 1):
        raise ValueError("a client quota entity is users, clients, users then clients, or ips")
    entity = [(WIRE_TYPES[t], n) for t, n in zip(entity_types, entity_names)]
    if args.describe:
        return await describe(admin, entity, out)
    add = parse_add_config(args.add_config) if args.add_config else {}
    delete = [k.strip() for k in args.delete_config.split(",") if k.strip()]
    keys = IP_KEYS if entity_types == ["ips"] else QUOTA_KEYS
    bad = [k for k in [*add, *delete] if k not in keys]
    if bad:
        raise ValueError(f"{', '.join(bad)}: not a quota of this entity ({', '.join(keys)})")
    return await alter(admin, entity, add, delete, out)
