"""Replication under faults the other replication tests do not inject (T5, T6, ZooKeeper
ensemble faults). Three real brokers (LocalCluster), ZooKeeper session timeout 6 s, topic RF=3 with
min.insync.replicas=2, acks=all producers at ~1,000 records/s (bounded in time), every send, ack and
read logged in the shared History checker (tests/checkers.py), whose counts are asserted.

- T5: the leader is SIGSTOPped past its session timeout while a raw pipelined acks=all producer keeps
  writing to it; after it is replaced it must acknowledge nothing the final log lacks, and it rejoins
  by truncating by epoch.
- T6: the leader is cut off from both followers (tests/proxy.py on its advertised address, the
  address followers fetch from) but keeps its ZooKeeper session: no acks=all acknowledged by it once
  the ISR is below min.insync.replicas, no leader outside the ISR, nothing acked lost after healing.
- ZooKeeper: one node of a three-node ensemble killed under load (nothing noticed), then quorum lost
  and restored (leaders keep serving what needs no ZooKeeper write; nothing acked lost).
The checker's ability to see loss is shown by T15 in test_replication.py.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import struct
import threading
import time

import pytest

from checkers import PRODUCE, History, all_batches, read_all_confluent
from kbroker._native.batch import BatchBuilder
from kbroker.protocol import api
from kbroker.testing import LocalCluster, wait_until
from kbroker.protocol.errors import Errors
from proxy import TcpProxy
from test_replication import TOPIC, LoadProducer, make_topic, state, wait_acks_grow, wait_isr, wait_unregistered

LAG_MS = 3000
NOT_ENOUGH_REPLICAS = Errors.NOT_ENOUGH_REPLICAS
NOT_ENOUGH_REPLICAS_AFTER_APPEND = Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND


class RawAcksAllSender:
    """Pipelined acks=all Produce v8 requests (one record each) on one connection to one broker, so
    requests keep arriving at that broker whatever it is (stopped, replaced, cut off). A reader
    thread matches responses by correlation id and logs acks/failures in the History, with the time
    each answer arrived (to tell acks given after a point in time)."""

    def __init__(self, port: int, history: History, prefix: bytes, interval: float = 0.02,
                 max_requests: int = 1500, timeout_ms: int = 5000):
        self.history = history
        self.prefix = prefix
        self.interval = interval
        self.max_requests = max_requests
        self.timeout_ms = timeout_ms
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.pending: dict = {}               # correlation id -> value
        self.answers: list = []               # (arrival monotonic time, value, error_code, base_offset)
        self.stop_flag = threading.Event()
        self.closed = threading.Event()
        self.sent = 0
        self._w = threading.Thread(target=self._write, daemon=True)
        self._r = threading.Thread(target=self._read, daemon=True)

    def start(self):
        self._w.start()
        self._r.start()
        return self

    def _write(self):
        nxt = time.monotonic()
        while not self.stop_flag.is_set() and self.sent < self.max_requests and not self.closed.is_set():
            cid = self.sent + 1
            value = self.prefix + b"%06d" % cid
            b = BatchBuilder()
            b.append(int(time.time() * 1000), None, value)
            frame = api.encode_request(PRODUCE, 8, cid, "t5-raw", {
                "transactional_id": None, "acks": -1, "timeout_ms": self.timeout_ms,
                "topic_data": [{"name": TOPIC, "partition_data": [{"index": 0, "records": b.build()}]}]})
            self.pending[cid] = value
            self.history.send(value)
            try:
                self.sock.sendall(frame)      # while the broker is stopped the kernel buffers these
            except OSError:
                break
            self.sent += 1
            nxt += self.interval
            time.sleep(max(0.0, nxt - time.monotonic()))

    def _recv_exact(self, n):
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("closed")
            out += chunk
        return bytes(out)

    def _read(self):
        self.sock.settimeout(None)
        try:
            while True:
                size = struct.unpack(">i", self._recv_exact(4))[0]
                cid, resp = api.decode_response(PRODUCE, 8, self._recv_exact(size))
                r = resp["responses"][0]["partition_responses"][0]
                value = self.pending.pop(cid)
                self.answers.append((time.monotonic(), value, r["error_code"], r["base_offset"]))
                if r["error_code"] == 0:
                    self.history.ack(value, 0, r["base_offset"])
                else:
                    self.history.fail(value, f"error {r['error_code']}")
        except (OSError, ConnectionError, struct.error):
            pass
        finally:
            self.closed.set()

    def finish(self, timeout=30.0):
        """Stop sending; wait until every request is answered or the connection closes."""
        self.stop_flag.set()
        self._w.join(10)
        wait_until(lambda: self.closed.is_set() or not self.pending, timeout, "answers to the raw requests")
        self.sock.close()
        self._r.join(5)

    def acked_after(self, t):
        return [(v, off) for when, v, err, off in self.answers if err == 0 and when >= t]


def stored(c, b, topic=TOPIC):
    return [(s.base_offset, s.last_offset, s.crc) for _p, s in all_batches(c.brokers[b].data_dir, topic, 0)]


def logs_identical(c):
    first = stored(c, 0)
    return first and all(stored(c, b) == first for b in c.brokers)


def offsets_in_log(history: History, values) -> int:
    """How many of ``values`` were acknowledged at an offset the final read does not hold them at."""
    at = {(p, o): v for p, o, v in history.polls}
    return sum(1 for v in values if v in history.acked and at.get(history.acked[v]) != v)


# ---- T5: leader SIGSTOPped past its session timeout ---------------------------------------------

@pytest.mark.slow
def test_t5_paused_leader_replaced_acks_nothing_and_truncates_on_return(tmp_path):
    """Invariant: once replaced (new leader, higher epoch) the paused leader acknowledges no acks=all
    write the final log does not hold at the acknowledged offset (count 0); it rejoins (stepping down
    when it runs again, truncating by epoch what it holds beyond), all three logs end identical, acked-but-lost 0 of N, inconsistent offsets 0."""
    with LocalCluster(tmp_path, brokers=3, overrides={"replica.lag.time.max.ms": LAG_MS}) as c:
        leader, epoch, _isr = make_topic(c)
        hist = History()
        # Raw pipelined senders keep writing to the paused leader itself; an idempotent confluent-kafka
        # producer writes through the bootstrap. A paused broker sends no reset and librdkafka asks
        # its connected brokers for metadata, so it would keep asking the paused one until
        # socket.timeout.ms (60 s): 5 s here lets it find the new leader within the test.
        load = LoadProducer(c.bootstrap, hist, rate=1000, **{
            "enable.idempotence": True, "acks": "all", "request.timeout.ms": 5000,
            "socket.timeout.ms": 5000}).start()
        raw = RawAcksAllSender(c.brokers[leader].port, hist, b"old-", interval=0.004, max_requests=6000).start()
        after = None
        stopped = False
        try:
            wait_until(lambda: sum(1 for a in raw.answers if a[2] == 0) >= 300, 30, "300 acks from the leader")
            os.kill(c.brokers[leader].pid, signal.SIGSTOP)
            stopped = True
            paused_at = time.monotonic()
            wait_unregistered(c, leader)
            new = wait_until(lambda: (lambda s: s if s[0] >= 0 and s[0] != leader else None)(state(c)), 30,
                             "a new leader")
            replaced_at = time.monotonic()
            assert new[1] > epoch, f"epoch did not rise: {epoch} -> {new}"
            # acks=all goes on at the new leader (ISR: the two live replicas).
            after = RawAcksAllSender(c.brokers[new[0]].port, hist, b"new-", interval=0.002,
                                     max_requests=2000).start()
            wait_until(lambda: sum(1 for a in after.answers if a[2] == 0) >= 300, 30, "300 acks from the new leader")
            wait_acks_grow(load, 1000, timeout=45)
            os.kill(c.brokers[leader].pid, signal.SIGCONT)
            stopped = False
            raw.finish()
            # The paused broker re-registers (new session) and rejoins the ISR.
            wait_until(lambda: c.registration_czxid(leader) is not None, 30, "the old leader to re-register")
            wait_isr(c, 3, timeout=60)
            after.finish()
        finally:
            if stopped:
                os.kill(c.brokers[leader].pid, signal.SIGCONT)
            for s in (raw, after):
                if s is not None and not s.closed.is_set():
                    s.finish()
            load.finish()
        late = raw.acked_after(replaced_at)
        raw_values = [v for _t, v, _e, _o in raw.answers]
        read_all_confluent(c.bootstrap, TOPIC, 1, hist)
        report = hist.check()
        wrong_late = offsets_in_log(hist, [v for v, _o in late])
        errors = sorted({e for _t, _v, e, _o in raw.answers if e})
        print(report.line())
        print(f"T5: paused {replaced_at - paused_at:.1f}s until replaced; raw sent {raw.sent}, answered "
              f"{len(raw.answers)}, acked after replacement {len(late)} (not in the final log at that offset: "
              f"{wrong_late}), error codes {errors}")
        assert wrong_late == 0, late[:5]
        assert offsets_in_log(hist, raw_values) == 0
        assert report.acked > 1500
        assert report.duplicates == 0, report.line()
        assert report.acked_lost == 0, report.line()
        assert report.inconsistent_offsets == 0, report.line()
        wait_until(lambda: logs_identical(c), 30, "identical logs on all three brokers")
        log_text = c.brokers[leader].log_path.read_text(errors="replace")
        # Its unreplicated tail (acks=all appends the followers never fetched) goes by OffsetForLeaderEpoch.
        truncations = re.findall(r"truncating from (\d+) to (\d+) \(leader \d+ epoch \d+ ends at \d+\)", log_text)
        # Its ZooKeeper lease ran out while it was paused: it steps down as soon as it runs again, so the
        # requests queued meanwhile are refused, not appended; what is left to truncate is what it
        # appended before the pause and its followers never fetched, which may be nothing.
        stepped_down = "stepped down as leader" in log_text
        print(f"T5: the returning leader truncated by epoch: {truncations}; stepped down on return: {stepped_down}")
        assert truncations or stepped_down, "the returning leader neither stepped down nor truncated by epoch"


# ---- T6: leader cut off from its followers, not from ZooKeeper -----------------------------------

def zk_state(c, topic=TOPIC, partition=0):
    """(leader, leader_epoch, isr) from the partition's state znode (the source of truth)."""
    import json

    from kazoo.client import KazooClient

    zk = KazooClient(hosts=c.zk_connect, timeout=5)
    zk.start(timeout=5)
    try:
        data, _ = zk.get(f"/brokers/topics/{topic}/partitions/{partition}/state")
    finally:
        zk.stop()
        zk.close()
    s = json.loads(data)
    return s["leader"], s["leader_epoch"], sorted(s["isr"])


