"""DescribeProducers (61, v0): the active producers of partitions led here, from each log's producer
state (kafka-transactions.sh describe-producers; KIP-664's way to find hanging transactions).

Per producer: id, epoch, the last sequence and timestamp of its newest retained batch (-1 when it has
none, e.g. known from a marker only), the coordinator epoch of its last marker, and the first offset of
its ongoing transaction (-1: none). Errors per partition as Kafka's: UNKNOWN_TOPIC_OR_PARTITION (not
hosted here), NOT_LEADER_OR_FOLLOWER.
"""
from __future__ import annotations

from ...protocol.errors import Errors
from . import authz


def describe_producers(broker, conn, header, body):
    partitions = broker.replica_manager.partitions
    refused = authz.refused(broker, conn, authz.READ, authz.TOPIC, [t["name"] for t in body["topics"]])
    topics = []
    for t in body["topics"]:
        name = t["name"]
        parts = []
        for index in t["partition_indexes"]:
            res = {"partition_index": index, "error_code": 0, "error_message": None, "active_producers": []}
            parts.append(res)
            if name in refused:
                res["error_code"] = int(Errors.TOPIC_AUTHORIZATION_FAILED)
                continue
            p = partitions.get((name, index))
            if p is None:
                res["error_code"] = int(Errors.UNKNOWN_TOPIC_OR_PARTITION)
                continue
            if not p.is_leader:
                res["error_code"] = int(Errors.NOT_LEADER_OR_FOLLOWER)
                continue
            res["active_producers"] = [_producer(e) for e in p.log.producer_state.producers.values()]
        topics.append({"name": name, "partitions": parts})
    return {"throttle_time_ms": 0, "topics": topics}


def _producer(entry):
    last = entry.batches[-1] if entry.batches else None
    return {"producer_id": entry.producer_id, "producer_epoch": entry.epoch,
            "last_sequence": last.last_seq if last is not None else -1,
            "last_timestamp": entry.last_timestamp,
            "coordinator_epoch": entry.coordinator_epoch,
            "current_txn_start_offset": entry.current_txn_first_offset}
