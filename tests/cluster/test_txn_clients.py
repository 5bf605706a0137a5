"""Transactions with real clients end to end (coordinator, markers, fencing, read_committed): confluent-kafka
and aiokafka transactional producers committing and aborting leave one COMMIT/ABORT marker per transaction
and partition; a read_committed consumer sees exactly the committed records in order, a read_uncommitted
one every data record, neither a control record; a second producer with the same transactional.id fences
the first, whose later writes are refused and whose open transaction stays invisible; a
consume-transform-produce loop with send_offsets_to_transaction (one transaction aborted and replayed)
reflects every input record exactly once in the committed output, with its input offsets committed."""
from __future__ import annotations

import asyncio
import time

import confluent_kafka as ck
import pytest

from kbroker.testing import LocalCluster, wait_until
from tests.support.checkers import RawConn, all_batches, create_topic


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("txnclients"), brokers=1, num_partitions=2,
                      overrides={"transaction.state.log.num.partitions": 5, "offsets.topic.num.partitions": 5,
                                 "group.initial.rebalance.delay.ms": 0}) as c:
        yield c


def read(bootstrap, topic, partitions, committed: bool, timeout=30.0) -> list[tuple[int, bytes]]:
    """Every record a consumer of that isolation level sees, to the end of each partition (its LSO or HW)."""
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{time.monotonic_ns()}",
                     "isolation.level": "read_committed" if committed else "read_uncommitted",
                     "enable.auto.commit": False, "enable.partition.eof": True, "fetch.wait.max.ms": 50})
    out, eof = [], set()
    try:
        c.assign([ck.TopicPartition(topic, p, 0) for p in range(partitions)])
        deadline = time.monotonic() + timeout
        while len(eof) < partitions:
            assert time.monotonic() < deadline, f"reader stuck: eof {eof}, read {len(out)}"
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                assert m.error().code() == ck.KafkaError._PARTITION_EOF, m.error()
                eof.add(m.partition())
                continue
            out.append((m.partition(), m.value()))
    finally:
        c.close()
    return out


def producer(bootstrap, tid, **extra):
    return ck.Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 5, **extra})


def markers(cluster, topic, partition) -> list[int]:
    """Producer ids of the control batches in the partition's log, in log order."""
    return [b.producer_id for _path, b in all_batches(cluster.brokers[0].data_dir, topic, partition)
            if b.attributes & 0x20]


def txn_state(cluster, tid) -> dict:
    with RawConn(cluster.bootstrap) as c:
        return c.request(65, 0, {"transactional_ids": [tid]})["transaction_states"][0]


def test_confluent_commit_and_abort_mixed(cluster):
    topic = "ck-mixed"
    create_topic(cluster.bootstrap, topic, 2)
    p = producer(cluster.bootstrap, "ck-mixed")
    p.init_transactions(30)
    committed = []
    for i in range(6):
        p.begin_transaction()
        for j in range(20):
            p.produce(topic, value=f"{i}-{j}".encode(), partition=j % 2)
        if i % 3 != 1:
            p.commit_transaction(30)
            committed += [(j % 2, f"{i}-{j}".encode()) for j in range(20)]
        else:
            p.flush(30)      # the aborted records reach the log before the ABORT marker
            p.abort_transaction(30)
    # EndTxn answers once Prepare* is durable; the markers follow, one per transaction and partition,
    # then Complete*.
    wait_until(lambda: txn_state(cluster, "ck-mixed")["transaction_state"] == "CompleteCommit", 30, "complete")
    d = txn_state(cluster, "ck-mixed")
    assert d["topics"] == []
    assert all(len(markers(cluster, topic, q)) == 6 for q in (0, 1))
    assert set(markers(cluster, topic, 0)) == {d["producer_id"]}
    everything = read(cluster.bootstrap, topic, 2, committed=False)
    assert sorted(v for _q, v in everything) == sorted(f"{i}-{j}".encode() for i in range(6) for j in range(20))
    seen = read(cluster.bootstrap, topic, 2, committed=True)
    for q in (0, 1):
        assert [v for x, v in seen if x == q] == [v for x, v in committed if x == q]     # in order