class StateWatcher:
    """Samples the state znode every 100 ms in a thread; counts samples whose leader is not in the ISR."""

    def __init__(self, c):
        self.c = c
        self.samples: list = []
        self.stop_flag = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stop_flag.is_set():
            try:
                self.samples.append(zk_state(self.c))
            except Exception:          # noqa: BLE001 — a missed sample is not a violation
                pass
            self.stop_flag.wait(0.1)

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.stop_flag.set()
        self.thread.join(10)

    def out_of_isr_leaders(self):
        return [s for s in self.samples if s[0] >= 0 and s[0] not in s[2]]


@pytest.mark.slow
def test_t6_leader_cut_from_followers_acks_nothing_below_min_insync(tmp_path):
    """Followers fetch from the leader at its advertised address: each broker advertises a TcpProxy,
    and cutting the leader's proxy cuts both followers' fetches (and the controller's requests to it)
    while the leader keeps its ZooKeeper session and clients still reach its listener directly.
    Invariant: no acks=all acknowledged for a record the followers do not hold (count 0), the ISR
    shrinks to the leader alone and acks=all is then refused (NOT_ENOUGH_REPLICAS[_AFTER_APPEND] or
    a timeout), no state with a leader outside its ISR, acked-but-lost 0 of N after healing."""
    c = LocalCluster(tmp_path, brokers=3, overrides={"replica.lag.time.max.ms": LAG_MS})
    proxies = {i: TcpProxy(b.port).start() for i, b in c.brokers.items()}
    try:
        for i, b in c.brokers.items():
            b.extra = {"advertised.listeners": f"PLAINTEXT://127.0.0.1:{proxies[i].port}"}
        with c:
            _t6(c, proxies)
    finally:
        for px in proxies.values():
            px.close()


