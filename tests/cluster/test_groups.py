"""Consumer groups against a real broker with real clients: kafka-python, confluent-kafka,
aiokafka and kcat -G each split a topic; a mixed group; commit/committed round trips; and the
coordinator's protocol answers (MEMBER_ID_REQUIRED, INVALID_SESSION_TIMEOUT, generation fencing,
standalone commits, DeleteGroups, OffsetDelete, the records written to __consumer_offsets).

Invariant of the split tests: when every member has joined before anything is produced, every
record is consumed exactly once (duplicates counted over (partition, offset); expected 0)."""
import asyncio
import subprocess
import threading
import time
import uuid

import pytest
# Imported here, once: the consumer threads importing them concurrently can deadlock on the import lock.
import aiokafka  # noqa: F401
import confluent_kafka  # noqa: F401
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor as _AioRR  # noqa: F401
from kafka import KafkaConsumer as _KC  # noqa: F401
from kafka.coordinator.assignors.range import RangePartitionAssignor as _KR  # noqa: F401
from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor as _KRR  # noqa: F401

from kbroker.client.connection import BrokerConnection
from kbroker.client.group import decode_assignment, encode_subscription
from kbroker.coordinator import records as consumer_offsets
from kbroker.testing import LocalCluster, wait_until
from kbroker.protocol.errors import Errors

SESSION_MS = 6000
OFFSETS_PARTITIONS = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("groups"), brokers=1, num_partitions=4,
                      overrides={"offsets.topic.num.partitions": OFFSETS_PARTITIONS,
                                 "group.initial.rebalance.delay.ms": 0}) as c:
        yield c


@pytest.fixture(scope="module")
def bs(cluster):
    return cluster.bootstrap


# ---- helpers -------------------------------------------------------------------------------------

def request(bs, key, body, version=None):
    async def go():
        host, port = bs.split(",")[0].rsplit(":", 1)
        conn = await BrokerConnection.open(host, int(port))
        try:
            return (await conn.send(key, body, version))[1]
        finally:
            conn.close()
    return asyncio.run(go())


def coordinator_ready(bs, group):
    """FindCoordinator answers and the coordinator has loaded the group's offsets partition."""
    if request(bs, 10, {"key": group, "key_type": 0}, 1)["error_code"] != 0:
        return False
    return request(bs, 9, {"group_id": group, "topics": None}, 5)["error_code"] == 0


def describe(bs, group):
    return request(bs, 15, {"groups": [group]}, 4)["groups"][0]


def owned(bs, group):
    """{member_id: [partitions]} of a Stable group, else None."""
    d = describe(bs, group)
    if d["group_state"] != "Stable":
        return None
    return {m["member_id"]: sorted(p for ps in decode_assignment(m["member_assignment"]).values() for p in ps)
            for m in d["members"]}


def split_ok(bs, group, members, partitions):
    o = owned(bs, group)
    if o is None or len(o) != members:
        return False
    allp = [p for ps in o.values() for p in ps]
    return sorted(allp) == list(range(partitions)) and all(o.values()) if members <= partitions else \
        sorted(allp) == list(range(partitions))


def produce(bs, topic, n):
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bs})
    for i in range(n):
        p.produce(topic, key=str(i).encode(), value=f"v{i}".encode())
    assert p.flush(30) == 0


def create_topic(bs, topic, partitions):
    from confluent_kafka.admin import AdminClient, NewTopic
    a = AdminClient({"bootstrap.servers": bs})
    a.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def check_exactly_once(seen, n):
    keys = [(p, o) for p, o, _ in seen]
    dups = len(keys) - len(set(keys))
    values = sorted(v for _, _, v in seen)
    assert dups == 0, f"{dups} duplicates"
    assert len(set(values)) == n, f"consumed {len(set(values))} distinct of {n}"


