"""Exactly-once under broker crashes: a confluent-kafka consume-transform-produce loop (read_committed
consumer, transactional producer, send_offsets_to_transaction) on 3 brokers (every topic RF=3,
min.insync.replicas=2) while the transaction coordinator's broker is killed with SIGKILL inside a
transaction (its records and offsets written, EndTxn not yet sent) and restarted, and later the leader of
an output partition (not the group's coordinator) is, the same way. Some transactions are aborted on
purpose, others by the faults.

Invariant, checked with the shared history checker on a read_committed read of the whole output: every
input record is in the committed output exactly once (``not_once`` 0 of N), nothing an aborted
transaction wrote is visible (``aborted_visible`` 0), nothing a committed transaction wrote is missing or
moved (``acked_lost``, ``inconsistent_offsets`` 0); and no committed offset is lost: whenever the loop
reads its group's offsets back (after every abort and at the end) they are at least those of its last
confirmed commit, and at the end they are the input's end offsets.
"""
from __future__ import annotations

import time

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from kbroker.testing import LocalCluster, wait_until
from tests.support.checkers import History, RawConn, read_all_confluent, wait_for_topic

SRC, DST, TID = "ctp-in", "ctp-out", "ctp-tx"
PARTITIONS = 2
PER_PARTITION = 120
TXN_RECORDS = 8              # records per transaction at most
ABORT_EVERY = 5              # every 5th transaction is aborted on purpose
PHASE_TXNS = 4               # transactions between two fault steps


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("txnctp"), brokers=3, num_partitions=PARTITIONS,
                      overrides={"transaction.state.log.num.partitions": 1,
                                 "transaction.state.log.replication.factor": 3,
                                 "transaction.state.log.min.isr": 2,
                                 "offsets.topic.num.partitions": 3,     # a group apart from the txn's
                                 "offsets.topic.replication.factor": 3,
                                 "default.replication.factor": 3,
                                 "min.insync.replicas": 2,
                                 "group.initial.rebalance.delay.ms": 0}) as c:
        yield c


def _metadata(bootstrap: str) -> dict:
    for hp in bootstrap.split(","):
        try:
            with RawConn(hp, timeout=5) as c:
                return c.request(3, 1, {"topics": None})
        except OSError:
            continue
    raise ConnectionError(f"no broker of {bootstrap} answers")


def _coordinator(bootstrap: str, key: str = TID, key_type: int = 1) -> int:
    """The broker coordinating transactional id ``key`` (key_type 1) or group ``key`` (key_type 0)."""
    out = {}

    def found():
        for hp in bootstrap.split(","):
            try:
                with RawConn(hp, timeout=5) as c:
                    r = c.request(10, 3, {"key": key, "key_type": key_type})
            except OSError:
                continue
            out.update(r)
            return r["error_code"] == 0
        return False
    wait_until(found, 60, f"coordinator of {key}")
    return out["node_id"]


def _fully_replicated(bootstrap: str) -> bool:
    """Every partition of every topic (internal ones too) has a leader and all 3 replicas in its ISR."""
    try:
        md = _metadata(bootstrap)
    except ConnectionError:
        return False
    return all(p["error_code"] == 0 and p["leader_id"] >= 0 and len(p["isr_nodes"]) == 3
               for t in md["topics"] for p in t["partitions"])


def _group_apart(bootstrap: str, txn_coordinator: int) -> str:
    """A group id whose coordinator is not the transaction's: the first fault kills the transaction
    coordinator, and librdkafka (2.16) keeps a group coordinator that left the metadata cached and waits
    for it to come back, past send_offsets_to_transaction's timeout (the loop would hang, not fail)."""
    for i in range(64):
        group = f"ctp-group-{i}"
        if _coordinator(bootstrap, group, 0) != txn_coordinator:
            return group
    raise AssertionError(f"every offsets partition is led by the transaction coordinator {txn_coordinator}")