def _t6(c, proxies):
    leader, epoch, _isr = make_topic(c)
    followers = [b for b in c.brokers if b != leader]
    hist = History()
    watcher = StateWatcher(c).start()
    raw = RawAcksAllSender(c.brokers[leader].port, hist, b"cut-", interval=0.004, max_requests=6000,
                           timeout_ms=3000).start()
    try:
        wait_until(lambda: sum(1 for a in raw.answers if a[2] == 0) >= 300, 30, "300 acks from the leader")
        proxies[leader].cut()
        cut_at = time.monotonic()
        shrunk = wait_until(lambda: (lambda s: s if s[2] == [leader] else None)(zk_state(c)),
                            LAG_MS / 1000 + 15, "the leader to shrink the ISR to itself")
        shrunk_at = time.monotonic()
        assert shrunk[0] == leader and shrunk[1] == epoch, f"leader changed though it kept its session: {shrunk}"
        # Keep writing for a while below min.insync.replicas, then read what the followers hold.
        wait_until(lambda: sum(1 for a in raw.answers if a[0] > shrunk_at + 3) >= 50, 20,
                   "answers after the shrink")
        follower_end = max((stored(c, b)[-1][1] + 1) if stored(c, b) else 0 for b in followers)
        single_copy_acks = [(v, off) for _t, v, err, off in raw.answers if err == 0 and off >= follower_end]
        after_shrink = [a for a in raw.answers if a[0] > shrunk_at]
        acked_after_shrink = [a for a in after_shrink if a[2] == 0]
        errors = sorted({a[2] for a in after_shrink})
        proxies[leader].heal()
        wait_until(lambda: zk_state(c)[2] == [0, 1, 2], 60, "the followers to rejoin after healing")
        raw.finish()
    finally:
        proxies[leader].heal()
        watcher.stop()
        if not raw.closed.is_set():
            raw.finish()
    read_all_confluent(f"127.0.0.1:{c.brokers[leader].port}", TOPIC, 1, hist)
    report = hist.check()
    bad_leaders = watcher.out_of_isr_leaders()
    print(report.line())
    print(f"T6: ISR shrank to [{leader}] {shrunk_at - cut_at:.1f}s after the cut; followers held offsets < "
          f"{follower_end}; acks for records only the leader held: {len(single_copy_acks)}; answers after the "
          f"shrink {len(after_shrink)} (acked {len(acked_after_shrink)}, error codes {errors}); "
          f"state samples {len(watcher.samples)}, leader outside ISR {len(bad_leaders)}")
    assert single_copy_acks == [], single_copy_acks[:5]
    assert acked_after_shrink == [], acked_after_shrink[:5]
    assert set(errors) <= {NOT_ENOUGH_REPLICAS, NOT_ENOUGH_REPLICAS_AFTER_APPEND, 7}, errors
    assert bad_leaders == [], bad_leaders[:5]
    assert report.acked >= 300
    assert report.acked_lost == 0, report.line()
    assert report.inconsistent_offsets == 0, report.line()
    wait_until(lambda: logs_identical(c), 30, "identical logs on all three brokers")


