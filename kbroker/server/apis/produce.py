"""Produce: check names, then hand each partition's RecordBatch to the ReplicaManager.

The batch bytes are a view into the request frame; the leader's ``Log.append_as_leader`` validates
them natively (CRC32C, sizes, counts), stamps offsets and the leader epoch in place and writes them
to the segment. No per-record Python work. acks=0/1 are answered at once; acks=all when the high
watermark covers the batches (replica/manager.py). A compressed batch is decompressed and checked
on a worker thread and a large one written on its log dir's writer thread; such requests are
answered once appended (per partition, in arrival order). acks=0 gets no response, and any error closes
the connection (the client has no other way to learn of it).
"""
from __future__ import annotations

import asyncio
import logging

from ..._native.request import encode_produce_response
from ...network.connection import CLOSE, NO_RESPONSE
from ...protocol import api
from ...protocol.errors import Errors
from ...log.errors import LogAppendError
from ...replica.delayed import DelayedProduce
from ...replica.manager import UNDECIDED, PartitionResult
from ..metadata import topic_name_error
from . import authz, leader_hints

log = logging.getLogger(__name__)

_ACKS = frozenset((-1, 0, 1))


def handle(broker, conn, header, body):
    """The API table's handler (kbroker/server/apis/__init__.py): the reference path, from the
    generic codec's dict to a response dict."""
    return produce(broker, header, body, conn)


def handle_native(broker, conn, req):
    """Produce v3-11 parsed natively (kbroker._native.request.ProduceRequest) -> the encoded response
    as [bytes], NO_RESPONSE, CLOSE, or an awaitable of one of them (acks=all). The same policy as
    ``produce`` (``execute``); only parsing and encoding differ, and tests/test_native_differential.py
    holds both to the same bytes."""
    out = execute(broker, req.api_version, req.acks, req.timeout_ms, req.topics, conn, req.transactional_id)
    if out is NO_RESPONSE or out is CLOSE:
        return out
    if not isinstance(out, list):
        return _encode_later(broker, conn, req.api_version, req.correlation_id, out)
    return _encode(broker, conn, req.api_version, req.correlation_id, out)


def _encode(broker, conn, version, correlation_id, out):
    """The answer rows encoded natively; v10+ rows that name the current leader (KIP-951's tagged
    fields) through the reference encoder."""
    if version >= 10 and any(res[1] in leader_hints.PRODUCE_CODES for _name, parts in out for res in parts):
        return api.encode_response(api.ApiKey.PRODUCE, version, correlation_id,
                                   _as_dict(out, (broker, getattr(conn, "listener_name", None))))
    return [encode_produce_response(version, correlation_id, out)]


async def _encode_later(broker, conn, version, correlation_id, awaitable):
    out = await awaitable
    if out is NO_RESPONSE or out is CLOSE:        # acks=0 whose appends were queued off the loop
        return out
    return _encode(broker, conn, version, correlation_id, out)


def fast_write_failed(broker, conn, leader, error, version, correlation_id, acks, timeout_ms, out, row, slots,
                      rest, parked=()):
    """The native path's append (ext/request.pyx, FastProduce) could not write one partition's batch
    (OSError ``error``; that segment's state is as before): what append_as_leader, append_records and
    execute do then. ``out``: execute's answer rows in request order, those of the partitions appended
    before it filled in; ``row``: the failed partition's (KAFKA_STORAGE_ERROR is written into it);
    ``slots``/``rest``: (tp, row) and {tp: records} of the partitions after it, not appended yet, which
    go through append_records as in execute's loop; ``parked``: the acks=-1 partitions appended before
    it that wait for the high watermark, (Partition, required offset, tp, row, base offset, append
    time, log start) each, their rows unfilled: they get one DelayedProduce, as append_records' pending.
    -> the encoded answer, CLOSE for acks=0, or an awaitable of either."""
    lg = leader.log
    tp = leader.tp
    try:
        lg._write_failed(lg.segments[-1], error)
    except LogAppendError as e:
        broker.replica_manager._storage_failed(tp, lg, e)
        row[1] = int(e.error_code)
        row[5] = e.message or None
    broker.metrics.produce_failed(tp[0])
    rm = broker.replica_manager
    waits = []                  # (results or their awaitable, slots)
    if parked:
        held = {t: PartitionResult(UNDECIDED, base, at, start) for _p, _r, t, _row, base, at, start in parked}
        d = DelayedProduce(held, len(parked), rm.loop or asyncio.get_running_loop(), timeout_ms, rm._timed_out)
        for p, required, _t, _row, _b, _a, _s in parked:
            p.waiters.append((required, d))
        waits.append((d.future, [(t, r) for _p, _q, t, r, _b, _a, _s in parked]))
    if rest:
        waits.append((rm.append_records(rest, acks, timeout_ms, source=conn), slots))
    if any(not isinstance(results, dict) for results, _slots in waits):
        return _encode_later(broker, conn, version, correlation_id, _finish_all(broker, waits, out, acks))
    for results, part in waits:
        _fill(broker, results, part)
    if acks == 0:
        return CLOSE
    return _encode(broker, conn, version, correlation_id, out)


