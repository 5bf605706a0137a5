"""Fetched record bytes leave the broker through sendfile(2), not through a user-space copy.

Invariant: while a confluent-kafka consumer reads ~20 MB back, the bytes the broker process passes to
sendfile add up to at least 90% of the partition's log bytes it serves.

Measured two independent ways: Debian's ``strace -f -e trace=sendfile`` attached to the broker's PID
(adding up the syscalls' return values; the test fails if strace is missing), and the broker's own
counters (fetch_sendfile_calls/bytes, fetch_copy_bytes) on its ``kbroker.metrics.port`` /metrics.
The counter test and the vanishing-client test run on both event loops (kbroker.event.loop): uvloop has
no loop.sendfile, so there the broker calls os.sendfile itself and waits on a dup() of the socket.
"""
from __future__ import annotations

import os
import re
import time
import uuid

import pytest

from checkers import all_batches, consume_confluent, end_offsets, strace_attached, wait_for_topic, wait_until

N = 20_000
VALUE = 1000          # ~20 MB of values
PARTITIONS = 3

_SENDFILE = re.compile(rb"sendfile(?:64)?\((\d+), (\d+), .*\) = (\d+)")


def test_fetch_uses_sendfile(kafka_cluster, tmp_path):
    import confluent_kafka as ck

    bootstrap = kafka_cluster.bootstrap
    topic = f"sendfile-{uuid.uuid4().hex[:8]}"
    wait_for_topic(bootstrap, topic, PARTITIONS)
    p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "compression.type": "none"})
    payload = os.urandom(VALUE)
    for i in range(N):
        while True:
            try:
                p.produce(topic, key=b"%d" % i, value=payload[:VALUE - 8] + b"%08d" % i)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0
    ends = end_offsets(bootstrap, topic, PARTITIONS)
    assert sum(ends.values()) == N
    log_bytes = sum(b.size for part in range(PARTITIONS)
                    for _f, b in all_batches(kafka_cluster.brokers[0].data_dir, topic, part))

    trace_out = tmp_path / "strace.out"
    with strace_attached(kafka_cluster.brokers[0].pid, "sendfile", trace_out) as tracer:
        # attached once a syscall we provoke shows up: strace has no readiness signal of its own
        def attached():
            if tracer.poll() is not None:
                raise RuntimeError(f"strace exited: {tracer.stderr.read()!r}")
            consume_confluent(bootstrap, topic, {0: 1})
            return trace_out.exists() and _SENDFILE.search(trace_out.read_bytes())
        wait_until(attached, 30, "strace to see the broker's sendfile calls", interval=0.2)
        seen_before = _sum(trace_out)
        t0 = time.monotonic()
        got = consume_confluent(bootstrap, topic, ends, timeout=120)
        elapsed = time.monotonic() - t0
    calls, sent = _sum(trace_out)
    calls -= seen_before[0]
    sent -= seen_before[1]
    assert len(got) == N
    assert [int(m.rec.value[-8:]) for m in got if m.partition == 0] == sorted(
        int(m.rec.value[-8:]) for m in got if m.partition == 0)
    ratio = sent / log_bytes
    print(f"T-sendfile log_bytes={log_bytes} sendfile_calls={calls} sendfile_bytes={sent} ratio={ratio:.3f} "
          f"read_s={elapsed:.1f}")
    assert calls > 0
    assert ratio >= 0.90, f"only {ratio:.1%} of the fetched log bytes went through sendfile"


def _sum(path):
    calls = total = 0
    if not path.exists():
        return 0, 0
    for m in _SENDFILE.finditer(path.read_bytes()):
        calls += 1
        total += int(m.group(3))
    return calls, total


def test_strace_parser_counts_calls(tmp_path):
    """The parser reads strace's sendfile lines (both -f forms) and ignores failed calls."""
    f = tmp_path / "s.out"
    f.write_bytes(b"1234  sendfile(14, 22, [0] => [65536], 65536) = 65536\n"
                  b"sendfile(14, 22, [65536] => [70000], 1000000) = 4464\n"
                  b"1234  sendfile(14, 22, [70000], 10) = -1 EAGAIN (Resource temporarily unavailable)\n")
    assert _sum(f) == (2, 70000)


