"""Smoke tests of the pyperf suites (perf/micro.py, perf/macro.py).

Each suite runs in pyperf's quickest mode (``--debug-single-value``: one worker, one value, one
loop per benchmark), writes pyperf JSON with ``-o``, and ``pyperf compare_to`` must accept two such
files. No timing is asserted: the figures of a one-loop run on a shared machine mean nothing.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pyperf
import pytest

from kbroker.perf import inputs, micro

TIMEOUT_S = 240


def run_suite(module: str, out, *extra) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", module, "--debug-single-value", "--quiet", "-o", str(out), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}"
    return proc


def load_names(path) -> list[str]:
    suite = pyperf.BenchmarkSuite.load(str(path))
    for bench in suite.get_benchmarks():
        assert bench.get_unit() == "second"
        assert bench.get_nvalue() >= 1 and all(v > 0 for v in bench.get_values())
    return suite.get_benchmark_names()


def compare(a, b) -> str:
    proc = subprocess.run([sys.executable, "-m", "pyperf", "compare_to", str(a), str(b), "--table"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_micro_suite_writes_pyperf_json_that_compare_to_accepts(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    run_suite("kbroker.perf.micro", a)
    names = load_names(a)
    assert names == list(micro.BENCHMARKS)
    for size in ("128B", "1KiB", "4KiB", "64KiB", "1MiB"):
        assert f"crc32c_ours_{size}" in names and f"crc32c_pkg_{size}" in names
    json.loads(a.read_text())       # plain JSON too
    # A second (smaller) run: compare_to reports the benchmarks both files hold.
    run_suite("kbroker.perf.micro", b, "--select", "^(crc32c_ours_1KiB|index_lookup_native_64Ki_entries)$")
    assert load_names(b) == ["crc32c_ours_1KiB", "index_lookup_native_64Ki_entries"]
    table = compare(a, b)
    assert "crc32c_ours_1KiB" in table and "index_lookup_native_64Ki_entries" in table


def test_macro_suite_against_its_own_broker(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    run_suite("kbroker.perf.macro", a)
    run_suite("kbroker.perf.macro", b)
    names = load_names(a)
    assert names == ["produce_req_1MiB_4x256KiB_1KiB_records", "fetch_req_1MiB_4x256KiB_1KiB_records"]
    assert load_names(b) == names
    payload = pyperf.BenchmarkSuite.load(str(a)).get_benchmarks()[0].get_metadata()["payload_bytes"]
    assert 1000 * inputs.KiB < payload <= inputs.MiB
    table = compare(a, b)
    assert all(n in table for n in names)


def test_list_and_select():
    out = subprocess.run([sys.executable, "-m", "kbroker.perf.micro", "--list", "--select", "^crc32c_"],
                         capture_output=True, text=True, timeout=60, check=True).stdout.split()
    assert out == [n for n in micro.BENCHMARKS if n.startswith("crc32c_")] and len(out) == 10


@pytest.mark.parametrize("n,label", [(128, "128B"), (1024, "1KiB"), (65536, "64KiB"),
                                     (1 << 20, "1MiB"), (1000, "1000B")])
def test_size_label(n, label):
    assert inputs.size_label(n) == label


def test_inputs_are_seeded_and_batches_restampable():
    from kbroker._native.batch import validate_and_stamp
    assert inputs.random_buffers(64, 2, "x") == inputs.random_buffers(64, 2, "x")
    assert inputs.random_buffers(64, 1, "x") != inputs.random_buffers(64, 1, "y")
    batch = inputs.fill_batch(16 * inputs.KiB, 100, "t", timestamp_ms=1)
    assert len(batch) <= 16 * inputs.KiB
    ring = inputs.BatchRing([batch], total_bytes=4 * len(batch))
    for _ in range(3):      # every pass hands out batches the broker accepts again
        for buf in ring.take(len(ring)):
            assert validate_and_stamp(buf, 7, 0, inputs.MiB, -1).base_offset == 7


def test_arrow_decode_matches_records():
    import pyarrow  # noqa: F401  (pinned in requirements/dev.txt)
    from kbroker._native.batch import decode_records
    batch = inputs.fill_batch(inputs.MiB, 100, "arrow-test", max_records=500)
    rb = micro.batch_to_arrow(batch)
    recs = decode_records(batch)
    assert rb.num_rows == len(recs) == 500
    assert rb.column("offset").to_pylist() == [r[0] for r in recs]
    assert rb.column("value").to_pylist() == [r[3] for r in recs]
    assert rb.column("key").to_pylist() == [r[2] for r in recs]
