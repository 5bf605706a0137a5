"""The machine's floor for acks=all: a leader and two followers that do no broker work at all.

    python -m kbroker.perf.replication_floor leader [--log FILE]     (prints its Kafka and relay addresses)
    python -m kbroker.perf.replication_floor follower --relay HOST:PORT [--log FILE]

``replication_bench --floor`` starts one leader and two followers beside its brokers and runs every
acks=1 / acks=all latency pair on them too, with the same producer (confluent-kafka), rate and bursts.
What acks=all adds there is the price of its message pattern on this machine: a Produce wakes the
leader, the leader answers a follower's parked fetch, the follower wakes and fetches again, that fetch
wakes the leader, which answers the Produce; four processes (producer, leader, two followers) sharing
the cores. No broker can add less on the same cores.

The leader speaks just enough Kafka for the producer: ApiVersions, Metadata (every topic asked for has
one partition led by it) and Produce (acks 1 and all). It keeps a Produce's records as one chunk of its
log, numbered in order, and nothing else: no checks, no index; with ``--log`` each process also
appends what it receives to a file, as a broker writes its log (one write() into the page cache, no
fsync), so a floor on the brokers' filesystem meets the same write stalls. Followers speak a relay protocol
of their own on a second port: a fetch is the 8-byte number of chunks the follower holds; its answer is
the 4-byte size of the chunks after that, the 8-byte new count and those chunks. A fetch with nothing
to send parks until the next Produce. A fetch also reports the follower's position: an acks=all Produce
is answered once both followers' positions pass its chunk (Kafka's high watermark with both in the ISR).
Each process is one thread on select.epoll (the leader) or blocking sockets (followers); every complete
frame of one read is handled before anything is sent, then parked fetches are answered, then produces,
as an event-loop broker would. All of them exit when their stdin closes (the parent's exit).
"""
from __future__ import annotations

import argparse
import collections
import os
import select
import socket
import struct
import subprocess
import sys

from kbroker.protocol.api import decode_request, encode_response, parse_request_header

from .harness import exit_with_parent, recv_exact

PRODUCE, METADATA, API_VERSIONS = 0, 3, 18
VERSIONS = {PRODUCE: (3, 9), METADATA: (1, 9), API_VERSIONS: (0, 3)}
_POS = struct.Struct(">q")
_ANSWER = struct.Struct(">iq")
_I32 = struct.Struct(">i")
# A v2 RecordBatch's lastOffsetDelta sits at byte 23 (after baseOffset 8, length 4, leader epoch 4,
# magic 1, CRC 4, attributes 2).
_LAST_DELTA = 23


class Leader:
    def __init__(self, log_fd: int = -1):
        self.log_fd = log_fd
        self.kafka = self._listen()
        self.relay = self._listen()
        self.port = self.kafka.getsockname()[1]
        self.chunks: list[bytes] = []       # chunks not yet held by both followers
        self.first = 0                      # the number of chunks[0]
        self.offset = 0                     # the next record offset (the producer's base offsets)
        self.positions: dict[int, int] = {} # follower socket fd -> chunks it holds
        self.parked: set[int] = set()       # follower fds whose fetch waits for a chunk
        self.pending = collections.deque()  # acks=all produces: (chunk number, fd, answer)
        self.conns: dict[int, list] = {}    # fd -> [socket, buffer, is follower]
        self.out: dict[int, bytearray] = {}

    @staticmethod
    def _listen() -> socket.socket:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        s.setblocking(False)
        return s

    def end(self) -> int:
        return self.first + len(self.chunks)

    def serve(self) -> None:
        ep = select.epoll()
        for s in (self.kafka, self.relay):
            ep.register(s.fileno(), select.EPOLLIN)
        while True:
            for fd, _ in ep.poll():
                if fd in (self.kafka.fileno(), self.relay.fileno()):
                    listener = self.kafka if fd == self.kafka.fileno() else self.relay
                    c, _ = listener.accept()
                    c.setblocking(False)
                    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    self.conns[c.fileno()] = [c, bytearray(), listener is self.relay]
                    self.out[c.fileno()] = bytearray()
                    ep.register(c.fileno(), select.EPOLLIN)
                    continue
                c, buf, follower = self.conns[fd]
                try:
                    data = c.recv(1 << 20)
                except BlockingIOError:
                    continue
                if not data:
                    ep.unregister(fd)
                    self._drop(fd)
                    continue
                buf += data
                used = self._fetches(fd, buf) if follower else self._requests(fd, buf)
                del buf[:used]
                self._answer_parked()
                self._flush()

    def _drop(self, fd: int) -> None:
        self.conns.pop(fd)[0].close()
        self.out.pop(fd)
        self.positions.pop(fd, None)
        self.parked.discard(fd)

    def _flush(self) -> None:
        for fd, out in self.out.items():
            if out:
                c = self.conns[fd][0]
                c.setblocking(True)         # answers are small next to the socket buffers
                c.sendall(out)
                c.setblocking(False)
                out.clear()

    # followers
    def _fetches(self, fd: int, buf: bytearray) -> int:
        pos = 0
        while len(buf) - pos >= 8:
            have = _POS.unpack_from(buf, pos)[0]
            if have < self.first:           # a follower that started over after the others moved on
                raise SystemExit(f"replication floor: a follower asks from chunk {have}, dropped up to {self.first}")
            self.positions[fd] = have
            self.parked.add(fd)
            pos += 8
        self._release()
        return pos

    def _answer_parked(self) -> None:
        end = self.end()
        for fd in list(self.parked):
            have = self.positions[fd]
            if have < end:
                data = b"".join(self.chunks[have - self.first:])
                self.out[fd] += _ANSWER.pack(len(data), end) + data
                self.parked.discard(fd)

    def _release(self) -> None:
        if len(self.positions) < 2:
            return
        held = min(self.positions.values())
        while self.pending and self.pending[0][0] < held:
            _n, fd, answer = self.pending.popleft()
            if fd in self.out:
                self.out[fd] += answer
        if held > self.first:               # both followers hold these chunks
            del self.chunks[:held - self.first]
            self.first = held

    # the producer
    def _requests(self, fd: int, buf: bytearray) -> int:
        pos = 0
        while len(buf) - pos >= 4:
            size = _I32.unpack_from(buf, pos)[0]
            if len(buf) - pos - 4 < size:
                break
            frame = memoryview(buf)[pos + 4:pos + 4 + size]
            try:
                self._request(fd, frame)
            finally:
                frame.release()
            pos += 4 + size
        return pos

    def _request(self, fd: int, frame) -> None:
        header, at = parse_request_header(frame)
        key, version, cid = header.api_key, header.api_version, header.correlation_id
        if key == API_VERSIONS:
            body = {"error_code": 0, "api_keys": [{"api_key": k, "min_version": lo, "max_version": hi}
                                                  for k, (lo, hi) in VERSIONS.items()]}
            self._send(fd, encode_response(key, min(version, VERSIONS[key][1]), cid, body))
            return
        lo, hi = VERSIONS.get(key, (1, 0))
        if not lo <= version <= hi:
            raise SystemExit(f"replication floor: API {key} v{version} not spoken (the producer asked for it)")
        req = decode_request(key, version, frame, at)
        if key == METADATA:
            names = [t["name"] for t in req["topics"] or ()]
            self._send(fd, encode_response(key, version, cid, {
                "throttle_time_ms": 0, "brokers": [{"node_id": 0, "host": "127.0.0.1", "port": self.port}],
                "cluster_id": "floor", "controller_id": 0,
                "topics": [{"error_code": 0, "name": n, "partitions": [{
                    "error_code": 0, "partition_index": 0, "leader_id": 0, "leader_epoch": 0,
                    "replica_nodes": [0, 1, 2], "isr_nodes": [0, 1, 2], "offline_replicas": []}]}
                    for n in names]}))
            return
        responses = []
        for t in req["topic_data"]:
            parts = []
            for p in t["partition_data"]:
                records = bytes(p["records"])
                parts.append({"index": p["index"], "error_code": 0, "base_offset": self.offset,
                              "log_append_time_ms": -1, "log_start_offset": 0})
                self.offset += _I32.unpack_from(records, _LAST_DELTA)[0] + 1
                self.chunks.append(records)
                if self.log_fd >= 0:
                    os.write(self.log_fd, records)
            responses.append({"name": t["name"], "partition_responses": parts})
        if req["acks"] == 0:
            return
        answer = b"".join(bytes(c) for c in encode_response(key, version, cid, {
            "responses": responses, "throttle_time_ms": 0}))
        if req["acks"] == 1:
            self.out[fd] += answer
        else:
            self.pending.append((self.end() - 1, fd, answer))

    def _send(self, fd: int, chunks) -> None:
        for c in chunks:
            self.out[fd] += c


