"""The Spark jobs run as users run them: bulk_load with plain python (local[2]) against the session
broker, and the throughput job with spark-submit on a real Spark standalone cluster (one master,
two workers, separate processes started from pyspark's own launcher on 127.0.0.1) against a
three-broker kbroker cluster with replication factor 3."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import pytest

from kbroker.testing import free_port, wait_until
from spark_util import create_topic, jvm_env, produce

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(900)


def _env():
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return jvm_env(env)


def test_bulk_load_to_parquet_with_count_check(bootstrap, tmp_path):
    import pyarrow.parquet as pq
    topic = f"sbulk-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 3)
    n = produce(bootstrap, topic, ((i % 3, b"k%d" % i, b"value-%d" % i, [("h", b"1")]) for i in range(5000)), "snappy")
    out, report = tmp_path / "out", tmp_path / "report.json"
    r = subprocess.run([sys.executable, "-m", "kbroker.spark.bulk_load", "--bootstrap-servers", bootstrap,
                        "--subscribe", topic, "--output", str(out), "--master", "local[2]", "--include-headers",
                        "--partition-by", "partition", "--report", str(report)],
                       env=_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    rep = json.loads(report.read_text())
    assert rep["ok"] and rep["rows_written"] == n == rep["offsets_planned"] and rep["offsets_without_rows"] == 0
    assert f"loaded {n} rows from 3 topic-partitions" in r.stdout
    t = pq.read_table(out)
    assert sorted(t.column("value").to_pylist()) == sorted(b"value-%d" % i for i in range(n))


@pytest.fixture
def spark_standalone(tmp_path):
    """Master + two workers (1 core, 1 GB each) from pyspark's spark-class; stopped by PID."""
    import pyspark
    home = Path(pyspark.__file__).parent
    env = dict(_env(), SPARK_HOME=str(home), SPARK_LOG_DIR=str(tmp_path / "spark-logs"),
               SPARK_WORKER_DIR=str(tmp_path / "spark-work"))
    port, ui = free_port(), free_port()
    procs = []

    def launch(name, *args):
        log = open(tmp_path / f"{name}.log", "wb")
        p = subprocess.Popen([str(home / "bin" / "spark-class"), *args], env=env, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
        procs.append((p, log))
        return p

    try:
        launch("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
               "--webui-port", str(ui))
        for i in range(2):
            launch(f"worker{i}", "org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}",
                   "--host", "127.0.0.1", "--cores", "1", "--memory", "1g", "--webui-port", str(free_port()),
                   "--work-dir", str(tmp_path / f"work{i}"))

        def workers_alive():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as resp:
                    return json.load(resp).get("aliveworkers", 0) == 2
            except OSError:
                return False
        wait_until(workers_alive, timeout=120, what="two Spark workers registered", interval=0.5)
        yield {"master": f"spark://127.0.0.1:{port}", "home": home, "env": env, "ui": ui}
    finally:
        for p, log in reversed(procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)
            log.close()


@pytest.mark.slow
def test_throughput_job_on_standalone_cluster_three_brokers(spark_standalone, tmp_path):
    from kbroker.testing import LocalCluster
    report = tmp_path / "throughput.json"
    with LocalCluster(tmp_path / "kbroker", brokers=3) as cluster:
        cmd = [str(spark_standalone["home"] / "bin" / "spark-submit"), "--master", spark_standalone["master"],
               "--conf", "spark.executor.memory=512m", "--conf", "spark.ui.enabled=false",
               str(ROOT / "spark" / "throughput.py"), "--bootstrap-servers", cluster.bootstrap,
               "--gb", "0.03", "--record-size", "1000", "--partitions", "4", "--replication-factor", "3",
               "--compression", "lz4", "--report", str(report)]
        r = subprocess.run(cmd, env=spark_standalone["env"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    rep = json.loads(report.read_text())
    assert rep["ok"], rep["verify"]
    s = rep["settings"]
    assert s["spark_master"] == spark_standalone["master"] and s["replication_factor"] == 3
    assert s["records"] == 30_000 and sum(v["read_records"] for v in rep["verify"].values()) == 30_000
    assert set(rep["phases"]) == {"write", "read", "expected"}
    assert all("cpu_seconds_local" in v for v in rep["phases"].values())
    # both workers ran executors of the job
    with urllib.request.urlopen(f"http://127.0.0.1:{spark_standalone['ui']}/json/", timeout=5) as resp:
        state = json.load(resp)
    app = state["completedapps"][0]
    assert app["cores"] >= 2, app
    print("throughput on standalone (2 workers, 3 brokers, RF 3):",
          {k: v["MB_per_s"] for k, v in rep["phases"].items()})


def test_tree_cpu_seconds_counts_descendants():
    # The throughput report's cpu_seconds_local: a descendant's CPU must show while it lives
    # (Spark's JVM and Python workers) and after it is reaped.
    from kbroker.spark.progress import tree_cpu_seconds
    before = tree_cpu_seconds()
    burn = ("import sys, time\nt = time.process_time()\nwhile time.process_time() - t < 0.3:\n    pass\n"
            "print('burnt', flush=True)\nsys.stdin.read()\n")
    p = subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "burnt"
        alive = tree_cpu_seconds()
        p.stdin.close()
        assert p.wait(60) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    reaped = tree_cpu_seconds()
    assert before is not None and alive - before >= 0.25, (before, alive)
    assert reaped - before >= 0.25, (before, reaped)


def test_tree_run_queue_seconds_counts_waiting_for_a_core():
    # The throughput report's run_queue_seconds_local: two descendants pinned to one core, each
    # burning 0.3 CPU-s, wait for each other: together at least ~0.3 s on the run queue.
    from kbroker.spark.progress import run_queue_delta, tree_run_queue_seconds
    before = tree_run_queue_seconds()
    if before is None:
        pytest.skip("no /proc/<pid>/task/<tid>/schedstat on this kernel")
    cpu = min(os.sched_getaffinity(0))
    burn = (f"import os, sys, time\nos.sched_setaffinity(0, {{{cpu}}})\nsys.stdin.readline()\n"
            "t = time.process_time()\nwhile time.process_time() - t < 0.3:\n    pass\n"
            "print('burnt', flush=True)\nsys.stdin.read()\n")
    procs = [subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True) for _ in range(2)]
    try:
        for p in procs:         # start burning together
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in procs:
            assert p.stdout.readline().strip() == "burnt"
        waited = run_queue_delta(before, tree_run_queue_seconds())
        for p in procs:
            p.stdin.close()
            assert p.wait(60) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert waited >= 0.2, waited
