"""Process identity from /proc: is a pid alive, and is it still the command we started?

Pid files outlive processes and pids get recycled, so stopping "the broker in broker.pid" must first
check that the pid still runs our command line."""
from __future__ import annotations

from pathlib import Path


def live_argv(pid: int) -> list[bytes] | None:
    """The argv of a live process, or None if it is gone or a zombie (exited, not yet reaped)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":
        return None
    return argv


def die_with_parent(sig: int = 15):
    """A ``preexec_fn`` for test and benchmark children: the kernel sends ``sig`` (SIGTERM) to the child
    when the thread that started it exits, so a test run killed by a timeout cannot leave brokers or
    ZooKeeper servers behind. (Linux ``PR_SET_PDEATHSIG``; tied to the starting *thread*.)"""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1

    def _arm():
        libc.prctl(pr_set_pdeathsig, sig, 0, 0, 0)
    return _arm
