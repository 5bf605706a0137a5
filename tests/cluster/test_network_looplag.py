"""The loop-lag sampler (kbroker/network/looplag.py, ``KBROKER_LOOP_LAG_LOG``) on a real KafkaServer, on
both loops: a callback that holds the loop 40 ms shows as one stall of about that lag, with the loop
thread's CPU over it telling a busy callback (CPU ≈ wall) from a blocked one (CPU ≈ 0); without the
variable no file is written.
"""
from __future__ import annotations

import dataclasses
import time

import pytest

from kbroker import switches
from netserver import LOOPS, ServerThread

HOLD_S = 0.040


def _busy():
    end = time.thread_time() + HOLD_S      # CPU, not wall: the machine may preempt the loop meanwhile
    while time.thread_time() < end:
        pass


def _stalls(path):
    rows = []
    with open(path) as f:
        assert f.readline().startswith("# loop ")
        for line in f:
            fields = line.split()
            if not fields[1].startswith("n="):
                rows.append(tuple(float(x) for x in fields[1:]))   # lag, wall, cpu (ms)
    return rows


def _held(rows):
    """Stalls at least about as late as a hold."""
    return [r for r in rows if r[0] >= HOLD_S * 1e3 * 0.8]


@pytest.mark.parametrize("loop_name", LOOPS)
def test_a_held_loop_shows_as_one_stall_with_its_cpu(loop_name, tmp_path, monkeypatch):
    path = tmp_path / "lag-{pid}.txt"
    monkeypatch.setattr(switches, "current", dataclasses.replace(switches.current, loop_lag_log=str(path)))
    with ServerThread({}, loop_name=loop_name) as srv:
        time.sleep(0.05)
        srv.call(_busy)
        time.sleep(0.05)
        srv.call(lambda: time.sleep(HOLD_S))
        time.sleep(0.05)
        ticks = srv.call(lambda: srv.server._loop_lag.ticks)
    files = list(tmp_path.glob("lag-*.txt"))
    assert len(files) == 1 and "{pid}" not in files[0].name
    held = _held(_stalls(files[0]))
    assert ticks >= 20
    # (a loaded machine may add stalls of its own: each hold is looked for, not counted)
    assert any(r[2] >= HOLD_S * 1e3 for r in held), held                  # on the CPU for the hold
    assert any(r[1] >= HOLD_S * 1e3 and r[2] <= 0.3 * r[1] for r in held), held   # off the CPU for it


def test_off_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.setattr(switches, "current", dataclasses.replace(switches.current, loop_lag_log=None))
    with ServerThread({}) as srv:
        assert srv.call(lambda: srv.server._loop_lag) is None
