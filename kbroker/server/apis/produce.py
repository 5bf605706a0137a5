"""Produce: validate and append each partition's RecordBatch as received.

The batch bytes are a view into the request frame; ``Log.append_as_leader`` validates them natively
(CRC32C, sizes, counts), stamps offsets and the leader epoch in place and writes them to the segment.
No per-record Python work. acks=0 gets no response, and any error closes the connection (the client
has no other way to learn of it).
"""
from __future__ import annotations

import logging

from ...log.errors import LogAppendError
from ...network.connection import CLOSE, NO_RESPONSE
from ...protocol import api
from ...protocol.errors import Errors
from ..metadata import topic_name_error

log = logging.getLogger(__name__)


def register(broker, handlers):
    # Advertised from v0 (librdkafka 2.0 disables compression when Produce min > 0); served from v3.
    api.advertise(0, 0, 8)
    handlers[0] = lambda conn, header, body: produce(broker, header, body)


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
    now_ms = broker.now_ms()
    failed = False
    responses = []
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
            if err is None:
                if tinfo is None:
                    err = (Errors.INVALID_TOPIC_EXCEPTION if topic_name_error(name)
                           else Errors.UNKNOWN_TOPIC_OR_PARTITION)
                else:
                    pinfo = tinfo.partitions.get(index)
                    if pinfo is None:
                        err = Errors.UNKNOWN_TOPIC_OR_PARTITION
                    elif pinfo.leader != broker.broker_id:
                        err = Errors.NOT_LEADER_OR_FOLLOWER
                    elif p["records"] is None or len(p["records"]) == 0:
                        err = Errors.CORRUPT_MESSAGE
                    elif acks == -1 and len(pinfo.isr) < _min_isr(broker, tinfo):
                        err = Errors.NOT_ENOUGH_REPLICAS
            if err is None:
                lg = broker.logs.get((name, index))
                if lg is None:
                    err = Errors.NOT_LEADER_OR_FOLLOWER
                else:
                    try:
                        r = lg.append_as_leader(p["records"], pinfo.leader_epoch, now_ms)
                    except LogAppendError as e:
                        err = e.error_code
                        res["error_message"] = str(e)
                        if err == Errors.KAFKA_STORAGE_ERROR:
                            log.error("append to %s-%d failed: %s", name, index, e)
                    else:
                        broker.metrics.produced(name, r.last_offset - r.base_offset + 1, len(p["records"]))
                        res["base_offset"] = r.base_offset
                        res["log_append_time_ms"] = r.log_append_time_ms
                        res["log_start_offset"] = r.log_start_offset
                        broker.notifier.appended((name, index))
            if err is not None:
                res["error_code"] = int(err)
                broker.metrics.produce_failed(name)
                failed = True
        responses.append({"name": name, "partition_responses": parts})
    if acks == 0:
        return CLOSE if failed else NO_RESPONSE
    return {"responses": responses, "throttle_time_ms": 0}


def _min_isr(broker, tinfo) -> int:
    v = tinfo.config.get("min.insync.replicas")
    return int(v) if v is not None else broker.config.get("min.insync.replicas")
