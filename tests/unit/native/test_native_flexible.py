"""The native codec's flexible versions (ext/wire.pxi: Produce v9-11, Fetch v12-17) against the reference
codec (kbroker.protocol): the same fields parsed from frames carrying tagged fields in every place a client
may put them (request header, Fetch's cluster_id and replica_state, v17's replica_directory_id, unknown
tags in every struct), the same refusals for a known tagged field of the wrong size, and the same bytes
encoded for answers of every flexible version. No broker: pure parsing and encoding."""
from __future__ import annotations

import random
import struct

import pytest

from kbroker._native import request as native
from kbroker.protocol import api
from kbroker.protocol.types import ProtocolError, uvarint_bytes

PRODUCE, FETCH = 0, 1
TID = bytes(range(16))
UNKNOWN_TAG = uvarint_bytes(1) + uvarint_bytes(7) + uvarint_bytes(3) + b"xyz"     # one tag 7 of 3 bytes


def _fetch_body(version, **extra):
    part = {"partition": 2, "current_leader_epoch": 5, "fetch_offset": 77, "last_fetched_epoch": 4,
            "log_start_offset": 3, "partition_max_bytes": 1000}
    part.update(extra.pop("part", {}))
    body = {"replica_id": 3, "max_wait_ms": 500, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 1,
            "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": "orders", "topic_id": TID, "partitions": [part, dict(part, partition=3)]}],
            "forgotten_topics_data": [{"topic": "gone", "topic_id": TID[::-1], "partitions": [1, 4]}],
            "rack_id": "rack-a"}
    body.update(extra)
    return body


def _produce_body():
    return {"transactional_id": "tx", "acks": -1, "timeout_ms": 3000, "topic_data": [
        {"name": "orders", "partition_data": [{"index": 0, "records": b"batch-0"}, {"index": 4, "records": None}]},
        {"name": "ü", "partition_data": [{"index": 1, "records": b""}]}]}


def _reference_fetch(frame):
    header, pos = api.parse_request_header(frame)
    b = api.decode_request(FETCH, header.api_version, frame, pos)
    v = header.api_version
    name = "topic_id" if v >= 13 else "topic"
    return (header.correlation_id, header.client_id, b["replica_state"]["replica_id"] if v >= 15 else b["replica_id"],
            b["max_wait_ms"], b["min_bytes"], b["max_bytes"], b["isolation_level"], b["session_id"],
            b["session_epoch"], b["rack_id"],
            [(t[name], [(p["partition"], p["current_leader_epoch"], p["fetch_offset"], p["log_start_offset"],
                         p["partition_max_bytes"]) for p in t["partitions"]]) for t in b["topics"]],
            [(t[name], list(t["partitions"])) for t in b["forgotten_topics_data"]])


def _native_fetch(frame):
    r = native.parse_fetch(frame)
    return (r.correlation_id, r.client_id, r.replica_id, r.max_wait_ms, r.min_bytes, r.max_bytes, r.isolation_level,
            r.session_id, r.session_epoch, r.rack_id, r.topics, r.forgotten)


def _outcome(fn, frame):
    try:
        return ("ok", fn(frame))
    except ProtocolError:
        return ("refused",)


def _with_header_tag(frame: bytes) -> bytes:
    """``frame`` (size prefix removed) with an unknown tag in its request header v2."""
    n = struct.unpack_from(">h", frame, 8)[0]
    at = 10 + max(n, 0)
    assert frame[at] == 0
    return frame[:at] + UNKNOWN_TAG + frame[at + 1:]


def _with_body_tag(frame: bytes) -> bytes:
    """``frame`` with an unknown tag in its top-level tag buffer (the frame's last byte, empty)."""
    assert frame[-1] == 0
    return frame[:-1] + UNKNOWN_TAG


@pytest.mark.parametrize("version", range(12, 18))
def test_fetch_parse_with_tags_agrees_with_reference(version):
    plain = api.encode_request(FETCH, version, 41, "cli", _fetch_body(version))[4:]
    tagged = api.encode_request(FETCH, version, 41, "cli", _fetch_body(
        version, cluster_id="cluster-1", replica_state={"replica_id": 2, "replica_epoch": 9},
        part={"replica_directory_id": bytes(range(16, 32))}))[4:]
    frames = [plain, tagged, _with_header_tag(plain), _with_body_tag(plain)]
    for frame in frames:
        ref = _reference_fetch(frame)
        assert _native_fetch(frame) == ref
    # v15+: the follower's id is replica_state's (tag 1), v12-14 keep replica_id in the body
    assert native.parse_fetch(tagged).replica_id == (2 if version >= 15 else 3)
    # v13+: topics by id until the handler resolves them; the forgotten topics are kept for it
    got = native.parse_fetch(plain)
    assert got.topics[0][0] == (TID if version >= 13 else "orders")
    assert got.forgotten == [(TID[::-1] if version >= 13 else "gone", [1, 4])]


