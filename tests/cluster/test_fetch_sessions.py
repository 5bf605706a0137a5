"""Fetch sessions (KIP-227, kbroker/server/fetch_sessions.py) on real brokers: raw Fetch v11 requests for
each session outcome (a session created by a full fetch, incremental answers listing only what changed,
forgotten partitions, FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH, a close, a long poll woken
by an append); kafka-python 3 (incremental sessions by default) consuming many partitions while its
assignment grows and shrinks and the broker restarts (its session lost: it falls back to a full fetch),
every record exactly once; and a follower's session (kbroker/replica/fetcher.py) on a leader with one
session slot: the slot is the follower's, the ISR stays whole, the high watermark follows acks=all
appends, and after the leader restarts the follower's new session does the same.
"""
from __future__ import annotations

import threading
import time
import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from checkers import FETCH, METADATA, RawConn, create_topic, wait_for_topic
from kbroker.protocol.errors import Errors
from kbroker.testing import LocalCluster, wait_until
from test_produce_fast import one, produce_raw

V = 11


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("fsess")) as c:
        yield c


def topic_of(c, partitions):
    name = f"fsess-{uuid.uuid4().hex[:8]}"
    create_topic(c.bootstrap, name, partitions)
    return name


def fetch(conn, session_id, epoch, topics=(), forgotten=(), max_wait_ms=0, min_bytes=1, replica_id=-1,
          timeout=30, version=V, ids=None):
    """``topics``: [(topic, [(partition, fetch_offset), ...])]; ``forgotten``: [(topic, [partition])];
    from v13 topics go by id (``ids``: {name: id})."""
    def named(t):
        return {"topic": t, "topic_id": ids[t]} if version >= 13 else {"topic": t}
    body = {"replica_id": replica_id, "max_wait_ms": max_wait_ms, "min_bytes": min_bytes, "max_bytes": 1 << 20,
            "isolation_level": 0, "session_id": session_id, "session_epoch": epoch,
            "topics": [dict(named(t), partitions=[
                {"partition": p, "current_leader_epoch": -1, "fetch_offset": o, "last_fetched_epoch": -1,
                 "log_start_offset": -1, "partition_max_bytes": 1 << 20} for p, o in parts]) for t, parts in topics],
            "forgotten_topics_data": [dict(named(t), partitions=list(ps)) for t, ps in forgotten], "rack_id": ""}
    resp = conn.request(FETCH, version, body, timeout=timeout)
    if version >= 13:
        names = {i: t for t, i in ids.items()}
        for t in resp["responses"]:
            t["topic"] = names[t["topic_id"]]
    return resp


def session_of(conn, version, topic):
    """(fetch as ``version`` speaks it, {topic: id}): v17 names topics by the id Metadata v12 gives."""
    ids = None
    if version >= 13:
        ids = {topic: conn.request(3, 12, {"topics": [{"name": topic, "topic_id": bytes(16)}]})["topics"][0]["topic_id"]}
    return lambda conn, *a, **kw: fetch(conn, *a, version=version, ids=ids, **kw)


def rows(resp):
    """{(topic, partition): (high watermark, records bytes)}"""
    return {(t["topic"], p["partition_index"]): (p["high_watermark"], bytes(p["records"] or b""))
            for t in resp["responses"] for p in t["partitions"]}


@pytest.mark.parametrize("version", [V, 17])
def test_a_session_answers_only_what_changed_and_refuses_wrong_ids_and_epochs(single, version):
    c = single
    topic = topic_of(c, 3)
    with RawConn(c.bootstrap, timeout=30) as conn:
        fetch = session_of(conn, version, topic)
        full = fetch(conn, 0, 0, [(topic, [(0, 0), (1, 0), (2, 0)])])
        sid = full["session_id"]
        assert full["error_code"] == 0 and sid > 0
        assert set(rows(full)) == {(topic, 0), (topic, 1), (topic, 2)}
        quiet = fetch(conn, sid, 1)
        assert (quiet["error_code"], quiet["session_id"], rows(quiet)) == (0, sid, {})
        assert produce_raw(conn, topic, one(b"a"), index=1)["error_code"] == 0
        changed = fetch(conn, sid, 2)
        [(tp, (hw, records))] = rows(changed).items()
        assert tp == (topic, 1) and hw == 1 and b"a" in records
        # the client moves past the record: listed with its new offset, nothing new to say
        assert rows(fetch(conn, sid, 3, [(topic, [(1, 1)])])) == {}
        stale = fetch(conn, sid, 3)
        assert (stale["error_code"], stale["session_id"]) == (Errors.INVALID_FETCH_SESSION_EPOCH, 0)
        assert fetch(conn, sid ^ 0x5A5A, 1)["error_code"] == Errors.FETCH_SESSION_ID_NOT_FOUND
        # the epoch after the refused ones is still the session's next
        assert fetch(conn, sid, 4)["error_code"] == 0
        # a close (epoch -1) is answered sessionless, in full, and the session is gone
        closed = fetch(conn, sid, -1, [(topic, [(0, 0)])])
        assert (closed["error_code"], closed["session_id"], set(rows(closed))) == (0, 0, {(topic, 0)})
        assert fetch(conn, sid, 5)["error_code"] == Errors.FETCH_SESSION_ID_NOT_FOUND


