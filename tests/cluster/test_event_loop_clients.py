"""The client round-trip suite (tests/test_clients_roundtrip.py: confluent-kafka, kafka-python, aiokafka,
kcat against a real broker) on the loop that is not the default (asyncio's selector loop; the rest of the
suite runs on the default, uvloop): run in a child pytest with KBROKER_EVENT_LOOP naming it, which every
broker it starts inherits. Invariant: every test passes there too, and the brokers it started ran that
loop (their logs say so; none names the other)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kbroker.config import DEFAULT_EVENT_LOOP, EVENT_LOOP_ENV, EVENT_LOOPS
import paths



@pytest.mark.slow
@pytest.mark.timeout(400)
def test_client_roundtrips_on_the_other_loop(tmp_path):
    other = next(loop for loop in EVENT_LOOPS if loop != DEFAULT_EVENT_LOOP)
    base = tmp_path / "run"
    env = dict(os.environ, **{EVENT_LOOP_ENV: other})
    r = subprocess.run([sys.executable, "-m", "pytest", "tests/cluster/test_clients_roundtrip.py", "-q", "-x",
                        "-p", "no:cacheprovider", "--basetemp", str(base)],
                       cwd=paths.ROOT, env=env, capture_output=True, text=True, timeout=380)
    tail = (r.stdout + r.stderr)[-3000:]
    assert r.returncode == 0, tail
    assert " passed" in r.stdout and " failed" not in r.stdout, tail
    loops = []
    for log in base.rglob("*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if "event loop: " in line and "(kbroker.event.loop)" in line:
                loops.append(line.split("event loop: ")[1].split()[0])
    assert loops and set(loops) == {other}, loops
