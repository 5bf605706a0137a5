"""The built wheel works on its own: installed into a fresh virtualenv and run from outside the source
tree, `kbroker cluster up` starts ZooKeeper and a broker, and the demo round-trips records with kcat.
Building without the compression headers, or importing a source tree without its native build, stops
with one line saying what to do."""
import os
import runpy
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(900)  # a whole native build: slow when the parallel run shares the cores
def test_wheel_installs_and_runs_a_cluster(tmp_path):
    wheels = tmp_path / "wheels"
    # --no-build-isolation: build with this environment's pinned Cython/setuptools (no second download).
    # -O0: the packaging is under test, not the code's speed (an -O3 build costs minutes of CPU).
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(wheels), str(ROOT)], check=True, timeout=600, env=dict(os.environ, KBROKER_OPT="-O0"))
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


def _setup_checks():
    """setup.py's functions without running setup() (it runs only as __main__)."""
    return runpy.run_path(str(ROOT / "setup.py"), run_name="kbroker_setup")


def test_build_stops_with_one_line_naming_the_packages_when_a_header_is_missing(tmp_path):
    check = _setup_checks()["check_compression_headers"]
    for header in ("zlib.h", "lz4.h"):
        (tmp_path / header).write_text("")
    with pytest.raises(SystemExit) as e:
        check([str(tmp_path)])
    message = str(e.value.code)
    assert "\n" not in message and "zstd.h" in message and "zlib.h" not in message
    assert "apt-get install zlib1g-dev liblz4-dev libzstd-dev" in message
    (tmp_path / "zstd.h").write_text("")
    check([str(tmp_path)])                    # all three present: the build goes on


def test_compiler_include_dirs_honour_cpath_and_build_ext_dirs(monkeypatch, tmp_path):
    include_dirs = _setup_checks()["compiler_include_dirs"]
    monkeypatch.setenv("CPATH", str(tmp_path / "cpath"))
    dirs = include_dirs([str(tmp_path / "given")])
    assert dirs[:2] == [str(tmp_path / "given"), str(tmp_path / "cpath")] and dirs[-1] == "/usr/include"


def test_source_tree_without_native_build_says_how_to_build_it(tmp_path):
    # A copy of kbroker/ alone: its kbroker._native (ext/, mapped at install time) is absent. -S keeps
    # site-packages (and this checkout's editable install) off the path.
    shutil.copytree(ROOT / "kbroker", tmp_path / "kbroker", ignore=shutil.ignore_patterns("__pycache__"))
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    r = subprocess.run([sys.executable, "-S", "-c", "import kbroker.log"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: kbroker's native extensions (kbroker._native) are not built")
    assert "scripts/setup.sh" in last and "pip install ." in last


def test_the_tls_extension_is_built_only_with_openssl_headers(monkeypatch):
    extensions = _setup_checks()["extensions"]
    built = {e.name: e for e in extensions()}
    assert built["kbroker._native.tls"].libraries == ["ssl", "crypto"]      # the headers are installed here
    monkeypatch.setitem(extensions.__globals__["OPTIONAL"], "tls", ("no/such/ssl.h", ["ssl", "crypto"]))
    names = {e.name for e in extensions()}
    assert "kbroker._native.tls" not in names and "kbroker._native.request" in names
