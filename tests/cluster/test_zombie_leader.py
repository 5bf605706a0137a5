"""A leader cut from ZooKeeper and from its followers while producers still reach it (a zombie leader)
stops leading once its session may have expired (zk/lease.py, Broker._session_fence).

Three real brokers, ZooKeeper (tickTime 0.5 s) session timeout 6 s, one partition RF=3 led by the
victim, min.insync.replicas=2. The victim reaches ZooKeeper through a TcpProxy, and advertises a
LinkProxy: every connection to it goes through that proxy, which can drop just the ones other
brokers open (their fetchers' and the controller's, recognised by the client id of their first
request) while client connections go on. An idempotent acks=all confluent-kafka producer writes
through the bootstrap.

1. Short cut (2 s, well inside the session timeout): nothing changes - same leader, same leader
   epoch, same registration, no partition stepped down from.
2. Long cut (until the controller has replaced the victim): the victim steps down on its own before
   ZooKeeper may have expired it; the producer's first acknowledgement of a record sent after the
   cut comes within session timeout + 2 s of the cut (without the fencing it comes only after the
   heal: the victim holds the batches and never says it no longer leads). /metrics and
   ``topics --describe`` on the victim show it. Healed, it re-registers and follows.

Invariants (counted, asserted 0): acknowledged records missing from the final log, or read at
another offset than acknowledged; values stored twice (idempotent producer); leadership changes
caused by the short cut."""
from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from checkers import History, read_all_confluent
from kbroker.testing import LocalCluster, free_port, wait_until
from kbroker.zk.lease import NegotiatedTimeoutLogger, SessionLease
from kbroker.zk.local import start_zookeeper
from proxy import LOOPBACK, TcpProxy
from test_replication import TOPIC, LoadProducer
from test_replication_faults import zk_state

SESSION_MS = 6000
SHORT_CUT_S = 2.0
VICTIM = 2
GAUGE = "kbroker_replicamanager_selffencedpartitions"


class LinkProxy(TcpProxy):
    """A broker's advertised address: forwards every connection; ``cut_links()`` drops the ones
    other brokers opened (client id ``broker-N-fetcher`` / ``controller-N`` in their first request
    header) and refuses new ones until ``heal_links()``; clients keep their connections."""

    BROKER_IDS = ("broker-", "controller-")

    def __init__(self, target_port: int):
        super().__init__(target_port)
        self.links_cut = False
        self._links: set = set()

    def cut_links(self) -> None:
        self._call(self._cut_links())

    def heal_links(self) -> None:
        self.links_cut = False

    async def _cut_links(self):
        self.links_cut = True
        for w in list(self._links):
            self._writers.discard(w)
            w.transport.abort()
        self._links.clear()

    async def _pipe(self, reader, writer, other):
        if writer.get_extra_info("peername")[1] == self.target_port:    # the client -> broker direction
            try:
                head = await asyncio.wait_for(reader.readexactly(4), 10)
                frame = await asyncio.wait_for(reader.readexactly(int.from_bytes(head, "big")), 10)
            except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError):
                frame = None
            # request header v1+: api_key, api_version, correlation_id, client_id (int16 length + bytes)
            n = int.from_bytes(frame[8:10], "big", signed=True) if frame else 0
            link = n > 0 and frame[10:10 + n].decode("utf-8", "replace").startswith(self.BROKER_IDS)
            if frame is None or (link and self.links_cut):
                self.refused += frame is not None
                for w in (writer, other):
                    self._writers.discard(w)
                    w.transport.abort()
                return
            if link:
                self._links.update((writer, other))
            writer.write(head + frame)
        await super()._pipe(reader, writer, other)


class TimedHistory(History):
    """History plus the monotonic time of each send and acknowledgement."""

    def __init__(self):
        super().__init__()
        self.sent_at: dict = {}
        self.acked_at: dict = {}
        self._times = threading.Lock()   # acks arrive on the producer's thread while the test reads them

    def send(self, value: bytes) -> None:
        self.sent_at[value] = time.monotonic()
        super().send(value)

    def ack(self, value: bytes, partition: int, offset: int) -> None:
        with self._times:
            self.acked_at[value] = time.monotonic()
        super().ack(value, partition, offset)

    def first_ack_of_sent_after(self, t: float) -> float | None:
        """When the first record sent after ``t`` was acknowledged (None: none yet)."""
        with self._times:
            acked = list(self.acked_at.items())
        times = [a for v, a in acked if self.sent_at[v] > t]
        return min(times) if times else None


