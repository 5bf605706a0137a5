"""The /metrics endpoint (prometheus-client's server over our collector) serves Kafka's JMX-exporter
names, and the counters follow real traffic."""
import socket
import time
import urllib.request

import confluent_kafka as ck
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kbroker.testing import LocalCluster, free_port, wait_until


def _scrape(port):
    """-> ({family name: type}, {(sample name, sorted label items): value}), parsed by prometheus-client."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    types, samples = {}, {}
    for fam in text_string_to_metric_families(text):
        types[fam.name] = fam.type
        for smp in fam.samples:
            samples[(smp.name, tuple(sorted(smp.labels.items())))] = smp.value
    return types, samples


def _get(samples, name, **labels):
    return samples[(name, tuple(sorted(labels.items())))]


def _sum(samples, name, **labels):
    """Sum of ``name`` over the samples carrying at least ``labels``."""
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= set(lab))


@pytest.fixture(scope="module")
def metered(tmp_path_factory):
    port = free_port()
    with LocalCluster(tmp_path_factory.mktemp("metrics"), num_partitions=2,
                      overrides={"kbroker.metrics.port": port}) as c:
        yield c, port


def _consume_all(cluster, topic, n, partitions=2, **conf):
    # No auto-commit: librdkafka would otherwise wait for the coordinator on close.
    c = ck.Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "m", "enable.auto.commit": False, **conf})
    c.assign([ck.TopicPartition(topic, i, ck.OFFSET_BEGINNING) for i in range(partitions)])
    got, errors = 0, []
    deadline = time.monotonic() + 60
    while got < n and time.monotonic() < deadline:
        for m in c.consume(1000, timeout=1):
            if m.error():
                errors.append(str(m.error()))
            else:
                got += 1
    return c, got, errors


def test_metrics_follow_produce_and_fetch(metered):
    cluster, port = metered
    p = ck.Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 5})
    for i in range(3000):
        p.produce("metered", value=b"v" * 1000)
    assert p.flush(30) == 0
    c, got, errors = _consume_all(cluster, "metered", 3000)
    c.close()
    assert got == 3000, f"consumed {got} of 3000; errors: {errors[:5]}"

    types, s = _scrape(port)
    for name, kind in (("kafka_server_brokertopicmetrics_messagesin", "counter"),
                       ("kafka_server_brokertopicmetrics_bytesin", "counter"),
                       ("kafka_server_brokertopicmetrics_bytesout", "counter"),
                       ("kafka_network_requestmetrics_requests", "counter"),
                       ("kafka_controller_kafkacontroller_activecontrollercount", "gauge"),
                       ("kafka_network_socketserver_networkprocessoravgidlepercent", "gauge"),
                       ("kafka_network_requestmetrics_totaltimems", "summary"),
                       ("process_cpu_seconds", "counter")):
        assert types.get(name) == kind, (name, types.get(name))
    assert _get(s, "kafka_server_brokertopicmetrics_messagesin_total", topic="metered") == 3000
    stored = _get(s, "kafka_server_brokertopicmetrics_bytesin_total", topic="metered")
    assert stored > 3000 * 1000
    assert _get(s, "kafka_server_brokertopicmetrics_bytesout_total", topic="metered") >= stored
    assert _get(s, "kafka_controller_kafkacontroller_activecontrollercount") == 1
    assert _sum(s, "kafka_network_requestmetrics_requests_total", request="Produce") > 0
    assert all(dict(lab)["version"].isdigit() for (n, lab) in s if n == "kafka_network_requestmetrics_requests_total")
    # Every fetched byte left through sendfile or the counted copy path, and most through sendfile.
    sent = _get(s, "kbroker_network_fetch_sendfile_bytes_total") + _get(s, "kbroker_network_fetch_copy_bytes_total")
    assert sent == _get(s, "kafka_server_brokertopicmetrics_bytesout_total")
    assert _get(s, "kbroker_network_fetch_sendfile_bytes_total") >= 0.9 * sent
    assert _get(s, "kafka_log_log_logendoffset", topic="metered", partition="0") \
        + _get(s, "kafka_log_log_logendoffset", topic="metered", partition="1") == 3000


def test_small_fetches_are_counted_where_they_leave(metered):
    """A small fetch at the log's tail is answered from the segment's read block (bytes copied into
    the response, no sendfile): those bytes still count as copied, so sendfile + copy == BytesOut
    holds for small fetches as well as large ones (the read-block path once went uncounted)."""
    cluster, port = metered
    p = ck.Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 0})
    p.produce("metered-small", value=b"s" * 50, partition=0)
    assert p.flush(30) == 0
    _types, before = _scrape(port)

    def sent(s):
        return _get(s, "kbroker_network_fetch_sendfile_bytes_total") + _get(s, "kbroker_network_fetch_copy_bytes_total")

    c, got, errors = _consume_all(cluster, "metered-small", 1, partitions=1)
    c.close()
    assert got == 1, errors[:5]
    _types, after = _scrape(port)
    out = _get(after, "kafka_server_brokertopicmetrics_bytesout_total", topic="metered-small")
    assert 0 < out < 1000
    assert sent(after) - sent(before) == out
    assert _get(after, "kbroker_network_fetch_copy_bytes_total") - _get(before, "kbroker_network_fetch_copy_bytes_total") == out


def test_idle_percent_falls_under_load(metered):
    """NetworkProcessorAvgIdlePercent: near 1 while nothing is asked of the broker, clearly lower
    while one-record Produce requests arrive back to back (linger.ms=0, acks=1) for 2 s."""
    cluster, port = metered
    _scrape(port)                              # starts a window
    t0 = time.monotonic()

    def idle_window():
        if time.monotonic() - t0 < 1.5:        # the gauge's window is at least a second long
            return None
        return _get(_scrape(port)[1], "kafka_network_socketserver_networkprocessoravgidlepercent")
    idle = wait_until(idle_window, 20, "an idle window")
    # One record per Produce request: the broker's work is per request.
    p = ck.Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 0, "acks": 1, "batch.num.messages": 1})
    p.produce("metered-idle", value=b"x")
    assert p.flush(30) == 0                    # topic created, metadata known
    _scrape(port)
    t1 = time.monotonic()
    sent = 0
    while time.monotonic() - t1 < 2.0 and sent < 2_000_000:
        try:
            p.produce("metered-idle", value=b"x" * 100)
            sent += 1
        except BufferError:
            p.poll(0.01)
        p.poll(0)
    assert p.flush(30) == 0
    types, s = _scrape(port)
    busy = _get(s, "kafka_network_socketserver_networkprocessoravgidlepercent")
    print(f"T-idle idle={idle:.3f} under_load={busy:.3f} records={sent}")
    assert idle > 0.9, idle
    assert busy < idle - 0.2, (idle, busy)
    assert 0 < _get(s, "kbroker_network_loop_idle_seconds_total")


def test_metrics_bound_to_the_listener_host(metered):
    """The listener is 127.0.0.1: the metrics server takes that address only (not 127.0.0.2)."""
    _cluster, port = metered
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.2", port), timeout=5)


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
    counts = h.counts               # a copy of the C counters
    counts[10] = 100
    lo, hi = BOUNDS_S[9], BOUNDS_S[10]
    assert quantile(counts, 0.5) == pytest.approx((lo + hi) / 2)
    assert quantile(counts, 1.0) == pytest.approx(hi)
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
        wall0, cpu0 = time.perf_counter(), time.thread_time()
        end = wall0 + 0.4
        while time.perf_counter() < end:
            pass
        ratio = meter.ratio(min_window_s=0)
        return ratio, (time.thread_time() - cpu0) / (time.perf_counter() - wall0)

    try:
        idle = loop.run_until_complete(waiting())
        busy, cpu_share = loop.run_until_complete(spinning())
    finally:
        loop.close()
    assert meter.method == ("select" if loop_kind == "asyncio" else "cpu")
    assert idle > 0.8, idle
    if meter.method == "select":
        assert busy < 0.2, busy
    else:
        # The CPU method counts the time this thread waited for a core as idle, so on a loaded machine
        # a spinning loop reads as idle as its share of a core was short: judge it against that share.
        assert abs((1.0 - busy) - cpu_share) < 0.2, (busy, cpu_share)
        assert busy < idle - 0.3 or cpu_share < 0.5, (busy, idle, cpu_share)
    assert meter.idle_seconds() > 0.3


def test_request_quantiles_cover_the_last_five_minutes():
    """Quantiles come from the requests since a snapshot 5-5.5 minutes old; _count/_sum since start."""
    from kbroker.metrics import BrokerCollector
    from kbroker.request_metrics import RequestStats

    s = RequestStats("Produce")
    collector = BrokerCollector(broker=None)

    def scrape(now):
        snap = [(s.name, s.count, {k: h.snapshot() for k, h in s.histograms().items()})]
        fams = {f.name: f for f in collector._request_families(snap, now)}
        total = fams["kafka_network_requestmetrics_totaltimems"]
        return {(x.name, x.labels.get("quantile")): x.value for x in total.samples}

    for _ in range(100):
        s.observe(0.0, 0.0, 0.0, 2.0)          # slow requests first
    q = scrape(1000.0)
    # Buckets are 2^(1/2) wide: a quantile lands within the bucket holding its rank.
    assert 1800 < q[("kafka_network_requestmetrics_totaltimems", "0.99")] <= 2000 * 2 ** 0.5
    for _ in range(100):
        s.observe(0.0, 0.0, 0.0, 0.001)
    q = scrape(1200.0)                          # both inside the window: the median is slow-ish
    assert q[("kafka_network_requestmetrics_totaltimems", "0.99")] > 1500
    assert q[("kafka_network_requestmetrics_totaltimems", "0.50")] <= 1.0 * 2 ** 0.5
    for _ in range(100):
        s.observe(0.0, 0.0, 0.0, 0.001)
    q = scrape(1320.0)                          # the 1000 s snapshot is now the base: slow ones out
    assert q[("kafka_network_requestmetrics_totaltimems", "0.999")] <= 1.0 * 2 ** 0.5
    assert q[("kafka_network_requestmetrics_totaltimems_count", None)] == 300
    assert q[("kafka_network_requestmetrics_totaltimems_sum", None)] == pytest.approx(100 * 2000 + 200 * 1.0)
    q = scrape(2000.0)                          # nothing new: empty window, quantiles 0
    assert q[("kafka_network_requestmetrics_totaltimems", "0.99")] == 0.0
    assert q[("kafka_network_requestmetrics_totaltimems_count", None)] == 300


def test_silent_scraper_is_dropped_and_others_served(metered):
    """A connection that sends nothing is closed after the handler timeout (5 s) instead of holding
    its thread; scrapes keep working meanwhile."""
    _cluster, port = metered
    silent = [socket.create_connection(("127.0.0.1", port), timeout=20) for _ in range(20)]
    try:
        assert _get(_scrape(port)[1], "kafka_controller_kafkacontroller_activecontrollercount") == 1
        t0 = time.monotonic()
        for s in silent:
            assert s.recv(1) == b""             # closed by the server, no response
        assert time.monotonic() - t0 < 15
    finally:
        for s in silent:
            s.close()
