"""Loopback ports for the processes kbroker starts locally (``kbroker cluster``, ``LocalCluster``,
ZooKeeper, the benchmarks' targets): picking free ones and probing whether one is taken.

A picked port is free when picked, not reserved: another process may bind it before ours does, and
the starter then reports the bind failure (or retries on another port).
"""
from __future__ import annotations

import os
import socket

LOOPBACK = "127.0.0.1"


# Under pytest-xdist every worker picks from its own block below Linux's ephemeral range (32768+): a
# port picked there (bound later, by the process it is for) is never picked by another worker, nor taken
# meanwhile by a client's outgoing connection.
_WORKER_PORT_BASE = 20000
_WORKER_PORT_BLOCK = 500
_next_in_block = 0


def _worker_block() -> int | None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit():
        return _WORKER_PORT_BASE + int(worker[2:]) * _WORKER_PORT_BLOCK
    return None


def _from_block(first: int, taken: set[int]) -> int:
    global _next_in_block
    for _ in range(_WORKER_PORT_BLOCK):
        port = first + _next_in_block
        _next_in_block = (_next_in_block + 1) % _WORKER_PORT_BLOCK
        if port not in taken and not port_in_use(port):
            return port
    raise OSError(f"no free port in {first}..{first + _WORKER_PORT_BLOCK - 1}")


def free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports (each socket stays bound until all are chosen)."""
    first = _worker_block()
    if first is not None:
        taken: set[int] = set()
        for _ in range(count):
            taken.add(_from_block(first, taken))
        return sorted(taken)
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind((LOOPBACK, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


def port_in_use(port: int) -> bool:
    """True when ``port`` cannot be bound on the loopback address. SO_REUSEADDR: only a live socket
    counts, not connections left in TIME_WAIT."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return True
    return False


def port_open(port: int, timeout: float = 0.5) -> bool:
    """True when something accepts a TCP connection on the loopback ``port``."""
    try:
        with socket.create_connection((LOOPBACK, port), timeout=timeout):
            return True
    except OSError:
        return False
