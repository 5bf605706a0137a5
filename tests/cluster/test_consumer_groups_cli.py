"""``kbroker consumer-groups`` against a real broker and a running confluent-kafka group: --describe
shows the right CURRENT-OFFSET / LOG-END-OFFSET / LAG and the owning member; --members, --state,
--list; --reset-offsets refuses an active group and moves a stopped one as asked (dry run changes
nothing); --delete."""
import subprocess
import sys
import threading
import time
import uuid

import pytest

from kbroker.testing import LocalCluster, wait_until

from test_groups import coordinator_ready, create_topic, describe, request


@pytest.fixture(scope="module")
def bs(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("cg-cli"), brokers=1, num_partitions=2,
                      overrides={"offsets.topic.num.partitions": 2, "group.initial.rebalance.delay.ms": 0}) as c:
        yield c.bootstrap


def cli(bs, *args):
    r = subprocess.run([sys.executable, "-m", "kbroker", "consumer-groups", "--bootstrap-server", bs, *args],
                       capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout, r.stderr


def rows(out):
    lines = [ln.split() for ln in out.splitlines() if ln.strip()]
    header = next(i for i, ln in enumerate(lines) if ln and ln[0] == "GROUP")
    return [dict(zip(lines[header], ln)) for ln in lines[header + 1:]]


def committed(bs, group):
    r = request(bs, 9, {"group_id": group, "topics": None}, 5)
    return {(t["name"], p["partition_index"]): p["committed_offset"] for t in r["topics"] for p in t["partitions"]}


def produce_to(bs, topic, partition, n):
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bs})
    for i in range(n):
        p.produce(topic, value=b"x%d" % i, partition=partition)
    assert p.flush(30) == 0


class Group:
    """A confluent-kafka member that consumes, commits what it consumed once asked, and keeps polling."""

    def __init__(self, bs, group, topic):
        from confluent_kafka import Consumer
        self.c = Consumer({"bootstrap.servers": bs, "group.id": group, "enable.auto.commit": False,
                           "auto.offset.reset": "earliest", "session.timeout.ms": 6000, "client.id": "cli-test"})
        self.c.subscribe([topic])
        self.count = 0
        self.commit_now = threading.Event()
        self.committed = threading.Event()
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.stop.is_set():
            m = self.c.poll(0.1)
            if m is not None and not m.error():
                self.count += 1
            if self.commit_now.is_set() and not self.committed.is_set():
                self.c.commit(asynchronous=False)
                self.committed.set()
        self.c.close()

    def close(self):
        self.stop.set()
        self.t.join(30)


def test_describe_reset_delete(bs):
    topic, group = f"cli-{uuid.uuid4().hex[:8]}", f"cli-{uuid.uuid4().hex[:8]}"
    create_topic(bs, topic, 2)
    produce_to(bs, topic, 0, 10)
    produce_to(bs, topic, 1, 5)
    wait_until(lambda: coordinator_ready(bs, group), 30, "coordinator")
    g = Group(bs, group, topic)
    try:
        wait_until(lambda: g.count >= 15, 60, "group consumed the first 15 records")
        g.commit_now.set()
        wait_until(g.committed.is_set, 30, "commit")
        produce_to(bs, topic, 0, 4)       # not committed: LAG 4 on partition 0
        wait_until(lambda: g.count >= 19, 30, "member read the new records")

        rc, out, err = cli(bs, "--describe", "--group", group)
        assert rc == 0, err
        got = {int(r["PARTITION"]): r for r in rows(out)}
        assert (got[0]["CURRENT-OFFSET"], got[0]["LOG-END-OFFSET"], got[0]["LAG"]) == ("10", "14", "4")
        assert (got[1]["CURRENT-OFFSET"], got[1]["LOG-END-OFFSET"], got[1]["LAG"]) == ("5", "5", "0")
        assert got[0]["CONSUMER-ID"].startswith("cli-test-") and got[0]["CLIENT-ID"] == "cli-test"
        assert got[0]["HOST"] == "/127.0.0.1"

        rc, out, _ = cli(bs, "--describe", "--group", group, "--members", "--verbose")
        assert rc == 0 and rows(out)[0]["#PARTITIONS"] == "2"
        assert f"{topic}(0,1)" in out
        rc, out, _ = cli(bs, "--describe", "--group", group, "--state")
        assert rc == 0 and rows(out)[0]["STATE"] == "Stable" and rows(out)[0]["#MEMBERS"] == "1"
        rc, out, _ = cli(bs, "--list")
        assert rc == 0 and group in out.split()

        rc, out, err = cli(bs, "--reset-offsets", "--group", group, "--topic", topic, "--to-earliest", "--execute")
        assert rc == 1 and "can only be reset if the group" in err and "Stable" in err
        assert committed(bs, group) == {(topic, 0): 10, (topic, 1): 5}
    finally:
        g.close()
    wait_until(lambda: describe(bs, group)["group_state"] == "Empty", 30, "group empty")

    rc, out, _ = cli(bs, "--reset-offsets", "--group", group, "--topic", topic, "--to-earliest", "--dry-run")
    assert rc == 0 and {int(r["PARTITION"]): r["NEW-OFFSET"] for r in rows(out)} == {0: "0", 1: "0"}
    assert committed(bs, group) == {(topic, 0): 10, (topic, 1): 5}       # dry run: nothing moved
    cases = [(["--to-earliest"], {0: 0, 1: 0}), (["--shift-by", "3"], {0: 3, 1: 3}),
             (["--to-latest"], {0: 14, 1: 5}), (["--to-offset", "7"], {0: 7, 1: 5}),
             (["--shift-by", "-100"], {0: 0, 1: 0}), (["--to-datetime", "2999-01-01T00:00:00.000"], {0: 14, 1: 5})]
    for opt, want in cases:
        rc, out, err = cli(bs, "--reset-offsets", "--group", group, "--topic", topic, *opt, "--execute")
        assert rc == 0, (opt, err)
        assert committed(bs, group) == {(topic, p): o for p, o in want.items()}, opt
    rc, out, _ = cli(bs, "--reset-offsets", "--group", group, "--topic", f"{topic}:1", "--to-earliest", "--execute")
    assert rc == 0 and committed(bs, group) == {(topic, 0): 14, (topic, 1): 0}

    rc, out, _ = cli(bs, "--describe", "--group", group)
    assert rc == 0 and f"Consumer group '{group}' has no active members." in out
    assert {int(r["PARTITION"]): r["LAG"] for r in rows(out)} == {0: "0", 1: "5"}
    rc, out, _ = cli(bs, "--delete", "--group", group)
    assert rc == 0 and f"Deletion of requested consumer groups ('{group}') was successful." in out
    rc, out, err = cli(bs, "--describe", "--group", group)
    assert rc == 1 and f"Consumer group '{group}' does not exist." in err