class Runner:
    """A consumer of one library polling in its own thread; ``seen`` [(partition, offset, value)]."""

    def __init__(self, lib, bs, group, topic, assignor="roundrobin", extra=None):
        self.lib, self.bs, self.group, self.topic, self.assignor = lib, bs, group, topic, assignor
        self.extra = extra or {}
        self.seen = []
        self.stop = threading.Event()
        self.error = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            getattr(self, "_" + self.lib)()
        except Exception as e:   # surfaced by close()
            self.error = e

    def _kafka_python(self):
        from kafka import KafkaConsumer
        from kafka.coordinator.assignors.range import RangePartitionAssignor
        from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
        a = {"range": RangePartitionAssignor, "roundrobin": RoundRobinPartitionAssignor}[self.assignor]
        c = KafkaConsumer(self.topic, bootstrap_servers=self.bs, group_id=self.group, auto_offset_reset="earliest",
                          session_timeout_ms=SESSION_MS, heartbeat_interval_ms=1000,
                          partition_assignment_strategy=[a], **self.extra)
        try:
            # Join only once the client's metadata holds the topic's partitions. A leader that assigned
            # without them (nothing to assign) rejoins when its metadata catches up, and kafka-python
            # 3.0.12 can strand that rejoin: when the JoinGroup/SyncGroup task finishes between two
            # poll() calls (a loaded machine), the next poll() only looks at need_rejoin(), which the
            # leader's own assignment inside that task has made False, so the result is never applied:
            # no heartbeat, no fetch, and the coordinator rightly expires the member after
            # session.timeout.ms (counts [284, 316, 0]; broker log: SyncGroup answered in 20 ms, then no
            # heartbeat for 6.0 s; client log: no "Enabling heartbeat" for that member).
            wait_until(lambda: c.partitions_for_topic(self.topic), 30, f"kafka-python metadata of {self.topic}")
            while not self.stop.is_set():
                for tp, msgs in c.poll(200).items():
                    self.seen += [(tp.partition, m.offset, m.value) for m in msgs]
        finally:
            c.close()

    def _confluent(self):
        from confluent_kafka import Consumer
        conf = {"bootstrap.servers": self.bs, "group.id": self.group, "auto.offset.reset": "earliest",
                "session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": 1000,
                "partition.assignment.strategy": self.assignor}
        conf.update(self.extra)
        c = Consumer(conf)
        c.subscribe([self.topic])
        try:
            while not self.stop.is_set():
                m = c.poll(0.2)
                if m is not None and not m.error():
                    self.seen.append((m.partition(), m.offset(), m.value()))
        finally:
            c.close()

    def _aiokafka(self):
        from aiokafka import AIOKafkaConsumer
        from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
        from kafka.coordinator.assignors.range import RangePartitionAssignor as _R  # noqa: F401

        async def go():
            c = AIOKafkaConsumer(self.topic, bootstrap_servers=self.bs, group_id=self.group,
                                 auto_offset_reset="earliest", session_timeout_ms=SESSION_MS,
                                 heartbeat_interval_ms=1000,
                                 partition_assignment_strategy=(RoundRobinPartitionAssignor,))
            await c.start()
            try:
                while not self.stop.is_set():
                    for tp, msgs in (await c.getmany(timeout_ms=200)).items():
                        self.seen += [(tp.partition, m.offset, m.value) for m in msgs]
            finally:
                await c.stop()
        asyncio.run(go())

    def close(self):
        self.stop.set()
        self.thread.join(30)
        if self.error:
            raise self.error


def run_group(bs, libs, partitions=6, n=600):
    topic, group = f"split-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    create_topic(bs, topic, partitions)
    wait_until(lambda: coordinator_ready(bs, group), 30, "coordinator")
    runners = [Runner(lib, bs, group, topic) for lib in libs]
    try:
        wait_until(lambda: split_ok(bs, group, len(libs), partitions), 60, "every member assigned")
        produce(bs, topic, n)
        wait_until(lambda: len({v for r in runners for _, _, v in r.seen}) >= n, 60, "all records consumed")
        time.sleep(0.5)   # a duplicate delivered late would show up here
        seen = [x for r in runners for x in r.seen]
        check_exactly_once(seen, n)
        per_member = [len(r.seen) for r in runners]
        assert all(c > 0 for c in per_member), per_member
    finally:
        for r in runners:
            r.close()


# ---- the split tests ------------------------------------------------------------------------------

@pytest.mark.parametrize("lib", ["kafka_python", "confluent", "aiokafka"])
def test_group_of_one_library_splits_topic(bs, lib):
    run_group(bs, [lib, lib, lib])


def test_mixed_group_of_three_libraries(bs):
    run_group(bs, ["kafka_python", "confluent", "aiokafka"])


