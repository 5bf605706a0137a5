"""The transaction coordinator's APIs over the wire, on a real broker: FindCoordinator key_type=1 (with
``__transaction_state`` created on first use), InitProducerId with a transactional id (new id, epoch bump,
KIP-360 recovery, fencing errors per version, INVALID_TRANSACTION_TIMEOUT), AddPartitionsToTxn (unknown
topics, v4 verify_only), AddOffsetsToTxn, EndTxn (stale epoch, wrong state, concurrent calls),
DescribeTransactions and ListTransactions; the state survives a broker restart (loaded from the log)."""
from __future__ import annotations

import pytest

from kbroker.protocol.errors import Errors as E
from kbroker.testing import LocalCluster, wait_until
from tests.support.checkers import RawConn, create_topic

TXN_PARTITIONS = 5


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("txncoord"), brokers=1, num_partitions=2,
                      overrides={"transaction.state.log.num.partitions": TXN_PARTITIONS,
                                 "transaction.max.timeout.ms": 60000}) as c:
        create_topic(c.bootstrap, "t1", 2)
        yield c


def find(conn, tid, version=3):
    return conn.request(10, version, {"key": tid, "key_type": 1})


def init(conn, tid, timeout_ms=30000, pid=-1, epoch=-1, version=4):
    body = {"transactional_id": tid, "transaction_timeout_ms": timeout_ms, "producer_id": pid, "producer_epoch": epoch}
    return conn.request(22, version, body)


def ready(conn, tid):
    """InitProducerId once the coordinator is found and loaded (clients retry the same way)."""
    wait_until(lambda: find(conn, tid)["error_code"] == 0, 30, "transaction coordinator")
    out = {}

    def attempt():
        r = init(conn, tid)
        out.update(r)
        return r["error_code"] not in (E.COORDINATOR_LOAD_IN_PROGRESS, E.NOT_COORDINATOR,
                                       E.COORDINATOR_NOT_AVAILABLE, E.CONCURRENT_TRANSACTIONS)
    wait_until(attempt, 30, "InitProducerId")
    return out


def add(conn, tid, pid, epoch, parts, version=3):
    body = {"v3_and_below_transactional_id": tid, "v3_and_below_producer_id": pid,
            "v3_and_below_producer_epoch": epoch,
            "v3_and_below_topics": [{"name": t, "partitions": ps} for t, ps in parts.items()]}
    r = conn.request(24, version, body)
    return {(t["name"], p["partition_index"]): p["partition_error_code"]
            for t in r["results_by_topic_v3_and_below"] for p in t["results_by_partition"]}


def end(conn, tid, pid, epoch, commit, version=3):
    return conn.request(26, version, {"transactional_id": tid, "producer_id": pid, "producer_epoch": epoch,
                                      "committed": commit})["error_code"]


def describe(conn, tid):
    return conn.request(65, 0, {"transactional_ids": [tid]})["transaction_states"][0]


def test_find_coordinator_creates_the_state_topic(cluster):
    with RawConn(cluster.bootstrap) as c:
        wait_until(lambda: find(c, "tx-find")["error_code"] == 0, 30, "coordinator")
        r = find(c, "tx-find")
        assert (r["node_id"], f"{r['host']}:{r['port']}") == (0, cluster.bootstrap)
        md = c.request(3, 1, {"topics": [{"name": "__transaction_state"}]})
        t = md["topics"][0]
        assert t["error_code"] == 0 and len(t["partitions"]) == TXN_PARTITIONS and t["is_internal"]
        assert find(c, "")["error_code"] == E.INVALID_REQUEST
        v4 = c.request(10, 4, {"key_type": 1, "coordinator_keys": ["a", "b"]})
        assert [x["error_code"] for x in v4["coordinators"]] == [0, 0]


