"""Request metrics from the network layer (contract 2): every answered request is observed once, on
the path that served it, with queue/local/remote/send parts that add up to its total.

Invariants (a real broker, raw requests on one connection, /metrics parsed by prometheus-client):
- N Produce requests (acks=1 and acks=0, pipelined in one write) -> Produce TotalTimeMs count grows by N;
- a Fetch that long-polls max_wait_ms=400 counts once as FetchConsumer with total >= 400 ms, the wait
  counted as RemoteTimeMs, not LocalTimeMs (handler) or RequestQueueTimeMs;
- ApiVersions answered from the unsupported-version fallback is counted too.
"""
from __future__ import annotations

import struct
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from checkers import API_VERSIONS, FETCH, PRODUCE, RawConn, wait_for_topic
from kbroker.protocol import api
from kbroker.testing import LocalCluster, free_port
import builders


def _scrape(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, s.labels.get("request"))] = s.value
    return out


def _batch():
    return bytes(builders.batch(1, 100, int(time.time() * 1000), key=None, fill=b"m"))


@pytest.fixture(scope="module")
def metered(tmp_path_factory):
    port = free_port()
    with LocalCluster(tmp_path_factory.mktemp("reqmetrics"), num_partitions=1,
                      overrides={"kbroker.metrics.port": port}) as c:
        wait_for_topic(c.bootstrap, "rm", 1)
        _wait_until_leader(c.bootstrap)
        yield c, port


def _wait_until_leader(bootstrap, timeout=30.0):
    """Metadata can name the leader a moment before its replica manager leads (NOT_LEADER_OR_FOLLOWER
    for a Produce in between): retry one Produce until it is appended."""
    body = {"transactional_id": None, "acks": 1, "timeout_ms": 5000,
            "topic_data": [{"name": "rm", "partition_data": [{"index": 0, "records": _batch()}]}]}
    deadline = time.monotonic() + timeout
    with RawConn(bootstrap) as conn:
        while True:
            resp = conn.request(PRODUCE, 7, body)
            code = resp["responses"][0]["partition_responses"][0]["error_code"]
            if code == 0:
                return
            assert time.monotonic() < deadline, f"partition rm-0 not led after {timeout} s (error {code})"
            time.sleep(0.05)


def _count(s, metric, request):
    return s.get((f"kafka_network_requestmetrics_{metric}_count", request), 0.0)


def _sum(s, metric, request):
    return s.get((f"kafka_network_requestmetrics_{metric}_sum", request), 0.0)


def test_pipelined_produce_each_counted(metered):
    c, port = metered
    before = _count(_scrape(port), "totaltimems", "Produce")
    batch = _batch()
    frames = []
    for i in range(20):
        acks = 0 if i % 5 == 4 else 1          # 4 of 20 get no response but are answered all the same
        body = {"transactional_id": None, "acks": acks, "timeout_ms": 5000,
                "topic_data": [{"name": "rm", "partition_data": [{"index": 0, "records": batch}]}]}
        frames.append(api.encode_request(PRODUCE, 7, i + 1, "rm", body))
    with RawConn(c.bootstrap) as conn:
        conn.send(b"".join(frames))             # one write: the broker reads them together
        for i in range(16):
            cid, resp = api.decode_response(PRODUCE, 7, conn.recv_frame())
            assert resp["responses"][0]["partition_responses"][0]["error_code"] == 0
        # A request after the acks=0 ones: once it is answered, all before it were handled.
        assert conn.request(API_VERSIONS, 3, {})["error_code"] == 0
    after = _scrape(port)
    assert _count(after, "totaltimems", "Produce") - before == 20
    for part in ("requestqueuetimems", "localtimems", "remotetimems", "responsesendtimems"):
        assert _count(after, part, "Produce") == _count(after, "totaltimems", "Produce")


def test_long_poll_is_remote_time(metered):
    c, port = metered
    s0 = _scrape(port)
    with RawConn(c.bootstrap) as conn:
        end = conn.request(2, 5, {"replica_id": -1, "isolation_level": 0, "topics": [
            {"name": "rm", "partitions": [{"partition_index": 0, "current_leader_epoch": -1,
                                           "timestamp": -1}]}]})["topics"][0]["partitions"][0]["offset"]
        t0 = time.monotonic()
        resp = conn.request(FETCH, 11, {
            "replica_id": -1, "max_wait_ms": 400, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": "rm", "partitions": [{"partition": 0, "current_leader_epoch": -1,
                                                       "fetch_offset": end, "log_start_offset": -1,
                                                       "partition_max_bytes": 1 << 20}]}],
            "forgotten_topics_data": [], "rack_id": ""})
        waited = time.monotonic() - t0
        # The broker's clock stops once the answer's last byte is handed to the socket: after the client
        # may already have it (the woken client can run before the broker returns from its send), but
        # before the broker reads the next request on this connection.
        assert conn.request(API_VERSIONS, 3, {})["error_code"] == 0
        after = time.monotonic() - t0
    part = resp["responses"][0]["partitions"][0]
    assert resp["error_code"] == 0 and part["error_code"] == 0 and waited >= 0.4
    s1 = _scrape(port)
    assert _count(s1, "totaltimems", "FetchConsumer") - _count(s0, "totaltimems", "FetchConsumer") == 1
    total = _sum(s1, "totaltimems", "FetchConsumer") - _sum(s0, "totaltimems", "FetchConsumer")
    remote = _sum(s1, "remotetimems", "FetchConsumer") - _sum(s0, "remotetimems", "FetchConsumer")
    local = _sum(s1, "localtimems", "FetchConsumer") - _sum(s0, "localtimems", "FetchConsumer")
    assert 400 <= total <= after * 1000
    # The deadline is 400 ms after a point inside the handler's call: the wait is RemoteTimeMs. (Not a
    # share of the total: ResponseSendTimeMs grows when the broker is preempted around its send.)
    assert remote + local >= 400 and local < 50


def test_api_versions_fallback_counted(metered):
    c, port = metered
    before = _count(_scrape(port), "totaltimems", "ApiVersions")
    with RawConn(c.bootstrap) as conn:
        h = struct.pack(">hhih", API_VERSIONS, 99, 5, 2) + b"rm"
        conn.send(struct.pack(">i", len(h) + 1) + h + b"\0")
        cid, _body = api.decode_response(API_VERSIONS, 0, conn.recv_frame())
        assert cid == 5
    assert _count(_scrape(port), "totaltimems", "ApiVersions") - before == 1
