"""perf/curve_latency.py's open-loop limiter (_throttled) with a stand-in producer: it sends at the offered
rate, and its ``quantum_ns`` bounds how often it sleeps (one sleep per record cost the real producer
~30% more CPU at 40,000 records/s: docs/perf/latency-tail.md)."""
from __future__ import annotations

import time

from kbroker.perf import curve_latency


class FakeProducer:
    def __init__(self):
        self.sent = []

    def produce(self, topic, value, partition=0, on_delivery=None):
        self.sent.append(value)
        on_delivery(None, _Msg(value))

    def poll(self, _timeout):
        return 0

    def flush(self, _timeout):
        return 0


class _Msg:
    def __init__(self, value):
        self._value = value

    def value(self):
        return self._value


def _run(monkeypatch, quantum_ns):
    sleeps = []
    real_sleep = time.sleep

    def counting_sleep(s):
        sleeps.append(s)
        real_sleep(s)

    monkeypatch.setattr(curve_latency.time, "sleep", counting_sleep)
    p = FakeProducer()
    r = curve_latency._throttled(p, "t", 1, 20_000, 2_000, 5.0, 1, quantum_ns)
    return p, r, sleeps


def test_the_quantum_bounds_the_sleeps_not_the_rate(monkeypatch):
    p, r, sleeps = _run(monkeypatch, 1_000_000)          # 1 ms: ~20 records per wake at 20,000/s
    assert len(p.sent) == r["sent"] == r["delivered"] == 2_000
    assert r["seconds"] >= 0.095                         # 2,000 records at 20,000/s: not sent faster
    assert r["achieved_rate"] <= 21_000
    assert len(sleeps) <= 150, len(sleeps)               # ~100 wakes, not one per record
    assert min(sleeps) >= 0.001


def test_without_a_quantum_it_sleeps_until_each_record_is_due(monkeypatch):
    p, r, sleeps = _run(monkeypatch, 0)
    assert len(p.sent) == 2_000
    assert r["seconds"] >= 0.095
    assert min(sleeps) < 0.0002                          # short sleeps, up to one per record
