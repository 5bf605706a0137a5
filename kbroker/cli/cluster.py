"""``kbroker cluster up|down|status --dir DIR``: a local ZooKeeper plus N brokers for development and tests.

Layout of DIR::

    cluster.json                  ids, ports, ZooKeeper port: a second `up` reuses them
    zookeeper/                    kbroker.zk.local's data dir (zoo.cfg, zookeeper.pid, zookeeper.log);
                                  with --zookeepers N: zookeeper/node-<i>/ per ensemble node (myid i)
    broker-<id>/server.properties generated once; later `up`s keep (and validate) an edited file
    broker-<id>/broker.pid        pid of `python -m kbroker serve --config .../server.properties`
    broker-<id>/broker.log        its stdout and stderr
    broker-<id>/data/             log.dirs

Broker ids are 0..N-1 (Kafka's sample config uses broker.id=0). Everything binds to 127.0.0.1.
With ``--security`` ZooKeeper serves TLS clients only, on the ZooKeeper port (cli/cluster_security.py).

``up`` returns once every broker is registered in ZooKeeper (a fresh ``/brokers/ids/<id>`` node),
answers an ApiVersions v0 request, and has heard from the controller about every broker of the
layout (its Metadata lists them all: a topic with replication factor N can be created at once); its
last stdout line is ``bootstrap.servers=127.0.0.1:P1,...``.
Running ``up`` again starts only what is not running. ``down`` stops the processes recorded in the pid
files, after checking each pid still runs the command we started (pids get recycled).
``status`` exits 0 only when ZooKeeper runs and every broker is registered.
Brokers are started, waited on and stopped through kbroker.localcluster, the runner the tests'
LocalCluster uses too; ZooKeeper through kbroker.zk.local.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from kbroker.cli import cluster_security
from kbroker.config import BrokerConfig, ConfigError
from kbroker.localcluster import (BrokerExited, BrokerNotReady, api_versions_probe, metadata_probe, reap,
                                  spawn_broker, stop_pids, wait_broker_ready)
from kbroker.ports import LOOPBACK, free_ports, port_in_use
from kbroker.procutil import live_argv

LAYOUT_FILE = "cluster.json"
DEFAULT_ZK_PORT = 2181
DEFAULT_BASE_PORT = 9092
# Local clusters use a 6 s ZooKeeper session instead of Kafka's 18 s: a killed broker's registration
# disappears sooner, so kill/restart cycles in tests are quick. It lies inside ZooKeeper's allowed
# [2, 20] x tickTime (2000 ms) window.
LOCAL_SESSION_TIMEOUT_MS = 6000
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


class ClusterError(Exception):
    """A failure the CLI reports as one message (exit status 1)."""


# --------------------------------------------------------------------------------------------------
# Layout

@dataclass
class BrokerSlot:
    id: int
    port: int


@dataclass
class Layout:
    root: Path
    zk_port: int
    brokers: list[BrokerSlot]
    num_partitions: int = 1
    # (client, peer, election) port per node of a ZooKeeper ensemble; empty = one standalone server
    zk_ensemble: list[tuple[int, int, int]] = field(default_factory=list)
    security: str = "plaintext"     # the brokers' listener: plaintext, ssl, sasl_plaintext, sasl_ssl

    @classmethod
    def load(cls, root: Path) -> Layout | None:
        path = root / LAYOUT_FILE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise ClusterError(f"cannot read {path}: {e}") from None
        return cls(root, int(data["zookeeper"]["port"]),
                   [BrokerSlot(int(b["id"]), int(b["port"])) for b in data["brokers"]],
                   int(data.get("num_partitions", 1)),
                   [tuple(int(x) for x in n) for n in data["zookeeper"].get("ensemble", [])],
                   data.get("security", "plaintext"))

    def save(self) -> None:
        zk = {"port": self.zk_port}
        if self.zk_ensemble:
            zk["ensemble"] = [list(n) for n in self.zk_ensemble]
        data = {"version": 1, "zookeeper": zk,
                "brokers": [{"id": b.id, "port": b.port} for b in self.brokers],
                "num_partitions": self.num_partitions, "security": self.security}
        tmp = self.root / (LAYOUT_FILE + ".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, self.root / LAYOUT_FILE)  # atomic: a crash never leaves half a layout

    @property
    def zk_dir(self) -> Path:
        return self.root / "zookeeper"

    @property
    def zk_node_dirs(self) -> list[Path]:
        return [self.zk_dir / f"node-{i + 1}" for i in range(len(self.zk_ensemble))]

    @property
    def zk_connect(self) -> str:
        if self.zk_ensemble:
            return ",".join(f"{LOOPBACK}:{client}" for client, _, _ in self.zk_ensemble)
        return f"{LOOPBACK}:{self.zk_port}"

    def broker_dir(self, broker_id: int) -> Path:
        return self.root / f"broker-{broker_id}"

    def config_path(self, broker_id: int) -> Path:
        return self.broker_dir(broker_id) / "server.properties"

    def pid_path(self, broker_id: int) -> Path:
        return self.broker_dir(broker_id) / "broker.pid"

    def log_path(self, broker_id: int) -> Path:
        return self.broker_dir(broker_id) / "broker.log"

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"{LOOPBACK}:{b.port}" for b in self.brokers)


def broker_properties(layout: Layout, slot: BrokerSlot) -> str:
    n = len(layout.brokers)
    return "\n".join([
        "# Written by `kbroker cluster up`. Later `cluster up` runs keep this file, so edits stick.",
        f"broker.id={slot.id}",
        *cluster_security.broker_lines(layout.root, layout.security, slot.port),
        f"log.dirs={layout.broker_dir(slot.id) / 'data'}",
        f"zookeeper.connect={layout.zk_connect}",
        *cluster_security.zookeeper_lines(layout.root),
        f"zookeeper.session.timeout.ms={LOCAL_SESSION_TIMEOUT_MS}",
        f"num.partitions={layout.num_partitions}",
        # Topics are replicated as on a production cluster (RF 3, acks=all needs 2 in sync), capped at
        # the broker count (no more replicas than brokers; one broker may stop without failing acks=all).
        f"default.replication.factor={min(3, n)}",
        f"min.insync.replicas={max(1, min(2, n - 1))}",
        f"offsets.topic.replication.factor={min(3, n)}",
        f"transaction.state.log.replication.factor={min(3, n)}",
        f"transaction.state.log.min.isr={min(2, n)}",
        # No reason to hold the first consumer group back on a local cluster.
        "group.initial.rebalance.delay.ms=0",
        # The kernel sizes the receive buffer (autotuning) instead of Kafka's fixed 100 KiB: a large
        # produce request then takes fewer reads (docs/perf/request-capacity.md has the figures).
        "socket.receive.buffer.bytes=-1",
        "",
    ])


# --------------------------------------------------------------------------------------------------
# Processes

def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def is_our_broker(pid: int, config_path: Path) -> bool:
    """True if ``pid`` is alive (not a zombie) and runs ``kbroker serve --config <config_path>``."""
    argv = live_argv(pid)
    if argv is None:
        reap(pid)           # a zombie child of ours: collect it
        return False
    return b"kbroker" in argv and b"serve" in argv and str(config_path).encode() in argv


def running_broker_pid(layout: Layout, broker_id: int) -> int | None:
    pid = _read_pid(layout.pid_path(broker_id))
    if pid is not None and is_our_broker(pid, layout.config_path(broker_id)):
        return pid
    return None


def _tail(path: Path, start: int = 0, lines: int = 30) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(start)
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(log is empty)"


@dataclass
class Started:
    slot: BrokerSlot
    popen: subprocess.Popen | None      # None: it was already running
    pid: int
    log_start: int
    stale_czxid: int | None             # czxid of a registration left over from a previous run


def start_broker(layout: Layout, slot: BrokerSlot) -> tuple[subprocess.Popen, int]:
    # Its own session (localcluster.spawn_broker): the broker outlives this CLI and ignores a Ctrl-C aimed at it.
    popen, log_start = spawn_broker(
        layout.config_path(slot.id), layout.log_path(slot.id), cwd=layout.broker_dir(slot.id),
        banner=f"--- kbroker cluster up: starting broker {slot.id} at {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    layout.pid_path(slot.id).write_text(f"{popen.pid}\n")
    return popen, log_start


def _alive(s: Started, layout: Layout) -> bool:
    if s.popen is not None:
        return s.popen.poll() is None
    return is_our_broker(s.pid, layout.config_path(s.slot.id))


# --------------------------------------------------------------------------------------------------
# Readiness

def wait_cluster_metadata(layout: Layout, timeout: float) -> None:
    """Until every broker's Metadata names all the layout's brokers and a controller."""
    want = {slot.id for slot in layout.brokers}
    deadline = time.monotonic() + timeout
    security = cluster_security.client_security(layout.root, layout.security)
    for slot in layout.brokers:
        while True:
            got = (metadata_probe(slot.port) if security is None
                   else cluster_security.probe_metadata(slot.port, security))
            if got is not None and want <= got[0] and got[1] >= 0:
                break
            if time.monotonic() >= deadline:
                raise ClusterError(f"broker {slot.id} (port {slot.port}) does not see every broker after "
                                   f"{timeout:g}s: its Metadata names {sorted(got[0]) if got else 'nothing'}, "
                                   f"controller {got[1] if got else 'unknown'}")
            time.sleep(0.05)


def wait_ready(zk, layout: Layout, s: Started, timeout: float) -> None:
    """Return once broker ``s`` has a fresh registration and answers ApiVersions; ClusterError if it
    dies or ``timeout`` seconds pass."""
    security = cluster_security.client_security(layout.root, layout.security)
    log_path = layout.log_path(s.slot.id)

    def exited():
        if _alive(s, layout):
            return None
        return f"status {s.popen.returncode if s.popen is not None else 'unknown'}"

    def probe():
        return (api_versions_probe(s.slot.port) if security is None
                else cluster_security.probe_api_versions(s.slot.port, security))

    try:
        wait_broker_ready(zk, s.slot.id, exited, probe, s.stale_czxid, timeout)
    except BrokerExited as e:
        raise ClusterError(
            f"broker {s.slot.id} (pid {s.pid}) exited with {e} during start-up; "
            f"{log_path} ends with:\n{_tail(log_path, s.log_start)}") from None
    except BrokerNotReady as e:
        state = "registered in ZooKeeper" if e.registered else f"not registered at /brokers/ids/{s.slot.id}"
        raise ClusterError(
            f"broker {s.slot.id} (pid {s.pid}, port {s.slot.port}) not ready after "
            f"{timeout:g}s: {state}; last ApiVersions probe: {e.last_probe}; "
            f"{log_path} ends with:\n{_tail(log_path, s.log_start)}") from None


# --------------------------------------------------------------------------------------------------
# ZooKeeper

def ensure_zookeeper(zk_dir: Path, port: int, tls=None):
    """Re-attach to the cluster's ZooKeeper or start it (``tls``: a kbroker.zk.local.ServerTls);
    returns (ZkProcess, started_now)."""
    from kbroker.zk import local

    running = local.find_running(zk_dir)
    if running is not None:
        if port and running.port != port:
            raise ClusterError(f"ZooKeeper in {zk_dir} runs on port {running.port}, the cluster expects {port}")
        return running, False
    try:
        return local.start_zookeeper(zk_dir, port=port, tls=tls), True
    except (local.ZooKeeperStartError, local.ZooKeeperNotInstalled) as e:
        raise ClusterError(f"cannot start ZooKeeper: {e}") from None


def ensure_ensemble(layout: Layout) -> tuple[str, bool]:
    """Re-attach to the layout's ZooKeeper ensemble, starting the nodes that are not running;
    returns (connect string, whether any node was started)."""
    from kbroker.zk import local

    dirs = layout.zk_node_dirs
    missing = [d for d in dirs if local.find_running(d) is None]
    try:
        if len(missing) == len(dirs) and not all((d / local.CONFIG_FILE).exists() for d in dirs):
            local.start_ensemble(layout.zk_dir, len(dirs), ports=layout.zk_ensemble)
        elif missing:
            local.start_nodes(missing)
    except (local.ZooKeeperStartError, local.ZooKeeperNotInstalled) as e:
        raise ClusterError(f"cannot start the ZooKeeper ensemble: {e}") from None
    return layout.zk_connect, bool(missing)


def _zk_tls_note(root: Path) -> str:
    if not cluster_security.zk_tls_properties(root):
        return ""
    return (f" (TLS only; ZooKeeper tools: --zk-tls-config-file "
            f"{root / cluster_security.ZK_TLS_PROPERTIES})")


def _ensemble_ports(n: int, zk_port: int | None) -> list[tuple[int, int, int]]:
    if zk_port == 0:
        ports = free_ports(3 * n)
        return [tuple(ports[3 * i:3 * i + 3]) for i in range(n)]
    base = DEFAULT_ZK_PORT if zk_port is None else zk_port
    return [(base + i, 2888 + i, 3888 + i) for i in range(n)]


def _kazoo(connect: str, timeout: float = 10.0, tls: dict | None = None):
    """A started client; ``tls``: kazoo's TLS arguments (cluster_security.kazoo_tls)."""
    from kazoo.client import KazooClient
    from kazoo.handlers.threading import KazooTimeoutError

    client = KazooClient(hosts=connect, timeout=timeout, **(tls or {}))
    try:
        client.start(timeout=timeout)
    except KazooTimeoutError:
        client.close()
        raise ClusterError(f"cannot connect to ZooKeeper at {connect}") from None
    return client


