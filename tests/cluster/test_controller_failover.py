"""Controller failure handling on real three-broker clusters (ZooKeeper session timeout 6 s):
a killed leader's partitions move to an ISR member with a higher leader epoch, a returning broker is
taken back, a killed controller is replaced (/controller_epoch + 1), and a SIGTERMed broker hands
its leaderships over (controlled shutdown) while it is still registered.

Bound (stated): leadership is visible in Metadata at most the session timeout + 6 s after kill -9
(session expiry, then one controller event: a ZooKeeper read, one fenced multi-op, the requests)."""
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from kbroker.testing import LocalCluster, wait_until
from kbroker.zk import layout as L

from checkers import History, read_all_confluent

SESSION_MS = 6000
BOUND_S = SESSION_MS / 1000 + 6.0


@pytest.fixture
def cluster(tmp_path):
    with LocalCluster(tmp_path, brokers=3, session_timeout_ms=SESSION_MS) as c:
        yield c


@pytest.fixture
def zk(cluster):
    client = KazooClient(hosts=cluster.zk.connect_string)
    client.start(timeout=10)
    yield client
    client.stop()
    client.close()


def _states(zk, name, partitions):
    return {p: L.decode_partition_state(zk.get(L.partition_state_path(name, p))[0]) for p in range(partitions)}


def _leaders(port, name):
    """{partition: (leader, isr)} as the broker on ``port`` answers Metadata."""
    md = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"}).list_topics(topic=name, timeout=10)
    return {p.id: (p.leader, sorted(p.isrs)) for p in md.topics[name].partitions.values()}, md.controller_id


def _create(cluster, name, partitions):
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(name, partitions, 3)])[name].result(30)


def _controller(zk):
    return json.loads(zk.get(L.CONTROLLER)[0])["brokerid"], int(zk.get(L.CONTROLLER_EPOCH)[0])


def _other_controller(zk, old):
    """(id, epoch) of a controller other than ``old``, or None: /controller may vanish between reads
    while the old one's session expires and the election runs."""
    try:
        ctl = _controller(zk)
    except NoNodeError:
        return None
    return ctl if ctl[0] != old else None


def _await_moved(cluster, zk, name, partitions, victim, before, survivor_port):
    """Wait until no partition is led by ``victim`` in ``survivor_port``'s Metadata; check the new
    leaders were in the ISR, epochs rose, and the victim left every ISR. Returns seconds waited."""
    t0 = time.monotonic()
    victims = [p for p, st in before.items() if st.leader == victim]
    assert victims, "the scenario needs partitions led by the victim"

    def moved():
        view, _ = _leaders(survivor_port, name)
        return all(view[p][0] not in (victim, -1) for p in range(partitions)) and view

    view = wait_until(moved, BOUND_S + 30, f"leadership of {name} to leave broker {victim}")
    took = time.monotonic() - t0
    after = _states(zk, name, partitions)
    for p in range(partitions):
        if p in victims:
            assert after[p].leader in before[p].isr and after[p].leader != victim
            assert after[p].leader_epoch > before[p].leader_epoch
        assert victim not in after[p].isr
        assert view[p][0] == after[p].leader
    return took


