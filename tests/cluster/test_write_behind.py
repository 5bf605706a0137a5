"""Write-behind of one receive chunk's Produce frames (ext/segment.pyx LeaderAppender, ext/request.pyx
dispatch_frames): the plain leader appends of consecutive Produce frames are committed as each frame is
handled and written with one writev per log when the run ends, before any other frame of the chunk is
served and before any answer leaves. Real processes and clients:

- a confluent-kafka producer with one record per request and many requests in flight (several frames per
  read): every acknowledged record reads back at its acknowledged offset, in order, acks=1 on one broker
  and acks=all on three brokers (RF=3);
- raw frames: Produce frames and a Fetch frame of the same partition in one send (one chunk): the fetch
  sees every produced record;
- kill -9 while that producer runs (slow): every acknowledged record survives the restart;
- a run whose write fails (a full log dir): its rows on the failed log answer KAFKA_STORAGE_ERROR as a
  lone failed append does, the others keep their offsets, acks=all waits on the lost batches are decided
  KAFKA_STORAGE_ERROR, acks=0 closes, the connection otherwise stays open; an idempotent batch whose
  log's pending write fails first is retried and appended; a real idempotent client on a filling disk.
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
from kbroker.testing import LocalCluster, wait_until
from kbroker.protocol.errors import Errors

import test_crash_recovery
from test_hostile_ops import KAFKA_STORAGE_ERROR, tmpfs  # noqa: F401 (a fixture: a small tmpfs, root only)

RECORDS = 3000
INVALID_RECORD = Errors.INVALID_RECORD


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("write-behind")) as c:
        yield c


def _delivery_reports():
    """-> (acked [(partition, offset, value)], failed [error], the on_delivery callback filling them)."""
    acked, failed = [], []

    def report(err, msg):
        if err is not None:
            failed.append(str(err))
        else:
            acked.append((msg.partition(), msg.offset(), msg.value().decode()))

    return acked, failed, report


def _produce_one_record_requests(bootstrap: str, topic: str, acks, n: int) -> list[tuple[int, int, str]]:
    """``n`` one-record Produce requests, all allowed in flight at once -> [(partition, offset, value)]."""
    import confluent_kafka as ck

    acked, failed, report = _delivery_reports()
    _wait_leader_serves(bootstrap, topic)

    p = ck.Producer({"bootstrap.servers": bootstrap, "acks": acks, "enable.idempotence": False,
                     "linger.ms": 0, "batch.num.messages": 1, "max.in.flight.requests.per.connection": 1000,
                     "message.timeout.ms": 60000})
    for i in range(n):
        p.produce(topic, partition=0, value=f"wb-{i}".encode(), on_delivery=report)
        p.poll(0)
    assert p.flush(60) == 0
    assert failed == [], failed[:5]
    return acked


def _wait_leader_serves(bootstrap: str, topic: str) -> None:
    """wait_for_topic reads one broker's metadata; the leader may not serve the partition yet. The
    first of 1,000 requests in flight would then fail NOT_LEADER_OR_FOLLOWER and, retried by a
    non-idempotent producer after later ones, land out of order (seen once in CI under load)."""
    import confluent_kafka as ck

    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"unused-{uuid.uuid4().hex}"})

    def serves():
        try:
            c.get_watermark_offsets(ck.TopicPartition(topic, 0), timeout=2)     # ListOffsets to the leader
            return True
        except ck.KafkaException:
            return False
    try:
        wait_until(serves, 30, f"the leader of {topic}-0 to serve it")
    finally:
        c.close()


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
    # fails is cut back and its requests answer KAFKA_STORAGE_ERROR; every record answered with an
    # offset is in the log, and after kill -9 and restart the log ends exactly after them.
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


# ---- a run whose write fails answers KAFKA_STORAGE_ERROR (the connection stays open) ------------------
def _frame(correlation_id: int, topic: str, parts: dict, acks: int = 1, *more: tuple[str, dict]) -> bytes:
    """A Produce v8 frame carrying ``parts`` ({partition: batch bytes}) of ``topic``, then ``more``
    topics' (name, parts)."""
    return encode_request(0, 8, correlation_id, "wb-test", {
        "transactional_id": None, "acks": acks, "timeout_ms": 10000,
        "topic_data": [{"name": t, "partition_data": [{"index": p, "records": b} for p, b in ps.items()]}
                       for t, ps in ((topic, parts),) + more]})


