"""TLS against plaintext on one broker: produce and fetch MB/s and broker CPU per GB, with kcat.

One broker (kbroker.testing.LocalCluster) with a PLAINTEXT and an SSL listener; for each listener in
turn kcat produces ``--records`` records of ``--size`` bytes (acks=all, one partition, a topic of its
own) and then consumes them from the start to the end. Reported per listener and phase: MB/s of
payload (wall clock of the kcat process) and the broker's CPU seconds per GB of payload (utime+stime
of the broker process from /proc), and kcat's own CPU seconds per GB with its busiest thread's share
of a core (on a host where kcat and the broker share the cores, kcat's TLS work bounds the ratio too). Then ``--handshakes`` connection setups on a SASL_SSL listener
(TLS handshake, SCRAM-SHA-512 login, ApiVersions; kbroker's client, one after another): setups per
second and broker CPU milliseconds per setup. Runs are short and the machine shared: read the ratios,
repeat for figures. The best round is reported (highest MB/s, lowest CPU) with the range over rounds,
and the load average (the machine may be shared).

    python -m kbroker.perf.tls_bench [--records 200000] [--size 1024] [--rounds 1] [--handshakes 200]
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import tempfile
import time
from pathlib import Path

from kbroker.security.certs import loopback_pki
from kbroker.testing import LocalCluster, free_port

TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    return _cpu_s_of(f"/proc/{pid}/stat")


def _threads_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of ``pid`` ({} once it is gone)."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            out[int(tid)] = _cpu_s_of(f"/proc/{pid}/task/{tid}/stat")
        except (OSError, IndexError, ValueError):
            pass
    return out


def _cpu_s_of(path: str) -> float:
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _timed(pid: int, cmd: list[str], **kw) -> tuple[float, float, float, float]:
    """Run ``cmd`` (kcat) -> (wall s, broker CPU s, kcat CPU s, kcat's busiest thread CPU s). The
    client's figures say whether kcat itself bounds the run: its busiest thread (librdkafka's broker
    thread, which encrypts) near the wall time means one of its cores was full. Threads are sampled
    every 20 ms, so the busiest thread's figure may miss its last sample (a lower bound)."""
    cpu0, t0 = _cpu_s(pid), time.monotonic()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen(cmd, **kw)
    busiest: dict[int, float] = {}
    while proc.poll() is None:
        for tid, c in _threads_cpu_s(proc.pid).items():
            busiest[tid] = c
        time.sleep(0.02)
    wall, broker = time.monotonic() - t0, _cpu_s(pid) - cpu0
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    client = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, broker, client, max(busiest.values(), default=0.0)


def _handshakes(pid: int, port: int, ca: Path, n: int) -> tuple[float, float]:
    """(setups per second, broker CPU ms per setup) of ``n`` SASL_SSL connection setups."""
    import asyncio
    from kbroker.client.connection import BrokerConnection
    from kbroker.client.security import ClientSecurity
    sec = ClientSecurity.from_properties({
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": 'x required username="bench" password="bench-pw";',
        "ssl.truststore.type": "PEM", "ssl.truststore.location": str(ca)})

    async def go():
        for _ in range(n):
            conn = await BrokerConnection.open("127.0.0.1", port, security=sec)
            conn.close()
    cpu0, t0 = _cpu_s(pid), time.monotonic()
    asyncio.run(go())
    wall, cpu = time.monotonic() - t0, _cpu_s(pid) - cpu0
    return n / wall, cpu * 1000 / n


