"""Crash recovery: kill -9 of the broker under load, and damaged segment tails.

(a) kafka-python with its defaults (idempotent, acks=all) produces from a child process that logs
    every acknowledged (partition, offset, value); the broker is killed with SIGKILL mid-stream and
    restarted while the producer keeps retrying. Invariants: acked_lost == 0 (every acknowledged
    record is at its acknowledged offset), dups == 0 (retried batches deduplicated), offsets
    contiguous, and acknowledgements continue after the restart.
(b) the same with confluent-kafka acks=1 (not idempotent): acked_lost == 0, contiguous; duplicates
    are legal there (a batch written but not acknowledged before the crash is resent) and reported.
(c) damage to the active segment after kill -9 — cut mid-batch, garbage appended, one flipped byte
    in the last batch: after restart the log ends at the last valid batch, every batch left passes
    its CRC, reads work and appends continue at that offset.
Each checker is shown to see a violation: fabricated loss/duplicates/gaps, and a real loss made by
cutting an acknowledged batch off the segment.
"""
from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from checkers import (all_batches, check_acked, consume_confluent, crc_ok, end_offsets, log_end_offset,
                      offset_gaps, scan_log, segment_files, wait_for_topic, wait_until)
from kbroker.testing import LocalCluster

pytestmark = pytest.mark.slow

PARTITIONS = 3

KAFKA_PYTHON_CHILD = textwrap.dedent("""
    import os, sys, time
    from kafka import KafkaProducer
    bootstrap, topic, ack_path, err_path, stop_path = sys.argv[1:]
    acks = open(ack_path, "a", buffering=1)
    errs = open(err_path, "a", buffering=1)
    def ok(value, md):
        acks.write(f"{md.partition} {md.offset} {value}\\n")
    def bad(value, exc):
        errs.write(f"{value} {type(exc).__name__}: {exc}\\n")
    # defaults: acks=all, enable_idempotence=True, retries=inf, delivery_timeout_ms=120000
    p = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=2, reconnect_backoff_max_ms=500)
    n = 0
    while not os.path.exists(stop_path):
        value = f"kp-{n}"
        f = p.send(topic, key=str(n % 64).encode(), value=value.encode())
        f.add_callback(ok, value)
        f.add_errback(bad, value)
        n += 1
        if n % 100 == 0:
            time.sleep(0.01)
    p.flush(120)
    p.close(30)
    print("sent", n, flush=True)
""")

CONFLUENT_CHILD = textwrap.dedent("""
    import os, sys, time
    import confluent_kafka as ck
    bootstrap, topic, ack_path, err_path, stop_path = sys.argv[1:]
    acks = open(ack_path, "a", buffering=1)
    errs = open(err_path, "a", buffering=1)
    def report(err, msg):
        if err is not None:
            errs.write(f"{msg.value().decode()} {err}\\n")
        else:
            acks.write(f"{msg.partition()} {msg.offset()} {msg.value().decode()}\\n")
    p = ck.Producer({"bootstrap.servers": bootstrap, "acks": 1, "enable.idempotence": False,
                     "linger.ms": 2, "message.timeout.ms": 120000, "reconnect.backoff.max.ms": 500})
    n = 0
    while not os.path.exists(stop_path):
        try:
            p.produce(topic, key=str(n % 64).encode(), value=f"ck-{n}".encode(), on_delivery=report)
        except BufferError:
            p.poll(0.05)
            continue
        n += 1
        p.poll(0)
        if n % 100 == 0:
            time.sleep(0.01)
    left = p.flush(120)
    print("sent", n, "unflushed", left, flush=True)
""")


def _read_acks(path):
    out = []
    try:
        text = path.read_text()
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        parts = line.split(" ")
        if len(parts) == 3:
            out.append((int(parts[0]), int(parts[1]), parts[2]))
    return out


