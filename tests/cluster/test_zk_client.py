"""kbroker.zk.layout and BrokerZk against a real ZooKeeper (the session fixture `zk_server`).

Each test works under its own chroot so tests never see each other's znodes.
"""

import asyncio
import json
import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest
from kazoo.client import KazooClient

from kbroker.zk import layout as L
from kbroker.zk.client import (BrokerRegistrationError, BrokerZk, NotControllerError, PartitionNotFoundError,
                               StaleVersionError, TopicExistsError, TopicNotFoundError, ZkClientError)
from kbroker.zk.local import start_zookeeper
from kbroker.testing import wait_until

SESSION_MS = 6000


@pytest.fixture
def cs(zk_server):
    """A connect string with a fresh chroot."""
    return f"{zk_server.connect_string}/t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def brokers(cs):
    """Factory of started BrokerZk clients (closed at teardown)."""
    made = []

    def make(broker_id=1, loop=None, connect=None):
        b = BrokerZk(connect or cs, broker_id, SESSION_MS, loop)
        b.start()
        made.append(b)
        return b

    yield make
    for b in made:
        b.close()


@pytest.fixture
def raw(cs, brokers):
    """A plain kazoo client on the same chroot, to look at what BrokerZk wrote."""
    brokers(99)  # creates the chroot
    zk = KazooClient(cs, timeout=SESSION_MS / 1000)
    zk.start(timeout=10)
    yield zk
    zk.stop()
    zk.close()


def expire_session(connect_string, session_id, password):
    """Expire a live session for real: attach a second client to it, then close that client."""
    zk = KazooClient(connect_string, client_id=(session_id, password), timeout=SESSION_MS / 1000)
    zk.start(timeout=10)
    zk.stop()
    zk.close()


def negotiated_timeout_s(zk_server):
    tick = zk_server.tick_time_ms
    return min(max(SESSION_MS, 2 * tick), 20 * tick) / 1000


# --- layout: exact bytes and tolerant decoding ---------------------------------

def test_layout_exact_json():
    assert L.encode_broker("h", 9092, timestamp_ms=1700000000123) == (
        b'{"version":5,"host":"h","port":9092,"jmx_port":-1,"timestamp":"1700000000123",'
        b'"endpoints":["PLAINTEXT://h:9092"],"listener_security_protocol_map":{"PLAINTEXT":"PLAINTEXT"},'
        b'"features":{}}')
    assert json.loads(L.encode_broker("h", 1, "r1", timestamp_ms=1))["rack"] == "r1"
    assert L.encode_controller(3, timestamp_ms=42) == (
        b'{"version":2,"brokerid":3,"timestamp":"42","kraftControllerEpoch":-1}')
    assert L.encode_controller_epoch(7) == b"7"
    assert L.encode_cluster_id("AAAAAAAAAAAAAAAAAAAAAA") == b'{"version":"1","id":"AAAAAAAAAAAAAAAAAAAAAA"}'
    assert L.encode_topic({1: [2, 1], 0: [1, 2]}, "AAAAAAAAAAAAAAAAAAAAAA") == (
        b'{"version":3,"partitions":{"0":[1,2],"1":[2,1]},"adding_replicas":{},"removing_replicas":{},'
        b'"topic_id":"AAAAAAAAAAAAAAAAAAAAAA"}')
    assert L.encode_partition_state(L.PartitionState(1, 0, [1, 2], 5)) == (
        b'{"version":1,"leader":1,"leader_epoch":0,"controller_epoch":5,"isr":[1,2]}')
    assert json.loads(L.encode_partition_state(L.PartitionState(1, 0, [1], 5, 1)))["leader_recovery_state"] == 1
    assert L.encode_config({"retention.ms": "1000"}) == b'{"version":1,"config":{"retention.ms":"1000"}}'
    with pytest.raises(TypeError):
        L.encode_config({"retention.ms": 1000})
    assert L.encode_config_change("topics", "t") == b'{"version":2,"entity_path":"topics/t"}'
    assert L.encode_producer_id_block(L.ProducerIdBlock(1, 0, 999)) == (
        b'{"version":1,"broker":1,"block_start":"0","block_end":"999"}')