def _rows(conn, n: int) -> list[dict]:
    """The next ``n`` answers' partition rows, each answer as {partition: row without its index}."""
    out = []
    for _ in range(n):
        _h, body = decode_response(0, 8, memoryview(bytearray(conn.recv_frame(30))))
        out.append({r["index"]: {k: v for k, v in r.items() if k != "index"}
                    for t in body["responses"] for r in t["partition_responses"]})
    return out


@pytest.mark.slow
def test_failed_run_write_answers_storage_error_and_keeps_the_connection(tmp_path, tmpfs):  # noqa: F811
    # ~20 s. Two partitions in two log dirs, one on a full tmpfs. Pipelined Produce frames (one chunk,
    # so one write-behind run) to both: rows on the full log answer KAFKA_STORAGE_ERROR exactly as a lone
    # failed append does (-1 offsets, the write's message), rows on the other keep offsets that read
    # back, a multi-partition request gets both; the next request on the connection works. On the native
    # path (a fresh dir) and on the reference path (the dir is failing: appends are Python's until one
    # succeeds there). An idempotent batch after deferred plain batches of its log, whose pending write
    # fails first, answers the error and its retry is appended. acks=0 in a failed run closes.
    from test_produce_diskfull import _fill_to_last_page
    from test_produce_fast import Delta, idem, one

    import urllib.request
    from kbroker.testing import free_port

    port = free_port()
    dirs = [os.path.join(tmpfs, "data"), str(tmp_path / "data2")]
    with LocalCluster(tmp_path / "cluster", num_partitions=2, overrides={"log.dirs": ",".join(dirs),
                                                                         "kbroker.metrics.port": port}) as c:
        topic = f"wb-{uuid.uuid4().hex[:8]}"
        wait_for_topic(c.bootstrap, topic, 2)       # auto-created: 2 partitions, one per dir
        full = 0 if os.path.isdir(os.path.join(dirs[0], f"{topic}-0")) else 1
        good = 1 - full
        assert os.path.isdir(os.path.join(dirs[0], f"{topic}-{full}"))
        assert os.path.isdir(os.path.join(dirs[1], f"{topic}-{good}"))
        big = b"f" * 8000                           # needs new pages on the full tmpfs
        acked = {full: [], good: []}
        with RawConn(c.bootstrap, timeout=30) as conn:
            for p in (full, good):
                conn.send(_frame(1, topic, {p: one(b"warm")}))
                assert _rows(conn, 1)[0][p]["error_code"] == 0
                acked[p].append(b"warm")
            _fill_to_last_page(tmpfs)

            def run(tag: bytes, python: bool):
                # 5 requests in one chunk; the 4th names the full partition twice, which only the Python
                # path serves (its first row is appended, the second refused INVALID_RECORD)
                twice = encode_request(0, 8, 13, "wb-test", {
                    "transactional_id": None, "acks": 1, "timeout_ms": 10000, "topic_data": [
                        {"name": topic, "partition_data": [{"index": full, "records": one(big)},
                                                           {"index": full, "records": one(big)}]}]})
                with Delta(port) as d:
                    conn.send(b"".join([
                        _frame(10, topic, {good: one(b"%s-g0" % tag)}),
                        _frame(11, topic, {full: one(big)}),
                        _frame(12, topic, {good: one(b"%s-g1" % tag), full: one(big)}),
                        twice,
                        _frame(14, topic, {good: one(b"%s-g2" % tag)})]))
                    rows = _rows(conn, 3)
                    _h, body = decode_response(0, 8, memoryview(bytearray(conn.recv_frame(30))))
                    dup = [{k: v for k, v in r.items() if k != "index"}
                           for r in body["responses"][0]["partition_responses"]]
                    rows += _rows(conn, 1)
                # natively served (the 4th and maybe a next one not), or (a failing dir) all on the reference path
                assert (d.fast, d.reference) in ([(0, 5)] if python else [(4, 1), (3, 2)]), (d.fast, d.reference)
                assert dup[1]["error_code"] == INVALID_RECORD, dup
                base = len(acked[good])
                assert [r[good]["error_code"] for r in (rows[0], rows[2], rows[3])] == [0, 0, 0], rows
                assert [r[good]["base_offset"] for r in (rows[0], rows[2], rows[3])] == [base, base + 1, base + 2]
                acked[good] += [b"%s-g%d" % (tag, k) for k in range(3)]
                return rows[1][full], rows[2][full], dup[0]

            failed_native = run(b"n", False)        # the run's write fails at its end
            failed_python = run(b"p", True)         # the dir is failing: Python's appends, written at once
            conn.send(_frame(20, topic, {full: one(big)}))      # a lone request: written as handled
            lone = _rows(conn, 1)[0][full]
            assert lone["error_code"] == KAFKA_STORAGE_ERROR
            assert (lone["base_offset"], lone["log_append_time_ms"], lone["log_start_offset"]) == (-1, -1, -1)
            assert "No space left on device" in lone["error_message"], lone
            for row in failed_native + failed_python:
                assert row == lone, (row, lone)
            # the connection still serves
            conn.send(_frame(21, topic, {good: one(b"after")}))
            r = _rows(conn, 1)[0][good]
            assert (r["error_code"], r["base_offset"]) == (0, len(acked[good])), r
            acked[good].append(b"after")
        os.unlink(os.path.join(tmpfs, "ballast"))
        with RawConn(c.bootstrap, timeout=30) as conn:
            # the idempotent gap: plain batches deferred, then an idempotent batch of the same log whose
            # pending write (first) fails: both answer the error; the retry is appended, not a duplicate
            pid = 4242
            for seq in (0, 1):                      # producer known, steady state (native) from seq 1
                conn.send(_frame(30 + seq, topic, {full: idem(one(b"i%d" % seq), pid, 0, seq)}, acks=-1))
                r = _rows(conn, 1)[0][full]
                assert (r["error_code"], r["base_offset"]) == (0, len(acked[full])), r
                acked[full].append(b"i%d" % seq)
            _fill_to_last_page(tmpfs)
            with Delta(port) as d:
                conn.send(_frame(40, topic, {full: one(big)}) + _frame(41, topic, {full: one(big)})
                          + _frame(42, topic, {full: idem(one(b"i2" + big), pid, 0, 2)}, acks=-1))
                rows = [r[full] for r in _rows(conn, 3)]
            assert d.fast >= 2, (d.fast, d.reference)
            assert [r["error_code"] for r in rows] == [KAFKA_STORAGE_ERROR] * 3, rows
            os.unlink(os.path.join(tmpfs, "ballast"))
            for k in range(2):                      # the retry is appended; its own retry is the duplicate
                conn.send(_frame(50 + k, topic, {full: idem(one(b"i2" + big), pid, 0, 2)}, acks=-1))
                r = _rows(conn, 1)[0][full]
                assert (r["error_code"], r["base_offset"]) == (0, len(acked[full])), r
            acked[full].append(b"i2" + big)
        # acks=0 in a run whose write fails (the dir not failing yet: native): the connection closes after
        # the answers before it
        _fill_to_last_page(tmpfs)
        with RawConn(c.bootstrap, timeout=30) as conn:
            conn.send(_frame(60, topic, {good: one(b"z-g0")}) + _frame(61, topic, {full: one(big)}, acks=0)
                      + _frame(62, topic, {good: one(b"z-g1")}))
            r = _rows(conn, 1)[0][good]
            assert (r["error_code"], r["base_offset"]) == (0, len(acked[good])), r
            acked[good] += [b"z-g0", b"z-g1"]       # the second written in that run (its answer not sent)
            with pytest.raises((ConnectionError, OSError)):
                conn.recv_frame(10)
        os.unlink(os.path.join(tmpfs, "ballast"))
        # one error line per failing streak of the dir (3), none per cut-back run
        broker_log = c.brokers[0].log_tail(100000)
        assert broker_log.count("fail (first:") == 3 and "cut back" not in broker_log
        ends = {p: log_end_offset(c.bootstrap, topic, p) for p in (0, 1)}
        assert ends == {p: len(v) for p, v in acked.items()}, (ends, {p: len(v) for p, v in acked.items()})
        consumed = consume_confluent(c.bootstrap, topic, ends, timeout=60)
        got = {0: [], 1: []}
        for m in sorted(consumed, key=lambda m: (m.partition, m.offset)):
            got[m.partition].append(m.rec.value)
        assert got == acked
        # produce_failed once per failed row: 4 + 4 in the runs (INVALID_RECORD rows included), the lone
        # one, 3 in the idempotent one, the acks=0 one
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        failed = [ln for ln in text.splitlines()
                  if ln.startswith("kafka_server_brokertopicmetrics_failedproducerequests") and topic in ln]
        assert len(failed) == 1 and float(failed[0].split()[-1]) == 13, failed


