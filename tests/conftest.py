import pytest

pytest_plugins = ["cpu_by_file", "timeline"]   # --cpu-by-file=N, --timeline (tests/support/)


@pytest.fixture(scope="session", autouse=True)
def shared_zookeeper(tmp_path_factory):
    """One real ZooKeeper (Debian's package) per test process, started when first used: every
    LocalCluster of the process gets its own chroot on it (kbroker.testing.share_zookeeper) unless it
    asks for its own server (``own_zookeeper=True``) or names an ensemble. tickTime 1000 ms: sessions
    may be negotiated between 2 s and 20 s."""
    from kbroker import testing

    shared = testing.SharedZooKeeper(lambda: tmp_path_factory.mktemp("zookeeper"))
    testing.share_zookeeper(shared)
    try:
        yield shared
    finally:
        from cpu_by_file import counted_apart
        testing.share_zookeeper(None)
        with counted_apart():
            shared.stop()


@pytest.fixture(scope="session")
def zk_server(shared_zookeeper):
    """The process's ZooKeeper server (a ``kbroker.zk.local.ZkProcess``: ``.connect_string``, ``.port``,
    ``.tick_time_ms``). Tests isolate themselves under a chroot (``f"{zk_server.connect_string}/<unique>"``)."""
    return shared_zookeeper.server()


@pytest.fixture(scope="session")
def kafka_cluster(tmp_path_factory):
    """One broker for the whole session (tests use their own topic names), on the shared ZooKeeper.
    Auto-created topics get 3 partitions. Fault tests start their own LocalCluster."""
    from kbroker.testing import LocalCluster

    cluster = LocalCluster(tmp_path_factory.mktemp("cluster"), brokers=1, num_partitions=3)
    cluster.start()
    try:
        yield cluster
    finally:
        from cpu_by_file import counted_apart
        with counted_apart():
            cluster.stop()


@pytest.fixture
def bootstrap(kafka_cluster):
    return kafka_cluster.bootstrap


# Timing-sensitive tests: on a busy machine they would measure the other workers, so scripts/test.sh
# runs them alone, last (marker `serial`).
SERIAL = ("tests/cluster/test_network_looplag.py", "tests/unit/perf/test_latency_limiter.py",
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
          "tests/cluster/test_zombie_leader.py::test_zombie_leader_steps_down_before_its_session_expires",
          # quota rates held within 15%, a quota change applied within 1 s, a muted channel's duration
          "tests/cluster/test_quotas.py")

# CPU-heavy tests that assert no timing: the benchmark tools' smoke runs, the Spark jobs (each a JVM
# with its own worker threads) and the client round trips on the other event loop (a pytest run of its
# own). Spread over the four workers of the parallel run they took up to 3.5 times their time alone;
# scripts/test.sh runs them on two workers, a file each (marker `heavy`).
# Also a test that mostly waits (a minute of offsets retention): it fills the second worker of the heavy run,
# which finishes its files while the Spark unit still runs on the first.
HEAVY = ("tests/perf/", "tests/spark/test_spark_batch.py", "tests/spark/test_spark_jobs.py",
         "tests/spark/test_spark_stream.py", "tests/spark/test_spark_txn",
         "tests/cluster/test_event_loop_clients.py",
         "tests/cluster/test_groups_expiry.py::test_empty_group_offsets_expire_and_stay_expired")


def pytest_addoption(parser):
    parser.addoption("--serial-tests", choices=("all", "skip", "only", "heavy", "serial"), default="all",
                     help="run the `serial` and `heavy` tests with the others (all), leave them out (skip), run "
                          "only them (only), or only one kind (heavy, serial); scripts/test.sh runs skip on four "
                          "workers, then heavy on two, then serial alone")


def pytest_ignore_collect(collection_path, config):
    """With --serial-tests=heavy or serial, files holding none of those tests are not even imported
    (collecting the whole tree imports Spark, the clients and matplotlib: seconds per pytest run)."""
    which = config.getoption("--serial-tests")
    if which not in ("heavy", "serial"):
        return None
    rel = collection_path.relative_to(config.rootpath).as_posix()
    if rel == "tests":
        return None
    if collection_path.is_dir():
        rel += "/"
    files = {e.split("::")[0] for e in (HEAVY if which == "heavy" else SERIAL)}
    wanted = any(f.startswith(rel) or rel.startswith(f) for f in files)
    return None if wanted else True


# The runs hand out work units (a file each) in this order (scripts/test.sh: --dist loadgroup
# --no-loadscope-reorder): the Spark unit first (the heavy run's longest), then the cluster and hostile
# files, the many short unit-test files last, where they fill the workers' tails. (xdist's own reorder
# puts the files with the most tests first, which left the long fault files with few tests for the end.)
_RUN_ORDER = ("tests/spark/", "tests/cluster/", "tests/hostile/", "tests/unit/")


def _run_rank(nodeid: str) -> int:
    return next((i for i, prefix in enumerate(_RUN_ORDER) if nodeid.startswith(prefix)), len(_RUN_ORDER))


@pytest.hookimpl(tryfirst=True)     # before xdist's own hook, which reads xdist_group into the nodeid
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.startswith(SERIAL):
            item.add_marker(pytest.mark.serial)
        elif item.nodeid.startswith(HEAVY):
            item.add_marker(pytest.mark.heavy)
        # one work unit per file: its module-scoped cluster starts once; the Spark jobs one unit in all, so
        # that two Spark JVMs never share the cores (a Python worker then missed its connect-back timeout)
        heavy_spark = item.nodeid.startswith("tests/spark/") and item.get_closest_marker("heavy") is not None
        item.add_marker(pytest.mark.xdist_group("spark" if heavy_spark else item.nodeid.split("::")[0]))
    items.sort(key=lambda item: _run_rank(item.nodeid))   # stable: a file's tests keep their order
    which = config.getoption("--serial-tests")
    if which == "all":
        return
    wanted = {"skip": (), "only": ("serial", "heavy"), "heavy": ("heavy",), "serial": ("serial",)}[which]
    keep, drop = [], []
    for item in items:
        kind = next((k for k in ("serial", "heavy") if item.get_closest_marker(k) is not None), None)
        (keep if (kind in wanted if kind else which == "skip") else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
