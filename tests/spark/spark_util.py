"""Shared helpers of the Spark tests: one local SparkSession per module, topic creation and
confluent-kafka reads to compare against."""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The JVMs of these tests (drivers, executors, standalone daemons) live for seconds to a minute and
# move little data: JIT compilation by C2 and parallel GC threads cost more CPU than they save there.
# C1 only and the serial collector change no Spark behaviour.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def jvm_env(env: dict) -> dict:
    """``env`` with TEST_JVM_OPTIONS for every JVM started under it (the java launcher reads
    JDK_JAVA_OPTIONS and notes it on stderr)."""
    return dict(env, JDK_JAVA_OPTIONS=TEST_JVM_OPTIONS)


def make_session(app: str, master: str = "local[2]", extra: dict | None = None):
    from kbroker.spark import ensure_python_env
    ensure_python_env()
    # The repo root on the workers' path makes the top-level pyspark_kbroker module visible to
    # Spark's data source lookup (an installed wheel puts it in site-packages instead).
    # Only the JVM (started by getOrCreate) and its workers get it: other tests' subprocesses
    # (e.g. the wheel install test) must not see the source tree on their path.
    saved = os.environ.get("PYTHONPATH")
    paths = [str(ROOT)] + [p for p in (saved or "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    try:
        from pyspark.sql import SparkSession
        b = (SparkSession.builder.master(master).appName(app)
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.memory", "1g")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.python.worker.reuse", "true")
             .config("spark.driver.extraJavaOptions", TEST_JVM_OPTIONS))
        for k, v in (extra or {}).items():
            b = b.config(k, v)
        return b.getOrCreate()
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def create_topic(bootstrap: str, name: str, partitions: int, config: dict | None = None):
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})
    fut = admin.create_topics([NewTopic(name, partitions, 1, config=config or {})])[name]
    fut.result(30)
    from kbroker.spark.kafka import wait_for_partitions
    from kbroker.spark.options import ClientConfig
    assert wait_for_partitions(ClientConfig(bootstrap), name) == partitions


def produce(bootstrap: str, topic: str, records, compression: str = "none", extra: dict | None = None):
    """records: iterable of (partition, key, value, headers). Returns the count delivered."""
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "compression.type": compression, "linger.ms": 20,
                  "message.max.bytes": 4 * 1024 * 1024, **(extra or {})})
    errors = []
    n = 0
    for part, key, value, headers in records:
        while True:
            try:
                p.produce(topic, value=value, key=key, partition=part, headers=headers,
                          on_delivery=lambda err, msg: errors.append(err) if err else None)
                break
            except BufferError:
                p.poll(0.05)
        n += 1
    assert p.flush(60) == 0
    assert not errors, errors[:3]
    return n


def consume_all(bootstrap: str, topic: str, ranges: dict):
    """Every record of {partition: (start, end)} via confluent-kafka, as Spark-shaped dicts."""
    import datetime

    from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "spark-compare", "enable.auto.commit": False,
                  "fetch.message.max.bytes": 8 * 1024 * 1024})
    out = []
    try:
        want = {p: (s, e) for p, (s, e) in ranges.items() if e > s}
        c.assign([TopicPartition(topic, p, s) for p, (s, e) in want.items()])
        done = set()
        import time
        deadline = time.monotonic() + 60
        while len(done) < len(want) and time.monotonic() < deadline:
            for m in c.consume(500, 1.0):
                assert m.error() is None, m.error()
                p, off = m.partition(), m.offset()
                s, e = want[p]
                if off >= e:
                    done.add(p)
                    continue
                ts_type, ts = m.timestamp()
                hdrs = m.headers()
                out.append({
                    "key": m.key(), "value": m.value(), "topic": m.topic(), "partition": p, "offset": off,
                    "timestamp": datetime.datetime.fromtimestamp(ts / 1000, datetime.timezone.utc),
                    "timestampType": 1 if ts_type == TIMESTAMP_LOG_APPEND_TIME else 0,
                    "headers": [{"key": k, "value": v} for k, v in hdrs] if hdrs else None,
                })
                if off == e - 1:
                    done.add(p)
        assert len(done) == len(want), f"confluent-kafka did not reach the ends: {done} of {want}"
    finally:
        c.close()
    return sorted(out, key=lambda r: (r["partition"], r["offset"]))


def python_exe() -> str:
    return sys.executable