def test_layout_decoders_tolerate_older_versions():
    b = L.decode_broker(4, b'{"version":1,"host":"h","port":9092,"jmx_port":-1}')
    assert (b.host, b.port, b.endpoints, b.rack) == ("h", 9092, [("PLAINTEXT", "h", 9092)], None)
    b = L.decode_broker(4, L.encode_broker("::1", 9092, "r", timestamp_ms=5))
    assert (b.endpoints, b.rack, b.timestamp_ms, b.version) == ([("PLAINTEXT", "::1", 9092)], "r", 5, 5)
    t = L.decode_topic(b'{"version":1,"partitions":{"0":[1]}}')
    assert (t.topic_id, t.partitions, t.adding_replicas) == (None, {0: [1]}, {})
    assert L.decode_controller(b'{"version":1,"brokerid":2,"timestamp":"9"}').broker_id == 2
    assert L.decode_config(b"") == {} and L.decode_config(None) == {}
    assert L.decode_config_change(b'{"version":1,"entity_type":"topics","entity_name":"t"}') == ("topics", "t")
    assert L.decode_producer_id_block(b"") is None


def test_layout_ids_and_names():
    for _ in range(200):
        s = L.new_uuid_base64()
        assert len(s) == 22 and not s.startswith("-") and "=" not in s
        assert L.uuid_to_base64(L.base64_to_uuid(s)) == s
    for bad in ("", ".", "..", "a/b", "x" * 250, "sp ace"):
        with pytest.raises(ValueError):
            L.validate_topic_name(bad)
    L.validate_topic_name("orders.v1_x-2")


# --- cluster id and registration ---------------------------------------------------

def test_start_fails_clearly_without_zookeeper():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    b = BrokerZk(f"127.0.0.1:{port}", 1, SESSION_MS, connect_timeout_s=1.0)
    with pytest.raises(ZkClientError, match="cannot connect to ZooKeeper"):
        b.start()


def test_start_creates_persistent_paths_and_cluster_id(cs, brokers, raw):
    b = brokers(1)
    for path in L.PERSISTENT_PATHS:
        assert raw.exists(path) is not None, path
    data, _ = raw.get(L.CLUSTER_ID)
    obj = json.loads(data)
    assert obj == {"version": "1", "id": b.cluster_id} and len(b.cluster_id) == 22
    assert brokers(2).cluster_id == b.cluster_id  # a second broker joins the same cluster


def test_register_broker_json_and_idempotent(brokers, raw):
    b = brokers(1)
    epoch = b.register_broker("127.0.0.1", 9092, rack="r1")
    data, stat = raw.get("/brokers/ids/1")
    assert stat.ephemeralOwner == b.session_id and stat.czxid == epoch == b.broker_epoch
    obj = json.loads(data)
    assert list(obj) == ["version", "host", "port", "jmx_port", "timestamp", "endpoints",
                         "listener_security_protocol_map", "features", "rack"]
    assert obj["version"] == 5 and obj["port"] == 9092 and obj["jmx_port"] == -1
    assert isinstance(obj["timestamp"], str) and abs(int(obj["timestamp"]) - time.time() * 1000) < 60_000
    assert obj["endpoints"] == ["PLAINTEXT://127.0.0.1:9092"] and obj["features"] == {}
    assert obj["listener_security_protocol_map"] == {"PLAINTEXT": "PLAINTEXT"} and obj["rack"] == "r1"
    assert b.get_broker_ids() == [1]
    assert b.get_broker(1).endpoints == [("PLAINTEXT", "127.0.0.1", 9092)]
    # Our own node (same session) is kept, not re-created.
    assert b.register_broker("127.0.0.1", 9092, rack="r1") == epoch
    assert raw.get("/brokers/ids/1")[1].czxid == epoch


