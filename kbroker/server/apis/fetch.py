"""Fetch (long-poll, KIP-74, sendfile), ListOffsets and OffsetForLeaderEpoch.

A Fetch answer lists every requested partition (sessionless clients such as kafka-python discard an
answer that does not) and carries each partition's data as ``FileRegions`` into segment files: the
network layer sends them with ``sendfile``. When less than ``min_bytes`` is available the request waits,
without blocking anything else, until an append to one of its partitions or ``max_wait_ms``.
"""
from __future__ import annotations

import asyncio

from ...log.errors import OffsetOutOfRange
from ...protocol.errors import Errors
from ...protocol.types import FileRegions
from ...record import BatchError
from ...replica.partition import follower_key

LATEST, EARLIEST, MAX_TIMESTAMP = -1, -2, -3


# The API table's handlers (kbroker/server/apis/__init__.py).
def handle(broker, conn, header, body):
    return fetch(broker, header, body)


def handle_list_offsets(broker, conn, header, body):
    return list_offsets(broker, header, body)


def handle_offset_for_leader_epoch(broker, conn, header, body):
    return offset_for_leader_epoch(broker, header, body)


def _leader_log(broker, topic, partition, current_leader_epoch=-1):
    """-> (Log, Partition, error code): reads are served by the leader only (KIP-320 epoch checks
    in ReplicaManager.fetch_partition)."""
    p, err = broker.replica_manager.fetch_partition((topic, partition), current_leader_epoch)
    if err:
        if p is None and broker.metadata.partition(topic, partition) is None:
            err = Errors.UNKNOWN_TOPIC_OR_PARTITION
        return None, p, err
    return p.log, p, Errors.NONE


def fetch(broker, header, body):
    if body["session_id"] != 0:
        # We never hand out fetch sessions (KIP-227 lets a broker answer every fetch in full).
        return {"throttle_time_ms": 0, "error_code": Errors.FETCH_SESSION_ID_NOT_FOUND, "session_id": 0,
                "responses": []}
    replica_id = body.get("replica_id", -1)    # v15+ would carry it in replica_state; we serve <= 11
    if replica_id >= 0:
        _record_follower(broker, body, replica_id)
    responses, size, errors = _read(broker, body)
    if size >= body["min_bytes"] or body["max_wait_ms"] <= 0 or errors:
        return _answer(responses)
    # Register for wake-ups now: the coroutine below starts only on a later loop turn, and an
    # append (or HW move) in between must not leave this fetch asleep for max_wait_ms.
    if replica_id >= 0:     # a follower waits for appends, a consumer for the high watermark
        tps = [follower_key(t["topic"], p["partition"]) for t in body["topics"] for p in t["partitions"]]
    else:
        tps = [(t["topic"], p["partition"]) for t in body["topics"] for p in t["partitions"]]
    return _long_poll(broker, body, tps, broker.notifier.waiter(tps))


async def _long_poll(broker, body, tps, fut):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + body["max_wait_ms"] / 1000
    while True:
        remaining = deadline - loop.time()
        if fut is None:
            fut = broker.notifier.waiter(tps)
        try:
            if remaining > 0:
                await asyncio.wait_for(asyncio.shield(fut), remaining)
        except asyncio.TimeoutError:
            pass
        finally:
            broker.notifier.forget(tps, fut)
            fut = None
        responses, size, errors = _read(broker, body)
        if size >= body["min_bytes"] or errors or loop.time() >= deadline:
            return _answer(responses)


def _record_follower(broker, body, replica_id):
    """A follower's fetch offset is its log end offset: HW and ISR bookkeeping on the leader."""
    rm = broker.replica_manager
    for t in body["topics"]:
        for p in t["partitions"]:
            part, err = rm.fetch_partition((t["topic"], p["partition"]), p.get("current_leader_epoch", -1))
            if not err:
                rm.record_follower_fetch(part, replica_id, p["fetch_offset"], p.get("current_leader_epoch", -1))


def _answer(responses):
    return {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "responses": responses}


# Room kept below 2^31-1 for the response's own fields (about 100 bytes a partition): record data
# never brings an answer near the int32 size limit, whatever max_bytes and the broker keys allow.
_RESPONSE_DATA_CEILING = 0x7FFFFFFF - (64 << 20)


def _read(broker, body):
    """Read every requested partition -> (responses, total bytes, any error)."""
    replica_id = body.get("replica_id", -1)
    follower = replica_id >= 0
    # As Kafka: the request's max_bytes, capped by fetch.max.bytes for consumers and by
    # replica.fetch.response.max.bytes for followers (a broker key the request cannot raise).
    broker_max = broker.config.get("replica.fetch.response.max.bytes" if follower else "fetch.max.bytes")
    budget = min(body.get("max_bytes", 0x7FFFFFFF), broker_max, _RESPONSE_DATA_CEILING)
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
            lg, part, err = _leader_log(broker, name, index, p.get("current_leader_epoch", -1))
            if not err and follower and replica_id not in part.replicas:
                err = Errors.NOT_LEADER_OR_FOLLOWER      # only assigned replicas read past the HW
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
                # Consumers never see past the high watermark (= LSO until transactions exist);
                # followers read up to the log end.
                data = lg.read(p["fetch_offset"], limit, lg.log_end_offset if follower else hw,
                               min_one_batch=first)
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
    # A partition named twice is ambiguous: Kafka answers INVALID_REQUEST for each mention.
    seen, duplicates = set(), set()
    for t in body["topics"]:
        for p in t["partitions"]:
            tp = (t["name"], p["partition_index"])
            (duplicates if tp in seen else seen).add(tp)
    topics = []
    for t in body["topics"]:
        parts = []
        for p in t["partitions"]:
            index = p["partition_index"]
            res = {"partition_index": index, "error_code": 0, "timestamp": -1, "offset": -1, "leader_epoch": -1}
            parts.append(res)
            if duplicates and (t["name"], index) in duplicates:
                res["error_code"] = int(Errors.INVALID_REQUEST)
                continue
            lg, pinfo, err = _leader_log(broker, t["name"], index, p.get("current_leader_epoch", -1))
            if err:
                res["error_code"] = int(err)
                continue
            ts = p["timestamp"]
            if not pinfo.leader_hw_ready():
                # A new leader's HW may be below what the previous leader exposed (KIP-207).
                res["error_code"] = int(Errors.OFFSET_NOT_AVAILABLE)
                continue
            if ts == LATEST:
                res["offset"] = lg.high_watermark        # = LSO for read_committed without transactions
                res["leader_epoch"] = pinfo.leader_epoch
            elif ts == EARLIEST:
                res["offset"] = lg.log_start_offset
                res["leader_epoch"] = pinfo.leader_epoch
            else:
                try:
                    found = lg.offset_for_timestamp(ts)
                except BatchError as e:
                    # e.g. a stored batch that inflates past the decompression cap: an error code for
                    # this partition, not an exception that closes the connection
                    res["error_code"] = int(e.error_code)
                    continue
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
