"""``kbroker transactions``: kafka-transactions.sh — list, describe, describe-producers, abort, find-hanging.

- ``list``: ListTransactions (66) to every broker; TransactionalId / Coordinator / ProducerId / TransactionState.
- ``describe --transactional-id``: FindCoordinator (key type 1), then DescribeTransactions (65).
- ``describe-producers --topic --partition [--broker-id]``: DescribeProducers (61) to the leader (or a
  given replica).
- ``abort --topic --partition`` with ``--start-offset`` (the producer found by DescribeProducers) or
  ``--producer-id --producer-epoch --coordinator-epoch``: an ABORT marker through WriteTxnMarkers (27) to
  the partition leader, as Kafka's Admin.abortTransaction does.
- ``find-hanging --broker-id | --topic [--partition]``: producers whose open transaction on a partition
  is older than ``--max-transaction-timeout`` minutes and that their coordinator does not know as ongoing
  with that partition (KIP-664).

Tables as Kafka's TransactionsCommand: each column left-aligned to its widest cell, then a tab.
"""
from __future__ import annotations

import asyncio
import time

from kbroker.cli.tool import ToolError, run_tool
from kbroker.client.cluster import Cluster
from kbroker.client.connection import KafkaError, raise_for_error
from kbroker.protocol.errors import Errors

FIND_COORDINATOR, WRITE_TXN_MARKERS, DESCRIBE_PRODUCERS = 10, 27, 61
DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = 65, 66
TRANSACTION_KEY = 1
_RETRY = {Errors.COORDINATOR_LOAD_IN_PROGRESS, Errors.COORDINATOR_NOT_AVAILABLE, Errors.NOT_COORDINATOR}


def register(subparsers) -> None:
    p = subparsers.add_parser("transactions", help="list, describe and abort transactions (kafka-transactions.sh)",
                              description="This tool is used to analyze the transactional state of producers "
                                          "in the cluster. It can be used to detect and recover from hanging "
                                          "transactions.")
    p.add_argument("--bootstrap-server", required=True, help="hostname and port for the broker to connect to, "
                                                             "in the form `host:port`")
    p.add_argument("--command-config", help="(accepted for compatibility; no client properties are needed)")
    sub = p.add_subparsers(dest="txn_command", metavar="COMMAND", required=True)
    sub.add_parser("list", help="list transactions")
    d = sub.add_parser("describe", help="describe the state of an active transactional-id")
    d.add_argument("--transactional-id", required=True, help="transactional id")
    dp = sub.add_parser("describe-producers", help="describe the states of active producers for a topic partition")
    dp.add_argument("--topic", required=True, help="topic name")
    dp.add_argument("--partition", required=True, type=int, help="partition number")
    dp.add_argument("--broker-id", type=int, help="optional broker id to describe the producer state on a "
                                                  "specific replica")
    a = sub.add_parser("abort", help="abort a hanging transaction (requires administrative privileges)")
    a.add_argument("--topic", required=True, help="topic name")
    a.add_argument("--partition", required=True, type=int, help="partition number")
    a.add_argument("--start-offset", type=int, help="start offset of the transaction to abort")
    a.add_argument("--producer-id", type=int, help="producer id of the transaction to abort")
    a.add_argument("--producer-epoch", type=int, help="producer epoch of the transaction to abort")
    a.add_argument("--coordinator-epoch", type=int, help="coordinator epoch of the transaction to abort")
    f = sub.add_parser("find-hanging", help="find hanging transactions")
    f.add_argument("--broker-id", type=int, help="broker id to search for hanging transactions")
    f.add_argument("--topic", help="topic name to limit search to (required if --partition is specified)")
    f.add_argument("--partition", type=int, help="partition number")
    f.add_argument("--max-transaction-timeout", type=int, default=15,
                   help="maximum transaction timeout in minutes to limit the scope of the search (15 minutes by "
                        "default)")
    p.set_defaults(func=main)


