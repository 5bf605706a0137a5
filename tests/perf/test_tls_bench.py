"""perf/tls_bench.py on a small run: both listeners measured in both phases, with positive figures."""
from kbroker.perf.tls_bench import run


def test_tls_bench_small_run():
    lines = []
    best = run(records=3000, size=512, rounds=1, out=lines.append)
    assert set(best) == {(l, p) for l in ("PLAINTEXT", "SSL") for p in ("produce", "fetch")}
    assert all(mbps > 0 and cpu >= 0 for mbps, cpu in best.values())
    assert lines[-2].startswith("TLS/plaintext produce:") and lines[-1].startswith("TLS/plaintext fetch:")
