"""The transaction coordinator's clocks and races on a real broker: an ongoing transaction past its
timeout is aborted with an epoch bump (the producer is fenced); an idle transactional id expires
(``transactional.id.expiration.ms``); concurrent EndTxn calls are answered as Kafka does; and
``kbroker transactions list`` / ``describe`` show the coordinator's state."""
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
