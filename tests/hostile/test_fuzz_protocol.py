"""The structure-aware protocol fuzzer (kbroker/fuzz.py) against a real broker, bounded for CI.

Invariants (counted by the fuzzer, asserted zero here): no crash, no hang (each request answered or its
connection closed within the bound), RSS growth bounded, and a probe connection's ApiVersions + Metadata
answered every second throughout. The long run is ``python -m kbroker.fuzz --seconds 1800``.
"""
from __future__ import annotations

import socket
import threading

import pytest

from kbroker.fuzz import FUZZ_BROKER, Fuzzer, _answer_or_close, make_batch, mutate_bytes
from kbroker.testing import LocalCluster

CI_SECONDS = 30
RSS_BOUND_MIB = 256     # the broker's default pool is 400 MiB; fuzz frames are small, so growth stays far below


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_fuzz_every_advertised_api(tmp_path):
    with LocalCluster(tmp_path / "cluster", num_partitions=1, overrides=FUZZ_BROKER) as c:
        fz = Fuzzer(c.bootstrap, seed=9, rss_pid=c.brokers[0].pid, rss_bound_mib=RSS_BOUND_MIB)
        stats = fz.run(CI_SECONDS)
        alive = c.brokers[0].running()
    print("T-fuzz " + " ".join(f"{k}={v}" for k, v in stats.items() if k != "samples"))
    assert alive and not stats["crashed"]
    assert stats["hangs"] == 0, stats["samples"]
    assert stats["probe_failures"] == 0, stats["samples"]
    assert stats["rss_violations"] == 0, stats["samples"]
    # the run exercised both outcomes, many APIs, and enough requests to mean something
    assert stats["answered"] > 500 and stats["closed"] > 500, stats
    assert stats["apis"] >= 50, stats


def test_hang_detector_sees_a_silent_peer():
    """The checker can see a violation: a peer that reads the request and never answers is a hang;
    one that closes is a close."""
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    held = []

    def serve():
        for _ in range(2):
            conn, _ = srv.accept()
            conn.recv(100)
            held.append(conn)
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"\0\0\0\1x")
        assert _answer_or_close(s, 0.5) == "hang"
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"\0\0\0\1x")
        t.join(5)
        held[-1].close()
        assert _answer_or_close(s, 2) == "closed"
    for h in held:
        h.close()
    srv.close()


def test_mutators_keep_the_frame_shape():
    import random
    r = random.Random(1)
    for _ in range(200):
        b = make_batch(r)
        assert len(b) >= 61
        f = mutate_bytes(r, bytearray(b"\0\0\0\x10" + bytes(16)))
        assert len(f) >= 4