@pytest.mark.slow
def test_killed_leader_and_killed_controller_are_replaced(cluster, zk):
    name = f"failover-{uuid.uuid4().hex[:6]}"
    _create(cluster, name, 6)
    controller, epoch = _controller(zk)

    # 1. kill -9 a broker that leads partitions but is not the controller.
    victim = next(b for b in (0, 1, 2) if b != controller)
    before = _states(zk, name, 6)
    cluster.kill(victim)
    survivor = cluster.brokers[controller].port
    took = _await_moved(cluster, zk, name, 6, victim, before, survivor)
    print(f"kill -9 of leader broker {victim}: leadership moved after {took:.2f}s")
    assert took <= BOUND_S, f"leaders moved {took:.1f}s after kill -9 (bound {BOUND_S}s)"
    assert _controller(zk) == (controller, epoch)

    # 2. It comes back: registered, served the cluster's metadata, replica of its partitions again.
    cluster.start_broker(victim)
    view, seen_controller = _leaders(cluster.brokers[victim].port, name)
    assert seen_controller == controller and all(lead >= 0 for lead, _ in view.values())
    # ... and back in every ISR (RF 3 on 3 brokers): the snapshot below must not be taken while the
    # ISRs still grow, or a leader elected from an ISR that grew after it looks like an unclean one.
    wait_until(lambda: all(victim in st.isr for st in _states(zk, name, 6).values()), BOUND_S + 30,
               f"broker {victim} to rejoin every ISR")

    # 3. kill -9 the controller: another broker wins /controller with the next epoch and moves
    #    the dead controller's leaderships.
    before = _states(zk, name, 6)
    t0 = time.monotonic()
    cluster.kill(controller)
    survivor = cluster.brokers[victim].port
    new_controller, new_epoch = wait_until(
        lambda: _other_controller(zk, controller),
        BOUND_S + 30, "a new controller")
    assert new_epoch == epoch + 1 and new_controller in (0, 1, 2)
    if any(st.leader == controller for st in before.values()):
        _await_moved(cluster, zk, name, 6, controller, before, survivor)
    took = time.monotonic() - t0      # kill -9 -> new controller -> its leaderships moved
    print(f"kill -9 of controller broker {controller}: new controller {new_controller}, leadership moved "
          f"after {took:.2f}s")
    assert took <= BOUND_S, f"failover took {took:.1f}s (bound {BOUND_S}s)"
    wait_until(lambda: _leaders(survivor, name)[1] == new_controller, 10, "brokers to name the new controller")


@pytest.mark.slow
def test_sigterm_moves_leadership_before_the_broker_leaves(cluster, zk):
    name = f"ctrl-shutdown-{uuid.uuid4().hex[:6]}"
    _create(cluster, name, 6)
    controller, _ = _controller(zk)
    victim = next(b for b in (0, 1, 2) if b != controller)
    before = _states(zk, name, 6)
    cluster.kill(victim, signal.SIGTERM)
    assert cluster.brokers[victim].proc.returncode == 0
    # The registration is gone at once (clean session close); the moves happened before that:
    # each moved state's write (mzxid) precedes the deletion of /brokers/ids/<victim> (the
    # parent's pzxid), i.e. leadership was handed over while the broker was still registered.
    deregistered = zk.exists(L.BROKER_IDS).pzxid
    assert zk.exists(L.broker_path(victim)) is None
    moved = 0
    for p, st in before.items():
        data, stat = zk.get(L.partition_state_path(name, p))
        after = L.decode_partition_state(data)
        assert victim not in after.isr and after.leader != victim
        assert stat.mzxid < deregistered, f"partition {p} changed only after broker {victim} left"
        if st.leader == victim:
            assert after.leader in st.isr and after.leader_epoch > st.leader_epoch
            moved += 1
    assert moved >= 1
    assert "controlled shutdown succeeded" in cluster.brokers[victim].log_path.read_text()
    view, _ = _leaders(cluster.brokers[controller].port, name)
    assert all(lead not in (victim, -1) for lead, _ in view.values())

    # The rest leave one by one, the controller first: it moves its leaderships to the last. The last
    # is frozen (SIGSTOP) from the controller's "succeeded" until after the controller has exited, then
    # stopped at once: its shutdown begins before (or while) it learns that it is the controller now,
    # so its first request may go to the dead one. With no other live replica for anything, it leaves
    # without retrying (not after the 3 attempts' 10 s of backoff), whether that request was answered.
    second = controller
    last = next(b for b in (0, 1, 2) if b not in (victim, second))
    last_pid = cluster.brokers[last].proc.pid
    os.kill(cluster.brokers[second].proc.pid, signal.SIGTERM)
    wait_until(lambda: "controlled shutdown succeeded" in cluster.brokers[second].log_path.read_text(),
               30, f"broker {second}'s controlled shutdown", interval=0.005)
    os.kill(last_pid, signal.SIGSTOP)
    try:
        cluster.brokers[second].proc.wait(timeout=60)
        os.kill(last_pid, signal.SIGTERM)
    finally:
        os.kill(last_pid, signal.SIGCONT)
    cluster.brokers[last].proc.wait(timeout=60)
    text = cluster.brokers[last].log_path.read_text()
    assert "no partition still led here has another live replica; not retrying" in text
    assert "controlled shutdown attempt 2 of" not in text