def follow(relay: tuple[str, int], log_fd: int = -1) -> None:
    s = socket.create_connection(relay)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    have = 0
    head = bytearray(_ANSWER.size)
    body = bytearray(1 << 20)
    try:
        while True:
            s.sendall(_POS.pack(have))
            recv_exact(s, memoryview(head))
            size, have = _ANSWER.unpack(head)
            if size > len(body):
                body = bytearray(size)
            recv_exact(s, memoryview(body)[:size])
            if log_fd >= 0:
                os.write(log_fd, memoryview(body)[:size])
    except ConnectionError:
        return                              # the leader went away


class Floor:
    """One leader and two followers, each a process of its own; ``bootstrap`` is the leader's Kafka
    address and ``brokers`` {0: leader, 1, 2: followers} their processes (``pid``), as a LocalCluster's.
    ``log_dir``: each process appends what it receives to a file there."""

    def __init__(self, log_dir=None):
        self.brokers: dict[int, subprocess.Popen] = {}
        self.bootstrap = ""
        self.log_dir = log_dir

    def _log(self, i: int) -> tuple:
        return () if self.log_dir is None else ("--log", os.path.join(self.log_dir, f"floor-{i}.log"))

    def _spawn(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "kbroker.perf.replication_floor", *args],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)

    def start(self) -> "Floor":
        leader = self.brokers[0] = self._spawn("leader", *self._log(0))
        line = leader.stdout.readline().split()         # printed once it listens
        if len(line) != 2:
            self.close()
            raise RuntimeError(f"the floor's leader printed no addresses (exit {leader.poll()})")
        self.bootstrap, relay = line
        for i in (1, 2):
            self.brokers[i] = self._spawn("follower", "--relay", relay, *self._log(i))
        return self

    def close(self) -> None:
        for proc in self.brokers.values():
            proc.stdin.close()              # its watcher thread exits the process
        for proc in self.brokers.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()                 # our own child, by its PID
                proc.wait(timeout=10)
        self.brokers.clear()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("role", choices=["leader", "follower"])
    ap.add_argument("--relay", default="", help="the leader's relay address (followers)")
    ap.add_argument("--log", default="", help="append what it receives to this file")
    a = ap.parse_args(argv)
    log_fd = os.open(a.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if a.log else -1
    exit_with_parent()
    if a.role == "leader":
        leader = Leader(log_fd)
        print(f"127.0.0.1:{leader.port} 127.0.0.1:{leader.relay.getsockname()[1]}", flush=True)
        leader.serve()
    else:
        host, _, port = a.relay.rpartition(":")
        follow((host, int(port)), log_fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