def _metrics(port) -> dict[str, float]:
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("kbroker_network_fetch_"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


LOOPS = ["asyncio", "uvloop"]


def _loop_env(c, loop):
    assert f"event loop: {loop} (kbroker.event.loop)" in c.brokers[0].log_path.read_text(errors="replace")


@pytest.mark.parametrize("loop", LOOPS)
def test_fetch_uses_sendfile_by_broker_counters(tmp_path, loop):
    """The same invariant from the broker's own counters on its /metrics endpoint."""
    from kbroker.testing import LocalCluster, free_port
    import confluent_kafka as ck

    mport = free_port()
    with LocalCluster(tmp_path / "cluster", num_partitions=1, overrides={"kbroker.metrics.port": mport},
                      env={"KBROKER_EVENT_LOOP": loop}) as c:
        _loop_env(c, loop)
        topic = f"sendfile-m-{uuid.uuid4().hex[:8]}"
        wait_for_topic(c.bootstrap, topic, 1)
        p = ck.Producer({"bootstrap.servers": c.bootstrap, "linger.ms": 20})
        payload = os.urandom(VALUE)
        for i in range(N):
            while True:
                try:
                    p.produce(topic, value=payload)
                    break
                except BufferError:
                    p.poll(0.05)
        assert p.flush(60) == 0
        del p
        log_bytes = sum(b.size for _f, b in all_batches(c.brokers[0].data_dir, topic, 0))
        before = _metrics(mport)
        got = consume_confluent(c.bootstrap, topic, {0: N}, timeout=120)
        after = _metrics(mport)
    assert len(got) == N
    d = {k.replace("kbroker_network_fetch_", ""): after[k] - before.get(k, 0) for k in after}
    sent, copied = d["sendfile_bytes_total"], d["copy_bytes_total"]
    print(f"T-sendfile-metrics log_bytes={log_bytes} sendfile_bytes={sent:.0f} copy_bytes={copied:.0f} "
          f"calls={d['sendfile_calls_total']:.0f} loop={loop}")
    assert sent >= 0.90 * (sent + copied)
    assert sent >= 0.90 * log_bytes


@pytest.mark.parametrize("loop", LOOPS)
def test_client_vanishing_mid_fetch_leaves_no_stuck_send(tmp_path, loop):
    """Invariant: a consumer that disconnects while a large fetch response is being sent (the socket
    buffer full, the broker waiting to write) leaves nothing behind: no send waiting forever, no stale
    event-loop registration for its fd; the broker keeps serving, and its open-connection gauge returns
    to the number of live clients."""
    import socket as _socket
    import urllib.request

    import confluent_kafka as ck

    from kbroker.protocol import api as _api
    from kbroker.testing import LocalCluster, free_port, wait_until

    mport = free_port()
    with LocalCluster(tmp_path, overrides={"kbroker.metrics.port": mport}, env={"KBROKER_EVENT_LOOP": loop}) as c:
        _loop_env(c, loop)
        p = ck.Producer({"bootstrap.servers": c.bootstrap, "linger.ms": 20})
        for _ in range(8000):
            p.produce("vanish", value=b"x" * 1000, partition=0)
        assert p.flush(30) == 0
        body = {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 64 << 20, "isolation_level": 0,
                "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
                "topics": [{"topic": "vanish", "partitions": [{"partition": 0, "current_leader_epoch": -1,
                                                               "fetch_offset": 0, "log_start_offset": -1,
                                                               "partition_max_bytes": 64 << 20}]}]}
        def gauge():
            text = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5).read().decode()
            return [float(line.split()[-1]) for line in text.splitlines()
                    if line.startswith("kafka_network_socketserver_connections ")][0]
        # The live clients: the producer and the controller's channel to its own broker.
        live = gauge()
        host, port = c.bootstrap.split(":")
        for i in range(5):
            s = _socket.create_connection((host, int(port)), timeout=5)
            s.setsockopt(_socket.SOL_SOCKET, _socket.SO_RCVBUF, 4096)   # keep the broker's send blocked
            s.sendall(_api.encode_request(1, 11, i, "vanish", body))
            s.recv(1024)                                                # the response has started
            s.close()

        p.flush(0)
        wait_until(lambda: gauge() <= live, 15, "the vanished consumers' connections to be gone")
        # and fetches still work
        cons = ck.Consumer({"bootstrap.servers": c.bootstrap, "group.id": "v", "enable.auto.commit": False})
        cons.assign([ck.TopicPartition("vanish", 0, 7990)])
        got = []
        for _ in range(20):
            got += [m for m in cons.consume(20, timeout=0.5) if not m.error()]
            if len(got) >= 10:
                break
        cons.close()
        assert len(got) == 10
        # A stale selector registration shows up as "Exception in callback ..._add_reader" when the
        # next connection reuses the fd number.
        log_text = c.brokers[0].log_path.read_text(errors="replace")
        assert "Exception in callback" not in log_text and "Traceback" not in log_text
