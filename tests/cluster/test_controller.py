"""The controller on a real three-broker cluster (racks a, a, b) that no test here kills: metadata
pushed by UpdateMetadata agrees on every broker, placement (replication factor, racks), delete and
immediate recreate, stale controller/broker epochs refused, and fencing of a deposed controller's
ZooKeeper writes. Failure tests (kill -9, SIGTERM) are in test_controller_failover.py."""
import json
import urllib.request
import uuid

import confluent_kafka as ck
import kafka
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kazoo.client import KazooClient

from kbroker.protocol.errors import Errors
from kbroker.testing import BrokerProc, LocalCluster, free_port, wait_until
from kbroker.zk import layout as L
from kbroker.zk.client import BrokerZk, NotControllerError

from checkers import RawConn

RACKS = {0: "a", 1: "a", 2: "b"}
UPDATE_METADATA, LEADER_AND_ISR = 6, 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("controller"), brokers=0, session_timeout_ms=6000)
    c.start()   # ZooKeeper only: the brokers get their racks below
    try:
        for bid, rack in RACKS.items():
            c.brokers[bid] = BrokerProc(bid, free_port(), c.root)
            c.brokers[bid].metrics_port = free_port()
            c.start_broker(bid, extra={"broker.rack": rack, "kbroker.metrics.port": c.brokers[bid].metrics_port})
        yield c
    finally:
        c.stop()


@pytest.fixture
def zk(cluster):
    client = KazooClient(hosts=cluster.zk.connect_string)
    client.start(timeout=10)
    yield client
    client.stop()
    client.close()


