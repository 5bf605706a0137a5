"""The built wheel works on its own: installed into a fresh virtualenv and run from outside the source
tree, `kbroker cluster up` starts ZooKeeper and a broker, and the demo round-trips records with kcat."""
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_installs_and_runs_a_cluster(tmp_path):
    wheels = tmp_path / "wheels"
    # --no-build-isolation: build with this environment's pinned Cython/setuptools (no second download).
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(wheels), str(ROOT)], check=True, timeout=600)
    (wheel,) = wheels.glob("kbroker-*.whl")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)],
                   check=True, timeout=600)

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    run = dict(cwd=outside, env=env, capture_output=True, text=True, timeout=180)
    # The installed package, not the source tree, is what runs.
    where = subprocess.run([str(py), "-c", "import kbroker, kbroker._native.batch as b; print(b.__file__)"], **run)
    assert where.returncode == 0, where.stderr
    assert str(env_dir) in where.stdout and str(ROOT) not in where.stdout

    kbroker = env_dir / "bin" / "kbroker"
    cluster = tmp_path / "cluster"
    up = subprocess.run([str(kbroker), "cluster", "up", "--brokers", "1", "--dir", str(cluster),
                         "--port", "0", "--zk-port", "0"], **run)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        last = up.stdout.strip().splitlines()[-1]
        assert last.startswith("bootstrap.servers=127.0.0.1:")
        demo = subprocess.run([str(py), "-m", "kbroker.demo", "--bootstrap-server", last.split("=", 1)[1]], **run)
        assert demo.returncode == 0, demo.stdout + demo.stderr
        assert "round trip ok: 5 records" in demo.stdout
    finally:
        down = subprocess.run([str(kbroker), "cluster", "down", "--dir", str(cluster)], **run)
        assert down.returncode == 0, down.stdout + down.stderr
