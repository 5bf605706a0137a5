"""Test harness shipped with the package (asyncpg's _testbase idea): real ZooKeeper and real broker
processes on free loopback ports, state in a directory the caller owns, readiness waited on (never a
bare sleep), every process stopped by the PID we started.

    with LocalCluster(tmp_path, brokers=1, overrides={"log.segment.bytes": 65536}) as c:
        c.bootstrap            # "127.0.0.1:PORT"
        c.kill(0)              # SIGKILL broker 0 (no clean-shutdown marker)
        c.start_broker(0)      # restart it on the same port and data dir
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from kbroker.localcluster import (BrokerExited, api_versions_probe, metadata_probe, spawn_broker, stop_child,
                                  wait_broker_ready)
from kbroker.ports import free_port
from kbroker.procutil import die_with_parent
from kbroker.zk.local import start_zookeeper


def wait_until(predicate, timeout: float = 20.0, what: str = "condition", interval: float = 0.05):
    """Poll ``predicate`` until it returns a truthy value (returned); TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def api_versions_ok(port: int) -> bool:
    """True when a raw ApiVersions v0 request on the port gets a well-formed answer."""
    return api_versions_probe(port, timeout=1.0) is None


def controller_known(port: int):
    """The controller id in the broker's Metadata answer (v1, no topics) once the broker has applied
    the controller's first UpdateMetadata; None before (or when it does not answer)."""
    got = metadata_probe(port)
    return None if got is None or got[1] < 0 else got[1]


class BrokerProc:
    def __init__(self, broker_id: int, port: int, root: Path):
        self.broker_id = broker_id
        self.port = port
        self.dir = root / f"broker-{broker_id}"
        self.data_dir = self.dir / "data"
        self.config_path = self.dir / "server.properties"
        self.log_path = self.dir / "broker.log"
        self.proc: subprocess.Popen | None = None
        self.czxid = None   # czxid of our last registration: a restart must produce a new one
        self.extra: dict = {}   # this broker's own settings (e.g. advertised.listeners on a test proxy)
        self.command_prefix: list = []   # run the broker under this (e.g. setpriv dropping capabilities)

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


class ZkChroot:
    """A cluster's own namespace on a ZooKeeper server it shares: what ``LocalCluster.zk`` offers
    (``connect_string`` naming the chroot, ``port``, ``tick_time_ms``) without owning the process.
    The brokers create the chroot when they first connect."""

    def __init__(self, server, path: str):
        self.server = server
        self.path = path
        self.port = server.port
        self.host = server.host
        self.tick_time_ms = server.tick_time_ms

    @property
    def connect_string(self) -> str:
        return self.server.connect_string + self.path

    def is_running(self) -> bool:
        return self.server.is_running()

    def stop(self, timeout: float = 10.0) -> None:
        """Nothing to stop: the server belongs to whoever shares it."""


class SharedZooKeeper:
    """One ZooKeeper server for the LocalClusters of one process (a test worker), each under its own
    chroot: a standalone server costs more CPU to start (a JVM) than a one-broker cluster's broker.
    Started on first use; ``stop`` by the owner."""

    def __init__(self, data_dir_factory):
        self._data_dir_factory = data_dir_factory
        self._server = None
        self._clusters = 0

    def server(self, avoid_ports=frozenset()):
        """The running server (a ``kbroker.zk.local.ZkProcess``), started if need be."""
        if self._server is None or not self._server.is_running():
            self._server = start_zookeeper(self._data_dir_factory(), port=0, tick_time_ms=1000,
                                           die_with_parent=True, avoid_ports=avoid_ports)
        return self._server

    def chroot(self, avoid_ports=frozenset()) -> ZkChroot:
        server = self.server(avoid_ports)
        self._clusters += 1
        path = f"/cluster-{os.getpid()}-{self._clusters}"
        # created now: a client that connects under it before any broker did would find no chroot
        from kazoo.client import KazooClient
        zk = KazooClient(hosts=server.connect_string, timeout=10)
        zk.start(timeout=10)
        try:
            zk.ensure_path(path)
        finally:
            zk.stop()
            zk.close()
        return ZkChroot(server, path)

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None


_shared_zookeeper: SharedZooKeeper | None = None


def share_zookeeper(shared: SharedZooKeeper | None) -> None:
    """LocalClusters made from now on in this process use ``shared`` (None: each starts its own)."""
    global _shared_zookeeper
    _shared_zookeeper = shared


