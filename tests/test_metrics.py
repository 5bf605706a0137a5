"""The /metrics endpoint serves Kafka's JMX-exporter names, and the counters follow real traffic."""
import re
import time
import urllib.error
import urllib.request

import confluent_kafka as ck
import pytest

from kbroker.testing import LocalCluster, free_port


def _samples(text):
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


@pytest.fixture(scope="module")
def metered(tmp_path_factory):
    port = free_port()
    with LocalCluster(tmp_path_factory.mktemp("metrics"), num_partitions=2,
                      overrides={"kbroker.metrics.port": port}) as c:
        yield c, port


def test_metrics_follow_produce_and_fetch(metered):
    cluster, port = metered
    url = f"http://127.0.0.1:{port}/metrics"
    p = ck.Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 5})
    for i in range(3000):
        p.produce("metered", value=b"v" * 1000)
    assert p.flush(30) == 0
    # No auto-commit: consumer groups (and their coordinator) are a later issue; librdkafka would
    # otherwise wait for a coordinator on close.
    c = ck.Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "m", "enable.auto.commit": False})
    c.assign([ck.TopicPartition("metered", i, ck.OFFSET_BEGINNING) for i in range(2)])
    got, errors = 0, []
    deadline = time.monotonic() + 60
    while got < 3000 and time.monotonic() < deadline:
        for m in c.consume(1000, timeout=1):
            if m.error():
                errors.append(str(m.error()))
            else:
                got += 1
    c.close()
    assert got == 3000, f"consumed {got} of 3000; errors: {errors[:5]}"

    text = urllib.request.urlopen(url, timeout=10).read().decode()
    for name in ("kafka_server_brokertopicmetrics_messagesin_total", "kafka_server_brokertopicmetrics_bytesin_total",
                 "kafka_server_brokertopicmetrics_bytesout_total", "kafka_network_requestmetrics_requests_total",
                 "kafka_controller_kafkacontroller_activecontrollercount"):
        assert f"# TYPE {name} " in text
    s = _samples(text)
    assert s['kafka_server_brokertopicmetrics_messagesin_total{topic="metered"}'] == 3000
    stored = s['kafka_server_brokertopicmetrics_bytesin_total{topic="metered"}']
    assert stored > 3000 * 1000
    assert s['kafka_server_brokertopicmetrics_bytesout_total{topic="metered"}'] >= stored
    assert s["kafka_controller_kafkacontroller_activecontrollercount"] == 1
    assert any(re.match(r'kafka_network_requestmetrics_requests_total\{request="Produce",version="\d+"\}', k) for k in s)
    # Every fetched byte left through sendfile or the counted copy path, and most through sendfile.
    sent = s["kbroker_network_fetch_sendfile_bytes_total"] + s["kbroker_network_fetch_copy_bytes_total"]
    assert sent == s["kafka_server_brokertopicmetrics_bytesout_total"]
    assert s["kbroker_network_fetch_sendfile_bytes_total"] >= 0.9 * sent


def test_metrics_unknown_path_is_404(metered):
    _cluster, port = metered
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/nope", timeout=10)
    assert e.value.code == 404


# ---- kbroker.request_metrics: the counters the collector reads ------------------------------------

def test_request_stats_count_sum_and_buckets():
    from kbroker.request_metrics import BOUNDS_S, RequestStatsRegistry
    reg = RequestStatsRegistry()
    s = reg.get(0)
    assert s is reg.get(0) and s.name == "Produce"
    assert reg.get(1).name == "FetchConsumer" and reg.get(1, follower=True).name == "FetchFollower"
    assert reg.get(3, follower=True).name == "Metadata"
    s.observe(0.001, 0.002, 0.0005, 0.010)       # remote = 10 - 1 - 2 - 0.5 = 6.5 ms
    s.observe(0.0, 0.0, 0.0, 0.0)
    assert s.count == 2
    assert s.total.sum_s == pytest.approx(0.010) and s.remote.sum_s == pytest.approx(0.0065)
    for h, v in ((s.queue, 0.001), (s.local, 0.002), (s.send, 0.0005), (s.total, 0.010), (s.remote, 0.0065)):
        assert sum(h.counts) == 2 and h.counts[0] == 1
        i = next(i for i, c in enumerate(h.counts) if c and i > 0)
        assert BOUNDS_S[i - 1] < v <= BOUNDS_S[i]
    s.observe(0.001, 0.001, 0.001, 0.002)          # parts above the whole: remote clamps at 0
    assert s.remote.counts[0] == 2
    s.observe(0, 0, 0, 1e6)                         # beyond the last bound: overflow bucket
    assert s.total.counts[-1] == 1
    assert {x.name for x in reg.all()} == {"Produce", "FetchConsumer", "FetchFollower", "Metadata"}


def test_quantile_interpolates_inside_buckets():
    from kbroker.request_metrics import BOUNDS_S, N_BUCKETS, TimeHistogram, quantile
    h = TimeHistogram()
    assert quantile(h.counts, 0.99) == 0.0
    # 100 values spread evenly over (BOUNDS_S[9], BOUNDS_S[10]]: the median is mid-bucket.
    h.counts[10] = 100
    lo, hi = BOUNDS_S[9], BOUNDS_S[10]
    assert quantile(h.counts, 0.5) == pytest.approx((lo + hi) / 2)
    assert quantile(h.counts, 1.0) == pytest.approx(hi)
    # 90 fast, 10 slow: p50 among the fast, p95 and p99 among the slow.
    counts = [0] * N_BUCKETS
    counts[4], counts[30] = 90, 10
    assert BOUNDS_S[3] < quantile(counts, 0.5) <= BOUNDS_S[4]
    assert BOUNDS_S[29] < quantile(counts, 0.95) <= BOUNDS_S[30]
    counts[-1] = 1000
    assert quantile(counts, 0.99) == BOUNDS_S[-1]


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_loop_idle_meter_tells_waiting_from_working(loop_kind):
    """A loop that only waits is measured nearly idle; one that spins on the CPU nearly busy."""
    import asyncio

    from kbroker.request_metrics import LoopIdleMeter

    if loop_kind == "uvloop":
        import uvloop
        loop = uvloop.new_event_loop()
    else:
        loop = asyncio.new_event_loop()
    meter = LoopIdleMeter()

    async def waiting():
        meter.install(asyncio.get_running_loop())
        for _ in range(20):
            await asyncio.sleep(0.02)
        return meter.ratio(min_window_s=0)

    async def spinning():
        end = time.perf_counter() + 0.4
        while time.perf_counter() < end:
            pass
        return meter.ratio(min_window_s=0)

    try:
        idle = loop.run_until_complete(waiting())
        busy = loop.run_until_complete(spinning())
    finally:
        loop.close()
    assert meter.method == ("select" if loop_kind == "asyncio" else "cpu")
    assert idle > 0.8, idle
    # The CPU method counts time this thread waited for a core (2 shared cores here) as idle.
    assert busy < (0.2 if meter.method == "select" else 0.5), busy
    assert meter.idle_seconds() > 0.3