@pytest.mark.slow
def test_failed_run_write_fails_parked_acks_all_rows_rf3(tmp_path, tmpfs):  # noqa: F811
    # ~20 s. Leader 0 with two log dirs, one on a full tmpfs: partition 0 of an RF=3 topic and an RF=1
    # topic there, partition 1 of the RF=3 topic on the other. acks=-1 requests in one chunk, parked until the followers have their rows: a
    # row on a full log waiting for the HW (native, and Python's for a request naming it twice) is decided
    # KAFKA_STORAGE_ERROR when the run's write fails; a row on a full log answered at once (RF=1) in a
    # parked request is rewritten when the request's answer is ready (Slot.lost); the rows on the other
    # log still wait for the HW and answer their offsets; the next request on the connection works.
    from test_produce_diskfull import _fill_to_last_page
    from test_produce_fast import isr_of, leader_conn, multi_topic, one

    c = LocalCluster(tmp_path / "c", brokers=3, overrides={"replica.lag.time.max.ms": 3000})
    dirs = [os.path.join(tmpfs, "data"), str(tmp_path / "data2")]
    c.brokers[0].extra = {"log.dirs": ",".join(dirs)}
    with c:
        topic = multi_topic(c, 2, replicas=[[0, 1, 2], [0, 2, 1]])
        single = multi_topic(c, 1, replicas=[[0]])
        for p in (0, 1):
            wait_until(lambda p=p: isr_of(c, topic, 0, p) == [0, 1, 2], 30, f"a full ISR of {p}")
        full, good, alone = 0, 1, 0                 # the least loaded dir, the first on ties
        assert [os.path.isdir(os.path.join(dirs[0], f"{t}-{p}")) for t, p in ((topic, 0), (topic, 1), (single, 0))] \
            == [True, False, True]
        big = b"f" * 8000
        with leader_conn(c, 0) as conn:
            _fill_to_last_page(tmpfs)
            twice = encode_request(0, 8, 3, "wb-test", {
                "transactional_id": None, "acks": -1, "timeout_ms": 20000, "topic_data": [
                    {"name": topic, "partition_data": [{"index": good, "records": one(b"g1")},
                                                       {"index": full, "records": one(big)},
                                                       {"index": full, "records": one(big)}]}]})
            conn.send(_frame(1, topic, {good: one(b"g0"), full: one(big)}, acks=-1) + twice
                      + _frame(4, topic, {good: one(b"g2")}, -1, (single, {alone: one(big)}))
                      + _frame(5, topic, {good: one(b"g3")}, acks=-1))
            answers = []
            for _ in range(4):
                _h, body = decode_response(0, 8, memoryview(bytearray(conn.recv_frame(30))))
                answers.append([(r["index"], r["error_code"], r["base_offset"], r["log_append_time_ms"],
                                 r["log_start_offset"], r.get("error_message"))
                                for t in body["responses"] for r in t["partition_responses"]])
            failed = (full, KAFKA_STORAGE_ERROR, -1, -1, -1, None)
            assert answers[0] == [(good, 0, 1, -1, 0, None), failed], answers[0]
            assert answers[1] == [(good, 0, 2, -1, 0, None), failed, (full, INVALID_RECORD, -1, -1, -1, None)], \
                answers[1]
            message = f"write to {dirs[0]}/{single}-0/00000000000000000000.log failed: No space left on device"
            assert answers[2] == [(good, 0, 3, -1, 0, None), (alone, KAFKA_STORAGE_ERROR, -1, -1, -1, message)], \
                answers[2]
            assert answers[3] == [(good, 0, 4, -1, 0, None)], answers[3]
            conn.send(_frame(6, topic, {good: one(b"g4")}, acks=-1))
            _h, body = decode_response(0, 8, memoryview(bytearray(conn.recv_frame(30))))
            r = body["responses"][0]["partition_responses"][0]
            assert (r["error_code"], r["base_offset"]) == (0, 5), r
            os.unlink(os.path.join(tmpfs, "ballast"))
        assert {p: log_end_offset(c.bootstrap, topic, p) for p in (0, 1)} == {good: 6, full: 1}
        assert log_end_offset(c.bootstrap, single, 0) == 1