def test_aiokafka_commit_and_abort_mixed(cluster):
    from aiokafka import AIOKafkaProducer

    topic = "aio-mixed"
    create_topic(cluster.bootstrap, topic, 1)

    async def run():
        p = AIOKafkaProducer(bootstrap_servers=cluster.bootstrap, transactional_id="aio-mixed")
        await p.start()
        try:
            for i in range(4):
                await p.begin_transaction()
                for j in range(10):
                    await (await p.send(topic, f"{i}-{j}".encode(), partition=0))
                if i % 2 == 0:
                    await p.commit_transaction()
                else:
                    await p.abort_transaction()
        finally:
            await p.stop()

    asyncio.run(run())
    wait_until(lambda: txn_state(cluster, "aio-mixed")["transaction_state"] == "CompleteAbort", 30, "complete")
    assert len(markers(cluster, topic, 0)) == 4
    assert len(read(cluster.bootstrap, topic, 1, committed=False)) == 40
    assert [v for _q, v in read(cluster.bootstrap, topic, 1, committed=True)] == \
        [f"{i}-{j}".encode() for i in (0, 2) for j in range(10)]


def test_zombie_is_fenced_and_its_later_writes_refused(cluster):
    topic = "zombie"
    create_topic(cluster.bootstrap, topic, 1)
    zombie = producer(cluster.bootstrap, "zombie-id")
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(topic, value=b"before-fence")
    zombie.flush(30)
    before = txn_state(cluster, "zombie-id")
    # The new instance fences the old one; the coordinator aborts its open transaction with a new epoch.
    fresh = producer(cluster.bootstrap, "zombie-id")
    fresh.init_transactions(30)
    after = txn_state(cluster, "zombie-id")
    assert after["producer_id"] == before["producer_id"] and after["producer_epoch"] >= before["producer_epoch"] + 2
    zombie.produce(topic, value=b"after-fence")
    with pytest.raises(ck.KafkaException) as e:
        zombie.commit_transaction(30)
    assert e.value.args[0].fatal() or e.value.args[0].txn_requires_abort(), e.value
    fresh.begin_transaction()
    fresh.produce(topic, value=b"fresh")
    fresh.commit_transaction(30)
    wait_until(lambda: len(markers(cluster, topic, 0)) == 2, 30, "markers")
    values = [v for _p, v in read(cluster.bootstrap, topic, 1, committed=False)]
    assert values == [b"before-fence", b"fresh"]       # the zombie's write after the fence was refused
    assert [v for _p, v in read(cluster.bootstrap, topic, 1, committed=True)] == [b"fresh"]




def test_consume_transform_produce_commits_output_and_offsets_together(cluster):
    src, dst, group = "ctp-in", "ctp-out", "ctp-group"
    create_topic(cluster.bootstrap, src, 2)
    create_topic(cluster.bootstrap, dst, 2)
    feed = ck.Producer({"bootstrap.servers": cluster.bootstrap})
    for i in range(60):
        feed.produce(src, value=str(i).encode(), partition=i % 2)
    feed.flush(30)

    def run_loop(tid, abort_first: bool) -> int:
        cons = ck.Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group,
                            "isolation.level": "read_committed", "enable.auto.commit": False,
                            "auto.offset.reset": "earliest", "enable.partition.eof": True})
        prod = producer(cluster.bootstrap, tid)
        prod.init_transactions(30)
        cons.subscribe([src])
        done, eof = 0, set()
        deadline = time.monotonic() + 60
        aborted_once = not abort_first
        try:
            while len(eof) < 2:
                assert time.monotonic() < deadline
                msgs = [m for m in cons.consume(10, 1.0)]
                for m in msgs:
                    if m.error() and m.error().code() == ck.KafkaError._PARTITION_EOF:
                        eof.add(m.partition())
                data = [m for m in msgs if not m.error()]
                if not data:
                    continue
                eof -= {m.partition() for m in data}
                prod.begin_transaction()
                for m in data:
                    prod.produce(dst, value=b"out-" + m.value(), partition=m.partition())
                prod.send_offsets_to_transaction(cons.position(cons.assignment()), cons.consumer_group_metadata(), 30)
                if not aborted_once:
                    prod.flush(30)      # the aborted output reaches the log before its ABORT marker
                    prod.abort_transaction(30)
                    aborted_once = True
                    # Rewind to the committed offsets, as an application does after an abort.
                    committed = cons.committed(cons.assignment(), 30)
                    for tp in committed:
                        cons.seek(ck.TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else 0))
                    continue
                prod.commit_transaction(30)
                done += len(data)
        finally:
            cons.close()
        return done

    assert run_loop("ctp-1", abort_first=True) == 60
    out = read(cluster.bootstrap, dst, 2, committed=True)
    assert sorted(int(v[4:]) for _p, v in out) == list(range(60))     # each input exactly once
    # The group's offsets moved with the committed transactions: a restarted loop has nothing left.
    admin_cons = ck.Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group,
                              "isolation.level": "read_committed"})
    try:
        offs = admin_cons.committed([ck.TopicPartition(src, 0), ck.TopicPartition(src, 1)], 30)
    finally:
        admin_cons.close()
    assert [o.offset for o in offs] == [30, 30]
