"""Go's Sarama (Debian's 1.22: its own protocol code, request versions picked from its configured Kafka
version, no ApiVersions negotiation) against a real broker, configured as an old client (0.11.0:
Produce v3, Fetch v4, ListOffsets v1, OffsetCommit v1, JoinGroup v1) and as the newest version it
knows (2.2.0). The client is our program in tests/support/sarama, built once per source hash.

Invariants: what Sarama produced with each codec is what Sarama and kafka-python read back (offsets,
keys, values, timestamps); a group member that consumed and committed leaves commits at exactly the
next offset of what it took, and a restarted member resumes there (every record taken once); offsets
by time are the first offset whose record timestamp is at or past the time; admin creates, describes,
lists groups and deletes.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from kbroker.protocol.api import ApiKey
from kbroker.protocol.errors import Errors
from kbroker.testing import LocalCluster, wait_until

from checkers import RawConn, consume_kafka_python, create_topic

SOURCE = Path(__file__).resolve().parents[1] / "support" / "sarama" / "main.go"
GOPATH = "/usr/share/gocode"        # Debian's Go packages (golang-github-shopify-sarama-dev)
OLD, NEW = "0.11.0.0", "2.2.0"      # the oldest version Sarama writes RecordBatch v2 with; its newest
VERSIONS = [OLD, NEW]
TS_BASE = 1_650_000_000_000


def _build() -> Path:
    """The client binary, built with Debian's Go in GOPATH mode; cached by the source's and Go's hash."""
    go = shutil.which("go")
    assert go, "Go is missing: scripts/setup.sh installs golang-go and golang-github-shopify-sarama-dev"
    goversion = subprocess.run([go, "version"], capture_output=True, check=True).stdout
    key = hashlib.sha256(SOURCE.read_bytes() + goversion).hexdigest()[:16]
    root = Path(tempfile.gettempdir()) / "kbroker-sarama"
    binary = root / key / "sarama-client"
    if binary.exists():
        return binary
    binary.parent.mkdir(parents=True, exist_ok=True)
    partial = binary.with_name(f"sarama-client.{os.getpid()}")
    env = dict(os.environ, GO111MODULE="off", GOPATH=GOPATH, GOCACHE=str(root / "gocache"))
    r = subprocess.run([go, "build", "-o", str(partial), str(SOURCE)], env=env, capture_output=True, timeout=600)
    assert r.returncode == 0, f"go build failed:\n{r.stderr.decode()[-4000:]}"
    os.replace(partial, binary)
    return binary


@pytest.fixture(scope="module")
def sarama():
    return _build()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("sarama"), brokers=1, num_partitions=3,
                      overrides={"offsets.topic.num.partitions": 1,
                                 "group.initial.rebalance.delay.ms": 0}) as c:
        # Sarama 1.22's group gives up on COORDINATOR_LOAD_IN_PROGRESS: start once the offsets
        # partition is loaded.
        with RawConn(c.bootstrap) as raw:
            def loaded():
                raw.request(ApiKey.FIND_COORDINATOR, 0, {"key": "probe"})     # creates __consumer_offsets
                r = raw.request(ApiKey.OFFSET_FETCH, 2, {"group_id": "probe", "topics": None})
                assert r["error_code"] in (0, Errors.COORDINATOR_LOAD_IN_PROGRESS, Errors.NOT_COORDINATOR,
                                           Errors.COORDINATOR_NOT_AVAILABLE), r
                return r["error_code"] == 0
            wait_until(loaded, timeout=60, what="__consumer_offsets loaded")
        yield c


def run(binary, cluster, command, version, timeout=90, **flags) -> list[dict]:
    args = [str(binary), command, "-brokers", cluster.bootstrap, "-version", version]
    for k, v in flags.items():
        args += [f"-{k}", str(v)]
    r = subprocess.run(args, capture_output=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(args)} failed ({r.returncode}):\n{r.stderr.decode()[-3000:]}"
    return [json.loads(line) for line in r.stdout.splitlines()]


def _topic(prefix):
    return f"sarama-{prefix}-{uuid.uuid4().hex[:8]}"


CODECS = [(v, c) for v in VERSIONS for c in ("none", "gzip", "snappy", "lz4", "zstd")
          if not (c == "zstd" and v == OLD)]     # Sarama sends zstd only when configured for 2.1 or later


