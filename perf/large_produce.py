"""Broker cost of large Produce requests: minor page faults and CPU per request, MB/s.

    python -m kbroker.perf.large_produce [--requests 400] [--records 500] [--value-bytes 1000]

One broker (``LocalCluster``: real ZooKeeper, log dir in a temp dir), one raw connection sending Produce v8
requests of one uncompressed batch each (500 x 1000 B ≈ 493 KiB by default, acks=1), 4 in flight, after 50
uncounted ones. Page faults (``minflt`` of /proc/<pid>/stat) do not depend on how loaded the shared machine
is; CPU and MB/s do. A frame of this size does not fit a receive chunk and gets a buffer of its own: fresh
pages fault in once per 4 KiB unless the buffer is recycled (kbroker.network.pool.FrameCache).
"""
from __future__ import annotations

import argparse
import os
import socket
import tempfile
import time
from pathlib import Path

from kbroker._native.batch import BatchBuilder
from kbroker.protocol.api import encode_request
from kbroker.testing import LocalCluster


def _stat(pid: int) -> tuple[int, float]:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(f[7]), (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def _recv_exact(s: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = s.recv_into(view[got:])
        if not k:
            raise EOFError("broker closed the connection")
        got += k
    return buf


def run(requests: int, records: int, value_bytes: int) -> dict:
    from confluent_kafka.admin import AdminClient, NewTopic

    with tempfile.TemporaryDirectory(prefix="kbroker-large-produce-") as tmp, \
            LocalCluster(Path(tmp), num_partitions=1) as c:
        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        admin.create_topics([NewTopic("large", 1, 1)])["large"].result(30)
        b = BatchBuilder(batch_size=records * (value_bytes + 64) + 1024)
        value = os.urandom(value_bytes)
        for _ in range(records):
            b.append(int(time.time() * 1000), None, value)
        batch = b.build()
        body = {"transactional_id": None, "acks": 1, "timeout_ms": 5000,
                "topic_data": [{"name": "large", "partition_data": [{"index": 0, "records": batch}]}]}
        frames = [encode_request(0, 8, i % 2**31, "kbroker-perf-large", body) for i in range(4)]
        pid = c.brokers[0].pid
        s = socket.create_connection(("127.0.0.1", c.brokers[0].port), timeout=60)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def loop(n: int) -> None:
            sent = got = 0
            while got < n:
                while sent < n and sent - got < 4:
                    s.sendall(frames[sent % 4])
                    sent += 1
                _recv_exact(s, int.from_bytes(_recv_exact(s, 4), "big"))
                got += 1

        try:
            loop(50)
            f0, c0 = _stat(pid)
            t0 = time.monotonic()
            loop(requests)
            t1 = time.monotonic()
            f1, c1 = _stat(pid)
        finally:
            s.close()
    return {"requests": requests, "request_bytes": len(batch), "minflt_per_request": (f1 - f0) / requests,
            "cpu_us_per_request": (c1 - c0) / requests * 1e6, "mb_per_s": requests * len(batch) / 1e6 / (t1 - t0)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m kbroker.perf.large_produce", description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--records", type=int, default=500)
    ap.add_argument("--value-bytes", type=int, default=1000)
    a = ap.parse_args(argv)
    r = run(a.requests, a.records, a.value_bytes)
    print(f"{r['requests']} Produce requests of {r['request_bytes'] / 1024:.0f} KiB: minor faults/request "
          f"{r['minflt_per_request']:.1f}, broker CPU {r['cpu_us_per_request']:.0f} us/request, {r['mb_per_s']:.0f} MB/s")


if __name__ == "__main__":
    main()
