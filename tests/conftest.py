import pytest


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory):
    """One real ZooKeeper (Debian's package) for the whole test session, on a free loopback port.

    tickTime 1000 ms: sessions may be negotiated between 2 s and 20 s.
    Yields a ``kbroker.zk.local.ZkProcess`` (``.connect_string``, ``.port``, ``.tick_time_ms``).
    Tests should isolate themselves under a chroot (``f"{zk_server.connect_string}/<unique>"``).
    """
    from kbroker.zk.local import start_zookeeper

    proc = start_zookeeper(tmp_path_factory.mktemp("zookeeper"), port=0, tick_time_ms=1000, die_with_parent=True)
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def kafka_cluster(tmp_path_factory):
    """One ZooKeeper + one kbroker broker for the whole session (tests use their own topic names).
    Auto-created topics get 3 partitions. Fault tests start their own LocalCluster."""
    from kbroker.testing import LocalCluster

    with LocalCluster(tmp_path_factory.mktemp("cluster"), brokers=1, num_partitions=3) as cluster:
        yield cluster


@pytest.fixture
def bootstrap(kafka_cluster):
    return kafka_cluster.bootstrap


# Timing-sensitive or CPU-heavy tests: on a busy machine they would measure the other workers,
# so scripts/test.sh runs them alone after the parallel run (marker `serial`).
SERIAL = ("tests/perf/", "tests/spark/", "tests/cluster/test_network_looplag.py",
          "tests/cluster/test_event_loop_clients.py", "tests/unit/perf/test_latency_limiter.py",
          # event-loop stall bounds, idle percentage, replication throttle rates
          "tests/cluster/test_broker_fetch.py::test_huge_list_offsets_does_not_hold_the_loop",
          "tests/cluster/test_broker_fetch.py::test_huge_admin_requests_do_not_hold_the_loop",
          "tests/hostile/test_hostile_attacks.py::test_huge_metadata_request_does_not_hold_the_loop",
          "tests/cluster/test_metrics.py::test_idle_percent_falls_under_load",
          "tests/cluster/test_configs_broker.py::"
          "test_rate_set_through_the_api_throttles_a_follower_and_delete_lifts_it",
          "tests/cluster/test_replication_throttle.py::",
          # a step-down deadline measured against the session timeout; a 4 s session forced to expire (with
          # four workers on two cores the broker's loop lags past its lease and it fences itself again)
          "tests/cluster/test_broker_lifecycle.py::test_forced_session_expiry_reregisters_and_serves",
          "tests/cluster/test_zombie_leader.py::test_zombie_leader_steps_down_before_its_session_expires")


def pytest_addoption(parser):
    parser.addoption("--serial-tests", choices=("all", "skip", "only"), default="all",
                     help="run the `serial` tests with the others (all), leave them out (skip) or run only them "
                          "(only); scripts/test.sh uses skip for its parallel run and only for the serial one")


# The parallel run hands out work units (a file each) in this order (scripts/test.sh: --dist loadgroup
# --no-loadscope-reorder): the cluster and hostile files first, the many short unit-test files last,
# where they fill the workers' tails. (xdist's own reorder puts the files with the most tests first,
# which left the long fault files with few tests for the end.)
_RUN_ORDER = ("tests/cluster/", "tests/hostile/", "tests/unit/")


def _run_rank(nodeid: str) -> int:
    return next((i for i, prefix in enumerate(_RUN_ORDER) if nodeid.startswith(prefix)), len(_RUN_ORDER))


@pytest.hookimpl(tryfirst=True)     # before xdist's own hook, which reads xdist_group into the nodeid
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.startswith(SERIAL):
            item.add_marker(pytest.mark.serial)
        # one work unit per file: its module-scoped cluster starts once
        item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    items.sort(key=lambda item: _run_rank(item.nodeid))   # stable: a file's tests keep their order
    which = config.getoption("--serial-tests")
    if which == "all":
        return
    keep, drop = [], []
    for item in items:
        (keep if (item.get_closest_marker("serial") is not None) == (which == "only") else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