# --------------------------------------------------------------------------------------------------
# Commands

def cluster_up(root: Path, brokers: int | None, zk_port: int | None, base_port: int | None,
               partitions: int | None, timeout: float = READY_TIMEOUT_S, out=sys.stdout,
               zookeepers: int | None = None, security: str | None = None) -> Layout:
    root = root.resolve()
    layout = Layout.load(root)
    if layout is not None and security is not None and security != layout.security:
        raise ClusterError(f"{root / LAYOUT_FILE} holds a {layout.security} cluster, not {security}; "
                           "use another --dir")
    if layout is None and security not in (None, "plaintext"):
        if zookeepers is not None and zookeepers > 1:
            raise ClusterError("--security with --zookeepers is not supported")
        root.mkdir(parents=True, exist_ok=True)
        cluster_security.prepare(root, security)
    if layout is None and zookeepers is not None and zookeepers > 1:
        return _cluster_up_ensemble(root, brokers, zk_port, base_port, partitions, timeout, out, zookeepers)
    if layout is not None and layout.zk_ensemble:
        _check_same(layout, brokers, None, base_port, partitions)
        connect, started = ensure_ensemble(layout)
        print(f"ZooKeeper ensemble {'started' if started else 'already running'}: {connect}", file=out, flush=True)
        return _start_brokers(layout, connect, timeout, out)
    if zookeepers is not None and zookeepers != 1:
        raise ClusterError("--zookeepers must be an odd number (1, 3, 5...)" if zookeepers < 1 or zookeepers % 2 == 0
                           else f"{root / LAYOUT_FILE} holds a standalone ZooKeeper; use another --dir")
    if layout is None:
        n = 1 if brokers is None else brokers
        if n < 1:
            raise ClusterError("--brokers must be at least 1")
        root.mkdir(parents=True, exist_ok=True)
        zk, _ = ensure_zookeeper(root / "zookeeper", DEFAULT_ZK_PORT if zk_port is None else zk_port,
                                 cluster_security.zookeeper_tls(root))
        try:
            base = DEFAULT_BASE_PORT if base_port is None else base_port
            ports = free_ports(n) if base == 0 else list(range(base, base + n))
            if ports[-1] > 65535:
                raise ClusterError(f"broker ports {ports[0]}..{ports[-1]} exceed 65535")
            layout = Layout(root, zk.port, [BrokerSlot(i, p) for i, p in enumerate(ports)],
                            1 if partitions is None else partitions, security=security or "plaintext")
            layout.save()
        except BaseException:
            zk.stop()  # nothing records it yet: do not leave it orphaned
            raise
        print(f"ZooKeeper started: pid {zk.pid}, {zk.connect_string}{_zk_tls_note(root)}", file=out, flush=True)
    else:
        _check_same(layout, brokers, zk_port, base_port, partitions)
        zk, started = ensure_zookeeper(layout.zk_dir, layout.zk_port, cluster_security.zookeeper_tls(root))
        if layout.zk_port != zk.port:  # a layout saved before its ZooKeeper port was known
            layout.zk_port = zk.port
            layout.save()
        print(f"ZooKeeper {'started' if started else 'already running'}: pid {zk.pid}, {zk.connect_string}"
              f"{_zk_tls_note(root)}", file=out, flush=True)
    return _start_brokers(layout, zk.connect_string, timeout, out)


