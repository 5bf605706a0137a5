"""The transaction coordinator on 3 brokers (``__transaction_state`` RF=3, min ISR 2) losing its broker to
kill -9 right after EndTxn answered (PrepareCommit durable, markers possibly not sent): the next leader of
the state partition loads it, finishes the commit (every partition gets its marker, possibly a second
time, the state reaches CompleteCommit), and the same confluent-kafka producer goes on committing through the new coordinator."""
from __future__ import annotations

import time

import confluent_kafka as ck
import pytest

from kbroker.testing import LocalCluster, wait_until
from tests.support.checkers import RawConn, all_batches, wait_for_topic

TOPIC = "fo"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("txnfailover"), brokers=3, num_partitions=2,
                      overrides={"transaction.state.log.num.partitions": 1,
                                 "transaction.state.log.replication.factor": 3,
                                 "transaction.state.log.min.isr": 2,
                                 "default.replication.factor": 3}) as c:
        yield c


def _live_bootstrap(cluster, dead) -> str:
    return ",".join(f"127.0.0.1:{b.port}" for i, b in cluster.brokers.items() if i != dead)


def _coordinator(bootstrap, tid) -> int:
    out = {}

    def found():
        with RawConn(bootstrap.split(",")[0]) as c:
            r = c.request(10, 3, {"key": tid, "key_type": 1})
        out.update(r)
        return r["error_code"] == 0
    wait_until(found, 60, "transaction coordinator")
    return out["node_id"]


def _state(bootstrap, tid) -> dict:
    node = _coordinator(bootstrap, tid)
    port = next(p for p in bootstrap.split(",") if p)  # any live broker answers FindCoordinator
    with RawConn(port) as c:
        md = c.request(3, 1, {"topics": []})
    host = next(f"{b['host']}:{b['port']}" for b in md["brokers"] if b["node_id"] == node)
    with RawConn(host) as c:
        return c.request(65, 0, {"transactional_ids": [tid]})["transaction_states"][0]


def _closed_transactions(cluster, broker_id, partition) -> tuple[int, bool]:
    """(transactions ended by a marker, data left after the last marker) in a replica's copy. A
    coordinator that loads a PrepareCommit sends its markers again although the dead one may have
    written them (as Kafka's does): a marker with no data before it since the previous one ends
    nothing and is not counted."""
    closed, open_ = 0, False
    for _p, b in all_batches(cluster.brokers[broker_id].data_dir, TOPIC, partition):
        if not b.attributes & 0x20:
            open_ = True
        elif open_:
            closed, open_ = closed + 1, False
    return closed, open_


def test_commit_survives_kill_of_the_coordinator(cluster):
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 2, 3, config={"min.insync.replicas": "2"})])[TOPIC].result(30)
    wait_for_topic(cluster.bootstrap, TOPIC, 2)
    tid = "fo-tx"
    p = ck.Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": tid, "linger.ms": 5,
                     "transaction.timeout.ms": 60000})
    p.init_transactions(60)

    def one_txn(i):
        p.begin_transaction()
        for j in range(10):
            p.produce(TOPIC, value=f"{i}-{j}".encode(), partition=j % 2)
        p.commit_transaction(60)

    for i in range(3):
        one_txn(i)
    coord = _coordinator(cluster.bootstrap, tid)
    one_txn(3)
    cluster.kill(coord)             # right after EndTxn answered: the markers may not all be out yet
    live = _live_bootstrap(cluster, coord)
    t0 = time.monotonic()
    for i in range(4, 7):
        one_txn(i)
    failover_s = time.monotonic() - t0
    assert _coordinator(live, tid) != coord
    wait_until(lambda: _state(live, tid)["transaction_state"] == "CompleteCommit", 60, "complete")
    survivor = next(i for i in cluster.brokers if i != coord)
    # Every one of the 7 transactions has its COMMIT marker on both partitions (a replica's copy).
    wait_until(lambda: all(_closed_transactions(cluster, survivor, q) == (7, False) for q in (0, 1)), 60,
               "markers replicated")
    print(f"T-txn-failover first transactions after kill -9 took {failover_s:.1f} s")
