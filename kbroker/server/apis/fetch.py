"""Fetch (long-poll, KIP-74, sendfile), ListOffsets and OffsetForLeaderEpoch.

A sessionless Fetch answer lists every requested partition (a client discards an answer that does not);
a fetch session's (KIP-227: the cache in server/fetch_sessions.py, the policy in ``_session_fetch``) lists
only what changed. An answer carries each partition's data as ``FileRegions`` into segment files: the
network layer sends them with ``sendfile``. When less than ``min_bytes`` is available the request waits,
without blocking anything else, until an append to one of its partitions or ``max_wait_ms``.
"""
from __future__ import annotations

import asyncio
import bisect
import functools
import time

from ..._native.request import encode_fetch_response
from ...log.errors import OffsetOutOfRange
from ...network.connection import EncodeOffLoop
from ...protocol import api
from ...protocol.errors import Errors
from ...protocol.types import FileRegions
from ...record import BatchError
from ...replica.longpoll import long_poll
from ...replica.partition import follower_key
from .. import fetch_sessions as fs
from . import authz, leader_hints, offset_queries, replica_selector

# ListOffsets' special timestamps; earliest-local (KIP-405) and latest-tiered (KIP-1005) answer as a broker
# without tiered storage: every record is local (the log start) and none is tiered (offset -1).
LATEST, EARLIEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED = -1, -2, -3, -4, -5
_DENIED = int(Errors.TOPIC_AUTHORIZATION_FAILED)
_NOT_LEADER = Errors.NOT_LEADER_OR_FOLLOWER
_UNKNOWN_ID = int(Errors.UNKNOWN_TOPIC_ID)


_now_ms = fs.now_ms


# The API table's handlers (kbroker/server/apis/__init__.py).
def handle(broker, conn, header, body):
    return fetch(broker, header, body, conn)


def handle_list_offsets(broker, conn, header, body):
    return list_offsets(broker, header, body, conn)


def handle_offset_for_leader_epoch(broker, conn, header, body):
    return offset_for_leader_epoch(broker, header, body, conn)


_NONE = frozenset()


def _refused(broker, conn, req):
    """The topics of a Fetch this connection may not read: a consumer needs Read on each topic, a
    follower ClusterAction (without it every partition is refused, as Kafka answers)."""
    if broker.authorizer is None:
        return _NONE
    if req.replica_id >= 0:
        return _NONE if authz.cluster(broker, conn, authz.CLUSTER_ACTION) else {n for n, _ in req.topics}
    return authz.refused(broker, conn, authz.READ, authz.TOPIC, [n for n, _ in req.topics])


def _leader_log(broker, topic, partition, current_leader_epoch=-1):
    """-> (Log, Partition, error code): reads are served by the leader only (KIP-320 epoch checks
    in ReplicaManager.fetch_partition)."""
    p, err = broker.replica_manager.fetch_partition((topic, partition), current_leader_epoch)
    if err:
        if p is None and broker.metadata.partition(topic, partition) is None:
            err = Errors.UNKNOWN_TOPIC_OR_PARTITION
        return None, p, err
    return p.log, p, Errors.NONE


class _Args:
    """The fields of a Fetch request the policy reads, in the shape the native parser gives them
    (kbroker._native.request.FetchRequest): topics = [(name, [(partition, current_leader_epoch,
    fetch_offset, log_start_offset, partition_max_bytes), ...]), ...]. v13+ names topics by id: ``ids``
    maps the names of known ids back to them, ``unknown`` lists the request's topics whose id this broker
    does not know, (topic_id, [partition, ...]) each."""

    __slots__ = ("replica_id", "max_wait_ms", "min_bytes", "max_bytes", "isolation_level", "session_id",
                 "session_epoch", "topics", "forgotten", "ids", "unknown", "api_version", "rack_id")

    def __init__(self, body, version=11, topic_ids=None):
        # v15+ carries the follower's id in replica_state (KIP-903)
        self.replica_id = body["replica_state"]["replica_id"] if version >= 15 else body.get("replica_id", -1)
        self.max_wait_ms = body["max_wait_ms"]
        self.min_bytes = body["min_bytes"]
        self.max_bytes = body.get("max_bytes", 0x7FFFFFFF)
        self.isolation_level = body.get("isolation_level", 0)
        self.session_id = body["session_id"]
        self.session_epoch = body.get("session_epoch", -1)
        self.api_version = version
        self.rack_id = body.get("rack_id", "")
        self.ids = {}
        self.unknown = []
        topics = body["topics"]
        # forgotten_topics_data (v7+): [(name, [partition, ...]), ...]; an unknown id forgets nothing
        forgotten = body.get("forgotten_topics_data") or ()
        if version >= 13:
            self.forgotten = [(topic_ids[bytes(t["topic_id"])], t["partitions"]) for t in forgotten
                              if bytes(t["topic_id"]) in topic_ids]
        else:
            self.forgotten = [(t["topic"], t["partitions"]) for t in forgotten]
        if version >= 13:
            known = []
            for t in topics:
                name = topic_ids.get(bytes(t["topic_id"]))
                if name is None:
                    self.unknown.append((t["topic_id"], [p["partition"] for p in t["partitions"]]))
                else:
                    self.ids[name] = t["topic_id"]
                    known.append(dict(t, topic=name))
            topics = known
        self.topics = [(t["topic"], [(p["partition"], p.get("current_leader_epoch", -1), p["fetch_offset"],
                                      p.get("log_start_offset", -1), p["partition_max_bytes"])
                                     for p in t["partitions"]]) for t in topics]