def test_exactly_once_checker_sees_a_duplicate():
    with pytest.raises(AssertionError, match="1 duplicates"):
        check_exactly_once([(0, 1, b"a"), (0, 1, b"a")], 1)


def test_kcat_balanced_consumers(bs, tmp_path):
    topic, group, n = f"kcat-{uuid.uuid4().hex[:8]}", f"kg-{uuid.uuid4().hex[:8]}", 400
    create_topic(bs, topic, 4)
    wait_until(lambda: coordinator_ready(bs, group), 30, "coordinator")
    outs = [tmp_path / f"kcat{i}.out" for i in range(2)]
    procs = [subprocess.Popen(["kcat", "-b", bs, "-G", group, "-u", "-f", "%p %o %s\n", "-q",
                               "-X", f"session.timeout.ms={SESSION_MS}", "-X", "auto.offset.reset=earliest", topic],
                              stdout=open(o, "w"), stderr=subprocess.DEVNULL) for o in outs]
    try:
        wait_until(lambda: split_ok(bs, group, 2, 4), 60, "both kcat members assigned")
        produce(bs, topic, n)

        def lines():
            return [ln.split() for o in outs for ln in o.read_text().splitlines() if ln.strip()]
        wait_until(lambda: len(lines()) >= n, 60, "kcat consumed everything")
        time.sleep(0.5)
        check_exactly_once([(int(p), int(o), v) for p, o, v in lines()], n)
        assert all(o.read_text() for o in outs)
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)


# ---- commit / committed round trips ---------------------------------------------------------------------

def test_confluent_commit_and_committed_with_metadata(bs):
    from confluent_kafka import Consumer, TopicPartition
    topic, group = f"cc-{uuid.uuid4().hex[:8]}", f"cg-{uuid.uuid4().hex[:8]}"
    create_topic(bs, topic, 2)
    wait_until(lambda: coordinator_ready(bs, group), 30, "coordinator")
    c = Consumer({"bootstrap.servers": bs, "group.id": group, "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(topic, 0, 17, metadata="hello"),
                          TopicPartition(topic, 1, 5, metadata="wörld")], asynchronous=False)
        got = c.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=10)
        assert [(t.partition, t.offset, t.metadata) for t in got] == [(0, 17, "hello"), (1, 5, "wörld")]
    finally:
        c.close()
    # the commit is durable state of the group, visible to a new consumer too
    c2 = Consumer({"bootstrap.servers": bs, "group.id": group})
    try:
        assert c2.committed([TopicPartition(topic, 0)], timeout=10)[0].offset == 17
    finally:
        c2.close()


def test_kafka_python_commit_committed_seek_to_committed(bs):
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata
    topic, group = f"kp-{uuid.uuid4().hex[:8]}", f"kpg-{uuid.uuid4().hex[:8]}"
    create_topic(bs, topic, 1)
    produce(bs, topic, 20)
    tp = TopicPartition(topic, 0)
    c = KafkaConsumer(bootstrap_servers=bs, group_id=group, enable_auto_commit=False)
    try:
        c.assign([tp])
        c.commit({tp: OffsetAndMetadata(7, "meta-kp", -1)})
        assert c.committed(tp) == 7
        assert c.committed(tp, metadata=True).metadata == "meta-kp"
        c.seek(tp, 15)
        c.seek_to_committed(tp) if hasattr(c, "seek_to_committed") else c.seek(tp, c.committed(tp))
        assert c.position(tp) == 7
        assert next(iter(c.poll(5000).values()))[0].offset == 7
    finally:
        c.close()


def test_aiokafka_commit_committed_seek_to_committed(bs):
    from aiokafka import AIOKafkaConsumer, TopicPartition
    topic, group = f"ak-{uuid.uuid4().hex[:8]}", f"akg-{uuid.uuid4().hex[:8]}"
    create_topic(bs, topic, 1)
    produce(bs, topic, 20)

    async def go():
        tp = TopicPartition(topic, 0)
        c = AIOKafkaConsumer(bootstrap_servers=bs, group_id=group, enable_auto_commit=False)
        await c.start()
        try:
            c.assign([tp])
            await c.commit({tp: 11})
            assert await c.committed(tp) == 11
            c.seek(tp, 2)
            await c.seek_to_committed(tp)
            assert await c.position(tp) == 11
            msg = await c.getone()
            assert msg.offset == 11
        finally:
            await c.stop()
    asyncio.run(go())


