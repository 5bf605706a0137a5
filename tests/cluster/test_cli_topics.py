"""`kbroker topics` / console tools against Tansu and against kbroker itself: Kafka's output lines."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from kbroker.cli.main import main as cli
from test_client_peers import start_tansu

KBROKER = [sys.executable, "-m", "kbroker"]


@pytest.fixture(scope="module")
def tansu_bootstrap():
    with start_tansu() as port:
        yield f"127.0.0.1:{port}"


@pytest.fixture(params=["tansu", "kbroker"])
def peer(request):
    if request.param == "tansu":
        return request.param, request.getfixturevalue("tansu_bootstrap")
    return request.param, request.getfixturevalue("bootstrap")   # tests/conftest.py: ZooKeeper + one kbroker


def _name(prefix):
    return f"{prefix}-{os.getpid()}-{time.monotonic_ns() % 10**9}"


def topics(capsys, bootstrap, *args):
    code = cli(["topics", "--bootstrap-server", bootstrap, *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_create_list_describe_alter_delete(capsys, peer):
    kind, b = peer
    t = _name("cli")
    assert topics(capsys, b, "--create", "--topic", t, "--partitions", "3", "--replication-factor", "1",
                  "--config", "retention.ms=86400000") == (0, f"Created topic {t}.\n", "")

    code, out, _ = topics(capsys, b, "--list")
    assert code == 0 and t in out.splitlines()

    code, out, _ = topics(capsys, b, "--describe", "--topic", t)
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 4
    m = re.fullmatch(rf"Topic: {t}(\tTopicId: [A-Za-z0-9_-]{{22}})?\tPartitionCount: 3\tReplicationFactor: 1"
                     r"\tConfigs: (.*)", lines[0])
    assert m, lines[0]
    if kind == "kbroker":
        assert m.group(2) == "retention.ms=86400000"
    for i, line in enumerate(lines[1:]):
        assert re.fullmatch(rf"\tTopic: {t}\tPartition: {i}\tLeader: (\d+)\tReplicas: \1\tIsr: \1"
                            r"\tElr: N/A\tLastKnownElr: N/A", line), line

    if kind == "kbroker":   # Tansu has no CreatePartitions
        assert topics(capsys, b, "--alter", "--topic", t, "--partitions", "5") == (0, "", "")
        code, out, _ = topics(capsys, b, "--describe", "--topic", t)
        assert "\tPartitionCount: 5\t" in out.splitlines()[0] and len(out.splitlines()) == 6

    assert topics(capsys, b, "--delete", "--topic", t) == (0, "", "")
    deadline = time.monotonic() + 30
    while True:   # deletion may complete asynchronously (ZooKeeper mode)
        code, out, _ = topics(capsys, b, "--list")
        if t not in out.splitlines() or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert t not in out.splitlines()


def test_errors_print_like_kafka_topics(capsys, peer):
    _, b = peer
    t = _name("dup")
    assert topics(capsys, b, "--create", "--topic", t, "--partitions", "1", "--replication-factor", "1")[0] == 0
    code, out, err = topics(capsys, b, "--create", "--topic", t, "--partitions", "1", "--replication-factor", "1")
    assert code == 1
    assert re.fullmatch(r"Error while executing topic command : Topic .* already exists\.\n", out), out
    assert "TopicExistsException" in err
    # --if-not-exists: silent success
    assert topics(capsys, b, "--create", "--topic", t, "--partitions", "1", "--if-not-exists") == (0, "", "")

    missing = _name("missing")
    code, out, err = topics(capsys, b, "--describe", "--topic", missing)
    assert (code, out) == (1, f"Error while executing topic command : Topic '{missing}' does not exist as expected\n")
    assert topics(capsys, b, "--delete", "--topic", missing, "--if-exists") == (0, "", "")
    code, out, _ = topics(capsys, b, "--create", "--topic", _name("bad"), "--partitions", "0")
    assert (code, out) == (1, "Error while executing topic command : The partitions must be greater than 0\n")
    code, out, _ = topics(capsys, b, "--create", "--topic", _name("cfg"), "--config", "novalue")
    assert code == 1 and "Invalid topic config" in out


def test_console_producer_and_consumer(peer):
    kind, b = peer
    t = _name("console")
    assert subprocess.run(KBROKER + ["topics", "--bootstrap-server", b, "--create", "--topic", t,
                                     "--partitions", "1", "--replication-factor", "1"],
                          capture_output=True, timeout=60).returncode == 0
    prod = subprocess.run(KBROKER + ["console-producer", "--bootstrap-server", b, "--topic", t,
                                     "--property", "parse.key=true", "--property", "key.separator=:"],
                          input=b"k1:hello\nk2:world\nk3:\n", capture_output=True, timeout=60)
    assert prod.returncode == 0, prod.stderr
    cons = subprocess.run(KBROKER + ["console-consumer", "--bootstrap-server", b, "--topic", t, "--from-beginning",
                                     "--max-messages", "3", "--property", "print.key=true",
                                     "--property", "print.offset=true", "--property", "print.partition=true"],
                          capture_output=True, timeout=60)
    assert cons.returncode == 0, cons.stderr
    assert cons.stdout == (b"Partition:0\tOffset:0\tk1\thello\n"
                           b"Partition:0\tOffset:1\tk2\tworld\n"
                           b"Partition:0\tOffset:2\tk3\t\n")
    assert cons.stderr.decode().strip().splitlines()[-1] == "Processed a total of 3 messages"
    # a line without the separator is refused as Kafka's LineMessageReader does
    bad = subprocess.run(KBROKER + ["console-producer", "--bootstrap-server", b, "--topic", t,
                                    "--property", "parse.key=true"], input=b"no separator\n",
                         capture_output=True, timeout=60)
    assert bad.returncode == 1 and b"No key separator found on line number 1" in bad.stderr
    # --partition/--offset from the middle, timestamps printed as CreateTime
    mid = subprocess.run(KBROKER + ["console-consumer", "--bootstrap-server", b, "--topic", t, "--partition", "0",
                                    "--offset", "1", "--max-messages", "2", "--property", "print.timestamp=true"],
                         capture_output=True, timeout=60)
    assert mid.returncode == 0, mid.stderr
    assert re.fullmatch(rb"CreateTime:\d{13}\tworld\nCreateTime:\d{13}\t\n", mid.stdout), mid.stdout