# Fetch v0-3 answers carry magic 0/1 message sets, which kbroker does not convert to (it stores RecordBatch
# v2 only): every partition is answered UNSUPPORTED_VERSION, as Kafka with message.downconversion.enable=false.
FETCH_MIN_CONVERTED = 4


def fetch(broker, header, body, conn=None):
    """The reference path: the generic codec's dict in, a response dict out."""
    version = header.api_version
    if version < FETCH_MIN_CONVERTED:
        return {"throttle_time_ms": 0, "responses": [
            {"topic": t["topic"], "partitions": [_row_dict([p["partition"], int(Errors.UNSUPPORTED_VERSION),
                                                            -1, -1, -1, b""]) for p in t["partitions"]]}
            for t in body["topics"]]}
    args = _Args(body, version, broker.metadata.topic_ids)
    if version < 13:
        answer = _as_dict
    else:
        listener = getattr(conn, "listener_name", None)

        def answer(out):
            return _as_dict_by_id(broker, listener, version, args, out)
    out = execute(broker, args, answer, refused_by=conn)
    if type(out) is tuple:
        return answer(out)
    return out


def _as_dict(out):
    """(error_code, rows[, session_id]) -> the response dict."""
    code, rows = out[0], out[1]
    return {"throttle_time_ms": 0, "error_code": code, "session_id": out[2] if len(out) > 2 else 0, "responses": [
        {"topic": name, "partitions": [_row_dict(res) for res in parts]} for name, parts in rows]}


def _as_dict_by_id(broker, listener, version, args, out):
    """v13+: topics by id, unknown ids' partitions UNKNOWN_TOPIC_ID; v16+ (KIP-951) rows refused as not
    (or no longer) led here name the current leader, and the answer its address."""
    body = _as_dict(out)
    leaders = set()
    for t in body["responses"]:
        name = t.pop("topic")
        t["topic_id"] = args.ids[name]          # a session's topics not in this request: added by _answer_ids
        if version >= 16:
            for row in t["partitions"]:
                if row["error_code"] in leader_hints.FETCH_CODES:
                    row["current_leader"] = leader_hints.current_leader(broker, name, row["partition_index"])
                    leaders.add(row["current_leader"]["leader_id"])
    body["responses"] += [{"topic_id": tid, "partitions": [
        _row_dict([p, int(Errors.UNKNOWN_TOPIC_ID), -1, -1, -1, b""]) for p in parts]} for tid, parts in args.unknown]
    if leaders:
        body["node_endpoints"] = leader_hints.node_endpoints(broker, listener, leaders)
    return body


def _row_dict(res):
    aborted = res[6] if len(res) > 6 else None          # read_committed rows carry a 7th field
    return {"partition_index": res[0], "error_code": res[1], "high_watermark": res[2],
            "last_stable_offset": res[3], "log_start_offset": res[4],
            "preferred_read_replica": res[7] if len(res) > 7 else -1,
            "records": res[5], "aborted_transactions": None if aborted is None else
            [{"producer_id": e[0], "first_offset": e[1]} for e in aborted]}


def handle_native(broker, conn, req):
    """Fetch v4-17 parsed natively (kbroker._native.request.FetchRequest) -> the encoded response
    chunks, or a future of them (long poll). Same policy as ``fetch`` (``execute``); record
    ranges below the server's sendfile threshold are copied into the response so that small fetches
    leave in one write with the other responses of their read. A consumer's fetch answered at once
    (the common small fetch) is read and encoded here, without ``execute`` and ``_encode`` frames."""
    if req.api_version >= 13 and req.ids is None:
        _by_name(req, broker.metadata.topic_ids)
    # v16+ rows refused as not led here name the current leader (KIP-951): the broker's metadata
    encode = _encode if req.api_version < 16 else functools.partial(_encode, broker=broker)
    if req.recorded:
        # A follower's fetch the native path (ext/request.pyx _fetch_fast) checked and recorded
        # (record_follower_fetch's effect) with nothing to read: execute's long poll, nothing again.
        return _poll_recorded(broker, req, conn)
    if req.session_id == 0 and req.session_epoch == -1 and req.replica_id < 0:
        refused = _refused(broker, conn, req)
        rows, size, errors = _read(broker, req, False, refused, conn)
        if size >= req.min_bytes or req.max_wait_ms <= 0 or errors:
            return encode(conn, req, (0, rows))
        return _poll(broker, req, False, encode, conn, refused)
    out = execute(broker, req, encode, conn, conn)
    if type(out) is tuple:
        return encode(conn, req, out)
    return out