# ---- ZooKeeper ensemble: one node lost, then the quorum lost and restored -------------------------

@pytest.mark.slow
def test_zookeeper_node_loss_unnoticed_then_quorum_loss_and_return_loses_nothing(tmp_path):
    """Three ZooKeeper nodes (zk/local.py start_ensemble), three brokers, idempotent acks=all load.
    (1) kill -9 the ZooKeeper quorum leader: invariant — nothing noticed: no broker session expires
    (registrations keep their czxid), no leader change (same leader and epoch), no failed send, acks
    go on. (2) kill -9 a second node (no quorum) for longer than the session timeout, then bring both
    back: what needs no ZooKeeper write (fetching, HW, acks=all with an unchanged ISR) goes on, as in
    Kafka (acks during the loss > 0, failed sends 0); then acked-but-lost 0, inconsistent offsets 0,
    duplicates 0, no leader outside its ISR, and a full ISR again once the quorum is back."""
    from zk.local import ensemble_connect_string, quorum_mode, start_ensemble, start_node

    nodes = start_ensemble(tmp_path / "zk", 3, tick_time_ms=1000, die_with_parent=True)
    restarted = []
    try:
        with LocalCluster(tmp_path / "cluster", brokers=3, zookeeper_connect=ensemble_connect_string(nodes),
                          overrides={"replica.lag.time.max.ms": LAG_MS}) as c:
            _zk_faults(c, nodes, restarted, quorum_mode, start_node)
    finally:
        for n in nodes + restarted:
            n.stop()