def test_init_producer_id_new_id_then_epoch_bumps(cluster):
    with RawConn(cluster.bootstrap) as c:
        r = ready(c, "tx-init")
        assert r["error_code"] == 0 and r["producer_id"] >= 0 and r["producer_epoch"] == 0
        again = init(c, "tx-init")
        assert (again["error_code"], again["producer_id"], again["producer_epoch"]) == (0, r["producer_id"], 1)
        # KIP-360: the current id and epoch bump it; a retry with the previous epoch gets the current one.
        bumped = init(c, "tx-init", pid=r["producer_id"], epoch=1)
        assert (bumped["error_code"], bumped["producer_epoch"]) == (0, 2)
        retry = init(c, "tx-init", pid=r["producer_id"], epoch=1)
        assert (retry["error_code"], retry["producer_epoch"]) == (0, 2)
        stale = init(c, "tx-init", pid=r["producer_id"], epoch=0)
        assert stale["error_code"] == E.PRODUCER_FENCED
        assert init(c, "tx-init", pid=r["producer_id"], epoch=0, version=3)["error_code"] == E.INVALID_PRODUCER_EPOCH
        assert init(c, "tx-init", pid=r["producer_id"] + 999, epoch=2)["error_code"] == E.PRODUCER_FENCED


def test_transaction_timeout_over_the_maximum(cluster):
    with RawConn(cluster.bootstrap) as c:
        wait_until(lambda: find(c, "tx-timeout")["error_code"] == 0, 30, "coordinator")
        assert init(c, "tx-timeout", timeout_ms=60001)["error_code"] == E.INVALID_TRANSACTION_TIMEOUT
        assert init(c, "tx-timeout", timeout_ms=0)["error_code"] == E.INVALID_TRANSACTION_TIMEOUT
        assert init(c, "", timeout_ms=1000)["error_code"] == E.INVALID_REQUEST


def test_add_partitions_unknown_topics_and_producer_checks(cluster):
    with RawConn(cluster.bootstrap) as c:
        r = ready(c, "tx-add")
        pid, epoch = r["producer_id"], r["producer_epoch"]
        codes = add(c, "tx-add", pid, epoch, {"t1": [0, 1], "no-such-topic": [0]})
        assert codes == {("t1", 0): E.OPERATION_NOT_ATTEMPTED, ("t1", 1): E.OPERATION_NOT_ATTEMPTED,
                         ("no-such-topic", 0): E.UNKNOWN_TOPIC_OR_PARTITION}
        assert add(c, "tx-add", pid, epoch, {"t1": [7]}) == {("t1", 7): E.UNKNOWN_TOPIC_OR_PARTITION}
        assert describe(c, "tx-add")["transaction_state"] == "Empty"
        assert add(c, "tx-add", pid + 1, epoch, {"t1": [0]}) == {("t1", 0): E.INVALID_PRODUCER_ID_MAPPING}
        assert add(c, "tx-add", pid, epoch + 1, {"t1": [0]}) == {("t1", 0): E.PRODUCER_FENCED}
        assert add(c, "tx-add", pid, epoch + 1, {"t1": [0]}, version=1) == {("t1", 0): E.INVALID_PRODUCER_EPOCH}
        assert add(c, "tx-add", pid, epoch, {"t1": [0, 1]}) == {("t1", 0): 0, ("t1", 1): 0}
        d = describe(c, "tx-add")
        assert (d["error_code"], d["transaction_state"], d["producer_id"], d["producer_epoch"]) == \
            (0, "Ongoing", pid, epoch)
        assert d["topics"] == [{"topic": "t1", "partitions": [0, 1]}] and d["transaction_start_time_ms"] > 0
        # v4 verify_only, as a partition leader asks (KIP-890): in the transaction or not.
        v4 = c.request(24, 4, {"transactions": [{"transactional_id": "tx-add", "producer_id": pid,
                                                 "producer_epoch": epoch, "verify_only": True,
                                                 "topics": [{"name": "t1", "partitions": [0]}]}]})
        res = v4["results_by_transaction"][0]["topic_results"][0]["results_by_partition"]
        assert res == [{"partition_index": 0, "partition_error_code": 0}]
        # AddOffsetsToTxn adds the group's __consumer_offsets partition.
        r2 = c.request(25, 3, {"transactional_id": "tx-add", "producer_id": pid, "producer_epoch": epoch,
                               "group_id": "g-add"})
        assert r2["error_code"] == 0
        assert "__consumer_offsets" in {t["topic"] for t in describe(c, "tx-add")["topics"]}


