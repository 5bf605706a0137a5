"""spark_bench's marginal cost per GB with the probe of the same round subtracted, on hand-made phase times."""
from __future__ import annotations


def test_spark_marginal_cost_subtracts_the_probe_of_the_same_round():
    from kbroker.perf.spark_bench import marginal_over_probe
    probe = [{"write": 1.0, "read": 1.0, "expected": None, "write_cpu": 1.0},
             {"write": 2.0, "read": 1.0, "expected": None, "write_cpu": 1.0}]
    runs = {"1.0": [{"write": 6.0, "read": 4.0, "write_cpu": 5.0}, {"write": 7.0, "read": 4.0, "write_cpu": 5.0}],
            "2.0": [{"write": 11.0, "read": 7.0, "write_cpu": 9.0}, {"write": 12.0, "read": 9.0, "write_cpu": 9.0}]}
    out = marginal_over_probe(runs, probe)
    assert out["marginal_s_per_GB_over_probe"]["write"] == {"1.0": [5.0, 5.0, 5.0], "2.0": [5.0, 5.0, 5.0]}
    assert out["marginal_s_per_GB_over_probe"]["read"]["2.0"] == [3.5, 3.0, 4.0]
    assert out["marginal_spread_over_probe"]["write"]["met"] is True
    assert out["marginal_spread_over_probe"]["read"]["spread"] == round(3.5 / 3.0, 3)
    assert out["model_1TB"]["write"]["mb_per_s_per_core"] == 100.0
    assert out["marginal_s_per_GB_over_probe"]["write_cpu"]["2.0"] == [4.0, 4.0, 4.0]
    assert out["model_1TB"]["write"]["core_seconds_per_TB_cpu"] == 4000.0
    assert "core_seconds_per_TB_cpu" not in out["model_1TB"]["read"]
    assert "expected" not in out["model_1TB"]