# ---- protocol answers ---------------------------------------------------------------------------------

def _join(bs, group, member_id="", session=SESSION_MS, version=5, instance=None):
    return request(bs, 11, {"group_id": group, "session_timeout_ms": session, "rebalance_timeout_ms": 10000,
                            "member_id": member_id, "group_instance_id": instance, "protocol_type": "consumer",
                            "protocols": [{"name": "range", "metadata": encode_subscription(["t"])}]}, version)


def test_join_protocol_errors_and_fencing(bs):
    group = f"proto-{uuid.uuid4().hex[:8]}"
    wait_until(lambda: coordinator_ready(bs, group), 30, "coordinator")
    assert _join(bs, group, session=1000)["error_code"] == Errors.INVALID_SESSION_TIMEOUT
    first = _join(bs, group)
    assert first["error_code"] == Errors.MEMBER_ID_REQUIRED and first["member_id"]
    j = _join(bs, group, member_id=first["member_id"])
    assert j["error_code"] == 0 and j["leader"] == j["member_id"] == first["member_id"]
    gen, mid = j["generation_id"], j["member_id"]
    assert [m["member_id"] for m in j["members"]] == [mid]
    s = request(bs, 14, {"group_id": group, "generation_id": gen, "member_id": mid,
                         "assignments": [{"member_id": mid, "assignment": b"\x00\x00\x00\x00\x00\x00\xff\xff\xff\xff"}]}, 3)
    assert s["error_code"] == 0
    hb = {"group_id": group, "generation_id": gen, "member_id": mid}
    assert request(bs, 12, hb, 3)["error_code"] == 0
    assert request(bs, 12, dict(hb, generation_id=gen - 1), 3)["error_code"] == Errors.ILLEGAL_GENERATION
    assert request(bs, 12, dict(hb, member_id="nobody"), 3)["error_code"] == Errors.UNKNOWN_MEMBER_ID
    commit = {"group_id": group, "generation_id_or_member_epoch": gen - 1, "member_id": mid,
              "topics": [{"name": "__consumer_offsets", "partitions": [
                  {"partition_index": 0, "committed_offset": 1, "committed_metadata": ""}]}]}
    assert request(bs, 8, commit, 7)["topics"][0]["partitions"][0]["error_code"] == Errors.ILLEGAL_GENERATION
    # DeleteGroups refuses a group with members; after LeaveGroup it is empty and can go
    assert request(bs, 42, {"groups_names": [group]}, 1)["results"][0]["error_code"] == Errors.NON_EMPTY_GROUP
    lv = request(bs, 13, {"group_id": group, "members": [{"member_id": mid}]}, 3)
    assert lv["error_code"] == 0 and lv["members"][0]["error_code"] == 0
    assert describe(bs, group)["group_state"] == "Empty"
    assert request(bs, 42, {"groups_names": [group]}, 1)["results"][0]["error_code"] == 0
    assert describe(bs, group)["group_state"] == "Dead"
    assert request(bs, 42, {"groups_names": [group]}, 1)["results"][0]["error_code"] == Errors.GROUP_ID_NOT_FOUND


