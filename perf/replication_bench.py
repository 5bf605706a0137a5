"""Replication benchmark (not a test): three local brokers (kbroker.testing.LocalCluster).

1. Latency at a fixed rate on an RF=3 topic (min.insync.replicas=2): confluent-kafka producer,
   acks=all vs acks=1 (idempotence off for both), time from produce() to the delivery callback;
   p50/p99 and the difference, in --pairs alternating pairs; beside each run, the CPU seconds its
   leader and its followers used.
2. Leader CPU per GB: the leader process's user+system CPU (/proc/<pid>/stat) while a producer
   pushes --gb of data at full speed (acks=1), on an RF=3 and on an RF=1 topic led by the same
   broker; plus the whole cluster's CPU per GB for RF=3.

3. Follower catch-up: a follower stopped (SIGTERM), --catchup-mb produced to an RF=3 topic with
   acks=all (ISR 2 still meets min.insync.replicas=2), the follower restarted; its copy rate (bytes
   on its disk over time from its first new byte to equality with the leader's log) and the time
   until it is back in the ISR.
4. Failover split (--failovers rounds, kill -9 of the leader under a retrying idempotent acks=all
   producer at --probe-rate records/s): kill -> /brokers/ids/<id> gone (session expiry), expiry ->
   another leader in Metadata, new leader -> first acknowledged acks=all write after the expiry.
   Then a SIGTERM bounce of the leader (controlled shutdown, restart, back in the ISR): the longest
   gap between two acknowledgements of that producer (unavailability) and its failed records.
5. Zombie leader (--zombie-rounds N, none by default; a leader cut from ZooKeeper and its followers but
   not from clients): a fresh three-broker cluster per setting, ZooKeeper session timeout 6 s, the leader of an
   RF=3 partition (min.insync.replicas=2) cut for --zombie-cut-s from ZooKeeper and from the other
   brokers (their connections to it; clients' go on) under the idempotent acks=all probe; the longest
   gap between two acknowledgements around the cut (that partition's unavailability), with
   kbroker.zookeeper.session.fencing.enable=false (before) and true (after).

--rate 0 (default) runs the latency pair at half of RF=1's peak rate, measured first in the same run
(acks=1, RF=1, --peak-records records of 100 B at full speed).

Goals (printed with median and range over the pairs / rounds, and written with every per-round figure to
--json PATH): acks=all minus acks=1 p99 at half of RF=1's peak <= 2 ms; the user-space CPU per GB that
RF=3 adds on the leader (its utime per GB at RF=3 minus at RF=1, same round) <= 0.3 s/GB.

--compare K=V[,K=V...] starts a second three-broker cluster with those broker settings (and
--compare-env K=V,... with that environment, e.g. PYTHONPATH of a changed copy of the tree) beside the
first (Kafka's defaults) and interleaves the two in every CPU round (A RF=3, A RF=1, B RF=3, B RF=1,
then reversed), so a setting such as replica.fetch.min.bytes / replica.fetch.wait.max.ms is judged
against the defaults under the same load; --pairs then also runs the latency pairs on both.

--floor runs every latency pair on the replication floor as well (perf/replication_floor.py): a leader
and two followers that keep a Produce's records in memory, append them to a file beside the brokers'
logs and do nothing else, speaking Kafka to the same producer. What acks=all adds there is what its
message pattern costs on this machine: no broker adds less.

--sched (root) runs every latency run under `perf sched record` and prints, beside its latencies, how
long the leader's and the followers' event loops and the producer's threads waited for a CPU each time
they were woken (p50/p99/max): on 2 cores shared by three brokers and the producer, the waits on the
acks=all path (a follower's fetch, then the leader) beside its tail (perf/sched_delay.py).

--perf-rounds N (root) then runs RF=3 and RF=1 under `perf record -g` of the leader and prints its CPU
per GB by kernel path (receive work done in its softirq for the receiving sockets, TCP transmit,
sendfile/page cache, epoll, file write, ..., user). --netns (root) starts every broker in a network
namespace of its own, joined by veth pairs to a bridge, with the receive processing in threaded-NAPI
kernel threads (as on separate hosts, where the receiver's host does it); --netns-b only the second
cluster, beside a loopback one. docs/perf/replication-cpu.md has the figures.

    .venv/bin/python -m kbroker.perf.replication_bench [--rate 0] [--seconds 10] [--pairs 3] [--mb 256] [--catchup-mb 200]
        [--failovers 3] [--probe-rate 200] [--skip-cpu] [--cpu-rounds 3] [--compare K=V,K=V]
        [--perf-rounds 0] [--perf-dir DIR] [--netns | --netns-b] [--zombie-rounds 0] [--zombie-cut-s 20] [--sched]
        [--floor]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kbroker.protocol import api
from kbroker.testing import LocalCluster, wait_until
from kbroker.zk.local import start_zookeeper

from .replication_floor import Floor
from .sched_delay import SchedRecord, describe, sched_delays, summary

TICK = os.sysconf("SC_CLK_TCK")
GOAL_ACKS_ALL_P99_MS = 2.0
GOAL_ADDED_USER_S_PER_GB = 0.3


def median_range(xs: list[float]) -> tuple[float, float, float]:
    s = sorted(xs)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2, s[0], s[-1]


def cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICK, int(fields[12]) / TICK   # utime, stime


def cpu_seconds(pid: int) -> float:
    return sum(cpu_split(pid))


def create(admin, name, rf, leader=None, brokers=3):
    replicas = None
    if leader is not None:
        others = [b for b in range(brokers) if b != leader][:rf - 1]
        replicas = {0: [leader] + others}
    topic = (NewTopic(name, num_partitions=1, replica_assignment=[replicas[0]], config={"min.insync.replicas": str(min(rf, 2))})
             if replicas else NewTopic(name, 1, rf, config={"min.insync.replicas": str(min(rf, 2))}))
    admin.create_topics([topic])[name].result(30)
    md = wait_until(lambda: (lambda p: p if p.leader >= 0 and len(p.isrs) == rf else None)(
        admin.list_topics(name, timeout=10).topics[name].partitions.get(0)), 30, f"{name} ready")
    return md.leader


def latency_run(bootstrap, topic, acks, rate, seconds, size=100):
    # Idempotence off for both settings (it requires acks=all and changes in-flight limits): only acks differs.
    p = Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 0, "enable.idempotence": False})
    lat = []
    errors = []
    sent = 0
    payload = b"x" * size

    def cb(err, msg, t0):
        if err is None:
            lat.append(time.perf_counter() - t0)
        else:
            errors.append(err)
    p.produce(topic, payload, partition=0)
    p.flush(10)
    step = 0.005
    per = max(1, int(rate * step))
    end = time.monotonic() + seconds
    nxt = time.monotonic()
    while time.monotonic() < end:
        for _ in range(per):
            t0 = time.perf_counter()
            p.produce(topic, payload, partition=0, on_delivery=lambda e, m, t0=t0: cb(e, m, t0))
        sent += per
        nxt += step
        # Serve delivery callbacks while waiting for the next step (a sleep would add its time).
        p.poll(0)
        while (left := nxt - time.monotonic()) > 0:
            p.poll(left)
    left = p.flush(30)
    lat.sort()
    return lat, sent, len(errors) + left


def pct(sorted_vals, q):
    return sorted_vals[min(len(sorted_vals) - 1, int(q * len(sorted_vals)))] * 1000


def tcp_out_segs(pid: int) -> int:
    """Tcp OutSegs of the network namespace of ``pid``."""
    with open(f"/proc/{pid}/net/snmp") as f:
        rows = [line.split() for line in f if line.startswith("Tcp:")]
    return int(rows[1][rows[0].index("OutSegs")])


def cpu_run(c, bootstrap, topic, leader, mb, size=1000):
    p = Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 5, "batch.size": 262144,
                  "queue.buffering.max.kbytes": 262144})
    n = mb * 1024 * 1024 // size
    payload = b"y" * size
    pids = {b: c.brokers[b].pid for b in c.brokers}
    napi = sorted(getattr(getattr(c, "net", None), "napi", ()))
    napi_before = sum(cpu_seconds(t) for t in napi)
    segs_before = tcp_out_segs(pids[leader]) if napi else 0
    before = {b: cpu_seconds(pid) for b, pid in pids.items()}
    leader_before = cpu_split(pids[leader])
    t0 = time.monotonic()
    for _ in range(n):
        while True:
            try:
                p.produce(topic, payload, partition=0)
                break
            except BufferError:
                p.poll(0.01)
        p.poll(0)
    p.flush(120)
    # Let the followers finish copying before reading the CPU counters.
    time.sleep(2)
    wall = time.monotonic() - t0
    after = {b: cpu_seconds(pid) for b, pid in pids.items()}
    leader_after = cpu_split(pids[leader])
    gb = n * size / 1e9
    used = {b: after[b] - before[b] for b in pids}
    cpu_run.leader_user_sys = tuple((a - b) / gb for a, b in zip(leader_after, leader_before))
    # --netns: the receive processing the brokers' namespaces moved into napi kernel threads.
    cpu_run.napi = (sum(cpu_seconds(t) for t in napi) - napi_before) / gb
    # The leader's namespace holds only its own sockets: its TCP segments sent, a count no load disturbs.
    cpu_run.out_segs = (tcp_out_segs(pids[leader]) - segs_before) / gb if napi else 0
    return used[leader] / gb, sum(used.values()) / gb, wall


# ---- --netns: every broker in a network namespace of its own, as on separate hosts ----------------
CLONE_NEWNET = 0x40000000
_libc = None


def _setns(fd: int) -> None:
    """setns(2) of the calling thread's network namespace (only this thread moves; children it
    starts inherit it)."""
    global _libc
    if _libc is None:
        import ctypes
        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        import ctypes
        raise OSError(ctypes.get_errno(), "setns")


@contextlib.contextmanager
def in_netns(name: str):
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(target)
        os.close(own)


def ethtool_flag(dev: str, cmd: int, on: bool) -> None:
    """A legacy ethtool set-flag ioctl (SIOCETHTOOL) on ``dev`` of the calling thread's namespace."""
    import ctypes
    import fcntl
    import struct

    val = ctypes.create_string_buffer(struct.pack("II", cmd, int(on)), 8)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sk:
        fcntl.ioctl(sk, 0x8946, struct.pack("16sP", dev.encode(), ctypes.addressof(val)) + bytes(16))