def _by_name(req, topic_ids):
    """v13+: the request's topics named (``req.topics``), ``req.ids`` {name: id} and ``req.unknown``
    [(id, [partition, ...])] of the ids this broker does not know, and its forgotten topics named, as
    ``_Args`` resolves them."""
    ids, unknown, known = {}, [], []
    for tid, parts in req.topics:
        name = topic_ids.get(tid)
        if name is None:
            unknown.append((tid, [p[0] for p in parts]))
        else:
            ids[name] = tid
            known.append((name, parts))
    req.topics, req.ids, req.unknown = known, ids, unknown
    if req.forgotten:
        # forgotten_topics_data by id too (the list is the request's own): an unknown id forgets nothing
        req.forgotten[:] = [(topic_ids[tid], parts) for tid, parts in req.forgotten if tid in topic_ids]


def _encode(conn, req, out, broker=None):
    version = req.api_version
    if (req.rack_id and any(len(res) > 7 for _name, parts in out[1] for res in parts)) or \
            (broker is not None and any(res[1] in leader_hints.FETCH_CODES for _name, parts in out[1] for res in parts)):
        # KIP-392 rows name a preferred read replica, which the native encoder leaves at -1; KIP-951
        # rows the current leader (v16+, ``broker`` given), a tagged field it does not write
        body = _as_dict(out) if version < 13 else \
            _as_dict_by_id(broker, getattr(conn, "listener_name", None), version, req, out)
        return api.encode_response(api.ApiKey.FETCH, version, req.correlation_id, body)
    rows = out[1]
    if version >= 13 and req.unknown:
        rows = rows + [(tid, [[p, _UNKNOWN_ID, -1, -1, -1, b""] for p in parts]) for tid, parts in req.unknown]
    chunks, copied = encode_fetch_response(version, req.correlation_id, out[0], rows,
                                           conn.server.sendfile_min_bytes, req.ids, out[2] if len(out) > 2 else 0)
    if copied:
        conn.server.metrics.fetch_copy_bytes += copied
    return chunks


def execute(broker, req, answer=None, conn=None, refused_by=None):
    """Policy of one Fetch request, whichever path parsed it. -> (error_code, rows) with rows =
    [(topic, [[partition_index, error_code, high_watermark, last_stable_offset, log_start_offset,
    records(, aborted_transactions)], ...]), ...] (records: b"" or FileRegions; aborted_transactions,
    read_committed only: the aborted transactions in the range read, log/txn_index.AbortedTxn each),
    or a future of ``answer((error_code, rows))``
    (``answer(conn, req, (error_code, rows))`` when ``conn`` is given; of the pair itself without
    ``answer``) when the request long-polls: the long poll's answer is built (encoded, for the native
    path) in the poll's last callback, with no coroutine around it. (Passing ``conn`` rather than a
    closure over it: no function object is made for the fetches that are answered at once.)
    ``refused_by``: the connection whose ACLs decide (the reference path has no ``conn``).
    A request with fetch session metadata (an id, or an epoch other than -1) is ``_session_fetch``'s,
    which may encode its answer itself (with the session id); a tuple it returns is encoded by the caller."""
    if req.session_id != 0 or req.session_epoch != fs.FINAL_EPOCH:
        return _session_fetch(broker, req, answer, conn, refused_by)
    return _execute(broker, req, answer, conn, refused_by)


def _execute(broker, req, answer, conn, refused_by):
    """``execute`` of a sessionless fetch: every partition listed is read and answered."""
    follower = req.replica_id >= 0
    refused = _refused(broker, refused_by, req)
    # A follower's fetch offset is its log end offset: the first read records it (HW and ISR
    # bookkeeping) for each partition it may read; the long poll's re-reads do not.
    rows, size, errors = _read(broker, req, follower, refused, refused_by)
    if size >= req.min_bytes or req.max_wait_ms <= 0 or errors:
        return (0, rows)
    return _poll(broker, req, follower, answer, conn, refused)


