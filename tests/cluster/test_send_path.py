"""The send path of sendfile answers (kbroker.network.connection + ext/sendio.pyx ``SendCursor``).

Invariants:
* the native step writes an answer's bytes chunks and file ranges in order through a socket that fills
  up, stops on would-block with a return code, resumes at the next byte, counts the file bytes and
  ranges into the metrics, and fails on a file shorter than its range or a dead peer;
* a broker with a small socket send buffer serves large fetch answers to a slow real consumer
  (kafka-python) byte-identical, on both event loops (kbroker.event.loop: asyncio and uvloop);
* answers pipelined behind a blocked one leave in request order;
* clients that close mid-answer leave no descriptor behind (the uvloop writer's dup() included) and
  the broker keeps serving.
"""
from __future__ import annotations

import os
import socket
import struct
import uuid

import pytest

from checkers import wait_for_topic
from test_sendfile import _metrics     # the broker's kbroker_network_fetch_* counters
from kbroker._native.sendio import SendCursor
from kbroker.protocol import api
from kbroker.protocol.types import FileRegions

LOOPS = ["asyncio", "uvloop"]


class _Metrics:
    fetch_sendfile_calls = 0
    fetch_sendfile_bytes = 0


def _pair(buf=4096):
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buf)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buf)
    a.setblocking(False)
    b.setblocking(False)
    return a, b


def _drain(sock, into: bytearray):
    while True:
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return
        if not data:
            return
        into += data


def _data_file(tmp_path, size):
    data = os.urandom(size)
    path = tmp_path / "seg.log"
    path.write_bytes(data)
    return data, open(path, "rb")


def test_step_partial_sends_resume_at_the_right_byte(tmp_path):
    data, f = _data_file(tmp_path, 300_000)
    a, b = _pair()
    with f, a, b:
        fd = f.fileno()
        chunks = [b"H" * 37, FileRegions([(fd, 1000, 50_000), (f, 60_000, 100_000), (fd, 5, 0)]),
                  bytearray(b"middle"), b"", memoryview(b"0123456789")[2:], FileRegions([(fd, 299_000, 1000)])]
        expected = b"H" * 37 + data[1000:51_000] + data[60_000:160_000] + b"middle" + b"23456789" + data[299_000:]
        m = _Metrics()
        cur = SendCursor(chunks)
        assert cur.remaining == len(expected) and not cur.done
        got = bytearray()
        blocked = 0
        while not cur.send(a.fileno(), m):
            blocked += 1
            assert blocked < 10_000
            _drain(b, got)
            # everything sent so far has been read: what the cursor still owes is exactly the rest
            assert len(got) + cur.remaining == len(expected)
        _drain(b, got)
        assert cur.done and cur.remaining == 0
        assert bytes(got) == expected
        assert blocked >= 2                         # the socket filled up, more than once
        assert m.fetch_sendfile_bytes == 151_000
        assert m.fetch_sendfile_calls == 3          # the empty range is not a call
        assert cur.send(a.fileno(), m) is True     # done stays done, nothing more is written
        _drain(b, got)
        assert len(got) == len(expected)


def test_step_resumes_inside_a_bytes_chunk(tmp_path):
    a, b = _pair()
    payload = os.urandom(200_000)
    with a, b:
        cur = SendCursor([payload])
        assert cur.send(a.fileno()) is False
        assert cur.index == 0 and 0 < cur.offset < len(payload)
        got = bytearray()
        while not cur.send(a.fileno()):
            _drain(b, got)
        _drain(b, got)
        assert bytes(got) == payload


def test_step_file_shorter_than_its_range_is_an_error(tmp_path):
    data, f = _data_file(tmp_path, 1000)
    a, b = _pair(1 << 16)
    with f, a, b:
        m = _Metrics()
        cur = SendCursor([b"hdr", FileRegions([(f.fileno(), 0, 5000)])])
        with pytest.raises(ConnectionError, match="short sendfile"):
            cur.send(a.fileno(), m)
        assert m.fetch_sendfile_bytes == 1000 and m.fetch_sendfile_calls == 0
        got = bytearray()
        _drain(b, got)
        assert bytes(got) == b"hdr" + data


@pytest.mark.parametrize("first", ["bytes", "file"])
def test_step_dead_peer_is_an_oserror(tmp_path, first):
    _data, f = _data_file(tmp_path, 10_000)
    a, b = _pair()
    with f, a:
        b.close()
        chunks = [b"x" * 100] if first == "bytes" else [FileRegions([(f.fileno(), 0, 10_000)])]
        with pytest.raises(OSError) as e:
            SendCursor(chunks).send(a.fileno())
        assert isinstance(e.value, (BrokenPipeError, ConnectionResetError)), e.value


def test_cursor_refuses_bad_ranges():
    with pytest.raises(ValueError):
        SendCursor([FileRegions([(0, 0, -1)])])
    with pytest.raises(ValueError):
        SendCursor([FileRegions([(0, -5, 10)])])


# ---- through a broker ----------------------------------------------------------------------------

RECORDS = 2500
VALUE = 2000          # ~5 MB in one partition: fetch answers of up to 4 MiB through a 16 KiB send buffer
SNDBUF = 16 * 1024