@pytest.mark.slow
def test_no_in_sync_replica_left_means_offline_unless_unclean_election_is_allowed(cluster, zk):
    controller, _ = _controller(zk)
    a, b = [x for x in (0, 1, 2) if x != controller]
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    clean, unclean = f"clean-{uuid.uuid4().hex[:6]}", f"unclean-{uuid.uuid4().hex[:6]}"
    fs = admin.create_topics([NewTopic(clean, 1, replica_assignment=[[a, b]]),
                              NewTopic(unclean, 1, replica_assignment=[[a, b]],
                                       config={"unclean.leader.election.enable": "true"})])
    for f in fs.values():
        f.result(30)

    # The follower stops (controlled shutdown takes it out of the ISR), then the leader dies:
    # nobody in sync is left.
    cluster.kill(b, signal.SIGTERM)
    for name in (clean, unclean):
        assert _states(zk, name, 1)[0].isr == [a]
    cluster.kill(a)
    wait_until(lambda: _states(zk, clean, 1)[0].leader == -1, BOUND_S + 30, f"{clean} to go offline")
    offline = _states(zk, clean, 1)[0]
    assert offline.isr == [a]                    # the last in-sync replica stays recorded
    # the brokers' Metadata follows the ZooKeeper state once the controller's UpdateMetadata arrived
    wait_until(lambda: _leaders(cluster.brokers[controller].port, clean)[0][0][0] == -1, 10,
               "Metadata to show no leader")

    # The out-of-sync replica comes back: only the topic that allows it takes it as leader.
    before = _states(zk, unclean, 1)[0]
    cluster.start_broker(b)
    st = wait_until(lambda: (s := _states(zk, unclean, 1)[0]).leader == b and s, 30, f"{unclean} led by {b}")
    assert st.isr == [b] and st.leader_epoch > before.leader_epoch
    assert _states(zk, clean, 1)[0] == offline
    assert _leaders(cluster.brokers[controller].port, clean)[0][0][0] == -1

    # The last in-sync replica returns: the clean topic is led again, by it.
    cluster.start_broker(a)
    st = wait_until(lambda: (s := _states(zk, clean, 1)[0]).leader == a and s, 30, f"{clean} led by {a} again")
    assert st.leader_epoch > offline.leader_epoch
    wait_until(lambda: _leaders(cluster.brokers[controller].port, clean)[0][0][0] == a, 10,
               "Metadata to show the clean topic's leader")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["cli", "auto"])