def test_standalone_commit_fetch_offset_delete_and_records(bs):
    topic, group = f"sa-{uuid.uuid4().hex[:8]}", f"sa-{uuid.uuid4().hex[:8]}"
    create_topic(bs, topic, 2)
    wait_until(lambda: coordinator_ready(bs, group), 30, "coordinator")
    commit = {"group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
              "topics": [{"name": topic, "partitions": [
                  {"partition_index": 0, "committed_offset": 42, "committed_leader_epoch": 3,
                   "committed_metadata": "m0"},
                  {"partition_index": 1, "committed_offset": 9, "committed_metadata": None}]},
                         {"name": "no-such-topic", "partitions": [
                  {"partition_index": 0, "committed_offset": 1, "committed_metadata": ""}]}]}
    r = request(bs, 8, commit, 7)
    codes = {(t["name"], p["partition_index"]): p["error_code"] for t in r["topics"] for p in t["partitions"]}
    assert codes == {(topic, 0): 0, (topic, 1): 0, ("no-such-topic", 0): 3}
    f = request(bs, 9, {"group_id": group, "topics": None}, 5)
    got = {(t["name"], p["partition_index"]): (p["committed_offset"], p["committed_leader_epoch"], p["metadata"])
           for t in f["topics"] for p in t["partitions"]}
    assert got == {(topic, 0): (42, 3, "m0"), (topic, 1): (9, -1, "")}
    missing = request(bs, 9, {"group_id": group, "topics": [{"name": topic, "partition_indexes": [5]}]}, 5)
    assert missing["topics"][0]["partitions"][0]["committed_offset"] == -1
    assert any(g["group_id"] == group for g in request(bs, 16, {}, 2)["groups"])

    # the records in __consumer_offsets are Kafka's formats: key v1, value v3
    from kafka import KafkaConsumer, TopicPartition
    from kbroker.coordinator.group_coordinator import partition_for
    tp = TopicPartition("__consumer_offsets", partition_for(group, OFFSETS_PARTITIONS))
    c = KafkaConsumer(bootstrap_servers=bs, enable_auto_commit=False)
    try:
        c.assign([tp])
        c.seek_to_beginning(tp)
        recs = []
        deadline = time.time() + 10
        while time.time() < deadline:
            recs += [m for ms in c.poll(500).values() for m in ms]
            if any(m.key == consumer_offsets.offset_key(group, topic, 0) for m in recs):
                break
    finally:
        c.close()
    mine = [m for m in recs if m.key == consumer_offsets.offset_key(group, topic, 0)]
    assert len(mine) == 1
    assert mine[0].value[:2] == b"\x00\x03"
    v = consumer_offsets.decode_offset_value(mine[0].value)
    assert (v.offset, v.leader_epoch, v.metadata) == (42, 3, "m0")

    od = request(bs, 47, {"group_id": group, "topics": [{"name": topic, "partitions": [{"partition_index": 0}]}]}, 0)
    assert od["error_code"] == 0 and od["topics"][0]["partitions"][0]["error_code"] == 0
    f = request(bs, 9, {"group_id": group, "topics": None}, 5)
    assert {(t["name"], p["partition_index"]) for t in f["topics"] for p in t["partitions"]} == {(topic, 1)}


def test_admin_clients_list_describe_offsets_delete(bs):
    """confluent-kafka's AdminClient and kafka-python's KafkaAdminClient on a running group:
    list, describe (state, members, assignment), committed offsets, OffsetDelete refused for a
    subscribed topic, DeleteGroups once the group is empty."""
    from confluent_kafka import Consumer
    from confluent_kafka.admin import AdminClient
    from confluent_kafka import ConsumerGroupTopicPartitions
    from kafka import KafkaAdminClient, TopicPartition
    from kafka.errors import GroupSubscribedToTopicError
    topic, group = f"adm-{uuid.uuid4().hex[:8]}", f"adm-{uuid.uuid4().hex[:8]}"
    create_topic(bs, topic, 2)
    produce(bs, topic, 10)
    wait_until(lambda: coordinator_ready(bs, group), 30, "coordinator")
    c = Consumer({"bootstrap.servers": bs, "group.id": group, "auto.offset.reset": "earliest",
                  "session.timeout.ms": SESSION_MS, "enable.auto.commit": False})
    c.subscribe([topic])
    got = 0
    deadline = time.time() + 30
    while got < 10 and time.time() < deadline:
        m = c.poll(0.2)
        got += m is not None and not m.error()
    c.commit(asynchronous=False)
    a = AdminClient({"bootstrap.servers": bs})
    k = KafkaAdminClient(bootstrap_servers=bs)
    try:
        assert group in [g.group_id for g in a.list_consumer_groups().result(10).valid]
        d = a.describe_consumer_groups([group])[group].result(10)
        assert str(d.state).endswith("STABLE") and len(d.members) == 1
        assert sorted(tp.partition for tp in d.members[0].assignment.topic_partitions) == [0, 1]
        offs = a.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(10)
        assert sum(tp.offset for tp in offs.topic_partitions) == 10
        # kafka-python negotiates ListGroups v5, whose entries also carry the group's state and type
        assert {"group_id": group, "protocol_type": "consumer", "group_state": "Stable",
                "group_type": "classic"} in k.list_groups()
        assert k.describe_groups([group])[group]["group_state"] == "Stable"
        assert sum(o.offset for o in k.list_group_offsets(group)[group].values()) == 10
        res = k.delete_group_offsets(group, [TopicPartition(topic, 1)])
        assert res[TopicPartition(topic, 1)] is GroupSubscribedToTopicError
        c.close()
        c = None
        wait_until(lambda: describe(bs, group)["group_state"] == "Empty", 30, "group empty")
        assert k.delete_groups([group]) == {group: "OK"}
        assert group not in [g.group_id for g in a.list_consumer_groups().result(10).valid]
    finally:
        k.close()
        if c is not None:
            c.close()


