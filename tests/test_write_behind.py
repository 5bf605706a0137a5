"""Write-behind of one receive chunk's Produce frames (ext/segment.pyx LeaderAppender, ext/request.pyx
dispatch_frames): the plain leader appends of consecutive Produce frames are committed as each frame is
handled and written with one writev per log when the run ends, before any other frame of the chunk is
served and before any answer leaves. Real processes and clients:

- a confluent-kafka producer with one record per request and many requests in flight (several frames per
  read): every acknowledged record reads back at its acknowledged offset, in order, acks=1 on one broker
  and acks=all on three brokers (RF=3);
- raw frames: Produce frames and a Fetch frame of the same partition in one send (one chunk): the fetch
  sees every produced record;
- kill -9 while that producer runs (slow): every acknowledged record survives the restart.
The log-level behaviour (deferral, ordering against roll/idempotent/flush, write failures and ENOSPC at
the run's write) is in tests/test_log.py (test_write_behind_*, test_enospc_at_write_behind_*).
"""
from __future__ import annotations

import os
import uuid

import pytest

from checkers import RawConn, check_acked, consume_confluent, log_end_offset, wait_for_topic
from kbroker._native.batch import BatchBuilder, iter_batches
from kbroker.protocol.api import decode_response, encode_request
from kbroker.testing import LocalCluster

import test_crash_recovery
from test_hostile_ops import KAFKA_STORAGE_ERROR, tmpfs  # noqa: F401 (a fixture: a small tmpfs, root only)

RECORDS = 3000


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("write-behind")) as c:
        yield c


def _produce_one_record_requests(bootstrap: str, topic: str, acks, n: int) -> list[tuple[int, int, str]]:
    """``n`` one-record Produce requests, all allowed in flight at once -> [(partition, offset, value)]."""
    import confluent_kafka as ck

    acked, failed = [], []

    def report(err, msg):
        if err is not None:
            failed.append(str(err))
        else:
            acked.append((msg.partition(), msg.offset(), msg.value().decode()))

    p = ck.Producer({"bootstrap.servers": bootstrap, "acks": acks, "enable.idempotence": False,
                     "linger.ms": 0, "batch.num.messages": 1, "max.in.flight.requests.per.connection": 1000,
                     "message.timeout.ms": 60000})
    for i in range(n):
        p.produce(topic, partition=0, value=f"wb-{i}".encode(), on_delivery=report)
        p.poll(0)
    assert p.flush(60) == 0
    assert failed == [], failed[:5]
    return acked


def _check_read_back(bootstrap: str, topic: str, acked: list) -> None:
    import confluent_kafka as ck

    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"unused-{uuid.uuid4().hex}"})
    try:
        ends = {0: c.get_watermark_offsets(ck.TopicPartition(topic, 0), timeout=30)[1]}    # asks the leader
    finally:
        c.close()
    consumed = consume_confluent(bootstrap, topic, ends, timeout=60)
    report = check_acked(acked, [(m.partition, m.offset, m.rec.value.decode()) for m in consumed])
    assert report.ok, report.line()
    assert len(acked) == RECORDS == ends[0]
    # in order: one partition, sent one at a time, so offsets follow the send order
    assert [v for _p, _o, v in sorted(acked)] == [f"wb-{i}" for i in range(RECORDS)]


def test_pipelined_one_record_produce_acks1_reads_back_in_order(broker):
    topic = f"wb-{uuid.uuid4().hex[:8]}"
    wait_for_topic(broker.bootstrap, topic, 1)
    acked = _produce_one_record_requests(broker.bootstrap, topic, 1, RECORDS)
    _check_read_back(broker.bootstrap, topic, acked)


@pytest.mark.slow
def test_pipelined_one_record_produce_acks_all_rf3(tmp_path):
    with LocalCluster(tmp_path, brokers=3, overrides={"default.replication.factor": 3}) as c:
        topic = f"wb-{uuid.uuid4().hex[:8]}"
        wait_for_topic(c.bootstrap, topic, 1)
        acked = _produce_one_record_requests(c.bootstrap, topic, "all", RECORDS)
        _check_read_back(c.bootstrap, topic, acked)


def _produce_frame(topic: str, correlation_id: int, value: bytes) -> bytes:
    """A Produce v8 frame (acks=1) of one one-record batch for partition 0."""
    b = BatchBuilder()
    b.append(1_700_000_000_000 + correlation_id, None, value)
    return encode_request(0, 8, correlation_id, "wb-test", {
        "transactional_id": None, "acks": 1, "timeout_ms": 5000,
        "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": b.build()}]}]})


