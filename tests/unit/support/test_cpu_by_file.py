"""--cpu-by-file (tests/support/cpu_by_file.py) charges each file the CPU of its tests and of the children
they reaped, with and without pytest-xdist: a pytest run of its own over two files, one whose test makes a
child burn CPU and one whose test only sleeps."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from paths import ROOT

BURN = '''import subprocess, sys
def test_burns_in_a_child():
    code = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.6:\\n    pass"
    subprocess.run([sys.executable, "-c", code], check=True)
'''
SLEEP = '''import time
def test_sleeps():
    time.sleep(0.6)
'''


@pytest.mark.parametrize("workers", [None, 2])
def test_files_are_charged_their_own_cpu(tmp_path, workers):
    (tmp_path / "test_burn.py").write_text(BURN)
    (tmp_path / "test_sleep.py").write_text(SLEEP)
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["cpu_by_file"]\n')
    # only the plugins this needs (hypothesis alone takes seconds to import on a busy machine)
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
            "-p", "no:timeout", "--cpu-by-file=5", "--rootdir", str(tmp_path), "-c", "/dev/null", str(tmp_path)]
    args += ["-n", str(workers)] if workers else ["-p", "no:xdist"]
    env = {"PYTHONPATH": str(ROOT / "tests" / "support"), "PATH": "/usr/bin:/bin"}
    r = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = {m.group(3): (float(m.group(1)), float(m.group(2)))
            for m in re.finditer(r"^\s*([\d.]+) CPU-s\s+([\d.]+) s\s+(\S+)$", r.stdout, re.M)}
    assert "test files by CPU" in r.stdout, r.stdout[-3000:]
    burn, sleep = rows["test_burn.py"], rows["test_sleep.py"]
    assert burn[0] >= 0.5, rows                 # the child's 0.6 s, counted once reaped
    assert sleep[0] < 0.3 and sleep[1] >= 0.55, rows