def test_end_txn_errors_and_prepare(cluster):
    with RawConn(cluster.bootstrap) as c:
        r = ready(c, "tx-end")
        pid, epoch = r["producer_id"], r["producer_epoch"]
        assert end(c, "tx-end", pid, epoch, True) == E.INVALID_TXN_STATE          # nothing ongoing
        wait_until(lambda: end(c, "tx-unknown-id", pid, epoch, True) != E.COORDINATOR_LOAD_IN_PROGRESS, 30, "load")
        assert end(c, "tx-unknown-id", pid, epoch, True) == E.INVALID_PRODUCER_ID_MAPPING
        assert add(c, "tx-end", pid, epoch, {"t1": [0]}) == {("t1", 0): 0}
        assert end(c, "tx-end", pid, epoch - 1, True) == E.PRODUCER_FENCED         # stale epoch
        assert end(c, "tx-end", pid, epoch - 1, True, version=1) == E.INVALID_PRODUCER_EPOCH
        assert end(c, "tx-end", pid + 1, epoch, True) == E.INVALID_PRODUCER_ID_MAPPING
        assert end(c, "tx-end", pid, epoch, False) == 0
        d = describe(c, "tx-end")
        assert d["transaction_state"] in ("PrepareAbort", "CompleteAbort")
        # A second EndTxn: the same result is in progress or done; the other one is refused.
        assert end(c, "tx-end", pid, epoch, False) in (E.CONCURRENT_TRANSACTIONS, 0)
        assert end(c, "tx-end", pid, epoch, True) == E.INVALID_TXN_STATE


def test_list_and_describe(cluster):
    with RawConn(cluster.bootstrap) as c:
        r = ready(c, "tx-list")
        assert add(c, "tx-list", r["producer_id"], r["producer_epoch"], {"t1": [1]}) == {("t1", 1): 0}
        lst = c.request(66, 1, {"state_filters": [], "producer_id_filters": [], "duration_filter": -1})
        assert lst["error_code"] == 0
        ids = {x["transactional_id"]: x for x in lst["transaction_states"]}
        assert ids["tx-list"]["transaction_state"] == "Ongoing"
        assert ids["tx-list"]["producer_id"] == r["producer_id"]
        ongoing = c.request(66, 0, {"state_filters": ["Ongoing", "Bogus"], "producer_id_filters": []})
        assert ongoing["unknown_state_filters"] == ["Bogus"]
        assert all(x["transaction_state"] == "Ongoing" for x in ongoing["transaction_states"])
        by_pid = c.request(66, 0, {"state_filters": [], "producer_id_filters": [r["producer_id"]]})
        assert [x["transactional_id"] for x in by_pid["transaction_states"]] == ["tx-list"]
        wait_until(lambda: describe(c, "tx-never-seen")["error_code"] != E.COORDINATOR_LOAD_IN_PROGRESS, 30, "load")
        assert describe(c, "tx-never-seen")["error_code"] == E.TRANSACTIONAL_ID_NOT_FOUND


def test_state_is_loaded_after_a_restart(cluster):
    with RawConn(cluster.bootstrap) as c:
        r = ready(c, "tx-restart")
        assert add(c, "tx-restart", r["producer_id"], r["producer_epoch"], {"t1": [0, 1]}) == \
            {("t1", 0): 0, ("t1", 1): 0}
    cluster.stop_broker(0)
    cluster.start_broker(0)
    with RawConn(cluster.bootstrap) as c:
        def loaded():
            d = describe(c, "tx-restart")
            return d if d["error_code"] == 0 else None
        wait_until(loaded, 60, "coordinator loaded")
        d = loaded()
        assert (d["transaction_state"], d["producer_id"], d["producer_epoch"]) == \
            ("Ongoing", r["producer_id"], r["producer_epoch"])
        assert d["topics"] == [{"topic": "t1", "partitions": [0, 1]}]


def _txn_commit(conn, tid, group, pid, epoch, offsets, generation=-1, member="", version=3):
    body = {"transactional_id": tid, "group_id": group, "producer_id": pid, "producer_epoch": epoch,
            "generation_id": generation, "member_id": member, "group_instance_id": None,
            "topics": [{"name": t, "partitions": [{"partition_index": p, "committed_offset": o,
                                                   "committed_leader_epoch": -1, "committed_metadata": ""}]}
                       for (t, p), o in offsets.items()]}
    r = conn.request(28, version, body)
    return {(t["name"], p["partition_index"]): p["error_code"] for t in r["topics"] for p in t["partitions"]}


