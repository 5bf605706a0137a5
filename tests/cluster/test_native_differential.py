"""The native request path against the pure-Python reference.

Three levels, the same seeded request generator for all (valid Produce v3-11 and Fetch v4-17 requests
built with kbroker.protocol, plus truncated, byte-flipped and length-mutated ones; Fetch v13+ names
each topic by a stand-in id that ``_Client`` swaps for each broker's own id, both ways):
1. parse: ``_native.request.parse_produce`` / ``parse_fetch`` and the generic codec
   (``parse_request_header`` + ``decode_request``) agree on every frame — the same fields, or both
   refuse it (ProtocolError);
2. encode: ``encode_produce_response`` / ``encode_fetch_response`` and ``api.encode_response`` give
   the same bytes on the wire for random answers (error codes, offsets, messages, unicode names; Fetch
   records as bytes or file regions of a real file, copied inline or left for sendfile);
3. end to end: two real brokers, one with the native path and one with KBROKER_NATIVE_REQUESTS=0,
   get the same request sequence over raw sockets; every outcome (response bytes, connection closed,
   no response) must be identical. Log state (offsets, errors) is real: a real ReplicaManager and Log.

The comparison helper is shown to catch a single differing byte and a close/answer difference.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import random
import signal
import socket
import struct
import time
import urllib.request

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from checkers import API_VERSIONS, METADATA, PRODUCE, RawConn, create_topic, wait_for_topic
from kbroker._native import request as native
from kbroker._native.crc import crc32c
from kbroker.protocol import api
from kbroker.protocol.types import ProtocolError
from kbroker.testing import LocalCluster, free_port

VERSIONS = range(native.PRODUCE_MIN, native.PRODUCE_MAX + 1)
FETCH_VERSIONS = range(native.FETCH_MIN, native.FETCH_MAX + 1)
FETCH = 1
TS = 1_700_000_000_000      # fixed record timestamps: both brokers store identical bytes


def _batch(rng, n=None, codec=0):
    b = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i in range(n or rng.randint(1, 4)):
        b.append(i, timestamp=TS + i, key=None if rng.random() < 0.5 else b"k%d" % i,
                 value=bytes(rng.randrange(256) for _ in range(rng.randint(0, 40))), headers=[])
    return bytes(b.build())


def _records(rng):
    r = rng.random()
    if r < 0.08:
        return None
    if r < 0.14:
        return b""
    data = bytearray(_batch(rng))
    if r < 0.22:                                 # CRC no longer matches
        data[rng.randrange(61, len(data))] ^= 0xFF
    return bytes(data)


TOPICS = ("d0", "d1", "nope", "bad name!", "é-topic")


def produce_body(rng):
    topics = []
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        name = rng.choice(TOPICS)
        parts = [{"index": rng.choice((0, 0, 1, 2, 7, -1)), "records": _records(rng)}
                 for _ in range(rng.choice((1, 1, 2, 3)))]
        topics.append({"name": name, "partition_data": parts})
    return {"transactional_id": rng.choice((None, None, "", "tx")),
            "acks": rng.choice((1, 1, 1, -1, -1, 0, 2)), "timeout_ms": rng.choice((5000, 30000)),
            "topic_data": topics}


def produce_frame(rng, correlation, version=None) -> bytes:
    """A valid Produce request with its size prefix."""
    version = rng.choice(VERSIONS) if version is None else version
    client = rng.choice(("diff", None, "", "ü-client"))
    return api.encode_request(PRODUCE, version, correlation, client, produce_body(rng))


def fetch_body(rng):
    topics = []
    for _ in range(rng.choice((0, 1, 1, 1, 2))):
        parts = [{"partition": rng.choice((0, 0, 1, 2, -1)), "current_leader_epoch": rng.choice((-1, -1, 0, 5)),
                  "fetch_offset": rng.choice((0, 0, 1, 3, 10, 40, 1 << 40, -1)),
                  "log_start_offset": rng.choice((-1, 0)),
                  "partition_max_bytes": rng.choice((0, 1, 100, 2000, 1 << 20))}
                 for _ in range(rng.choice((1, 1, 2)))]
        topics.append({"topic": rng.choice(TOPICS), "partitions": parts})
    return {"replica_id": rng.choice((-1, -1, -1, -1, 0, 7)), "max_wait_ms": rng.choice((0, 0, 0, 10)),
            "min_bytes": rng.choice((0, 1, 1)), "max_bytes": rng.choice((1, 500, 5000, 1 << 20, 0x7FFFFFFF)),
            "isolation_level": rng.choice((0, 1)), "session_id": rng.choice((0, 0, 0, 0, 9)),
            # epoch -1: sessionless (with id 9, the close of a session neither broker has); epoch 0 would
            # ask for a fetch session, whose random id would make the two answers differ
            "session_epoch": -1, "topics": topics,
            "forgotten_topics_data": [{"topic": "d0", "partitions": [0, 1]}] if rng.random() < 0.2 else [],
            "rack_id": rng.choice(("", "r1"))}


def fetch_frame(rng, correlation, version=None) -> bytes:
    version = rng.choice(FETCH_VERSIONS) if version is None else version
    return fetch_request(version, correlation, rng.choice(("diff", None)), fetch_body(rng))


def stand_in_id(name: str) -> bytes:
    """The 16 bytes a v13+ Fetch of these tests names topic ``name`` by (_Client puts the broker's id
    of the topic in its place; a topic the broker lacks keeps it: an unknown id)."""
    return hashlib.md5(name.encode()).digest()


def fetch_request(version, correlation, client, body) -> bytes:
    """A Fetch frame of any version from a body naming topics: v13+ by stand-in ids, v15+ with the
    replica id in replica_state."""
    if version >= 13:
        body = dict(body, topics=[dict(t, topic_id=stand_in_id(t["topic"])) for t in body["topics"]],
                    forgotten_topics_data=[dict(t, topic_id=stand_in_id(t["topic"]))
                                           for t in body.get("forgotten_topics_data", [])])
    if version >= 15:
        body = dict(body, replica_state={"replica_id": body.get("replica_id", -1), "replica_epoch": -1})
    return api.encode_request(FETCH, version, correlation, client, body)


def mutate(rng, frame: bytes) -> bytes:
    """A malformed (or accidentally still valid) variant of a size-prefixed frame, with a size prefix
    that matches its new length."""
    body = bytearray(frame[4:])
    kind = rng.randrange(4)
    if kind == 0:                                # truncated anywhere
        body = body[:rng.randrange(len(body))]
    elif kind == 1:                              # a few bytes flipped (header, lengths, records)
        for _ in range(rng.randint(1, 3)):
            body[rng.randrange(len(body))] = rng.randrange(256)
    elif kind == 2:                              # an int16/int32 length field set to an extreme
        pos = rng.randrange(max(len(body) - 4, 1))
        body[pos:pos + 4] = rng.choice((b"\x7f\xff\xff\xff", b"\xff\xff\xff\xfe", b"\x80\x00\x00\x00",
                                        b"\x00\x00\xff\xff"))
    else:                                        # trailing garbage
        body += bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    return struct.pack(">i", len(body)) + bytes(body)


def mutate_fetch(rng, frame: bytes) -> bytes:
    """``mutate`` of a Fetch frame, again while the result is a valid Fetch that waits longer than 1 s (a
    long poll of up to 2^31 ms on both brokers: a lost request to the comparison, not a difference)."""
    while True:
        out = mutate(rng, frame)
        try:
            hdr, pos = api.parse_request_header(memoryview(out)[4:])
            if api.decode_request(hdr.api_key, hdr.api_version, memoryview(out)[4:], pos)["max_wait_ms"] <= 1000:
                return out
        except (ProtocolError, KeyError):
            return out


# ---- 1. parse -------------------------------------------------------------------------------------
def _reference_parse(frame):
    header, pos = api.parse_request_header(frame)
    body = api.decode_request(header.api_key, header.api_version, frame, pos)
    return (header.api_key, header.api_version, header.correlation_id, header.client_id,
            body["transactional_id"], body["acks"], body["timeout_ms"],
            [(t["name"], [(p["index"], None if p["records"] is None else bytes(p["records"]))
                          for p in t["partition_data"]]) for t in body["topic_data"]])


def _native_parse(frame):
    r = native.parse_produce(frame)
    return (r.api_key, r.api_version, r.correlation_id, r.client_id, r.transactional_id, r.acks, r.timeout_ms,
            [(name, [(i, None if rec is None else bytes(rec)) for i, rec in parts]) for name, parts in r.topics])


def _reference_parse_fetch(frame):
    header, pos = api.parse_request_header(frame)
    b = api.decode_request(header.api_key, header.api_version, frame, pos)
    v = header.api_version
    name = "topic_id" if v >= 13 else "topic"
    return (header.api_key, header.api_version, header.correlation_id, header.client_id,
            b["replica_state"]["replica_id"] if v >= 15 else b["replica_id"],
            b["max_wait_ms"], b["min_bytes"], b["max_bytes"], b["isolation_level"], b["session_id"],
            b["session_epoch"], b["rack_id"],
            [(t[name], [(p["partition"], p["current_leader_epoch"], p["fetch_offset"], p["log_start_offset"],
                         p["partition_max_bytes"]) for p in t["partitions"]]) for t in b["topics"]],
            [(t[name], list(t["partitions"])) for t in b["forgotten_topics_data"]])


def _native_parse_fetch(frame):
    r = native.parse_fetch(frame)
    return (r.api_key, r.api_version, r.correlation_id, r.client_id, r.replica_id, r.max_wait_ms, r.min_bytes,
            r.max_bytes, r.isolation_level, r.session_id, r.session_epoch, r.rack_id, r.topics, r.forgotten)


def test_fetch_parse_agrees_with_reference():
    rng = random.Random(10_002)
    counts = {"ok": 0, "refused": 0}
    for i in range(6000):
        frame = fetch_frame(rng, i)
        if i % 3:
            frame = mutate(rng, frame)
        view = memoryview(bytearray(frame))[4:]
        key, version = native.peek_key_version(view)
        if key != FETCH or version not in FETCH_VERSIONS:
            continue
        ref, nat = _outcome(_reference_parse_fetch, view), _outcome(_native_parse_fetch, view)
        assert nat == ref, (i, frame.hex())
        counts[ref[0]] += 1
    assert counts["ok"] > 2500 and counts["refused"] > 1500, counts


def _outcome(fn, frame):
    try:
        return ("ok", fn(frame))
    except ProtocolError:
        return ("refused",)


def test_parse_agrees_with_reference():
    rng = random.Random(10_001)
    counts = {"ok": 0, "refused": 0}
    for i in range(6000):
        frame = produce_frame(rng, i)
        if i % 3:
            frame = mutate(rng, frame)
        view = memoryview(bytearray(frame))[4:]
        key, version = native.peek_key_version(view)
        if key != PRODUCE or version not in VERSIONS:
            continue                             # the connection sends these to the reference path
        ref, nat = _outcome(_reference_parse, view), _outcome(_native_parse, view)
        assert nat == ref, (i, frame.hex())
        counts[ref[0]] += 1
    assert counts["ok"] > 2500 and counts["refused"] > 1500, counts


def test_parse_records_are_views_into_the_frame():
    rng = random.Random(3)
    buf = bytearray(produce_frame(rng, 1, version=8))
    req = native.parse_produce(memoryview(buf)[4:])
    views = [rec for _n, parts in req.topics for _i, rec in parts if rec]
    assert views and all(isinstance(v, memoryview) and v.obj is buf for v in views)


# ---- 2. encode ------------------------------------------------------------------------------------
def _random_answer(rng, version):
    topics = []
    for _ in range(rng.randint(0, 3)):
        parts = []
        for _ in range(rng.randint(0, 3)):
            code = rng.choice((0, 0, 1, 2, 3, 6, 10, 17, 19, 87))
            message = rng.choice((None, None, "", "ISR [1] is smaller than min.insync.replicas=2", "ünï"))
            parts.append([rng.randint(-2**31, 2**31 - 1), code, rng.choice((-1, 0, rng.randint(0, 2**62))),
                          rng.choice((-1, TS)), rng.choice((-1, 0, rng.randint(0, 2**40))), message])
        topics.append((rng.choice(TOPICS + ("",)), parts))
    return topics


def _reference_encode(version, correlation_id, topics):
    from kbroker.server.apis.produce import _as_dict
    return b"".join(api.encode_response(PRODUCE, version, correlation_id, _as_dict(topics)))


def test_encode_agrees_with_reference():
    rng = random.Random(77)
    for i in range(3000):
        version = rng.choice(VERSIONS)
        topics = _random_answer(rng, version)
        cid = rng.randint(-2**31, 2**31 - 1)
        assert native.encode_produce_response(version, cid, topics) == _reference_encode(version, cid, topics), i


def _wire(chunks) -> bytes:
    """The bytes a response's chunks put on the wire (file regions read from their files)."""
    import os

    from kbroker.protocol.types import FileRegions
    out = bytearray()
    for c in chunks:
        if isinstance(c, FileRegions):
            for fd, pos, length in c.regions:
                out += os.pread(fd if isinstance(fd, int) else fd.fileno(), length, pos)
        else:
            out += c
    return bytes(out)