def test_leadership_returns_to_the_preferred_replica(tmp_path, how):
    """After a SIGTERM bounce the broker is back in every ISR but leads nothing; `kbroker
    leader-election --election-type PREFERRED` (or auto.leader.rebalance.enable with a 1 s check)
    gives its preferred partitions back to it."""
    overrides = ({"auto.leader.rebalance.enable": "false"} if how == "cli" else
                 {"auto.leader.rebalance.enable": "true", "leader.imbalance.check.interval.seconds": 1})
    with LocalCluster(tmp_path, brokers=3, session_timeout_ms=SESSION_MS, overrides=overrides) as cluster:
        zk = KazooClient(hosts=cluster.zk.connect_string)
        zk.start(timeout=10)
        try:
            name = f"preferred-{uuid.uuid4().hex[:6]}"
            _create(cluster, name, 3)
            controller, _ = _controller(zk)
            victim = next(b for b in (0, 1, 2) if b != controller)
            assignment = json.loads(zk.get(L.topic_path(name))[0])["partitions"]
            mine = [int(p) for p, replicas in assignment.items() if replicas[0] == victim]
            assert mine

            cluster.kill(victim, signal.SIGTERM)
            assert all(_states(zk, name, 3)[p].leader != victim for p in mine)
            cluster.start_broker(victim)
            # Back in sync: the leaders take it into their ISRs again (replication's business).
            wait_until(lambda: all(victim in st.isr for st in _states(zk, name, 3).values()), 60,
                       f"broker {victim} to rejoin every ISR")
            if how == "cli":
                assert all(_states(zk, name, 3)[p].leader != victim for p in mine)
                r = subprocess.run([sys.executable, "-m", "kbroker", "leader-election", "--bootstrap-server",
                                    cluster.bootstrap, "--election-type", "preferred", "--all-topic-partitions"],
                                   capture_output=True, text=True, timeout=60)
                assert r.returncode == 0, r.stdout + r.stderr
                assert (f"Successfully completed leader election (PREFERRED) for partitions "
                        f"{', '.join(f'{name}-{p}' for p in sorted(mine))}") in r.stdout
                assert "Valid replica already elected for partitions" in r.stdout
            wait_until(lambda: all(_states(zk, name, 3)[p].leader == victim for p in mine), 30,
                       f"broker {victim} to lead its preferred partitions again")
            # Brokers learn it from the controller's UpdateMetadata, sent after the state znodes change.
            wait_until(lambda: all(_leaders(cluster.brokers[controller].port, name)[0][p][0] == victim
                                   for p in mine), 30, "the controller's broker to answer Metadata with the move")
        finally:
            zk.stop()
            zk.close()


@pytest.mark.slow
def test_reassign_partitions_moves_replicas_and_keeps_the_data(cluster, zk, tmp_path):
    """kafka-reassign-partitions.sh's flow with `kbroker reassign-partitions`: move a partition,
    raise another's replication factor, drain broker 0 from a third; the records written before
    stay readable (all N of N) and the removed replicas' logs are deleted."""
    def tool(*args):
        return subprocess.run([sys.executable, "-m", "kbroker", "reassign-partitions", "--zookeeper",
                               cluster.zk.connect_string, *args], capture_output=True, text=True, timeout=60)

    name = f"reassign-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(name, 3, replica_assignment=[[0, 1], [1, 0], [0, 1]])])[name].result(30)
    p = ck.Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    n = 300
    for i in range(n):
        p.produce(name, value=b"%d" % i, partition=i % 3)
    assert p.flush(30) == 0

    moves = tmp_path / "topics.json"
    moves.write_text(json.dumps({"version": 1, "topics": [{"topic": name}]}))
    gen = tool("--generate", "--topics-to-move-json-file", str(moves), "--broker-list", "1,2")
    assert gen.returncode == 0, gen.stdout + gen.stderr
    proposed = json.loads(gen.stdout.split("Proposed partition reassignment configuration\n")[1])
    assert all(set(e["replicas"]) <= {1, 2} and len(e["replicas"]) == 2 for e in proposed["partitions"])

    target = {0: [1, 2], 1: [1, 0, 2], 2: [2, 1]}
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": name, "partition": q, "replicas": rs} for q, rs in target.items()]}))
    ex = tool("--execute", "--reassignment-json-file", str(plan))
    assert ex.returncode == 0, ex.stdout + ex.stderr
    assert f"Successfully started partition reassignments for {name}-0,{name}-1,{name}-2" in ex.stdout

    wait_until(lambda: tool("--verify", "--reassignment-json-file", str(plan)).returncode == 0, 60,
               "the reassignment to complete")
    assert zk.exists(L.REASSIGN_PARTITIONS) is None
    a = L.decode_topic(zk.get(L.topic_path(name))[0])
    assert a.partitions == target and a.adding_replicas == {} and a.removing_replicas == {}
    for q, st in _states(zk, name, 3).items():
        assert st.leader in target[q] and set(st.isr) <= set(target[q])

    # Every record is still there, read from the new leaders.
    c = ck.Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                     "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        c.assign([ck.TopicPartition(name, q, 0) for q in range(3)])
        seen = set()
        deadline = time.monotonic() + 30
        while len(seen) < n and time.monotonic() < deadline:
            for m in c.consume(100, timeout=1):
                if m.error() is None:
                    seen.add(int(m.value()))
        assert len(seen) == n, f"{n - len(seen)} of {n} records missing after the reassignment"
    finally:
        c.close()
    # Removed replicas' logs are gone: broker 0 no longer holds partitions 0 and 2.
    for q in (0, 2):
        wait_until(lambda: not (cluster.brokers[0].data_dir / f"{name}-{q}").exists(), 15,
                   f"broker 0's copy of {name}-{q} to be deleted")


