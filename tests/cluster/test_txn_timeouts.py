"""The transaction coordinator's clocks and races on a real broker: an ongoing transaction past its
timeout is aborted with an epoch bump (the producer is fenced); an idle transactional id expires
(``transactional.id.expiration.ms``); concurrent EndTxn calls are answered as Kafka does;
``kbroker transactions list`` / ``describe`` show the coordinator's state; and a hanging transaction (a
producer the coordinator never knew, on a broker without KIP-890 verification) is shown by
``describe-producers``, found by ``find-hanging`` and ended by ``abort``."""
from __future__ import annotations

import asyncio
import io
import threading

import pytest

from kbroker.cli import transactions as tool
from kbroker.cli.main import build_parser
from kbroker.protocol.errors import Errors as E
from kbroker.testing import LocalCluster, wait_until
from tests.cluster.test_txn_coordinator import add, describe, end, init, ready
from tests.support.builders import batch
from tests.support.checkers import RawConn, create_topic

EXPIRATION_MS = 4000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("txntimeouts"), brokers=1, num_partitions=1,
                      overrides={"transaction.state.log.num.partitions": 3,
                                 "transaction.abort.timed.out.transaction.cleanup.interval.ms": 200,
                                 "transaction.remove.expired.transaction.cleanup.interval.ms": 200,
                                 "transactional.id.expiration.ms": EXPIRATION_MS}) as c:
        create_topic(c.bootstrap, "tt", 1)
        yield c


def test_timed_out_transaction_is_aborted_and_its_producer_fenced(cluster):
    with RawConn(cluster.bootstrap) as c:
        wait_until(lambda: c.request(10, 3, {"key": "tx-slow", "key_type": 1})["error_code"] == 0, 30, "coordinator")
        r = {}
        wait_until(lambda: r.update(init(c, "tx-slow", timeout_ms=300)) or r["error_code"] == 0, 30, "init")
        pid, epoch = r["producer_id"], r["producer_epoch"]
        assert add(c, "tx-slow", pid, epoch, {"tt": [0]}) == {("tt", 0): 0}
        wait_until(lambda: describe(c, "tx-slow")["transaction_state"] == "CompleteAbort", 20, "timeout abort")
        d = describe(c, "tx-slow")
        assert (d["producer_id"], d["producer_epoch"]) == (pid, epoch + 1)
        assert end(c, "tx-slow", pid, epoch, True) == E.PRODUCER_FENCED
        assert add(c, "tx-slow", pid, epoch, {"tt": [0]}) == {("tt", 0): E.PRODUCER_FENCED}


def test_idle_transactional_id_expires(cluster):
    with RawConn(cluster.bootstrap) as c:
        first = ready(c, "tx-idle")
        assert describe(c, "tx-idle")["transaction_state"] == "Empty"
        wait_until(lambda: describe(c, "tx-idle")["error_code"] == E.TRANSACTIONAL_ID_NOT_FOUND,
                   EXPIRATION_MS / 1000 + 20, "expiry")
        again = ready(c, "tx-idle")
        assert again["error_code"] == 0 and again["producer_id"] != first["producer_id"]
        assert again["producer_epoch"] == 0


def _race(cluster, requests):
    """Send each (api_key, version, body) on its own connection at once; -> answers in order."""
    conns = [RawConn(cluster.bootstrap) for _ in requests]
    answers = [None] * len(requests)
    try:
        go = threading.Barrier(len(requests))

        def one(i):
            go.wait()
            answers[i] = conns[i].request(*requests[i])
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(requests))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        for c in conns:
            c.close()
    return answers


def test_concurrent_end_txn(cluster):
    with RawConn(cluster.bootstrap) as c:
        r = ready(c, "tx-race")
        pid, epoch = r["producer_id"], r["producer_epoch"]
        body = {"transactional_id": "tx-race", "producer_id": pid, "producer_epoch": epoch}
        for commit_second in (True, False):
            assert add(c, "tx-race", pid, epoch, {"tt": [0]}) == {("tt", 0): 0}
            codes = [a["error_code"] for a in _race(cluster, [(26, 3, {**body, "committed": True}),
                                                              (26, 3, {**body, "committed": commit_second})])]
            # Exactly one moves the transaction to PrepareCommit; the other sees it in progress or done
            # (same result) or is refused (the other result).
            assert codes.count(0) >= 1, codes
            other = E.INVALID_TXN_STATE if not commit_second else E.CONCURRENT_TRANSACTIONS
            assert all(x in (0, other, E.CONCURRENT_TRANSACTIONS) for x in codes), codes
            wait_until(lambda: describe(c, "tx-race")["transaction_state"] in ("CompleteCommit", "CompleteAbort"),
                       20, "complete")
            if describe(c, "tx-race")["transaction_state"] == "CompleteAbort":
                assert not commit_second and codes[0] != 0 and codes[1] == 0, codes


