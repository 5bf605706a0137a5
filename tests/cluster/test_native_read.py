"""One native call per readable event (ext/request.pyx ``on_read``) against the connection's
Python reference (``Connection._read_py``, KBROKER_NATIVE_READ=0).

1. In process (tests/netserver.py ServerThread): the same pipelined byte stream (ApiVersions, an
   awaited Metadata, native Produce and Fetch handlers, a Fetch answer of two chunks: the Python
   ``_flush`` fallback) split at every byte boundary into two reads, then a long stream of it in
   seeded random pieces (the receive chunk's tail rotated with a partial frame in it, chunks reused
   while answers are pending), gives byte-identical answers with the native read path on and off.
2. Real brokers and real clients (confluent-kafka and kafka-python, produce and consume): every
   readable event of the broker is served natively (``kbroker_network_reads_total{path}``), or,
   when the broker was started with KBROKER_NATIVE_READ=0, every one by Python.

3. The native readable callback (``recv_ready``, asyncio's ``_read_ready__get_buffer`` in C) is the
   transport's on the native path only, and a peer's close (EOF) or reset, mid-frame or not, ends the
   connection on both paths.

Counter-checks (each broken on purpose, the named test failed, restored): on_read's chunk reuse kept
its local start/end at 0 without writing them to the connection (the split test: answers missing,
timed out); on_read counting a native read as python (the clients test, and the split test's read
counts); recv_ready ignoring EOF (the close test, native). recv_ready ignoring a recv error is NOT
caught by the reset case: after ECONNRESET the next recv reads EOF and the connection ends anyway.
"""
from __future__ import annotations

import asyncio
import random
import re
import socket
import struct
import time
import urllib.request
import uuid

import pytest

from kbroker import switches
from kbroker.protocol import api

from netserver import LOOPS, ServerThread, _conn


@pytest.fixture(autouse=True)
def _advertise():
    saved = dict(api.SUPPORTED)
    for k, lo, hi in ((18, 0, 3), (3, 0, 8), (0, 3, 8), (1, 4, 11)):
        api.advertise(k, lo, hi)
    yield
    api.SUPPORTED.clear()
    api.SUPPORTED.update(saved)


def _api_versions(conn, header, body):
    return {"error_code": 0, "api_keys": [{"api_key": 18, "min_version": 0, "max_version": 3}],
            "throttle_time_ms": 0}


async def _metadata(conn, header, body):
    # awaited: its answer is queued after the read that brought it (answers stay in request order)
    await asyncio.sleep(0.001)
    return {"brokers": [], "controller_id": 0,
            "topics": [{"error_code": 0, "name": t["name"], "is_internal": False, "partitions": []}
                       for t in body["topics"] or []]}


def _produce(conn, req):
    # native Produce handler: an answer naming each partition and its records' size
    return api.encode_response(0, req.api_version, req.correlation_id, {"responses": [
        {"name": name, "partition_responses": [
            {"index": index, "error_code": 0, "base_offset": len(records or b""), "log_append_time_ms": -1,
             "log_start_offset": 0, "record_errors": [], "error_message": None}
            for index, records in parts]} for name, parts in req.topics], "throttle_time_ms": 0})


def _fetch(conn, req):
    # native Fetch handler: an answer in two chunks (taken by the connection's Python _flush)
    chunks = api.encode_response(1, req.api_version, req.correlation_id, {
        "throttle_time_ms": 0, "error_code": 0, "session_id": 0, "responses": [
            {"topic": t, "partitions": [
                {"partition_index": p[0], "error_code": 0, "high_watermark": p[2], "last_stable_offset": p[2],
                 "log_start_offset": 0, "aborted_transactions": [], "preferred_read_replica": -1,
                 "records": None} for p in parts]} for t, parts in req.topics]})
    data = b"".join(chunks)
    return [data[:7], data[7:]]