def _poll(broker, req, follower, answer, conn, refused=_NONE, finish=None):
    """``execute``'s long poll: less than min_bytes is available, no error, max_wait_ms > 0.
    ``finish(rows)`` -> the answer's (error_code, rows[, session_id]) (default: (0, rows))."""
    # Register for wake-ups now: the poll's first attempt runs only on a later loop turn, and an
    # append (or HW move) in between must not leave this fetch asleep for max_wait_ms.
    if follower:            # a follower waits for appends, a consumer for the high watermark
        tps = [follower_key(name, p[0]) for name, parts in req.topics for p in parts]
    else:
        tps = [(name, p[0]) for name, parts in req.topics for p in parts]
    return _wait(broker.notifier, tps, req, lambda: _read(broker, req, False, refused, conn), finish, answer, conn)


def _plain(rows):
    return (0, rows)


def _wait(notifier, tps, req, read, finish, answer, conn):
    """A long poll of ``read()`` (-> rows, bytes, any error) woken by ``notifier``'s waiters on ``tps``,
    answered with ``finish(rows)`` (encoded by ``answer`` as ``execute`` describes)."""
    min_bytes = req.min_bytes
    if finish is None:
        finish = _plain
    if answer is None:
        def done(res):
            return finish(res[0])
    elif conn is not None:
        def done(res):
            return answer(conn, req, finish(res[0]))
    else:
        def done(res):
            return answer(finish(res[0]))
    return long_poll(notifier, tps, notifier.waiter(tps), req.max_wait_ms / 1000, read,
                     lambda res: res[1] >= min_bytes or res[2], done)


# ---- fetch sessions (KIP-227; the cache: server/fetch_sessions.py) ----------------------------------------

def throttled_answer(broker, answer: dict) -> dict:
    """A Fetch answer its client's quota throttles, as Kafka answers one: no partitions. A full fetch
    (epoch 0) makes no session: the one its answer made is removed and the answer says session id 0;
    an incremental fetch keeps its session (its id answered, its epoch moved on)."""
    sid = answer.get("session_id") or 0
    if sid:
        s = broker.fetch_sessions.get(sid)
        if s is not None and s.fresh:
            broker.fetch_sessions.remove(sid)
            sid = 0
    return dict(answer, responses=[], session_id=sid)


def _session_fetch(broker, req, answer, conn, refused_by):
    """``execute`` for a request with session metadata: epoch -1 closes the session named (the fetch is
    sessionless), epoch 0 is a full fetch that creates a session (closing the one named), any other
    epoch an incremental fetch of the session named. The answer is encoded here (``answer``), or a
    future of it; ``(error_code, rows, session_id)`` without ``answer``."""
    cache = broker.fetch_sessions       # the broker's (built at its start)
    sid, epoch = req.session_id, req.session_epoch
    if epoch == fs.FINAL_EPOCH or epoch == fs.INITIAL_EPOCH:
        if sid:
            cache.remove(sid)
        if epoch == fs.FINAL_EPOCH or cache.slots <= 0:
            return _execute(broker, req, answer, conn, refused_by)
        return _full_fetch(broker, cache, req, answer, conn, refused_by)
    s = cache.get(sid)
    if s is None:
        return _respond(req, (int(Errors.FETCH_SESSION_ID_NOT_FOUND), [], 0), answer, conn)
    if s.epoch != epoch:
        return _respond(req, (int(Errors.INVALID_FETCH_SESSION_EPOCH), [], 0), answer, conn)
    if s.uses_topic_ids != (req.api_version >= 13):
        return _respond(req, (int(Errors.FETCH_SESSION_TOPIC_ID_ERROR), [], 0), answer, conn)
    ids = getattr(req, "ids", None) or {}
    for name, parts in req.topics:
        for fields in parts:
            s.add(name, fields, ids.get(name))
    for name, indexes in req.forgotten or ():
        for index in indexes:
            s.drop((name, index))
    if not s.parts:
        # everything forgotten: the session ends, and the fetch is sessionless (of nothing)
        cache.remove(sid)
        return _respond(req, (0, [], 0), answer, conn)
    now = _now_ms()
    cache.touch(s, now)
    s.epoch = fs.next_epoch(s.epoch)
    if s.dormant:
        s.resume()
        s.swept_ms = now - s.sweep_ms       # its waiters were away: every partition is read
    return _incremental_fetch(broker, s, req, answer, conn, refused_by, now)


class _View:
    """What ``_read`` and ``_refused`` take of a request, with the topics of a session's read."""
    __slots__ = ("replica_id", "max_bytes", "isolation_level", "topics", "api_version", "rack_id")

    def __init__(self, req, topics):
        self.replica_id, self.max_bytes, self.isolation_level = req.replica_id, req.max_bytes, req.isolation_level
        self.api_version, self.rack_id = req.api_version, req.rack_id
        self.topics = topics


