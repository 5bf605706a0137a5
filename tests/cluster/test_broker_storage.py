"""Storage through a running broker: segment roll, retention by bytes and by time driven by topic
configs altered with real admin clients, log start offset and OFFSET_OUT_OF_RANGE as consumers see
them, and a full disk answered with KAFKA_STORAGE_ERROR without acknowledging anything unreadable.
"""
from __future__ import annotations

import subprocess
import time

import pytest

from kbroker.testing import LocalCluster
from test_broker_fetch import (EARLIEST, KAFKA_STORAGE_ERROR, LATEST, NONE, OFFSET_OUT_OF_RANGE, PRODUCE,
                               PRODUCE_V, Raw, create_topic, fetch_records, list_offset, make_batch,
                               produce, produce_body, read_all, wait_for)

SEGMENT_BYTES = 65536


def live_segments(cluster, topic, partition=0):
    """[(base offset, size)] of the partition's .log files not (yet) marked deleted, in order. Retention
    may rename a file away between the listing and its stat: that file is not live any more."""
    d = cluster.brokers[0].data_dir / f"{topic}-{partition}"
    out = []
    for f in d.glob("*.log"):
        try:
            out.append((int(f.name[:20]), f.stat().st_size))
        except FileNotFoundError:
            continue
    return sorted(out)


def fill(raw, topic, total_bytes, ts, value_size=1000, per_batch=8):
    """Produce ~total_bytes in batches of per_batch records; returns the number of records."""
    n = 0
    while n * value_size < total_bytes:
        recs = [(ts, b"k%d" % (n + i), b"%08d" % (n + i) + b"x" * (value_size - 8)) for i in range(per_batch)]
        r = produce(raw, topic, 0, recs)
        assert r["error_code"] == NONE and r["base_offset"] == n, r
        n += per_batch
    return n


@pytest.fixture(scope="module")
def roll_cluster(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("roll"), overrides={
            "log.segment.bytes": SEGMENT_BYTES, "log.retention.check.interval.ms": 500}) as c:
        yield c


@pytest.fixture(scope="module")
def retained_by_bytes(roll_cluster):
    """'retain-bytes': ~1 MB in 64 KiB segments, then retention.bytes=200000 set with
    IncrementalAlterConfigs and applied (log start > 0). -> (topic, record count, segments before)."""
    import confluent_kafka.admin as cka

    c = roll_cluster
    topic = create_topic(c.bootstrap, "retain-bytes")
    with Raw(c.bootstrap) as raw:
        n = fill(raw, topic, 1 << 20, int(time.time() * 1000))
        before = live_segments(c, topic)
        assert list_offset(raw, topic, 0, EARLIEST)["offset"] == 0
        admin = cka.AdminClient({"bootstrap.servers": c.bootstrap})
        res = cka.ConfigResource(cka.ResourceType.TOPIC, topic, incremental_configs=[
            cka.ConfigEntry("retention.bytes", "200000", incremental_operation=cka.AlterConfigOpType.SET)])
        admin.incremental_alter_configs([res])[res].result(timeout=30)
        wait_for(lambda: list_offset(raw, topic, 0, EARLIEST)["offset"] > 0, 30, "retention.bytes to apply")
    return topic, n, before