def _cluster_up_ensemble(root, brokers, zk_port, base_port, partitions, timeout, out, zookeepers) -> Layout:
    from kbroker.zk import local

    n = 1 if brokers is None else brokers
    if n < 1:
        raise ClusterError("--brokers must be at least 1")
    if zookeepers % 2 == 0:
        raise ClusterError("--zookeepers must be an odd number (1, 3, 5...)")
    root.mkdir(parents=True, exist_ok=True)
    ensemble = _ensemble_ports(zookeepers, zk_port)
    try:
        nodes = local.start_ensemble(root / "zookeeper", zookeepers, ports=ensemble)
    except (local.ZooKeeperStartError, local.ZooKeeperNotInstalled, ValueError) as e:
        raise ClusterError(f"cannot start the ZooKeeper ensemble: {e}") from None
    try:
        base = DEFAULT_BASE_PORT if base_port is None else base_port
        ports = free_ports(n) if base == 0 else list(range(base, base + n))
        layout = Layout(root, ensemble[0][0], [BrokerSlot(i, p) for i, p in enumerate(ports)],
                        1 if partitions is None else partitions, ensemble)
        layout.save()
    except BaseException:
        for node in nodes:
            node.stop()
        raise
    print(f"ZooKeeper ensemble started: {layout.zk_connect} (pids {', '.join(str(x.pid) for x in nodes)})",
          file=out, flush=True)
    return _start_brokers(layout, layout.zk_connect, timeout, out)