def test_static_member_rejoin_fences_the_old_member_id(bs):
    group = f"static-p-{uuid.uuid4().hex[:8]}"
    wait_until(lambda: coordinator_ready(bs, group), 30, "coordinator")
    j1 = _join(bs, group, instance="inst-1")              # static members get no MEMBER_ID_REQUIRED
    assert j1["error_code"] == 0
    old, gen = j1["member_id"], j1["generation_id"]
    assignment = b"\x00\x00\x00\x00\x00\x01\x00\x01t\x00\x00\x00\x01\x00\x00\x00\x00\xff\xff\xff\xff"
    s = request(bs, 14, {"group_id": group, "generation_id": gen, "member_id": old, "group_instance_id": "inst-1",
                         "assignments": [{"member_id": old, "assignment": assignment}]}, 3)
    assert s["error_code"] == 0 and s["assignment"] == assignment
    j2 = _join(bs, group, instance="inst-1")              # the same instance restarts (new member id)
    assert j2["error_code"] == 0 and j2["member_id"] != old
    assert j2["generation_id"] == gen                     # no rebalance
    hb = {"group_id": group, "generation_id": gen, "group_instance_id": "inst-1"}
    assert request(bs, 12, dict(hb, member_id=old), 3)["error_code"] == Errors.FENCED_INSTANCE_ID
    assert request(bs, 12, dict(hb, member_id=j2["member_id"]), 3)["error_code"] == 0
    s2 = request(bs, 14, {"group_id": group, "generation_id": gen, "member_id": j2["member_id"],
                          "group_instance_id": "inst-1", "assignments": []}, 3)
    assert s2["error_code"] == 0 and s2["assignment"] == assignment                 # the old assignment kept
    d = describe(bs, group)
    assert d["group_state"] == "Stable" and [m["group_instance_id"] for m in d["members"]] == ["inst-1"]
    lv = request(bs, 13, {"group_id": group, "members": [{"member_id": "", "group_instance_id": "inst-1"}]}, 3)
    assert lv["members"][0]["error_code"] == 0 and describe(bs, group)["group_state"] == "Empty"


def test_clients_may_not_produce_to_or_delete_the_offsets_topic(bs):
    """Invariant: __consumer_offsets is written only by the coordinator. A client's produce gets
    INVALID_TOPIC_EXCEPTION (Kafka's "Cannot append to internal topic") and its DeleteTopics the same;
    the committed offsets stay readable afterwards."""
    import confluent_kafka as ck
    from confluent_kafka.admin import AdminClient

    group = f"internal-{uuid.uuid4().hex[:6]}"
    wait_until(lambda: coordinator_ready(bs, group), 30, "the group coordinator")
    c = ck.Consumer({"bootstrap.servers": bs, "group.id": group, "enable.auto.commit": False})
    create_topic(bs, t := f"it-{uuid.uuid4().hex[:6]}", 1)
    c.commit(offsets=[ck.TopicPartition(t, 0, 7)], asynchronous=False)

    errors = []
    p = ck.Producer({"bootstrap.servers": bs, "message.timeout.ms": 10000, "retries": 0})
    p.produce("__consumer_offsets", b"forged", key=b"k", partition=0,
              on_delivery=lambda err, msg: errors.append(err))
    p.flush(15)
    assert [e.code() for e in errors] == [ck.KafkaError.TOPIC_EXCEPTION], errors

    admin = AdminClient({"bootstrap.servers": bs})
    fut = admin.delete_topics(["__consumer_offsets"], operation_timeout=10)["__consumer_offsets"]
    with pytest.raises(ck.KafkaException) as e:
        fut.result(timeout=30)
    assert e.value.args[0].code() == ck.KafkaError.TOPIC_EXCEPTION
    assert c.committed([ck.TopicPartition(t, 0)], timeout=10)[0].offset == 7
    c.close()
