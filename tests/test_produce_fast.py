"""The one-partition Produce served without a Python frame (issue 10; ext/request.pyx FastProduce,
kbroker/replica/manager.py ``_fast_refresh``): real brokers, real clients (confluent-kafka) and raw
requests. The broker's ``kbroker_produce_native_requests_total{path=fast|slow}`` counters show which
path served each Produce; every reason the native path must leave a request to Python is shown to do
so (and to give Python's answer), and the plain requests to be served natively again afterwards.

Counter-checks (each was broken on purpose and this file failed): arming a partition whose ISR is
larger than one for acks=-1 (the acks=all waiter test saw an answer before the followers had the
batch), skipping the disarm in become_follower together with the per-request epoch and config-identity guards
(the leadership move test saw the old leader append; with any one of the three left, it refuses),
dropping the consumers' notifier wake (the long-poll test waited for its max wait), ignoring the
log's config identity (LogAppendTime missing in the answer).
"""
from __future__ import annotations

import os
import struct
import threading
import time
import urllib.request
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from checkers import (FETCH, PRODUCE, RawConn, all_batches, create_topic, end_offsets, metered_cluster, segment_files,
                      wait_for_topic)
from kbroker.testing import LocalCluster, free_port, wait_until
from test_hostile_attacks import _batch, _record
from test_produce_diskfull import _fill, tmpfs  # noqa: F401 (tmpfs: the fixture)

NOT_LEADER_OR_FOLLOWER = 6
MESSAGE_TOO_LARGE = 10
INVALID_TOPIC_EXCEPTION = 17
UNKNOWN_TOPIC_OR_PARTITION = 3
KAFKA_STORAGE_ERROR = 56


def counts(port: int) -> dict:
    """{"fast": n, "slow": n} from the broker's metrics endpoint."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("kbroker_produce_native_requests_total{"):
            path = line.split('path="', 1)[1].split('"', 1)[0]
            out[path] = int(float(line.rsplit(" ", 1)[1]))
    return out


class Delta:
    """Fast/slow Produce requests served between entering and leaving the block."""

    def __init__(self, port):
        self.port = port

    def __enter__(self):
        self.before = counts(self.port)
        return self

    def __exit__(self, *exc):
        after = counts(self.port)
        self.fast = after["fast"] - self.before["fast"]
        self.slow = after["slow"] - self.before["slow"]


def produce_raw(conn, topic, batch, acks=1, version=7, index=0):
    """-> the partition's answer dict (None for acks=0)."""
    body = {"transactional_id": None, "acks": acks, "timeout_ms": 10000,
            "topic_data": [{"name": topic, "partition_data": [{"index": index, "records": batch}]}]}
    if acks == 0:
        from kbroker.protocol import api
        conn.send(api.encode_request(PRODUCE, version, 99, "fast-test", body))
        return None
    return conn.request(PRODUCE, version, body, timeout=30)["responses"][0]["partition_responses"][0]


def one(value=b"v", i=0, codec=0):
    return _batch(codec, [_record(i, b"k", value)])


def produce_confluent(bootstrap, topic, n, **conf):
    """n one-record Produce requests (linger 0, one record per batch); -> delivery errors."""
    errors = []
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.num.messages": 1, "acks": 1, **conf})
    for i in range(n):
        p.produce(topic, key=b"k%d" % i, value=b"value-%d" % i, partition=0,
                  on_delivery=lambda err, _m: errors.append(err) if err else None)
        p.poll(0)
    assert p.flush(60) == 0
    return errors


def consume_values(bootstrap, topic, end, timeout=60.0):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "fast-" + uuid.uuid4().hex[:6],
                  "enable.auto.commit": False})
    out = []
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + timeout
        while len(out) < end and time.monotonic() < deadline:
            for m in c.consume(500, timeout=0.5):
                assert not m.error(), m.error()
                out.append((m.offset(), m.value(), m.timestamp()))
    finally:
        c.close()
    return out


def alter_topic(bootstrap, topic, **config):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    res = ConfigResource(ConfigResource.Type.TOPIC, topic, set_config={k.replace("_", "."): str(v)
                                                                        for k, v in config.items()})
    for f in admin.alter_configs([res]).values():
        f.result(30)