ETHTOOL_STSO, ETHTOOL_SGRO = 0x1f, 0x2c


def veth_napi(dev: str) -> None:
    """A veth receives through NAPI (GRO on) only segments its peer sent without TSO; with both, and
    /sys/class/net/<dev>/threaded, its receive processing runs in a napi/<dev> kernel thread."""
    ethtool_flag(dev, ETHTOOL_SGRO, True)
    ethtool_flag(dev, ETHTOOL_STSO, False)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def napi_threads() -> set[int]:
    out = set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/comm") as f:
                    if f.read().startswith("napi/"):
                        out.add(int(d))
            except OSError:
                pass
    return out


class NetnsNet:
    """A bridge in this namespace (10.77.<k>.1/24) and ``n`` namespaces, each joined to it by a veth
    pair (10.77.<k>.<i + 2>). Both ends of every veth have GRO on, TSO off (MTU 65000) and threaded NAPI, so a segment's
    receive processing (bridge forwarding, ip_rcv, tcp_v4_rcv, queueing, the reader's wakeup) runs
    in a napi/* kernel thread instead of the sender's softirq: the sender pays its transmit only, as
    across hosts. ``close`` removes all of it (the ExitStack of main calls it on every exit path)."""

    def __init__(self, n: int, k: int):
        self.tag = f"rb{os.getpid()}{chr(97 + k)}"        # <= 12 characters with "br" / "v<i>" (IFNAMSIZ 16)
        self.net = f"10.77.{(os.getpid() + k) % 200 + 20}"
        self.names = [f"{self.tag}-{i}" for i in range(n)]
        self.bridge = f"{self.tag}br"
        self.made: list[tuple[str, str]] = []
        self.napi: set[int] = set()
        try:
            self._up(n)
        except BaseException:
            self.close()
            raise

    @property
    def gateway(self) -> str:
        return f"{self.net}.1"

    def addr(self, i: int) -> str:
        return f"{self.net}.{i + 2}"

    @staticmethod
    def remove_stale() -> None:
        """Namespaces and links of an earlier run whose process is gone (killed with SIGKILL: nothing
        else skips close); only names of this class's pattern."""
        def dead(pid: str) -> bool:
            return not os.path.exists(f"/proc/{pid}")
        ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
        for name in ns:
            m = re.fullmatch(r"rb(\d+)[a-z]-\d+", name)
            if m and dead(m.group(1)):
                subprocess.run(["ip", "netns", "del", name], capture_output=True)
        for line in subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout.splitlines():
            name = line.split()[0].split("@")[0] if line.split() else ""
            m = re.fullmatch(r"rb(\d+)[a-z](br|v\d+)", name)
            if m and dead(m.group(1)):
                subprocess.run(["ip", "link", "del", name], capture_output=True)

    def _up(self, n: int) -> None:
        self.remove_stale()
        if self.net + "." in subprocess.run(["ip", "-4", "-br", "addr"], capture_output=True, text=True).stdout:
            raise SystemExit(f"--netns: {self.net}.0/24 is in use here")
        before = napi_threads()
        _ip("link", "add", self.bridge, "type", "bridge")
        self.made.append(("link", self.bridge))
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "mtu", "65000")
        _ip("link", "set", self.bridge, "up")
        for i, ns in enumerate(self.names):
            _ip("netns", "add", ns)
            self.made.append(("netns", ns))
            host = f"{self.tag}v{i}"
            _ip("link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", host, "master", self.bridge, "up")
            _ip("-n", ns, "addr", "add", f"{self.addr(i)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            # MTU 65000 without TSO: segments as large as loopback's 64 KiB ones, each one packet.
            _ip("link", "set", host, "mtu", "65000")
            _ip("-n", ns, "link", "set", "eth0", "mtu", "65000")
            veth_napi(host)
            with in_netns(ns):
                veth_napi("eth0")
            with open(f"/sys/class/net/{host}/threaded", "w") as f:
                f.write("1")
            # /sys shows the namespace it was mounted in: ip netns exec mounts the namespace's own.
            subprocess.run(["ip", "netns", "exec", ns, "sh", "-c", "echo 1 > /sys/class/net/eth0/threaded"],
                           check=True, capture_output=True)
        self.napi = napi_threads() - before

    def close(self) -> None:
        for kind, name in reversed(self.made):
            if kind == "netns":
                subprocess.run(["ip", "netns", "del", name], capture_output=True)
            else:
                subprocess.run(["ip", "link", "del", name], capture_output=True)
        self.made.clear()


class ZkForwarder:
    """ZooKeeper listens on 127.0.0.1 of this namespace only; the brokers in their namespaces reach
    it through this TCP forwarder on the bridge's address (same port). ``target_port``: forward to
    that port of 127.0.0.1 instead (``port`` 0: any free one)."""

    def __init__(self, host: str, port: int, target_port: int | None = None):
        self.target_port = port if target_port is None else target_port
        self.srv = socket.create_server((host, port))
        self.port = self.srv.getsockname()[1]
        self.srv.settimeout(0.5)
        self.stop = threading.Event()
        self.th = threading.Thread(target=self._accept, daemon=True)
        self.th.start()

    def _accept(self):
        while not self.stop.is_set():
            try:
                a, _ = self.srv.accept()
            except (socket.timeout, OSError):
                continue
            self._handle(a)

    def _handle(self, a):
        self._open(a)

    def _open(self, a, first: bytes = b""):
        try:
            b = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            b.sendall(first)
        except OSError:
            a.close()
            return None
        b.settimeout(None)
        a.settimeout(None)
        for x, y in ((a, b), (b, a)):
            threading.Thread(target=self._pump, args=(x, y), daemon=True).start()
        return b

    @staticmethod
    def _pump(src, dst):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sk in (src, dst):
                with contextlib.suppress(OSError):
                    sk.shutdown(socket.SHUT_RDWR)

    def close(self):
        self.stop.set()
        self.srv.close()
        self.th.join(5)


class CutProxy(ZkForwarder):
    """A loopback TCP forwarder to ``target_port`` that can cut the link. ``kafka``: only connections
    other brokers opened (client id ``broker-N-fetcher`` / ``controller-N`` in their first request) are
    cut and refused, clients' go on; otherwise (ZooKeeper) every connection."""

    LINKS = (b"broker-", b"controller-")

    def __init__(self, target_port: int, kafka: bool = False):
        self.kafka = kafka
        self.cut_on = False
        self.cuttable: list = []
        self.lock = threading.Lock()
        super().__init__("127.0.0.1", 0, target_port)

    def _handle(self, a):
        threading.Thread(target=self._classify, args=(a,), daemon=True).start()

    def _classify(self, a):
        first, link = b"", True
        if self.kafka:
            try:
                a.settimeout(10)
                head = a.recv(4, socket.MSG_WAITALL)
                first = head + a.recv(int.from_bytes(head, "big"), socket.MSG_WAITALL)
            except (OSError, ValueError):
                a.close()
                return
            n = int.from_bytes(first[12:14], "big", signed=True)   # request header v1: the client id
            link = n > 0 and first[14:14 + n].startswith(self.LINKS)
        with self.lock:
            if self.cut_on and link:
                a.close()
                return
            b = self._open(a, first)
            if b is not None and link:
                self.cuttable += [a, b]

    def cut(self):
        with self.lock:
            self.cut_on = True
            for sk in self.cuttable:
                with contextlib.suppress(OSError):
                    sk.shutdown(socket.SHUT_RDWR)
            self.cuttable.clear()

    def heal(self):
        self.cut_on = False

    def close(self):
        self.cut()
        super().close()


class NetnsCluster(LocalCluster):
    """LocalCluster with broker i started in namespace i of ``net`` (listening on every interface of
    its namespace, advertising its veth address) against a ZooKeeper reached through ``zk_connect``."""

    def __init__(self, root, net: NetnsNet, zk_connect: str, **kw):
        super().__init__(root, brokers=len(net.names), zookeeper_connect=zk_connect, **kw)
        self.net = net

    def start_broker(self, broker_id: int, timeout: float = 60.0, extra: dict | None = None):
        port = self.brokers[broker_id].port
        extra = {"listeners": f"PLAINTEXT://:{port}",
                 "advertised.listeners": f"PLAINTEXT://{self.net.addr(broker_id)}:{port}", **(extra or {})}
        with in_netns(self.net.names[broker_id]):      # the broker and its readiness checks
            return super().start_broker(broker_id, timeout, extra)

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{self.net.addr(i)}:{b.port}" for i, b in self.brokers.items())


def start_cluster(stack, root: Path, k: int, netns: bool, **kw):
    """A three-broker LocalCluster on loopback, or (netns) a NetnsCluster with its network,
    ZooKeeper and forwarder, all torn down by ``stack``."""
    if not netns:
        return stack.enter_context(LocalCluster(root, brokers=3, **kw))
    net = NetnsNet(3, k)
    stack.callback(net.close)
    zk = start_zookeeper(root / "zookeeper", port=0, tick_time_ms=1000, die_with_parent=True)
    stack.callback(zk.stop)
    fwd = ZkForwarder(net.gateway, zk.port)
    stack.callback(fwd.close)
    c = stack.enter_context(NetnsCluster(root, net, f"{net.gateway}:{zk.port}", **kw))
    print(f"netns cluster: brokers at {c.bootstrap}, receive processing in napi threads {sorted(net.napi)}")
    return c


# ---- where the leader's CPU goes (perf record -g of the leader, kernel stacks classified) -------------
PERF_FREQ = 1999     # cpu-clock samples per second of the leader's CPU time
# First matching class wins, tested in this order on the whole kernel stack of a sample. On loopback a
# sent segment is received (ip_rcv, tcp_v4_rcv, queueing, the reader's wakeup) in the net_rx softirq
# run by the sender's local_bh_enable; with tick accounting (no CONFIG_IRQ_TIME_ACCOUNTING) that time
# is the sender's system time.
PERF_CLASSES = (
    # The receiving socket's side of a segment: queueing the data, waking its reader (the follower's
    # loop at RF=3, the producer's at RF=1 for its answers): work of the receiving process.
    ("rx softirq: reader wakeups", ("net_rx_action", "process_backlog"), ("try_to_wake_up", "__wake_up",
                                                                          "sock_def_readable")),
    ("rx softirq: ack processing", ("net_rx_action", "process_backlog"), ("tcp_ack", "tcp_clean_rtx_queue")),
    ("rx softirq: ip/tcp data receive", ("net_rx_action", "process_backlog", "__netif_receive_skb"), ()),
    ("other softirq", ("handle_softirqs", "__do_softirq"), ()),
    ("tcp transmit", ("tcp_sendmsg_locked", "tcp_write_xmit", "__tcp_transmit_skb", "tcp_push",
                      "__tcp_push_pending_frames", "ip_queue_xmit", "dev_queue_xmit", "tcp_sendmsg"), ()),
    ("sendfile/splice/page cache", ("do_sendfile", "splice_direct_to_actor", "do_splice_direct",
                                    "filemap_splice_read", "__x64_sys_sendfile64"), ()),
    ("epoll", ("do_epoll_wait", "do_epoll_ctl", "ep_poll", "__x64_sys_epoll_wait", "__x64_sys_epoll_ctl"), ()),
    ("own socket receive", ("tcp_recvmsg", "__sys_recvfrom", "sock_recvmsg", "__x64_sys_recvfrom"), ()),
    ("file write/read", ("vfs_write", "vfs_read", "ksys_write", "ksys_read", "ksys_pwrite64", "ksys_pread64",
                         "vfs_writev"), ()),
    ("scheduler", ("schedule", "__schedule", "finish_task_switch"), ()),
)


def perf_start(pid: int, out: Path):
    """perf record of ``pid``, started disabled and enabled through its control fifo: returns once
    perf has acknowledged, so the run that follows is sampled from its first record."""
    ctl, ack = out.with_suffix(".ctl"), out.with_suffix(".ack")
    for f in (ctl, ack):
        f.unlink(missing_ok=True)
        os.mkfifo(f)
    proc = subprocess.Popen(["perf", "record", "-q", "-e", "cpu-clock", "-F", str(PERF_FREQ), "-g", "-D", "-1",
                             f"--control=fifo:{ctl},{ack}", "-p", str(pid), "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with open(ctl, "w") as w:              # opens once perf has opened its end
            w.write("enable\n")
        with open(ack) as r:
            got = r.readline()
        if not got.startswith("ack"):
            raise RuntimeError(f"perf record control answered {got!r}")
    except BaseException:
        perf_stop(proc)
        raise
    return proc


def perf_stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    proc.wait(120)


def classify_stack(frames: list[str]) -> str:
    """Class of one sample from its callchain's symbols (leaf first); user space when the leaf is not
    a kernel symbol (perf marks kernel frames with the [kernel.kallsyms] dso)."""
    if not frames or not frames[0][1]:
        return "user"
    names = {f for f, _k in frames}
    for label, any_of, also in PERF_CLASSES:
        if names.intersection(any_of) and (not also or names.intersection(also)):
            return label
    return "other kernel (syscall entry, faults, ...)"


def classify_script(text: str) -> dict[str, int]:
    """Samples per class of ``perf script -F ip,sym,dso`` output: a sample is its callchain's lines
    (address, symbol, (dso)), leaf first, samples separated by blank lines."""
    counts: dict[str, int] = {}
    frames: list[tuple[str, bool]] = []
    for line in text.splitlines() + [""]:
        line = line.strip()
        if not line:
            if frames:
                label = classify_stack(frames)
                counts[label] = counts.get(label, 0) + 1
            frames = []
            continue
        parts = line.split(None, 1)
        if len(parts) < 2:
            continue
        sym, _, dso = parts[1].rpartition(" (")
        # tcp_ack+0x1f, finish_task_switch.isra.0: the function's name
        name = sym.split("+", 1)[0].split(".", 1)[0].strip()
        frames.append((name, dso.startswith("[kernel.kallsyms]")))
    return counts


def perf_classes(data: Path) -> dict[str, int]:
    """Samples per class of a perf.data file."""
    return classify_script(subprocess.run(["perf", "script", "-i", str(data), "-F", "ip,sym,dso"],
                                          capture_output=True, text=True, check=True).stdout)


def perf_profile(clusters, rounds, mb, out_dir: Path):
    """--perf-rounds: RF=3 and RF=1 runs under perf record of the leader (after the timed rounds, on
    the topics they created), s/GB per class of kernel work: samples / PERF_FREQ / GB."""
    leader = 0
    out_dir.mkdir(parents=True, exist_ok=True)
    gb = mb * 1024 * 1024 // 1000 * 1000 / 1e9
    table = {}
    runs = [(label, name) for label in clusters for name in ("cpu3", "cpu1")]
    for rnd in range(rounds):
        for label, name in (runs if rnd % 2 == 0 else runs[::-1]):
            c, _admin = clusters[label]
            data = out_dir / f"{name}{label.strip(' []')}-{rnd + 1}.data"
            proc = perf_start(c.brokers[leader].pid, data)
            try:
                cpu_run(c, c.bootstrap, name, leader, mb)
            finally:
                perf_stop(proc)
            us = cpu_run.leader_user_sys
            counts = perf_classes(data)
            table.setdefault((label, name), []).append({k: v / PERF_FREQ / gb for k, v in counts.items()})
            print(f"perf round {rnd + 1}{label} {name}: leader /proc user/system per GB {us[0]:.2f}/{us[1]:.2f} s; "
                  f"perf samples {sum(counts.values())} = {sum(counts.values()) / PERF_FREQ / gb:.2f} s/GB")
    labels = sorted({k for rows in table.values() for r in rows for k in r})
    for label in clusters:
        print(f"leader s/GB per class{label}, median of {rounds} (range) RF=3 | RF=1 | RF=3 - RF=1:")
        for k in labels + ["kernel total", "all"]:
            def vals(name):
                rows = table[label, name]
                if k == "all":
                    return sorted(sum(r.values()) for r in rows)
                if k == "kernel total":
                    return sorted(sum(v for kk, v in r.items() if kk != "user") for r in rows)
                return sorted(r.get(k, 0.0) for r in rows)
            v3, v1 = vals("cpu3"), vals("cpu1")
            m3, m1 = v3[len(v3) // 2], v1[len(v1) // 2]
            print(f"  {k:<42} {m3:5.2f} ({v3[0]:.2f}-{v3[-1]:.2f}) | {m1:5.2f} ({v1[0]:.2f}-{v1[-1]:.2f}) | {m3 - m1:+.2f}")
    return table


def metadata_state(c, topic, partition=0):
    """(leader, leader_epoch, isr) from the first live broker answering Metadata v8; None if none does."""
    for b in c.brokers.values():
        if not b.running():
            continue
        try:
            with socket.create_connection(("127.0.0.1", b.port), timeout=2) as s:
                s.sendall(api.encode_request(3, 8, 1, "replbench", {
                    "topics": [{"name": topic}], "allow_auto_topic_creation": False,
                    "include_cluster_authorized_operations": False, "include_topic_authorized_operations": False}))
                size = int.from_bytes(s.recv(4, socket.MSG_WAITALL), "big")
                frame = s.recv(size, socket.MSG_WAITALL)
            _, body = api.decode_response(3, 8, memoryview(frame))
        except (OSError, ValueError):
            continue
        for t in body["topics"]:
            for p in t["partitions"]:
                if t["error_code"] == 0 and p["partition_index"] == partition:
                    return p["leader_id"], p["leader_epoch"], sorted(p["isr_nodes"])
    return None


def raw_produce_ok(port, topic, value=b"raw"):
    """One acks=all Produce v8 straight to a broker (no client discovery): True when acknowledged."""
    from kbroker._native.batch import BatchBuilder

    b = BatchBuilder()
    b.append(int(time.time() * 1000), None, value)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(api.encode_request(0, 8, 1, "replbench", {
                "transactional_id": None, "acks": -1, "timeout_ms": 5000,
                "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": b.build()}]}]}))
            size = int.from_bytes(s.recv(4, socket.MSG_WAITALL), "big")
            frame = s.recv(size, socket.MSG_WAITALL)
        _, body = api.decode_response(0, 8, memoryview(frame))
    except (OSError, ValueError):
        return False
    return body["responses"][0]["partition_responses"][0]["error_code"] == 0