def _stream(seed: int) -> tuple[bytes, int]:
    """Pipelined requests (their frames back to back) -> (bytes, how many answers)."""
    rng = random.Random(seed)
    frames = []
    cid = seed * 100
    for _ in range(6):
        cid += 1
        kind = rng.randrange(4)
        if kind == 0:
            frames.append(api.encode_request(18, 0, cid, "c" * rng.randrange(40), {}))
        elif kind == 1:
            frames.append(api.encode_request(3, 1, cid, "m", {"topics": [
                {"name": "t%d" % rng.randrange(1000)} for _ in range(rng.randrange(1, 4))]}))
        elif kind == 2:
            frames.append(api.encode_request(0, rng.randrange(3, 9), cid, "p", {
                "transactional_id": None, "acks": 1, "timeout_ms": 1000, "topic_data": [
                    {"name": "t", "partition_data": [{"index": i, "records": b"r" * rng.randrange(300)}
                                                     for i in range(rng.randrange(1, 3))]}]}))
        else:
            frames.append(api.encode_request(1, 11, cid, "f", {
                "replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
                "session_id": 0, "session_epoch": -1, "topics": [{"topic": "t", "partitions": [
                    {"partition": 0, "current_leader_epoch": -1, "fetch_offset": rng.randrange(99),
                     "log_start_offset": -1, "partition_max_bytes": 100}]}],
                "forgotten_topics_data": [], "rack_id": ""}))
    return b"".join(frames), len(frames)


def _read_answers(s, n) -> bytes:
    data = b""
    got = 0
    pos = 0
    while got < n:
        while len(data) - pos >= 4 and len(data) - pos - 4 >= struct.unpack_from(">i", data, pos)[0]:
            pos += 4 + struct.unpack_from(">i", data, pos)[0]
            got += 1
        if got >= n:
            break
        chunk = s.recv(65536)
        assert chunk, "connection closed"
        data += chunk
    assert pos == len(data), "more bytes than answers"
    return data


def _session(srv, native: bool) -> tuple[list[bytes], int]:
    """One connection with the native read path ``native``; -> (its answers per exchange, reads)."""
    srv.call(lambda: setattr(srv.server, "native_read", native))
    before = srv.call(lambda: (srv.server.metrics.reads.native, srv.server.metrics.reads.reference))
    out = []
    s = _conn(srv.port)
    try:
        s.settimeout(10)
        s.sendall(api.encode_request(18, 0, 0, "c", {}))
        _read_answers(s, 1)
        # the transport's readable callback: ext/conn.pxi recv_ready on the native path, asyncio's own
        # _read_ready__get_buffer on the Python one or where asyncio's internals are not to be used
        if srv.loop_name == "asyncio":          # uvloop's transport reads in its own C, then calls on_read
            internals = srv.call(lambda: srv.server.asyncio_internals)
            cbs = srv.call(lambda: [(getattr(c.transport._read_ready_cb, "__name__", "?"), c._direct_write)
                                    for c in srv.server.connections])
            assert cbs == [("recv_ready" if native and internals else "_read_ready__get_buffer", internals)], cbs
        small, n = _stream(1)
        for k in range(1, len(small)):           # every byte boundary: two reads
            s.sendall(small[:k])
            time.sleep(0.001)
            s.sendall(small[k:])
            out.append(_read_answers(s, n))
        rng = random.Random(7)
        for seed in range(2, 40):                # long streams in random pieces, several in flight
            data, n = _stream(seed)
            data, n = data * 3, n * 3
            pos = 0
            while pos < len(data):
                step = rng.choice((1, 3, 17, 200, 1000, 5000))
                s.sendall(data[pos:pos + step])
                pos += step
                if rng.random() < 0.3:
                    time.sleep(0.0005)
            out.append(_read_answers(s, n))
    finally:
        s.close()
    after = srv.call(lambda: (srv.server.metrics.reads.native, srv.server.metrics.reads.reference))
    reads = (after[0] - before[0], after[1] - before[1])
    return out, reads


@pytest.mark.parametrize("loop_name", LOOPS)
def test_split_reads_answer_the_same_native_and_python(loop_name):
    handlers = {18: _api_versions, 3: _metadata}
    with ServerThread(handlers, loop_name, native_handlers={0: _produce, 1: _fetch}) as srv:
        # the native read path is the default on both loops (KBROKER_NATIVE_READ=0: off)
        assert srv.server.native_read == switches.current.native_read
        native, native_reads = _session(srv, True)
        python, python_reads = _session(srv, False)
    small, _n = _stream(1)
    assert len(native) == len(python) == len(small) - 1 + 38
    for i, (a, b) in enumerate(zip(native, python)):
        assert a == b, f"exchange {i} differs"
    # each path really served its session, and the splits were separate reads (most of them)
    assert native_reads[1] == 0 and native_reads[0] > len(small), native_reads
    assert python_reads[0] == 0 and python_reads[1] > len(small), python_reads


