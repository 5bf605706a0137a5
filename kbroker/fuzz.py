"""Structure-aware protocol fuzzer for a running kbroker.

Requests are generated from the schemas in ``kbroker.protocol.messages`` for every API and version the
broker advertises (valid headers, fields of the right types, arrays, record batches in every codec),
then mutated at three levels:
- fields: extreme integers, empty/long/null strings, arrays of odd lengths, random UUIDs;
- record batches: lying record counts, wrong offset deltas, corrupt compressed sections, small bombs,
  flipped bytes with the CRC fixed up (so the broker's record checks run, not just the CRC);
- bytes of the encoded frame: flips, interesting values (0x00, 0x7f, 0x80, 0xff) at length and varint
  positions, truncation, appended garbage, a wrong size prefix.

Invariants, checked as the run goes (each violation is counted and a sample kept):
- no crash: the broker process is alive at the end;
- no hang: every request sent gets a response frame or its connection closed within ``answer_s``;
- no unbounded memory: the broker's RSS stays below its starting RSS plus ``rss_bound_mib``;
- other connections keep completing: a probe connection's ApiVersions + Metadata every second is
  answered within ``probe_s``.

Requests the broker may legitimately hold for long (Fetch max_wait_ms, Produce/JoinGroup/... timeouts)
are decoded after mutation with the broker's own decoder; those asking for waits above 5 s, and
CreateTopics / CreatePartitions asking for more than 64 partitions in total, are not sent (they would
test patience, not robustness, and fill the disk in a long run). Known gap this hides: CreatePartitions
with a count of 134,217,729 makes the broker try to create them all (RSS 4.5 GiB, the loop stalls);
Kafka has no cap either, but a bound belongs in the admin handler.

Every connection (the fuzzed ones, the probe) is opened by ``connect``: plain TCP by default, or
``sasl_ssl_connector``'s TLS + SASL login first, so the fuzzed bytes reach the request path of an
authenticated SASL_SSL connection rather than its handshake.

Long run: ``python -m kbroker.fuzz --seconds 1800`` (starts its own ZooKeeper and broker) or
``--bootstrap host:port`` against one already running; prints a JSON summary.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import select
import socket
import struct
import sys
import time
import uuid as _uuid

from .protocol import api
from .protocol.messages import REQUESTS
from .protocol.schema import Struct, _in
from .protocol.types import ProtocolError, varint_bytes

TOPICS = ["fuzz-a", "fuzz-b", "__consumer_offsets", "", "x" * 249, "bad topic!", "fuzz-c"]
GROUPS = ["fuzz-g", "", "g" * 300]
INTERESTING32 = [0, 1, -1, 2, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF, 0x7FFFFFFF, -0x80000000, 1000, 1 << 20]
INTERESTING64 = INTERESTING32 + [0x7FFFFFFFFFFFFFFF, -0x8000000000000000, 1 << 40]
WAIT_FIELDS = ("max_wait_ms", "timeout_ms", "session_timeout_ms", "rebalance_timeout_ms", "transaction_timeout_ms")
MAX_WAIT_MS = 5000
# Controller-to-broker requests (LeaderAndIsr, StopReplica, UpdateMetadata, ControlledShutdown). Without
# an authorizer any client may send them, in Kafka too. Brokers take a controller epoch only once
# ZooKeeper confirms it (a forged epoch 32767 no longer fences the real controller), but a fuzzed request
# that guesses the current epoch and controller id (small numbers) is obeyed, as Kafka would obey it, and
# rearranges leadership. They are fuzzed only with --include-control, where the probe's verdict says
# whether the broker survived, not the cluster state.
CONTROL_APIS = frozenset({4, 5, 6, 7})


class Gen:
    def __init__(self, rnd: random.Random):
        self.r = rnd

    # -- values ---------------------------------------------------------------------------------
    def int_(self, bits, name=""):
        r = self.r
        if name in WAIT_FIELDS:
            return r.choice([0, 10, 100, 500])
        if name in ("num_partitions", "replication_factor", "count"):
            return r.choice([-1, 0, 1, 2, 3])
        if r.random() < 0.7:
            return r.choice([0, 1, -1, 2, 3])
        pool = INTERESTING64 if bits == 64 else INTERESTING32
        v = r.choice(pool)
        lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        return max(lo, min(hi, v))

    def string(self, name):
        r = self.r
        if "topic" in name or name == "name":
            return r.choice(TOPICS)
        if "group" in name:
            return r.choice(GROUPS)
        return r.choice(["", "fuzz", "\u00e9\u4e2d", "k" * r.choice([1, 100, 1000])])

    def records(self):
        return make_batch(self.r)

    def value(self, f, version, flexible):
        t = f.type
        nullable = _in(f.nullable, version)
        if nullable and self.r.random() < 0.1:
            return None
        if isinstance(t, Struct):
            return self.struct(t.fields, version, flexible)
        if isinstance(t, list):
            return [self.struct(t, version, flexible) for _ in range(self.r.choice([0, 1, 1, 2, 3]))]
        if t.startswith("[]"):
            et = t[2:]
            fake = type(f)(f.name, et)
            return [self.value(fake, version, flexible) for _ in range(self.r.choice([0, 1, 2, 5]))]
        if t in ("int8", "int16", "int32", "int64"):
            return self.int_(int(t[3:]), f.name)
        if t in ("uint16", "uint32"):
            return self.r.choice([0, 1, 0xFFFF])
        if t == "bool":
            return self.r.random() < 0.5
        if t == "float64":
            return self.r.choice([0.0, -1.0, 1e308])
        if t == "uuid":
            return _uuid.UUID(int=self.r.getrandbits(128)).bytes if self.r.random() < 0.3 else bytes(16)
        if t == "string":
            return self.string(f.name)
        if t == "bytes":
            return bytes(self.r.getrandbits(8) for _ in range(self.r.choice([0, 1, 16])))
        if t == "records":
            return self.records()
        raise ValueError(t)

    def struct(self, fields, version, flexible):
        out = {}
        for f in fields:
            if _in(f.versions, version):
                out[f.name] = self.value(f, version, flexible)
        return out


def make_batch(r: random.Random) -> bytes:
    """A RecordBatch v2, valid or wrong in a structure-aware way, with a correct CRC unless the CRC is
    the point."""
    from ._native.crc import crc32c
    from .record.compression import compress

    codec = r.choice([0, 0, 1, 2, 3, 4])
    n = r.choice([1, 1, 2, 5])
    recs = []
    for i in range(n):
        key = None if r.random() < 0.2 else b"k%d" % i
        value = b"v" * r.choice([0, 10, 1000])
        delta = i if r.random() < 0.9 else r.choice([0, -1, i + 1, 0x7FFFFFFF])
        key_field = varint_bytes(-1) if key is None else varint_bytes(len(key)) + key
        body = (b"\0" + varint_bytes(0) + varint_bytes(delta) + key_field
                + varint_bytes(len(value)) + value + varint_bytes(0))
        if r.random() < 0.05:
            body = body[:r.randrange(len(body))]
        recs.append(varint_bytes(len(body) if r.random() < 0.95 else r.choice([0, -1, 1 << 20])) + body)
    raw = b"".join(recs)
    if r.random() < 0.03:
        raw = b"\0" * (r.choice([1, 4, 16]) << 20)     # bomb (small enough for a long run)
    section = compress(codec, raw)
    if codec and r.random() < 0.05:
        section = bytes(b ^ 0x5A if r.random() < 0.1 else b for b in section)
    count = n if r.random() < 0.85 else r.choice([0, -1, n + 1, 1_000_000, 0x7FFFFFFF])
    now = int(time.time() * 1000)
    pid = -1 if r.random() < 0.8 else r.choice([0, 1, 1 << 40])
    attrs = codec | (r.choice([0, 0x08, 0x10, 0x20, 0x40]) if r.random() < 0.1 else 0)
    after = struct.pack(">hiqqqhii", attrs, count - 1, now, now, pid, 0 if pid >= 0 else -1,
                        0 if pid >= 0 else -1, count) + section
    crc = crc32c(after) if r.random() < 0.95 else r.getrandbits(32)
    magic = 2 if r.random() < 0.97 else r.choice([0, 1, 3])
    length = 9 + len(after) if r.random() < 0.95 else r.choice([0, -1, 9 + len(after) + 10])
    batch = struct.pack(">qiibI", 0, length, -1, magic, crc) + after
    if r.random() < 0.1:
        batch = batch + batch            # two batches in one produce
    return batch


def mutate_bytes(r: random.Random, frame: bytearray) -> bytearray:
    """Byte-level mutations of an encoded frame (size prefix included)."""
    for _ in range(r.choice([1, 1, 2, 4])):
        op = r.random()
        if len(frame) <= 4:
            break
        pos = r.randrange(4, len(frame))
        if op < 0.3:
            frame[pos] ^= 1 << r.randrange(8)
        elif op < 0.55:
            frame[pos] = r.choice([0x00, 0x7F, 0x80, 0xFF])
        elif op < 0.7 and pos + 4 <= len(frame):
            struct.pack_into(">i", frame, pos, r.choice(INTERESTING32))
        elif op < 0.78:
            frame[pos:pos] = b"\xff" * r.choice([1, 5, 6, 10])         # over-long varint
        elif op < 0.86:
            del frame[pos:]                                             # truncation
        elif op < 0.93:
            frame += bytes(r.getrandbits(8) for _ in range(r.choice([1, 8, 100])))
        else:
            frame[pos:pos] = frame[4:min(len(frame), 4 + r.choice([8, 64]))]  # duplicated region
    if r.random() < 0.9:
        struct.pack_into(">i", frame, 0, len(frame) - 4)     # usually keep the size prefix honest
    elif r.random() < 0.5:
        struct.pack_into(">i", frame, 0, r.choice([len(frame) - 3, len(frame) - 5, 0, -1, 0x7FFFFFFF]))
    return frame


def _too_patient(key, version, frame) -> bool:
    """Would the broker legitimately hold this (decodable) request for long, or create many partitions?"""
    try:
        header, pos = api.parse_request_header(memoryview(frame)[4:])
        body = api.decode_request(key, version, memoryview(frame)[4:], pos)
    except (ProtocolError, Exception):     # noqa: BLE001  (undecodable: the broker closes; fine to send)
        return False
    stack = [body]
    parts = 0
    while stack:
        d = stack.pop()
        if isinstance(d, dict):
            for k, v in d.items():
                if k in WAIT_FIELDS and isinstance(v, int) and v > MAX_WAIT_MS:
                    return True
                if k == "num_partitions" and isinstance(v, int):
                    parts += max(v, 1)
                if k == "count" and key == 37 and isinstance(v, int):     # CreatePartitions: new total
                    parts += max(v, 1)
                if isinstance(v, (list, dict)):
                    stack.append(v)
        elif isinstance(d, list):
            stack.extend(d)
    return key in (19, 37) and parts > 64


def _acks_zero(key, version, frame) -> bool:
    """A Produce with acks=0 gets no response (an error closes the connection instead)."""
    if key != 0:
        return False
    try:
        header, pos = api.parse_request_header(memoryview(frame)[4:])
        return api.decode_request(key, version, memoryview(frame)[4:], pos)["acks"] == 0
    except Exception:     # noqa: BLE001  (undecodable: the broker closes)
        return False


class Fuzzer:
    def __init__(self, bootstrap: str, seed: int, *, answer_s: float = 10.0, probe_s: float = 3.0,
                 rss_pid: int | None = None, rss_bound_mib: float = 512, mutate_rate: float = 0.7,
                 include_control: bool = False, connect=None):
        host, port = bootstrap.rsplit(":", 1)
        self.addr = (host, int(port))
        # connect(timeout) -> a socket ready for requests (module docstring)
        self.connect = connect or (lambda timeout: socket.create_connection(self.addr, timeout=timeout))
        self.r = random.Random(seed)
        self.gen = Gen(self.r)
        self.answer_s, self.probe_s = answer_s, probe_s
        self.rss_pid, self.rss_bound_mib = rss_pid, rss_bound_mib
        self.mutate_rate = mutate_rate
        self.include_control = include_control
        self.lingering = []     # (deadline, fd, api, version): connections whose frame can never complete
        self.apis = self._advertised()
        self.stats = {"seed": seed, "requests": 0, "answered": 0, "closed": 0, "skipped_patient": 0, "no_response_expected": 0,
                      "hangs": 0, "probe_failures": 0, "probes": 0, "crashed": False, "rss_start_mib": 0.0,
                      "rss_peak_mib": 0.0, "rss_violations": 0, "apis": len(self.apis), "samples": []}

    def _advertised(self):
        with self.connect(10) as s:
            s.sendall(api.encode_request(18, 0, 1, "fuzz", {}))
            _cid, resp = api.decode_response(18, 0, _recv_frame(s, 10))
        return [(k["api_key"], v) for k in resp["api_keys"]
                if k["api_key"] in REQUESTS and (self.include_control or k["api_key"] not in CONTROL_APIS)
                for v in range(k["min_version"], k["max_version"] + 1)]

    def _frame(self):
        key, version = self.r.choice(self.apis)
        schema = REQUESTS[key]
        body = self.gen.struct(schema.fields, version, schema.is_flexible(version))
        try:
            frame = bytearray(api.encode_request(key, version, self.r.getrandbits(31), "fuzz", body))
        except (ValueError, struct.error, OverflowError, TypeError):
            return key, version, None
        if self.r.random() < self.mutate_rate:
            frame = mutate_bytes(self.r, frame)
            if len(frame) >= 8:        # what the broker will see (a mutation may hit the header)
                key, version = struct.unpack_from(">hh", frame, 4)
        return key, version, bytes(frame)

    def _rss_mib(self):
        if self.rss_pid is None:
            return 0.0
        try:
            with open(f"/proc/{self.rss_pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024
        except FileNotFoundError:
            self.stats["crashed"] = True
        return 0.0

    def _violation(self, kind, detail):
        self.stats[kind] += 1
        if len(self.stats["samples"]) < 20:
            self.stats["samples"].append(f"{kind}: {detail}")

    def probe(self):
        self.stats["probes"] += 1
        t0 = time.monotonic()
        try:
            with self.connect(self.probe_s) as s:
                s.sendall(api.encode_request(18, 0, 1, "probe", {}) + api.encode_request(3, 1, 2, "probe", {"topics": []}))
                _recv_frame(s, self.probe_s)
                _recv_frame(s, self.probe_s - (time.monotonic() - t0))
        except (OSError, ValueError) as e:
            self._violation("probe_failures", repr(e))

    def _check_lingering(self, now):
        keep = []
        for deadline, fd, key, version, sizes in self.lingering:
            s = socket.socket(fileno=fd)
            s.setblocking(False)
            try:
                closed = s.recv(1 << 16) == b""
            except BlockingIOError:
                closed = False
            except OSError:
                closed = True
            if closed:
                self.stats["closed"] += 1
                s.close()
            elif now > deadline:
                self._violation("hangs", f"api {key} v{version}: incomplete frame (sent, declared: {sizes}) not "
                                         "closed by the frame deadline")
                s.close()
            else:
                keep.append((deadline, s.detach(), key, version, sizes))
        self.lingering = keep

    def one_connection(self, n_requests: int):
        """Send up to n requests one at a time on one connection; each must be answered or closed."""
        try:
            s = self.connect(5)
        except (OSError, ValueError) as e:
            self._violation("probe_failures", f"connect: {e!r}")
            return
        with s:
            for _ in range(n_requests):
                key, version, frame = self._frame()
                if frame is None:
                    continue
                if _too_patient(key, version, frame):
                    self.stats["skipped_patient"] += 1
                    continue
                self.stats["requests"] += 1
                try:
                    s.sendall(frame)
                except OSError:
                    self.stats["closed"] += 1
                    return
                if _acks_zero(key, version, frame):
                    self.stats["no_response_expected"] += 1
                    continue
                if struct.unpack_from(">i", frame, 0)[0] > len(frame) - 4:
                    # the prefix promises bytes that never come: only the frame deadline can end this
                    # connection; check on it later instead of waiting here
                    self.lingering.append((time.monotonic() + self.answer_s, s.detach(), key, version,
                                           (len(frame), struct.unpack_from(">i", frame, 0)[0])))
                    return
                outcome = _answer_or_close(s, self.answer_s)
                if outcome == "answered":
                    self.stats["answered"] += 1
                    continue
                if outcome == "closed":
                    self.stats["closed"] += 1
                    return
                declared = struct.unpack_from(">i", frame, 0)[0]
                self._violation("hangs", f"api {key} v{version} len {len(frame)} declared {declared}: "
                                         f"{frame[:64].hex()}")
                return

    def run(self, seconds: float, per_connection: int = 20):
        self.stats["rss_start_mib"] = self._rss_mib()
        end = time.monotonic() + seconds
        next_probe = 0.0
        while time.monotonic() < end and not self.stats["crashed"]:
            self.one_connection(self.r.choice([1, 3, per_connection]))
            now = time.monotonic()
            if now >= next_probe:
                self.probe()
                next_probe = now + 1.0
            self._check_lingering(time.monotonic())
            rss = self._rss_mib()
            self.stats["rss_peak_mib"] = max(self.stats["rss_peak_mib"], rss)
            if self.rss_pid is not None and rss - self.stats["rss_start_mib"] > self.rss_bound_mib:
                self._violation("rss_violations", f"rss {rss:.0f} MiB")
        while self.lingering:
            self._check_lingering(time.monotonic())
            time.sleep(0.1)
        self.stats["seconds"] = seconds
        if self.rss_pid is not None:
            self.stats["crashed"] = self.stats["crashed"] or not os.path.exists(f"/proc/{self.rss_pid}")
        return self.stats


def sasl_ssl_connector(addr, context, mechanism: str, user: str, password: str, server_hostname="localhost"):
    """``connect`` for a SASL_SSL listener: TLS with ``context``, then SaslHandshake v1 and
    SaslAuthenticate v1 as ``user`` (PLAIN or SCRAM-SHA-256/512); ValueError when the login fails."""
    from .client.sasl import scram_client

    def connect(timeout):
        raw = socket.create_connection(addr, timeout=timeout)
        try:
            s = context.wrap_socket(raw, server_hostname=server_hostname)
        except OSError:
            raw.close()
            raise
        try:
            s.sendall(api.encode_request(17, 1, 1, "fuzz", {"mechanism": mechanism}))
            if api.decode_response(17, 1, _recv_frame(s, timeout))[1]["error_code"]:
                raise ValueError(f"SaslHandshake {mechanism} refused")
            steps = (iter([f"\0{user}\0{password}".encode(), None]) if mechanism == "PLAIN"
                     else scram_client(mechanism, user, password))
            token, cid = next(steps), 2
            while token is not None:
                s.sendall(api.encode_request(36, 1, cid, "fuzz", {"auth_bytes": token}))
                resp = api.decode_response(36, 1, _recv_frame(s, timeout))[1]
                if resp["error_code"]:
                    raise ValueError(f"SaslAuthenticate: {resp['error_message']}")
                token = steps.send(bytes(resp["auth_bytes"])) if mechanism != "PLAIN" else next(steps)
                cid += 1
        except BaseException:
            s.close()
            raise
        return s
    return connect


def _recv_exact(s, n, deadline):
    out = bytearray()
    while len(out) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no answer")
        s.settimeout(left)
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return bytes(out)


def _recv_frame(s, timeout):
    deadline = time.monotonic() + timeout
    size = struct.unpack(">i", _recv_exact(s, 4, deadline))[0]
    if size < 0 or size > 1 << 30:
        raise ValueError(f"bad response size {size}")
    return _recv_exact(s, size, deadline)


def _answer_or_close(s, timeout) -> str:
    try:
        _recv_frame(s, timeout)
        return "answered"
    except (ConnectionError, OSError, ValueError) as e:
        if isinstance(e, TimeoutError) or isinstance(e, socket.timeout):
            return "hang"
        return "closed"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m kbroker.fuzz", description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--seed", type=int, default=int(time.time()))
    p.add_argument("--bootstrap", help="fuzz a running broker (default: start ZooKeeper and a broker)")
    p.add_argument("--rss-bound-mib", type=float, default=512)
    p.add_argument("--include-control", action="store_true", help="also fuzz the controller-to-broker APIs 4-7")
    args = p.parse_args(argv)
    if args.bootstrap:
        stats = Fuzzer(args.bootstrap, args.seed, rss_bound_mib=args.rss_bound_mib,
                       include_control=args.include_control).run(args.seconds)
    else:
        import tempfile

        from .testing import LocalCluster
        with tempfile.TemporaryDirectory(prefix="kbroker-fuzz-") as root:
            with LocalCluster(root, num_partitions=1, overrides=FUZZ_BROKER) as c:
                stats = Fuzzer(c.bootstrap, args.seed, rss_pid=c.brokers[0].pid, rss_bound_mib=args.rss_bound_mib,
                               include_control=args.include_control).run(args.seconds)
                stats["broker_alive"] = c.brokers[0].running()
    print(json.dumps(stats, indent=1))
    ok = not stats["crashed"] and stats["hangs"] == 0 and stats["probe_failures"] == 0 and stats["rss_violations"] == 0
    return 0 if ok else 1


# The broker the long run starts: a 5 s frame deadline, so a lying size prefix closes well within the
# fuzzer's answer bound.
FUZZ_BROKER = {"kbroker.socket.request.frame.timeout.ms": 5000, "auto.create.topics.enable": "true"}


if __name__ == "__main__":
    sys.exit(main())
