"""Run a local standalone ZooKeeper from Debian's ``zookeeper`` package.

The package ships no usable service unit for our needs, so we start
``ZooKeeperServerMain`` ourselves with a generated ``zoo.cfg``. Everything the
server needs lives in ``data_dir``: ``zoo.cfg``, the snapshot/txn logs
(``version-2/``), ``zookeeper.log`` and ``zookeeper.pid``. The pid file lets a
later process (``kbroker cluster down``) find and stop a server that an earlier
process started.

Readiness is ``srvr`` answering ``Mode: standalone``: ``ruok`` answers before
the database is loaded, and clients connecting then are dropped.

``start_ensemble`` runs an odd-sized quorum instead (``QuorumPeerMain``, one data dir per node with
its ``myid``); a node is ready when ``srvr`` says ``Mode: leader`` or ``Mode: follower``, i.e. a
quorum has formed. ``start_node`` restarts one node of it (fault tests kill and restart nodes).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from kbroker import procutil
from kbroker.ports import LOOPBACK, free_port, free_ports, port_in_use
from kbroker.procutil import live_argv

ZOOKEEPER_JAR = "/usr/share/java/zookeeper.jar"
ZOOKEEPER_CONF_DIR = "/etc/zookeeper/conf"
SLF4J_SIMPLE_JAR = "/usr/share/java/slf4j-simple.jar"
MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
QUORUM_MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
MYID_FILE = "myid"

# TLS (secureClientPort) needs ZooKeeper's Netty server; Debian's netty-all.jar is an empty
# aggregate, so the module jars it would stand for go on the classpath (package libnetty-java).
NETTY_JARS = tuple(f"/usr/share/java/netty-{m}.jar"
                   for m in ("buffer", "codec", "common", "handler", "resolver", "transport"))

CONFIG_FILE = "zoo.cfg"
LOG_FILE = "zookeeper.log"
PID_FILE = "zookeeper.pid"

_INSTALL_HINT = "install Debian's zookeeper package (apt-get install -y zookeeper)"


class ZooKeeperNotInstalled(RuntimeError):
    """java or the ZooKeeper jar is missing."""


class ZooKeeperStartError(RuntimeError):
    """The server died during start-up or did not become ready in time."""


def four_letter_word(port: int, word: str, host: str = LOOPBACK, timeout: float = 1.0,
                     tls: ssl.SSLContext | None = None) -> str:
    """Send a four-letter command (``srvr``, ``ruok``, ``conf``...) and return the reply text; ``tls``:
    over TLS (ZooKeeper's Netty server answers them on its secure port too)."""
    with socket.create_connection((host, port), timeout=timeout) as raw:
        sock = tls.wrap_socket(raw, server_hostname=host) if tls is not None else raw
        sock.sendall(word.encode("ascii"))
        chunks = []
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


@dataclass(frozen=True)
class ServerTls:
    """A TLS client port next to the plaintext one: ``keystore`` a PEM file with the server's key
    (unencrypted) and certificate chain, ``truststore`` a PEM file of the CAs client certificates are
    checked with; ``client_auth`` is ZooKeeper's ssl.clientAuth (need, want or none).

    ``probe_keystore`` (a PEM client key and certificate from that CA) makes the TLS port the only one:
    no plaintext client port is bound, and this module's own readiness checks go over TLS with it."""
    keystore: str
    truststore: str
    client_auth: str = "need"
    probe_keystore: str | None = None

    @property
    def tls_only(self) -> bool:
        return self.probe_keystore is not None

    def probe_context(self) -> ssl.SSLContext:
        """The client side of this module's four-letter-word probes on the TLS port."""
        ctx = ssl.create_default_context(cafile=self.truststore)
        ctx.load_cert_chain(self.probe_keystore)
        return ctx

    def config_lines(self, port: int) -> str:
        return (f"secureClientPort={port}\n"
                f"secureClientPortAddress={LOOPBACK}\n"
                "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n"
                f"ssl.keyStore.location={self.keystore}\nssl.keyStore.type=PEM\n"
                f"ssl.trustStore.location={self.truststore}\nssl.trustStore.type=PEM\n"
                f"ssl.clientAuth={self.client_auth}\n")


class ZkProcess:
    """A ZooKeeper server process we started (``popen`` set) or re-attached to via the pid file."""

    def __init__(self, pid: int, port: int, data_dir: str | os.PathLike, tick_time_ms: int,
                 popen: subprocess.Popen | None = None):
        self.pid = pid
        self.port = port
        self.data_dir = Path(data_dir)
        self.tick_time_ms = tick_time_ms
        self.host = LOOPBACK
        self._popen = popen
        self.secure_port: int | None = None      # the TLS client port (start_zookeeper's tls)

    @property
    def connect_string(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def secure_connect_string(self) -> str | None:
        return None if self.secure_port is None else f"{self.host}:{self.secure_port}"

    def is_running(self) -> bool:
        if self._popen is not None:
            return self._popen.poll() is None
        return _pid_is_our_server(self.pid, self.data_dir)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL. Idempotent."""
        if self.is_running():
            try:
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            if not self._wait_exit(timeout):
                try:
                    os.kill(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self._wait_exit(timeout)
        elif self._popen is not None:
            self._popen.poll()  # reap
        pid_file = self.data_dir / PID_FILE
        try:
            if int(pid_file.read_text().strip()) == self.pid:
                pid_file.unlink()
        except (OSError, ValueError):
            pass

    def _wait_exit(self, timeout: float) -> bool:
        if self._popen is not None:
            try:
                self._popen.wait(timeout)
                return True
            except subprocess.TimeoutExpired:
                return False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not _pid_is_our_server(self.pid, self.data_dir):
                return True
            time.sleep(0.05)  # polling a non-child pid: there is nothing to block on
        return not _pid_is_our_server(self.pid, self.data_dir)

    def log_tail(self, lines: int = 40) -> str:
        return _tail(self.data_dir / LOG_FILE, 0, lines)

    def __enter__(self) -> "ZkProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"ZkProcess(pid={self.pid}, port={self.port}, data_dir={str(self.data_dir)!r})"


def find_running(data_dir: str | os.PathLike) -> ZkProcess | None:
    """Re-attach to a server started earlier (possibly by another process) on ``data_dir``.

    Returns None if there is no pid file or its pid is not our ZooKeeper (a stale
    pid file after a crash or reboot, or a recycled pid).
    """
    data_dir = Path(data_dir).resolve()
    try:
        pid = int((data_dir / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    if not _pid_is_our_server(pid, data_dir):
        return None
    cfg = _read_cfg(data_dir / CONFIG_FILE)
    secure = int(cfg["secureClientPort"]) if "secureClientPort" in cfg else None
    # a TLS-only server (ServerTls.tls_only) has no clientPort: its clients use the secure one
    proc = ZkProcess(pid, int(cfg.get("clientPort", secure)), data_dir, int(cfg.get("tickTime", 2000)))
    proc.secure_port = secure
    return proc


def start_zookeeper(data_dir: str | os.PathLike, port: int = 0, tick_time_ms: int = 2000, *,
                    ready_timeout: float = 30.0, java: str | None = None,
                    zookeeper_jar: str = ZOOKEEPER_JAR, die_with_parent: bool = False,
                    avoid_ports: frozenset | set = frozenset(), tls: ServerTls | None = None) -> ZkProcess:
    """Start a standalone server on 127.0.0.1 and return once it serves clients.

    ``die_with_parent`` (tests, benchmarks): the server gets SIGTERM if the starting thread exits, so a
    killed test run leaves no server behind. ``kbroker cluster up`` leaves it off: its server must
    outlive the command.

    ``port=0`` picks a free port, never one of ``avoid_ports`` (ports a caller picked for its brokers
    but has not bound yet); as the pick can race with another process binding it, a start that dies
    on a taken port is retried with a new one.

    ``tls``: also serve TLS clients on a free port (``secure_port`` of the answer); with
    ``tls.tls_only``, serve them only, on ``port`` (``port`` and ``secure_port`` are then the same).
    """
    java = java or _find_java()
    if not os.path.isfile(zookeeper_jar):
        raise ZooKeeperNotInstalled(f"{zookeeper_jar} not found: {_INSTALL_HINT}")
    missing = [j for j in NETTY_JARS if not os.path.isfile(j)] if tls else []
    if missing:
        raise ZooKeeperNotInstalled(f"{', '.join(missing)} not found: ZooKeeper's TLS needs Netty "
                                    f"(apt-get install -y libnetty-java)")
    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    running = find_running(data_dir)
    if running is not None:
        raise ZooKeeperStartError(
            f"a ZooKeeper (pid {running.pid}, port {running.port}) already runs on {data_dir}; "
            "use find_running() to re-attach")

    attempts = 5 if port == 0 else 1
    for attempt in range(attempts):
        chosen = port or free_port()
        while not port and chosen in avoid_ports:
            chosen = free_port()
        if port and port_in_use(port):
            raise ZooKeeperStartError(f"port {port} on {LOOPBACK} is already in use")
        try:
            if tls is not None and tls.tls_only:
                secure = chosen
            else:
                secure = None
                while tls is not None and (secure is None or secure in avoid_ports or secure == chosen):
                    secure = free_port()
            return _start_once(java, zookeeper_jar, data_dir, chosen, tick_time_ms, ready_timeout,
                               die_with_parent, tls, secure)
        except _PortTaken:
            if port:
                raise ZooKeeperStartError(f"port {port} on {LOOPBACK} is already in use") from None
            if attempt == attempts - 1:
                raise ZooKeeperStartError(f"no free port found after {attempts} attempts") from None
    raise AssertionError("unreachable")


class _PortTaken(Exception):
    pass


def _start_once(java: str, jar: str, data_dir: Path, port: int, tick_time_ms: int,
                ready_timeout: float, die_with_parent: bool = False, tls: ServerTls | None = None,
                secure_port: int | None = None) -> ZkProcess:
    cfg_path = data_dir / CONFIG_FILE
    plain = "" if tls is not None and tls.tls_only else f"clientPort={port}\nclientPortAddress={LOOPBACK}\n"
    cfg_path.write_text(
        f"tickTime={tick_time_ms}\n"
        f"dataDir={data_dir}\n"
        + plain +
        "maxClientCnxns=0\n"
        # Otherwise an admin HTTP server grabs port 8080.
        "admin.enableServer=false\n"
        "4lw.commands.whitelist=ruok,srvr,stat,mntr,conf\n"
        + (tls.config_lines(secure_port) if tls else ""))
    classpath = [ZOOKEEPER_CONF_DIR, jar]
    if os.path.isfile(SLF4J_SIMPLE_JAR):
        classpath.append(SLF4J_SIMPLE_JAR)  # the package has no slf4j binding: no log without it
    if tls:
        classpath += NETTY_JARS
    cmd = [java, "-Xms64m", "-Xmx256m", "-XX:+UseSerialGC", "-cp", ":".join(classpath),
           MAIN_CLASS, str(cfg_path)]
    log_path = data_dir / LOG_FILE
    with open(log_path, "ab") as log:
        log_start = log.tell()
        # A new session: the server must outlive the process that started it
        # (``kbroker cluster up`` exits) and ignore a Ctrl-C aimed at that process.
        popen = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 cwd=data_dir, start_new_session=True,
                                 preexec_fn=procutil.die_with_parent() if die_with_parent else None)
    (data_dir / PID_FILE).write_text(f"{popen.pid}\n")
    proc = ZkProcess(popen.pid, port, data_dir, tick_time_ms, popen)
    proc.secure_port = secure_port if tls else None

    probe = tls.probe_context() if tls is not None and tls.tls_only else None
    deadline = time.monotonic() + ready_timeout
    while True:
        if popen.poll() is not None:
            proc.stop()  # removes the pid file
            tail = _tail(log_path, log_start)
            # Without slf4j-simple the log is silent: also probe the port itself.
            if "BindException" in tail or port_in_use(port) or (secure_port and port_in_use(secure_port)):
                raise _PortTaken()
            raise ZooKeeperStartError(
                f"ZooKeeper exited with status {popen.returncode} during start-up; "
                f"{log_path} ends with:\n{tail}")
        # the secure port is bound after the plaintext one answers
        if _is_ready(port, data_dir, probe) and (not secure_port or port_in_use(secure_port)):
            return proc
        if time.monotonic() > deadline:
            proc.stop()
            raise ZooKeeperStartError(
                f"ZooKeeper not ready on port {port} after {ready_timeout:.0f}s; "
                f"{log_path} ends with:\n{_tail(log_path, log_start)}")
        time.sleep(0.05)  # poll interval of the readiness check


def _is_ready(port: int, data_dir: Path, tls: ssl.SSLContext | None = None) -> bool:
    try:
        if "Mode: standalone" not in four_letter_word(port, "srvr", tls=tls):
            return False
        # Make sure the answer comes from *our* server, not another one on that port.
        return f"dataDir={data_dir}/version-2\n" in four_letter_word(port, "conf", tls=tls)
    except OSError:
        return False


def _find_java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.access(os.path.join(java_home, "bin", "java"), os.X_OK):
        return os.path.join(java_home, "bin", "java")
    java = shutil.which("java")
    if java is None:
        raise ZooKeeperNotInstalled(f"java not found on PATH: {_INSTALL_HINT} (it pulls in a JRE)")
    return java


def _pid_is_our_server(pid: int, data_dir: Path) -> bool:
    """True if ``pid`` is a live (not zombie) ZooKeeperServerMain using ``data_dir``'s zoo.cfg."""
    cmdline = live_argv(pid)
    if cmdline is None:
        return False
    cfg = str(Path(data_dir).resolve() / CONFIG_FILE).encode()
    return (MAIN_CLASS.encode() in cmdline or QUORUM_MAIN_CLASS.encode() in cmdline) and cfg in cmdline


def _read_cfg(path: Path) -> dict[str, str]:
    cfg = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.lstrip().startswith("#"):
            cfg[key.strip()] = value.strip()
    return cfg


def _tail(path: Path, start: int, lines: int = 40) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(start)
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


# --- ensembles ---------------------------------------------------------------------------------

def ensemble_connect_string(nodes) -> str:
    return ",".join(n.connect_string for n in nodes)


def start_ensemble(root: str | os.PathLike, size: int = 3, tick_time_ms: int = 2000, *,
                   ports: list[tuple[int, int, int]] | None = None, ready_timeout: float = 60.0,
                   java: str | None = None, zookeeper_jar: str = ZOOKEEPER_JAR,
                   die_with_parent: bool = False) -> list[ZkProcess]:
    """Start a ``size``-node quorum on 127.0.0.1 (data dirs ``root/node-<i>``, myid i, 1-based) and
    return its nodes once every one serves as leader or follower. ``ports``: per node (client,
    peer, election); default: free ports."""
    if size < 1 or size % 2 == 0:
        raise ValueError(f"an ensemble needs an odd number of nodes, not {size}")
    java = java or _find_java()
    if not os.path.isfile(zookeeper_jar):
        raise ZooKeeperNotInstalled(f"{zookeeper_jar} not found: {_INSTALL_HINT}")
    root = Path(root).resolve()
    if not ports:
        picked = free_ports(3 * size)
        ports = [tuple(picked[3 * i:3 * i + 3]) for i in range(size)]
    servers = "".join(f"server.{i + 1}={LOOPBACK}:{peer}:{election}\n"
                      for i, (_, peer, election) in enumerate(ports))
    nodes = []
    try:
        for i, (client, _, _) in enumerate(ports):
            data_dir = root / f"node-{i + 1}"
            data_dir.mkdir(parents=True, exist_ok=True)
            running = find_running(data_dir)
            if running is not None:
                raise ZooKeeperStartError(f"a ZooKeeper (pid {running.pid}) already runs on {data_dir}")
            (data_dir / MYID_FILE).write_text(f"{i + 1}\n")
            (data_dir / CONFIG_FILE).write_text(
                f"tickTime={tick_time_ms}\ninitLimit=10\nsyncLimit=5\n"
                f"dataDir={data_dir}\nclientPort={client}\nclientPortAddress={LOOPBACK}\n"
                "maxClientCnxns=0\nadmin.enableServer=false\n"
                "4lw.commands.whitelist=ruok,srvr,stat,mntr,conf\n" + servers)
            nodes.append(_spawn(java, zookeeper_jar, data_dir, client, tick_time_ms, QUORUM_MAIN_CLASS,
                                die_with_parent))
        for node in nodes:
            _wait_quorum_ready(node, ready_timeout)
    except BaseException:
        for node in nodes:
            node.stop()
        raise
    return nodes


def start_nodes(data_dirs, *, ready_timeout: float = 60.0, java: str | None = None,
                zookeeper_jar: str = ZOOKEEPER_JAR, die_with_parent: bool = False) -> list[ZkProcess]:
    """(Re)start ensemble nodes from their existing zoo.cfg (all at once: a quorum may need several)
    and return once each serves in a quorum."""
    java = java or _find_java()
    nodes = []
    try:
        for d in data_dirs:
            d = Path(d).resolve()
            cfg = _read_cfg(d / CONFIG_FILE)
            nodes.append(_spawn(java, zookeeper_jar, d, int(cfg["clientPort"]), int(cfg.get("tickTime", 2000)),
                                QUORUM_MAIN_CLASS, die_with_parent))
        for node in nodes:
            _wait_quorum_ready(node, ready_timeout)
    except BaseException:
        for node in nodes:
            node.stop()
        raise
    return nodes


def start_node(data_dir: str | os.PathLike, **kw) -> ZkProcess:
    """Restart one ensemble node (fault tests); returns once it has rejoined a quorum."""
    return start_nodes([data_dir], **kw)[0]


def _spawn(java, jar, data_dir: Path, port: int, tick_time_ms: int, main_class: str,
           die_with_parent: bool) -> ZkProcess:
    classpath = [ZOOKEEPER_CONF_DIR, jar]
    if os.path.isfile(SLF4J_SIMPLE_JAR):
        classpath.append(SLF4J_SIMPLE_JAR)
    cmd = [java, "-Xms64m", "-Xmx256m", "-XX:+UseSerialGC", "-cp", ":".join(classpath), main_class,
           str(data_dir / CONFIG_FILE)]
    with open(data_dir / LOG_FILE, "ab") as log:
        popen = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 cwd=data_dir, start_new_session=True,
                                 preexec_fn=procutil.die_with_parent() if die_with_parent else None)
    (data_dir / PID_FILE).write_text(f"{popen.pid}\n")
    return ZkProcess(popen.pid, port, data_dir, tick_time_ms, popen)


def quorum_mode(port: int) -> str | None:
    """``leader`` / ``follower`` / ``standalone`` from ``srvr``; None when not serving."""
    try:
        for line in four_letter_word(port, "srvr").splitlines():
            if line.startswith("Mode: "):
                return line[6:].strip()
    except OSError:
        pass
    return None


def _wait_quorum_ready(node: ZkProcess, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if not node.is_running():
            node.stop()
            raise ZooKeeperStartError(f"ZooKeeper node {node.data_dir} exited during start-up; "
                                      f"{node.data_dir / LOG_FILE} ends with:\n{node.log_tail()}")
        if quorum_mode(node.port) in ("leader", "follower"):
            return
        if time.monotonic() > deadline:
            raise ZooKeeperStartError(f"ZooKeeper node {node.data_dir} not in a quorum after {timeout:.0f}s; "
                                      f"{node.data_dir / LOG_FILE} ends with:\n{node.log_tail()}")
        time.sleep(0.05)  # poll interval of the readiness check