def _respond(req, out, answer, conn):
    """``out`` answered as ``execute``'s callers expect (a tuple when they encode it themselves)."""
    if answer is None:
        return out
    if conn is not None:
        return answer(conn, req, out)
    return answer(out)


def _full_fetch(broker, cache, req, answer, conn, refused_by):
    """Session epoch 0: read as a sessionless fetch; the answer creates the session (when the cache
    has a slot) with every partition listed, remembering what the answer told the client."""
    follower = req.replica_id >= 0
    refused = _refused(broker, refused_by, req)
    rows, size, errors = _read(broker, req, follower, refused, refused_by)
    ids = getattr(req, "ids", None) or {}
    n = sum(len(parts) for _name, parts in req.topics)

    def finish(rows):
        s = cache.create(follower, n, req.api_version >= 13, _now_ms())
        if s is None:
            return (0, rows, 0)
        read = []
        for name, parts in req.topics:
            for fields in parts:
                s.add(name, fields, ids.get(name))
                read.append(s.parts[(name, fields[0])])
        s.dirty.clear()                 # just read
        s.metadata_updates = broker.metadata.updates
        s.refused = refused
        s.settle(read, rows, _bound(broker, follower), full=True)
        return (0, rows, s.id)
    if size >= req.min_bytes or req.max_wait_ms <= 0 or errors:
        return _respond(req, finish(rows), answer, conn)
    return _poll(broker, req, follower, answer, conn, refused, finish)


def _bound(broker, follower):
    """The offset up to which a session's partition can be read now, from its answer row: a
    follower's, the log end; a consumer's, the row's last stable offset (= HW unless read_committed)."""
    if not follower:
        return _row_bound
    partitions = broker.replica_manager.partitions

    def leo(cp, row):
        p = partitions.get((cp.topic, cp.index))
        return -1 if p is None else p.log.log_end_offset
    return leo


def _row_bound(cp, row):
    return row[3]


def _incremental_fetch(broker, s, req, answer, conn, refused_by, now):
    """An incremental fetch of session ``s`` (updated by the request): reads the partitions it lists,
    those told of an append / HW move and those left unread or in error (``FetchSession.candidates``;
    every partition when the metadata or the refused topics changed, or the session's sweep is due);
    the answer lists the partitions with something to say (FetchSession.settle)."""
    follower = req.replica_id >= 0
    expected = s.epoch
    refused = _NONE
    if broker.authorizer is not None:
        refused = _refused(broker, refused_by, _View(req, [(name, ()) for name in s.names]))
    updates = broker.metadata.updates
    full = updates != s.metadata_updates or refused != s.refused or now - s.swept_ms >= s.sweep_ms
    if full:
        s.metadata_updates, s.refused, s.swept_ms = updates, refused, now
    view = _View(req, [])
    read = {}                           # tp -> CachedPartition read by this fetch (grows while it polls)
    state = [full, True]                # [read every partition, record a follower's positions]
    bound = _bound(broker, follower)

    def read_once():
        for cp in s.candidates(state[0]):
            read[(cp.topic, cp.index)] = cp
        state[0] = False
        held = s.parts
        parts = [cp for cp in read.values() if held.get((cp.topic, cp.index)) is cp]   # none dropped meanwhile
        if len(parts) > 1:
            parts.sort(key=fs.SEQ)
        topics = view.topics = []
        last = None
        for cp in parts:
            if cp.topic != last:
                last = cp.topic
                group = []
                topics.append((last, group))
            group.append(cp.request_fields())
        record, state[1] = state[1] and follower, False
        rows, size, errors = _read(broker, view, record, refused, refused_by)
        return (rows, parts), size, errors

    def finish(got):
        rows, parts = got
        if s.epoch != expected:         # another request of this session came meanwhile (Kafka's check)
            return (int(Errors.INVALID_FETCH_SESSION_EPOCH), [], s.id)
        rows = s.settle(parts, rows, bound)
        if rows and getattr(req, "ids", None) is not None:
            _answer_ids(req.ids, s, rows)
        return (0, rows, s.id)
    got, size, errors = read_once()
    if size >= req.min_bytes or req.max_wait_ms <= 0 or errors:
        return _respond(req, finish(got), answer, conn)
    return _wait(s, None, req, read_once, finish, answer, conn)


def _answer_ids(ids, s, rows):
    """v13+: the topic ids of the answer's topics the request did not name (a session's)."""
    for name, prows in rows:
        if name not in ids:
            cp = s.parts.get((name, prows[0][0]))
            if cp is not None and cp.topic_id is not None:
                ids[name] = cp.topic_id