def _tool(cluster, *argv) -> str:
    out = io.StringIO()
    args = build_parser().parse_args(["transactions", "--bootstrap-server", cluster.bootstrap, *argv])
    assert asyncio.run(tool.run(args, out)) == 0
    return out.getvalue()


def test_transactions_tool_list_and_describe(cluster):
    with RawConn(cluster.bootstrap) as c:
        r = ready(c, "tx-tool")
        assert add(c, "tx-tool", r["producer_id"], r["producer_epoch"], {"tt": [0]}) == {("tt", 0): 0}
    lines = _tool(cluster, "list").splitlines()
    assert lines[0].split() == ["TransactionalId", "Coordinator", "ProducerId", "TransactionState"]
    assert ["tx-tool", "0", str(r["producer_id"]), "Ongoing"] in [line.split() for line in lines[1:]]
    desc = _tool(cluster, "describe", "--transactional-id", "tx-tool").splitlines()
    assert desc[0].split() == ["CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch", "TransactionState",
                               "TransactionTimeoutMs", "CurrentTransactionStartTimeMs", "TransactionDurationMs",
                               "TopicPartitions"]
    row = desc[1].split("\t")
    assert [x.strip() for x in row[:6]] == ["0", "tx-tool", str(r["producer_id"]), str(r["producer_epoch"]),
                                           "Ongoing", "30000"]
    assert row[8].strip() == "tt-0"


@pytest.fixture(scope="module")
def unverified(tmp_path_factory):
    """A broker that takes transactional batches without asking the coordinator (KIP-890 off): a
    producer the coordinator never heard of can leave a hanging transaction, as older brokers allowed."""
    with LocalCluster(tmp_path_factory.mktemp("txnhanging"), brokers=1, num_partitions=1,
                      overrides={"transaction.state.log.num.partitions": 3,
                                 "transaction.partition.verification.enable": False}) as c:
        create_topic(c.bootstrap, "hang", 1)
        yield c


def _lso(conn, topic) -> int:
    r = conn.request(2, 2, {"replica_id": -1, "isolation_level": 1, "topics": [
        {"name": topic, "partitions": [{"partition_index": 0, "timestamp": -1}]}]})
    return r["topics"][0]["partitions"][0]["offset"]


def test_hanging_transaction_found_and_aborted(unverified):
    c = unverified
    with RawConn(c.bootstrap) as conn:
        wait_until(lambda: conn.request(10, 3, {"key": "x", "key_type": 1})["error_code"] == 0, 30, "coordinator")
        body = {"transactional_id": "lost", "acks": -1, "timeout_ms": 5000, "topic_data": [{"name": "hang",
                "partition_data": [{"index": 0, "records": batch(3, 10, pid=4242, epoch=0, seq=0, transactional=True)}]}]}
        r = conn.request(0, 8, body)
        assert r["responses"][0]["partition_responses"][0]["error_code"] == 0
        assert conn.request(0, 8, {**body, "transactional_id": None, "topic_data": [{"name": "hang",
                            "partition_data": [{"index": 0, "records": batch(2, 10)}]}]}
                            )["responses"][0]["partition_responses"][0]["error_code"] == 0
        assert _lso(conn, "hang") == 0             # the open transaction holds the LSO
    prods = _tool(c, "describe-producers", "--topic", "hang", "--partition", "0").splitlines()
    assert prods[0].split() == ["ProducerId", "ProducerEpoch", "LatestCoordinatorEpoch", "LastSequence",
                                "LastTimestamp", "CurrentTransactionStartOffset"]
    assert [x.split()[0] for x in prods[1:]] == ["4242"] and prods[1].split()[-1] == "0"
    hanging = _tool(c, "find-hanging", "--topic", "hang", "--max-transaction-timeout", "0").splitlines()
    assert hanging[0].split()[:6] == ["Topic", "Partition", "ProducerId", "ProducerEpoch", "CoordinatorEpoch",
                                      "StartOffset"]
    assert [x.split()[:3] for x in hanging[1:]] == [["hang", "0", "4242"]]
    _tool(c, "abort", "--topic", "hang", "--partition", "0", "--start-offset", "0")
    assert _tool(c, "find-hanging", "--topic", "hang", "--max-transaction-timeout", "0").splitlines()[1:] == []
    with RawConn(c.bootstrap) as conn:
        wait_until(lambda: _lso(conn, "hang") == 6, 30, "LSO past the marker")   # 3 aborted + 2 + marker