def run(records: int, size: int, rounds: int, out=print, handshakes: int = 0) -> dict:
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="kbroker-tls-bench-") as tmp:
        root = Path(tmp)
        loopback_pki(root)
        payload = root / "records.txt"
        line = b"x" * (size - 1) + b"\n"
        payload.write_bytes(line * records)
        mb = records * size / 1e6
        c = LocalCluster(root / "c", brokers=1, overrides={
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_SSL:SASL_SSL",
            "sasl.enabled.mechanisms": "SCRAM-SHA-512",
            "ssl.keystore.type": "PEM", "ssl.keystore.location": str(root / "broker.pem")})
        ssl_port, sasl_port = free_port(), free_port()
        b = c.brokers[0]
        b.extra = {"listeners": f"PLAINTEXT://127.0.0.1:{b.port},SSL://127.0.0.1:{ssl_port},"
                                f"SASL_SSL://127.0.0.1:{sasl_port}"}
        with c:
            pid = b.pid
            if handshakes:
                from kazoo.client import KazooClient
                from kbroker.security.sasl.scram import ScramCredential
                from kbroker.zk.credentials import alter_user_config
                zk = KazooClient(hosts=c.zk_connect, timeout=5)
                zk.start(timeout=5)
                try:
                    alter_user_config(zk, "bench", {"SCRAM-SHA-512": ScramCredential.from_password(
                        "SCRAM-SHA-512", "bench-pw", 4096).encode()})
                finally:
                    zk.stop()
                    zk.close()
                results["handshakes"] = _handshakes(pid, sasl_port, root / "ca.pem", handshakes)
            listeners = {"PLAINTEXT": (b.port, []), "SSL": (ssl_port, ["-X", "security.protocol=SSL",
                                                                     "-X", f"ssl.ca.location={root / 'ca.pem'}"])}
            for r in range(rounds):
                for name, (port, x) in listeners.items():
                    topic = f"bench-{name.lower()}-{r}"
                    base = ["kcat", "-b", f"127.0.0.1:{port}", *x, "-t", topic, "-q"]
                    for phase, cmd, kw in (
                            ("produce", [*base, "-P", "-p", "0", "-X", "acks=all", "-X", "linger.ms=5",
                                         "-l", str(payload)], {}),
                            ("fetch", [*base, "-C", "-p", "0", "-o", "beginning", "-e"],
                             {"stdout": subprocess.DEVNULL})):
                        wall, cpu, client, thread = _timed(pid, cmd, **kw)
                        gb = mb / 1000
                        results.setdefault((name, phase), []).append(
                            (mb / wall, cpu / gb, client / gb, thread / wall))
    out(f"{records} records of {size} B ({records * size / 1e6:.0f} MB) per run, {rounds} round(s), kcat, one broker, "
        f"load average {os.getloadavg()[0]:.2f} at the end")
    out(f"{'listener':<10} {'phase':<8} {'MB/s':>8} {'broker CPU s/GB':>16} {'kcat CPU s/GB':>14} "
        f"{'kcat busiest thread':>20}   per-round ranges")
    best = {}
    setups = results.pop("handshakes", None)
    for (name, phase), runs in sorted(results.items()):
        mbps = max(r[0] for r in runs)
        cpu = min(r[1] for r in runs)
        client = min(r[2] for r in runs)
        thread = max(r[3] for r in runs)
        best[(name, phase)] = (mbps, cpu)
        out(f"{name:<10} {phase:<8} {mbps:>8.1f} {cpu:>16.2f} {client:>14.2f} {thread:>14.2f} cores   "
            f"MB/s {min(r[0] for r in runs):.1f}-{mbps:.1f}, s/GB {cpu:.2f}-{max(r[1] for r in runs):.2f}, "
            f"kcat s/GB {client:.2f}-{max(r[2] for r in runs):.2f}, "
            f"busiest thread {min(r[3] for r in runs):.2f}-{thread:.2f}")
    for phase in ("produce", "fetch"):
        tls, plain = best[("SSL", phase)], best[("PLAINTEXT", phase)]
        # a small run can finish inside one tick of the broker's CPU clock: no ratio then, not a crash
        cpu_ratio = f"{tls[1] / plain[1]:.2f}x" if plain[1] > 0 else "n/a (no plaintext CPU measured)"
        out(f"TLS/plaintext {phase}: {tls[0] / plain[0]:.2f}x MB/s, {cpu_ratio} CPU per GB")
    if setups is not None:
        best["handshakes"] = setups
        out(f"SASL_SSL connection setups (TLS 1.3 + SCRAM-SHA-512 4096 iterations + ApiVersions): "
            f"{setups[0]:.1f}/s, broker CPU {setups[1]:.1f} ms per setup")
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=1024, help="record size in bytes, newline included")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--handshakes", type=int, default=200, help="SASL_SSL connection setups to time (0: none)")
    args = ap.parse_args(argv)
    run(args.records, args.size, args.rounds, handshakes=args.handshakes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