def _zk_faults(c, nodes, restarted, quorum_mode, start_node):
    leader, epoch, _isr = make_topic(c)
    czxids = {b: c.registration_czxid(b) for b in c.brokers}
    hist = History()
    load = LoadProducer(c.bootstrap, hist, rate=1000, **{"enable.idempotence": True, "acks": "all"}).start()
    try:
        wait_acks_grow(load, 500)
        # (1) one node of three: the quorum leader (forces a ZooKeeper leader election too).
        first = next(n for n in nodes if quorum_mode(n.port) == "leader")
        os.kill(first.pid, signal.SIGKILL)
        first.stop()
        wait_acks_grow(load, 3000, timeout=30)     # > 3 s of load at 1,000/s across the election
        after_one = zk_state(c)
        same_sessions = {b: c.registration_czxid(b) for b in c.brokers} == czxids
        failed_phase1 = len(hist.failed)
        print(f"ZK node lost: state {after_one} (before: leader {leader} epoch {epoch}), "
              f"sessions kept {same_sessions}, failed sends {failed_phase1}")
        assert after_one == (leader, epoch, [0, 1, 2]), after_one
        assert same_sessions, "a broker's ZooKeeper session expired after losing one node of three"
        assert failed_phase1 == 0, list(hist.failed.items())[:3]

        # (2) a second node: no quorum, for longer than the session timeout.
        second = next(n for n in nodes if n is not first)
        os.kill(second.pid, signal.SIGKILL)
        second.stop()
        lost_at = time.monotonic()
        acked_at_loss = load.acked_count()
        wait_until(lambda: time.monotonic() - lost_at > c.session_timeout_ms / 1000 + 2, 30,
                   "the quorum to stay lost past the session timeout", interval=0.2)
        acked_during = load.acked_count() - acked_at_loss
        failed_during = len(hist.failed) - failed_phase1
        restarted.append(start_node(second.data_dir, die_with_parent=True))
        back_at = time.monotonic()
        restarted.append(start_node(first.data_dir, die_with_parent=True))
        wait_until(lambda: all(c.registration_czxid(b) is not None for b in c.brokers), 60,
                   "every broker registered after the quorum returned")
        final = wait_until(lambda: (lambda s: s if s[2] == [0, 1, 2] else None)(zk_state(c)), 60,
                           "a full ISR after the quorum returned")
        wait_acks_grow(load, 1000, timeout=60)
        recovered = time.monotonic() - back_at
        expired = [b for b in c.brokers if c.registration_czxid(b) != czxids[b]]
    finally:
        load.finish()
    read_all_confluent(c.bootstrap, TOPIC, 1, hist)
    report = hist.check()
    print(report.line())
    print(f"ZK quorum lost {c.session_timeout_ms / 1000 + 2:.0f}s: acks during the loss {acked_during}, "
          f"failed sends during it {failed_during}; after return: state {final}, brokers re-registered "
          f"(sessions expired) {expired}, load back to 1,000 acks {recovered:.1f}s after the quorum")
    # As Kafka does: a leader whose ISR does not change needs no ZooKeeper write, so acks=all goes on
    # while the quorum is gone (the conditional ISR write would fence it if the ISR had to change).
    assert acked_during > 0 and failed_during == 0, (acked_during, failed_during)
    assert final[0] in final[2]
    assert report.acked_lost == 0, report.line()
    assert report.inconsistent_offsets == 0, report.line()
    assert report.duplicates == 0, report.line()


# ---- the tools these tests rely on can see what they look for -------------------------------------

def test_offsets_in_log_counts_an_ack_the_final_log_lacks():
    h = History()
    for v in (b"a", b"b", b"c"):
        h.send(v)
    h.ack(b"a", 0, 0)
    h.ack(b"b", 0, 1)                    # acknowledged, then truncated away: offset 1 holds c
    h.ack(b"c", 0, 5)                    # acknowledged at an offset that does not exist at all
    h.poll(0, 0, b"a")
    h.poll(0, 1, b"c")
    assert offsets_in_log(h, [b"a"]) == 0
    assert offsets_in_log(h, [b"a", b"b", b"c"]) == 2
    assert h.check().acked_lost == 1 and h.check().inconsistent_offsets == 1


def test_proxy_forwards_cuts_open_connections_and_heals():
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(5)

    def echo_once():
        conn, _ = srv.accept()
        with conn:
            while data := conn.recv(4096):
                conn.sendall(data)

    with TcpProxy(srv.getsockname()[1]) as px:
        for _round in range(2):
            t = threading.Thread(target=echo_once, daemon=True)
            t.start()
            s = socket.create_connection(("127.0.0.1", px.port), timeout=5)
            s.sendall(b"ping")
            assert s.recv(4) == b"ping"
            px.cut()
            # The open connection is dropped (EOF or reset), and a new one is closed at once.
            try:
                assert s.recv(4) == b""
            except ConnectionResetError:
                pass
            s.close()
            s2 = socket.create_connection(("127.0.0.1", px.port), timeout=5)
            try:
                assert s2.recv(4) == b""
            except ConnectionResetError:
                pass
            s2.close()
            t.join(5)
            px.heal()
    srv.close()