def test_reregistration_after_forced_session_expiry(cs, brokers, raw):
    async def scenario():
        loop = asyncio.get_running_loop()
        events = asyncio.Queue()
        b = brokers(1, loop=loop)
        topics = asyncio.Queue()
        b.watch_topics(topics.put_nowait)
        assert await asyncio.wait_for(topics.get(), 10) == []
        b.on_session_lost = lambda: events.put_nowait(("lost", threading.get_ident()))
        # the lease as the re-registration leaves it: already renewed in the new session (the controller's
        # LeaderAndIsr may follow at once, and a lease still out would fence the partitions it gives us)
        b.on_reregistered = lambda epoch: events.put_nowait(("reregistered", epoch, threading.get_ident(),
                                                             b.lease.session_id, b.lease.expired()))
        epoch1 = b.register_broker("127.0.0.1", 9092)
        assert b.elect_controller() and b.is_controller
        controller_epoch1 = b.controller_epoch
        old_session, password = b.kazoo.client_id

        expire_session(cs, old_session, password)

        lost = await asyncio.wait_for(events.get(), 30)
        assert lost == ("lost", threading.get_ident())  # marshalled onto the loop's thread
        kind, epoch2, tid, lease_session, lease_out = await asyncio.wait_for(events.get(), 30)
        assert (kind, tid) == ("reregistered", threading.get_ident())
        assert (lease_session, lease_out) == (b.session_id, False)
        # Watches live on in the new session.
        b.create_topic("after-expiry", {0: [1]}, {})
        while (names := await asyncio.wait_for(topics.get(), 10)) != ["after-expiry"]:
            assert names == []  # kazoo may re-deliver the old list when it re-arms the watch
        return b, old_session, epoch1, epoch2, controller_epoch1

    b, old_session, epoch1, epoch2, controller_epoch1 = asyncio.run(scenario())
    assert b.session_id != old_session
    _, stat = raw.get("/brokers/ids/1")
    assert stat.ephemeralOwner == b.session_id and stat.czxid == epoch2 == b.broker_epoch and epoch2 > epoch1
    # The controllership went with the old session and was won again, one epoch later.
    assert b.is_controller and b.controller_epoch == controller_epoch1 + 1
    assert raw.get("/controller")[1].ephemeralOwner == b.session_id
    assert L.decode_controller_epoch(raw.get("/controller_epoch")[0]) == controller_epoch1 + 1


def test_old_session_node_is_waited_for_not_deleted(cs, brokers, raw):
    # An "old process" of broker 1 whose session is still alive.
    old = KazooClient(cs, timeout=SESSION_MS / 1000)
    old.start(timeout=10)
    old.create("/brokers/ids/1", L.encode_broker("old", 1), ephemeral=True)
    old_session, password = old.client_id

    b = brokers(1)
    with pytest.raises(BrokerRegistrationError, match="another session"):
        b.register_broker("127.0.0.1", 9092, wait_timeout_s=1.0)
    assert raw.get("/brokers/ids/1")[1].ephemeralOwner == old_session

    deletions = []
    raw.DataWatch("/brokers/ids/1", lambda data, stat: deletions.append(stat) if data is None else None)
    result = {}
    waiter = threading.Thread(target=lambda: result.update(epoch=b.register_broker("127.0.0.1", 9092)))
    waiter.start()
    waiter.join(1.5)
    assert waiter.is_alive(), "register_broker must wait while the old session lives"
    assert raw.get("/brokers/ids/1")[1].ephemeralOwner == old_session and deletions == []

    expire_session(cs, old_session, password)  # the old session ends (as if it timed out)
    waiter.join(SESSION_MS / 1000)
    assert not waiter.is_alive()
    data, stat = raw.get("/brokers/ids/1")
    assert stat.ephemeralOwner == b.session_id and stat.czxid == result["epoch"]
    assert json.loads(data)["host"] == "127.0.0.1"
    old.stop()
    old.close()


CHILD = textwrap.dedent("""
    import sys
    from kbroker.zk.client import BrokerZk
    b = BrokerZk(sys.argv[1], 7, int(sys.argv[2]))
    b.start()
    epoch = b.register_broker("127.0.0.1", 9092)
    print(b.session_id, epoch, flush=True)
    sys.stdin.read()   # stay alive until killed
""")