def test_fetch_pipelined_after_produce_frames_in_one_chunk_sees_them(broker):
    topic = f"wb-{uuid.uuid4().hex[:8]}"
    wait_for_topic(broker.bootstrap, topic, 1)
    n = 40
    frames = [_produce_frame(topic, i, f"chunk-{i}".encode()) for i in range(n)]
    frames.append(encode_request(1, 11, n, "wb-test", {
        "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
        "topics": [{"topic": topic, "partitions": [{
            "partition": 0, "current_leader_epoch": -1, "fetch_offset": 0, "log_start_offset": -1,
            "partition_max_bytes": 1 << 20}]}]}))
    with RawConn(broker.bootstrap, timeout=30) as c:
        c.send(b"".join(frames))           # ~4 KB: one read on loopback, so one chunk
        answers = [memoryview(bytearray(c.recv_frame(30))) for _ in range(n + 1)]
    for i in range(n):
        _h, body = decode_response(0, 8, answers[i])
        part = body["responses"][0]["partition_responses"][0]
        assert (part["error_code"], part["base_offset"]) == (0, i)
    _h, body = decode_response(1, 11, answers[n])
    part = body["responses"][0]["partitions"][0]
    assert part["error_code"] == 0 and part["high_watermark"] == n
    batches = iter_batches(part["records"] or b"")
    assert [b.base_offset for b in batches] == list(range(n))


@pytest.mark.slow
def test_kill9_during_pipelined_one_record_produce(tmp_path):
    # test_crash_recovery's acks=1 kill -9 run with one record per request and many in flight, so that
    # reads carry several Produce frames whose writes are deferred to the end of their chunk.
    child = test_crash_recovery.CONFLUENT_CHILD.replace(
        '"linger.ms": 2,', '"linger.ms": 0, "batch.num.messages": 1, "max.in.flight.requests.per.connection": 200,')
    assert child != test_crash_recovery.CONFLUENT_CHILD
    report, at_kill, after, errors, _out = test_crash_recovery._kill_during_produce(tmp_path, child)
    assert report.acked_lost == 0, report.lost_samples
    assert report.inconsistent == 0 and report.gaps == 0
    assert after >= 4000
    assert errors == [], errors[:10]


@pytest.mark.slow
def test_disk_full_under_pipelined_produce_loses_no_acked_record(tmp_path, tmpfs):  # noqa: F811
    # Sends of 16 Produce frames (one run each) until the log dir's tmpfs is full: the run whose writev
    # fails is cut back and its connection closed with no answer; every answered record is in the log,
    # and after kill -9 and restart the log ends exactly after them.
    with LocalCluster(tmp_path / "cluster", num_partitions=1,
                      overrides={"log.dirs": os.path.join(tmpfs, "data")}) as c:
        topic = f"wb-{uuid.uuid4().hex[:8]}"
        wait_for_topic(c.bootstrap, topic, 1)
        acked, failed, closed, n = [], False, False, 0
        with RawConn(c.bootstrap, timeout=30) as conn:
            for _ in range(2000):
                values = [f"df-{n + k}-".encode() + b"x" * 2000 for k in range(16)]
                conn.send(b"".join(_produce_frame(topic, n + k, v) for k, v in enumerate(values)))
                n += len(values)
                for v in values:
                    try:
                        answer = conn.recv_frame(30)
                    except ConnectionError:
                        closed = True
                        break
                    part = decode_response(0, 8, answer)[1]["responses"][0]["partition_responses"][0]
                    if part["error_code"]:
                        assert part["error_code"] == KAFKA_STORAGE_ERROR
                        failed = True
                    else:
                        assert part["base_offset"] == len(acked)
                        acked.append(v)
                if closed or failed:
                    break
        print(f"T-diskfull-write-behind answered={len(acked)} sent={n} closed={closed} storage_error={failed}")
        assert closed or failed, "the tmpfs never filled up"
        assert len(acked) > 1000
        c.kill(0)
        c.start_broker(0)
        wait_for_topic(c.bootstrap, topic, 1)
        leo = log_end_offset(c.bootstrap, topic, 0)
        assert leo == len(acked), f"log end {leo} after restart, {len(acked)} records answered"
        consumed = consume_confluent(c.bootstrap, topic, {0: leo}, timeout=60)
        assert [m.rec.value for m in consumed] == acked