def test_without_asyncio_internals_the_native_read_keeps_to_the_public_transport():
    """On a CPython minor version other than kbroker.network.server.ASYNCIO_INTERNALS_VERSION (here: the
    server's asyncio_internals switched off) the transport's own readable callback and writes serve,
    the frames still go through on_read, and every answer equals the Python reference path's."""
    handlers = {18: _api_versions, 3: _metadata}
    with ServerThread(handlers, "asyncio", native_handlers={0: _produce, 1: _fetch}) as srv:
        srv.call(lambda: setattr(srv.server, "asyncio_internals", False))
        public, public_reads = _session(srv, True)
        python, _python_reads = _session(srv, False)
    assert public == python
    assert public_reads[1] == 0 and public_reads[0] > 0, public_reads


@pytest.mark.parametrize("loop_name", LOOPS)
@pytest.mark.parametrize("native", [True, False])
def test_peer_close_and_reset_end_the_connection(native, loop_name):
    """A client that closes (EOF: asyncio's _read_ready__on_eof) or resets (ECONNRESET from recv: the
    transport's _fatal_error), mid-frame or between requests, is gone from the server promptly."""
    with ServerThread({18: _api_versions}, loop_name) as srv:
        srv.call(lambda: setattr(srv.server, "native_read", native))
        for reset in (False, True):
            for partial in (b"", api.encode_request(18, 0, 1, "c", {})[:7]):
                s = _conn(srv.port)
                s.sendall(api.encode_request(18, 0, 0, "c", {}))
                _read_answers(s, 1)
                assert srv.call(lambda: len(srv.server.connections)) == 1
                if partial:
                    s.sendall(partial)
                    time.sleep(0.05)
                if reset:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.close()
                deadline = time.monotonic() + 5
                while srv.call(lambda: len(srv.server.connections)) and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert srv.call(lambda: len(srv.server.connections)) == 0, (reset, partial)
        reads = srv.call(lambda: (srv.server.metrics.reads.native, srv.server.metrics.reads.reference))
        assert (reads[0] > 0) == native and (reads[1] > 0) != native, reads


# ---- real brokers, real clients -------------------------------------------------------------------
_READS = re.compile(r'^kbroker_network_reads_total\{path="(\w+)"\} (\S+)$', re.M)


def read_counts(port: int) -> dict:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {path: int(float(n)) for path, n in _READS.findall(text)}


from test_produce_fast import consume_values, produce_confluent, single  # noqa: E402,F401


def test_clients_are_read_natively(single):
    """confluent-kafka and kafka-python produce and consume; the broker's reads: all native (all
    Python when this run's brokers have KBROKER_NATIVE_READ=0)."""
    from kafka import KafkaProducer

    from checkers import consume_kafka_python, create_topic

    c, port = single
    topic = f"nr-{uuid.uuid4().hex[:8]}"
    create_topic(c.bootstrap, topic, 1)
    before = read_counts(port)
    assert produce_confluent(c.bootstrap, topic, 50) == []
    kp = KafkaProducer(bootstrap_servers=c.bootstrap, linger_ms=0, acks=1)
    for i in range(50, 100):
        kp.send(topic, key=b"k%d" % i, value=b"value-%d" % i, partition=0).get(timeout=30)
    kp.close()
    want = [b"value-%d" % i for i in range(100)]
    assert [v for _o, v, _t in consume_values(c.bootstrap, topic, 100)] == want
    assert [m.rec.value for m in consume_kafka_python(c.bootstrap, topic, {0: 100})] == want
    after = read_counts(port)
    native = after.get("native", 0) - before.get("native", 0)
    reference = after.get("reference", 0) - before.get("reference", 0)
    if not switches.current.native_read:
        assert native == 0 and reference > 20, (native, reference)
    else:
        assert reference == 0 and native > 20, (native, reference)
