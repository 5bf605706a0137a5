"""``kbroker broker-api-versions``: kafka-broker-api-versions.sh — the API versions each broker
advertises (ApiVersions), as Kafka's BrokerApiVersionsCommand prints them:

    127.0.0.1:9092 (id: 0 rack: null) -> (
    	Produce(0): 0 to 8 [usable: 8],
    	...
    	OffsetDelete(47): 0 [usable: 0]
    )

"usable" is the highest version both sides know; the client side is Kafka 3.9's range for every API
this project has a schema of (kbroker.protocol.messages), and those of them a broker does not
advertise are listed as ``Name(key): UNSUPPORTED``. (The Java tool also lists the APIs it knows and
we have no schema of, as UNSUPPORTED.)
"""
from __future__ import annotations

from kbroker.cli.tool import run_tool, add_command_config, command_security
from kbroker.client.connection import KafkaError
from kbroker.client.cluster import Cluster
from kbroker.protocol.messages import API_NAMES, REQUESTS


def register(subparsers) -> None:
    p = subparsers.add_parser("broker-api-versions", help="API versions of every broker (kafka-broker-api-versions.sh)",
                              description="This tool helps to retrieve broker version information.")
    p.add_argument("--bootstrap-server", required=True, help="REQUIRED: The server to connect to.")
    add_command_config(p)
    p.set_defaults(func=main)


def api_versions_text(advertised: dict[int, tuple[int, int]]) -> str:
    """NodeApiVersions.toString(true): one line per API key in ascending order."""
    lines = {}
    for key, (lo, hi) in advertised.items():
        name = API_NAMES.get(key)
        text = f"{name}({key}): " if name else f"UNKNOWN({key}): "
        text += str(lo) if lo == hi else f"{lo} to {hi}"
        if name:
            oldest, latest = REQUESTS[key].valid
            if latest < lo:
                text += " [unusable: node too new]"
            elif hi < oldest:
                text += " [unusable: node too old]"
            else:
                text += f" [usable: {min(latest, hi)}]"
        lines[key] = text
    for key, name in API_NAMES.items():
        lines.setdefault(key, f"{name}({key}): UNSUPPORTED")
    return "(\n\t" + ",\n\t".join(lines[k] for k in sorted(lines)) + "\n)"


async def run(args, out) -> int:
    cluster = Cluster(args.bootstrap_server, client_id="kbroker-broker-api-versions",
                      security=command_security(args))
    try:
        await cluster.fetch_metadata([])
        for bid in sorted(cluster.brokers):
            b = cluster.brokers[bid]
            node = f"{b.host}:{b.port} (id: {bid} rack: {b.rack if b.rack is not None else 'null'})"
            try:
                conn = await cluster.connection(bid)
            except (KafkaError, OSError) as e:
                print(f"{node} -> ERROR: {e}", file=out)
                continue
            print(f"{node} -> {api_versions_text(conn.broker_versions)}", file=out)
    finally:
        await cluster.close()
    return 0


def main(args) -> int:
    return run_tool(run, args)