@pytest.mark.parametrize("version", [V, 17])
def test_forgotten_partitions_leave_the_session_and_the_last_one_ends_it(single, version):
    c = single
    topic = topic_of(c, 2)
    with RawConn(c.bootstrap, timeout=30) as conn:
        fetch = session_of(conn, version, topic)
        sid = fetch(conn, 0, 0, [(topic, [(0, 0), (1, 0)])])["session_id"]
        assert rows(fetch(conn, sid, 1, forgotten=[(topic, [0])])) == {}
        for p in (0, 1):
            assert produce_raw(conn, topic, one(b"f%d" % p), index=p)["error_code"] == 0
        assert set(rows(fetch(conn, sid, 2))) == {(topic, 1)}
        # added back: answered again (its offsets unknown to the client's session)
        assert set(rows(fetch(conn, sid, 3, [(topic, [(0, 0)])]))) == {(topic, 0), (topic, 1)}
        last = fetch(conn, sid, 4, forgotten=[(topic, [0, 1])])
        assert (last["error_code"], last["session_id"], rows(last)) == (0, 0, {})
        assert fetch(conn, sid, 5)["error_code"] == Errors.FETCH_SESSION_ID_NOT_FOUND


def test_an_incremental_long_poll_wakes_on_an_append(single):
    c = single
    topic = topic_of(c, 4)
    with RawConn(c.bootstrap, timeout=30) as conn, RawConn(c.bootstrap, timeout=30) as producer:
        sid = fetch(conn, 0, 0, [(topic, [(p, 0) for p in range(4)])])["session_id"]
        got = {}

        def poll():
            t0 = time.monotonic()
            got["resp"] = fetch(conn, sid, 1, max_wait_ms=20000)
            got["s"] = time.monotonic() - t0
        t = threading.Thread(target=poll)
        t.start()
        time.sleep(0.3)         # the poll is parked (nothing to read)
        assert "resp" not in got
        assert produce_raw(producer, topic, one(b"late"), index=3)["error_code"] == 0
        t.join(30)
    assert got["s"] < 10 and set(rows(got["resp"])) == {(topic, 3)}, got


