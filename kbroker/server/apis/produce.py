"""Produce: check names, then hand each partition's RecordBatch to the ReplicaManager.

The batch bytes are a view into the request frame; the leader's ``Log.append_as_leader`` validates
them natively (CRC32C, sizes, counts), stamps offsets and the leader epoch in place and writes them
to the segment. No per-record Python work. acks=0/1 are answered at once; acks=all when the high
watermark covers the batches (replica/manager.py). acks=0 gets no response, and any error closes
the connection (the client has no other way to learn of it).
"""
from __future__ import annotations

import logging

from ...network.connection import CLOSE, NO_RESPONSE
from ...protocol import api
from ...protocol.errors import Errors
from ..metadata import topic_name_error

log = logging.getLogger(__name__)


def handle(broker, conn, header, body):
    """The API table's handler (kbroker/server/apis/__init__.py)."""
    return produce(broker, header, body)


def produce(broker, header, body):
    acks = body["acks"]
    version = header.api_version
    if version < api.PRODUCE_MIN_SERVED:
        code = Errors.UNSUPPORTED_VERSION   # v0-2 carry magic 0/1 message sets, which we never store
    elif acks not in (-1, 0, 1):
        code = Errors.INVALID_REQUIRED_ACKS
    else:
        code = None
    md = broker.metadata
    partitions = broker.replica_manager.partitions
    failed = False
    responses = []
    entries = {}
    slots = []          # (tp, response dict) of the partitions handed to the ReplicaManager
    for topic in body["topic_data"]:
        name = topic["name"]
        tinfo = md.topics.get(name)
        parts = []
        for p in topic["partition_data"]:
            index = p["index"]
            res = {"index": index, "error_code": 0, "base_offset": -1, "log_append_time_ms": -1,
                   "log_start_offset": -1}
            parts.append(res)
            err = code
            tp = (name, index)
            if err is None:
                # The replica manager first (as Kafka): LeaderAndIsr may be applied before the
                # UpdateMetadata that tells the cache about a new topic.
                if tp not in partitions and (tinfo is None or index not in tinfo.partitions):
                    err = (Errors.INVALID_TOPIC_EXCEPTION if tinfo is None and topic_name_error(name)
                           else Errors.UNKNOWN_TOPIC_OR_PARTITION)
                elif p["records"] is None or len(p["records"]) == 0:
                    err = Errors.CORRUPT_MESSAGE
            if err is None:
                if tp in entries:
                    err = Errors.INVALID_RECORD      # the same partition twice in one request
                else:
                    entries[tp] = p["records"]
                    slots.append((tp, res))
                    continue
            res["error_code"] = int(err)
            broker.metrics.produce_failed(name)
            failed = True
        responses.append({"name": name, "partition_responses": parts})
    if entries:
        results = broker.replica_manager.append_records(entries, acks, body["timeout_ms"])
        if not isinstance(results, dict):
            return _finish_later(broker, results, slots, responses)
        failed |= _fill(broker, results, slots)
    if acks == 0:
        return CLOSE if failed else NO_RESPONSE
    return {"responses": responses, "throttle_time_ms": 0}


def _fill(broker, results, slots) -> bool:
    failed = False
    for tp, res in slots:
        r = results[tp]
        if r.error_code:
            res["error_code"] = int(r.error_code)
            if r.error_message:
                res["error_message"] = r.error_message
            broker.metrics.produce_failed(tp[0])
            failed = True
        else:
            res["base_offset"] = r.base_offset
            res["log_append_time_ms"] = r.log_append_time_ms
            res["log_start_offset"] = r.log_start_offset
    return failed


async def _finish_later(broker, future, slots, responses):
    """acks=all: answer once the high watermark covers every batch (or it failed / timed out)."""
    _fill(broker, await future, slots)
    return {"responses": responses, "throttle_time_ms": 0}
