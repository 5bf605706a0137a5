"""Transaction APIs: thin handlers over ``kbroker.coordinator.transaction`` (the coordinator) and the
group coordinator (TxnOffsetCommit). InitProducerId with a transactional id is in ``producer_ids.py``.

WriteTxnMarkers is the partition leader's (``txn_markers.py``); wrapped here, as Kafka's API layer does,
so that a marker written to a ``__consumer_offsets`` partition commits or drops the group offsets the
transaction's TxnOffsetCommit left pending.

PRODUCER_FENCED (KIP-588) is answered as INVALID_PRODUCER_EPOCH to the versions that predate it
(AddPartitionsToTxn, AddOffsetsToTxn, EndTxn below v2), as Kafka does. Authorization as Kafka's handlers:
Write on the transactional id (AddPartitions, AddOffsets, EndTxn, TxnOffsetCommit), Write on each added
topic, Read on the group (AddOffsets, TxnOffsetCommit) and on each committed topic, ClusterAction for
AddPartitionsToTxn v4, Describe on the transactional id (DescribeTransactions, ListTransactions).
"""
from __future__ import annotations

from ...protocol.errors import Errors
from ...topics import GROUP_METADATA_TOPIC
from . import authz, txn_markers

E = Errors


def fenced_for(code: int, version: int, first_fenced_version: int) -> int:
    if code == E.PRODUCER_FENCED and version < first_fenced_version:
        return int(E.INVALID_PRODUCER_EPOCH)
    return int(code)


def _known_partition(md, topic: str, p: int) -> bool:
    t = md.topics.get(topic)
    return t is not None and p in t.partitions


def _tid_denied(broker, conn, tid, op=authz.WRITE) -> bool:
    return not authz.allowed(broker, conn, op, authz.TRANSACTIONAL_ID, tid)


async def _add_or_verify(broker, conn, tid, pid, epoch, topics, verify_only: bool, version: int) -> list:
    """One transaction's AddPartitionsToTxn: the topic results (every partition answered)."""
    tps = [(t["name"], p) for t in topics for p in t["partitions"]]
    md = broker.metadata
    refused = set() if verify_only else authz.refused(broker, conn, authz.WRITE, authz.TOPIC, {t for t, _ in tps})
    unknown = {tp for tp in tps if tp[0] not in refused and not _known_partition(md, *tp)}
    if not verify_only and _tid_denied(broker, conn, tid):
        codes = {tp: int(E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED) for tp in tps}
    elif unknown or refused:
        # As Kafka: the refused and unknown partitions say so, the others were not attempted.
        codes = {tp: int(E.TOPIC_AUTHORIZATION_FAILED if tp[0] in refused else
                         E.UNKNOWN_TOPIC_OR_PARTITION if tp in unknown else E.OPERATION_NOT_ATTEMPTED)
                 for tp in tps}
    elif verify_only:
        codes = broker.txn_coordinator.verify_partitions(tid, pid, epoch, tps)
    else:
        code = fenced_for(await broker.txn_coordinator.add_partitions(tid, pid, epoch, tps), version, 2)
        codes = {tp: code for tp in tps}
    by_topic: dict[str, list] = {}
    for t, p in tps:
        by_topic.setdefault(t, []).append({"partition_index": p, "partition_error_code": codes[(t, p)]})
    return [{"name": t, "results_by_partition": rs} for t, rs in by_topic.items()]


async def add_partitions_to_txn(broker, conn, header, body):
    v = header.api_version
    if v < 4:
        results = await _add_or_verify(broker, conn, body["v3_and_below_transactional_id"],
                                       body["v3_and_below_producer_id"], body["v3_and_below_producer_epoch"],
                                       body["v3_and_below_topics"], False, v)
        return {"throttle_time_ms": 0, "results_by_topic_v3_and_below": results}
    if not authz.cluster(broker, conn, authz.CLUSTER_ACTION):     # v4 is broker to broker
        return {"throttle_time_ms": 0, "error_code": int(E.CLUSTER_AUTHORIZATION_FAILED), "results_by_transaction": []}
    out = []
    for txn in body["transactions"]:
        results = await _add_or_verify(broker, conn, txn["transactional_id"], txn["producer_id"], txn["producer_epoch"],
                                       txn["topics"], bool(txn["verify_only"]), v)
        out.append({"transactional_id": txn["transactional_id"], "topic_results": results})
    return {"throttle_time_ms": 0, "error_code": 0, "results_by_transaction": out}