def _start_brokers(layout: Layout, zk_connect: str, timeout: float, out) -> Layout:
    for slot in layout.brokers:
        layout.broker_dir(slot.id).mkdir(exist_ok=True)
        cfg = layout.config_path(slot.id)
        if not cfg.exists():
            cfg.write_text(broker_properties(layout, slot))
        try:
            BrokerConfig.from_file(cfg)  # refuse a broken (edited) config here, not in a log file
        except ConfigError as e:
            raise ClusterError(f"{cfg}: {e}") from None

    client = _kazoo(zk_connect, tls=cluster_security.kazoo_tls(layout.root))
    try:
        cluster_security.register_admin(client, layout.root, layout.security)
        started: list[Started] = []
        for slot in layout.brokers:
            pid = running_broker_pid(layout, slot.id)
            if pid is not None:
                print(f"broker {slot.id} already running: pid {pid}, port {slot.port}", file=out, flush=True)
                log_path = layout.log_path(slot.id)
                log_start = log_path.stat().st_size if log_path.exists() else 0
                started.append(Started(slot, None, pid, log_start, None))
                continue
            if port_in_use(slot.port):
                raise ClusterError(f"port {slot.port} for broker {slot.id} is in use by another process")
            stale = client.exists(f"/brokers/ids/{slot.id}")
            popen, log_start = start_broker(layout, slot)
            print(f"broker {slot.id} starting: pid {popen.pid}, port {slot.port}, log {layout.log_path(slot.id)}",
                  file=out, flush=True)
            started.append(Started(slot, popen, popen.pid, log_start, stale.czxid if stale else None))
        for s in started:
            # Each broker gets its own full deadline, counted from when we got to it.
            wait_ready(client, layout, s, timeout)
            print(f"broker {s.slot.id} ready: registered and answering on {LOOPBACK}:{s.slot.port}",
                  file=out, flush=True)
        wait_cluster_metadata(layout, timeout)
    finally:
        client.stop()
        client.close()
    if layout.security != "plaintext":
        print(f"{layout.security.upper()} listeners; admin client properties (--command-config): "
              f"{layout.root / cluster_security.CLIENT_PROPERTIES}", file=out, flush=True)
    print(f"bootstrap.servers={layout.bootstrap_servers}", file=out, flush=True)
    return layout