def _produce(bootstrap, topic, partitions, n, start):
    """n records per partition (values p:i), acked."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for part in partitions:
        for i in range(start, start + n):
            p.produce(topic, value=b"%d:%d" % (part, i), partition=part)
    assert p.flush(60) == 0


def test_kafka_python_consumes_through_assignment_changes_and_a_broker_restart(single):
    from kafka import KafkaConsumer, TopicPartition

    c = single
    n_parts = 24
    topic = topic_of(c, n_parts)
    _produce(c.bootstrap, topic, range(n_parts), 20, 0)
    seen: dict = {}

    def drain(consumer, until_total, what):
        def step():
            for tp, recs in consumer.poll(timeout_ms=200).items():
                for r in recs:
                    seen.setdefault(tp.partition, []).append(r.value)
            return sum(len(v) for v in seen.values()) >= until_total
        wait_until(step, 60, what)

    kc = KafkaConsumer(bootstrap_servers=c.bootstrap, enable_auto_commit=False, auto_offset_reset="earliest",
                       fetch_max_wait_ms=200)
    try:
        first = [TopicPartition(topic, p) for p in range(12)]
        kc.assign(first)
        drain(kc, 12 * 20, "the first 12 partitions")
        handlers = kc._fetcher._session_handlers
        assert any(h.next_metadata.session_id > 0 for h in handlers.values()), "no fetch session in use"
        # grow to all 24 partitions (added to the session), then drop the first 6 (forgotten)
        kc.assign(first + [TopicPartition(topic, p) for p in range(12, n_parts)])
        drain(kc, n_parts * 20, "all 24 partitions")
        kept = [TopicPartition(topic, p) for p in range(6, n_parts)]
        kc.assign(kept)
        _produce(c.bootstrap, topic, range(n_parts), 10, 20)
        drain(kc, n_parts * 20 + len(kept) * 10, "the new records of the kept partitions")
        # the broker restarts: its sessions are gone, the consumer's next fetch is refused and it starts over
        c.stop_broker(0)
        c.start_broker(0)
        wait_for_topic(c.bootstrap, topic, n_parts)
        _produce(c.bootstrap, topic, range(n_parts), 10, 30)
        drain(kc, n_parts * 20 + len(kept) * 20, "the records after the restart")
        assert any(h.next_metadata.session_id > 0 for h in handlers.values()), "no session after the restart"
    finally:
        kc.close()
    for p in range(n_parts):
        want = [b"%d:%d" % (p, i) for i in range(20)]
        if p >= 6:
            want += [b"%d:%d" % (p, i) for i in range(20, 40)]
        assert seen.get(p) == want, (p, seen.get(p))


# ---- a follower's session ------------------------------------------------------------------------------
FOLLOWER_PARTITIONS = 40        # above kbroker.replica.fetcher.SESSION_MIN_PARTITIONS: the follower uses a session
LAG_MS = 2000


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    # one session slot: whoever holds it keeps it (a consumer cannot evict a follower's session)
    with LocalCluster(tmp_path_factory.mktemp("fsess2"), brokers=2,
                      overrides={"max.incremental.fetch.session.cache.slots": 1,
                                 "replica.lag.time.max.ms": LAG_MS}) as c:
        yield c


def _isr_whole(conn, topic):
    resp = conn.request(METADATA, 4, {"topics": [{"name": topic}], "allow_auto_topic_creation": False})
    parts = resp["topics"][0]["partitions"]
    return len(parts) == FOLLOWER_PARTITIONS and all(sorted(p["isr_nodes"]) == [0, 1] for p in parts)


def _slot_taken(conn, topic):
    """A consumer's full fetch asking for a session gets none: the one slot is held (by the follower)."""
    return fetch(conn, 0, 0, [(topic, [(0, 0)])])["session_id"] == 0


def test_a_follower_session_keeps_the_isr_and_moves_the_high_watermark_across_a_leader_restart(pair):
    from kbroker.replica.fetcher import SESSION_MIN_PARTITIONS

    c = pair
    assert FOLLOWER_PARTITIONS >= SESSION_MIN_PARTITIONS
    topic = f"fsess-f-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    admin.create_topics([NewTopic(topic, FOLLOWER_PARTITIONS, replica_assignment=[[0, 1]] * FOLLOWER_PARTITIONS,
                                  config={"min.insync.replicas": "2"})])[topic].result(30)
    wait_for_topic(c.bootstrap, topic, FOLLOWER_PARTITIONS)
    leader = 0
    for round_ in range(2):
        addr = f"127.0.0.1:{c.brokers[leader].port}"
        with RawConn(addr, timeout=30) as conn:
            wait_until(lambda: _isr_whole(conn, topic), 30, "the ISR of every partition")
            wait_until(lambda: _slot_taken(conn, topic), 30, "the follower's session on the leader")
        p = Producer({"bootstrap.servers": c.bootstrap, "acks": "all", "linger.ms": 5})
        errors = []
        for i in range(200):
            p.produce(topic, value=b"r%d-%d" % (round_, i), partition=i % FOLLOWER_PARTITIONS,
                      on_delivery=lambda err, _m: errors.append(err) if err else None)
        assert p.flush(60) == 0 and errors == []      # acks=all with min ISR 2: the HW followed
        # idle for longer than replica.lag.time.max.ms (the time itself is what is tested): the follower,
        # whose incremental fetches list nothing, stays in every ISR
        time.sleep(LAG_MS * 1.5 / 1000)
        with RawConn(addr, timeout=30) as conn:
            assert _isr_whole(conn, topic)
            assert _slot_taken(conn, topic)
            hw = {(t["topic"], r["partition_index"]): r["high_watermark"]
                  for t in fetch(conn, 0, -1, [(topic, [(i, 0) for i in range(FOLLOWER_PARTITIONS)])])["responses"]
                  for r in t["partitions"]}
        assert all(v == 5 * (round_ + 1) for v in hw.values()), hw
        if round_ == 0:
            # the leader restarts: its sessions are lost; broker 1 leads, and broker 0, back, follows it
            # with a session of its own there
            c.stop_broker(0)
            c.start_broker(0)
            leader = 1
