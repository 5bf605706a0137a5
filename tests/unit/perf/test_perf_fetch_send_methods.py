"""perf/fetch_send_methods.py: every send method delivers every range (the client process checks the
byte counts and fails on a short one) and the report names every method with positive figures.
Benchmark plumbing only: no timing assertion."""
from __future__ import annotations

import re

import pytest

from kbroker.perf import fetch_send_methods as fsm


def test_every_method_sends_every_range(tmp_path, capsys):
    methods = [*fsm.METHODS, "sendfile-nb@102400"]
    assert fsm.main(["--methods", ",".join(methods), "--rounds", "1", "--sends", "3", "--size-mib", "1",
                     "--dir", str(tmp_path), "--max-seconds", "30"]) == 0
    out = capsys.readouterr().out
    for m in methods:
        for unit in ("server CPU s/GB", "GB/s"):
            line = next(x for x in out.splitlines() if x.startswith(f"{m} ") and unit in x)
            assert float(re.search(r"median ([0-9.]+)", line).group(1)) > 0, line
    assert list(tmp_path.iterdir()) == []          # the range file is removed


def test_a_short_send_fails_the_pass(tmp_path, monkeypatch):
    real = fsm._send

    def short(method, sock, fd, mm, memory, pos, size, pipe, wait):
        return real(method, sock, fd, mm, memory, pos, size // 2, pipe, wait)
    monkeypatch.setattr(fsm, "_send", short)
    with pytest.raises((RuntimeError, TimeoutError, OSError)):
        fsm.main(["--methods", "memory", "--rounds", "1", "--sends", "2", "--size-mib", "1",
                  "--dir", str(tmp_path), "--max-seconds", "1"])
