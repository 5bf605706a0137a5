"""Moving a replica between the log dirs of a broker (AlterReplicaLogDirs, Kafka's future replica) on a
real 3-broker cluster under an idempotent acks=all producer: the partition's leader replica is moved by
kafka-python's admin ``alter_replica_log_dirs``, then back by ``kbroker reassign-partitions
--bootstrap-server --execute`` with Kafka's ``log_dirs`` in the reassignment JSON and ``--verify``.

Invariant: each move ends with the replica in the target dir and nothing of it left in the old one, and
the history checker finds acked-but-lost 0, duplicates 0 and no inconsistent offset over the whole run."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient
from kafka.errors import NoError
from kafka.structs import TopicPartitionReplica

from checkers import History, RawConn, read_all_confluent
from kbroker.testing import LocalCluster, wait_until
from test_replication import TOPIC, LoadProducer, state, wait_acks_grow

DESCRIBE_LOG_DIRS = 35


def replica_dirs(port, topic=TOPIC) -> dict:
    """{is_future: dir} of the topic's partition 0 on one broker (DescribeLogDirs v4)."""
    with RawConn(f"127.0.0.1:{port}") as c:
        resp = c.request(DESCRIBE_LOG_DIRS, 4, {"topics": [{"topic": topic, "partitions": [0]}]})
    return {p["is_future_key"]: r["log_dir"] for r in resp["results"] for t in r["topics"] for p in t["partitions"]}


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kbroker", *args], capture_output=True, text=True, timeout=120)


def test_a_leader_replica_moves_between_dirs_under_load(tmp_path):
    c = LocalCluster(tmp_path / "c", brokers=3, overrides={"replica.lag.time.max.ms": 3000})
    b0 = c.brokers[0]
    a, b = str(b0.data_dir / "a"), str(b0.data_dir / "b")
    b0.extra = {"log.dirs": f"{a},{b}"}
    with c:
        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        admin.create_topics([NewTopic(TOPIC, 1, replica_assignment=[[0, 1, 2]],
                                      config={"min.insync.replicas": "2", "segment.bytes": "200000"})]
                            )[TOPIC].result(30)
        wait_until(lambda: state(c)[0] == 0 and len(state(c)[2]) == 3, 30, "broker 0 leading, ISR of 3")
        first = replica_dirs(b0.port)[False]
        other = b if first == a else a
        hist = History()
        load = LoadProducer(c.bootstrap, hist, rate=1000, **{
            "enable.idempotence": True, "acks": "all", "request.timeout.ms": 5000, "socket.timeout.ms": 5000})
        load.start()
        try:
            wait_acks_grow(load, 2000, timeout=60)          # a few segments to copy

            ka = KafkaAdminClient(bootstrap_servers=c.bootstrap)
            try:
                result = ka.alter_replica_log_dirs({TopicPartitionReplica(TOPIC, 0, 0): other})
            finally:
                ka.close()
            assert list(result.values()) == [NoError], result      # kafka-python answers error classes
            wait_until(lambda: replica_dirs(b0.port) == {False: other}, 60, "the replica in its new dir")
            assert not os.path.exists(os.path.join(first, f"{TOPIC}-0"))
            assert not [n for n in os.listdir(first) if n.endswith(("-delete", "-future"))]
            wait_acks_grow(load, 500, timeout=60)           # appends go on in the new dir

            plan = tmp_path / "plan.json"
            plan.write_text(json.dumps({"version": 1, "partitions": [
                {"topic": TOPIC, "partition": 0, "replicas": [0, 1, 2], "log_dirs": [first, "any", "any"]}]}))
            out = cli("reassign-partitions", "--bootstrap-server", c.bootstrap, "--execute",
                      "--reassignment-json-file", str(plan))
            assert out.returncode == 0, out.stderr
            assert f"Successfully started log directory move for: {TOPIC}-0-0" in out.stdout
            assert "Successfully started partition reassignment" not in out.stdout    # same replicas
            verify = wait_until(lambda: (lambda r: r if r.returncode == 0 else None)(cli(
                "reassign-partitions", "--bootstrap-server", c.bootstrap, "--verify",
                "--reassignment-json-file", str(plan))), 60, "--verify to report the move complete")
            assert verify.stdout.splitlines()[:3] == [
                "Status of partition reassignment:", f"Reassignment of partition {TOPIC}-0 is complete.",
                f"Reassignment of replica {TOPIC}-0-0 completed successfully."], verify.stdout
            assert replica_dirs(b0.port) == {False: first}
            assert not os.path.exists(os.path.join(other, f"{TOPIC}-0"))
            wait_acks_grow(load, 500, timeout=60)
        finally:
            load.finish()
        read_all_confluent(c.bootstrap, TOPIC, 1, hist)
        report = hist.check()
        print(report.line())
        assert report.acked >= 3000
        assert report.acked_lost == 0, report.line()
        assert report.duplicates == 0, report.line()
        assert report.inconsistent_offsets == 0, report.line()
        log_text = b0.log_path.read_text(errors="replace")
        assert f"{TOPIC}-0: moved from {first} to {other}" in log_text
        assert f"{TOPIC}-0: moved from {other} to {first}" in log_text


def test_alter_replica_log_dirs_errors(tmp_path):
    c = LocalCluster(tmp_path / "c", brokers=1)
    b0 = c.brokers[0]
    a, b = str(b0.data_dir / "a"), str(b0.data_dir / "b")
    b0.extra = {"log.dirs": f"{a},{b}"}
    with c:
        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(30)
        wait_until(lambda: state(c)[0] == 0, 30, "a leader")
        with RawConn(f"127.0.0.1:{b0.port}") as conn:
            resp = conn.request(34, 2, {"dirs": [
                {"path": "/nowhere", "topics": [{"name": TOPIC, "partitions": [0]}]},
                {"path": b, "topics": [{"name": "no-such-topic", "partitions": [0]}]}]})
        codes = {(r["topic_name"], p["partition_index"]): p["error_code"] for r in resp["results"]
                 for p in r["partitions"]}
        assert codes == {(TOPIC, 0): 57, ("no-such-topic", 0): 3}    # LOG_DIR_NOT_FOUND, UNKNOWN_TOPIC_OR_PARTITION
