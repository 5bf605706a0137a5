"""WriteTxnMarkers (27, v0-1): the transaction coordinator asks each partition leader to end a
producer's transaction with a COMMIT or ABORT control batch.

Per partition the leader appends the marker (``ReplicaManager.append_markers`` -> ``Log.append_control``),
which is replicated like any batch, ends the producer's ongoing transaction (the last stable offset moves
past it) and, for an ABORT, adds the transaction to the aborted-transaction index. The answer for a
partition comes once the high watermark covers its marker (acks=all, ``request.timeout.ms``), as Kafka's.
Errors as Kafka's: UNKNOWN_TOPIC_OR_PARTITION (not hosted here), NOT_LEADER_OR_FOLLOWER,
INVALID_PRODUCER_EPOCH (a marker older than the producer's epoch), TRANSACTION_COORDINATOR_FENCED (an
older coordinator epoch), KAFKA_STORAGE_ERROR, REQUEST_TIMED_OUT / NOT_ENOUGH_REPLICAS_AFTER_APPEND
from the wait. A partition named twice in one marker is answered once per naming with one append.
"""
from __future__ import annotations

from ...protocol.errors import Errors
from . import authz


def write_txn_markers(broker, conn, header, body):
    if not authz.cluster(broker, conn, authz.CLUSTER_ACTION):
        # only brokers (the coordinators) write markers; a client's forged request changes nothing
        denied = int(Errors.CLUSTER_AUTHORIZATION_FAILED)
        return {"markers": [{"producer_id": m["producer_id"], "topics": [
            {"name": t["name"], "partitions": [{"partition_index": i, "error_code": denied}
                                               for i in t["partition_indexes"]]} for t in m["topics"]]}
            for m in body["markers"]]}
    rm = broker.replica_manager
    entries = []
    seen = set()
    for m in body["markers"]:
        pid = m["producer_id"]
        for t in m["topics"]:
            for index in t["partition_indexes"]:
                key = (pid, t["name"], index)
                if key not in seen:
                    seen.add(key)
                    entries.append(((t["name"], index), pid, m["producer_epoch"], bool(m["transaction_result"]),
                                    m["coordinator_epoch"]))
    # One request may end several producers' transactions on one partition: each marker is its own
    # append, in request order (ReplicaManager.append_markers takes a partition once per call).
    calls = []
    batch = []
    used = set()
    for e in entries:
        if e[0] in used:
            calls.append(batch)
            batch = []
            used = set()
        batch.append(e)
        used.add(e[0])
    if batch:
        calls.append(batch)
    timeout_ms = broker.config.get("request.timeout.ms")
    outcomes = [(batch, rm.append_markers(batch, timeout_ms)) for batch in calls]
    if all(isinstance(r, dict) for _b, r in outcomes):
        return _answer(body, outcomes)
    return _answer_later(body, outcomes)


async def _answer_later(body, outcomes):
    done = []
    for batch, r in outcomes:
        done.append((batch, r if isinstance(r, dict) else await r))
    return _answer(body, done)


def _answer(body, outcomes):
    codes = {}
    for batch, results in outcomes:
        for tp, pid, *_rest in batch:
            codes[(pid, tp)] = int(results[tp].error_code)
    markers = []
    for m in body["markers"]:
        pid = m["producer_id"]
        markers.append({"producer_id": pid, "topics": [
            {"name": t["name"], "partitions": [
                {"partition_index": i, "error_code": codes[(pid, (t["name"], i))]}
                for i in t["partition_indexes"]]}
            for t in m["topics"]]})
    return {"markers": markers}