@pytest.fixture(scope="module", params=LOOPS)
def filled(request, tmp_path_factory):
    """A broker on one event loop with a small socket send buffer, one topic of distinct random values."""
    import confluent_kafka as ck

    from kbroker.testing import LocalCluster, free_port

    loop = request.param
    mport = free_port()
    with LocalCluster(tmp_path_factory.mktemp(f"send-{loop}"), num_partitions=1,
                      overrides={"socket.send.buffer.bytes": SNDBUF, "kbroker.metrics.port": mport},
                      env={"KBROKER_EVENT_LOOP": loop}) as c:
        assert f"event loop: {loop} (kbroker.event.loop)" in c.brokers[0].log_path.read_text(errors="replace")
        topic = f"send-{uuid.uuid4().hex[:8]}"
        wait_for_topic(c.bootstrap, topic, 1)
        p = ck.Producer({"bootstrap.servers": c.bootstrap, "linger.ms": 50, "batch.size": 1 << 20,
                         "compression.type": "none"})
        values = [os.urandom(VALUE) for _ in range(RECORDS)]
        for v in values:
            while True:
                try:
                    p.produce(topic, value=v, partition=0)
                    break
                except BufferError:
                    p.poll(0.05)
        assert p.flush(60) == 0
        yield c, topic, values, mport


def _kafka_python_values(bootstrap, topic, n, timeout=90):
    """A slow reader: kafka-python with a 4 KiB receive buffer and 4 MiB partition fetches."""
    import time

    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                      auto_offset_reset="earliest", receive_buffer_bytes=4096, fetch_max_wait_ms=100,
                      max_partition_fetch_bytes=4 << 20, fetch_max_bytes=8 << 20)
    out = []
    try:
        tp = TopicPartition(topic, 0)
        c.assign([tp])
        c.seek_to_beginning(tp)
        deadline = time.monotonic() + timeout
        while len(out) < n:
            assert time.monotonic() < deadline, f"consumer stuck at {len(out)} of {n}"
            for msgs in c.poll(timeout_ms=500, max_records=100_000).values():
                out += [m.value for m in msgs]
    finally:
        c.close()
    return out


def test_slow_consumer_reads_large_answers_byte_identical(filled):
    c, topic, values, mport = filled
    before = _metrics(mport)
    got = _kafka_python_values(c.bootstrap, topic, len(values))
    after = _metrics(mport)
    assert got == values
    sent = after["kbroker_network_fetch_sendfile_bytes_total"] - before.get("kbroker_network_fetch_sendfile_bytes_total", 0)
    calls = after["kbroker_network_fetch_sendfile_calls_total"] - before.get("kbroker_network_fetch_sendfile_calls_total", 0)
    assert sent >= RECORDS * VALUE and calls >= 1


def _fetch_request(corr, topic, max_bytes):
    body = {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": max_bytes, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
            "topics": [{"topic": topic, "partitions": [{"partition": 0, "current_leader_epoch": -1,
                                                       "fetch_offset": 0, "log_start_offset": -1,
                                                       "partition_max_bytes": max_bytes}]}]}
    return api.encode_request(1, 11, corr, "send-path", body)


def _read_frame(s, started=False):
    """One response frame (size prefix removed); with ``started``: read its size prefix now and return
    a function that reads the rest."""
    def exact(n):
        buf = bytearray()
        while len(buf) < n:
            data = s.recv(min(n - len(buf), 1 << 16))
            assert data, "broker closed the connection"
            buf += data
        return buf
    size = struct.unpack(">i", exact(4))[0]
    if started:
        return lambda: exact(size)
    return exact(size)


def _small_window_conn(bootstrap):
    # the receive buffer set before connect, so the window the handshake announces is small too
    host, port = bootstrap.split(":")
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(30)
    s.connect((host, int(port)))
    return s


def test_answers_behind_a_blocked_one_stay_in_order(filled):
    c, topic, _values, _mport = filled
    s = _small_window_conn(c.bootstrap)
    # a large fetch first; once its answer has started (the broker's send blocked on the small
    # window), small answers and fetches behind it, read slowly
    plan = [(1, 4 << 20), (18, None), (1, 4 << 20), (18, None), (1, 64 << 10)]
    with s:
        frames = []
        for corr, (key, max_bytes) in enumerate(plan, 1):
            frames.append(_fetch_request(corr, topic, max_bytes) if key == 1
                          else api.encode_request(18, 0, corr, "send-path", {}))
        s.sendall(frames[0])
        first = _read_frame(s, started=True)
        for f in frames[1:]:
            s.sendall(f)
        records = []
        for corr, (key, _max) in enumerate(plan, 1):
            frame = first() if corr == 1 else _read_frame(s)
            got_corr, body = api.decode_response(key, 11 if key == 1 else 0, memoryview(frame))
            assert got_corr == corr
            if key == 1:
                part = body["responses"][0]["partitions"][0]
                assert part["error_code"] == 0
                records.append(bytes(part["records"]))
    assert len(records[0]) > 3 << 20 and records[0] == records[1]
    assert 0 < len(records[2]) <= len(records[0]) and records[0].startswith(records[2])


def _fd_count(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_client_closing_mid_answer_leaves_no_descriptor(filled):
    from kbroker.testing import wait_until

    c, topic, values, _mport = filled
    pid = c.brokers[0].pid
    host, port = c.bootstrap.split(":")

    def one_fetch_read_fully():
        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.sendall(_fetch_request(1, topic, 4 << 20))
            return len(_read_frame(s))

    assert one_fetch_read_fully() > 3 << 20        # segments open, the connection's path warmed up
    base = _fd_count(pid)      # may still hold that connection's socket: a bound one higher, not lower
    for i in range(6):
        s = _small_window_conn(c.bootstrap)                       # the broker's send blocks mid-answer
        s.sendall(_fetch_request(i, topic, 4 << 20))
        assert s.recv(1024)                                       # the answer has started
        s.close()
    wait_until(lambda: _fd_count(pid) <= base, 20, f"the broker's descriptors to return to {base}")
    # others are still served, in full
    assert _kafka_python_values(c.bootstrap, topic, len(values)) == values
    log_text = c.brokers[0].log_path.read_text(errors="replace")
    assert "Exception in callback" not in log_text and "Traceback" not in log_text