def test_fetch_encode_agrees_with_reference(tmp_path):
    import os

    from kbroker.protocol.types import FileRegions
    from kbroker.server.apis.fetch import _as_dict
    rng = random.Random(78)
    path = tmp_path / "segment"
    path.write_bytes(bytes(rng.randrange(256) for _ in range(1 << 16)))
    fd = os.open(path, os.O_RDONLY)
    try:
        for i in range(3000):
            version = rng.choice(FETCH_VERSIONS)
            rows = []
            for _ in range(rng.randint(0, 3)):
                parts = []
                for _ in range(rng.randint(0, 3)):
                    r = rng.random()
                    if r < 0.4:
                        records = b""
                    elif r < 0.5:
                        records = bytes(rng.randrange(256) for _ in range(rng.randint(1, 50)))
                    else:
                        records = FileRegions([(fd, rng.randrange(1 << 15), rng.randint(1, 9000))
                                               for _ in range(rng.randint(1, 2))])
                    parts.append([rng.randint(-2**31, 2**31 - 1), rng.choice((0, 1, 3, 6, 74)),
                                  rng.choice((-1, 0, rng.randint(0, 2**50))), rng.choice((-1, 7)),
                                  rng.choice((-1, 0, 3)), records])
                rows.append((rng.choice(TOPICS), parts))
            code, cid = rng.choice((0, 0, 70)), rng.randint(-2**31, 2**31 - 1)
            inline_max = rng.choice((0, 4096, 1 << 30))
            ids = {name: stand_in_id(name) for name in TOPICS}
            chunks, copied = native.encode_fetch_response(version, cid, code, rows, inline_max, ids)
            body = _as_dict((code, rows))
            if version >= 13:
                for t in body["responses"]:
                    t["topic_id"] = ids[t.pop("topic")]
            ref = api.encode_response(FETCH, version, cid, body)
            assert _wire(chunks) == _wire(ref), i
            inlined = 0            # ranges below inline_max, while the response's copied total fits in it
            for _n, ps in rows:
                for r in ps:
                    if isinstance(r[5], FileRegions) and r[5].size < inline_max and inlined + r[5].size <= inline_max:
                        inlined += r[5].size
            assert copied == inlined
            if inline_max == 1 << 30:
                assert len(chunks) == 1        # everything inline: one write
    finally:
        os.close(fd)