def new_topic(c, config=None, warm=True):
    """A one-partition topic; ``warm``: one record appended first (the first append after creation
    may see a config the slot was not armed with and re-arm it: served by Python)."""
    name = f"fast-{uuid.uuid4().hex[:8]}"
    create_topic(c.bootstrap, name, 1, config)
    if warm:
        with RawConn(c.bootstrap) as conn:
            wait_until(lambda: produce_raw(conn, name, one())["error_code"] == 0, 30, "the first append")
    return name


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    with metered_cluster(tmp_path_factory, "fast") as cluster:
        yield cluster


# ---- RF=1 -------------------------------------------------------------------------------------------
def test_plain_produce_is_served_natively_and_reads_back(single):
    c, port = single
    topic = new_topic(c)
    with Delta(port) as d:
        assert produce_confluent(c.bootstrap, topic, 300) == []
    # one may re-arm: the topic's config from its creation can reach the log after the warm-up append
    assert d.fast >= 299 and d.fast + d.slow == 300, (d.fast, d.slow)
    got = consume_values(c.bootstrap, topic, 301)
    assert [(o, v) for o, v, _ts in got[1:]] == [(i + 1, b"value-%d" % i) for i in range(300)]


@pytest.mark.parametrize("acks", [0, 1, -1])
def test_every_version_and_acks_native(single, acks):
    """v3-8, acks 0/1/-1 (an ISR of this leader alone: answered at once): all native, offsets in order,
    and the answer carries what the Python path's would (base offset, no append time, log start)."""
    c, port = single
    topic = new_topic(c)
    with Delta(port) as d, RawConn(c.bootstrap) as conn:
        for i, version in enumerate(range(3, 9)):
            r = produce_raw(conn, topic, one(b"x%d" % i), acks=acks, version=version)
            if acks:
                assert r["error_code"] == 0 and r["base_offset"] == i + 1, r
                assert r["log_append_time_ms"] == -1
                if version >= 5:
                    assert r["log_start_offset"] == 0
        # acks=0 has no answer to wait for: the last request may still be in flight here
        wait_until(lambda: end_offsets(c.bootstrap, topic, 1) == {0: 7}, 30, "all six appended")
    assert d.fast == 6 and d.slow == 0, (d.fast, d.slow)


def test_idempotent_producer_takes_python_path(single):
    c, port = single
    topic = new_topic(c)
    with Delta(port) as d:
        assert produce_confluent(c.bootstrap, topic, 50, **{"enable.idempotence": True, "acks": "all"}) == []
    assert d.slow >= 50 and d.fast == 0, (d.fast, d.slow)
    assert len(consume_values(c.bootstrap, topic, 51)) == 51


def test_compressed_batch_validated_off_the_loop_takes_python_path(single):
    c, port = single
    topic = new_topic(c)
    with Delta(port) as d, RawConn(c.bootstrap) as conn:
        for i in range(5):
            assert produce_raw(conn, topic, one(b"z" * 500, codec=1))["error_code"] == 0
    assert d.slow == 5 and d.fast == 0, (d.fast, d.slow)
    assert [o for o, _v, _t in consume_values(c.bootstrap, topic, 6)] == list(range(6))


def test_flush_messages_one_takes_python_path(single):
    c, port = single
    topic = new_topic(c, {"flush.messages": 1}, warm=False)
    with Delta(port) as d, RawConn(c.bootstrap) as conn:
        for i in range(5):
            assert produce_raw(conn, topic, one())["error_code"] == 0
    assert d.slow == 5 and d.fast == 0, (d.fast, d.slow)