def produce(broker, header, body, conn=None):
    topics = [(t["name"], [(p["index"], p["records"]) for p in t["partition_data"]]) for t in body["topic_data"]]
    out = execute(broker, header.api_version, body["acks"], body["timeout_ms"], topics, conn,
                  body.get("transactional_id"))
    if out is NO_RESPONSE or out is CLOSE:
        return out
    # v10+ (KIP-951): NOT_LEADER_OR_FOLLOWER rows name the current leader
    hints = (broker, getattr(conn, "listener_name", None)) if header.api_version >= 10 else None
    if not isinstance(out, list):
        return _as_dict_later(out, hints)
    return _as_dict(out, hints)


async def _as_dict_later(awaitable, hints):
    out = await awaitable
    if out is NO_RESPONSE or out is CLOSE:
        return out
    return _as_dict(out, hints)


def _as_dict(out, hints=None):
    responses = []
    leaders = set()
    for name, parts in out:
        prs = []
        for index, code, base, append_time, start, message in parts:
            res = {"index": index, "error_code": code, "base_offset": base, "log_append_time_ms": append_time,
                   "log_start_offset": start}
            if message is not None:
                res["error_message"] = message
            if hints is not None and code in leader_hints.PRODUCE_CODES:
                res["current_leader"] = leader_hints.current_leader(hints[0], name, index)
                leaders.add(res["current_leader"]["leader_id"])
            prs.append(res)
        responses.append({"name": name, "partition_responses": prs})
    body = {"responses": responses, "throttle_time_ms": 0}
    if leaders:
        body["node_endpoints"] = leader_hints.node_endpoints(hints[0], hints[1], leaders)
    return body


def execute(broker, version, acks, timeout_ms, topics, conn=None, transactional_id=None, refused=None):
    """Policy of one Produce request, whichever path parsed it. ``topics``: [(name, [(index, records
    or None), ...]), ...]. -> NO_RESPONSE or CLOSE (acks=0), the answer [(name, [[index, error_code,
    base_offset, log_append_time_ms, log_start_offset, error_message], ...]), ...] in request order, or
    an awaitable of that answer (acks=all waiting for the high watermark, or appends queued off the
    loop). ``conn``: the request's connection, whose batches to a partition keep their order.
    ``transactional_id``: the request's; with ``ReplicaManager.txn_verifier`` set, the batches that would
    start a transaction on a partition are verified first (``_verify_first``). ``refused``: {tp: error
    code} of partitions answered with that error and not appended (a failed verification)."""
    if transactional_id is not None and refused is None and broker.replica_manager.txn_verifier is not None:
        plan = _to_verify(broker, topics)
        if plan:
            return _verify_first(broker, version, acks, timeout_ms, topics, conn, transactional_id, plan)
    if refused is None and len(topics) == 1 and version >= api.PRODUCE_MIN_SERVED and acks in _ACKS:
        # The common request: one partition of one topic, which this broker hosts. The same policy
        # as the loop below with none of its error branches taken, minus its bookkeeping.
        name, pdata = topics[0]
        if len(pdata) == 1:
            index, records = pdata[0]
            tp = (name, index)
            if records and tp in broker.replica_manager.partitions and \
                    (broker.authorizer is None or authz.allowed(broker, conn, authz.WRITE, authz.TOPIC, name)):
                results = broker.replica_manager.append_records({tp: records}, acks, timeout_ms, source=conn)
                if type(results) is dict:
                    r = results[tp]
                    if not r.error_code:         # appended: _fill's success row, without its call
                        if acks == 0:
                            return NO_RESPONSE
                        return [(name, [[index, 0, r.base_offset, r.log_append_time_ms, r.log_start_offset,
                                         None]])]
                res = [index, 0, -1, -1, -1, None]
                out = [(name, [res])]
                slots = [(tp, res)]
                if not isinstance(results, dict):
                    return _finish_later(broker, results, slots, out, acks, False)
                failed = _fill(broker, results, slots)
                if acks == 0:
                    return CLOSE if failed else NO_RESPONSE
                return out
    if version < api.PRODUCE_MIN_SERVED:
        code = Errors.UNSUPPORTED_VERSION   # v0-2 carry magic 0/1 message sets, which we never store
    elif acks not in (-1, 0, 1):
        code = Errors.INVALID_REQUIRED_ACKS
    else:
        code = None
    md = broker.metadata
    partitions = broker.replica_manager.partitions
    failed = False
    out = []
    entries = {}
    slots = []          # (tp, result row) of the partitions handed to the ReplicaManager
    for name, pdata in topics:
        tinfo = md.topics.get(name)
        parts = []
        denied = code is None and not authz.allowed(broker, conn, authz.WRITE, authz.TOPIC, name)
        for index, records in pdata:
            res = [index, 0, -1, -1, -1, None]
            parts.append(res)
            err = Errors.TOPIC_AUTHORIZATION_FAILED if denied else code
            tp = (name, index)
            if err is None:
                # The replica manager first (as Kafka): LeaderAndIsr may be applied before the
                # UpdateMetadata that tells the cache about a new topic.
                if tp not in partitions and (tinfo is None or index not in tinfo.partitions):
                    err = (Errors.INVALID_TOPIC_EXCEPTION if tinfo is None and topic_name_error(name)
                           else Errors.UNKNOWN_TOPIC_OR_PARTITION)
                elif records is None or len(records) == 0:
                    err = Errors.CORRUPT_MESSAGE
            if err is None and refused and tp in refused:
                err = refused[tp]
            if err is None:
                if tp in entries:
                    err = Errors.INVALID_RECORD      # the same partition twice in one request
                else:
                    entries[tp] = records
                    slots.append((tp, res))
                    continue
            res[1] = int(err)
            broker.metrics.produce_failed(name)
            failed = True
        out.append((name, parts))
    if entries:
        results = broker.replica_manager.append_records(entries, acks, timeout_ms, source=conn)
        if not isinstance(results, dict):
            # acks=all waiting for the HW, or appends queued off the loop (compressed or large
            # batches, or behind such a batch of the same partition)
            return _finish_later(broker, results, slots, out, acks, failed)
        failed |= _fill(broker, results, slots)
    if acks == 0:
        return CLOSE if failed else NO_RESPONSE
    return out