def _name(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _admin(cluster):
    return AdminClient({"bootstrap.servers": cluster.bootstrap})


def _create(cluster, name, partitions, rf, config=None):
    admin = _admin(cluster)     # kept alive until the answer (a destroyed handle fails the future)
    admin.create_topics([NewTopic(name, partitions, rf, config=config or {})])[name].result(30)


def _view(port, topic=None):
    """One broker's answer (asked of that broker only): brokers, controller, and per partition
    (leader, replicas, isr)."""
    a = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
    md = a.list_topics(topic=topic, timeout=15)
    brokers = {b.id: (b.host, b.port) for b in md.brokers.values()}
    topics = {t: {p.id: (p.leader, list(p.replicas), sorted(p.isrs)) for p in tm.partitions.values()}
              for t, tm in md.topics.items() if tm.error is None and not t.startswith("__")}
    return brokers, md.controller_id, topics


def _view_with(port, name):
    """_view once the broker knows ``name`` (CreateTopics answers when the controller's broker
    has it; the others hear through their own UpdateMetadata a moment later)."""
    return wait_until(lambda: (v := _view(port)) and name in v[2] and v, 10, f"{name} on port {port}")


def test_every_broker_answers_the_same_metadata(cluster):
    name = _name("agree")
    _create(cluster, name, 6, 3)
    views = [_view_with(b.port, name) for b in cluster.brokers.values()]
    brokers, controller, topics = views[0]
    assert set(brokers) == {0, 1, 2} and controller in brokers
    assert len(topics[name]) == 6
    for p, (leader, replicas, isr) in topics[name].items():
        assert sorted(replicas) == [0, 1, 2] and isr == [0, 1, 2] and leader == replicas[0]
    # Leadership spreads: each broker leads two of the six partitions.
    leaders = [lead for lead, _, _ in topics[name].values()]
    assert sorted(leaders.count(b) for b in (0, 1, 2)) == [2, 2, 2]
    for other in views[1:]:
        assert other == views[0]
    # Another client library, each broker alone, sees the same leaders.
    for b in cluster.brokers.values():
        ka = kafka.KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{b.port}")
        try:
            (desc,) = ka.describe_topics([name])
            got = {p["partition_index"]: (p["leader_id"], p["replica_nodes"], sorted(p["isr_nodes"]))
                   for p in desc["partitions"]}
            assert got == topics[name]
        finally:
            ka.close()


def test_replication_factor_above_live_brokers_is_refused(cluster):
    name = _name("rf4")
    admin = _admin(cluster)
    fs = admin.create_topics([NewTopic(name, 1, 4)])
    with pytest.raises(ck.KafkaException) as e:
        fs[name].result(30)
    assert e.value.args[0].code() == ck.KafkaError.INVALID_REPLICATION_FACTOR
    assert "larger than available brokers: 3" in e.value.args[0].str()
    assert name not in _view(cluster.brokers[0].port)[2]


def test_replicas_spread_across_racks(cluster):
    name = _name("racks")
    _create(cluster, name, 12, 2)
    _, _, topics = _view_with(cluster.brokers[1].port, name)
    for p, (_, replicas, _) in topics[name].items():
        assert {RACKS[r] for r in replicas} == {"a", "b"}, (p, replicas)
    # Rack b's single broker holds a replica of every partition; leadership still rotates over all.
    assert {replicas[0] for _, replicas, _ in topics[name].values()} == {0, 1, 2}


def test_default_replication_factor_for_auto_created_topics(cluster, tmp_path):
    # The brokers run with the default default.replication.factor=1; a topic auto-created by a
    # Metadata request gets one replica, and a leader before the answer.
    name = _name("auto")
    a = AdminClient({"bootstrap.servers": cluster.bootstrap})
    p = ck.Producer({"bootstrap.servers": cluster.bootstrap})
    p.produce(name, b"x")
    assert p.flush(30) == 0
    md = a.list_topics(topic=name, timeout=15).topics[name]
    assert md.error is None and all(len(pm.replicas) == 1 and pm.leader >= 0 for pm in md.partitions.values())


def _produce(cluster, name, n):
    p = ck.Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(n):
        p.produce(name, value=b"v%d" % i, partition=i % 2)
    assert p.flush(30) == 0


def _end_offsets(cluster, name, partitions):
    c = ck.Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": _name("g")})
    try:
        return [c.get_watermark_offsets(ck.TopicPartition(name, p), timeout=15)[1] for p in range(partitions)]
    finally:
        c.close()


def test_delete_then_recreate_at_once(cluster, zk):
    name = _name("again")
    _create(cluster, name, 2, 3)
    _produce(cluster, name, 20)
    assert _end_offsets(cluster, name, 2) == [10, 10]
    old_id = json.loads(zk.get(L.topic_path(name))[0])["topic_id"]

    admin = _admin(cluster)
    admin.delete_topics([name])[name].result(30)
    # Gone everywhere once DeleteTopics answers on the controller... and on the others right after.
    for b in cluster.brokers.values():
        wait_until(lambda: name not in _view(b.port)[2], 10, f"{name} gone from broker {b.broker_id}")
    assert zk.exists(L.topic_path(name)) is None and zk.exists(L.delete_topic_path(name)) is None

    _create(cluster, name, 2, 3)       # at once, same name
    new_id = json.loads(zk.get(L.topic_path(name))[0])["topic_id"]
    assert new_id != old_id
    views = [_view_with(b.port, name)[2][name] for b in cluster.brokers.values()]
    assert views[0] == views[1] == views[2] and all(lead >= 0 for lead, _, _ in views[0].values())
    assert _end_offsets(cluster, name, 2) == [0, 0]   # nothing of the old topic's data
    _produce(cluster, name, 4)
    assert _end_offsets(cluster, name, 2) == [2, 2]


def _controller(zk):
    return json.loads(zk.get(L.CONTROLLER)[0])["brokerid"], int(zk.get(L.CONTROLLER_EPOCH)[0])


def _update_metadata(controller_id, controller_epoch, broker_epoch):
    return {"controller_id": controller_id, "controller_epoch": controller_epoch, "broker_epoch": broker_epoch,
            "topic_states": [], "live_brokers": []}


def test_brokers_refuse_stale_controller_and_broker_epochs(cluster, zk):
    cid, epoch = _controller(zk)
    for b in cluster.brokers.values():
        broker_epoch = zk.exists(L.broker_path(b.broker_id)).czxid
        with RawConn(f"127.0.0.1:{b.port}") as raw:
            # An older controller (epoch - 1) with an empty broker list: applied, it would empty
            # the cache; refused, nothing changes.
            resp = raw.request(UPDATE_METADATA, 7, _update_metadata(cid, epoch - 1, broker_epoch))
            assert resp["error_code"] == Errors.STALE_CONTROLLER_EPOCH
            # The current controller, but for an earlier incarnation of this broker.
            resp = raw.request(UPDATE_METADATA, 7, _update_metadata(cid, epoch, broker_epoch - 1))
            assert resp["error_code"] == Errors.STALE_BROKER_EPOCH
            versions = {k["api_key"]: (k["min_version"], k["max_version"])
                        for k in raw.request(18, 3, {"client_software_name": "t",
                                                     "client_software_version": "1"})["api_keys"]}
            if LEADER_AND_ISR in versions:
                resp = raw.request(LEADER_AND_ISR, 5, {
                    "controller_id": cid, "controller_epoch": epoch - 1, "broker_epoch": broker_epoch,
                    "type": 0, "topic_states": [], "live_leaders": []})
                assert resp["error_code"] == Errors.STALE_CONTROLLER_EPOCH
        brokers, controller, _ = _view(b.port)
        assert set(brokers) == {0, 1, 2} and controller == cid     # the cache is intact


def test_forged_controller_requests_from_the_future_are_refused(cluster, zk):
    """Invariant: any client can send controller APIs, but an epoch ZooKeeper has not seen (or the
    current epoch from a broker that does not hold /controller) is refused and not remembered, so a
    forged request cannot fence the real controller out of a broker. Afterwards the real controller
    still drives every broker: a new topic gets leaders everywhere."""
    cid, epoch = _controller(zk)
    for b in cluster.brokers.values():
        with RawConn(f"127.0.0.1:{b.port}") as raw:
            for forged_id, forged_epoch in ((cid, 32767), (cid, epoch + 1), ((cid + 1) % 3, epoch)):
                resp = raw.request(UPDATE_METADATA, 7, _update_metadata(forged_id, forged_epoch, -1))
                assert resp["error_code"] == Errors.STALE_CONTROLLER_EPOCH, (forged_id, forged_epoch)
            resp = raw.request(LEADER_AND_ISR, 5, {
                "controller_id": cid, "controller_epoch": 32767, "broker_epoch": -1,
                "type": 0, "topic_states": [], "live_leaders": []})
            assert resp["error_code"] == Errors.STALE_CONTROLLER_EPOCH
        brokers, controller, _ = _view(b.port)
        assert set(brokers) == {0, 1, 2} and controller == cid     # the cache is intact
    name = _name("after-forgery")
    _create(cluster, name, 3, 3)
    for b in cluster.brokers.values():
        parts = _view_with(b.port, name)[2][name]
        assert sorted(parts) == [0, 1, 2] and all(leader >= 0 for leader, _, _ in parts.values())


def test_deposed_controller_writes_nothing(cluster, zk):
    """A controller whose epoch was bumped by someone else: every kind of controller write fails
    and lands nothing (on a chroot of the same ZooKeeper, so the cluster is not disturbed)."""
    chroot = "/fencing-" + uuid.uuid4().hex[:6]
    b = BrokerZk(cluster.zk.connect_string + chroot, 99, 6000)
    b.start()
    try:
        assert b.elect_controller()
        b.create_topic("t", {0: [99]}, {})
        state = L.PartitionState(99, 0, [99], b.controller_epoch)
        b.create_partition_states("t", {0: state})
        zk.set(chroot + L.CONTROLLER_EPOCH, str(b.controller_epoch + 10).encode())   # another controller
        with pytest.raises(NotControllerError):
            b.update_partition_states({("t", 0): (L.PartitionState(-1, 1, [99], b.controller_epoch), 0)})
        for attempt in (lambda: b.create_partition_states("u", {0: state}),
                        lambda: b.controller_delete([chroot + L.partition_state_path("t", 0)]),
                        lambda: b.delete_topic("t")):
            try:
                attempt()
            except NotControllerError:
                pass
            else:   # it may have re-won meanwhile (a new epoch), which is not the deposed one writing
                assert b.controller_epoch > 1 + 10
        assert L.decode_partition_state(zk.get(chroot + L.partition_state_path("t", 0))[0]) == state
        assert zk.exists(chroot + L.topic_partitions_path("u")) is None
    finally:
        b.close()


def test_bumped_controller_epoch_makes_the_controller_resign_and_rerun(cluster, zk):
    cid, epoch = _controller(zk)
    zk.set(L.CONTROLLER_EPOCH, str(epoch + 5).encode())
    name = _name("after-fence")
    # The controller's next write (this topic's states) fails; it resigns, wins a newer epoch than
    # the intruder's, and finishes the job from ZooKeeper's state.
    _create(cluster, name, 3, 3)
    new_cid, new_epoch = _controller(zk)
    assert new_epoch == epoch + 6
    for p in range(3):
        st = L.decode_partition_state(zk.get(L.partition_state_path(name, p))[0])
        assert st.controller_epoch == new_epoch and st.leader >= 0
    for b in cluster.brokers.values():
        wait_until(lambda: _view(b.port)[1] == new_cid and name in _view(b.port)[2], 15,
                   f"broker {b.broker_id} to follow the new controller epoch")


def _metrics(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
            if line and not line.startswith("#") and "{" not in line.split()[0]}


def test_controller_metrics(cluster, zk):
    _create(cluster, _name("metrics"), 3, 3)
    cid, _ = _controller(zk)
    seen = {b.broker_id: _metrics(b.metrics_port) for b in cluster.brokers.values()}
    active = {bid: m["kafka_controller_kafkacontroller_activecontrollercount"] for bid, m in seen.items()}
    assert active == {bid: (1.0 if bid == cid else 0.0) for bid in seen}
    assert seen[cid]["kafka_controller_kafkacontroller_offlinepartitionscount"] == 0
    # Each new partition's first leader is an election; the controller made at least these three.
    assert seen[cid]["kafka_controller_controllerstats_leaderelectionrateandtimems_count"] >= 3


def test_config_change_reaches_every_broker(cluster):
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    name = _name("cfg")
    _create(cluster, name, 3, 3)
    admin = _admin(cluster)
    res = ConfigResource(ConfigResource.Type.TOPIC, name, incremental_configs=[
        ConfigEntry("retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(30)

    def value_on(port):
        with RawConn(f"127.0.0.1:{port}") as raw:     # this broker, not whichever a client picks
            resp = raw.request(32, 1, {"resources": [{"resource_type": 2, "resource_name": name,
                                                      "configuration_keys": ["retention.ms"]}],
                                       "include_synonyms": False})
        (result,) = resp["results"]
        return {c["name"]: c["value"] for c in result["configs"]}.get("retention.ms")

    # Each broker answers DescribeConfigs from its own cache: all of them learnt of the change
    # through /config/changes (not only the broker that served the AlterConfigs).
    for b in cluster.brokers.values():
        wait_until(lambda: value_on(b.port) == "3600000", 15, f"broker {b.broker_id} to apply retention.ms")


def test_topic_replaced_in_one_zookeeper_transaction_is_taken_in(cluster, zk):
    """Another tool deletes a topic and writes a new one of the same name (new id, more
    partitions) in one multi-op: the children of /brokers/topics look unchanged, yet every broker
    ends up with the new topic and leaders for all its partitions."""
    name = _name("replaced")
    _create(cluster, name, 1, 3)
    for b in cluster.brokers.values():
        _view_with(b.port, name)
    new_id = L.new_uuid_base64()
    assignment = {0: [0, 1, 2], 1: [1, 2, 0], 2: [2, 0, 1]}
    tx = zk.transaction()
    tx.delete(L.partition_state_path(name, 0))
    tx.delete(L.partition_path(name, 0))
    tx.delete(L.topic_partitions_path(name))
    tx.delete(L.topic_path(name))
    tx.create(L.topic_path(name), L.encode_topic(assignment, new_id))
    assert not any(isinstance(r, Exception) for r in tx.commit())
    for b in cluster.brokers.values():
        wait_until(lambda: len((v := _view(b.port))[2].get(name, {})) == 3
                   and all(lead >= 0 for lead, _, _ in v[2][name].values()), 15,
                   f"broker {b.broker_id} to serve the new {name}")
    for p in range(3):
        st = L.decode_partition_state(zk.get(L.partition_state_path(name, p))[0])
        assert st.leader == assignment[p][0] and st.leader_epoch == 0


def _labelled(port):
    """{(sample name, sorted label items): value} of one broker's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_follower_traffic_counts_as_replication_not_client_bytes(cluster):
    """Kafka's split: followers' fetches count in ReplicationBytesOut on the leader and their appends in
    ReplicationBytesIn, never in the topic's BytesOut/BytesIn (clients' traffic at any replication
    factor). acks=all: when flush returns both followers have read and appended every batch."""
    name = _name("repl-bytes")
    _create(cluster, name, 1, 3)
    leader = _view_with(cluster.brokers[0].port, name)[2][name][0][0]
    ports = {bid: b.metrics_port for bid, b in cluster.brokers.items()}
    before = {bid: _labelled(port) for bid, port in ports.items()}
    p = ck.Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 0})
    for i in range(200):
        p.produce(name, value=b"r" * 100, partition=0)
    assert p.flush(30) == 0

    def delta(bid, after, key, **labels):
        k = (key, tuple(sorted(labels.items())))
        return after[bid].get(k, 0.0) - before[bid].get(k, 0.0)

    def settled():
        after = {bid: _labelled(port) for bid, port in ports.items()}
        stored = delta(leader, after, "kafka_server_brokertopicmetrics_bytesin_total", topic=name)
        followers = [delta(b, after, "kafka_server_brokertopicmetrics_replicationbytesin_total")
                     for b in ports if b != leader]
        out = delta(leader, after, "kafka_server_brokertopicmetrics_replicationbytesout_total")
        return (stored, followers, out, after) if stored and followers == [stored, stored] else None

    stored, _followers, out, after = wait_until(settled, 15, "both followers to append every byte")
    assert stored > 200 * 100
    assert out == 2 * stored            # each follower read each batch once: a quiet cluster, no truncation
    # No consumer read the topic: client BytesOut stays absent/zero on every broker, and no follower
    # counted its appends as client BytesIn.
    for bid in ports:
        assert delta(bid, after, "kafka_server_brokertopicmetrics_bytesout_total", topic=name) == 0
        if bid != leader:
            assert delta(bid, after, "kafka_server_brokertopicmetrics_bytesin_total", topic=name) == 0
