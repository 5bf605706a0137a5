"""Fetch (long-poll, KIP-74, sendfile), ListOffsets and OffsetForLeaderEpoch.

A Fetch answer lists every requested partition (sessionless clients such as kafka-python discard an
answer that does not) and carries each partition's data as ``FileRegions`` into segment files: the
network layer sends them with ``sendfile``. When less than ``min_bytes`` is available the request waits,
without blocking anything else, until an append to one of its partitions or ``max_wait_ms``.
"""
from __future__ import annotations

import asyncio

from ...log.errors import OffsetOutOfRange
from ...protocol import api
from ...protocol.errors import Errors
from ...protocol.types import FileRegions

LATEST, EARLIEST, MAX_TIMESTAMP = -1, -2, -3


def register(broker, handlers):
    api.advertise(1, 4, 11)
    api.advertise(2, 1, 5)
    api.advertise(23, 2, 3)
    handlers[1] = lambda conn, header, body: fetch(broker, header, body)
    handlers[2] = lambda conn, header, body: list_offsets(broker, header, body)
    handlers[23] = lambda conn, header, body: offset_for_leader_epoch(broker, header, body)


def _leader_log(broker, topic, partition, current_leader_epoch=-1):
    """-> (Log, PartitionInfo, error code). Epoch checks per KIP-320."""
    pinfo = broker.metadata.partition(topic, partition)
    if pinfo is None:
        return None, None, Errors.UNKNOWN_TOPIC_OR_PARTITION
    if pinfo.leader != broker.broker_id:
        return None, pinfo, Errors.NOT_LEADER_OR_FOLLOWER
    if current_leader_epoch >= 0 and current_leader_epoch != pinfo.leader_epoch:
        return None, pinfo, (Errors.FENCED_LEADER_EPOCH if current_leader_epoch < pinfo.leader_epoch
                             else Errors.UNKNOWN_LEADER_EPOCH)
    lg = broker.logs.get((topic, partition))
    if lg is None:
        return None, pinfo, Errors.NOT_LEADER_OR_FOLLOWER
    return lg, pinfo, Errors.NONE


def fetch(broker, header, body):
    if body["session_id"] != 0:
        # We never hand out fetch sessions (KIP-227 lets a broker answer every fetch in full).
        return {"throttle_time_ms": 0, "error_code": Errors.FETCH_SESSION_ID_NOT_FOUND, "session_id": 0,
                "responses": []}
    responses, size, errors = _read(broker, body)
    if size >= body["min_bytes"] or body["max_wait_ms"] <= 0 or errors:
        return _answer(responses)
    return _long_poll(broker, body)


async def _long_poll(broker, body):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + body["max_wait_ms"] / 1000
    tps = [(t["topic"], p["partition"]) for t in body["topics"] for p in t["partitions"]]
    while True:
        remaining = deadline - loop.time()
        fut = broker.notifier.waiter(tps)
        try:
            if remaining > 0:
                await asyncio.wait_for(asyncio.shield(fut), remaining)
        except asyncio.TimeoutError:
            pass
        finally:
            broker.notifier.forget(tps, fut)
        responses, size, errors = _read(broker, body)
        if size >= body["min_bytes"] or errors or loop.time() >= deadline:
            return _answer(responses)


def _answer(responses):
    return {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "responses": responses}


def _read(broker, body):
    """Read every requested partition -> (responses, total bytes, any error)."""
    budget = body.get("max_bytes", 0x7FFFFFFF)
    first = True
    total = 0
    errors = False
    responses = []
    for t in body["topics"]:
        name = t["topic"]
        parts = []
        for p in t["partitions"]:
            index = p["partition"]
            res = {"partition_index": index, "error_code": 0, "high_watermark": -1, "last_stable_offset": -1,
                   "log_start_offset": -1, "aborted_transactions": None, "preferred_read_replica": -1,
                   "records": b""}   # never null: librdkafka rejects MessageSetSize -1
            parts.append(res)
            lg, _pinfo, err = _leader_log(broker, name, index, p.get("current_leader_epoch", -1))
            if err:
                res["error_code"] = int(err)
                errors = True
                continue
            hw = lg.high_watermark
            res["high_watermark"] = hw
            res["last_stable_offset"] = hw           # no transactions: LSO = HW (read_committed too)
            res["log_start_offset"] = lg.log_start_offset
            limit = min(p["partition_max_bytes"], budget)
            try:
                # Consumers never see past the high watermark (= LSO until transactions exist).
                data = lg.read(p["fetch_offset"], limit, hw, min_one_batch=first)
            except OffsetOutOfRange:
                res["error_code"] = int(Errors.OFFSET_OUT_OF_RANGE)
                errors = True
                continue
            if data.size:
                broker.metrics.fetched(name, data.size)
                res["records"] = FileRegions(data.regions)
                total += data.size
                budget -= data.size
                first = False
            else:
                res["records"] = b""
        responses.append({"topic": name, "partitions": parts})
    return responses, total, errors


def list_offsets(broker, header, body):
    topics = []
    for t in body["topics"]:
        parts = []
        for p in t["partitions"]:
            index = p["partition_index"]
            res = {"partition_index": index, "error_code": 0, "timestamp": -1, "offset": -1, "leader_epoch": -1}
            parts.append(res)
            lg, pinfo, err = _leader_log(broker, t["name"], index, p.get("current_leader_epoch", -1))
            if err:
                res["error_code"] = int(err)
                continue
            ts = p["timestamp"]
            if ts == LATEST:
                res["offset"] = lg.high_watermark        # = LSO for read_committed without transactions
                res["leader_epoch"] = pinfo.leader_epoch
            elif ts == EARLIEST:
                res["offset"] = lg.log_start_offset
                res["leader_epoch"] = pinfo.leader_epoch
            else:
                found = lg.offset_for_timestamp(ts)
                if found is not None and found[0] < lg.high_watermark:
                    res["offset"], res["timestamp"] = found[0], found[1]
                    res["leader_epoch"] = pinfo.leader_epoch
        topics.append({"name": t["name"], "partitions": parts})
    return {"throttle_time_ms": 0, "topics": topics}


def offset_for_leader_epoch(broker, header, body):
    topics = []
    for t in body["topics"]:
        parts = []
        for p in t["partitions"]:
            index = p["partition"]
            res = {"error_code": 0, "partition": index, "leader_epoch": -1, "end_offset": -1}
            parts.append(res)
            lg, _pinfo, err = _leader_log(broker, t["topic"], index, p.get("current_leader_epoch", -1))
            if err:
                res["error_code"] = int(err)
                continue
            epoch, end = lg.end_offset_for_epoch(p["leader_epoch"])
            res["leader_epoch"], res["end_offset"] = epoch, end
        topics.append({"topic": t["topic"], "partitions": parts})
    return {"throttle_time_ms": 0, "topics": topics}