@pytest.mark.slow
def test_frozen_controller_is_replaced_and_fenced_when_it_wakes(cluster, zk):
    """SIGSTOP the controller past its session timeout: another broker takes over with the next
    epoch and moves its leaderships. Woken up, the old controller finds its session gone, writes
    nothing (every state keeps the new epoch) and follows the new controller as a plain broker."""
    name = f"frozen-{uuid.uuid4().hex[:6]}"
    _create(cluster, name, 6)
    old, epoch = _controller(zk)
    os_pid = cluster.brokers[old].proc.pid
    os.kill(os_pid, signal.SIGSTOP)
    try:
        new, new_epoch = wait_until(lambda: _other_controller(zk, old),
                                    BOUND_S + 30, "a new controller")
        assert new_epoch == epoch + 1
        wait_until(lambda: all(st.leader != old and old not in st.isr for st in _states(zk, name, 6).values()),
                   BOUND_S + 30, f"leadership and ISRs without the frozen broker {old}")
    finally:
        os.kill(os_pid, signal.SIGCONT)
    frozen_port = cluster.brokers[old].port
    # It re-registers under a new session and learns of the new controller from it.
    wait_until(lambda: zk.exists(L.broker_path(old)) is not None and _leaders(frozen_port, name)[1] == new,
               BOUND_S + 30, f"broker {old} to follow controller {new}")
    assert _controller(zk) == (new, new_epoch)
    for st in _states(zk, name, 6).values():
        assert st.controller_epoch in (epoch, new_epoch) and st.leader >= 0
    wait_until(lambda: len({str(_leaders(b.port, name)) for b in cluster.brokers.values()}) == 1, 15,
               "every broker to answer the same metadata")
    p = ck.Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(30):
        p.produce(name, b"%d" % i, partition=i % 6)
    assert p.flush(30) == 0
    assert "is no longer controller" in cluster.brokers[old].log_path.read_text()


@pytest.mark.slow
def test_rolling_restart_fails_no_acks_all_write(cluster, zk):
    """SIGTERM and restart each broker in turn (controlled shutdown moves leadership first) under
    a steady idempotent acks=all load on an RF=3, min.insync.replicas=2 topic. Invariant, counted by
    the shared history checker: failed writes 0, acked-but-lost 0, duplicates 0, inconsistent 0."""
    name = f"rolling-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(name, 3, 3, config={"min.insync.replicas": "2"})])[name].result(30)
    hist = History()
    p = ck.Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True,
                     "linger.ms": 5, "message.timeout.ms": 120000})
    stop = threading.Event()

    def on_delivery(err, msg):
        if err is None:
            hist.ack(msg.value(), msg.partition(), msg.offset())
        else:
            hist.fail(msg.value(), err)

    def load():                       # ~300 records/s, round-robin over the partitions
        n = 0
        while not stop.is_set():
            for _ in range(3):
                v = b"r%08d" % n
                hist.send(v)
                p.produce(name, value=v, partition=n % 3, on_delivery=on_delivery)
                n += 1
            p.poll(0.01)

    def in_sync():
        return all(sorted(st.isr) == [0, 1, 2] for st in _states(zk, name, 3).values())

    wait_until(in_sync, 30, "full ISRs")
    t = threading.Thread(target=load, daemon=True)
    t.start()
    try:
        for b in (0, 1, 2):
            before = len(hist.acked)
            cluster.kill(b, signal.SIGTERM)
            assert cluster.brokers[b].proc.returncode == 0
            cluster.start_broker(b)
            wait_until(in_sync, 60, f"broker {b} back in every ISR")
            wait_until(lambda: len(hist.acked) > before + 300, 30, "acknowledgements to continue")
    finally:
        stop.set()
        t.join()
    assert p.flush(60) == 0
    read_all_confluent(cluster.bootstrap, name, 3, hist)
    r = hist.check()
    print("rolling restart:", r.line(), f"failed {len(hist.failed)}")
    assert not hist.failed, f"failed acks=all writes: {list(hist.failed.items())[:5]}"
    assert (r.acked_lost, r.duplicates, r.inconsistent_offsets) == (0, 0, 0), r.line()
    assert r.acked == r.sent