def wait_isr(c, topic, size, timeout=90.0):
    return wait_until(lambda: (lambda s: s if s and s[0] >= 0 and len(s[2]) == size else None)(
        metadata_state(c, topic)), timeout, f"{topic}: ISR of {size}")


def peak_rate(bootstrap, topic, records, size=100):
    """Records/s acknowledged by an acks=1 producer at full speed (same callback path as latency_run)."""
    # Same client settings as latency_run, so half of this is a rate that client can keep.
    p = Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 0})
    payload = b"p" * size
    done = [0]

    def cb(err, msg):
        if err is None:
            done[0] += 1
    p.produce(topic, payload, partition=0)
    p.flush(10)
    t0 = time.perf_counter()
    for _ in range(records):
        while True:
            try:
                p.produce(topic, payload, partition=0, on_delivery=cb)
                break
            except BufferError:
                p.poll(0.001)
        p.poll(0)
    p.flush(120)
    return done[0] / (time.perf_counter() - t0)


def log_bytes(data_dir, topic, partition=0):
    d = Path(data_dir) / f"{topic}-{partition}"
    try:
        return sum(f.stat().st_size for f in d.glob("*.log"))
    except OSError:         # a segment rolled or removed between glob and stat
        return -1


def produce_mb(bootstrap, topic, mb, size=1000):
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 5,
                  "batch.size": 262144, "queue.buffering.max.kbytes": 262144})
    payload = b"c" * size
    failed = [0]

    def cb(err, msg):
        if err is not None:
            failed[0] += 1
    for _ in range(mb * 1024 * 1024 // size):
        while True:
            try:
                p.produce(topic, payload, partition=0, on_delivery=cb)
                break
            except BufferError:
                p.poll(0.01)
        p.poll(0)
    assert p.flush(300) == 0 and failed[0] == 0, f"{failed[0]} failed writes while building the lag"


def catch_up(c, admin, mb):
    topic = "catchup"
    leader = create(admin, topic, 3, leader=0)
    follower = 2
    c.stop_broker(follower)
    wait_until(lambda: follower not in (metadata_state(c, topic) or (0, 0, [follower]))[2], 60, "ISR without follower")
    t0 = time.monotonic()
    produce_mb(c.bootstrap, topic, mb)
    print(f"catch-up: produced {mb} MB (acks=all, ISR 2) in {time.monotonic() - t0:.1f} s")
    lead_dir, fol_dir = c.brokers[leader].data_dir, c.brokers[follower].data_dir
    target = log_bytes(lead_dir, topic)
    base = log_bytes(fol_dir, topic)
    samples = []                                   # (time, follower bytes)
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            samples.append((time.monotonic(), log_bytes(fol_dir, topic)))
            time.sleep(0.02)
    th = threading.Thread(target=sample, daemon=True)
    t_start = time.monotonic()
    th.start()
    c.start_broker(follower)
    t_ready = time.monotonic()
    try:
        wait_until(lambda: samples and samples[-1][1] >= target, 600, "follower log to equal the leader's", 0.02)
        t_equal = samples[-1][0]
        wait_until(lambda: follower in metadata_state(c, topic)[2], 120, "follower back in the ISR", 0.02)
        t_isr = time.monotonic()
    finally:
        stop.set()
        th.join()
    first = next(t for t, n in samples if n > base)
    copied = (target - base) / 1e6
    print(f"catch-up: {copied:.0f} MB behind; process start -> ready {t_ready - t_start:.1f} s; "
          f"first new byte -> log equal {t_equal - first:.2f} s = {copied / max(t_equal - first, 1e-9):.1f} MB/s; "
          f"process start -> back in ISR {t_isr - t_start:.1f} s "
          f"(= {copied / (t_isr - t_start):.1f} MB/s including the restart)")


class Probe:
    """Idempotent acks=all producer at a fixed rate in a thread; the monotonic time of every
    acknowledgement (delivery callbacks served promptly by poll) and every failure."""

    def __init__(self, bootstrap, topic, rate):
        self.p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                           "linger.ms": 0, "message.timeout.ms": 120000, "retry.backoff.ms": 50,
                           "reconnect.backoff.max.ms": 200, "topic.metadata.refresh.interval.ms": 1000})
        self.topic, self.rate = topic, rate
        self.acks, self.failed = [], []
        self.stop_flag = threading.Event()
        self.th = threading.Thread(target=self._run, daemon=True)
        self.th.start()

    def _cb(self, err, msg):
        (self.acks if err is None else self.failed).append(time.monotonic())

    def _run(self):
        step = 1.0 / self.rate
        nxt = time.monotonic()
        while not self.stop_flag.is_set():
            self.p.produce(self.topic, b"probe", partition=0, on_delivery=self._cb)
            nxt += step
            while (left := nxt - time.monotonic()) > 0:
                self.p.poll(left)
            self.p.poll(0)

    def close(self):
        self.stop_flag.set()
        self.th.join()
        self.p.flush(120)

    def first_ack_after(self, t):
        return next((a for a in list(self.acks) if a > t), None)

    def max_gap(self, t0, t1):
        acks = [a for a in list(self.acks) if t0 <= a <= t1]
        return max((b - a for a, b in zip(acks, acks[1:])), default=float("nan")), len(acks)


