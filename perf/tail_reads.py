"""Syscalls per small fetch, counted by ``strace -c`` on the broker over the same request count: a
consumer at the log end (``--reader tail``: Fetch v11, one request in flight, offsets cycling over the last
8 one-record batches) or one reading batch after batch from older data (``--reader sequential``, as
request_bench's small-fetch workload does), with the segments' recent-batch list and read blocks
(kbroker's default) and without them (``KBROKER_SEGMENT_TAIL_BATCHES=0``, ``KBROKER_SEGMENT_READ_BLOCKS=0``).

    python -m kbroker.perf.tail_reads [--fetches 5000] [--reader tail|sequential]

Syscall counts do not depend on how loaded the (shared) machine is, unlike CPU time. Each variant runs one
broker (``LocalCluster``: real ZooKeeper, log dir in a temp dir), 3,000 one-record batches produced by
confluent-kafka (request_bench's fill), stopped by its PID. Needs strace (Debian's package).
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from kbroker.testing import LocalCluster

from .request_bench import _fill_sizes, fetch_run

BATCHES = 3000
SYSCALLS = ("pread64", "sendto", "recvfrom", "epoll_wait", "sendfile")


def _counts(strace_out: Path) -> dict:
    counts = {}
    for line in strace_out.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[-1] in SYSCALLS and parts[3].isdigit():
            counts[parts[-1]] = int(parts[3])
    return counts


VARIANTS = (("default", {}),
            ("no read blocks", {"KBROKER_SEGMENT_READ_BLOCKS": "0"}),
            ("neither", {"KBROKER_SEGMENT_READ_BLOCKS": "0", "KBROKER_SEGMENT_TAIL_BATCHES": "0"}))


def run(fetches: int, reader: str = "tail") -> dict:
    if shutil.which("strace") is None:
        raise SystemExit("strace is needed (apt-get install strace)")
    out = {}
    with tempfile.TemporaryDirectory(prefix="kbroker-tail-") as tmp:
        root = Path(tmp)
        # tail: the last 8 batches over and over; sequential: one batch after the other from offset 0
        n = max(BATCHES, fetches + 300)
        first, span = (n - 8, 8) if reader == "tail" else (0, None)
        for i, (name, env) in enumerate(VARIANTS):
            with LocalCluster(root / str(i), num_partitions=1, env=env or None) as c:
                _fill_sizes(c.bootstrap, "tail", [170], {170: n})
                pid = c.brokers[0].pid
                fetch_run(c.bootstrap, "tail", pid, n - 8, 200, 50, 1, 60.0, span=8)    # warm-up
                trace = root / f"{i}.strace"
                st = subprocess.Popen(["strace", "-f", "-c", "-o", str(trace), "-p", str(pid)],
                                      stderr=subprocess.DEVNULL)
                try:
                    time.sleep(1.0)                  # strace attaches to every thread
                    fetch_run(c.bootstrap, "tail", pid, first, fetches, 10, 1, 300.0, span=span)
                finally:
                    st.terminate()
                    st.wait(30)
                counts = _counts(trace)
                out[name] = {k: round(v / fetches, 2) for k, v in counts.items()}
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m kbroker.perf.tail_reads", description=__doc__.split("\n")[0])
    ap.add_argument("--fetches", type=int, default=5000)
    ap.add_argument("--reader", choices=("tail", "sequential"), default="tail")
    args = ap.parse_args(argv)
    res = run(args.fetches, args.reader)
    print(f"syscalls per {args.reader} fetch ({args.fetches:,} fetches, 1 in flight):")
    for name, per in res.items():
        print(f"  {name:15s} " + "  ".join(f"{k} {per.get(k, 0):.2f}" for k in SYSCALLS))


if __name__ == "__main__":
    main()