def test_roll_and_retention_by_bytes_and_time(roll_cluster, retained_by_bytes):
    """Invariants: ~1 MB into 64 KiB segments rolls into many segment files; after retention.bytes is
    set (IncrementalAlterConfigs) the oldest closed segments go until one more would bring the log
    under the limit, and after retention.ms is set (AlterConfigs) every closed segment older than it
    goes while the active one stays; the log start offset is the first surviving segment's base
    (ListOffsets earliest), the end does not move, and fetching below the start is OFFSET_OUT_OF_RANGE."""
    import confluent_kafka.admin as cka

    c = roll_cluster
    by_bytes, n_bytes, segs_before = retained_by_bytes
    by_time = create_topic(c.bootstrap, "retain-time")
    now = int(time.time() * 1000)
    with Raw(c.bootstrap) as raw:
        n_time = fill(raw, by_time, 1 << 20, now - 2 * 3_600_000)     # two hours old (CreateTime)
        for segs in (segs_before, live_segments(c, by_time)):
            assert len(segs) >= 10, f"{len(segs)} segments for ~1 MB at {SEGMENT_BYTES} B"
            assert all(size <= SEGMENT_BYTES for _b, size in segs[:-1])
        assert list_offset(raw, by_time, 0, EARLIEST)["offset"] == 0

        admin = cka.AdminClient({"bootstrap.servers": c.bootstrap})
        res = cka.ConfigResource(cka.ResourceType.TOPIC, by_time, set_config={"retention.ms": "3600000"})
        admin.alter_configs([res])[res].result(timeout=30)
        wait_for(lambda: len(live_segments(c, by_time)) == 1, 30, "retention.ms to apply")

        segs = live_segments(c, by_bytes)
        total = sum(size for _b, size in segs)
        assert total >= 200_000 and total - segs[0][1] < 200_000, (total, segs)
        start = list_offset(raw, by_bytes, 0, EARLIEST)["offset"]
        assert start == segs[0][0] > 0
        assert list_offset(raw, by_bytes, 0, LATEST)["offset"] == n_bytes

        [(active_base, _size)] = live_segments(c, by_time)
        assert list_offset(raw, by_time, 0, EARLIEST)["offset"] == active_base > 0
        assert list_offset(raw, by_time, 0, LATEST)["offset"] == n_time

        p, recs = fetch_records(raw, by_bytes, 0, 0)
        assert p["error_code"] == OFFSET_OUT_OF_RANGE and p["log_start_offset"] == start and recs == []
        p, recs = fetch_records(raw, by_bytes, 0, start)
        assert p["error_code"] == NONE and recs[0][0] == start and recs[0][3].startswith(b"%08d" % start)
        # Everything from the new start to the end is still there, in order.
        assert [r[0] for r in read_all(raw, by_time, 0, active_base)] == list(range(active_base, n_time))


def test_consumers_below_log_start(roll_cluster, retained_by_bytes):
    """Invariants: a kafka-python consumer positioned below the log start with auto_offset_reset='none'
    gets OffsetOutOfRangeError; with 'earliest' it resets to the log start and reads from there;
    librdkafka with auto.offset.reset=earliest does the same."""
    import confluent_kafka as ck
    from kafka import KafkaConsumer, TopicPartition
    from kafka.errors import OffsetOutOfRangeError

    c = roll_cluster
    with Raw(c.bootstrap) as raw:
        start = list_offset(raw, "retain-bytes", 0, EARLIEST)["offset"]
    assert start > 0
    tp = TopicPartition("retain-bytes", 0)

    kc = KafkaConsumer(bootstrap_servers=c.bootstrap, enable_auto_commit=False, auto_offset_reset="none",
                       fetch_max_wait_ms=100)
    try:
        kc.assign([tp])
        kc.seek(tp, 0)
        with pytest.raises(OffsetOutOfRangeError):
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                assert not kc.poll(timeout_ms=200), "records returned for an offset below the log start"
    finally:
        kc.close()

    kc = KafkaConsumer(bootstrap_servers=c.bootstrap, enable_auto_commit=False, auto_offset_reset="earliest",
                       fetch_max_wait_ms=100)
    try:
        kc.assign([tp])
        kc.seek(tp, 0)
        first = None
        deadline = time.monotonic() + 20
        while first is None and time.monotonic() < deadline:
            for msgs in kc.poll(timeout_ms=200).values():
                first = msgs[0]
                break
        assert first is not None and first.offset == start and first.value.startswith(b"%08d" % start)
    finally:
        kc.close()

    cc = ck.Consumer({"bootstrap.servers": c.bootstrap, "group.id": "below-start", "enable.auto.commit": False,
                      "auto.offset.reset": "earliest", "log_level": 0})
    try:
        cc.assign([ck.TopicPartition("retain-bytes", 0, 0)])
        deadline = time.monotonic() + 20
        m = None
        while time.monotonic() < deadline:
            m = cc.poll(0.2)
            if m is not None and m.error() is None:
                break
        assert m is not None and m.error() is None and m.offset() == start
    finally:
        cc.close()


