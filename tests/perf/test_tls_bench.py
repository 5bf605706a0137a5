"""perf/tls_bench.py on a small run: both listeners measured in both phases and SASL_SSL connection
setups timed, with positive figures."""
from kbroker.perf.tls_bench import run


def test_tls_bench_small_run():
    lines = []
    best = run(records=3000, size=512, rounds=1, out=lines.append, handshakes=5)
    assert set(best) == {(l, p) for l in ("PLAINTEXT", "SSL") for p in ("produce", "fetch")} | {"handshakes"}
    assert all(rate > 0 and cpu >= 0 for rate, cpu in best.values())
    assert lines[-3].startswith("TLS/plaintext produce:") and lines[-2].startswith("TLS/plaintext fetch:")
    assert lines[-1].startswith("SASL_SSL connection setups")