# ---- 3. end to end: two real brokers ----------------------------------------------------------------
def compare(outcomes_a, outcomes_b) -> list:
    """Indexes and both sides of every request whose outcome differs."""
    diffs = [(i, a, b) for i, (a, b) in enumerate(zip(outcomes_a, outcomes_b)) if a != b]
    if len(outcomes_a) != len(outcomes_b):
        diffs.append(("length", len(outcomes_a), len(outcomes_b)))
    return diffs


def test_compare_sees_a_difference():
    same = [("answer", b"\x00\x00\x00\x05abcde"), ("closed",), ("none",)]
    one_byte = [("answer", b"\x00\x00\x00\x05abcdf"), ("closed",), ("none",)]
    closed_instead = [("closed",), ("closed",), ("none",)]
    assert compare(same, list(same)) == []
    assert [d[0] for d in compare(same, one_byte)] == [0]
    assert [d[0] for d in compare(same, closed_instead)] == [0]


ID_TOPICS = ("d0", "d1", "d2", "m4", "r0")     # the topics the tests create: v13+ fetches name them by id


class _Client:
    """One raw connection to a broker; reconnects after the broker closed it. A v13+ Fetch's stand-in
    ids (stand_in_id) are replaced by the broker's own topic ids in the request, and back in the answer."""

    def __init__(self, bootstrap):
        self.bootstrap = bootstrap
        self.conn = None
        self.ids = {}           # stand-in -> this broker's id (None: the broker has no such topic)

    def _swap(self, data: bytes, to_broker: bool) -> bytes:
        for name in ID_TOPICS:
            stand_in = stand_in_id(name)
            if to_broker and stand_in in data and stand_in not in self.ids:
                with RawConn(self.bootstrap, timeout=10) as c:
                    t = c.request(METADATA, 12, {"topics": [{"name": name, "topic_id": bytes(16)}]})["topics"][0]
                self.ids[stand_in] = bytes(t["topic_id"]) if t["error_code"] == 0 else None
            real = self.ids.get(stand_in)
            if real is not None:
                data = data.replace(stand_in, real) if to_broker else data.replace(real, stand_in)
        return data

    def run(self, frame: bytes, answered: bool):
        """-> ("answer", bytes) | ("closed",) | ("none",) (acks=0: no answer, connection still open)."""
        if self.conn is None:
            self.conn = RawConn(self.bootstrap, timeout=10)
        c = self.conn
        frame = self._swap(frame, True)
        probe = api.encode_request(API_VERSIONS, 0, 0x7EADBEEF, "probe", {})
        try:
            # acks=0 requests are followed by a probe: its answer proves the request was taken
            # without a close (responses are in order).
            c.send(frame if answered else frame + probe)
            data = c.recv_frame(timeout=10)
        except (ConnectionError, OSError) as e:
            if isinstance(e, socket.timeout):
                raise AssertionError("broker neither answered nor closed within 10 s") from e
            c.close()
            self.conn = None
            return ("closed",)
        if not answered:
            assert data[:4] == struct.pack(">i", 0x7EADBEEF), data[:8].hex()
            return ("none",)
        return ("answer", self._swap(data, False))