def _produce_on_filling_disk(c, tmpfs, topic: str, partition: int, n: int, conf: dict) -> list:
    """``n`` one-record requests (confluent-kafka, ``conf``) to a log dir that fills up while they are
    sent (~2 MiB left); the space comes back once the broker reported the full dir. -> the acked
    (partition, offset, value); every record is acknowledged in the end."""
    import threading

    import confluent_kafka as ck
    from test_produce_diskfull import _fill

    _fill(tmpfs)
    ballast = os.path.join(tmpfs, "ballast")
    os.truncate(ballast, os.path.getsize(ballast) - (2 << 20))         # ~1000 records of 2 KB
    reported = c.brokers[0].log_tail(100000).count("fail (first:")

    def give_space_back():
        wait_until(lambda: c.brokers[0].log_tail(100000).count("fail (first:") > reported, 60, "the full dir")
        os.unlink(ballast)

    t = threading.Thread(target=give_space_back, daemon=True)
    t.start()
    acked, failed, report = _delivery_reports()

    p = ck.Producer({"bootstrap.servers": c.bootstrap, "linger.ms": 0, "batch.num.messages": 1,
                     "message.timeout.ms": 60000, "retry.backoff.ms": 50, **conf})
    for i in range(n):
        p.produce(topic, partition=partition, value=f"df-{partition}-{i}-".encode() + b"x" * 2000,
                  on_delivery=report)
        p.poll(0)
    assert p.flush(90) == 0
    t.join(60)
    assert not t.is_alive(), "the disk never filled up"
    assert failed == [], failed[:5]
    assert len(acked) == n
    return acked