def _poll_recorded(broker, req, conn):
    """``_poll`` of a follower's fetch the native path recorded: each read is the native path's again
    (FastFetch.reread: the request's frame, nothing recorded), or ``_read``'s when it leaves the
    read to Python (sendfile-sized data, a leadership change, an error...)."""
    tps = [follower_key(name, p[0]) for name, parts in req.topics for p in parts]
    reread = broker.replica_manager.fast_fetch_handler.reread
    min_bytes = req.min_bytes

    def read():
        got = reread(conn, req.frame)
        if got is not None:
            return got[0], got[1], False, True
        rows, size, errors = _read(broker, req)
        return rows, size, errors, False

    def done(res):
        return res[0] if res[3] else _encode(conn, req, (0, res[0]))
    return long_poll(broker.notifier, tps, broker.notifier.waiter(tps), req.max_wait_ms / 1000, read,
                     lambda res: res[1] >= min_bytes or res[2], done)


# Room kept below 2^31-1 for the response's own fields (about 100 bytes a partition): record data
# never brings an answer near the int32 size limit, whatever max_bytes and the broker keys allow.
_RESPONSE_DATA_CEILING = 0x7FFFFFFF - (64 << 20)


def _read(broker, req, record=False, refused=_NONE, conn=None):
    """Read every requested partition -> (rows, total bytes, any error). ``record``: first read of
    a follower's fetch, recorded (ReplicaManager.record_follower_fetch) before the partition is read,
    so the answer carries the high watermark that fetch moved. ``refused``: topics answered
    TOPIC_AUTHORIZATION_FAILED, neither read nor recorded (not an error that ends a long poll: the
    other partitions are waited for, as Kafka)."""
    replica_id = req.replica_id
    follower = replica_id >= 0
    # KIP-392: a consumer's rack, when the leader picks a preferred read replica for it
    rack = req.rack_id if req.api_version >= replica_selector.FIRST_VERSION and req.rack_id \
        and replica_selector.enabled(broker) else None
    listener = getattr(conn, "listener_name", None) if rack else None
    # As Kafka: the request's max_bytes, capped by fetch.max.bytes for consumers and by
    # replica.fetch.response.max.bytes for followers (a broker key the request cannot raise).
    # (Conditional expressions rather than min(): builtin min costs ~800 instructions a call in 3.11.)
    budget = broker.config.get("replica.fetch.response.max.bytes" if follower else "fetch.max.bytes")
    if req.max_bytes < budget:
        budget = req.max_bytes
    if budget > _RESPONSE_DATA_CEILING:
        budget = _RESPONSE_DATA_CEILING
    first = True
    total = 0
    errors = False
    rows = []
    committed = not follower and req.isolation_level == 1
    bytes_out = broker.metrics.bytes_out     # BytesOutPerSec by topic, counted here: no call per partition
    rm = broker.replica_manager
    # Ranges below the sendfile threshold (while the answer's copied bytes stay under it too, as
    # encode_fetch_response decides) are copied from the segment's read block: no pread per fetch.
    server = broker.server
    inline_left = server.sendfile_min_bytes if server is not None else 0
    for name, pdata in req.topics:
        if refused and name in refused:
            rows.append((name, [[p[0], _DENIED, -1, -1, -1, b""] for p in pdata]))
            continue
        parts = []
        for index, leader_epoch, fetch_offset, log_start, partition_max in pdata:
            # records never null: librdkafka rejects MessageSetSize -1
            res = [index, 0, -1, -1, -1, b""]
            parts.append(res)
            part, err = rm.fetch_partition((name, index), leader_epoch)     # KIP-320 epoch checks
            if not err and follower and replica_id not in part.replicas:
                err = Errors.NOT_LEADER_OR_FOLLOWER      # only assigned replicas read past the HW
            elif err == _NOT_LEADER and part is not None and not follower and part.leader_id >= 0 \
                    and part.fenced_epoch < 0 and req.api_version >= replica_selector.FIRST_VERSION:
                err = 0             # KIP-392: a follower serves consumers, up to its high watermark
            elif not err and rack and not follower:
                preferred = replica_selector.preferred_read_replica(broker, part, fetch_offset, rack, listener)
                if preferred >= 0:      # the consumer's rack has it: offsets only, answered at once
                    _offsets(res, part.log)
                    res += [None, preferred]
                    errors = True
                    continue
            if err:
                if part is None and broker.metadata.partition(name, index) is None:
                    err = Errors.UNKNOWN_TOPIC_OR_PARTITION
                res[1] = int(err)
                errors = True
                continue
            if record:
                rm.record_follower_fetch(part, replica_id, fetch_offset, leader_epoch, log_start)
            lg = part.log
            if follower and rm.leader_throttled(part, replica_id):
                _offsets(res, lg)
                continue        # throttled replica over the leader quota: no records this time (Kafka)
            limit = partition_max if partition_max < budget else budget
            try:
                # Consumers never see past the high watermark (None: Log.read's default), read_committed
                # ones past the last stable offset; followers read up to the log end.
                if committed:
                    lso = lg.last_stable_offset
                    data = lg.read(fetch_offset, limit, lso, first)
                else:
                    data = lg.read(fetch_offset, limit, lg.log_end_offset if follower else None, first)
            except OffsetOutOfRange:
                _offsets(res, lg)
                if committed:
                    res[3] = lg.last_stable_offset
                res[1] = int(Errors.OFFSET_OUT_OF_RANGE)
                errors = True
                continue
            # The offsets the read saw (no property calls)
            res[2] = res[3] = data.high_watermark
            res[4] = data.log_start_offset
            size = data.size
            if committed:
                res[3] = lso
                # the aborted transactions that may hold data in what is served (below the LSO)
                res.append(lg.aborted_transactions(fetch_offset, lso) if size else [])
            if size:
                if follower:
                    rm.record_leader_bytes(part, size)
                    broker.metrics.replication_bytes_out += size
                else:
                    bytes_out[name] = bytes_out.get(name, 0) + size
                regions = data.regions
                if size < inline_left and len(regions) == 1:
                    fd = regions[0][0]
                    seg = lg.segments[-1]            # a reader at the tail: the active segment
                    if seg.read_fd != fd:
                        seg = _segment_of(lg, fd, fetch_offset)
                    b = None if seg is None else seg.read_bytes(regions[0][1], size)
                    if b is not None:
                        res[5] = b
                        inline_left -= size
                        server.metrics.fetch_copy_bytes += size     # leaves copied, not by sendfile
                    else:
                        res[5] = FileRegions.of(regions, size)
                else:
                    res[5] = FileRegions.of(regions, size)
                total += size
                budget -= size
                first = False
        rows.append((name, parts))
    return rows, total, errors