def _requests(seed, n):
    """[(frame, answered)], the same for both brokers."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        frame = produce_frame(rng, i + 1)
        if i % 3 == 2:
            frame = fetch_frame(rng, i + 1)
            if rng.random() < 0.3:
                frame = mutate_fetch(rng, frame)
            out.append((frame, True))
            continue
        if i % 10 == 9:      # a clean acks=0 request now and then (random ones mostly fail and close)
            body = {"transactional_id": None, "acks": 0, "timeout_ms": 5000, "topic_data": [
                {"name": "d0", "partition_data": [{"index": i % 2, "records": _batch(rng)}]}]}
            frame = api.encode_request(PRODUCE, rng.choice(VERSIONS), i + 1, "diff", body)
        elif rng.random() < 0.3:
            frame = mutate(rng, frame)
        out.append((frame, _answered(frame)))
    return out


def _answered(frame) -> bool:
    """Whether a Produce frame expects an answer (anything but a well-formed acks=0 request)."""
    try:
        hdr, pos = api.parse_request_header(memoryview(frame)[4:])
        return api.decode_request(hdr.api_key, hdr.api_version, memoryview(frame)[4:], pos)["acks"] != 0
    except ProtocolError:
        return True


@pytest.fixture(scope="module")
def two_brokers(tmp_path_factory):
    clusters = []
    try:
        for mode in ("1", "0"):
            c = LocalCluster(tmp_path_factory.mktemp(f"diff-native-{mode}"), num_partitions=1,
                             env={"KBROKER_NATIVE_REQUESTS": mode})
            c.start()
            clusters.append(c)
            create_topic(c.bootstrap, "d0", 2)
            create_topic(c.bootstrap, "d1", 1)
            wait_for_topic(c.bootstrap, "d0", 2)
            wait_for_topic(c.bootstrap, "d1", 1)
        yield clusters
    finally:
        for c in clusters:
            c.stop()


def _run_both(brokers, reqs):
    """The same requests to each broker (one connection each, reopened after a close); every outcome
    must be identical. -> (the first broker's outcomes, how many of each kind)."""
    outcomes = []
    for broker in brokers:
        client = _Client(broker.bootstrap)
        outcomes.append([client.run(frame, answered) for frame, answered in reqs])
    diffs = compare(*outcomes)
    assert diffs == [], diffs[:3]
    return outcomes[0], {k: sum(1 for o in outcomes[0] if o[0] == k) for k in ("answer", "closed", "none")}


def test_brokers_answer_byte_for_byte(two_brokers):
    reqs = _requests(2024, 900)
    first, kinds = _run_both(two_brokers, reqs)
    # The sequence exercised every outcome, and real appends happened (offsets moved).
    assert kinds["answer"] > 200 and kinds["closed"] > 50 and kinds["none"] > 20, kinds
    offsets = set()
    for (frame, _answered), o in zip(reqs, first):
        if o[0] == "answer" and frame[5] == PRODUCE:
            version = struct.unpack_from(">h", frame, 6)[0]
            _cid, body = api.decode_response(PRODUCE, version, o[1])
            for t in body["responses"]:
                offsets.update(p["base_offset"] for p in t["partition_responses"])
    assert len(offsets) > 50
    # Fetches returned records (not only errors and empty answers).
    fetched = 0
    for (frame, _answered), o in zip(reqs, first):
        if o[0] == "answer" and frame[5] == FETCH:
            version = struct.unpack_from(">h", frame, 6)[0]
            _cid, body = api.decode_response(FETCH, version, o[1])
            fetched += sum(len(p["records"] or b"") for t in body["responses"] for p in t["partitions"])
    assert fetched > 10_000, fetched


def test_python_path_is_really_off(two_brokers):
    """The reference broker must not be running the native path (or the comparison proves nothing):
    its log says so at start-up, and the native one's does not."""
    native_broker, python_broker = two_brokers
    assert "native request path off" in python_broker.brokers[0].log_path.read_text()
    assert "native request path off" not in native_broker.brokers[0].log_path.read_text()


# ---- the native Produce fast path (ext/request.pyx FastProduce) against the native path without it --
def _fast_requests(seed, n):
    """Mostly the fast path's common request (one partition, any version 3-8, acks 0/1/-1), with
    malformed, multi-partition and Fetch frames in between. [(frame, answered)]"""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        r = rng.random()
        if r < 0.1:
            frame = fetch_frame(rng, i + 1)
            out.append((frame, True))
            continue
        if r < 0.2:
            frame = produce_frame(rng, i + 1)         # anything produce_body makes, several partitions too
        else:
            topic, index = rng.choice((("d0", 0), ("d0", 1), ("d1", 0), ("d1", 3)))
            body = {"transactional_id": None, "acks": rng.choice((1, 1, 0, -1)), "timeout_ms": 5000,
                    "topic_data": [{"name": topic, "partition_data": [
                        {"index": index, "records": _batch(rng, codec=rng.choice((0, 0, 0, 0, 1)))}]}]}
            frame = api.encode_request(PRODUCE, rng.choice(VERSIONS), i + 1,
                                       rng.choice(("fast", None, "", "ü-client")), body)
        if rng.random() < 0.1:
            frame = mutate(rng, frame)
        out.append((frame, _answered(frame)))
    return out


def _fast_counts(port, api_name="produce"):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    prefix = f"kbroker_{api_name}_native_requests_total{{"
    return {line.split('path="', 1)[1].split('"', 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith(prefix)}


@contextlib.contextmanager
def _switch_pair(tmp_path_factory, switch):
    """Two brokers, ``switch`` (an environment variable) on and off, topics d0 (2 partitions) and d1;
    the first one's metrics on a free port. -> (clusters, port), stopped on leaving."""
    clusters = []
    port = free_port()
    try:
        for mode in ("1", "0"):
            c = LocalCluster(tmp_path_factory.mktemp(f"diff-{switch.lower()}-{mode}"), num_partitions=1,
                             env={switch: mode}, overrides={"kbroker.metrics.port": port if mode == "1" else -1})
            clusters.append(c)
            c.start()
            create_topic(c.bootstrap, "d0", 2)
            create_topic(c.bootstrap, "d1", 1)
        yield clusters, port
    finally:
        for c in clusters:
            c.stop()


@pytest.fixture(scope="module")
def fast_pair(tmp_path_factory):
    with _switch_pair(tmp_path_factory, "KBROKER_FAST_PRODUCE") as pair:
        yield pair


def test_fast_path_answers_and_logs_byte_for_byte(fast_pair):
    """The same sequence to a broker with the fast path and one without (both native): every outcome
    identical, and so are the partitions' log files; the fast path served most Produce requests."""
    (fast, ref), port = fast_pair
    _first, kinds = _run_both((fast, ref), _fast_requests(10, 700))
    assert kinds["answer"] > 300 and kinds["closed"] > 10 and kinds["none"] > 50, kinds
    counts = _fast_counts(port)
    assert counts.get("fast", 0) > 300 and counts.get("reference", 0) > 30, counts
    _same_logs((fast, ref), (("d0", 0), ("d0", 1), ("d1", 0)))


def _same_logs(brokers, tps):
    """Each partition's .log files are identical on both brokers, and hold real appends."""
    for topic, index in tps:
        files = []
        for c in brokers:
            d = c.brokers[0].data_dir / f"{topic}-{index}"
            files.append({p.name: p.read_bytes() for p in sorted(d.glob("*.log"))})
        assert files[0] == files[1], (topic, index)
        assert sum(len(b) for b in files[0].values()) > 10_000, (topic, index)


MULTI_POOL = (("m4", 0), ("m4", 1), ("m4", 2), ("m4", 3), ("d0", 0), ("d0", 1), ("d1", 0))


def _recounted(batch: bytes, count: int) -> bytes:
    """``batch`` claiming ``count`` records, its CRC recomputed (a well-formed header, wrong content)."""
    b = bytearray(batch)
    struct.pack_into(">i", b, 57, count)
    struct.pack_into(">I", b, 17, crc32c(bytes(b[21:])))
    return bytes(b)


def _spoiled(rng, batch: bytes) -> bytes:
    """One bad batch: CRC mismatch, magic 1, or a wrong record count with a matching CRC."""
    kind = rng.randrange(3)
    if kind == 0:
        b = bytearray(batch)
        b[rng.randrange(61, len(b))] ^= 0xFF
        return bytes(b)
    if kind == 1:
        return batch[:16] + b"\x01" + batch[17:]
    return _recounted(batch, struct.unpack_from(">i", batch, 57)[0] + rng.choice((1, -1, 5)))


def _multi_requests(seed, n):
    """Produce requests carrying 2-7 partitions of several topics (any version 3-8, acks 0/1/-1):
    mostly all plain, the rest with one thing the fast path must leave whole to Python — one bad
    batch among good ones, an unknown or unarmed partition, the same partition twice, a transactional
    id, an idempotent batch. [(frame, answered)]"""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        tps = rng.sample(MULTI_POOL, rng.randint(2, len(MULTI_POOL)))
        batches = [_batch(rng, codec=rng.choice((0,) * 12 + (1,))) for _ in tps]
        r = rng.random()
        txn = None
        if r < 0.1:
            k = rng.randrange(len(tps))
            batches[k] = _spoiled(rng, batches[k])
        elif r < 0.15:
            tps[rng.randrange(len(tps))] = rng.choice((("m4", 9), ("nope", 0), ("d1", 3)))
        elif r < 0.2:
            tps.append(rng.choice(tps))                 # the same partition twice
            batches.append(_batch(rng))
        elif r < 0.23:
            txn = "tx"
        elif r < 0.26:
            k = rng.randrange(len(tps))                 # idempotent: producer id 7, epoch 0, sequence 0
            b = bytearray(batches[k])
            struct.pack_into(">qhi", b, 43, 7, 0, 0)
            batches[k] = _recounted(bytes(b), struct.unpack_from(">i", b, 57)[0])
        topics = []
        for (topic, index), batch in zip(tps, batches):
            if topics and topics[-1]["name"] == topic and rng.random() < 0.8:
                topics[-1]["partition_data"].append({"index": index, "records": batch})
            else:
                topics.append({"name": topic, "partition_data": [{"index": index, "records": batch}]})
        body = {"transactional_id": txn, "acks": rng.choice((1, 1, 0, -1)), "timeout_ms": 5000, "topic_data": topics}
        frame = api.encode_request(PRODUCE, rng.choice(VERSIONS), i + 1, rng.choice(("multi", None)), body)
        out.append((frame, _answered(frame)))
    return out


def test_fast_path_several_partitions_byte_for_byte(fast_pair):
    """Requests of several topics and partitions, to the fast broker and the one without the fast
    path: every outcome identical (per-partition errors included), the same log files; the fast path
    served most of them (all partitions at once) and left the others whole to Python."""
    (fast, ref), port = fast_pair
    for c in (fast, ref):
        create_topic(c.bootstrap, "m4", 4)
        wait_for_topic(c.bootstrap, "m4", 4)
    before = _fast_counts(port)
    reqs = _multi_requests(12, 500)
    first, kinds = _run_both((fast, ref), reqs)
    assert kinds["answer"] > 250 and kinds["none"] > 50 and kinds["closed"] > 5, kinds
    after = _fast_counts(port)
    served, left = after["fast"] - before.get("fast", 0), after["reference"] - before.get("reference", 0)
    assert served > 250 and left > 60, (served, left)
    errors = set()
    for (frame, _answered), o in zip(reqs, first):
        if o[0] == "answer":
            _cid, body = api.decode_response(PRODUCE, struct.unpack_from(">h", frame, 6)[0], o[1])
            errors.update(p["error_code"] for t in body["responses"] for p in t["partition_responses"])
    # none, CORRUPT_MESSAGE, UNKNOWN_TOPIC_OR_PARTITION, UNSUPPORTED_FOR_MESSAGE_FORMAT, INVALID_RECORD
    assert {0, 2, 3, 43, 87} <= errors, errors
    _same_logs((fast, ref), MULTI_POOL)


# ---- idempotent producers on the Produce fast path ---------------------------------------------------
IDEM_POOL = (("d0", 0), ("d0", 1), ("d1", 0))
TXN_PID = 9000          # transactional batches' producer (kept apart from the model below)


def _idem_batch(rng, pid, epoch, seq, txn=False):
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=txn, producer_id=pid,
                                  producer_epoch=epoch, base_sequence=seq, batch_size=1 << 20)
    for i in range(rng.randint(1, 4)):
        b.append(i, timestamp=TS + i, key=None, value=bytes(rng.randrange(256) for _ in range(rng.randint(0, 40))),
                 headers=[])
    return bytes(b.build())


def _idem_requests(seed, n):
    """Produce requests (1-3 partitions, acks 1/-1/0, versions 3-8) from a few idempotent producers
    that mostly send their next batch in sequence (the fast path's case), with, per partition: a
    retry of one of its last 1..5 batches, a sequence gap, an epoch bump (sequence 0), a new
    producer id, an older epoch, a transactional batch. A model of what the broker accepted keeps
    the in-sequence batches in sequence. [(frame, answered)]"""
    rng = random.Random(seed)
    epochs = {1000: 0, 1001: 0, 1002: 0}
    nxt, sent = {}, {}
    out = []
    for i in range(n):
        topics = []
        for tp in rng.sample(IDEM_POOL, rng.choice((1, 1, 1, 2, 3))):
            pid = rng.choice(list(epochs))
            key = (pid, tp)
            history = sent.setdefault(key, [])
            seq = nxt.get(key, 0)
            r = rng.random()
            if r < 0.1 and history:
                batch = history[-rng.randint(1, min(5, len(history)))]           # a retry
            elif r < 0.13:
                batch = _idem_batch(rng, pid, epochs[pid], seq + rng.randint(1, 3))   # out of order
            elif r < 0.15 and epochs[pid] > 0:
                batch = _idem_batch(rng, pid, epochs[pid] - 1, seq)               # an older epoch
            elif r < 0.17:
                batch = _idem_batch(rng, TXN_PID, 0, rng.randrange(3), txn=True)
            else:
                if r < 0.19:                                                     # an epoch bump
                    epochs[pid] += 1
                    for k in [k for k in nxt if k[0] == pid]:
                        nxt[k] = 0
                        sent[k] = []
                    seq = 0
                elif r < 0.2:                                                    # a new producer id
                    pid = max(epochs) + 1
                    epochs[pid] = 0
                    key, seq = (pid, tp), rng.choice((0, 7))
                    history = sent.setdefault(key, [])
                batch = _idem_batch(rng, pid, epochs[pid], seq)
                nxt[key] = seq + struct.unpack_from(">i", batch, 57)[0]
                history.append(batch)
            topic, index = tp
            if topics and topics[-1]["name"] == topic:
                topics[-1]["partition_data"].append({"index": index, "records": batch})
            else:
                topics.append({"name": topic, "partition_data": [{"index": index, "records": batch}]})
        body = {"transactional_id": None, "acks": rng.choice((1, 1, -1, -1, 0)), "timeout_ms": 5000,
                "topic_data": topics}
        frame = api.encode_request(PRODUCE, rng.choice(VERSIONS), i + 1, rng.choice(("idem", None)), body)
        out.append((frame, _answered(frame)))
    return out


def test_fast_path_idempotent_byte_for_byte(tmp_path_factory):
    """Idempotent producers to a broker with the fast path and one without: every answer identical
    (duplicates answered with their first offsets, OUT_OF_ORDER_SEQUENCE_NUMBER, INVALID_PRODUCER_EPOCH
    alike), the same log files and, after a clean stop, the same producer-state snapshots (what the
    fast path recorded for its batches); most requests were served by the fast path."""
    with _switch_pair(tmp_path_factory, "KBROKER_FAST_PRODUCE") as ((fast, ref), port):
        reqs = _idem_requests(31, 700)
        first, kinds = _run_both((fast, ref), reqs)
        assert kinds["answer"] > 400 and kinds["none"] > 50, kinds
        counts = _fast_counts(port)
        assert counts.get("fast", 0) > 300 and counts.get("reference", 0) > 100, counts
        errors, dups = set(), 0
        for (frame, _answered), o in zip(reqs, first):
            if o[0] == "answer":
                _cid, body = api.decode_response(PRODUCE, struct.unpack_from(">h", frame, 6)[0], o[1])
                errors.update(p["error_code"] for t in body["responses"] for p in t["partition_responses"])
        assert {0, 45, 47} <= errors, errors
        _same_logs((fast, ref), IDEM_POOL)
        for c in (fast, ref):
            c.stop()
        for topic, index in IDEM_POOL:
            snaps = [{p.name: p.read_bytes() for p in (c.brokers[0].data_dir / f"{topic}-{index}").glob("*.snapshot")}
                     for c in (fast, ref)]
            assert snaps[0] == snaps[1] and snaps[0], (topic, index)


# ---- the native Fetch fast path (ext/request.pyx FastFetch) against the native path without it ------
def _fill_requests(seed, n):
    """Produce frames (acks=1, fixed timestamps) of 1-5 records each for d0/0, d0/1 and d1/0: both
    brokers store the same batches at the same offsets."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        topic, index = rng.choice((("d0", 0), ("d0", 1), ("d1", 0)))
        body = {"transactional_id": None, "acks": 1, "timeout_ms": 5000, "topic_data": [
            {"name": topic, "partition_data": [{"index": index, "records": _batch(rng, rng.randint(1, 5))}]}]}
        out.append((api.encode_request(PRODUCE, 7, i + 1, "fill", body), True))
    return out


def _fast_fetch_requests(seed, n, ends):
    """Mostly the fast path's common request (one partition, any version 4-17) at offsets the fast
    path must judge: log start, inside the log, HW-1, HW, beyond; partition limits that cut between
    batches or below one; leader epochs current, older, newer; with malformed frames, followers,
    sessions, several partitions, a non-empty rack and long polls at the HW in between.
    ``ends``: {(topic, partition): high watermark}. [(frame, answered)]"""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        r = rng.random()
        if r < 0.1:
            frame = fetch_frame(rng, i + 1)             # anything fetch_body makes
        else:
            (topic, index), hw = rng.choice(sorted(ends.items()))
            offset = rng.choice((0, 1, rng.randrange(hw), rng.randrange(hw), rng.randrange(hw), hw - 1, hw - 1,
                                 hw, hw + 1, 1 << 40))
            version = rng.choice(FETCH_VERSIONS)
            body = {"replica_id": -1, "max_wait_ms": rng.choice((0, 0, 0, 5)), "min_bytes": rng.choice((0, 1, 1, 1, 5000)),
                    "max_bytes": rng.choice((0x7FFFFFFF, 1 << 20, 300, 50)), "isolation_level": rng.choice((0, 1)),
                    "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [],
                    "rack_id": "", "topics": [{"topic": topic, "partitions": [{
                        "partition": index, "current_leader_epoch": rng.choice((-1, -1, 0, 0, 1)),
                        "fetch_offset": offset, "log_start_offset": -1,
                        "partition_max_bytes": rng.choice((1, 100, 150, 400, 1000, 1 << 20))}]}]}
            frame = fetch_request(version, i + 1, rng.choice(("fast", None, "", "ü-client")), body)
        if rng.random() < 0.1:
            frame = mutate_fetch(rng, frame)
        out.append((frame, True))
    return out


@pytest.fixture(scope="module")
def fetch_pair(tmp_path_factory):
    with _switch_pair(tmp_path_factory, "KBROKER_FAST_FETCH") as pair:
        yield pair


def test_fetch_fast_path_answers_byte_for_byte(fetch_pair):
    """The same log (the same Produce frames to both) and the same Fetch sequence to a broker with the
    Fetch fast path and one without: every outcome identical, and the fast path served most of the
    plain consumer fetches while the others (errors, out of range, long polls, followers, malformed)
    took the reference path."""
    (fast, ref), port = fetch_pair
    _run_both((fast, ref), _fill_requests(3, 300))
    ends = {}
    probe = RawConn(fast.bootstrap, timeout=10)
    try:
        for tp in (("d0", 0), ("d0", 1), ("d1", 0)):
            body = probe.request(FETCH, 11, {
                "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1, "isolation_level": 0,
                "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
                "topics": [{"topic": tp[0], "partitions": [{"partition": tp[1], "current_leader_epoch": -1,
                                                            "fetch_offset": 0, "log_start_offset": -1,
                                                            "partition_max_bytes": 1}]}]}, timeout=10)
            ends[tp] = body["responses"][0]["partitions"][0]["high_watermark"]
    finally:
        probe.close()
    assert min(ends.values()) > 100, ends
    before = _fast_counts(port, "fetch")
    first, kinds = _run_both((fast, ref), _fast_fetch_requests(11, 800, ends))
    assert kinds["answer"] > 500 and kinds["closed"] > 20, kinds
    after = _fast_counts(port, "fetch")
    served, left = after["fast"] - before.get("fast", 0), after["reference"] - before.get("reference", 0)
    assert served > 250 and left > 100, (served, left)
    # the answers carried records, cut at batch boundaries by the partition limits
    fetched = 0
    for o in first:
        if o[0] == "answer" and len(o[1]) > 200:
            fetched += 1
    assert fetched > 200, fetched


# ---- several topics / partitions in one consumer Fetch on the fast path ------------------------------
def _small_segment_fill(seed, n):
    """Produce frames for d2/0 and d2/1 (segment.bytes 600: closed segments to fetch from)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        body = {"transactional_id": None, "acks": 1, "timeout_ms": 5000, "topic_data": [
            {"name": "d2", "partition_data": [{"index": i % 2, "records": _batch(rng, rng.randint(1, 3))}]}]}
        out.append((api.encode_request(PRODUCE, 7, i + 1, "fill", body), True))
    return out


def _multi_fetch_requests(seed, n, ends):
    """Consumer fetches naming two to eight partitions of one to three topics (in any order, a
    partition now and then twice): offsets with data, at the HW, past it, out of range, in a closed
    segment (d2); an unknown partition or topic; partition limits that cut between batches or below
    one; max_bytes used up part-way through; min_bytes met or not (long polls of 5 ms); any rack id;
    versions 4-17. ``ends``: {(topic, partition): high watermark}. [(frame, answered)]"""
    rng = random.Random(seed)
    tps = sorted(ends)
    out = []
    for i in range(n):
        version = rng.choice(FETCH_VERSIONS)
        chosen = [rng.choice(tps) for _ in range(rng.randint(2, 8))]
        # mostly a plain consumer fetch (offsets near the end: the active segment), else one odd partition
        odd = rng.randrange(len(chosen)) if rng.random() < 0.35 else -1
        if odd >= 0 and rng.random() < 0.25:
            chosen[odd] = rng.choice((("d1", 3), ("nope", 0)))
        topics = []
        for k, (topic, index) in enumerate(chosen):
            hw = ends.get((topic, index), 10)
            offset = rng.choice((rng.randrange(hw - 4, hw), hw - 1, hw, hw, hw))
            epoch = rng.choice((-1, -1, 0))
            if k == odd:
                offset = rng.choice((0, rng.randrange(hw), hw + 1, 1 << 40, offset))
                epoch = rng.choice((1, epoch))
            part = {"partition": index, "current_leader_epoch": epoch,
                    "fetch_offset": offset, "log_start_offset": -1,
                    "partition_max_bytes": rng.choice((1, 100, 150, 400, 1000, 1 << 20))}
            if topics and topics[-1]["topic"] == topic and rng.random() < 0.7:
                topics[-1]["partitions"].append(part)
            else:
                topics.append({"topic": topic, "partitions": [part]})
        body = {"replica_id": -1, "max_wait_ms": rng.choice((0, 0, 0, 5)),
                "min_bytes": rng.choice((0, 1, 1, 1, 400, 5000)),
                "max_bytes": rng.choice((0x7FFFFFFF, 1 << 20, 1000, 300, 50)),
                "isolation_level": rng.choice((0, 1)), "session_id": 0, "session_epoch": -1,
                "forgotten_topics_data": [], "rack_id": rng.choice(("", "", "rack-a", "ü-rack")),
                "topics": topics}
        frame = fetch_request(version, i + 1, rng.choice(("fast", None, "ü-client")), body)
        if rng.random() < 0.05:
            frame = mutate_fetch(rng, frame)
        out.append((frame, True))
    return out


def _high_watermarks(bootstrap, tps) -> dict:
    conn = RawConn(bootstrap, timeout=10)
    ends = {}
    try:
        for topic, index in tps:
            body = conn.request(FETCH, 11, {
                "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1, "isolation_level": 0,
                "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
                "topics": [{"topic": topic, "partitions": [{"partition": index, "current_leader_epoch": -1,
                                                            "fetch_offset": 0, "log_start_offset": -1,
                                                            "partition_max_bytes": 1}]}]}, timeout=10)
            ends[(topic, index)] = body["responses"][0]["partitions"][0]["high_watermark"]
    finally:
        conn.close()
    return ends


def test_multi_partition_fetch_fast_path_byte_for_byte(fetch_pair):
    """Several partitions per consumer Fetch, fast path on and off: every outcome identical; the fast
    path served most of them, and its answers carried records of several partitions at once.
    Counter-checks (each broken alone, this test failed, restored): the budget not shrunk by each
    partition's bytes; every partition given a whole first batch (min_one_batch always on); the fast
    path limited to one partition again (0 served)."""
    (fast, ref), port = fetch_pair
    for c in (fast, ref):
        create_topic(c.bootstrap, "d2", 2, {"segment.bytes": 600})
    _run_both((fast, ref), _fill_requests(5, 120) + _small_segment_fill(6, 80))
    ends = _high_watermarks(fast.bootstrap, (("d0", 0), ("d0", 1), ("d1", 0), ("d2", 0), ("d2", 1)))
    assert min(ends.values()) > 35, ends
    before = _fast_counts(port, "fetch")
    reqs = _multi_fetch_requests(12, 700, ends)
    first, kinds = _run_both((fast, ref), reqs)
    assert kinds["answer"] > 600, kinds
    after = _fast_counts(port, "fetch")
    served, left = after["fast"] - before.get("fast", 0), after["reference"] - before.get("reference", 0)
    assert served > 300 and left > 100, (served, left)
    # answers with records of two partitions or more, and answers with records and empty rows (at the
    # HW, or the budget used up) side by side
    several = mixed = 0
    for (frame, _answered), o in zip(reqs, first):
        if o[0] != "answer" or frame[5] != FETCH:
            continue
        with contextlib.suppress(ProtocolError, ValueError, KeyError, struct.error):
            _cid, body = api.decode_response(FETCH, struct.unpack_from(">h", frame, 6)[0], o[1])
            rows = [p for t in body["responses"] for p in t["partitions"]]
            several += sum(1 for p in rows if p["records"]) >= 2
            mixed += any(p["records"] for p in rows) and any(
                not p["records"] and p["error_code"] == 0 and p["high_watermark"] > 0 for p in rows)
    assert several > 120 and mixed > 300, (several, mixed)


# ---- followers' fetches on the fast path -------------------------------------------------------------
# One broker (id 0) leads topic "r0", whose replicas are 0, 1 and 2; brokers 1 and 2 never run: the
# test speaks for them with raw follower fetches (replica_id 1 / 2), so the follower positions, the
# high watermark and the ISR move only with the sequence, the same on both brokers.
def _write_replicated_topic(zk_connect, name, partitions):
    """The topic's assignment (replicas 0, 1, 2 for each partition) written to ZooKeeper as an admin
    does (brokers 1 and 2 need not exist); the controller makes 0 the leader, ISR [0]."""
    from kazoo.client import KazooClient

    from kbroker.zk import layout

    zk = KazooClient(hosts=zk_connect, timeout=10)
    zk.start(timeout=10)
    try:
        tx = zk.transaction()
        tx.create(layout.topic_path(name), layout.encode_topic({p: [0, 1, 2] for p in range(partitions)},
                                                              layout.new_uuid_base64()))
        tx.create(layout.topic_config_path(name), layout.encode_config({}))
        assert all(r is True or isinstance(r, str) for r in tx.commit())
    finally:
        zk.stop()
        zk.close()


def _follower_fetch(version, correlation, replica, max_wait, min_bytes, max_bytes, parts):
    """A follower's sessionless Fetch (as kbroker/replica/fetcher.py sends v11). parts: [(topic,
    partition, current_leader_epoch, fetch_offset, partition_max_bytes)]."""
    topics = []
    for topic, index, epoch, offset, limit in parts:
        part = {"partition": index, "current_leader_epoch": epoch, "fetch_offset": offset,
                "log_start_offset": 0, "partition_max_bytes": limit}
        if topics and topics[-1]["topic"] == topic:
            topics[-1]["partitions"].append(part)
        else:
            topics.append({"topic": topic, "partitions": [part]})
    body = {"replica_id": replica, "max_wait_ms": max_wait, "min_bytes": min_bytes, "max_bytes": max_bytes,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [],
            "rack_id": "", "topics": topics}
    return fetch_request(version, correlation, "follower", body)


def _isr(bootstrap, topic):
    with RawConn(bootstrap) as c:
        resp = c.request(METADATA, 4, {"topics": [{"name": topic}], "allow_auto_topic_creation": False})
    return {p["partition_index"]: sorted(p["isr_nodes"]) for p in resp["topics"][0]["partitions"]}


def _wait_isr(bootstrap, topic, want, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        isr = _isr(bootstrap, topic)
        if all(v == want for v in isr.values()):
            return isr
        assert time.monotonic() < deadline, isr
        time.sleep(0.05)


def _follower_requests(seed, n):
    """Produce batches (acks=1: an acks=-1 answer would wait on the sequence's next fetches; 1-4
    records) to r0/0 and r0/1 and followers' fetches from
    replicas 1 and 2 in between: each follower at its own position, then its position moved to the
    log end (below, at and past the HW up to the LEO), sometimes behind it or past it; one or both
    partitions; partition limits and max_bytes that cut between batches or below one; leader epochs
    current, older, newer; now and then a partition named twice; v4-11; max_wait 0 or 5 ms with min_bytes 0, 1 or 5000 (long polls, and
    the caught-up follower's wait the fast path hands to Python with its positions recorded); now
    and then a broker that is not a replica, this leader itself, an unknown partition, a mutated
    frame. -> [(frame, answered)] (the log ends are simulated: every produce to r0 succeeds)."""
    rng = random.Random(seed)
    leo = {0: 0, 1: 0}
    pos = {(r, p): 0 for r in (1, 2) for p in (0, 1)}
    out = []
    for i in range(n):
        c = i + 1
        if rng.random() < 0.3:
            index = rng.randrange(2)
            k = rng.randint(1, 4)
            body = {"transactional_id": None, "acks": 1, "timeout_ms": 5000, "topic_data": [
                {"name": "r0", "partition_data": [{"index": index, "records": _batch(rng, k)}]}]}
            out.append((api.encode_request(PRODUCE, 7, c, "fill", body), True))
            leo[index] += k
            continue
        replica = rng.choice((1, 2, 1, 2, 1, 2, 1, 2, 3, 0))
        parts = []
        indexes = rng.sample((0, 1), rng.choice((1, 2, 2)))
        if rng.random() < 0.05:
            indexes = [indexes[0]] * 2      # a partition named twice: each row's HW after its own record
        for index in indexes:
            key = (replica if replica in (1, 2) else 1, index)
            r = rng.random()
            if r < 0.6:
                offset = pos[key]
            elif r < 0.8:
                offset = leo[index]
            elif r < 0.95:
                offset = rng.randint(0, leo[index])
            else:
                offset = leo[index] + rng.choice((1, 100))
            if offset <= leo[index] and replica in (1, 2):
                pos[key] = offset
            parts.append(("r0" if rng.random() > 0.03 else "nope", index, rng.choice((-1, 0, 0, 0, 0, 1)), offset,
                          rng.choice((1, 100, 300, 1000, 1 << 20))))
        # below v16: v16+'s leader hints (KIP-951) carry each broker's own port, which differ here
        version = rng.choice((11, 11, 11) + tuple(v for v in FETCH_VERSIONS if v < 16))
        frame = _follower_fetch(version, c, replica, rng.choice((0, 0, 5)), rng.choice((0, 1, 1, 5000)),
                                rng.choice((0x7FFFFFFF, 0x7FFFFFFF, 1000, 50)), parts)
        if rng.random() < 0.03:
            frame = mutate_fetch(rng, frame)
        out.append((frame, True))
        # what the follower's next fetch asks for: the end of what it got (whole batches: any
        # offset in a batch is served from the batch's start, so its log end is simulated loosely)
        for _t, index, _e, offset, _l in parts:
            key = (replica if replica in (1, 2) else 1, index)
            if rng.random() < 0.7 and replica in (1, 2):
                pos[key] = leo[index]
    return out


@pytest.fixture(scope="module")
def follower_pair(tmp_path_factory):
    clusters = []
    port = free_port()
    try:
        for mode in ("1", "0"):
            # no ISR shrink while the sequence runs (the simulated followers fetch when it says)
            c = LocalCluster(tmp_path_factory.mktemp(f"diff-follower-{mode}"), num_partitions=1,
                             env={"KBROKER_FAST_FETCH": mode},
                             overrides={"kbroker.metrics.port": port if mode == "1" else -1,
                                        "replica.lag.time.max.ms": 3_600_000})
            clusters.append(c)
            c.start()
            _write_replicated_topic(c.zk_connect, "r0", 2)
            wait_for_topic(c.bootstrap, "r0", 2)
        # both followers join the ISR (a fetch in the current epoch, 0; the reference path: the expansion is
        # its policy), one after the other (an ISR write in flight holds the next expansion back)
        for r in (1, 2):
            _run_both(clusters, [(_follower_fetch(11, r, r, 0, 0, 1 << 20, [("r0", 0, 0, 0, 1 << 20),
                                                                          ("r0", 1, 0, 0, 1 << 20)]), True)])
            for c in clusters:
                _wait_isr(c.bootstrap, "r0", list(range(r + 1)))
        yield clusters, port
    finally:
        for c in clusters:
            c.stop()


def test_follower_fetch_fast_path_byte_for_byte(follower_pair):
    """Followers' fetches (replica_id >= 0) with the fetch fast path on and off, produces in between:
    every answer identical (records up to the log end, the HW each fetch moved: the follower positions
    recorded before it), the ISR and the high watermarks the same at the end. The fast path
    answered most follower fetches (the rest: errors, long polls with data, non-replicas, mutations).
    Counter-checks (each broken alone, this test failed, restored): followers' reads bounded by the HW
    instead of the log end; the rows' HW left as read before the follower's position was recorded."""
    (fast, ref), port = follower_pair
    before = _fast_counts(port, "fetch")
    reqs = _follower_requests(31, 900)
    first, kinds = _run_both((fast, ref), reqs)
    assert kinds["answer"] > 800, kinds
    after = _fast_counts(port, "fetch")
    served, left = after["fast"] - before.get("fast", 0), after["reference"] - before.get("reference", 0)
    assert served > 200 and left > 50, (served, left)
    # follower answers carried records past the HW (up to the log end), and the HW moved
    past_hw = 0
    hws = set()
    for (frame, _answered), o in zip(reqs, first):
        if o[0] != "answer" or frame[5] != FETCH:
            continue
        with contextlib.suppress(ProtocolError, ValueError, KeyError, struct.error):
            _cid, body = api.decode_response(FETCH, struct.unpack_from(">h", frame, 6)[0], o[1])
            for t in body["responses"]:
                for p in t["partitions"]:
                    hws.add(p["high_watermark"])
                    if p["records"] and p["error_code"] == 0:
                        base = struct.unpack_from(">q", p["records"])[0]
                        past_hw += base >= p["high_watermark"]
    assert past_hw > 20 and len(hws) > 30, (past_hw, len(hws))
    assert _isr(fast.bootstrap, "r0") == _isr(ref.bootstrap, "r0") == {0: [0, 1, 2], 1: [0, 1, 2]}
    # the same high watermarks after the sequence (what the followers' recorded positions give)
    tps = [("r0", 0), ("r0", 1)]
    assert _high_watermarks(fast.bootstrap, tps) == _high_watermarks(ref.bootstrap, tps)


# ---- acks=-1 on partitions with followers (RF=3): parked natively (ParkedProduce) vs Python's waiter --
R3_POOL = (("r3", 0), ("r3", 1), ("r3", 2), ("r1", 0))      # r3: RF=3, all led by broker 0; r1: broker 0 alone


class _Leader:
    """What _run_both needs of a cluster: the address of broker 0 (every partition's leader)."""

    def __init__(self, c):
        self.bootstrap = f"127.0.0.1:{c.brokers[0].port}"
        self.brokers = c.brokers


def _isr_full(c, topic, n, size) -> bool:
    from checkers import METADATA
    with RawConn(f"127.0.0.1:{c.brokers[0].port}") as conn:
        resp = conn.request(METADATA, 8, {"topics": [{"name": topic}], "allow_auto_topic_creation": False,
                                          "include_cluster_authorized_operations": False,
                                          "include_topic_authorized_operations": False})
    parts = [p for t in resp["topics"] for p in t["partitions"] if p["leader_id"] == 0]
    return len(parts) == n and all(len(p["isr_nodes"]) == size for p in parts)


@pytest.fixture(scope="module")
def rf3_pair(tmp_path_factory):
    """Two 3-broker clusters, KBROKER_FAST_PRODUCE on and off, each with r3 (3 partitions, RF=3) and
    r1 (RF=1) led by broker 0, every ISR full; the fast one's broker 0 metrics on a free port."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from kbroker.testing import wait_until
    clusters = []
    port = free_port()
    try:
        for mode in ("1", "0"):
            c = LocalCluster(tmp_path_factory.mktemp(f"diff-rf3-{mode}"), brokers=3,
                             env={"KBROKER_FAST_PRODUCE": mode})
            if mode == "1":
                c.brokers[0].extra = {"kbroker.metrics.port": port}
            clusters.append(c)
            c.start()
            admin = AdminClient({"bootstrap.servers": c.bootstrap})
            for f in admin.create_topics([NewTopic("r3", 3, replica_assignment=[[0, 1, 2], [0, 2, 1], [0, 1, 2]]),
                                          NewTopic("r1", 1, replica_assignment=[[0]])]).values():
                f.result(30)
            wait_until(lambda c=c: _isr_full(c, "r3", 3, 3) and _isr_full(c, "r1", 1, 1), 60, "full ISRs")
        yield [_Leader(c) for c in clusters], port
    finally:
        for c in clusters:
            c.stop()


def _rf3_requests(seed, n, timeout_ms=10000, acks=(-1, -1, -1, -1, 1, 0)):
    """Produce requests of 1-4 partitions of R3_POOL, mostly acks=-1 (answered when the followers have
    it, or at ``timeout_ms``), some acks 1/0, a bad batch or the same partition twice now and then.
    [(frame, answered)]"""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        tps = rng.sample(R3_POOL, rng.randint(1, len(R3_POOL)))
        batches = [_batch(rng) for _ in tps]
        r = rng.random()
        if r < 0.06:
            k = rng.randrange(len(tps))
            batches[k] = _spoiled(rng, batches[k])
        elif r < 0.1:
            tps.append(tps[0])
            batches.append(_batch(rng))
        topics = []
        for (topic, index), batch in zip(tps, batches):
            if topics and topics[-1]["name"] == topic:
                topics[-1]["partition_data"].append({"index": index, "records": batch})
            else:
                topics.append({"name": topic, "partition_data": [{"index": index, "records": batch}]})
        body = {"transactional_id": None, "acks": rng.choice(acks), "timeout_ms": timeout_ms, "topic_data": topics}
        frame = api.encode_request(PRODUCE, rng.choice(VERSIONS), i + 1, rng.choice(("rf3", None)), body)
        out.append((frame, _answered(frame)))
    return out


@pytest.mark.slow
def test_fast_path_acks_all_with_followers_byte_for_byte(rf3_pair):
    """acks=-1 to partitions whose ISR has followers: the fast broker parks them natively, the other
    through append_records' DelayedProduce; every answer is the same bytes (successes once the HW
    covers them, REQUEST_TIMED_OUT rows of timeout_ms 0, per-partition errors of refused requests) and
    so are the leader's log files; the fast path served most of them."""
    brokers, port = rf3_pair
    reqs = _rf3_requests(33, 300)
    first, kinds = _run_both(brokers, reqs)
    assert kinds["answer"] > 150 and kinds["none"] > 20, kinds
    # followers paused (SIGSTOP, well inside replica.lag.time.max.ms and the ZooKeeper session): the
    # RF=3 rows time out at timeout_ms, r1's are acknowledged; then the followers catch up
    paused = _rf3_requests(34, 12, timeout_ms=150, acks=(-1,))
    outcomes = []
    for b in brokers:
        client = _Client(b.bootstrap)
        for bid in (1, 2):
            os.kill(b.brokers[bid].pid, signal.SIGSTOP)
        try:
            outcomes.append([client.run(frame, answered) for frame, answered in paused])
        finally:
            for bid in (1, 2):
                os.kill(b.brokers[bid].pid, signal.SIGCONT)
    assert compare(*outcomes) == [], compare(*outcomes)[:3]
    reqs, first = reqs + paused, first + outcomes[0]
    after, _kinds = _run_both(brokers, _rf3_requests(35, 40))
    reqs, first = reqs + _rf3_requests(35, 40), first + after
    counts = _fast_counts(port)
    assert counts.get("fast", 0) > 200 and counts.get("reference", 0) > 10, counts
    codes = {}
    for (frame, _answered), o in zip(reqs, first):
        if o[0] == "answer":
            _cid, body = api.decode_response(PRODUCE, struct.unpack_from(">h", frame, 6)[0], o[1])
            for t in body["responses"]:
                for p in t["partition_responses"]:
                    codes[p["error_code"]] = codes.get(p["error_code"], 0) + 1
    # none (RF=3 rows acknowledged after the followers, r1 at once), REQUEST_TIMED_OUT, and errors
    assert codes.get(0, 0) > 200 and codes.get(7, 0) > 10, codes
    _same_logs(brokers, R3_POOL)