@pytest.mark.parametrize("version", range(12, 18))
def test_known_tag_of_the_wrong_size_refused_as_the_reference(version):
    """cluster_id's announced size one byte longer than its string, and each frame cut short at every
    length: both codecs refuse (or take) the same frames."""
    frame = api.encode_request(FETCH, version, 5, None, _fetch_body(version, cluster_id="c"))[4:]
    # the top-level tag buffer: count 1, tag 0, size 2, compact string "c" (2, 'c')
    tail = uvarint_bytes(1) + uvarint_bytes(0) + uvarint_bytes(2) + b"\x02c"
    assert frame.endswith(tail)
    longer = frame[:-len(tail)] + uvarint_bytes(1) + uvarint_bytes(0) + uvarint_bytes(3) + b"\x02cc"
    assert _outcome(_native_fetch, longer) == _outcome(_reference_fetch, longer) == ("refused",)
    for n in range(len(frame)):
        assert _outcome(_native_fetch, frame[:n])[0] == _outcome(_reference_fetch, frame[:n])[0], n


@pytest.mark.parametrize("version", range(9, 12))
def test_produce_parse_with_tags_agrees_with_reference(version):
    plain = api.encode_request(PRODUCE, version, 7, "p", _produce_body())[4:]
    for frame in (plain, _with_header_tag(plain), _with_body_tag(plain)):
        header, pos = api.parse_request_header(frame)
        b = api.decode_request(PRODUCE, version, frame, pos)
        r = native.parse_produce(frame)
        assert (r.correlation_id, r.client_id, r.transactional_id, r.acks, r.timeout_ms) == (
            header.correlation_id, header.client_id, b["transactional_id"], b["acks"], b["timeout_ms"])
        assert [(n, [(i, None if rec is None else bytes(rec)) for i, rec in ps]) for n, ps in r.topics] == [
            (t["name"], [(p["index"], None if p["records"] is None else bytes(p["records"]))
                         for p in t["partition_data"]]) for t in b["topic_data"]]
    for n in range(len(plain)):
        try:
            native.parse_produce(plain[:n])
            raise AssertionError(f"a frame cut at {n} was taken")
        except ProtocolError:
            pass


def test_random_flexible_answers_encode_as_the_reference():
    from kbroker.server.apis.fetch import _as_dict as fetch_dict
    from kbroker.server.apis.produce import _as_dict as produce_dict
    rng = random.Random(12)
    for _ in range(300):
        version = rng.randint(9, 11)
        rows = [(rng.choice(("a", "ü-t", "topic")), [[rng.randint(0, 9), rng.choice((0, 6, 87)), rng.randint(-1, 99),
                                                      rng.choice((-1, 5)), rng.randint(-1, 9),
                                                      rng.choice((None, "", "bad batch"))]
                                                     for _ in range(rng.randint(0, 3))]) for _ in range(rng.randint(0, 3))]
        assert native.encode_produce_response(version, 3, rows) == b"".join(
            api.encode_response(PRODUCE, version, 3, produce_dict(rows)))
        version = rng.randint(7, 17)            # v7+: the fetch session's id in the answer
        session_id = rng.choice((0, 1, 0x7FFFFFFF, rng.randint(2, 0x7FFFFFFE)))
        ids = {"a": TID, "b": TID[::-1]}
        rows = [(rng.choice(("a", "b")), [[rng.randint(0, 9), rng.choice((0, 1)), rng.randint(-1, 99), rng.randint(-1, 99),
                                           rng.randint(-1, 9), rng.choice((b"", b"records", None))]
                                          + ([[(7, 3), (8, 5)]] if rng.random() < 0.3 else [])
                                          for _ in range(rng.randint(0, 3))]) for _ in range(rng.randint(0, 3))]
        code = rng.choice((0, 70))
        chunks, _copied = native.encode_fetch_response(version, 9, code, rows, 0, ids, session_id)
        body = fetch_dict((code, rows, session_id))
        if version >= 13:
            for t in body["responses"]:
                t["topic_id"] = ids[t.pop("topic")]
        assert b"".join(chunks) == b"".join(api.encode_response(FETCH, version, 9, body))