def _offsets(res, lg):
    """A partition row's high watermark, last stable offset (= HW; a read_committed row sets its own)
    and log start offset, for an answer with no read."""
    res[2] = res[3] = lg.high_watermark
    res[4] = lg.log_start_offset


def _segment_of(lg, fd, offset):
    """The segment whose read descriptor ``fd`` a read of ``offset`` returned: the active one for a
    reader at the tail, else the one the offset falls in (or a later one: the read skips segments
    with nothing at or above the offset)."""
    segs = lg.segments
    seg = segs[-1]
    if seg.read_fd == fd:
        return seg
    for seg in segs[max(bisect.bisect_right(lg._bases, offset) - 1, 0):]:
        if seg.read_fd == fd:
            return seg
    return None


# A ListOffsets answer is built this many partitions per event-loop turn (as Metadata's, 2,000 topics
# per turn): a request naming 100,000 partitions must not hold the loop, and every other client, for
# the whole answer. Smaller requests are answered in the call, as before.
PARTITIONS_PER_TURN = 2000


def list_offsets(broker, header, body, conn=None):
    refused = authz.refused(broker, conn, authz.DESCRIBE, authz.TOPIC, [t["name"] for t in body["topics"]])
    if header.api_version == 0:
        return _list_offsets_v0(broker, body, refused)
    n = sum(len(t["partitions"]) for t in body["topics"])
    if n > PARTITIONS_PER_TURN:
        return _list_offsets_sliced(broker, body, refused)
    # A partition named twice is ambiguous: Kafka answers INVALID_REQUEST for each mention.
    seen, duplicates = set(), set()
    for t in body["topics"]:
        for p in t["partitions"]:
            tp = (t["name"], p["partition_index"])
            (duplicates if tp in seen else seen).add(tp)
    isolation = body.get("isolation_level", 0)
    topics = [{"name": t["name"], "partitions": [_list_offset(broker, t["name"], p, duplicates, isolation, refused)
                                                 for p in t["partitions"]]}
              for t in body["topics"]]
    return {"throttle_time_ms": 0, "topics": topics}


async def _list_offsets_sliced(broker, body, refused):
    """The same answer, PARTITIONS_PER_TURN partitions per loop turn (the duplicate scan too)."""
    seen, duplicates = set(), set()
    done = 0
    for t in body["topics"]:
        name = t["name"]
        for p in t["partitions"]:
            tp = (name, p["partition_index"])
            (duplicates if tp in seen else seen).add(tp)
            done += 1
            if done % PARTITIONS_PER_TURN == 0:
                await asyncio.sleep(0)
    topics = []
    done = 0
    for t in body["topics"]:
        name = t["name"]
        parts = []
        for p in t["partitions"]:
            parts.append(_list_offset(broker, name, p, duplicates, body.get("isolation_level", 0), refused))
            done += 1
            if done % PARTITIONS_PER_TURN == 0:
                await asyncio.sleep(0)
        topics.append({"name": name, "partitions": parts})
    return EncodeOffLoop({"throttle_time_ms": 0, "topics": topics})