def _output_leader(bootstrap: str, group: str):
    """The leader of an output partition that is not the group's coordinator (nor, when one is not, the
    transaction's), or None: killing the group's coordinator would stall the loop until its restart,
    which comes only after the phase (see _group_apart)."""
    group_coordinator, txn_coordinator = _coordinator(bootstrap, group, 0), _coordinator(bootstrap)
    md = _metadata(bootstrap)
    leaders = [p["leader_id"] for t in md["topics"] if t["name"] == DST for p in t["partitions"]]
    fit = sorted((b == txn_coordinator, b) for b in leaders if b >= 0 and b != group_coordinator)
    return fit[0][1] if fit else None


def _output_leader_apart(bootstrap: str, group: str) -> int:
    """An output leader apart from the group's coordinator. The restarted broker leads nothing until the
    preferred leaders are elected again, so both output partitions may be led by the coordinator's
    broker: then elect them (their preferred leaders are two different brokers)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    out = []

    def found():
        b = _output_leader(bootstrap, group)
        if b is None:
            try:
                admin.elect_leaders(ck.ElectionType.PREFERRED, None).result(30)
            except ck.KafkaException:
                pass        # ELECTION_NOT_NEEDED for some partitions, or a retry in progress
            return False
        out.append(b)
        return True
    wait_until(found, 60, "an output leader that is not the group's coordinator", interval=1.0)
    return out[0]


class Loop:
    """The application: read a batch, write it to DST (value and partition kept), commit the batch's
    offsets in the same transaction; on an abort or a fatal producer error, rewind to the group's
    committed offsets, as Kafka's exactly-once examples do."""

    def __init__(self, bootstrap: str, history: History, group: str):
        self.bootstrap = bootstrap
        self.history = history
        self.cons = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                 "isolation.level": "read_committed", "enable.auto.commit": False,
                                 "auto.offset.reset": "earliest", "fetch.wait.max.ms": 50})
        self.cons.assign([ck.TopicPartition(SRC, p, ck.OFFSET_STORED) for p in range(PARTITIONS)])
        self.prod = None
        self.confirmed = {p: 0 for p in range(PARTITIONS)}   # offsets of the last confirmed commit
        self.next = dict(self.confirmed)                      # the consumer's position as we read
        self.txns = self.committed_txns = self.aborted_txns = self.fatal = 0
        self.offsets_lost = self.consumer_errors = 0
        self.last_error = None
        self.before_commit = None     # run once inside the next transaction, before its EndTxn
        self.deadline = float("inf")  # the current phase's: no client call retries past it
        self.doing = None             # the transactional call in progress, for a failure message
        self._new_producer()

    def _new_producer(self):
        if self.prod is not None:
            try:
                self.prod.flush(0)
            except ck.KafkaException:
                pass    # a fenced producer raises its fatal error here; the new one replaces it anyway
        self.prod = ck.Producer({"bootstrap.servers": self.bootstrap, "transactional.id": TID, "linger.ms": 5,
                                 "transaction.timeout.ms": 60000, "message.timeout.ms": 55000})
        self.prod.init_transactions(60)

    def close(self):
        self.cons.close()
        if self.prod is not None:
            try:
                self.prod.flush(10)
            except ck.KafkaException as e:
                # a fenced or fatal producer raises here: that must not hide why the loop stopped
                self.last_error = e.args[0]

    def describe(self) -> str:
        """What the loop saw, for a failure message: the consumer's positions and errors, the group's offsets."""
        tps = [ck.TopicPartition(SRC, p) for p in range(PARTITIONS)]
        try:
            committed = [tp.offset for tp in self.cons.committed(tps, 10)]
        except ck.KafkaException as e:
            committed = repr(e.args[0])
        positions = [tp.offset for tp in self.cons.position(tps)]
        return (f"positions {positions}, committed {committed}, {self.consumer_errors} consumer errors, "
                f"last error {self.last_error}, stopped in {self.doing}")

    def done(self, ends: dict) -> bool:
        return all(self.confirmed[p] >= ends[p] for p in ends)

    def rewind(self):
        """Seek to the group's committed offsets; count any below the last confirmed commit (lost)."""
        got = self.cons.committed([ck.TopicPartition(SRC, p) for p in range(PARTITIONS)], 60)
        for tp in got:
            off = max(tp.offset, 0)
            if off < self.confirmed[tp.partition]:
                self.offsets_lost += 1
            self.confirmed[tp.partition] = max(self.confirmed[tp.partition], off)
            self.next[tp.partition] = self.confirmed[tp.partition]
            self.cons.seek(ck.TopicPartition(SRC, tp.partition, self.next[tp.partition]))

    def one(self) -> bool:
        """One transaction (or nothing when no input came); True when it committed."""
        got = self.cons.consume(TXN_RECORDS, 0.5)
        msgs = [m for m in got if not m.error()]
        self.consumer_errors += len(got) - len(msgs)
        if len(msgs) < len(got):
            self.last_error = next(m.error() for m in got if m.error())
        if not msgs:
            return False
        self.txns += 1
        delivered = []

        def on_delivery(err, m):
            if err is None:
                delivered.append((m.value(), m.partition(), m.offset()))

        try:
            self.doing = "begin_transaction"
            self.prod.begin_transaction()
            for m in msgs:
                self.prod.produce(DST, value=m.value(), partition=m.partition(), on_delivery=on_delivery)
                self.next[m.partition()] = m.offset() + 1
            offsets = [ck.TopicPartition(SRC, p, o) for p, o in self.next.items()]
            self.doing = "send_offsets_to_transaction"
            self.prod.send_offsets_to_transaction(offsets, self.cons.consumer_group_metadata(), self._timeout())
            self.doing = "flush"
            self.prod.flush(self._timeout())
            if self.txns % ABORT_EVERY == 0:
                self._abort(delivered)
                return False
            if self.before_commit is not None:
                fault, self.before_commit = self.before_commit, None
                fault()
            while True:
                self.doing = "commit_transaction"
                try:
                    self.prod.commit_transaction(self._timeout())
                    break
                except ck.KafkaException as e:
                    # a retriable error (e.g. the timeout) leaves the commit to be retried, within the phase
                    self.last_error = e.args[0]
                    if not e.args[0].retriable() or time.monotonic() >= self.deadline:
                        raise
            self.doing = None
            self.prod.poll(0)
            for v, p, o in delivered:
                self.history.ack(v, p, o)
            self.confirmed = dict(self.next)
            self.committed_txns += 1
            return True
        except ck.KafkaException as e:
            self.last_error = e.args[0]
            if e.args[0].txn_requires_abort():
                try:
                    self._abort(delivered)
                    return False
                except ck.KafkaException:
                    pass
            # Fatal (fenced, or the outcome unknown): a new producer with the same id fences this one and
            # aborts or completes what it left; the group's offsets say which.
            self.fatal += 1
            self._new_producer()
            self.rewind()
            return False

    def _timeout(self) -> float:
        """A transactional call's timeout: 60 s, cut to what is left of the phase (at least 1 s)."""
        return max(1.0, min(60.0, self.deadline - time.monotonic()))

    def _abort(self, delivered):
        self.doing = "abort_transaction"
        self.prod.abort_transaction(self._timeout())
        self.doing = None
        self.prod.poll(0)
        for v, p, o in delivered:
            self.history.abort(v, p, o)
        self.aborted_txns += 1
        self.rewind()


