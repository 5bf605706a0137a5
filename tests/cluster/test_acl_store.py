"""The AclAuthorizer against a real ZooKeeper: Kafka's znodes and JSON, change notifications applied by
a second authorizer (another broker) within a second, compare-and-set writes from two writers, and a
change written the way Kafka's tools write it (raw znodes) picked up."""
import asyncio
import json
import threading
import time
import uuid

import pytest
from kazoo.client import KazooClient

from kbroker.security.acl import AclEntry, Operation as Op, PatternType as P, Permission, ResourcePattern, \
    ResourceType as T
from kbroker.security.authorizer import AclAuthorizer

ALICE = "User:alice"


@pytest.fixture
def kazoo_factory(zk_server):
    chroot = f"/acl{uuid.uuid4().hex[:10]}"
    made = []

    def make():
        zk = KazooClient(hosts=zk_server.connect_string + chroot)
        if not made:
            root = KazooClient(hosts=zk_server.connect_string)
            root.start(10)
            root.ensure_path(chroot)
            root.stop()
            root.close()
        zk.start(10)
        made.append(zk)
        return zk

    yield make
    for zk in made:
        zk.stop()
        zk.close()


async def started(kazoo):
    loop = asyncio.get_running_loop()
    a = AclAuthorizer()
    await asyncio.to_thread(a.start, kazoo, loop, lambda fn, *args: loop.call_soon_threadsafe(fn, *args))
    await asyncio.sleep(0)      # the initial load is applied on the loop
    return a


async def within(cond, timeout_s):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "not applied in time"
        await asyncio.sleep(0.01)


def test_round_trip_between_two_brokers(kazoo_factory):
    zk1, zk2 = kazoo_factory(), kazoo_factory()

    async def main():
        a, b = await started(zk1), await started(zk2)
        entry = AclEntry(ALICE, "*", Op.READ, Permission.ALLOW)
        t = ResourcePattern(T.TOPIC, "orders", P.LITERAL)
        t0 = time.monotonic()
        await asyncio.to_thread(a.update, t, lambda cur: cur | {entry})
        await within(lambda: b.authorize(ALICE, "127.0.0.1", Op.READ, T.TOPIC, "orders"), 1.0)
        assert time.monotonic() - t0 < 1.0
        data, _ = zk1.get("/kafka-acl/Topic/orders")
        assert json.loads(data) == {"version": 1, "acls": [
            {"principal": ALICE, "permissionType": "Allow", "operation": "Read", "host": "*"}]}
        notes = zk1.get_children("/kafka-acl-changes")
        assert [zk1.get(f"/kafka-acl-changes/{n}")[0] for n in notes] == [b"Topic:orders"]

        pre = ResourcePattern(T.GROUP, "app-", P.PREFIXED)
        await asyncio.to_thread(a.update, pre, lambda cur: cur | {AclEntry(ALICE, "*", Op.ALL, Permission.ALLOW)})
        await within(lambda: b.authorize(ALICE, "h", Op.READ, T.GROUP, "app-1"), 1.0)
        assert zk1.exists("/kafka-acl-extended/prefixed/Group/app-")
        ext = zk1.get_children("/kafka-acl-extended-changes")
        assert json.loads(zk1.get(f"/kafka-acl-extended-changes/{ext[0]}")[0])["patternType"] == "PREFIXED"

        await asyncio.to_thread(a.update, t, lambda cur: frozenset())
        await within(lambda: not b.authorize(ALICE, "h", Op.READ, T.TOPIC, "orders"), 1.0)
        assert not zk1.exists("/kafka-acl/Topic/orders")

        # a third broker starting now loads what is stored
        c = await started(kazoo_factory())
        assert c.authorize(ALICE, "h", Op.DESCRIBE, T.GROUP, "app-2")
        a.stop(), b.stop(), c.stop()

    asyncio.run(main())


def test_concurrent_writers_lose_nothing(kazoo_factory):
    zk1, zk2 = kazoo_factory(), kazoo_factory()

    async def main():
        a, b = await started(zk1), await started(zk2)
        t = ResourcePattern(T.TOPIC, "shared", P.LITERAL)
        users = [f"User:u{i}" for i in range(20)]

        def add(auth, who):
            for u in who:
                auth.update(t, lambda cur, u=u: cur | {AclEntry(u, "*", Op.WRITE, Permission.ALLOW)})

        th = [threading.Thread(target=add, args=(a, users[0::2])), threading.Thread(target=add, args=(b, users[1::2]))]
        await asyncio.to_thread(lambda: ([x.start() for x in th], [x.join() for x in th]))
        stored = json.loads(zk1.get("/kafka-acl/Topic/shared")[0])["acls"]
        assert sorted(e["principal"] for e in stored) == sorted(users)
        await within(lambda: all(a.authorize(u, "h", Op.WRITE, T.TOPIC, "shared") and
                                 b.authorize(u, "h", Op.WRITE, T.TOPIC, "shared") for u in users), 1.0)
        a.stop(), b.stop()

    asyncio.run(main())


def test_change_written_as_kafka_tools_write_it(kazoo_factory):
    zk1 = kazoo_factory()

    async def main():
        a = await started(zk1)
        raw = kazoo_factory()
        raw.create("/kafka-acl/Cluster/kafka-cluster", json.dumps({"version": 1, "acls": [
            {"principal": "User:broker", "permissionType": "Allow", "operation": "ClusterAction",
             "host": "127.0.0.1"}]}).encode(), makepath=True)
        raw.create("/kafka-acl-changes/acl_changes_", b"Cluster:kafka-cluster", sequence=True)
        await within(lambda: a.authorize("User:broker", "127.0.0.1", Op.CLUSTER_ACTION, T.CLUSTER,
                                         "kafka-cluster"), 1.0)
        assert not a.authorize("User:broker", "127.0.0.2", Op.CLUSTER_ACTION, T.CLUSTER, "kafka-cluster")
        a.stop()

    asyncio.run(main())