@pytest.mark.slow
def test_replicas_of_a_topic_deleted_while_their_broker_was_down_are_deleted_on_its_return(cluster, zk):
    controller, _ = _controller(zk)
    away = next(b for b in (0, 1, 2) if b != controller)
    name = f"stray-{uuid.uuid4().hex[:6]}"
    _create(cluster, name, 2)
    p = ck.Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(10):
        p.produce(name, b"%d" % i, partition=i % 2)
    assert p.flush(30) == 0
    # a live producer keeps refreshing the topic's metadata, and a refresh after the delete would
    # auto-create the topic again (as Kafka does), so the returning broker's logs would not be strays
    del p
    data = cluster.brokers[away].data_dir
    wait_until(lambda: all((data / f"{name}-{q}").is_dir() for q in range(2)), 15, "the follower's logs")

    cluster.kill(away, signal.SIGTERM)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.delete_topics([name])[name].result(30)
    assert zk.exists(L.topic_path(name)) is None
    assert all((data / f"{name}-{q}").is_dir() for q in range(2))       # nobody could tell it yet

    cluster.start_broker(away)
    wait_until(lambda: not any((data / f"{name}-{q}").exists() for q in range(2)), 30,
               f"broker {away}'s replicas of the deleted {name} to be deleted")


def test_shutdown_retries_go_on_while_any_partition_has_another_live_replica():
    """The early stop of controlled-shutdown retries (apis/controlled_shutdown): only when no remaining
    partition has a live replica besides the leaving broker; an unknown partition cannot be ruled out."""
    from kbroker.server.apis.controlled_shutdown import partitions_with_live_replica, replicated_here
    from kbroker.server.metadata import MetadataCache, PartitionInfo, TopicInfo

    md = MetadataCache()
    md.put_topic(TopicInfo("t", bytes(16), {0: PartitionInfo(1, 5, [1, 2], [1]), 1: PartitionInfo(1, 5, [1, 3], [1])}))
    left = [{"topic_name": "t", "partition_index": 0}, {"topic_name": "t", "partition_index": 1}]
    assert partitions_with_live_replica(md, 1, left, {1}) == 0                 # the last broker standing
    assert partitions_with_live_replica(md, 1, left, {1, 2}) == 1              # 2 is up (out of the ISR: may rejoin)
    assert partitions_with_live_replica(md, 1, left, {1, 2, 3}) == 2
    assert partitions_with_live_replica(md, 1, left + [{"topic_name": "gone", "partition_index": 0}], {1}) == 1
    # Without the controller's answer: every partition with a replica here (not only those it leads).
    md.put_topic(TopicInfo("u", bytes(16), {0: PartitionInfo(2, 1, [2, 1], [2]), 1: PartitionInfo(2, 1, [2, 4], [2])}))
    here = replicated_here(md, 1)
    assert sorted((p["topic_name"], p["partition_index"]) for p in here) == [("t", 0), ("t", 1), ("u", 0)]
    assert partitions_with_live_replica(md, 1, here, {1, 4}) == 0              # 4 holds only u-1: not ours
    assert partitions_with_live_replica(md, 1, here, {1, 2}) == 2