def test_config_changes_are_seen(single):
    """LogAppendTime in the answer, max.message.bytes refusing a batch, segment.bytes rolling: each
    after an AlterConfigs on a topic already served natively; plain appends stay native around them."""
    c, port = single
    topic = new_topic(c)
    with RawConn(c.bootstrap) as conn:
        assert produce_raw(conn, topic, one())["log_append_time_ms"] == -1
        alter_topic(c.bootstrap, topic, message_timestamp_type="LogAppendTime")
        wait_until(lambda: produce_raw(conn, topic, one())["log_append_time_ms"] > 0, 20, "LogAppendTime")
        with Delta(port) as d:
            before = int(time.time() * 1000)
            r = produce_raw(conn, topic, one())
        assert r["error_code"] == 0 and r["log_append_time_ms"] >= before - 1000, r
        assert d.fast == 1, (d.fast, d.slow)

        alter_topic(c.bootstrap, topic, max_message_bytes=2000)
        wait_until(lambda: produce_raw(conn, topic, one(b"m" * 3000))["error_code"] == MESSAGE_TOO_LARGE, 20,
                   "max.message.bytes")
        with Delta(port) as d:
            assert produce_raw(conn, topic, one(b"m" * 3000))["error_code"] == MESSAGE_TOO_LARGE
            assert produce_raw(conn, topic, one(b"s"))["error_code"] == 0
        assert (d.fast, d.slow) == (1, 1), (d.fast, d.slow)

        alter_topic(c.bootstrap, topic, segment_bytes=1024)
        wait_until(lambda: produce_raw(conn, topic, one(b"r" * 400))["error_code"] == 0 and
                   len(segment_files(c.brokers[0].data_dir, topic, 0)) > 1, 20, "a roll")
        with Delta(port) as d:
            for i in range(20):
                assert produce_raw(conn, topic, one(b"r" * 400))["error_code"] == 0
        # every other batch or so rolls (Python), the others append natively to the new segment
        assert d.fast >= 5 and d.slow >= 5 and d.fast + d.slow == 20, (d.fast, d.slow)
    end = end_offsets(c.bootstrap, topic, 1)[0]
    assert [o for o, _v, _t in consume_values(c.bootstrap, topic, end)] == list(range(end))


def test_internal_topic_rejected(single):
    c, port = single
    g = Consumer({"bootstrap.servers": c.bootstrap, "group.id": "fast-int-" + uuid.uuid4().hex[:6]})
    try:
        topic = new_topic(c)
        g.subscribe([topic])
        wait_until(lambda: g.poll(0.2) is None and g.assignment(), 30, "a group assignment")
    finally:
        g.close()
    wait_for_topic(c.bootstrap, "__consumer_offsets", 50)
    with Delta(port) as d, RawConn(c.bootstrap) as conn:
        for index in range(50):
            r = produce_raw(conn, "__consumer_offsets", one(), index=index)
            assert r["error_code"] in (INVALID_TOPIC_EXCEPTION, NOT_LEADER_OR_FOLLOWER), r
    assert d.fast == 0 and d.slow == 50, (d.fast, d.slow)