def _list_offset(broker, name, p, duplicates, isolation=0, refused=_NONE):
    """One partition of a ListOffsets answer (``isolation``: the request's isolation_level; latest is
    the last stable offset for read_committed; ``refused``: topics the connection may not describe)."""
    index = p["partition_index"]
    res = {"partition_index": index, "error_code": 0, "timestamp": -1, "offset": -1, "leader_epoch": -1}
    if refused and name in refused:
        res["error_code"] = _DENIED
        return res
    if duplicates and (name, index) in duplicates:
        res["error_code"] = int(Errors.INVALID_REQUEST)
        return res
    lg, pinfo, err = _leader_log(broker, name, index, p.get("current_leader_epoch", -1))
    if err:
        res["error_code"] = int(err)
        return res
    ts = p["timestamp"]
    if not pinfo.leader_hw_ready():
        # A new leader's HW may be below what the previous leader exposed (KIP-207).
        res["error_code"] = int(Errors.OFFSET_NOT_AVAILABLE)
        return res
    if ts == LATEST:
        res["offset"] = lg.last_stable_offset if isolation == 1 else lg.high_watermark
        res["leader_epoch"] = pinfo.leader_epoch
    elif ts == EARLIEST or ts == EARLIEST_LOCAL:
        res["offset"] = lg.log_start_offset
        res["leader_epoch"] = pinfo.leader_epoch
    elif ts == LATEST_TIERED:
        pass                    # nothing is tiered: offset -1, as Kafka without remote storage
    else:
        try:
            # KIP-734's max timestamp carries its batch's epoch, a time lookup the current one
            if ts == MAX_TIMESTAMP:
                found = offset_queries.max_timestamp(lg)
            else:
                found = lg.offset_for_timestamp(ts)
                found = None if found is None else (found[0], found[1], pinfo.leader_epoch)
        except BatchError as e:
            # e.g. a stored batch that inflates past the decompression cap: an error code for
            # this partition, not an exception that closes the connection
            res["error_code"] = int(e.error_code)
            return res
        if found is not None and found[0] < (lg.last_stable_offset if isolation == 1 else lg.high_watermark):
            res["offset"], res["timestamp"], res["leader_epoch"] = found
    return res


def _list_offsets_v0(broker, body, refused):
    """v0: each partition's ``old_style_offsets`` (offset_queries.legacy_offsets_before), consumers' capped
    by the high watermark. Errors as Kafka's v0 answers them: no offsets, the partition's error code."""
    consumer = body.get("replica_id", -1) == -1
    now = int(time.time() * 1000)
    topics = []
    for t in body["topics"]:
        name = t["name"]
        parts = []
        for p in t["partitions"]:
            res = {"partition_index": p["partition_index"], "error_code": 0, "old_style_offsets": []}
            parts.append(res)
            if refused and name in refused:
                res["error_code"] = _DENIED
                continue
            lg, _pinfo, err = _leader_log(broker, name, p["partition_index"])
            if err:
                res["error_code"] = int(err)
                continue
            res["old_style_offsets"] = offset_queries.legacy_offsets_before(
                lg, p["timestamp"], p.get("max_num_offsets", 1), now, lg.high_watermark if consumer else None)
        topics.append({"name": name, "partitions": parts})
    return {"topics": topics}


def offset_for_leader_epoch(broker, header, body, conn=None):
    refused = authz.refused(broker, conn, authz.DESCRIBE, authz.TOPIC, [t["topic"] for t in body["topics"]])
    topics = []
    for t in body["topics"]:
        parts = []
        for p in t["partitions"]:
            index = p["partition"]
            res = {"error_code": 0, "partition": index, "leader_epoch": -1, "end_offset": -1}
            parts.append(res)
            if refused and t["topic"] in refused:
                res["error_code"] = _DENIED
                continue
            lg, _pinfo, err = _leader_log(broker, t["topic"], index, p.get("current_leader_epoch", -1))
            if err:
                res["error_code"] = int(err)
                continue
            epoch, end = lg.end_offset_for_epoch(p["leader_epoch"])
            res["leader_epoch"], res["end_offset"] = epoch, end
        topics.append({"topic": t["topic"], "partitions": parts})
    return {"throttle_time_ms": 0, "topics": topics}
