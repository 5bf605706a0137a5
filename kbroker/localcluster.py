"""The one runner of local broker processes: start ``python -m kbroker serve --config FILE`` with its
output in a log file, wait until it is ready, stop it by its PID. ``kbroker cluster up|down``
(kbroker.cli.cluster: detached brokers that outlive the command, pid files) and the tests' and
benchmarks' ``LocalCluster`` (kbroker.testing: child brokers that die with the thread that started
them) are built on it; ZooKeeper comes from kbroker.zk.local for both.

Ready means: a registration at ``/brokers/ids/<id>`` newer than the one the caller knew of (after a
kill -9 the old session's node lingers until it expires), and the caller's probe passing (an ApiVersions
v0 answer, and for LocalCluster the controller's metadata too). The wait is woken by a ZooKeeper watch;
a bounded poll catches a crash or the listener coming up. Everything binds to the loopback address.
"""
from __future__ import annotations

import os
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

from kbroker.ports import LOOPBACK

API_VERSIONS_KEY = 18


class BrokerExited(RuntimeError):
    """The broker process ended while we waited for it to become ready."""


class BrokerNotReady(TimeoutError):
    """The broker did not become ready in time; ``registered`` says how far it got."""

    def __init__(self, message: str, registered: bool, last_probe: str):
        super().__init__(message)
        self.registered = registered
        self.last_probe = last_probe


# --------------------------------------------------------------------------------------------------
# Start

def broker_argv(config_path: Path, prefix=()) -> list[str]:
    """The broker's command line (``prefix``: run it under another command, e.g. setpriv)."""
    return [*prefix, sys.executable, "-m", "kbroker", "serve", "--config", str(config_path)]


def spawn_broker(config_path: Path, log_path: Path, *, banner: str | None = None, cwd=None, env=None,
                 prefix=(), preexec_fn=None) -> tuple[subprocess.Popen, int]:
    """Start a broker in its own session (a Ctrl-C aimed at the starter is not a broker crash), its
    stdout and stderr appended to ``log_path`` after ``banner``. -> (Popen, where its output starts in
    the log)."""
    with open(log_path, "ab") as log:
        if banner:
            log.write(banner.encode())
            log.flush()
        log_start = log.tell()
        popen = subprocess.Popen(broker_argv(config_path, prefix), stdin=subprocess.DEVNULL, stdout=log,
                                 stderr=subprocess.STDOUT, cwd=cwd, env=env, start_new_session=True,
                                 preexec_fn=preexec_fn)
    return popen, log_start


# --------------------------------------------------------------------------------------------------
# Readiness

def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def api_versions_probe(port: int, host: str = LOOPBACK, timeout: float = 2.0) -> str | None:
    """Send a hand-encoded ApiVersions v0 request; None if the broker answered with error_code 0,
    else why not. Encoded here on purpose: it checks the broker without trusting our own codec."""
    correlation_id = random.randrange(1, 2**31)
    client_id = b"kbroker-cluster-up"
    # Request header v1: api_key, api_version, correlation_id, client_id (int16 length + bytes);
    # the v0 body is empty.
    body = struct.pack(">hhih", API_VERSIONS_KEY, 0, correlation_id, len(client_id)) + client_id
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(struct.pack(">i", len(body)) + body)
            (size,) = struct.unpack(">i", _recv_exact(sock, 4))
            if not 6 <= size <= 1 << 20:
                return f"response frame of implausible size {size}"
            frame = _recv_exact(sock, size)
    except (OSError, EOFError) as e:
        return f"{type(e).__name__}: {e}"
    got_id, error_code = struct.unpack_from(">ih", frame)
    if got_id != correlation_id:
        return f"correlation id {got_id} in the response, expected {correlation_id}"
    if error_code != 0:
        return f"ApiVersions error_code {error_code}"
    return None


def metadata_probe(port: int, host: str = LOOPBACK, timeout: float = 2.0) -> tuple[set[int], int] | None:
    """(broker ids, controller id) from the broker's Metadata answer (v1, no topics); None if it
    does not answer. A broker lists the others once the controller's UpdateMetadata reached it."""
    from .protocol import api

    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(api.encode_request(3, 1, 1, "kbroker-cluster-up", {"topics": []}))
            (size,) = struct.unpack(">i", _recv_exact(sock, 4))
            _, body = api.decode_response(3, 1, memoryview(_recv_exact(sock, size)))
    except (OSError, EOFError, ValueError, struct.error):
        return None
    return {b["node_id"] for b in body["brokers"]}, body["controller_id"]


def wait_broker_ready(zk, broker_id: int, exited, probe, stale_czxid: int | None, timeout: float) -> int:
    """Until broker ``broker_id`` has a registration other than ``stale_czxid`` and ``probe()`` returns
    None (else a reason) -> the registration's czxid. ``exited()``: None while the process runs, else
    how it ended (BrokerExited). BrokerNotReady after ``timeout`` seconds. ``zk``: a started kazoo client."""
    deadline = time.monotonic() + timeout
    path = f"/brokers/ids/{broker_id}"
    changed = threading.Event()
    czxid = None
    last_probe = "not probed yet"
    while True:
        ended = exited()
        if ended is not None:
            raise BrokerExited(ended)
        if czxid is None:
            changed.clear()
            stat = zk.exists(path, watch=lambda event: changed.set())
            czxid = stat.czxid if stat is not None and stat.czxid != stale_czxid else None
        if czxid is not None:
            last_probe = probe() or ""
            if not last_probe:
                return czxid
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            state = "registered in ZooKeeper" if czxid is not None else f"not registered at {path}"
            raise BrokerNotReady(f"{state}; last probe: {last_probe}", czxid is not None, last_probe)
        # Woken at once by the znode watch; the cap bounds how late a crash or the listener is seen.
        changed.wait(min(0.1 if czxid is not None else 0.25, remaining))


# --------------------------------------------------------------------------------------------------
# Stop

def reap(pid: int) -> None:
    """Collect ``pid`` if it is our own exited child (in-process use); harmless otherwise."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _gone(pid: int) -> bool:
    if pid_alive(pid):
        return False
    reap(pid)
    return True


def stop_pids(pids: list[int], timeout: float) -> list[int]:
    """SIGTERM every pid, wait up to ``timeout`` for all, SIGKILL the rest. Returns the killed pids."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    pending = list(pids)
    while pending and time.monotonic() < deadline:
        pending = [p for p in pending if not _gone(p)]
        if pending:
            time.sleep(0.05)  # these are not our children in general: nothing to block on
    for pid in pending:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while not all(_gone(p) for p in pending) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pending


def stop_child(popen: subprocess.Popen, timeout: float) -> None:
    """stop_pids for a broker we started as our child: SIGTERM, SIGKILL after ``timeout``, reaped."""
    if popen.poll() is not None:
        return
    popen.terminate()
    try:
        popen.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait(timeout=10)
