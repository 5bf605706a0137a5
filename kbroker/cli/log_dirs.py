"""``kbroker log-dirs``: kafka-log-dirs.sh --describe — every broker's log dirs and their partitions
(DescribeLogDirs to each broker).

Output as Kafka's LogDirsCommand: ``Querying brokers for log directories information``,
``Received log directory information from brokers 0,1,2``, then one compact JSON document
``{"brokers":[{"broker":0,"logDirs":[{"partitions":[{"partition":"t-0","size":0,"offsetLag":0,
"isFuture":false}],"error":null,"logDir":"/data"}]}],"version":1}``. The Java tool builds that document
from HashMaps, so keys, log dirs and partitions come in Java's HashMap iteration order; this tool
reproduces it (``java_hashmap_order``) so that the two print the same bytes.
"""
from __future__ import annotations

import json

from kbroker.cli.topics import describe_error
from kbroker.client.admin import Admin
from kbroker.cli.tool import run_tool, add_command_config, command_security


def register(subparsers) -> None:
    p = subparsers.add_parser("log-dirs", help="describe the brokers' log directories (kafka-log-dirs.sh)",
                              description="This tool helps to query log directory usage on the specified brokers.")
    p.add_argument("--bootstrap-server", required=True, help="REQUIRED: the server(s) to use for bootstrapping")
    add_command_config(p)
    p.add_argument("--describe", action="store_true", required=True, help="Describe the specified log directories "
                   "on the specified brokers.")
    p.add_argument("--topic-list", default="", help="The list of topics to be queried in the form "
                   '"topic1,topic2,topic3". All topics will be queried if no topic list is specified')
    p.add_argument("--broker-list", default="", help="The list of brokers to be queried in the form "
                   '"0,1,2". All brokers in the cluster will be queried if no broker list is specified')
    p.set_defaults(func=main)


# ---- Java's HashMap iteration order ----------------------------------------------------------------

def java_string_hash(s: str) -> int:
    """java.lang.String.hashCode over UTF-16 code units (unsigned 32-bit)."""
    data = s.encode("utf-16-be")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h


def topic_partition_hash(topic: str, partition: int) -> int:
    """org.apache.kafka.common.TopicPartition.hashCode (as an unsigned 32-bit value)."""
    return (31 * ((31 + partition) & 0xFFFFFFFF) + java_string_hash(topic)) & 0xFFFFFFFF


def java_hashmap_order(keys: list, hash_of) -> list:
    """``keys`` (in insertion order) as a java.util.HashMap with default settings iterates them: by
    bucket (the spread hash masked to the table size, which doubles past 3/4 full from 16), then in
    insertion order within a bucket (a resize splits buckets keeping that order)."""
    capacity = 16
    while len(keys) > capacity * 3 // 4:
        capacity *= 2

    def bucket(k):
        h = hash_of(k)
        return (h ^ (h >> 16)) & (capacity - 1)
    return [k for _, _, k in sorted((bucket(k), i, k) for i, k in enumerate(keys))]


def _json_map(pairs: list[tuple[str, object]]) -> dict:
    keys = java_hashmap_order([k for k, _ in pairs], java_string_hash)
    values = dict(pairs)
    return {k: values[k] for k in keys}


def format_as_json(by_broker: dict, topics: set[str]) -> str:
    brokers = []
    for bid in sorted(by_broker):    # a HashMap of small Integer keys iterates in ascending order
        dirs = by_broker[bid]
        log_dirs = []
        for path in java_hashmap_order(list(dirs), java_string_hash):
            d = dirs[path]
            tps = java_hashmap_order(list(d.replicas), lambda tp: topic_partition_hash(*tp))
            partitions = [_json_map([("partition", f"{t}-{p}"), ("size", d.replicas[(t, p)].size),
                                     ("offsetLag", d.replicas[(t, p)].offset_lag),
                                     ("isFuture", d.replicas[(t, p)].is_future)])
                          for t, p in tps if not topics or t in topics]
            error = None if d.error is None else describe_error(d.error)[1]
            log_dirs.append(_json_map([("logDir", path), ("error", error), ("partitions", partitions)]))
        brokers.append(_json_map([("broker", bid), ("logDirs", log_dirs)]))
    return json.dumps(_json_map([("version", 1), ("brokers", brokers)]), separators=(",", ":"))


def _id_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


async def run(args, out) -> int:
    topics = {t for t in args.topic_list.split(",") if t}
    async with Admin(args.bootstrap_server, client_id="kbroker-log-dirs", security=command_security(args)) as admin:
        cluster = sorted((await admin.describe_cluster()).brokers)
        asked = _id_list(args.broker_list)
        missing = [b for b in asked if b not in cluster]
        if missing:
            print(f"ERROR: The given brokers do not exist from --broker-list: {','.join(map(str, missing))}. "
                  f"Current existent brokers: {','.join(map(str, cluster))}", file=out)
            return 0
        brokers = sorted(set(asked)) if asked else cluster
        print("Querying brokers for log directories information", file=out)
        by_broker = await admin.describe_log_dirs(brokers)
    print(f"Received log directory information from brokers {','.join(map(str, brokers))}", file=out)
    print(format_as_json(by_broker, topics), file=out)
    return 0


def main(args) -> int:
    return run_tool(run, args)