@pytest.mark.slow
def test_pipelined_producers_on_filling_disk_lose_nothing(tmp_path, tmpfs):  # noqa: F811
    # ~20 s. confluent-kafka, one record per request, many in flight (several Produce frames per read:
    # write-behind runs), on a log dir that fills up while it sends: a plain producer (acks=1, its
    # batches deferred in runs whose write fails) and an idempotent one (acks=all, 5 in flight). Every
    # acknowledged record reads back at its offset, none twice.
    with LocalCluster(tmp_path / "cluster", num_partitions=2, overrides={"log.dirs": os.path.join(tmpfs, "data")}) as c:
        topic = f"wb-{uuid.uuid4().hex[:8]}"
        wait_for_topic(c.bootstrap, topic, 2)
        acked = _produce_on_filling_disk(c, tmpfs, topic, 0, 3000, {
            "acks": 1, "enable.idempotence": False, "max.in.flight.requests.per.connection": 1000})
        acked += _produce_on_filling_disk(c, tmpfs, topic, 1, 3000, {
            "acks": "all", "enable.idempotence": True, "max.in.flight.requests.per.connection": 5})
        ends = {p: log_end_offset(c.bootstrap, topic, p) for p in (0, 1)}
        consumed = consume_confluent(c.bootstrap, topic, ends, timeout=60)
        values = [m.rec.value for m in consumed]
        print(f"T-storerr-clients acked={len(acked)} log ends={ends}")
        assert len(values) == len(set(values)) == sum(ends.values()), (len(values), len(set(values)), ends)
        report = check_acked(acked, [(m.partition, m.offset, m.rec.value.decode()) for m in consumed])
        assert report.ok, report.line()


def test_lost_answer_rewrites_only_the_claimed_rows_of_each_version():
    # The rewrite dispatch_frames / Connection._finish apply to an answer whose batch was cut away: for
    # Produce v3-8, exactly the bytes encode_produce_response gives a failed append's row (-1 offsets,
    # v8 its message); rows already failed, other partitions and other topics unchanged; acks=0 closes.
    from types import SimpleNamespace

    from kbroker._native.request import Slot, encode_produce_response, lost_answer

    no_response, close = object(), object()
    msg = "write to /d/t-1/00000000000000000000.log failed: No space left on device"
    for v in range(3, 9):
        slot = Slot(SimpleNamespace(api_key=0, api_version=v), 0.0, 0.0)
        slot.lost = {("t", 1): msg, ("u", 0): msg}
        before = [("t", [[0, 0, 5, 7, 2, None], [1, 0, 9, 7, 2, None], [2, 0, 4, 7, 2, None]]),
                  ("u", [[0, 6, -1, -1, -1, "already failed"], [1, 0, 3, -1, 0, None]])]
        after = [("t", [[0, 0, 5, 7, 2, None], [1, KAFKA_STORAGE_ERROR, -1, -1, -1, msg], [2, 0, 4, 7, 2, None]]),
                 ("u", [[0, 6, -1, -1, -1, "already failed"], [1, 0, 3, -1, 0, None]])]
        got = lost_answer(slot, [encode_produce_response(v, 77, before)], no_response, close)
        assert got == [encode_produce_response(v, 77, after)], v
    assert lost_answer(slot, no_response, no_response, close) is close