@pytest.mark.parametrize("version,codec", CODECS)
def test_each_codec_produces_and_reads_back(sarama, cluster, version, codec):
    topic = _topic(codec)
    create_topic(cluster.bootstrap, topic, 1)
    produced = run(sarama, cluster, "produce", version, topic=topic, partition=0, n=150, codec=codec,
                   ts=TS_BASE)
    assert [r["offset"] for r in produced] == list(range(150))
    read = run(sarama, cluster, "read", version, topic=topic, partition=0, n=150)
    assert read == produced
    theirs = consume_kafka_python(cluster.bootstrap, topic, {0: 150})
    assert [(c.offset, c.rec.timestamp, c.rec.key.decode(), c.rec.value.decode()) for c in theirs] == \
        [(r["offset"], r["timestamp"], r["key"], r["value"]) for r in produced]


def _committed(bootstrap, group, topic):
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return {tp.partition: om.offset for tp, om in admin.list_group_offsets(group)[group].items()
                if tp.topic == topic}
    finally:
        admin.close()


@pytest.mark.parametrize("version", VERSIONS)
def test_group_commits_and_a_restarted_member_resumes_there(sarama, cluster, version):
    topic, group = _topic("group"), _topic("g")
    create_topic(cluster.bootstrap, topic, 3)
    produced = set()
    for p in range(3):
        for r in run(sarama, cluster, "produce", version, topic=topic, partition=p, n=20, codec="none"):
            produced.add((p, r["offset"]))
    first = run(sarama, cluster, "group", version, topic=topic, group=group, limit=25)
    assert len(first) == 25
    taken = {}
    for r in first:
        taken.setdefault(r["partition"], []).append(r["offset"])
    for offsets in taken.values():                  # each partition's records in order, from 0
        assert offsets == list(range(len(offsets)))
    # Sarama's offset manager commits on its interval and when the member leaves.
    assert _committed(cluster.bootstrap, group, topic) == {p: len(o) for p, o in taken.items()}

    second = run(sarama, cluster, "group", version, topic=topic, group=group, limit=60 - 25)
    resumed = {}
    for r in second:
        resumed.setdefault(r["partition"], []).append(r["offset"])
    for p, offsets in resumed.items():
        start = len(taken.get(p, []))
        assert offsets == list(range(start, start + len(offsets))), (p, start, offsets[:5])
    both = [(r["partition"], r["offset"]) for r in first + second]
    assert len(both) == len(set(both)) and set(both) == produced
    assert _committed(cluster.bootstrap, group, topic) == {0: 20, 1: 20, 2: 20}


def _expected_offset(records, t):
    """Kafka's answer to ListOffsets(t): the first offset whose record timestamp is >= t, -1 if none."""
    return min((r["offset"] for r in records if r["timestamp"] >= t), default=-1)


@pytest.mark.parametrize("version", VERSIONS)
def test_offsets_by_time_match_the_records_timestamps(sarama, cluster, version):
    topic = _topic("times")
    create_topic(cluster.bootstrap, topic, 1)
    records = []
    for i in range(3):      # three batches, later ones later in time; timestamps step back inside each
        records += run(sarama, cluster, "produce", version, topic=topic, partition=0, n=40,
                       codec="gzip" if i == 1 else "none", ts=TS_BASE + i * 10_000, step=10)
    stamps = sorted({r["timestamp"] for r in records})
    times = [TS_BASE - 1] + stamps[::7] + [stamps[-1], stamps[-1] + 1]
    got = run(sarama, cluster, "offsets", version, topic=topic, partition=0, times=",".join(map(str, times)))
    assert [(g["time"], g["offset"]) for g in got] == [(t, _expected_offset(records, t)) for t in times]
    ends = run(sarama, cluster, "offsets", version, topic=topic, partition=0, times="-2,-1")
    assert [g["offset"] for g in ends] == [0, len(records)]


def _topics(bootstrap):
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return set(admin.list_topics())
    finally:
        admin.close()


@pytest.mark.parametrize("version", VERSIONS)
def test_admin_creates_describes_lists_groups_and_deletes(sarama, cluster, version):
    topic, group = _topic("admin"), _topic("ag")
    assert run(sarama, cluster, "admin", version, topic=topic, action="create", partitions=4) == [{"created": topic}]
    wait_until(lambda: topic in _topics(cluster.bootstrap), what=f"{topic} listed")
    described = run(sarama, cluster, "admin", version, topic=topic, action="describe")
    assert described == [{"topic": topic, "error": 0, "partitions": 4}]

    run(sarama, cluster, "produce", version, topic=topic, partition=2, n=1, codec="none")
    run(sarama, cluster, "group", version, topic=topic, group=group, limit=1)
    groups = run(sarama, cluster, "admin", version, action="groups")[0]["groups"]
    assert groups.get(group) == "consumer"

    assert run(sarama, cluster, "admin", version, topic=topic, action="delete") == [{"deleted": topic}]
    wait_until(lambda: topic not in _topics(cluster.bootstrap), what=f"{topic} deleted")