def test_long_poll_woken_by_native_append(single):
    """A consumer's Fetch waiting at the log end (max wait 20 s) returns with the record a natively
    served Produce appended."""
    c, port = single
    topic = new_topic(c)
    result = {}

    def fetch():
        with RawConn(c.bootstrap, timeout=30) as f:
            t0 = time.monotonic()
            r = f.request(FETCH, 11, {"replica_id": -1, "max_wait_ms": 20000, "min_bytes": 1, "max_bytes": 1 << 20,
                                      "isolation_level": 0, "session_id": 0, "session_epoch": -1, "topics": [
                                          {"topic": topic, "partitions": [
                                              {"partition": 0, "current_leader_epoch": -1, "fetch_offset": 1,
                                               "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
                                      "forgotten_topics_data": [], "rack_id": ""}, timeout=30)
            result["waited"] = time.monotonic() - t0
            result["records"] = bytes(r["responses"][0]["partitions"][0]["records"] or b"")

    t = threading.Thread(target=fetch)
    t.start()
    time.sleep(1.0)             # the fetch is parked (nothing to read at offset 1)
    with Delta(port) as d, RawConn(c.bootstrap) as conn:
        assert produce_raw(conn, topic, one(b"wake"))["error_code"] == 0
    t.join(40)
    assert d.fast == 1
    assert b"wake" in result["records"]
    assert result["waited"] < 15, result["waited"]      # woken, not timed out (20 s)


def test_topic_delete_and_recreate(single):
    c, port = single
    topic = new_topic(c)
    with RawConn(c.bootstrap) as conn:
        for _ in range(3):
            assert produce_raw(conn, topic, one())["error_code"] == 0
        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        admin.delete_topics([topic])[topic].result(30)
        wait_until(lambda: produce_raw(conn, topic, one())["error_code"] == UNKNOWN_TOPIC_OR_PARTITION, 30,
                   "the topic gone")
        with Delta(port) as d:
            assert produce_raw(conn, topic, one())["error_code"] == UNKNOWN_TOPIC_OR_PARTITION
        assert (d.fast, d.slow) == (0, 1)
    create_topic(c.bootstrap, topic, 1)
    with Delta(port) as d, RawConn(c.bootstrap) as conn:
        wait_until(lambda: produce_raw(conn, topic, one())["error_code"] == 0, 30, "the topic back")
        r = produce_raw(conn, topic, one())
    assert r["error_code"] == 0 and d.fast >= 1
    assert r["base_offset"] == end_offsets(c.bootstrap, topic, 1)[0] - 1


@pytest.mark.slow
def test_log_dir_failure(tmp_path, tmpfs):
    """A full log dir: a native append whose write fails answers KAFKA_STORAGE_ERROR (the Python
    finisher), the dir is then failing and appends take the Python path until one succeeds there;
    then they are native again. The log holds exactly the batches that were acknowledged."""
    port = free_port()
    with LocalCluster(tmp_path / "c", overrides={"kbroker.metrics.port": port,
                                                 "log.dirs": os.path.join(tmpfs, "data")}) as c:
        topic = new_topic(c)
        with RawConn(c.bootstrap, timeout=30) as conn:
            _fill(tmpfs)
            with Delta(port) as d:
                codes = [produce_raw(conn, topic, one(b"f" * 60_000))["error_code"] for _ in range(4)]
            assert codes == [KAFKA_STORAGE_ERROR] * 4, codes
            # the first: native, its write fails and Python's storage-failure finisher answers it
            # (counted slow); then the failing dir keeps the rest on the Python path
            assert (d.fast, d.slow) == (0, 4), (d.fast, d.slow)
            os.unlink(os.path.join(tmpfs, "ballast"))
            with Delta(port) as d:
                for _ in range(3):
                    assert produce_raw(conn, topic, one())["error_code"] == 0
            assert (d.fast, d.slow) == (2, 1), (d.fast, d.slow)
        assert end_offsets(c.bootstrap, topic, 1) == {0: 4}      # the warm-up record and these 3


# ---- RF=3 -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def three(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("fast3"), brokers=3, overrides={"replica.lag.time.max.ms": 3000})
    ports = {}
    for bid, b in c.brokers.items():
        ports[bid] = free_port()
        b.extra = {"kbroker.metrics.port": ports[bid]}
    c.start()
    try:
        yield c, ports
    finally:
        c.stop()


def rf3_topic(c, min_isr=1, leader=0):
    name = f"fast3-{uuid.uuid4().hex[:8]}"
    replicas = [leader] + [b for b in (0, 1, 2) if b != leader]
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    admin.create_topics([NewTopic(name, 1, replica_assignment=[replicas],
                                  config={"min.insync.replicas": str(min_isr)})])[name].result(30)
    wait_for_topic(c.bootstrap, name, 1)
    with leader_conn(c, leader) as conn:      # warm: see new_topic
        wait_until(lambda: produce_raw(conn, name, one())["error_code"] == 0, 30, "the first append")
    return name


def leader_conn(c, bid):
    return RawConn(f"127.0.0.1:{c.brokers[bid].port}", timeout=30)


@pytest.mark.slow
def test_rf3_leader_native_followers_replicate(three):
    c, ports = three
    topic = rf3_topic(c)
    with Delta(ports[0]) as d, leader_conn(c, 0) as conn:
        wait_until(lambda: produce_raw(conn, topic, one())["error_code"] == 0, 30, "leader ready")
        for i in range(30):
            assert produce_raw(conn, topic, one(b"r%d" % i))["error_code"] == 0
    assert d.fast >= 30, (d.fast, d.slow)
    # followers' long polls were woken: every replica's log reaches the leader's end
    for bid in (1, 2):
        wait_until(lambda b=bid: _leo(c, b, topic) == _leo(c, 0, topic), 30, f"broker {bid} replicated")


def _leo(c, bid, topic):
    batches = all_batches(c.brokers[bid].data_dir, topic, 0)
    return batches[-1][1].last_offset + 1 if batches else 0


@pytest.mark.slow
def test_rf3_acks_all_waits_for_followers(three):
    """acks=-1 with an ISR of three: the Python path (a waiter), answered once the followers have it."""
    c, ports = three
    topic = rf3_topic(c)
    with leader_conn(c, 0) as conn:
        wait_until(lambda: produce_raw(conn, topic, one(), acks=-1)["error_code"] == 0, 30, "leader ready")
        with Delta(ports[0]) as d:
            r = produce_raw(conn, topic, one(b"all"), acks=-1)
        assert r["error_code"] == 0
        assert (d.fast, d.slow) == (0, 1), (d.fast, d.slow)
        for bid in (1, 2):
            assert _leo(c, bid, topic) >= r["base_offset"] + 1
        with Delta(ports[0]) as d:
            assert produce_raw(conn, topic, one(), acks=1)["error_code"] == 0
        assert (d.fast, d.slow) == (1, 0)


@pytest.mark.slow
def test_rf3_isr_shrink_arms_acks_all(three):
    """An ISR shrinking to the leader alone (followers stopped, min.insync.replicas=1): acks=-1 is then
    answered natively at once; the followers back in the ISR: acks=-1 waits again (Python)."""
    c, ports = three
    topic = rf3_topic(c)
    with leader_conn(c, 0) as conn:
        wait_until(lambda: produce_raw(conn, topic, one(), acks=-1)["error_code"] == 0, 30, "leader ready")
        for bid in (1, 2):
            os.kill(c.brokers[bid].pid, 19)       # SIGSTOP
        try:
            def shrunk():
                with Delta(ports[0]) as d:
                    r = produce_raw(conn, topic, one(), acks=-1)
                return r["error_code"] == 0 and d.fast == 1
            wait_until(shrunk, 40, "acks=-1 served natively after the ISR shrank")
        finally:
            for bid in (1, 2):
                os.kill(c.brokers[bid].pid, 18)   # SIGCONT

        def expanded():
            with Delta(ports[0]) as d:
                r = produce_raw(conn, topic, one(), acks=-1)
            return r["error_code"] == 0 and d.slow == 1
        wait_until(expanded, 60, "acks=-1 back on the Python path after the ISR grew")


@pytest.mark.slow
def test_rf3_leadership_move(three):
    """The preferred leader takes the partition back (ElectLeaders): the old leader, still running,
    answers NOT_LEADER_OR_FOLLOWER (its slot disarmed), the new one serves natively, epoch bumped."""
    from confluent_kafka import ElectionType
    c, ports = three
    topic = rf3_topic(c, leader=1)
    with leader_conn(c, 1) as conn:
        wait_until(lambda: produce_raw(conn, topic, one())["error_code"] == 0, 30, "leader ready")
    # broker 1 steps down (controlled shutdown) and comes back as a follower: broker 0 leads
    c.stop_broker(1)
    c.start_broker(1)
    with leader_conn(c, 0) as conn:
        wait_until(lambda: produce_raw(conn, topic, one())["error_code"] == 0, 30, "broker 0 leads")
        with Delta(ports[0]) as d:
            assert produce_raw(conn, topic, one())["error_code"] == 0
        assert d.fast == 1
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    seen = []

    def elected():
        try:
            errors = admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic, 0)]).result(30)
        except Exception as e:
            errors = {None: e}
        errors = {tp: e for tp, e in errors.items() if e is not None}
        if errors:                  # e.g. the preferred replica not yet back in the ISR
            seen.append(repr(errors))
            time.sleep(0.5)
            return False
        return True
    try:
        wait_until(elected, 60, "the preferred leader elected")
    except TimeoutError:
        raise AssertionError(seen[-3:]) from None
    with leader_conn(c, 0) as conn:
        wait_until(lambda: produce_raw(conn, topic, one())["error_code"] == NOT_LEADER_OR_FOLLOWER, 30,
                   "the old leader refuses")
        with Delta(ports[0]) as d:
            assert produce_raw(conn, topic, one())["error_code"] == NOT_LEADER_OR_FOLLOWER
        assert (d.fast, d.slow) == (0, 1)
    with leader_conn(c, 1) as conn:
        wait_until(lambda: produce_raw(conn, topic, one())["error_code"] == 0, 30, "the new leader")
        with Delta(ports[1]) as d:
            r = produce_raw(conn, topic, one())
        assert r["error_code"] == 0 and d.fast == 1
    # the batches the new leader stamped carry its (bumped) epoch
    batches = [b for _p, b in all_batches(c.brokers[1].data_dir, topic, 0)]
    assert batches[-1].last_offset == r["base_offset"]
    epochs = [b.leader_epoch for b in batches]
    assert epochs == sorted(epochs) and epochs[-1] > epochs[0], epochs