def failovers(c, admin, rounds, rate):
    from kazoo.client import KazooClient

    topic = "failover"
    create(admin, topic, 3)
    zk = KazooClient(hosts=c.zk.connect_string, timeout=10)
    zk.start(timeout=10)
    probe = Probe(c.bootstrap, topic, rate)
    rows = []
    try:
        wait_until(lambda: len(probe.acks) >= rate, 30, "the probe producer running")
        for _ in range(rounds):
            leader, _epoch, _isr = wait_isr(c, topic, 3)
            before = len(probe.acks)
            wait_until(lambda: len(probe.acks) >= before + rate // 2, 30, "probe acks before the kill")
            t_kill = time.monotonic()
            os.kill(c.brokers[leader].pid, signal.SIGKILL)
            wait_until(lambda: zk.exists(f"/brokers/ids/{leader}") is None, 60, "session expiry", 0.01)
            t_exp = time.monotonic()
            wait_until(lambda: (lambda s: s and s[0] >= 0 and s[0] != leader)(metadata_state(c, topic)), 60,
                       "a new leader in Metadata", 0.01)
            t_lead = time.monotonic()
            # The broker side alone: a raw acks=all write sent straight to the new leader.
            new_port = c.brokers[metadata_state(c, topic)[0]].port
            wait_until(lambda: raw_produce_ok(new_port, topic), 60, "a raw acks=all write on the new leader", 0.01)
            t_raw = time.monotonic()
            wait_until(lambda: probe.first_ack_after(t_exp), 60, "an acks=all write acknowledged", 0.01)
            t_ack = probe.first_ack_after(t_exp)
            rows.append((t_exp - t_kill, t_lead - t_exp, t_ack - t_lead, t_ack - t_kill, t_raw - t_lead))
            print(f"failover: kill->expiry {rows[-1][0]:.2f} s, expiry->new leader {rows[-1][1]:.2f} s, "
                  f"new leader->first ack {rows[-1][2]:+.2f} s (kill->first ack {rows[-1][3]:.2f} s); "
                  f"new leader->first raw acks=all write {rows[-1][4]:.2f} s")
            c.brokers[leader].proc.wait(30)
            c.start_broker(leader)
        if rows:
            n = len(rows)
            print("failover mean of %d: kill->expiry %.2f s, expiry->new leader %.2f s, new leader->first ack "
                  "%+.2f s, kill->first ack %.2f s; new leader->first raw write %.2f s"
                  % ((n,) + tuple(sum(r[i] for r in rows) / n for i in range(5))))
        # SIGTERM bounce: controlled shutdown moves leadership before the process exits.
        leader, _epoch, _isr = wait_isr(c, topic, 3)
        t_quiet = time.monotonic()
        wait_until(lambda: len([a for a in probe.acks if a > t_quiet]) >= rate * 2, 30, "2 s of steady acks")
        base_gap, _n = probe.max_gap(t_quiet, time.monotonic())
        failed_before = len(probe.failed)
        t0 = time.monotonic()
        c.stop_broker(leader)
        t_down = time.monotonic()
        c.start_broker(leader)
        wait_isr(c, topic, 3)
        t_back = time.monotonic()
        wait_until(lambda: probe.first_ack_after(t_back + 2), 30, "2 s of acks after the bounce")
        gap, n = probe.max_gap(t0, t_back + 2)
        print(f"SIGTERM bounce of leader {leader}: shutdown took {t_down - t0:.2f} s, back in ISR after "
              f"{t_back - t0:.1f} s; longest ack gap {gap * 1000:.0f} ms over {n} acks "
              f"(steady-state longest gap {base_gap * 1000:.0f} ms at {rate}/s); "
              f"failed writes {len(probe.failed) - failed_before}")
    finally:
        probe.close()
        zk.stop()
        zk.close()
    print(f"probe totals: {len(probe.acks)} acknowledged, {len(probe.failed)} failed")


def zombie_cut(root: Path, fencing: bool, rate: int, cut_s: float, session_ms: int = 6000):
    """One zombie-leader cut on a fresh cluster (section 5): -> (longest ack gap around the cut, first
    ack after the cut - cut), seconds; both bounded by the cut's length when nothing is acknowledged
    until the heal."""
    victim, topic = 2, "zombie"
    zk = start_zookeeper(root / "zookeeper", port=0, tick_time_ms=500, die_with_parent=True)
    c = LocalCluster(root, brokers=3, session_timeout_ms=session_ms, zookeeper_connect=zk.connect_string,
                     overrides={"replica.lag.time.max.ms": 4000,
                                "kbroker.zookeeper.session.fencing.enable": str(fencing).lower()})
    zpx, links = CutProxy(zk.port), CutProxy(c.brokers[victim].port, kafka=True)
    c.brokers[victim].extra = {"zookeeper.connect": f"127.0.0.1:{zpx.port}",
                               "advertised.listeners": f"PLAINTEXT://127.0.0.1:{links.port}"}
    probe = None
    try:
        c.start()
        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        admin.create_topics([NewTopic(topic, 1, replica_assignment=[[victim, 0, 1]],
                                      config={"min.insync.replicas": "2"})])[topic].result(30)
        wait_until(lambda: (lambda s: s and s[0] == victim and len(s[2]) == 3)(metadata_state(c, topic)), 60,
                   "the victim leading an ISR of 3")
        probe = Probe(c.bootstrap, topic, rate)
        wait_until(lambda: len(probe.acks) >= 2 * rate, 60, "2 s of probe acks before the cut")
        t_cut = time.monotonic()
        zpx.cut()
        links.cut()
        time.sleep(cut_s)            # the cut's length is the experiment
        t_heal = time.monotonic()
        zpx.heal()
        links.heal()
        wait_until(lambda: probe.first_ack_after(t_heal + 2), 120, "acks after the heal")
        gap, _n = probe.max_gap(t_cut - 1, t_heal + 2)
        first = probe.first_ack_after(t_cut + 0.05)
        return gap, first - t_cut
    finally:
        if probe is not None:
            probe.close()
        c.stop()
        zpx.close()
        links.close()
        zk.stop()


def zombie_rounds(root: Path, rounds: int, rate: int, cut_s: float):
    rows = {False: [], True: []}
    for rnd in range(rounds):
        for fencing in (False, True):
            gap, first = zombie_cut(root / f"zombie-{rnd}-{int(fencing)}", fencing, rate, cut_s)
            rows[fencing].append(gap)
            print(f"zombie cut {rnd + 1} ({cut_s:.0f} s, session timeout 6 s), fencing "
                  f"{'on ' if fencing else 'off'}: partition unavailable {gap:.2f} s (longest ack gap), first "
                  f"ack {first:.2f} s after the cut")
    for fencing in (False, True):
        g = sorted(rows[fencing])
        if g:
            print(f"zombie cut, fencing {'on (after)' if fencing else 'off (before)'}: unavailability median "
                  f"{g[len(g) // 2]:.2f} s over {len(g)} rounds (range {g[0]:.2f}-{g[-1]:.2f} s)")


def latency_pairs(clusters, rate, pairs, seconds, sched_dir=None):
    """Alternating acks=1 / acks=all pairs on an RF=3 topic, each pair on every cluster of ``clusters``
    ({label: (cluster, admin)}) in turn -> {label: [(p50 diff, p99 diff)]}. ``sched_dir``: each run under
    ``perf sched record`` there, and the run-queue waits of the leader's and the followers' event loops
    and of the producer's threads printed beside its latencies (latency_pairs.sched keeps them)."""
    # A replication floor (admin None) leads every topic from its process 0.
    leaders = {label: create(admin, "lat", 3) if admin is not None else 0 for label, (c, admin) in clusters.items()}
    # Alternating pairs: one run alone is at the mercy of whatever else the 2 cores were doing.
    diffs = {label: [] for label in clusters}
    latency_pairs.sched = []
    latency_pairs.cpu = []      # each run's CPU seconds of the leader and of the followers together
    for pair in range(pairs):
        for label, (c, _admin) in clusters.items():
            res = {}
            for acks in ("1", "all"):
                pids = {b: c.brokers[b].pid for b in sorted(c.brokers)}
                cpu0 = {b: cpu_seconds(pid) for b, pid in pids.items()}
                if sched_dir is None:
                    lat, sent, failed = latency_run(c.bootstrap, "lat", acks, rate, seconds)
                else:
                    data = Path(sched_dir) / f"sched{label.strip(' []')}-{pair + 1}-acks{acks}.data"
                    with SchedRecord(data):
                        lat, sent, failed = latency_run(c.bootstrap, "lat", acks, rate, seconds)
                    roles = {"leader loop": (c.brokers[leaders[label]].pid, True)}
                    for b in sorted(c.brokers):
                        if b != leaders[label]:
                            roles[f"follower {b} loop"] = (c.brokers[b].pid, True)
                    roles["producer threads"] = (os.getpid(), False)
                    waits = summary(sched_delays(data, roles))
                    data.unlink()
                    latency_pairs.sched.append({"pair": pair + 1, "cluster": label or "A", "acks": acks, **waits})
                cpu = {b: cpu_seconds(pid) - cpu0[b] for b, pid in pids.items()}
                res[acks] = (pct(lat, 0.5), pct(lat, 0.99), len(lat))
                lead = leaders[label]
                latency_pairs.cpu.append({"pair": pair + 1, "cluster": label or "A", "acks": acks,
                                          "leader_s": cpu[lead],
                                          "followers_s": sum(v for b, v in cpu.items() if b != lead)})
                print(f"pair {pair + 1}{label} acks={acks:>3} RF=3: {res[acks][2]} of {sent} sent acknowledged "
                      f"({failed} failed or unconfirmed), target {rate}/s, sent {sent / seconds:.0f}/s: p50 "
                      f"{res[acks][0]:.2f} ms, p90 {pct(lat, 0.9):.2f} ms, p99 {res[acks][1]:.2f} ms, "
                      f"max {lat[-1] * 1000:.1f} ms; CPU leader {cpu[lead]:.2f} s, followers "
                      f"{latency_pairs.cpu[-1]['followers_s']:.2f} s")
                if sched_dir is not None:
                    print(f"    run-queue waits: {describe(waits)}")
            diffs[label].append((res["all"][0] - res["1"][0], res["all"][1] - res["1"][1]))
            print(f"pair {pair + 1}{label} acks=all minus acks=1: p50 {diffs[label][-1][0]:+.2f} ms, "
                  f"p99 {diffs[label][-1][1]:+.2f} ms")
    for label, d in diffs.items():
        if d:
            med, lo, hi = median_range([x[1] for x in d])
            print(f"acks=all minus acks=1{label} at {rate}/s, mean of {len(d)} pairs: "
                  f"p50 {sum(x[0] for x in d) / len(d):+.2f} ms, p99 {sum(x[1] for x in d) / len(d):+.2f} ms; "
                  f"p99 median {med:+.2f} ms (range {lo:+.2f} to {hi:+.2f}): goal <= {GOAL_ACKS_ALL_P99_MS} ms "
                  f"{'met' if med <= GOAL_ACKS_ALL_P99_MS else 'MISSED'} "
                  f"({sum(1 for x in d if x[1] <= GOAL_ACKS_ALL_P99_MS)}/{len(d)} pairs)")
    return diffs


def cpu_rounds(clusters, rounds, mb):
    """Leader CPU per GB at RF=3 and RF=1 (topics led by broker 0) for each cluster in ``clusters``
    ({label: (cluster, admin)}), every round running all of them, the order reversed each round."""
    leader = 0
    for c, admin in clusters.values():
        create(admin, "cpu3", 3, leader=leader)
        create(admin, "cpu1", 1, leader=leader)
    # Interleaved rounds (RF=3, RF=1, RF=1, RF=3, ...): the 2 cores are shared, so only
    # same-round ratios are compared; the median and the range are reported.
    ratios = {label: [] for label in clusters}
    cluster3 = {label: [] for label in clusters}
    rows = {label: [] for label in clusters}
    runs = [(label, name) for label in clusters for name in ("cpu3", "cpu1")]
    for rnd in range(rounds):
        got, split = {}, {}
        for label, name in (runs if rnd % 2 == 0 else runs[::-1]):
            c, _admin = clusters[label]
            got[label, name] = cpu_run(c, c.bootstrap, name, leader, mb)
            split[label, name] = cpu_run.leader_user_sys
            if getattr(c, "net", None):
                print(f"  {label.strip() or '[A]'} RF={name[-1]}: napi threads (receive work) {cpu_run.napi:.2f} s/GB, "
                      f"leader TCP segments sent {cpu_run.out_segs:,.0f} per GB")
        for label in clusters:
            (l3, total3, wall3), (l1, total1, wall1) = got[label, "cpu3"], got[label, "cpu1"]
            ratios[label].append(l3 / l1)
            cluster3[label].append(total3)
            s3, s1 = split[label, "cpu3"], split[label, "cpu1"]
            rows[label].append({"leader_s_per_gb": {"rf3": l3, "rf1": l1}, "cluster_s_per_gb_rf3": total3,
                                "leader_user_s_per_gb": {"rf3": s3[0], "rf1": s1[0]},
                                "leader_system_s_per_gb": {"rf3": s3[1], "rf1": s1[1]},
                                "added_user_s_per_gb": s3[0] - s1[0], "wall_s": {"rf3": wall3, "rf1": wall1}})
            print(f"round {rnd + 1}{label}: leader CPU per GB: RF=3 {l3:.2f} s, RF=1 {l1:.2f} s, ratio {l3 / l1:.2f} "
                  f"({mb} MB each, {wall3:.1f} s / {wall1:.1f} s); cluster CPU per GB: RF=3 {total3:.2f} s, "
                  f"RF=1 {total1:.2f} s; leader user/system per GB: RF=3 {s3[0]:.2f}/{s3[1]:.2f} s, "
                  f"RF=1 {s1[0]:.2f}/{s1[1]:.2f} s")
    for label in clusters:
        srt = sorted(ratios[label])
        if srt:
            print(f"leader CPU per GB RF=3 / RF=1{label} over {len(srt)} interleaved rounds: median "
                  f"{srt[len(srt) // 2]:.2f} (range {srt[0]:.2f}-{srt[-1]:.2f}); cluster CPU per GB at RF=3: "
                  f"median {sorted(cluster3[label])[len(srt) // 2]:.2f} s")
            med, lo, hi = median_range([r["added_user_s_per_gb"] for r in rows[label]])
            rf1 = median_range([r["leader_user_s_per_gb"]["rf1"] for r in rows[label]])
            print(f"leader user-space CPU RF=3 adds{label} (RF=3 minus RF=1, same round): median {med:+.3f} s/GB "
                  f"(range {lo:+.3f} to {hi:+.3f}; RF=1 leader user {rf1[0]:.2f} s/GB): goal <= "
                  f"{GOAL_ADDED_USER_S_PER_GB} s/GB {'met' if med <= GOAL_ADDED_USER_S_PER_GB else 'MISSED'}")
    cpu_rounds.rows = rows
    return ratios


def parse_settings(text: str) -> dict[str, str]:
    out = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--compare: {item!r} is not key=value")
        out[key.strip()] = value.strip()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=int, default=0,
                    help="records/s for the latency runs; 0 (default): half of RF=1's peak, measured first")
    ap.add_argument("--peak-records", type=int, default=200000, help="records (100 B) for the RF=1 peak (200000)")
    ap.add_argument("--seconds", type=float, default=10, help="seconds per latency run (10)")
    ap.add_argument("--pairs", type=int, default=3, help="alternating acks=1/acks=all latency pairs (3)")
    ap.add_argument("--mb", type=int, default=256, help="MB produced per CPU run (256)")
    ap.add_argument("--skip-cpu", action="store_true", help="skip the CPU-per-GB runs")
    ap.add_argument("--cpu-rounds", type=int, default=3, help="interleaved RF=3/RF=1 CPU rounds (3)")
    ap.add_argument("--catchup-mb", type=int, default=200, help="MB of follower lag to catch up (200; 0 skips)")
    ap.add_argument("--failovers", type=int, default=3, help="kill -9 failover rounds (3; 0 skips, and the bounce)")
    ap.add_argument("--probe-rate", type=int, default=200, help="records/s of the failover probe producer (200)")
    ap.add_argument("--compare", default="", metavar="K=V,K=V",
                    help="broker settings of a second cluster run beside the first in the latency pairs and "
                         "CPU rounds (e.g. replica.fetch.min.bytes=1048576,replica.fetch.wait.max.ms=20)")
    ap.add_argument("--compare-env", default="", metavar="K=V,K=V",
                    help="environment of the second cluster's brokers (e.g. PYTHONPATH=<a copy of the tree "
                         "with a change>, to compare code side by side); implies the second cluster")
    ap.add_argument("--perf-rounds", type=int, default=0,
                    help="after the timed rounds, rounds of RF=3 and RF=1 runs under `perf record -g` of the "
                         "leader (root), its CPU per GB split by kernel path (0: none)")
    ap.add_argument("--perf-dir", default="", help="keep the perf.data files there (default: the run's temp dir)")
    ap.add_argument("--netns", action="store_true",
                    help="every broker in a network namespace of its own joined by veth pairs and a bridge, "
                         "receive processing in threaded NAPI kernel threads (root; CPU rounds only)")
    ap.add_argument("--netns-b", action="store_true",
                    help="only the second cluster in namespaces (implies it): loopback and namespaces side by side")
    ap.add_argument("--zombie-rounds", type=int, default=0,
                    help="zombie-leader cuts, each with fencing off then on, on fresh clusters (0: none)")
    ap.add_argument("--zombie-cut-s", type=float, default=20, help="length of each zombie cut (20 s)")
    ap.add_argument("--sched", action="store_true",
                    help="run each latency run under `perf sched record` (root) and print the run-queue waits "
                         "of the leader's and followers' event loops and of the producer's threads beside it")
    ap.add_argument("--floor", action="store_true",
                    help="run every latency pair on the replication floor too (perf/replication_floor.py: a "
                         "leader and two followers doing no broker work), same producer, rate and bursts")
    ap.add_argument("--json", default="", help="write the latency pairs' and CPU rounds' figures and goals there")
    args = ap.parse_args(argv)
    if (args.netns or args.netns_b) and (args.pairs or args.catchup_mb or args.failovers or args.zombie_rounds):
        raise SystemExit("--netns runs the CPU rounds only: add --pairs 0 --catchup-mb 0 --failovers 0 "
                         "--zombie-rounds 0")
    if args.perf_rounds > 0 and (args.skip_cpu or args.cpu_rounds < 1):
        raise SystemExit("--perf-rounds profiles the topics of the CPU rounds: needs --cpu-rounds >= 1")
    base = {"log.segment.bytes": 256 << 20}
    compare = parse_settings(args.compare)
    compare_env = parse_settings(args.compare_env)
    with contextlib.ExitStack() as stack:
        root = stack.enter_context(tempfile.TemporaryDirectory(prefix="replbench-"))
        # SIGTERM unwinds the stack like Ctrl-C: brokers stopped, namespaces and bridges removed.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        c = start_cluster(stack, Path(root) / "a", 0, args.netns, overrides=base)
        clusters = {"": (c, AdminClient({"bootstrap.servers": c.bootstrap}))}
        if compare or compare_env or args.netns_b:
            print(f"[B] = a second cluster with settings {compare} and environment {compare_env}; "
                  "unlabelled = Kafka's defaults")
            cb = start_cluster(stack, Path(root) / "b", 1, args.netns or args.netns_b,
                               overrides={**base, **compare}, env=compare_env or None)
            clusters[" [B]"] = (cb, AdminClient({"bootstrap.servers": cb.bootstrap}))
        admin = clusters[""][1]
        rate = args.rate
        if rate <= 0 and args.pairs > 0:
            create(admin, "peak1", 1, leader=0)
            peak = peak_rate(c.bootstrap, "peak1", args.peak_records)
            rate = int(peak / 2)
            print(f"RF=1 peak (acks=1, 100 B, one producer): {peak:.0f} records/s; latency runs at half: {rate}/s")
        result = {"command": "python -m kbroker.perf.replication_bench " + " ".join(argv or sys.argv[1:]),
                  "rf1_peak_records_per_s": peak if args.rate <= 0 and args.pairs > 0 else None, "rate": rate}
        if args.pairs > 0:
            runs = dict(clusters)
            if args.floor:
                floor_dir = Path(root) / "floor"     # the brokers' filesystem: the same write stalls
                floor_dir.mkdir()
                runs[" [floor]"] = (stack.enter_context(Floor(floor_dir)), None)
            diffs = latency_pairs(runs, rate, args.pairs, args.seconds, Path(root) if args.sched else None)
            result["latency_run_cpu_s"] = latency_pairs.cpu
            if args.sched:
                result["run_queue_waits"] = latency_pairs.sched
            result["acks_all_minus_acks1_ms"] = {label or "A": [{"p50": a, "p99": b} for a, b in d]
                                                 for label, d in diffs.items()}
            result["goal_acks_all_p99_ms"] = {label or "A": dict(zip(("median", "min", "max"),
                                                                     median_range([b for _a, b in d])),
                                                                 target=GOAL_ACKS_ALL_P99_MS)
                                              for label, d in diffs.items() if d}
        if not args.skip_cpu:
            cpu_rounds(clusters, args.cpu_rounds, args.mb)
            result["cpu_rounds"] = {label or "A": r for label, r in cpu_rounds.rows.items()}
            result["goal_added_user_s_per_gb"] = {
                label or "A": dict(zip(("median", "min", "max"), median_range([x["added_user_s_per_gb"] for x in r])),
                                   target=GOAL_ADDED_USER_S_PER_GB) for label, r in cpu_rounds.rows.items() if r}
        if args.json:
            import json
            Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        if args.perf_rounds > 0:
            perf_profile(clusters, args.perf_rounds, args.mb, Path(args.perf_dir or Path(root) / "perf"))
        if args.catchup_mb > 0:
            catch_up(c, admin, args.catchup_mb)
        if args.failovers > 0:
            failovers(c, admin, args.failovers, args.probe_rate)
        if args.zombie_rounds > 0:
            zombie_rounds(Path(root) / "zombie", args.zombie_rounds, args.probe_rate, args.zombie_cut_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