_ATTR_TRANSACTIONAL = 0x10


def _to_verify(broker, topics) -> dict:
    """{(producer_id, epoch): [(tp, log)]} of the transactional batches that would start a transaction
    on a partition led here (KIP-890 part 1)."""
    plan = {}
    partitions = broker.replica_manager.partitions
    for name, pdata in topics:
        for index, records in pdata:
            # header: attributes at byte 21, producer id at 43, producer epoch at 51 (RecordBatch v2)
            if records is None or len(records) < 61 or not records[22] & _ATTR_TRANSACTIONAL:
                continue
            p = partitions.get((name, index))
            if p is None or not p.is_leader:
                continue
            pid = int.from_bytes(records[43:51], "big", signed=True)
            epoch = int.from_bytes(records[51:53], "big", signed=True)
            if pid >= 0 and p.log.producer_state.needs_verification(pid):
                plan.setdefault((pid, epoch), []).append(((name, index), p.log))
    return plan


async def _verify_first(broker, version, acks, timeout_ms, topics, conn, transactional_id, plan):
    """Ask the transaction coordinator (``ReplicaManager.txn_verifier``: an async callable
    (transactional_id, producer_id, producer_epoch, [tp]) -> {tp: error code}, set by the coordinator's
    side) whether each partition is in the producer's transaction; refuse those it denies, and those a
    marker reached meanwhile (INVALID_TXN_STATE), append the others."""
    verifier = broker.replica_manager.txn_verifier
    refused = {}
    for (pid, epoch), parts in plan.items():
        guards = [(tp, lg, lg.producer_state.begin_verification(pid)) for tp, lg in parts]
        try:
            codes = await verifier(transactional_id, pid, epoch, [tp for tp, _lg, _g in guards])
        except Exception:       # noqa: BLE001 - the coordinator could not be asked: retriable for the client
            log.warning("verifying %s in the transaction of %r failed", [tp for tp, _l, _g in guards],
                        transactional_id, exc_info=True)
            codes = {tp: Errors.COORDINATOR_NOT_AVAILABLE for tp, _l, _g in guards}
        for tp, lg, guard in guards:
            code = codes.get(tp, Errors.INVALID_TXN_STATE)
            if code == 0 and not lg.producer_state.verified(pid, guard):
                code = Errors.INVALID_TXN_STATE
            if code:
                refused[tp] = code
    out = execute(broker, version, acks, timeout_ms, topics, conn, transactional_id, refused)
    if out is NO_RESPONSE or out is CLOSE or isinstance(out, list):
        return out
    return await out


def _fill(broker, results, slots) -> bool:
    failed = False
    for tp, res in slots:
        r = results[tp]
        if r.error_code:
            res[1] = int(r.error_code)
            res[5] = r.error_message or None
            broker.metrics.produce_failed(tp[0])
            failed = True
        else:
            res[2] = r.base_offset
            res[3] = r.log_append_time_ms
            res[4] = r.log_start_offset
    return failed


async def _finish_all(broker, waits, out, acks):
    """fast_write_failed's answer once each of ``waits`` ((results or their awaitable, slots)) is
    decided; a batch failed there already (acks=0: a close)."""
    for results, slots in waits:
        _fill(broker, results if isinstance(results, dict) else await results, slots)
    return CLOSE if acks == 0 else out


async def _finish_later(broker, future, slots, out, acks, failed):
    """Answer once every batch is appended (and for acks=all, covered by the high watermark, or
    it failed / timed out). acks=0: nothing, or a close if a batch failed."""
    failed |= _fill(broker, await future, slots)
    if acks == 0:
        return CLOSE if failed else NO_RESPONSE
    return out
