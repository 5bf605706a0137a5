"""Streaming reads from kbroker with Spark: the driver is killed with SIGKILL mid-batch and a task
failure is injected; after a restart from the checkpoint the batch-id-keyed Parquet sink holds
every record exactly once, including records of partitions added while the query was down."""
from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from kbroker.testing import wait_until
from spark_util import create_topic, produce

HERE = Path(__file__).resolve().parent
pytestmark = [pytest.mark.timeout(600)]


def _start_driver(bootstrap, topic, checkpoint, out, max_offsets, slow, slow_from, log):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, str(HERE / "spark_stream_driver.py"), bootstrap, topic,
                             str(checkpoint), str(out), str(max_offsets), str(slow), str(slow_from)],
                            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _kill_group(proc):
    """SIGKILL the driver and its JVM (the process group this test started)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)


def exactly_once_violations(keys, expected):
    """(lost, duplicated) between the (partition, offset) keys found in the sink and the set
    expected."""
    counts = Counter(keys)
    lost = len(expected - set(counts))
    dup = sum(c - 1 for c in counts.values() if c > 1)
    return lost, dup


def test_checker_sees_violations():
    expected = {(0, 0), (0, 1), (1, 0)}
    assert exactly_once_violations([(0, 0), (0, 1), (1, 0)], expected) == (0, 0)
    assert exactly_once_violations([(0, 0), (0, 0), (1, 0)], expected) == (1, 1)


@pytest.mark.slow
def test_driver_sigkill_and_task_failure_then_restart_exactly_once(bootstrap, tmp_path):
    import pyarrow.parquet as pq
    topic = f"sstream-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 3)
    n1 = produce(bootstrap, topic, ((i % 3, None, b"a%d" % i, None) for i in range(1500)))
    checkpoint, out = tmp_path / "checkpoint", tmp_path / "out"
    markers = out / "_markers"
    log_path = tmp_path / "driver.log"
    with open(log_path, "ab") as log:
        # Run 1: ~300 offsets per micro-batch, 3 s of extra work in batch 2; SIGKILL once batch 2
        # has started (its offsets are logged, its output not committed).
        proc = _start_driver(bootstrap, topic, checkpoint, out, 300, 3, 2, log)
        try:
            wait_until(lambda: (markers / "started-2").exists() or proc.poll() is not None, timeout=240,
                       interval=0.2)
            assert proc.poll() is None, log_path.read_text()[-3000:]
        finally:
            _kill_group(proc)
        assert (markers / "failed-once").exists(), "the task failure was not injected"
        assert not (checkpoint / "commits" / "2").exists()
        # While the query is down the topic gains two partitions and more records.
        from confluent_kafka.admin import AdminClient, NewPartitions
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_partitions([NewPartitions(topic, 5)])[topic].result(30)
        from kbroker.spark.kafka import wait_for_partitions
        from kbroker.spark.options import ClientConfig
        wait_until(lambda: wait_for_partitions(ClientConfig(bootstrap), topic) == 5, timeout=30)
        n2 = produce(bootstrap, topic, ((i % 5, None, b"b%d" % i, None) for i in range(1000)))
        # Run 2: restart from the checkpoint (batch 2 again, then two more), Trigger.AvailableNow runs
        # to the end and stops.
        proc = _start_driver(bootstrap, topic, checkpoint, out, 1000, 0, 0, log)
        try:
            assert proc.wait(300) == 0, log_path.read_text()[-3000:]
        finally:
            if proc.poll() is None:
                _kill_group(proc)
    files = glob.glob(str(out / "batch=*" / "*.parquet"))
    t = pq.ParquetDataset(files).read() if files else None
    keys = list(zip(t.column("partition").to_pylist(), t.column("offset").to_pylist()))
    # the expected (partition, offset) set: the log end offsets now
    from kbroker.spark.kafka import latest_offsets
    from kbroker.spark.options import read_config
    _, latest = latest_offsets(read_config({"kafka.bootstrap.servers": bootstrap, "subscribe": topic}, False))
    expected = {(p, o) for (_, p), end in latest.items() for o in range(end)}
    assert len(expected) == n1 + n2
    lost, dup = exactly_once_violations(keys, expected)
    print(f"exactly-once after SIGKILL + task failure + restart: lost {lost}, duplicated {dup} "
          f"of {len(expected)}")
    assert (lost, dup) == (0, 0)
    assert {p for p, _ in keys} == {0, 1, 2, 3, 4}
    # the checkpoint reads like Spark's Kafka source's: {"topic": {"partition": next_offset}}
    last = max(int(os.path.basename(f)) for f in glob.glob(str(checkpoint / "offsets" / "[0-9]*")))
    line = (checkpoint / "offsets" / str(last)).read_text().strip().splitlines()[-1]
    assert json.loads(line) == {topic: {str(p): latest[(topic, p)] for p in range(5)}}
    assert list(json.loads(line)[topic]) == ["0", "1", "2", "3", "4"]


def test_max_offsets_per_trigger_rate_limit():
    from kbroker.spark.source import rate_limit
    start = {("t", 0): 0, ("t", 1): 100}
    latest = {("t", 0): 1000, ("t", 1): 110, ("t", 2): 0}
    # 1010 backlog, limit 101: t-0 gets floor(1000/1010*101)=100, t-1 gets 1 (a share under 1 rounds up)
    assert rate_limit(start, latest, 101) == {("t", 0): 100, ("t", 1): 101, ("t", 2): 0}
    assert rate_limit(start, latest, 5000) == latest
