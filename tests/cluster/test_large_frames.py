"""Frames too large for the 32 KiB receive chunk (kbroker/network/connection.py): each arrives in a buffer
of its own and is then served exactly like a chunk's frames, by dispatch_frames: a plain Produce takes the
native fast path, an off-loop append or another API the reference paths. Whatever path answers it, the
frame's request memory goes back to the pool once the request no longer needs it
(`kbroker_network_request_pool_used_bytes` returns to what it was before the test's connections: each
open connection holds one receive chunk)."""
from __future__ import annotations

import urllib.request
import uuid

import pytest
from confluent_kafka import Producer

from checkers import METADATA, RawConn, create_topic, metered_cluster
from kbroker.testing import wait_until
from test_produce_fast import Delta, consume_values

RECEIVE_CHUNK = 32 * 1024


def pool_used(port: int) -> int:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith("kbroker_network_request_pool_used_bytes "):
            return int(float(line.rsplit(" ", 1)[1]))
    raise AssertionError("no kbroker_network_request_pool_used_bytes in the metrics")


def wait_pool_back(port: int, before: int) -> None:
    wait_until(lambda: pool_used(port) == before, 15, f"request memory back in the pool ({before} B)")


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    with metered_cluster(tmp_path_factory, "large") as cluster:
        yield cluster


def produce_values(bootstrap: str, topic: str, values: list[bytes]) -> None:
    """One Produce request per record (linger 0, one record a batch), uncompressed."""
    errors = []
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.num.messages": 1, "acks": 1,
                  "message.max.bytes": 4 << 20, "compression.type": "none"})
    for v in values:
        p.produce(topic, value=v, partition=0, on_delivery=lambda err, _m: errors.append(err) if err else None)
        p.poll(0)
    assert p.flush(60) == 0 and errors == [], errors


def round_trip(single, values: list[bytes], config: dict | None = None) -> Delta:
    """``values`` produced one request each to a fresh topic (after a first record that arms the
    partition's fast-path slot through Python), read back in order, and the request memory back in
    the pool -> the fast/reference counts of those requests."""
    c, port = single
    before = pool_used(port)
    topic = f"large-{uuid.uuid4().hex[:8]}"
    create_topic(c.bootstrap, topic, 1, config)
    produce_values(c.bootstrap, topic, [b"warm"])
    with Delta(port) as d:
        produce_values(c.bootstrap, topic, values)
    got = consume_values(c.bootstrap, topic, len(values) + 1)
    assert [v for _, v, _ in got] == [b"warm"] + values
    wait_pool_back(port, before)
    return d


def test_large_produce_frames_take_the_native_path(single):
    d = round_trip(single, [bytes([65 + i]) * (100_000 + i) for i in range(12)])    # 3x the chunk: own buffers
    assert (d.fast, d.reference) == (12, 0), (d.fast, d.reference)


def test_off_loop_append_of_a_large_frame_releases_it_when_answered(single):
    # >= kbroker.log.writer.offload.bytes (1 MiB): the reference path appends on the writer thread and
    # answers later, so the frame's buffer is held past dispatch_frames' return
    d = round_trip(single, [bytes([97 + i]) * ((1 << 20) + 1000 * i) for i in range(3)],
                   {"max.message.bytes": str(4 << 20)})
    assert (d.fast, d.reference) == (0, 3), (d.fast, d.reference)


def test_large_frame_of_another_api_takes_the_generic_path(single):
    c, port = single
    before = pool_used(port)
    names = [f"absent-{i:05d}-{'x' * 40}" for i in range(1000)]     # ~50 KB of Metadata request
    with RawConn(c.bootstrap) as conn:
        resp = conn.request(METADATA, 4, {"topics": [{"name": n} for n in names],
                                          "allow_auto_topic_creation": False}, timeout=30)
        assert sorted(t["name"] for t in resp["topics"]) == names
        assert {t["error_code"] for t in resp["topics"]} == {3}        # UNKNOWN_TOPIC_OR_PARTITION
        # the connection still serves a small request after it
        assert conn.request(METADATA, 4, {"topics": [], "allow_auto_topic_creation": False})["brokers"]
    wait_pool_back(port, before)


def test_malformed_large_produce_frame_closes_the_connection(single):
    c, port = single
    before = pool_used(port)
    body = b"\x00\x00\x00\x07\x00\x00\x00\x01\x00\x01x" + b"\xff" * (RECEIVE_CHUNK * 2)   # v7, garbage
    with RawConn(c.bootstrap) as conn:
        conn.send(len(body).to_bytes(4, "big") + body)
        assert conn.closed_by_peer(10), "a malformed large Produce frame left the connection open"
    wait_pool_back(port, before)