class LocalCluster:
    def __init__(self, root, brokers: int = 1, overrides: dict | None = None, session_timeout_ms: int = 6000,
                 num_partitions: int = 1, env: dict | None = None, zookeeper_connect: str | None = None,
                 own_zookeeper: bool = False, zk_tls: dict[str, str] | None = None):
        self.root = Path(root)
        # Kafka's zookeeper.ssl.* properties (with zookeeper.ssl.client.enable=true): every broker and the
        # cluster's own ZooKeeper clients use them, so zookeeper_connect may name a TLS-only port
        self.zk_tls = dict(zk_tls or {})
        # An ensemble (or proxy) the caller runs; None: a chroot on the process's shared ZooKeeper
        # (share_zookeeper) or, without one or with own_zookeeper, a standalone ZooKeeper of our own.
        self.external_zk = zookeeper_connect
        self.own_zookeeper = own_zookeeper
        self._chroot: ZkChroot | None = None
        self.root.mkdir(parents=True, exist_ok=True)
        self.overrides = dict(overrides or {})
        self.session_timeout_ms = session_timeout_ms
        self.num_partitions = num_partitions
        self.env = env
        self.zk = None
        self.brokers = {i: BrokerProc(i, free_port(), self.root) for i in range(brokers)}

    # ---- lifecycle ------------------------------------------------------------------------------
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    @property
    def zk_connect(self) -> str:
        return self.external_zk or self.zk.connect_string

    def start(self):
        avoid = {b.port for b in self.brokers.values()}
        if self.external_zk is None and _shared_zookeeper is not None and not self.own_zookeeper:
            # the same chroot again after a stop: it holds the cluster's id and topics, as a data dir would
            self._chroot = self._chroot or _shared_zookeeper.chroot(avoid_ports=avoid)
            self.zk = self._chroot
        elif self.external_zk is None:
            # The brokers' ports were picked (not bound) at construction: ZooKeeper must not take one.
            self.zk = start_zookeeper(self.root / "zookeeper", port=0, tick_time_ms=1000, die_with_parent=True,
                                      avoid_ports=avoid)
        try:
            for b in self.brokers:
                self.start_broker(b)
        except BaseException:
            self.stop()
            raise

    def write_config(self, b: BrokerProc, extra: dict | None = None):
        props = {
            "broker.id": b.broker_id,
            "listeners": f"PLAINTEXT://127.0.0.1:{b.port}",
            "log.dirs": str(b.data_dir),
            "zookeeper.connect": self.zk_connect,
            "zookeeper.session.timeout.ms": self.session_timeout_ms,
            "num.partitions": self.num_partitions,
            "offsets.topic.replication.factor": 1,
            "transaction.state.log.replication.factor": 1,
            "transaction.state.log.min.isr": 1,
        }
        props.update(self.zk_tls)
        props.update(self.overrides)
        props.update(b.extra)
        props.update(extra or {})
        b.dir.mkdir(parents=True, exist_ok=True)
        b.config_path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))

    def start_broker(self, broker_id: int, timeout: float = 60.0, extra: dict | None = None,
                     wait_controller: bool = True):
        """Start broker ``broker_id`` and wait until it is registered and answers; with
        ``wait_controller`` (default) also until it holds the controller's metadata."""
        b = self.brokers[broker_id]
        if b.running():
            raise RuntimeError(f"broker {broker_id} already running (pid {b.pid})")
        self.write_config(b, extra)
        env = dict(os.environ, **(self.env or {}))
        # Its own session (kbroker.localcluster); dies with the starting thread.
        b.proc, _ = spawn_broker(b.config_path, b.log_path, env=env, prefix=b.command_prefix,
                                 preexec_fn=die_with_parent())

        def exited():
            return None if b.proc.poll() is None else f"exited with {b.proc.returncode}"

        def probe():
            # Ready = registered, answering, and (wait_controller) holding the controller's metadata.
            if not api_versions_ok(b.port):
                return "no ApiVersions answer"
            if wait_controller and controller_known(b.port) is None:
                return "no controller in its metadata yet"
            return None

        zk = self._kazoo()
        try:
            b.czxid = wait_broker_ready(zk, broker_id, exited, probe, b.czxid, timeout)
        except BrokerExited as e:
            raise RuntimeError(f"broker {broker_id} {e}:\n{b.log_tail()}") from None
        except TimeoutError as e:
            raise TimeoutError(f"timed out after {timeout}s waiting for broker {broker_id} to register and "
                               f"answer: {e}") from None
        finally:
            zk.stop()
            zk.close()
        return b

    def registration_czxid(self, broker_id: int):
        """czxid of /brokers/ids/<id> (the broker epoch), or None when not registered."""
        zk = self._kazoo()
        try:
            stat = zk.exists(f"/brokers/ids/{broker_id}")
            return None if stat is None else stat.czxid
        finally:
            zk.stop()
            zk.close()

    def _kazoo(self):
        """A started ZooKeeper client of the cluster's connect string (over TLS with ``zk_tls``)."""
        from kazoo.client import KazooClient
        from kbroker.zk.client import kazoo_tls_from_properties

        zk = KazooClient(hosts=self.zk_connect, timeout=5, **(kazoo_tls_from_properties(self.zk_tls) or {}))
        try:
            zk.start(timeout=5)
        except BaseException:
            zk.close()
            raise
        return zk

    def kill(self, broker_id: int, sig=signal.SIGKILL):
        b = self.brokers[broker_id]
        if b.running():
            os.kill(b.proc.pid, sig)
            b.proc.wait(timeout=60)

    def stop_broker(self, broker_id: int, timeout: float = 30.0):
        b = self.brokers[broker_id]
        if b.running():
            stop_child(b.proc, timeout)

    def stop(self):
        for b in self.brokers:
            self.stop_broker(b)
        if self.zk is not None:
            self.zk.stop()
            self.zk = None

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{b.port}" for b in self.brokers.values())