def _count_lines(path):
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def _kill_during_produce(tmp_path, child_src):
    """Run the child producer, SIGKILL the broker mid-stream, restart it, let the producer continue,
    stop it, drain everything and return (report, acks before kill, acks after restart, errors)."""
    with LocalCluster(tmp_path / "cluster", num_partitions=PARTITIONS, session_timeout_ms=4000) as c:
        topic = f"crash-{uuid.uuid4().hex[:8]}"
        wait_for_topic(c.bootstrap, topic, PARTITIONS)
        script = tmp_path / "child.py"
        script.write_text(child_src)
        ack_path, err_path, stop_path = tmp_path / "acks.txt", tmp_path / "errors.txt", tmp_path / "stop"
        out = open(tmp_path / "child.out", "wb")
        child = subprocess.Popen([sys.executable, str(script), c.bootstrap, topic, str(ack_path), str(err_path),
                                  str(stop_path)], stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: _count_lines(ack_path) >= 4000, 60, "4000 acknowledgements before the kill")
            c.kill(0)
            at_kill = _count_lines(ack_path)
            c.start_broker(0)
            restarted = _count_lines(ack_path)
            wait_until(lambda: _count_lines(ack_path) >= restarted + 4000, 90,
                       "4000 more acknowledgements after the restart")
            stop_path.write_text("stop")
            child.wait(timeout=150)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(10)
            out.close()
        child_out = (tmp_path / "child.out").read_text(errors="replace")
        assert child.returncode == 0, child_out[-3000:]
        acks = _read_acks(ack_path)
        errors = err_path.read_text().splitlines() if err_path.exists() else []
        ends = end_offsets(c.bootstrap, topic, PARTITIONS)
        consumed = consume_confluent(c.bootstrap, topic, ends, timeout=120)
        report = check_acked(acks, [(m.partition, m.offset, m.rec.value.decode()) for m in consumed])
        return report, at_kill, len(acks) - at_kill, errors, child_out


def test_kill9_during_idempotent_produce(tmp_path):
    report, at_kill, after, errors, child_out = _kill_during_produce(tmp_path, KAFKA_PYTHON_CHILD)
    print(f"T-crash client=kafka-python acks=all idem=on faults=1xSIGKILL {report.line()} "
          f"acked_before_kill={at_kill} acked_after={after} errors={len(errors)} {child_out.strip()}")
    assert report.acked_lost == 0, report.lost_samples
    assert report.inconsistent == 0
    assert report.duplicates == 0, "idempotent retries across the restart were appended twice"
    assert report.gaps == 0
    assert after >= 4000, "the producer did not get going again after the restart"
    assert errors == [], errors[:10]


def test_kill9_during_acks1_produce(tmp_path):
    report, at_kill, after, errors, child_out = _kill_during_produce(tmp_path, CONFLUENT_CHILD)
    print(f"T-crash client=confluent-kafka acks=1 idem=off faults=1xSIGKILL {report.line()} "
          f"acked_before_kill={at_kill} acked_after={after} errors={len(errors)} {child_out.strip()}")
    assert report.acked_lost == 0, report.lost_samples
    assert report.inconsistent == 0
    assert report.gaps == 0
    assert after >= 4000
    assert errors == [], errors[:10]


# ---- checker self-tests ------------------------------------------------------------------------------

def test_ack_checker_counts_fabricated_violations():
    consumed = [(0, o, f"v{o}") for o in range(10)] + [(1, o, f"w{o}") for o in range(5)]
    acked = list(consumed)
    assert check_acked(acked, consumed).ok
    # lost: acknowledged at (0, 10) but never read
    r = check_acked(acked + [(0, 10, "v10")], consumed)
    assert (r.acked_lost, r.duplicates, r.gaps) == (1, 0, 0)
    # a duplicate value at a new offset
    r = check_acked(acked, consumed + [(1, 5, "w2")])
    assert (r.acked_lost, r.duplicates, r.gaps) == (0, 1, 0)
    # a hole in partition 0 (offset 4 missing) and an acknowledged value found elsewhere
    holed = [x for x in consumed if x[:2] != (0, 4)]
    r = check_acked(acked, holed)
    assert r.acked_lost == 1 and r.gaps == 1
    r = check_acked(acked, [(p, o, "x" if (p, o) == (1, 3) else v) for p, o, v in consumed])
    assert r.inconsistent == 1 and not r.ok
    assert offset_gaps({0: [1, 2, 3]}) == 1 and offset_gaps({0: [0, 1, 1, 2]}) == 1


# ---- (c) damaged tails --------------------------------------------------------------------------------

def _produce(bootstrap, topic, partition, values):
    import confluent_kafka as ck

    acked = []
    p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 100})

    def cb(err, msg):
        assert err is None, err
        acked.append((msg.partition(), msg.offset(), msg.value().decode()))

    for v in values:
        p.produce(topic, value=v.encode(), partition=partition, on_delivery=cb)
    assert p.flush(30) == 0
    return acked


