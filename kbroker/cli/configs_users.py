"""``kbroker configs --entity-type users``: SCRAM credentials as kafka-configs.sh manages them over the
admin API (DescribeUserScramCredentials / AlterUserScramCredentials).

    --alter --add-config 'SCRAM-SHA-512=[iterations=8192,password=secret]'   (iterations default 4096)
    --alter --delete-config SCRAM-SHA-512
    --describe   ->  SCRAM credential configs for user-principal 'alice' are SCRAM-SHA-512=iterations=8192
"""
from __future__ import annotations

from kbroker.cli.configs import parse_add_config
from kbroker.security.sasl.scram import MECHANISMS, MIN_ITERATIONS


def _credential(mechanism: str, text: str) -> tuple[str, int]:
    fields = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        k, sep, v = item.partition("=")
        if not sep:
            raise ValueError(f"{mechanism}: expected password=... and iterations=..., got {item!r}")
        fields[k.strip()] = v
    if "password" not in fields:
        raise ValueError(f"{mechanism}: the credential needs password=...")
    try:
        iterations = int(fields.get("iterations", MIN_ITERATIONS))
    except ValueError:
        raise ValueError(f"{mechanism}: iterations must be an integer") from None
    return fields["password"], iterations


async def run_users(admin, args, out) -> int:
    if args.entity_default:
        raise ValueError("--entity-default is not supported for users' SCRAM credentials")
    user = args.entity_name
    if args.describe:
        creds = await admin.describe_user_scram_credentials(None)
        mine = creds.get(user, {})
        text = ", ".join(f"{m}=iterations={i}" for m, i in sorted(mine.items()))
        print(f"SCRAM credential configs for user-principal '{user}' are {text}", file=out)
        return 0
    add = parse_add_config(args.add_config) if args.add_config else {}
    delete = [k.strip() for k in args.delete_config.split(",") if k.strip()]
    for key in [*add, *delete]:
        if key not in MECHANISMS:
            raise ValueError(f"{key}: only SCRAM credentials ({', '.join(MECHANISMS)}) are user configs here")
    if not add and not delete:
        raise ValueError("--alter needs --add-config and/or --delete-config")
    upserts = [(user, m, *_credential(m, text)) for m, text in add.items()]
    await admin.alter_user_scram_credentials(upserts, [(user, m) for m in delete])
    print(f"Completed updating config for user {user}.", file=out)
    return 0
