"""A rolling upgrade: three brokers start on a build of an earlier commit of this repository (OLD_COMMIT),
then each in turn is stopped with SIGTERM (controlled shutdown) and started on the current tree, on the
same data dirs, while an idempotent acks=all producer runs. Invariants: no write fails, the history
checker finds acked-but-lost 0, duplicates 0 and no inconsistent offset, and each broker really ran the
old code first (its ApiVersions lacks AlterReplicaLogDirs, which the current tree serves).

The old build: ``git archive`` of OLD_COMMIT installed with this venv's pip (``--no-build-isolation``:
this venv's Cython compiles its ext/*.pyx, at -O0) into ``--target`` of a cache directory keyed by the commit
(KBROKER_UPGRADE_CACHE, default <tmp>/kbroker-upgrade-builds/<commit>), reused by later runs. An old broker
runs from that directory (``env -C``: ``python -m`` puts the working directory first on sys.path)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from checkers import RawConn, read_all_confluent
from kbroker.testing import LocalCluster, wait_until
from paths import ROOT
from test_replication import TOPIC, state, wait_acks_grow
from test_rolling_restart import rf3_load

# The last commit of the session before AlterReplicaLogDirs, DescribeCluster, JBOD failure handling,
# security and transactions were added (2026-11-27).
OLD_COMMIT = "6754b9bf9f864959a51e507e68673026667ce24f"
API_VERSIONS, ALTER_REPLICA_LOG_DIRS = 18, 34
BUILD_TIMEOUT_S = 900


def _has_commit() -> bool:
    r = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{OLD_COMMIT}^{{commit}}"], capture_output=True)
    return r.returncode == 0


pytestmark = pytest.mark.skipif(not _has_commit(), reason=f"not a git checkout holding {OLD_COMMIT[:12]}")


def old_build() -> Path:
    """The installed old tree (a directory holding its ``kbroker`` package), built once per commit."""
    cache = Path(os.environ.get("KBROKER_UPGRADE_CACHE", Path(tempfile.gettempdir()) / "kbroker-upgrade-builds"))
    done = cache / OLD_COMMIT
    if (done / ".complete").exists():
        return done / "target"
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{OLD_COMMIT[:12]}-", dir=cache))
    try:
        (work / "src").mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", OLD_COMMIT], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(work / "src")], input=archive.stdout, check=True)
        # Compiled without optimisation: the test needs the old code's behaviour, not its speed, and on a
        # fresh checkout (CI) this build is part of the suite's time.
        setup_py = work / "src" / "setup.py"
        src = setup_py.read_text()
        assert '["-O3"]' in src, "the old setup.py no longer names its optimisation flag"
        setup_py.write_text(src.replace('["-O3"]', '["-O0"]'))
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--target", str(work / "target"), str(work / "src")], check=True, timeout=BUILD_TIMEOUT_S)
        shutil.rmtree(work / "src")
        (work / ".complete").write_text(OLD_COMMIT + "\n")
        try:
            os.rename(work, done)
        except OSError:
            if not (done / ".complete").exists():    # not another run's finished build
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return done / "target"


def api_keys(port) -> set:
    with RawConn(f"127.0.0.1:{port}") as c:
        return {k["api_key"] for k in c.request(API_VERSIONS, 0, {})["api_keys"]}


def test_rolling_upgrade_from_an_earlier_build_under_acks_all_load(tmp_path):
    t0 = time.monotonic()
    old = old_build()
    built_s = time.monotonic() - t0
    where = subprocess.run(["env", "-C", str(old), sys.executable, "-c", "import kbroker; print(kbroker.__file__)"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert where == str(old / "kbroker" / "__init__.py"), where
    c = LocalCluster(tmp_path, brokers=3, overrides={"replica.lag.time.max.ms": 5000})
    for b in c.brokers.values():
        b.command_prefix = ["env", "-C", str(old)]
    with c:
        assert all(ALTER_REPLICA_LOG_DIRS not in api_keys(b.port) for b in c.brokers.values())   # the old code
        hist, load = rf3_load(c)
        restarts = []
        try:
            wait_acks_grow(load, 300, timeout=60)
            for i, b in sorted(c.brokers.items()):
                t = time.monotonic()
                c.stop_broker(i)                    # SIGTERM: controlled shutdown
                assert b.proc.returncode == 0
                b.command_prefix = []               # the current tree
                c.start_broker(i)
                assert ALTER_REPLICA_LOG_DIRS in api_keys(b.port)
                wait_until(lambda: len(state(c)[2]) == 3, 60, f"broker {i} back in the ISR")
                restarts.append(time.monotonic() - t)
                wait_acks_grow(load, 300, timeout=60)
        finally:
            load.finish()
        read_all_confluent(c.bootstrap, TOPIC, 1, hist)
        report = hist.check()
        print(report.line(), f"; old build {'built' if built_s > 5 else 'cached'} in {built_s:.0f} s; restarts took",
              ", ".join(f"{s:.1f}s" for s in restarts), f"; wall {time.monotonic() - t0:.0f} s")
        assert report.acked >= 1200
        assert report.acked_lost == 0, report.line()
        assert report.duplicates == 0, report.line()
        assert report.inconsistent_offsets == 0, report.line()
        assert not hist.failed, list(hist.failed.items())[:5]
