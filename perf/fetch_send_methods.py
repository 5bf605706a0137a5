"""Server CPU per GB to send large file ranges over loopback, by send method (what bounds fetch capacity).

    python -m kbroker.perf.fetch_send_methods [--methods memory,sendfile-nb,mmap-b,...] [--rounds 5]
        [--sends 96] [--size-mib 4] [--sndbuf 102400] [--dir /dev/shm] [--max-seconds 60]

The capacity benchmark (broker_bench (c)) divides the broker's fetch MB/s by a replay server's that
sends the very same response frames from memory with a blocking ``sendall``; the broker sends record
ranges from its segment files with ``os.sendfile`` on a non-blocking socket. This tool isolates that
difference: one server (this process, one thread) sends ``--sends`` ranges of ``--size-mib`` MiB from a
64 MiB file (``--dir``, tmpfs by default, as the benchmark's log dirs) to one client process that asks
for each with one byte and reads it with ``recv_into``; the figure is the server thread's CPU time
(``time.thread_time``) per GB sent, and GB/s. Methods:

* ``memory``: blocking ``sendall`` from an in-memory copy of the file (the replay baseline's way);
* ``sendfile-b`` / ``sendfile-nb``: ``os.sendfile`` on a blocking socket / a non-blocking one that
  waits in ``epoll`` for writability (the broker's way);
* ``splice-nb``: file -> a 1 MiB pipe -> non-blocking socket with ``os.splice``;
* ``mmap-b`` / ``mmap-nb``: ``sendall`` / non-blocking ``os.write`` of a slice of an ``mmap`` of the file.

A method may carry ``@BYTES``: SO_SNDBUF set to that (the broker sets socket.send.buffer.bytes, Kafka's
default 102400; the kernel doubles it and stops autotuning). Methods are visited in an order rotated
per round; the figures to read are medians and same-round ratios to the first method. Every loop is
bounded by a count and by ``--max-seconds``; the client process is ours and waited for.
"""
from __future__ import annotations

import argparse
import fcntl
import mmap
import os
import select
import socket
import statistics
import struct
import sys
import time
from pathlib import Path

FILE_BYTES = 64 << 20
F_SETPIPE_SZ = 1031
BLOCKING = ("memory", "sendfile-b", "mmap-b")
METHODS = BLOCKING + ("sendfile-nb", "splice-nb", "mmap-nb")


def _client(port: int, sends: int, size: int) -> None:
    s = socket.create_connection(("127.0.0.1", port))
    buf = bytearray(1 << 20)
    for _ in range(sends):
        s.sendall(b"x")
        left = size
        while left:
            k = s.recv_into(buf, min(left, len(buf)))
            if not k:
                raise ConnectionError("server closed early")
            left -= k
    s.close()


class _Wait:
    """Waits for one event on one descriptor (epoll, registered per wait as the broker does)."""

    def __init__(self, fd: int, deadline: float):
        self.ep, self.fd, self.deadline = select.epoll(), fd, deadline

    def __call__(self, events: int) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("send pass over its time bound")
        self.ep.register(self.fd, events)
        try:
            ready = self.ep.poll(left)
        finally:
            self.ep.unregister(self.fd)
        if not ready:
            raise TimeoutError("send pass over its time bound")

    def close(self):
        self.ep.close()


def _send(method: str, sock: socket.socket, fd: int, mm, memory: bytes, pos: int, size: int,
          pipe: tuple | None, wait: _Wait) -> None:
    cfd = sock.fileno()
    if method == "memory":
        sock.sendall(memoryview(memory)[pos:pos + size])
    elif method == "mmap-b":
        sock.sendall(memoryview(mm)[pos:pos + size])
    elif method == "sendfile-b":
        sent = 0
        while sent < size:
            sent += os.sendfile(cfd, fd, pos + sent, size - sent)
    elif method == "sendfile-nb":
        sent = 0
        while sent < size:
            try:
                sent += os.sendfile(cfd, fd, pos + sent, size - sent)
            except BlockingIOError:
                wait(select.EPOLLOUT)
    elif method == "mmap-nb":
        view = memoryview(mm)[pos:pos + size]
        while view:
            try:
                view = view[os.write(cfd, view):]
            except BlockingIOError:
                wait(select.EPOLLOUT)
    elif method == "splice-nb":
        r, w = pipe
        sent = in_pipe = 0
        while sent < size:
            if in_pipe == 0:
                in_pipe = os.splice(fd, w, min(size - sent, 1 << 20), offset_src=pos + sent)
            try:
                k = os.splice(r, cfd, in_pipe)
            except BlockingIOError:
                wait(select.EPOLLOUT)
                continue
            in_pipe -= k
            sent += k
    else:
        raise ValueError(method)