def test_consume_transform_produce_exactly_once_under_kill_9(cluster):
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    for f in admin.create_topics([NewTopic(t, PARTITIONS, 3, config={"min.insync.replicas": "2"})
                                  for t in (SRC, DST)]).values():
        f.result(30)
    for t in (SRC, DST):
        wait_for_topic(cluster.bootstrap, t, PARTITIONS)
    hist = History()
    feed = ck.Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for p in range(PARTITIONS):
        for i in range(PER_PARTITION):
            v = b"in-%d-%d" % (p, i)
            hist.send(v)
            feed.produce(SRC, value=v, partition=p)
    assert feed.flush(60) == 0
    ends = {p: PER_PARTITION for p in range(PARTITIONS)}

    group = _group_apart(cluster.bootstrap, _coordinator(cluster.bootstrap))
    loop = Loop(cluster.bootstrap, hist, group)
    steps = []
    t0 = time.monotonic()
    try:
        def run(n_committed: int, what: str):
            target = loop.committed_txns + n_committed
            deadline = loop.deadline = time.monotonic() + 90
            while loop.committed_txns < target and not loop.done(ends):
                assert time.monotonic() < deadline, (f"no progress {what}: {loop.committed_txns} < {target} "
                                                    f"({loop.txns} transactions, {loop.fatal} fatal, {loop.describe()})")
                loop.one()
            assert not loop.done(ends), f"the input ran out {what}: too few records for the fault schedule"

        run(PHASE_TXNS, "before the faults")
        # Each kill lands inside a transaction: its records and offsets are written, EndTxn is not sent.
        coord = _coordinator(cluster.bootstrap)
        loop.before_commit = lambda: (cluster.kill(coord), steps.append(f"killed coordinator {coord}"))
        run(PHASE_TXNS, "after killing the coordinator")
        cluster.start_broker(coord)
        wait_until(lambda: _fully_replicated(cluster.bootstrap), 60, "ISR whole again")
        run(PHASE_TXNS, "after restarting the coordinator")
        leader = _output_leader_apart(cluster.bootstrap, group)
        loop.before_commit = lambda: (cluster.kill(leader), steps.append(f"killed output leader {leader}"))
        run(PHASE_TXNS, "after killing an output leader")
        cluster.start_broker(leader)
        wait_until(lambda: _fully_replicated(cluster.bootstrap), 60, "ISR whole again")
        deadline = loop.deadline = time.monotonic() + 90
        while not loop.done(ends):
            assert time.monotonic() < deadline, f"the loop stopped at {loop.confirmed} of {ends}: {loop.describe()}"
            loop.one()
        loop.rewind()                   # the group's offsets read back once more: nothing lost
    finally:
        loop.close()
    loop_s = time.monotonic() - t0

    # Every transaction is finished (LSO = high watermark) before the read_committed read of the output.
    wait_until(lambda: _ends(cluster.bootstrap, "read_committed") == _ends(cluster.bootstrap, "read_uncommitted"),
               60, "the output's last stable offsets to reach its high watermarks")
    read_all_confluent(cluster.bootstrap, DST, PARTITIONS, hist, isolation="read_committed")
    r = hist.check()
    print(f"T-txn-ctp {' , '.join(steps)}; transactions {loop.txns} (committed {loop.committed_txns}, "
          f"aborted {loop.aborted_txns}, fatal {loop.fatal}) in {loop_s:.1f} s; {r.line()}; "
          f"committed offsets lost {loop.offsets_lost}")
    assert len(steps) == 2 and loop.aborted_txns >= 2
    assert r.not_once == 0, r.line()
    assert r.aborted_visible == 0, r.line()
    assert r.acked_lost == r.inconsistent_offsets == r.duplicates == r.unseen == 0, r.line()
    assert loop.offsets_lost == 0
    assert loop.confirmed == ends


def _ends(bootstrap: str, isolation: str) -> dict:
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"ends-{time.monotonic_ns()}",
                     "isolation.level": isolation})
    try:
        return {p: c.get_watermark_offsets(ck.TopicPartition(DST, p), timeout=10)[1] for p in range(PARTITIONS)}
    finally:
        c.close()
