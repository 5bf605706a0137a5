"""--timeline (tests/support/timeline.py): each worker's busy time, finish and last files, and the tail."""
from timeline import worker_summary


def test_summary_names_each_workers_finish_and_the_tail():
    started = 1000.0
    workers = {
        "gw1": {"tests/cluster/test_long.py": (1010.0, 1300.0)},
        "gw0": {"tests/unit/a/test_a.py": (1000.0, 1005.0), "tests/unit/a/test_b.py": (1005.0, 1100.0),
                "tests/cluster/test_c.py": (1100.0, 1120.0), "tests/cluster/test_d.py": (1120.0, 1150.0)},
    }
    lines = worker_summary(workers, started)
    assert lines[0] == ("gw0: 4 files, busy 150 s, done at 150 s; last: test_b.py 5-100, test_c.py 100-120, "
                        "test_d.py 120-150")
    assert lines[1] == "gw1: 1 files, busy 290 s, done at 300 s; last: test_long.py 10-300"
    assert lines[2] == "tail: workers finished between 150 s and 300 s (150 s apart)"


def test_machine_cpu_counts_busy_ticks_below_the_total():
    from timeline import machine_cpu
    busy, total = machine_cpu()
    assert 0 < busy < total