def _check_same(layout: Layout, brokers, zk_port, base_port, partitions) -> None:
    where = layout.root / LAYOUT_FILE
    if brokers is not None and brokers != len(layout.brokers):
        raise ClusterError(f"{where} holds a cluster of {len(layout.brokers)} broker(s), not {brokers}; "
                           "use another --dir for a different size")
    if zk_port and zk_port != layout.zk_port:
        raise ClusterError(f"{where} records ZooKeeper port {layout.zk_port}, not {zk_port}")
    if base_port and base_port != layout.brokers[0].port:
        raise ClusterError(f"{where} records broker ports starting at {layout.brokers[0].port}, not {base_port}")
    if partitions is not None and partitions != layout.num_partitions:
        raise ClusterError(f"{where} records num.partitions={layout.num_partitions}; "
                           "edit the brokers' server.properties to change it")


def cluster_down(root: Path, timeout: float = STOP_TIMEOUT_S, out=sys.stdout) -> None:
    from kbroker.zk import local

    root = root.resolve()
    layout = Layout.load(root)
    if layout is None:
        raise ClusterError(f"no cluster in {root} ({LAYOUT_FILE} not found)")
    pids = {}
    for slot in layout.brokers:
        pid = running_broker_pid(layout, slot.id)
        if pid is not None:
            pids[slot.id] = pid
        else:
            print(f"broker {slot.id} not running", file=out, flush=True)
    killed = stop_pids(list(pids.values()), timeout)
    for broker_id, pid in pids.items():
        how = f"killed after {timeout:g}s" if pid in killed else "stopped"
        print(f"broker {broker_id} {how} (pid {pid})", file=out, flush=True)
    for slot in layout.brokers:
        layout.pid_path(slot.id).unlink(missing_ok=True)
    for i, d in enumerate(layout.zk_node_dirs or [layout.zk_dir]):
        name = f"ZooKeeper node {i + 1}" if layout.zk_ensemble else "ZooKeeper"
        zk = local.find_running(d)
        if zk is not None:
            zk.stop()
            print(f"{name} stopped (pid {zk.pid})", file=out, flush=True)
        else:
            print(f"{name} not running", file=out, flush=True)