def table(headers: list[str], rows: list[list], out) -> None:
    cells = [[str(c) for c in r] for r in [headers, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for r in cells:
        print("".join(f"{c:<{w}}\t" for c, w in zip(r, widths)), file=out)


async def _coordinator(cluster: Cluster, tid: str) -> int:
    for _ in range(100):
        _, r = await cluster.send_any(FIND_COORDINATOR, {"key": tid, "key_type": TRANSACTION_KEY})
        if r["error_code"] == 0:
            return r["node_id"]
        if r["error_code"] not in _RETRY:
            raise_for_error(r["error_code"], r.get("error_message"), f"FindCoordinator({tid})")
        await asyncio.sleep(0.1)
    raise ToolError(f"no transaction coordinator for {tid}")


async def _request(cluster: Cluster, node: int, api_key: int, body: dict) -> dict:
    conn = await cluster.connection(node)
    _, r = await conn.send(api_key, body)
    return r


async def _describe(cluster: Cluster, tid: str) -> tuple[int, dict]:
    for _ in range(100):
        node = await _coordinator(cluster, tid)
        r = (await _request(cluster, node, DESCRIBE_TRANSACTIONS, {"transactional_ids": [tid]}))["transaction_states"][0]
        if r["error_code"] not in _RETRY:
            return node, r
        await asyncio.sleep(0.1)
    raise ToolError(f"the coordinator of {tid} did not answer")


async def list_cmd(cluster: Cluster, out) -> int:
    await cluster.refresh_metadata()
    rows = []
    for node in sorted(cluster.brokers):
        r = await _request(cluster, node, LIST_TRANSACTIONS, {"state_filters": [], "producer_id_filters": []})
        raise_for_error(r["error_code"], None, f"ListTransactions on broker {node}")
        rows += [[t["transactional_id"], node, t["producer_id"], t["transaction_state"]]
                 for t in r["transaction_states"]]
    table(["TransactionalId", "Coordinator", "ProducerId", "TransactionState"], rows, out)
    return 0


async def describe_cmd(cluster: Cluster, tid: str, out) -> int:
    node, r = await _describe(cluster, tid)
    raise_for_error(r["error_code"], None, f"DescribeTransactions({tid})")
    start = r["transaction_start_time_ms"]
    now = int(time.time() * 1000)
    parts = ",".join(f"{t['topic']}-{p}" for t in r["topics"] for p in t["partitions"])
    table(["CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch", "TransactionState",
           "TransactionTimeoutMs", "CurrentTransactionStartTimeMs", "TransactionDurationMs", "TopicPartitions"],
          [[node, r["transactional_id"], r["producer_id"], r["producer_epoch"], r["transaction_state"],
            r["transaction_timeout_ms"], start if start >= 0 else "None", now - start if start >= 0 else "None",
            parts]], out)
    return 0


async def _producers(cluster: Cluster, topic: str, partition: int, broker_id: int | None = None) -> list[dict]:
    await cluster.fetch_metadata([topic], allow_auto_topic_creation=False)
    node = broker_id if broker_id is not None else cluster.leader_for(topic, partition)
    if node is None or node < 0:
        raise ToolError(f"no leader for {topic}-{partition}")
    r = await _request(cluster, node, DESCRIBE_PRODUCERS,
                       {"topics": [{"name": topic, "partition_indexes": [partition]}]})
    pr = r["topics"][0]["partitions"][0]
    raise_for_error(pr["error_code"], pr.get("error_message"), f"DescribeProducers({topic}-{partition})")
    return pr["active_producers"]


async def describe_producers_cmd(cluster: Cluster, args, out) -> int:
    rows = [[p["producer_id"], p["producer_epoch"], p["coordinator_epoch"], p["last_sequence"],
             p["last_timestamp"], p["current_txn_start_offset"] if p["current_txn_start_offset"] >= 0 else "None"]
            for p in await _producers(cluster, args.topic, args.partition, args.broker_id)]
    table(["ProducerId", "ProducerEpoch", "LatestCoordinatorEpoch", "LastSequence", "LastTimestamp",
           "CurrentTransactionStartOffset"], rows, out)
    return 0


async def abort_cmd(cluster: Cluster, args, out) -> int:
    if args.start_offset is not None:
        found = [p for p in await _producers(cluster, args.topic, args.partition)
                 if p["current_txn_start_offset"] == args.start_offset]
        if not found:
            raise ToolError(f"Could not find any open transactions starting at offset {args.start_offset} on "
                            f"partition {args.topic}-{args.partition}")
        pid, epoch, coord_epoch = found[0]["producer_id"], found[0]["producer_epoch"], found[0]["coordinator_epoch"]
    elif None not in (args.producer_id, args.producer_epoch, args.coordinator_epoch):
        pid, epoch, coord_epoch = args.producer_id, args.producer_epoch, args.coordinator_epoch
    else:
        raise ToolError("abort needs --start-offset, or --producer-id, --producer-epoch and --coordinator-epoch")
    await cluster.fetch_metadata([args.topic], allow_auto_topic_creation=False)
    leader = cluster.leader_for(args.topic, args.partition)
    r = await _request(cluster, leader, WRITE_TXN_MARKERS, {"markers": [
        {"producer_id": pid, "producer_epoch": epoch, "transaction_result": False, "coordinator_epoch": coord_epoch,
         "topics": [{"name": args.topic, "partition_indexes": [args.partition]}]}]})
    code = r["markers"][0]["topics"][0]["partitions"][0]["error_code"]
    raise_for_error(code, None, f"WriteTxnMarkers({args.topic}-{args.partition})")
    return 0


async def find_hanging_cmd(cluster: Cluster, args, out) -> int:
    if args.partition is not None and args.topic is None:
        raise ToolError("--partition requires --topic")
    if args.broker_id is None and args.topic is None:
        raise ToolError("find-hanging needs --broker-id or --topic")
    await cluster.fetch_metadata(None, allow_auto_topic_creation=False)
    parts = []
    for name, tm in sorted(cluster.topics.items()):
        if args.topic is not None and name != args.topic:
            continue
        for p, pm in sorted(tm.partitions.items()):
            if args.partition is not None and p != args.partition:
                continue
            if args.broker_id is not None and args.broker_id not in pm.replicas:
                continue
            parts.append((name, p))
    now = int(time.time() * 1000)
    max_ms = args.max_transaction_timeout * 60_000
    candidates = []
    for name, p in parts:
        for prod in await _producers(cluster, name, p, args.broker_id):
            start = prod["current_txn_start_offset"]
            if start >= 0 and now - prod["last_timestamp"] >= max_ms:
                candidates.append((name, p, prod))
    hanging = []
    if candidates:
        ongoing = await _ongoing_by_producer(cluster)
        for name, p, prod in candidates:
            tid = ongoing.get(prod["producer_id"])
            if tid is not None:
                _node, d = await _describe(cluster, tid)
                if (d["error_code"] == 0 and d["producer_epoch"] == prod["producer_epoch"]
                        and d["transaction_state"] == "Ongoing"
                        and any(t["topic"] == name and p in t["partitions"] for t in d["topics"])):
                    continue   # the coordinator knows it: it will complete or time out
            hanging.append([name, p, prod["producer_id"], prod["producer_epoch"], prod["coordinator_epoch"],
                            prod["current_txn_start_offset"], prod["last_timestamp"],
                            (now - prod["last_timestamp"]) // 60_000])
    table(["Topic", "Partition", "ProducerId", "ProducerEpoch", "CoordinatorEpoch", "StartOffset", "LastTimestamp",
           "Duration(min)"], hanging, out)
    return 0


async def _ongoing_by_producer(cluster: Cluster) -> dict[int, str]:
    out = {}
    for node in sorted(cluster.brokers):
        try:
            r = await _request(cluster, node, LIST_TRANSACTIONS, {"state_filters": ["Ongoing"],
                                                                  "producer_id_filters": []})
        except KafkaError:
            continue
        for t in r["transaction_states"]:
            out[t["producer_id"]] = t["transactional_id"]
    return out


async def run(args, out) -> int:
    cluster = Cluster(args.bootstrap_server, client_id="kbroker-transactions")
    try:
        cmd = args.txn_command
        if cmd == "list":
            return await list_cmd(cluster, out)
        if cmd == "describe":
            return await describe_cmd(cluster, args.transactional_id, out)
        if cmd == "describe-producers":
            return await describe_producers_cmd(cluster, args, out)
        if cmd == "abort":
            return await abort_cmd(cluster, args, out)
        return await find_hanging_cmd(cluster, args, out)
    finally:
        await cluster.close()


def main(args) -> int:
    return run_tool(run, args)