def one_pass(spec: str, path: Path, memory: bytes, sends: int, size: int, max_s: float) -> dict:
    method, _, sndbuf = spec.partition("@")
    if method not in METHODS:
        raise SystemExit(f"unknown method {method!r} (known: {', '.join(METHODS)})")
    fd = os.open(path, os.O_RDONLY)
    mm = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)
    port = ls.getsockname()[1]
    pid = os.fork()
    if pid == 0:                                    # the client: its CPU is not the server's
        code = 0
        try:
            ls.close()
            _client(port, sends, size)
        except BaseException:  # noqa: BLE001 - a child reports through its exit status only
            code = 1
        os._exit(code)
    pipe = None
    conn = wait = None
    try:
        ls.settimeout(max_s)
        conn, _ = ls.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if sndbuf:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, int(sndbuf))
        deadline = time.monotonic() + max_s
        wait = _Wait(conn.fileno(), deadline)
        nonblocking = method not in BLOCKING
        conn.setblocking(not nonblocking)
        if not nonblocking:     # a blocking send waits at most max_s for room (then EAGAIN: failed)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", int(max_s), 0))
        if method == "splice-nb":
            pipe = os.pipe()
            fcntl.fcntl(pipe[1], F_SETPIPE_SZ, 1 << 20)
        t0, c0 = time.monotonic(), time.thread_time()
        for i in range(sends):
            wait(select.EPOLLIN)                    # the client's one-byte ask (bounded wait)
            if not conn.recv(1):
                raise ConnectionError("client closed early")
            _send(method, conn, fd, mm, memory, (i * size) % FILE_BYTES, size, pipe, wait)
        cpu, wall = time.thread_time() - c0, time.monotonic() - t0
    finally:
        for c in (conn, ls):
            if c is not None:
                c.close()
        if wait is not None:
            wait.close()
        if pipe:
            os.close(pipe[0])
            os.close(pipe[1])
        _, status = os.waitpid(pid, 0)
        mm.close()
        os.close(fd)
    if status != 0:
        raise RuntimeError(f"client of {spec} failed (status {status})")
    gb = sends * size / 1e9
    return {"cpu_s_per_gb": cpu / gb, "gb_per_s": gb / wall}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", default="memory,sendfile-nb@102400,sendfile-nb,sendfile-b,splice-nb@102400,"
                                          "mmap-b,mmap-nb@102400")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sends", type=int, default=96)
    ap.add_argument("--size-mib", type=int, default=4)
    ap.add_argument("--dir", default="/dev/shm")
    ap.add_argument("--max-seconds", type=float, default=60.0)
    a = ap.parse_args(argv)
    size = a.size_mib << 20
    if size > FILE_BYTES:
        raise SystemExit(f"--size-mib at most {FILE_BYTES >> 20}")
    specs = [m for m in a.methods.split(",") if m]
    path = Path(a.dir) / f"kbroker-send-methods-{os.getpid()}.bin"
    try:
        with open(path, "wb") as f:
            f.write(os.urandom(FILE_BYTES))
        memory = path.read_bytes()
        res = {m: [] for m in specs}
        for rnd in range(a.rounds):
            for m in specs[rnd % len(specs):] + specs[:rnd % len(specs)]:
                res[m].append(one_pass(m, path, memory, a.sends, size, a.max_seconds))
            print(f"round {rnd}: " + "  ".join(f"{m} {res[m][-1]['cpu_s_per_gb']:.3f}" for m in specs),
                  file=sys.stderr, flush=True)
    finally:
        path.unlink(missing_ok=True)
    print(f"{a.sends} sends of {a.size_mib} MiB per pass, {a.rounds} rounds, file in {a.dir}; "
          f"load average at the end {os.getloadavg()}")
    ref = specs[0]
    for m in specs:
        for key, unit in (("cpu_s_per_gb", "server CPU s/GB"), ("gb_per_s", "GB/s")):
            v = [r[key] for r in res[m]]
            line = f"{m:22s} {unit:16s} median {statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})"
            if m != ref:
                ratios = [x[key] / y[key] for x, y in zip(res[m], res[ref]) if y[key]]
                line += f"  ÷ {ref}: {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
