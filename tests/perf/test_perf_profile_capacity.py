"""profile_request capacity's persisting baselines (the write and splice sinks) and its report of them.

The sinks are real processes on a free loopback port; each test stops the one it started, by its PID."""
from __future__ import annotations

import os
import socket
import struct

import pytest

from kbroker.perf import harness as H
from kbroker.perf import profile_request as P
from kbroker.protocol.api import encode_request
from kbroker.testing import wait_until


def _frame(corr: int, payload: bytes) -> bytes:
    """A Produce v7 request frame (size prefix included) carrying ``payload`` as its records."""
    return bytes(encode_request(0, 7, corr, "t", {
        "transactional_id": None, "acks": 1, "timeout_ms": 1000,
        "topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": payload}]}]}))


@pytest.mark.parametrize("kind", P.PERSIST_SINKS)
def test_persist_sink_stores_each_request_and_answers_its_correlation_id(tmp_path, kind):
    proc, port = P.start_persist_sink(kind, tmp_path, max_seconds=120)
    try:
        # Larger than the splice sink's 1 MiB pipe, so a request takes several socket -> pipe -> file rounds.
        frames = [_frame(7, os.urandom(1500 * 1024)), _frame(8, os.urandom(3000)), _frame(9, b"")]
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            head = bytearray(4)
            for f in frames:
                s.sendall(f)
                resp = H.recv_frame(s, head)
                assert struct.unpack_from(">i", resp, 0)[0] == struct.unpack_from(">i", f, 8)[0]
            if kind == "recv1":           # the one-thread recv sink keeps nothing
                assert list(tmp_path.iterdir()) == []
                return
            stored = (tmp_path / "conn-1.log").read_bytes()
            assert stored == b"".join(frames)
        wait_until(lambda: not (tmp_path / "conn-1.log").exists(), 30, "the sink to unlink its file")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_capacity_report_sets_the_broker_against_each_persisting_sink():
    def row(mb, user, system):
        return {"mb_per_s": mb, "user_s_per_gb": user, "system_s_per_gb": system}
    rows = {"kbroker": [row(300, 0.6, 1.0), row(400, 0.6, 1.0)], "sink": [row(1500, 0.05, 0.2), row(2000, 0.05, 0.2)],
            "write-shm-sink": [row(600, 0.05, 0.75), row(1000, 0.05, 0.75)]}
    text = P._capacity_report(rows, None, 1024, 524235, [("kbroker", {}, {})], ["write-shm-sink"])
    assert ("| write-shm-sink | 800.00 (600.00-1000.00) | 0.05 (0.05-0.05) | 0.75 (0.75-0.75) "
            "| 0.45 (0.40-0.50) |") in text
    assert "kbroker ÷ write-shm-sink, same round: MB/s 0.45 (0.40-0.50), CPU-s/GB 2.00 (2.00-2.00)" in text
    assert "Syscalls" not in text          # no profile runs: rounds only


def test_parse_perf_stat_gives_calls_per_request():
    text = ("# started on Thu Nov 26 17:49:00 2026\n\n"
            "3082,,syscalls:sys_enter_recvfrom,1500000000,100.00,,\n"
            "1577,,syscalls:sys_enter_epoll_wait,1500000000,100.00,,\n"
            "<not counted>,,syscalls:sys_enter_futex,0,0.00,,\n"
            "512,,syscalls:sys_enter_write,1500000000,100.00,,\n")
    assert P.parse_perf_stat(text, 512) == {"recvfrom": 3082 / 512, "epoll_wait": 1577 / 512, "write": 1.0}