def cluster_status(root: Path, out=sys.stdout) -> bool:
    """Print the table; True when ZooKeeper runs and every broker is registered."""
    from kbroker.zk import local

    root = root.resolve()
    layout = Layout.load(root)
    if layout is None:
        raise ClusterError(f"no cluster in {root} ({LAYOUT_FILE} not found)")
    nodes = [local.find_running(d) for d in layout.zk_node_dirs or [layout.zk_dir]]
    zk = None if not all(nodes) else nodes[0]   # "running" = every node of the ensemble runs
    registered: set[str] | None = None
    if zk is not None:
        client = _kazoo(layout.zk_connect, timeout=5.0, tls=cluster_security.kazoo_tls(layout.root))
        try:
            registered = set(client.get_children("/brokers/ids")) if client.exists("/brokers/ids") else set()
        finally:
            client.stop()
            client.close()
    rows = [("BROKER", "PORT", "PID", "STATE")]
    healthy = zk is not None
    for slot in layout.brokers:
        pid = running_broker_pid(layout, slot.id)
        if pid is None:
            state = "stopped"
        elif registered is not None and str(slot.id) in registered:
            state = "registered"
        else:
            state = "running"
        healthy &= state == "registered"
        rows.append((str(slot.id), str(slot.port), "-" if pid is None else str(pid), state))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip(), file=out)
    if layout.zk_ensemble:
        for (client_port, _, _), node in zip(layout.zk_ensemble, nodes):
            print(f"zookeeper {LOOPBACK}:{client_port} " + (f"pid {node.pid} running" if node else "stopped"),
                  file=out)
    elif zk is not None:
        print(f"zookeeper {zk.connect_string} pid {zk.pid} running", file=out)
    else:
        print(f"zookeeper {LOOPBACK}:{layout.zk_port} stopped", file=out)
    out.flush()
    return healthy