def test_old_create_times_do_not_roll_a_segment_per_batch(roll_cluster):
    """Invariant (Kafka's LogSegment.timeWaitedForRoll): the time-based roll compares the new batch's
    timestamp with the segment's first batch timestamp, so replaying month-old records (same
    timestamps) into a fresh partition fills one segment instead of creating one per batch."""
    topic = create_topic(roll_cluster.bootstrap, "old-create-times")
    month_ago = int(time.time() * 1000) - 30 * 86_400_000
    with Raw(roll_cluster.bootstrap) as raw:
        for i in range(5):
            assert produce(raw, topic, 0, [(month_ago, None, b"old-%d" % i)])["base_offset"] == i
    assert len(live_segments(roll_cluster, topic)) == 1, live_segments(roll_cluster, topic)


# ---- full disk -----------------------------------------------------------------------------------------

def _mount_tmpfs(path, size="2m"):
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root/CAP_SYS_ADMIN): {r.stderr.strip()}")


def _umount(path):
    for _ in range(50):
        if subprocess.run(["umount", str(path)], capture_output=True).returncode == 0:
            return
        time.sleep(0.1)   # a just-stopped broker's descriptors may still be closing
    subprocess.run(["umount", "-l", str(path)], check=True)


def test_full_disk_answers_storage_error_and_acks_only_readable_data(tmp_path):
    """Invariant: when the log dir is full the Produce answer is KAFKA_STORAGE_ERROR (56) with no
    offset; every acknowledged offset is readable with its content, nothing beyond the acknowledged
    ones appears (end offset = acked count), and later produces keep that property."""
    cluster = LocalCluster(tmp_path, overrides={"log.segment.bytes": 400_000, "log.index.size.max.bytes": 65536})
    data_dir = cluster.brokers[0].data_dir
    _mount_tmpfs(data_dir)
    try:
        cluster.start()
        topic = create_topic(cluster.bootstrap, "full-disk")
        acked = []            # (offset, value)
        failure = None
        with Raw(cluster.bootstrap) as raw:
            for i in range(400):                     # 2 MiB / 16 KiB = 128 batches: bounded well above
                value = b"%06d" % i + bytes([i % 251]) * 16_000
                r = raw.call(PRODUCE, PRODUCE_V, produce_body(topic, 0, make_batch([(None, None, value)])))
                r = r["responses"][0]["partition_responses"][0]
                if r["error_code"] != NONE:
                    failure = r
                    break
                assert r["base_offset"] == len(acked)
                acked.append((r["base_offset"], value))
            assert failure is not None, "2 MiB tmpfs never filled up"
            assert failure["error_code"] == KAFKA_STORAGE_ERROR, failure
            assert failure["base_offset"] == -1
            assert len(acked) > 10

            def check():
                assert list_offset(raw, topic, 0, LATEST)["offset"] == len(acked)
                got = [(r[0], r[3]) for r in read_all(raw, topic, 0)]
                assert got == acked

            check()
            # Later attempts (small and large) either fail or are acknowledged and readable.
            for value in (b"small", b"L" * 16_000, b"tiny"):
                r = raw.call(PRODUCE, PRODUCE_V, produce_body(topic, 0, make_batch([(None, None, value)])))
                r = r["responses"][0]["partition_responses"][0]
                if r["error_code"] == NONE:
                    assert r["base_offset"] == len(acked)
                    acked.append((r["base_offset"], value))
                else:
                    assert r["error_code"] == KAFKA_STORAGE_ERROR and r["base_offset"] == -1, r
            check()
        assert cluster.brokers[0].running(), "the broker died on a full disk"
    finally:
        cluster.stop()
        _umount(data_dir)