def test_ephemeral_vanishes_after_sigkill_within_session_timeout(cs, zk_server, brokers, raw):
    child = subprocess.Popen([sys.executable, "-c", CHILD, cs, str(SESSION_MS)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([child.stdout], [], [], 30)
        assert ready, "child did not register in 30 s"
        session_id, epoch = map(int, child.stdout.readline().split())
        _, stat = raw.get("/brokers/ids/7")
        assert (stat.ephemeralOwner, stat.czxid) == (session_id, epoch)

        gone = threading.Event()
        stat = raw.exists("/brokers/ids/7", watch=lambda event: gone.set())
        assert stat is not None
        killed_at = time.monotonic()
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        assert gone.wait(60), "ephemeral never went away"
        elapsed = time.monotonic() - killed_at
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert raw.exists("/brokers/ids/7") is None
    timeout_s = negotiated_timeout_s(zk_server)
    tick_s = zk_server.tick_time_ms / 1000
    # Not a clean close (that would be immediate): the client pings every ~timeout/3, so the
    # server sees the last packet at most that long before the kill.
    assert elapsed >= timeout_s / 2, elapsed
    # ZooKeeper expires sessions on tick boundaries: timeout + one tick (+ delivery slack).
    assert elapsed <= timeout_s + tick_s + 0.5, elapsed


# --- controller ------------------------------------------------------------------------

def test_lone_broker_elects_itself_and_epoch_increments(cs, brokers, raw):
    b = brokers(1)
    assert raw.exists("/controller_epoch") is None
    assert b.elect_controller() is True
    assert b.is_controller and b.controller_epoch == 1 and b.controller_id() == 1
    data, stat = raw.get("/controller")
    obj = json.loads(data)
    assert list(obj) == ["version", "brokerid", "timestamp", "kraftControllerEpoch"]
    assert obj["version"] == 2 and obj["brokerid"] == 1 and isinstance(obj["timestamp"], str)
    assert obj["kraftControllerEpoch"] == -1 and stat.ephemeralOwner == b.session_id
    assert raw.get("/controller_epoch")[0] == b"1"
    assert b.elect_controller() is True and b.controller_epoch == 1  # re-asking changes nothing

    b.close()
    wait_until(lambda: raw.exists("/controller") is None, 5, "/controller to go with the session")
    b2 = brokers(1)
    assert b2.elect_controller() is True and b2.controller_epoch == 2
    assert raw.get("/controller_epoch")[0] == b"2"


def test_standby_takes_over_when_controller_goes(brokers, raw):
    changes = []
    b1 = brokers(1)
    b2 = brokers(2)
    b2.on_controller_change = lambda cid, mine, epoch: changes.append((cid, mine, epoch))
    assert b1.elect_controller() is True
    assert b2.elect_controller() is False
    assert not b2.is_controller and b2.controller_id() == 1 and b2.controller_epoch == 1

    b1.close()
    wait_until(lambda: b2.is_controller, 10, "broker 2 to take over")
    assert b2.controller_epoch == 2 and b2.controller_id() == 2
    assert changes[-1] == (2, True, 2)
    assert json.loads(raw.get("/controller")[0])["brokerid"] == 2


def test_controller_writes_are_fenced_by_epoch(brokers, raw):
    b = brokers(1)
    assert b.elect_controller()
    # Another controller bumps the epoch behind our back: our writes must fail, not land.
    b.create_topic("fenced", {0: [1]}, {})          # an admin write: not fenced
    raw.set("/controller_epoch", b"5")
    state = L.PartitionState(1, 0, [1], b.controller_epoch)
    with pytest.raises(NotControllerError):
        b.create_partition_states("fenced", {0: state})
    assert raw.exists("/brokers/topics/fenced/partitions") is None
    # It resigns and, being the only candidate, wins again with a newer epoch than the intruder's.
    wait_until(lambda: b.is_controller and b.controller_epoch == 6, 10, "re-election after fencing")
    assert raw.get("/controller_epoch")[0] == b"6"
    assert b.create_partition_states("fenced", {0: L.PartitionState(1, 0, [1], 6)}) == {0: 0}
    assert json.loads(raw.get("/brokers/topics/fenced/partitions/0/state")[0])["controller_epoch"] == 6
    # A state update is fenced too, and checks the version it read.
    raw.set("/controller_epoch", b"9")
    with pytest.raises(NotControllerError):
        b.update_partition_states({("fenced", 0): (L.PartitionState(1, 1, [1], 6), 0)})
    assert json.loads(raw.get("/brokers/topics/fenced/partitions/0/state")[0])["leader_epoch"] == 0
    wait_until(lambda: b.is_controller and b.controller_epoch == 10, 10, "re-election after fencing")
    with pytest.raises(StaleVersionError):
        b.update_partition_states({("fenced", 0): (L.PartitionState(1, 1, [1], 10), 3)})
    assert b.update_partition_states({("fenced", 0): (L.PartitionState(1, 1, [1], 10), 0)}) == {("fenced", 0): 1}
    non_controller = brokers(2)
    with pytest.raises(NotControllerError):
        non_controller.create_partition_states("x", {0: L.PartitionState(2, 0, [2], 1)})


# --- topics ----------------------------------------------------------------------------

def test_topic_crud_and_cas(brokers, raw):
    b = brokers(1)
    b.elect_controller()
    epoch = b.controller_epoch
    tid = b.create_topic("orders", {0: [1], 1: [1]}, {"retention.ms": "86400000"})
    assert raw.exists("/brokers/topics/orders/partitions") is None    # states are the controller's
    b.create_partition_states("orders", {p: L.PartitionState(1, 0, [1], epoch) for p in (0, 1)})
    assert len(tid) == 22 and L.uuid_to_base64(L.base64_to_uuid(tid)) == tid
    with pytest.raises(TopicExistsError):
        b.create_topic("orders", {0: [1]}, {})
    assert b.get_topics() == ["orders"]
    assert b.get_topic("orders") == (tid, {0: [1], 1: [1]})

    topic = json.loads(raw.get("/brokers/topics/orders")[0])
    assert topic == {"version": 3, "partitions": {"0": [1], "1": [1]}, "adding_replicas": {},
                     "removing_replicas": {}, "topic_id": tid}
    state = json.loads(raw.get("/brokers/topics/orders/partitions/1/state")[0])
    assert state == {"version": 1, "leader": 1, "leader_epoch": 0, "controller_epoch": epoch, "isr": [1]}
    assert json.loads(raw.get("/config/topics/orders")[0]) == {"version": 1,
                                                                "config": {"retention.ms": "86400000"}}
    changes = raw.get_children("/config/changes")
    assert len(changes) == 1 and changes[0].startswith("config_change_") and len(changes[0]) == 24
    assert json.loads(raw.get("/config/changes/" + changes[0])[0]) == {"version": 2,
                                                                        "entity_path": "topics/orders"}

    # CAS on partition state.
    st, version = b.get_partition_state("orders", 0)
    assert st == L.PartitionState(1, 0, [1], epoch)
    new_version = b.set_partition_state("orders", 0, L.PartitionState(1, 1, [1], epoch), version)
    assert new_version == version + 1
    with pytest.raises(StaleVersionError):
        b.set_partition_state("orders", 0, L.PartitionState(1, 9, [1], epoch), version)  # stale
    assert b.get_partition_state("orders", 0) == (L.PartitionState(1, 1, [1], epoch), new_version)
    with pytest.raises(PartitionNotFoundError):
        b.get_partition_state("orders", 9)

    # Partitions: only contiguous new ones.
    with pytest.raises(ValueError):
        b.add_partitions("orders", {3: [1]})
    assert b.add_partitions("orders", {2: [1], 3: [1]}) == {0: [1], 1: [1], 2: [1], 3: [1]}
    assert b.get_topic("orders") == (tid, {0: [1], 1: [1], 2: [1], 3: [1]})
    with pytest.raises(PartitionNotFoundError):
        b.get_partition_state("orders", 3)
    b.create_partition_states("orders", {p: L.PartitionState(1, 0, [1], epoch) for p in (2, 3)})
    assert b.get_partition_state("orders", 3)[0] == L.PartitionState(1, 0, [1], epoch)

    # Configs.
    b.set_topic_config("orders", {"cleanup.policy": "compact"})
    assert b.get_topic_config("orders") == {"cleanup.policy": "compact"}
    assert len(raw.get_children("/config/changes")) == 2
    with pytest.raises(TopicNotFoundError):
        b.set_topic_config("missing", {"a": "b"})
    assert raw.exists("/config/topics/missing") is None

    # Delete, then the name is free again.
    b.delete_topic("orders")
    assert b.get_topics() == []
    assert raw.exists("/brokers/topics/orders") is None and raw.exists("/config/topics/orders") is None
    with pytest.raises(TopicNotFoundError):
        b.delete_topic("orders")
    with pytest.raises(TopicNotFoundError):
        b.get_topic("orders")
    assert b.get_topic_config("orders") == {}
    tid2 = b.create_topic("orders", {0: [1]}, {}, topic_id=L.new_uuid_base64())
    assert tid2 != tid and b.get_topic("orders") == (tid2, {0: [1]})


def test_watch_topics_delivers_on_the_loop(brokers):
    async def scenario():
        loop = asyncio.get_running_loop()
        seen = asyncio.Queue()
        b = brokers(1, loop=loop)
        b.elect_controller()
        b.watch_topics(lambda names: seen.put_nowait((names, threading.get_ident())))
        assert await asyncio.wait_for(seen.get(), 10) == ([], threading.get_ident())
        b.create_topic("a", {0: [1]}, {})
        assert (await asyncio.wait_for(seen.get(), 10))[0] == ["a"]
        b.create_topic("b", {0: [1]}, {})
        assert (await asyncio.wait_for(seen.get(), 10))[0] == ["a", "b"]
        b.delete_topic("a")
        assert (await asyncio.wait_for(seen.get(), 10))[0] == ["b"]

    asyncio.run(scenario())


# --- producer id blocks ------------------------------------------------------------------

def test_producer_id_blocks_never_overlap_when_racing(cs, brokers, raw):
    clients = [brokers(1), brokers(2)]
    blocks = {1: [], 2: []}
    barrier = threading.Barrier(2)

    def allocate(b):
        barrier.wait()
        for _ in range(40):
            blocks[b.broker_id].append(b.allocate_producer_id_block(block_size=10))

    threads = [threading.Thread(target=allocate, args=(b,)) for b in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    every = sorted(blocks[1] + blocks[2])
    assert len(every) == 80
    assert every[0] == (0, 9)
    for (s1, e1), (s2, e2) in zip(every, every[1:]):
        assert e1 - s1 == 9 and s2 == e1 + 1  # disjoint and contiguous
    obj = json.loads(raw.get("/latest_producer_id_block")[0])
    assert obj == {"version": 1, "broker": obj["broker"], "block_start": str(every[-1][0]),
                   "block_end": str(every[-1][1])}

    # A restarted broker continues after the last block.
    for b in clients:
        b.close()
    assert brokers(1).allocate_producer_id_block() == (every[-1][1] + 1, every[-1][1] + 1000)


def test_producer_id_blocks_survive_zookeeper_restart(tmp_path):
    own = start_zookeeper(tmp_path, tick_time_ms=1000)
    try:
        with BrokerZk(own.connect_string, 1, SESSION_MS) as b:
            assert b.allocate_producer_id_block() == (0, 999)
    finally:
        own.stop()
    own = start_zookeeper(tmp_path, tick_time_ms=1000)
    try:
        with BrokerZk(own.connect_string, 1, SESSION_MS) as b:
            assert b.allocate_producer_id_block() == (1000, 1999)
    finally:
        own.stop()