def _damage(path, kind, rng):
    batches, tail = scan_log(path)
    assert tail == 0 and len(batches) >= 3
    last = batches[-1]
    size = os.path.getsize(path)
    if kind == "truncated":
        os.truncate(path, last.position + last.size // 2)
        return last.base_offset
    if kind == "garbage":
        with open(path, "ab") as f:
            f.write(rng.randbytes(3000))
        return last.last_offset + 1
    if kind == "flipped":
        pos = last.position + 61 + rng.randrange(last.size - 61)   # inside the records, after the header
        with open(path, "r+b") as f:
            f.seek(pos)
            b = f.read(1)
            f.seek(pos)
            f.write(bytes([b[0] ^ 0x10]))
        assert os.path.getsize(path) == size
        return last.base_offset
    raise ValueError(kind)


DAMAGE = ["truncated", "garbage", "flipped"]


def test_damaged_tail_is_cut_back(tmp_path):
    rng = random.Random(5)
    with LocalCluster(tmp_path / "cluster", num_partitions=len(DAMAGE), session_timeout_ms=4000,
                      overrides={"log.segment.bytes": 262144}) as c:
        data_dir = c.brokers[0].data_dir
        topic = f"tail-{uuid.uuid4().hex[:8]}"
        wait_for_topic(c.bootstrap, topic, len(DAMAGE))
        acked = {}
        for p in range(len(DAMAGE)):
            values = [f"p{p}-{i}-" + "x" * rng.randint(10, 200) for i in range(3000)]
            acked[p] = _produce(c.bootstrap, topic, p, values)
            assert len(segment_files(data_dir, topic, p)) >= 2, "want a rolled segment before the active one"
        c.kill(0)
        expect_end = {}
        for p, kind in enumerate(DAMAGE):
            active = segment_files(data_dir, topic, p)[-1]
            expect_end[p] = _damage(active, kind, rng)
        c.start_broker(0)

        for p, kind in enumerate(DAMAGE):
            leo = log_end_offset(c.bootstrap, topic, p)
            assert leo == expect_end[p], f"{kind}: log end {leo}, expected {expect_end[p]}"
            batches = all_batches(data_dir, topic, p)       # raises if bytes are left after the last batch
            bad = [(f.name, b.position) for f, b in batches if not crc_ok(f, b)]
            assert bad == [], f"{kind}: batches failing CRC after recovery: {bad}"
            assert batches[-1][1].last_offset + 1 == leo
            consumed = consume_confluent(c.bootstrap, topic, {p: leo})
            got = [(m.partition, m.offset, m.rec.value.decode()) for m in consumed]
            surviving = [a for a in acked[p] if a[1] < leo]
            r = check_acked(surviving, got)
            assert r.ok and r.unacked_present == 0 and r.consumed == leo, (kind, r.line())
            # the checker counts exactly the records we cut off as acknowledged-and-lost
            cut = [a for a in acked[p] if a[1] >= leo]
            r_all = check_acked(acked[p], got)
            assert r_all.acked_lost == len(cut), (kind, r_all.line(), len(cut))
            if kind != "garbage":
                assert cut, "the damaged batch should have held acknowledged records"
            # appends continue at the right offset
            more = _produce(c.bootstrap, topic, p, [f"after-{kind}-{i}" for i in range(500)])
            assert [o for _p, o, _v in more] == list(range(leo, leo + 500)), f"{kind}: {more[:3]}"
            assert log_end_offset(c.bootstrap, topic, p) == leo + 500
            consumed = consume_confluent(c.bootstrap, topic, {p: leo + 500})
            r = check_acked(surviving + more, [(m.partition, m.offset, m.rec.value.decode()) for m in consumed])
            assert r.ok and r.consumed == leo + 500, (kind, r.line())
        print(f"T-tail ends={expect_end}")


def test_loss_checker_sees_a_real_loss(tmp_path):
    """Cut acknowledged batches off a segment behind the broker's back (kill -9, truncate to the start
    of the last 2 batches, restart): the checker must count every acknowledged record we removed."""
    with LocalCluster(tmp_path / "cluster", num_partitions=1, session_timeout_ms=4000) as c:
        topic = f"loss-{uuid.uuid4().hex[:8]}"
        wait_for_topic(c.bootstrap, topic, 1)
        acked = _produce(c.bootstrap, topic, 0, [f"v{i}" for i in range(2000)])
        c.kill(0)
        active = segment_files(c.brokers[0].data_dir, topic, 0)[-1]
        batches, _ = scan_log(active)
        cut_from = batches[-2]
        os.truncate(active, cut_from.position)
        c.start_broker(0)
        leo = log_end_offset(c.bootstrap, topic, 0)
        assert leo == cut_from.base_offset
        consumed = consume_confluent(c.bootstrap, topic, {0: leo})
        r = check_acked(acked, [(m.partition, m.offset, m.rec.value.decode()) for m in consumed])
        assert r.acked_lost == 2000 - cut_from.base_offset > 0, r.line()
        assert not r.ok