# --------------------------------------------------------------------------------------------------
# argparse wiring

def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port (0..65535; 0 = any free port)")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cluster", help="run a local ZooKeeper and brokers",
                       description="Start, stop and inspect a local cluster kept in a directory.")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    up = actions.add_parser("up", help="start ZooKeeper and N brokers (only what is not running)")
    up.add_argument("--dir", required=True, type=Path, help="cluster directory")
    up.add_argument("--brokers", type=int, help="number of brokers, ids 0..N-1 (default 1)")
    up.add_argument("--zk-port", type=_port, help=f"ZooKeeper port (default {DEFAULT_ZK_PORT}; 0 = free port)")
    up.add_argument("--port", type=_port,
                    help=f"first broker port, then +1 per broker (default {DEFAULT_BASE_PORT}; 0 = free ports)")
    up.add_argument("--partitions", type=int, help="num.partitions for the brokers (default 1)")
    up.add_argument("--zookeepers", type=int,
                    help="ZooKeeper nodes: 1 = standalone (default), 3 or 5 = an ensemble (client ports from "
                         "--zk-port on, peer/election ports 2888+/3888+; --zk-port 0 = free ports)")
    up.add_argument("--security", choices=cluster_security.MODES,
                    help="the brokers' listener (default plaintext); ssl, sasl_plaintext and sasl_ssl make a CA, "
                         "certificates and an admin super user, written to DIR/client.properties, and serve "
                         "ZooKeeper over TLS only (DIR/zk-tls.properties for --zk-tls-config-file)")
    up.add_argument("--timeout", type=float, default=READY_TIMEOUT_S,
                    help=f"seconds each broker may take to become ready (default {READY_TIMEOUT_S:.0f})")
    up.set_defaults(func=_run_up)

    down = actions.add_parser("down", help="stop the brokers (SIGTERM, then SIGKILL) and ZooKeeper")
    down.add_argument("--dir", required=True, type=Path, help="cluster directory")
    down.add_argument("--timeout", type=float, default=STOP_TIMEOUT_S,
                      help=f"seconds to wait after SIGTERM before SIGKILL (default {STOP_TIMEOUT_S:.0f})")
    down.set_defaults(func=_run_down)

    status = actions.add_parser("status", help="show brokers and ZooKeeper (exit 0 when all are up)")
    status.add_argument("--dir", required=True, type=Path, help="cluster directory")
    status.set_defaults(func=_run_status)


def _fail(e: Exception) -> int:
    print(f"kbroker cluster: {e}", file=sys.stderr)
    return 1


def _run_up(args: argparse.Namespace) -> int:
    try:
        cluster_up(args.dir, args.brokers, args.zk_port, args.port, args.partitions, args.timeout,
                   zookeepers=args.zookeepers, security=args.security)
    except ClusterError as e:
        return _fail(e)
    return 0


def _run_down(args: argparse.Namespace) -> int:
    try:
        cluster_down(args.dir, args.timeout)
    except ClusterError as e:
        return _fail(e)
    return 0


def _run_status(args: argparse.Namespace) -> int:
    try:
        return 0 if cluster_status(args.dir) else 1
    except ClusterError as e:
        return _fail(e)