def _fetch(conn, group, tp, stable=True):
    r = conn.request(9, 7, {"group_id": group, "topics": [{"name": tp[0], "partition_indexes": [tp[1]]}],
                            "require_stable": stable})
    if r["error_code"]:          # the group's (coordinator loading or elsewhere): no partitions
        return r["error_code"], -1
    p = r["topics"][0]["partitions"][0]
    return p["error_code"], p["committed_offset"]


def test_txn_offset_commit_is_pending_until_the_marker(cluster):
    tp = ("t1", 0)
    with RawConn(cluster.bootstrap) as c:
        for group, commit in (("g-txn-commit", True), ("g-txn-abort", False)):
            tid = f"tx-{group}"
            r = ready(c, tid)
            pid, epoch = r["producer_id"], r["producer_epoch"]
            assert c.request(25, 3, {"transactional_id": tid, "producer_id": pid, "producer_epoch": epoch,
                                     "group_id": group})["error_code"] == 0
            wait_until(lambda: c.request(10, 3, {"key": group, "key_type": 0})["error_code"] == 0, 30, "group")
            wait_until(lambda: _txn_commit(c, tid, group, pid, epoch, {tp: 42}) == {tp: 0}, 30, "txn commit")
            # KIP-447: a member id the group does not know is refused.
            assert _txn_commit(c, tid, group, pid, epoch, {tp: 43}, generation=1, member="nobody") == \
                {tp: E.UNKNOWN_MEMBER_ID}
            assert _fetch(c, group, tp) == (E.UNSTABLE_OFFSET_COMMIT, -1)
            assert _fetch(c, group, tp, stable=False) == (0, -1)      # the committed offset: none yet
            assert end(c, tid, pid, epoch, commit) == 0
            wait_until(lambda: _fetch(c, group, tp)[0] == 0, 30, "marker on __consumer_offsets")
            assert _fetch(c, group, tp) == (0, 42 if commit else -1)


def test_transactional_offsets_are_reloaded_held_until_their_marker(cluster):
    tp = ("t1", 1)
    with RawConn(cluster.bootstrap) as c:
        ids = {}
        for group in ("g-reload-done", "g-reload-open", "g-reload-aborted"):
            tid = f"tx-{group}"
            r = ready(c, tid)
            ids[group] = (tid, r["producer_id"], r["producer_epoch"])
            assert c.request(25, 3, {"transactional_id": tid, "producer_id": r["producer_id"],
                                     "producer_epoch": r["producer_epoch"], "group_id": group})["error_code"] == 0
            wait_until(lambda: c.request(10, 3, {"key": group, "key_type": 0})["error_code"] == 0, 30, "group")
            wait_until(lambda: _txn_commit(c, tid, group, r["producer_id"], r["producer_epoch"], {tp: 7}) == {tp: 0},
                       30, "txn commit")
        for group, commit in (("g-reload-done", True), ("g-reload-aborted", False)):
            assert end(c, *ids[group], commit) == 0
            wait_until(lambda: _fetch(c, group, tp)[0] == 0, 30, "marker")
    cluster.stop_broker(0)
    cluster.start_broker(0)
    with RawConn(cluster.bootstrap) as c:
        def settled(group):
            code, off = _fetch(c, group, tp)
            return None if code in (E.COORDINATOR_LOAD_IN_PROGRESS, E.NOT_COORDINATOR) else (code, off)
        for group in ids:
            wait_until(lambda: settled(group) is not None, 60, "offsets loaded")
        assert settled("g-reload-done") == (0, 7)
        assert settled("g-reload-aborted") == (0, -1)
        assert settled("g-reload-open") == (E.UNSTABLE_OFFSET_COMMIT, -1)
        tid, pid, epoch = ids["g-reload-open"]
        wait_until(lambda: end(c, tid, pid, epoch, True) not in (E.COORDINATOR_LOAD_IN_PROGRESS, E.NOT_COORDINATOR),
                   60, "coordinator loaded")
        wait_until(lambda: settled("g-reload-open") == (0, 7), 30, "committed after the reload")
