"""The machine's floor for a small Fetch round trip: a server that does no broker work at all.

    python -m kbroker.perf.fetch_floor serve --mode block|epoll     (prints its port, serves until stdin closes)

fetch_latency's ``floor-block`` / ``floor-epoll`` targets start one of these beside the brokers and
measure it exactly as they measure a broker (schedstat run time of the process per fetch, 1 and 8 in
flight). It answers every Fetch v11 frame of request_bench's shape with one precomputed answer (one
one-record batch, ~260 B, like a broker's), patching only the correlation id and the batch's base
offset (which its CRC does not cover), so the client's checks pass. What it costs per fetch is the
price of the round trip itself on this machine: the loopback TCP receive and send, the sleep and
wake-up of a thread that waits for its next request, and a few µs of interpreter. No broker written
for this machine can answer a request from a client that waits for each answer for less.

Modes: ``block``: one thread, blocking recv_into/send (no readiness syscall: the cheapest shape);
``epoll``: non-blocking sockets under select.epoll, every complete frame of one read answered in one
send (the shape of an event-loop broker, kbroker's and the mock's: epoll_wait, recv, send).
Every loop ends with its connection or when stdin closes (the parent's exit).
"""
from __future__ import annotations

import argparse
import select
import socket
import struct
import subprocess
import sys

from kbroker.coordinator.store import build_batch
from kbroker.protocol.api import encode_response

from .harness import exit_with_parent

_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
FETCH = 1
VERSION = 11
# A Fetch v11 request of request_bench's shape ends with the one partition's fetch_offset (8),
# log_start_offset (8), partition_max_bytes (4), the empty forgotten-topics array (4) and rack id "" (2)
OFFSET_FROM_END = 8 + 8 + 4 + 4 + 2
VALUE = b"v" * 100


def answer_template() -> tuple[bytes, int]:
    """-> (a whole Fetch v11 answer, size prefix included; where its batch's base offset sits)."""
    batch = bytes(build_batch([(b"", VALUE)], 0))
    body = {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "responses": [{
        "topic": "floor", "partitions": [{
            "partition_index": 0, "error_code": 0, "high_watermark": 1 << 40, "last_stable_offset": 1 << 40,
            "log_start_offset": 0, "aborted_transactions": None, "preferred_read_replica": -1,
            "records": batch}]}]}
    whole = b"".join(bytes(c) for c in encode_response(FETCH, VERSION, 0, body))
    return whole, len(whole) - len(batch)    # the records are the answer's last field


def _answers(buf: bytearray, end: int, template: bytes, at: int, out: bytearray) -> int:
    """Every complete frame in buf[:end] answered into ``out``; -> bytes consumed."""
    pos = 0
    while end - pos >= 4:
        size = _I32.unpack_from(buf, pos)[0]
        if end - pos - 4 < size:
            break
        frame_end = pos + 4 + size
        n = len(out)
        out += template
        out[n + 4:n + 8] = buf[pos + 8:pos + 12]                      # correlation id
        out[n + at:n + at + 8] = buf[frame_end - OFFSET_FROM_END:frame_end - OFFSET_FROM_END + 8]
        pos = frame_end
    return pos


def serve_block(conn: socket.socket, template: bytes, at: int) -> None:
    buf = bytearray(1 << 16)
    view = memoryview(buf)
    end = 0
    out = bytearray()
    while True:
        n = conn.recv_into(view[end:])
        if not n:
            return
        end += n
        used = _answers(buf, end, template, at, out)
        if out:
            conn.sendall(out)
            out.clear()
        if used:
            buf[:end - used] = buf[used:end]
            end -= used


def serve_epoll(listener: socket.socket, template: bytes, at: int) -> None:
    ep = select.epoll()
    listener.setblocking(False)
    ep.register(listener.fileno(), select.EPOLLIN)
    conns = {}                                          # fd -> [socket, buffer, filled]
    out = bytearray()
    while True:
        for fd, _ in ep.poll():
            if fd == listener.fileno():
                c, _ = listener.accept()
                c.setblocking(False)
                c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conns[c.fileno()] = [c, bytearray(1 << 16), 0]
                ep.register(c.fileno(), select.EPOLLIN)
                continue
            st = conns[fd]
            c, buf, end = st
            try:
                n = c.recv_into(memoryview(buf)[end:])
            except BlockingIOError:
                continue
            if not n:
                ep.unregister(fd)
                c.close()
                del conns[fd]
                continue
            end += n
            used = _answers(buf, end, template, at, out)
            if out:
                c.setblocking(True)     # a ~260 B answer per frame always fits the socket buffer
                c.sendall(out)
                c.setblocking(False)
                out.clear()
            if used:
                buf[:end - used] = buf[used:end]
                end -= used
            st[2] = end


class FloorTarget:
    """fetch_latency's target for one floor server (its own process; ``pid`` is what gets measured).
    ``synthetic``: it has no topics and takes no produce: every offset is answered."""
    synthetic = True

    def __init__(self, mode: str):
        self.mode = mode
        self.name = f"floor-{mode}"
        self.proc = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "kbroker.perf.fetch_floor", "serve", "--mode", self.mode],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     start_new_session=True)
        line = self.proc.stdout.readline().strip()      # printed once it listens
        if not line:
            raise RuntimeError(f"the {self.name} server printed no address (exit {self.proc.poll()})")
        self.bootstrap = line

    def create_topic(self, topic: str, partitions: int = 1) -> str:
        return "none"

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()         # its watcher thread exits the process
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()            # our own child, by its PID
                self.proc.wait(timeout=10)
            self.proc = None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=["serve"])
    ap.add_argument("--mode", choices=["block", "epoll"], default="block")
    a = ap.parse_args(argv)
    template, at = answer_template()
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    exit_with_parent()
    print(f"127.0.0.1:{listener.getsockname()[1]}", flush=True)
    if a.mode == "epoll":
        serve_epoll(listener, template, at)
    else:
        while True:             # one connection at a time: request_bench opens them one after another
            conn, _ = listener.accept()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with conn:
                try:
                    serve_block(conn, template, at)
                except ConnectionError:
                    pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