def fenced_gauge(port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    m = re.search(rf"^{GAUGE} (\S+)$", text, re.M)
    assert m, f"{GAUGE} missing from /metrics"
    return float(m.group(1))


def describe(port: int) -> tuple[str, str]:
    """``kbroker topics --describe`` asked of one broker -> (stdout, stderr)."""
    r = subprocess.run([sys.executable, "-m", "kbroker", "topics", "--bootstrap-server", f"127.0.0.1:{port}",
                        "--describe", "--topic", TOPIC], capture_output=True, text=True, timeout=60)
    return r.stdout, r.stderr


FENCED_WARNING = f"WARNING: broker {VICTIM} has fenced itself"


# ---- the lease alone -------------------------------------------------------------------------------

def test_lease_deadline_moves_with_answers_of_the_current_session_only():
    lease = SessionLease(6000, now=100.0)
    assert lease.deadline == pytest.approx(100.0 + 6.0 - 0.6)
    lease.heard(101.0, session_id=7)
    lease.heard(100.5, session_id=7)            # an older request answered late: the anchor stays
    assert lease.deadline == pytest.approx(101.0 + 5.4)
    assert not lease.expired(106.3) and lease.expired(106.4)
    lease.heard(103.0, session_id=8)            # a new session starts its own anchor
    assert lease.anchor == 103.0


def test_lease_uses_the_negotiated_timeout_when_the_server_lowered_it():
    lease = SessionLease(30000, now=0.0)
    logger = NegotiatedTimeoutLogger(__import__("logging").getLogger("kazoo.test"), lease)
    logger.log(5, "Session created, session_id: %r session_passwd: %s\n    negotiated session timeout: %s",
               0x1, "00", 20000)
    assert lease.timeout_ms == 20000 and lease.deadline == pytest.approx(18.0)
    lease.negotiated_timeout_ms = 40000         # raised by the server: the configured one still bounds it
    assert lease.timeout_ms == 30000


def test_the_history_checker_counts_an_acknowledged_record_the_log_lacks():
    h = History()
    for i, v in enumerate((b"a", b"b")):
        h.send(v)
        h.ack(v, 0, i)
    h.poll(0, 0, b"a")
    h.poll(0, 5, b"a")                          # stored twice
    r = h.check()
    assert (r.acked_lost, r.duplicates) == (1, 1), r.line()


# ---- the cluster -----------------------------------------------------------------------------------

@pytest.mark.slow
def test_zombie_leader_steps_down_before_its_session_expires_and_loses_nothing(tmp_path):
    metrics_port = free_port()
    c = LocalCluster(tmp_path, brokers=3, overrides={"replica.lag.time.max.ms": 4000},
                     session_timeout_ms=SESSION_MS)
    # tickTime 500 ms: ZooKeeper rounds an expiry up to its next tick, a later election adds to the
    # measured time without saying anything about the broker
    zk = start_zookeeper(tmp_path / "zookeeper", port=0, tick_time_ms=500, die_with_parent=True,
                         avoid_ports={b.port for b in c.brokers.values()} | {metrics_port})
    zpx = links = None
    try:
        c.external_zk = zk.connect_string
        zpx = TcpProxy(zk.port).start()
        links = LinkProxy(c.brokers[VICTIM].port).start()
        c.brokers[VICTIM].extra = {"zookeeper.connect": f"127.0.0.1:{zpx.port}",
                                   "advertised.listeners": f"PLAINTEXT://127.0.0.1:{links.port}",
                                   "kbroker.metrics.port": metrics_port}
        with c:
            _zombie(c, zpx, links, metrics_port)
    finally:
        for px in (zpx, links):
            if px is not None:
                px.close()
        zk.stop()


def _time_of(predicate, timeout: float) -> float | None:
    """When ``predicate`` first held (monotonic), or None after ``timeout``: measured here, judged at
    the end, so one run reports every figure."""
    try:
        wait_until(predicate, timeout, "a measured event")
    except TimeoutError:
        return None
    return time.monotonic()


def _cut(zpx, links):
    zpx.cut()
    links.cut_links()
    return time.monotonic()


def _heal(zpx, links):
    zpx.heal()
    links.heal_links()


def _zombie(c, zpx, links, metrics_port):
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, replica_assignment=[[VICTIM, 0, 1]],
                                  config={"min.insync.replicas": "2"})])[TOPIC].result(30)
    leader, epoch, isr = wait_until(lambda: (lambda s: s if len(s[2]) == 3 else None)(zk_state(c)), 30, "ISR of 3")
    assert leader == VICTIM
    czxid = c.registration_czxid(VICTIM)
    hist = TimedHistory()
    load = LoadProducer(c.bootstrap, hist, rate=300, **{
        "enable.idempotence": True, "acks": "all", "client.id": "zombie-test",
        "request.timeout.ms": 30000, "message.timeout.ms": 120000, "retry.backoff.ms": 50,
        "topic.metadata.refresh.interval.ms": 1000}).start()
    healed = True
    try:
        wait_until(lambda: len(hist.acked) >= 300, 30, "300 acks before the cuts")
        # 1. Short cut: no leadership change, nothing stepped down from.
        t0 = _cut(zpx, links)
        healed = False
        time.sleep(SHORT_CUT_S)         # the cut's length is what is under test, not a wait for readiness
        reconnects = zpx.accepted
        _heal(zpx, links)
        healed = True
        # kazoo retries with a back-off: the long cut below must start from a connected session
        wait_until(lambda: zpx.accepted > reconnects, 30, "the victim to reconnect to ZooKeeper")
        short_gauge = fenced_gauge(metrics_port)
        described_short = describe(c.brokers[VICTIM].port)
        wait_until(lambda: hist.first_ack_of_sent_after(t0 + SHORT_CUT_S), 30, "acks after the short cut")
        after_short = zk_state(c)
        short_changes = int(after_short[:2] != (VICTIM, epoch)) + int(c.registration_czxid(VICTIM) != czxid)
        short_changes += int(short_gauge != 0)
        wait_until(lambda: len(zk_state(c)[2]) == 3, 60, "the ISR of 3 again")
        # 2. Long cut: the victim becomes a zombie unless it steps down.
        base = len(hist.acked)
        wait_until(lambda: len(hist.acked) >= base + 200, 30, "200 acks before the long cut")
        cut_at = _cut(zpx, links)
        healed = False
        fenced_at = _time_of(lambda: fenced_gauge(metrics_port) >= 1, SESSION_MS / 1000 + 5)
        described = describe(c.brokers[VICTIM].port)
        new = wait_until(lambda: (lambda s: s if s[0] not in (VICTIM, -1) else None)(zk_state(c)), 30,
                         "a new leader")
        _time_of(lambda: hist.first_ack_of_sent_after(cut_at), SESSION_MS / 1000 + 10)
        first = hist.first_ack_of_sent_after(cut_at)
        _heal(zpx, links)
        healed = True
        wait_until(lambda: (lambda z: z is not None and z != czxid)(c.registration_czxid(VICTIM)), 60,
                   "the victim to re-register")
        wait_until(lambda: len(zk_state(c)[2]) == 3, 60, "the victim back in the ISR")
        wait_until(lambda: fenced_gauge(metrics_port) == 0, 30, "the victim's partition settled by LeaderAndIsr")
        base = len(hist.acked)
        wait_until(lambda: len(hist.acked) >= base + 200, 30, "200 acks after the heal")
    finally:
        if not healed:
            _heal(zpx, links)
        load.finish(120)
    read_all_confluent(c.bootstrap, TOPIC, 1, hist)
    report = hist.check()
    print(report.line())
    late = lambda t: "never" if t is None else f"{t - cut_at:.1f} s after the cut"  # noqa: E731
    print(f"zombie cut: the victim stepped down {late(fenced_at)}, new leader {new[0]} (epoch {new[1]}); "
          f"first ack of a record sent after the cut {late(first)}; short cut ({SHORT_CUT_S} s): "
          f"state {after_short}, changes {short_changes}")
    assert short_changes == 0, (after_short, epoch, short_gauge)
    assert first is not None and first - cut_at <= SESSION_MS / 1000 + 2, f"first ack {late(first)}"
    assert fenced_at is not None and fenced_at - cut_at < SESSION_MS / 1000, f"stepped down {late(fenced_at)}"
    assert new[1] > epoch and new[0] in isr, (new, epoch, isr)
    assert re.search(rf"Partition: 0\tLeader: none\t", described[0]), described
    assert FENCED_WARNING in described[1], described
    assert FENCED_WARNING not in described_short[1] and f"Leader: {VICTIM}" in described_short[0], described_short
    assert report.acked_lost == 0, report.line()
    assert report.inconsistent_offsets == 0, report.line()
    assert report.duplicates == 0, report.line()
