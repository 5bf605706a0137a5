"""Admin operations that outlive one broker's answer, on a real 3-broker cluster:

- DeleteRecords is answered once every in-sync replica's log start has moved (Kafka's
  DelayedDeleteRecords): with an in-sync follower paused (SIGSTOP) it times out REQUEST_TIMED_OUT;
  resumed, the next one is answered with the new low watermark, and a follower that takes over as leader
  starts its log there.
- A reassignment started through AlterPartitionReassignments (no /admin/reassign_partitions entry) is
  resumed by the next controller when the one that started it is killed -9, and completes."""
from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient
from kafka.structs import TopicPartition as KpTopicPartition
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from kbroker.testing import LocalCluster, wait_until
from kbroker.zk import layout as L
from checkers import RawConn
from test_replication import state


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("waits"), brokers=3) as c:
        yield c


def fill(c, topic, n, size=100):
    p = Producer({"bootstrap.servers": c.bootstrap, "acks": "all", "linger.ms": 20})
    for _ in range(n):
        p.produce(topic, b"x" * size, partition=0)
    assert p.flush(60) == 0


def earliest(c, topic) -> int:
    from confluent_kafka import Consumer
    cons = Consumer({"bootstrap.servers": c.bootstrap, "group.id": f"e-{time.monotonic_ns()}"})
    try:
        return cons.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[0]
    finally:
        cons.close()


def test_delete_records_waits_for_every_in_sync_follower(cluster):
    c = cluster
    topic = f"dr-{os.getpid()}"
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    admin.create_topics([NewTopic(topic, 1, replica_assignment=[[0, 1, 2]])])[topic].result(30)
    fill(c, topic, 100)
    wait_until(lambda: (lambda s: s if s[2] == [0, 1, 2] else None)(state(c, topic)), 30, "ISR of 3")

    def delete(offset, timeout_s):
        [fut] = admin.delete_records([TopicPartition(topic, 0, offset)], request_timeout=30,
                                     operation_timeout=timeout_s).values()
        return fut

    t0 = time.monotonic()
    assert delete(10, 10).result(30).low_watermark == 10
    assert time.monotonic() - t0 < 10
    os.kill(c.brokers[2].pid, signal.SIGSTOP)           # in sync (replica.lag.time.max.ms is 30 s) but silent
    try:
        t0 = time.monotonic()
        with pytest.raises(KafkaException) as e:
            delete(50, 2).result(30)
        assert e.value.args[0].code() == KafkaError.REQUEST_TIMED_OUT
        assert time.monotonic() - t0 >= 2
    finally:
        os.kill(c.brokers[2].pid, signal.SIGCONT)
    assert delete(60, 20).result(30).low_watermark == 60
    # Every replica has moved: whichever takes over starts its log at 60.
    c.stop_broker(0)
    try:
        wait_until(lambda: state(c, topic)[0] in (1, 2), 30, "a new leader")
        assert earliest(c, topic) == 60
    finally:
        c.start_broker(0)


def _controller(zk) -> int:
    """The controller's id, -1 while none holds /controller (the znode may go between two reads)."""
    try:
        return json.loads(zk.get(L.CONTROLLER)[0])["brokerid"]
    except NoNodeError:
        return -1


def test_an_api_reassignment_resumes_after_the_controller_is_killed(cluster):
    c = cluster
    topic = f"ra-{os.getpid()}"
    zk = KazooClient(hosts=c.zk_connect)
    zk.start(timeout=10)
    try:
        ctl = _controller(zk)
        src, dst = [b for b in c.brokers if b != ctl]
        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        admin.create_topics([NewTopic(topic, 1, replica_assignment=[[src]])])[topic].result(30)
        fill(c, topic, 2000, 1000)
        # The new replica copies at 10 kB/s: its first fetch (up to replica.fetch.max.bytes, 1 MiB) goes
        # through, the quota's 11 one-second windows then hold it back for ~10 s, so the move of the 2 MB
        # is still running when the controller dies.
        throttle(admin, dst, topic, "10000", f"0:{dst}")
        # dst learns the topic's throttled replicas from a ZooKeeper notification: start the move only
        # once it answers with them, or its first fetches may copy the whole log unthrottled
        wait_until(lambda: _config_on(c, dst, 2, topic).get("follower.replication.throttled.replicas") == f"0:{dst}",
                   30, "the throttle known to the new replica's broker")
        assert _config_on(c, dst, 4, str(dst)).get("follower.replication.throttled.rate") == "10000"
        tp = KpTopicPartition(topic, 0)
        target = [src, dst]
        kp = KafkaAdminClient(bootstrap_servers=c.bootstrap, request_timeout_ms=30000)
        try:
            assert kp.alter_partition_reassignments({tp: target}) == {tp: None}
            assert tp in kp.list_partition_reassignments()
        finally:
            kp.close()
        # started through the API: nothing in /admin/reassign_partitions tells the next controller
        assert not zk.exists(L.REASSIGN_PARTITIONS) or topic not in zk.get(L.REASSIGN_PARTITIONS)[0].decode()
        c.kill(ctl)
        wait_until(lambda: _controller(zk) not in (ctl, -1), 30, "a new controller")
        new = _controller(zk)
        throttle(admin, dst, topic, None, None)      # let the copy finish

        def done():
            a = L.decode_topic(zk.get(L.topic_path(topic))[0])
            return a if a.partitions[0] == target and not a.adding_replicas and not a.removing_replicas else None
        wait_until(done, 90, "the reassignment to complete under the new controller")
        assert sorted(state(c, topic)[2]) == sorted(target)
        # the new controller found the move in the topic znode (other tests of this module may leave more)
        logs = "".join(b.log_path.read_text(errors="replace") for b in c.brokers.values() if b.log_path.exists())
        assert re.search(r"resuming \d+ reassignment\(s\) in progress", logs), new
    finally:
        zk.stop()
        zk.close()
        if not c.brokers[ctl].running():
            c.start_broker(ctl)


def _config_on(c, broker, resource_type, name) -> dict:
    """{key: value} of a resource (2 topic, 4 broker) as broker ``broker`` itself describes it."""
    with RawConn(f"127.0.0.1:{c.brokers[broker].port}") as conn:
        got = conn.request(32, 1, {"resources": [{"resource_type": resource_type, "resource_name": name,
                                                  "configuration_keys": None}], "include_synonyms": False})
    (res,) = got["results"]
    return {e["name"]: e["value"] for e in res["configs"]}


def throttle(admin, broker, topic, rate, replicas):
    """Set (or, with None, delete) broker ``broker``'s follower rate and ``topic``'s throttled replicas."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource
    op = AlterConfigOpType.SET if rate is not None else AlterConfigOpType.DELETE
    fs = admin.incremental_alter_configs([
        ConfigResource("BROKER", str(broker), incremental_configs=[ConfigEntry(
            "follower.replication.throttled.rate", rate or "", incremental_operation=op)]),
        ConfigResource("TOPIC", topic, incremental_configs=[ConfigEntry(
            "follower.replication.throttled.replicas", replicas or "", incremental_operation=op)])])
    for f in fs.values():
        f.result(30)