async def add_offsets_to_txn(broker, conn, header, body):
    if _tid_denied(broker, conn, body["transactional_id"]):
        return {"throttle_time_ms": 0, "error_code": int(E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)}
    if not authz.allowed(broker, conn, authz.READ, authz.GROUP, body["group_id"]):
        return {"throttle_time_ms": 0, "error_code": int(E.GROUP_AUTHORIZATION_FAILED)}
    code = await broker.txn_coordinator.add_offsets(body["transactional_id"], body["producer_id"],
                                                    body["producer_epoch"], body["group_id"])
    return {"throttle_time_ms": 0, "error_code": fenced_for(code, header.api_version, 2)}


async def end_txn(broker, conn, header, body):
    if _tid_denied(broker, conn, body["transactional_id"]):
        return {"throttle_time_ms": 0, "error_code": int(E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)}
    code = await broker.txn_coordinator.end_txn(body["transactional_id"], body["producer_id"], body["producer_epoch"],
                                                bool(body["committed"]))
    return {"throttle_time_ms": 0, "error_code": fenced_for(code, header.api_version, 2)}


async def txn_offset_commit(broker, conn, header, body):
    wanted, order = {}, []
    for t in body["topics"]:
        for p in t["partitions"]:
            tp = (t["name"], p["partition_index"])
            order.append(tp)
            wanted[tp] = (p["committed_offset"], p.get("committed_leader_epoch", -1), p["committed_metadata"])
    if _tid_denied(broker, conn, body["transactional_id"]):
        codes = {tp: int(E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED) for tp in wanted}
    elif not authz.allowed(broker, conn, authz.READ, authz.GROUP, body["group_id"]):
        codes = {tp: int(E.GROUP_AUTHORIZATION_FAILED) for tp in wanted}
    else:
        refused = authz.refused(broker, conn, authz.READ, authz.TOPIC, {t for t, _ in wanted})
        codes = {tp: int(E.TOPIC_AUTHORIZATION_FAILED) for tp in wanted if tp[0] in refused}
        allowed = {tp: v for tp, v in wanted.items() if tp[0] not in refused}
        if allowed:
            codes.update(await broker.group_coordinator.txn_commit_offsets(
                body["group_id"], body["producer_id"], body["producer_epoch"], body.get("generation_id", -1),
                body.get("member_id", ""), body.get("group_instance_id"), allowed))
    topics: dict = {}
    for tp in order:
        topics.setdefault(tp[0], []).append({"partition_index": tp[1], "error_code": codes.get(tp, 0)})
    return {"throttle_time_ms": 0, "topics": [{"name": n, "partitions": ps} for n, ps in topics.items()]}


def describe_transactions(broker, conn, header, body):
    tc = broker.txn_coordinator
    out = []
    for tid in body["transactional_ids"]:
        if _tid_denied(broker, conn, tid, authz.DESCRIBE):
            out.append({"error_code": int(E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED), "transactional_id": tid,
                        "transaction_state": "", "transaction_timeout_ms": 0, "transaction_start_time_ms": -1,
                        "producer_id": -1, "producer_epoch": -1, "topics": []})
        else:
            out.append(tc.describe(tid))
    return {"throttle_time_ms": 0, "transaction_states": out}


async def list_transactions(broker, conn, header, body):
    err, unknown, found = await broker.txn_coordinator.list_transactions(
        body.get("state_filters") or [], body.get("producer_id_filters") or [], body.get("duration_filter", -1))
    return {"throttle_time_ms": 0, "error_code": err, "unknown_state_filters": unknown,
            "transaction_states": [{"transactional_id": tid, "producer_id": pid, "transaction_state": state}
                                   for tid, pid, state in found
                                   if not _tid_denied(broker, conn, tid, authz.DESCRIBE)]}


def write_txn_markers(broker, conn, header, body):
    resp = txn_markers.write_txn_markers(broker, conn, header, body)
    if isinstance(resp, dict):
        _complete_group_offsets(broker, body, resp)
        return resp

    async def later():
        r = await resp
        _complete_group_offsets(broker, body, r)
        return r
    return later()


def _complete_group_offsets(broker, body, resp) -> None:
    # The answer lists the request's markers in order.
    for req, res in zip(body["markers"], resp["markers"]):
        written = [p["partition_index"] for t in res["topics"] if t["name"] == GROUP_METADATA_TOPIC
                   for p in t["partitions"] if p["error_code"] == 0]
        if written:
            broker.group_coordinator.on_transaction_completed(req["producer_id"], written,
                                                              bool(req["transaction_result"]))
