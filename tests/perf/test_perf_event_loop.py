"""The event-loop choice: ``kbroker.event.loop`` in the config, or KBROKER_EVENT_LOOP in
the environment when the config does not set it; validated with Kafka's wording. uvloop is the default
and is accepted where the uvloop package is importable (a config error naming the key otherwise);
asyncio is always accepted.

Invariant for a real broker on each loop: every record a confluent-kafka producer wrote (small and
large, so fetches go both through the copy path and through file regions ≥ the sendfile threshold) is
read back once, in order, byte for byte (the sendfile invariants on both loops: tests/test_sendfile.py); and the broker process runs the loop it was told to (uvloop's
extension module is mapped into the process only when it was chosen)."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from kbroker import switches
from kbroker.config import (DEFAULT_EVENT_LOOP, EVENT_LOOP_ENV, EVENT_LOOP_KEY, EVENT_LOOPS, UVLOOP_MISSING,
                            BrokerConfig, ConfigError)

BASE = {"zookeeper.connect": "127.0.0.1:2181", "broker.id": 0}


def _env_loop(monkeypatch, value):
    """This process's switchboard as if started with $KBROKER_EVENT_LOOP = value (None: unset)."""
    monkeypatch.setattr(switches, "current", dataclasses.replace(switches.current, event_loop=value))


def test_key_default_values_and_errors(monkeypatch):
    _env_loop(monkeypatch, None)
    assert set(EVENT_LOOPS) == {"asyncio", "uvloop"} and DEFAULT_EVENT_LOOP == "uvloop"
    assert BrokerConfig.from_dict(BASE).event_loop == "uvloop"
    assert BrokerConfig.from_dict({**BASE, EVENT_LOOP_KEY: "asyncio"}).event_loop == "asyncio"
    with pytest.raises(ConfigError) as e:
        BrokerConfig.from_dict({**BASE, EVENT_LOOP_KEY: "tokio"})
    assert e.value.key == EVENT_LOOP_KEY
    assert str(e.value) == ("Invalid value tokio for configuration kbroker.event.loop: "
                            "String must be one of: asyncio, uvloop")
    assert BrokerConfig.from_dict({**BASE, EVENT_LOOP_KEY: "uvloop"}).event_loop == "uvloop"


def test_uvloop_not_importable_is_a_config_error(monkeypatch):
    # sys.modules[name] = None makes the import system (find_spec included) treat it as not importable
    monkeypatch.setitem(sys.modules, "uvloop", None)
    with pytest.raises(ConfigError) as e:
        BrokerConfig.from_dict({**BASE, EVENT_LOOP_KEY: "uvloop"})
    assert e.value.key == EVENT_LOOP_KEY
    assert str(e.value) == f"Invalid value uvloop for configuration kbroker.event.loop: {UVLOOP_MISSING}"


def test_environment_sets_it_when_the_config_does_not(monkeypatch):
    _env_loop(monkeypatch, "asyncio")
    assert BrokerConfig.from_dict(BASE).event_loop == "asyncio"
    _env_loop(monkeypatch, "uvloop")
    assert BrokerConfig.from_dict(BASE).event_loop == "uvloop"
    _env_loop(monkeypatch, "UVLOOP")
    with pytest.raises(ConfigError) as e:
        BrokerConfig.from_dict(BASE)
    assert e.value.key == EVENT_LOOP_KEY and EVENT_LOOP_ENV in str(e.value)
    # a bad variable is not an error when the config names the loop
    assert BrokerConfig.from_dict({**BASE, EVENT_LOOP_KEY: "asyncio"}).event_loop == "asyncio"


@pytest.mark.parametrize("how", ["env-trio", "config-tokio", "env-uvloop", "config-uvloop", "default-uvloop"])
def test_serve_refuses_a_bad_value_naming_the_key(tmp_path, how):
    """A bad name, and uvloop when the package cannot be imported (hidden here by a sitecustomize that
    blocks the import, as in a Python without uvloop), named or as the default: exit status 2, the key
    named, no traceback."""
    kind, value = how.split("-")
    path = tmp_path / "server.properties"
    text = f"zookeeper.connect=127.0.0.1:1\nlog.dirs={tmp_path / 'data'}\n"
    path.write_text(text + (f"{EVENT_LOOP_KEY}={value}\n" if kind == "config" else ""))
    env = {k: v for k, v in os.environ.items() if k != EVENT_LOOP_ENV}
    if kind == "env":
        env[EVENT_LOOP_ENV] = value
    if value == "uvloop":
        hide = tmp_path / "hide"
        hide.mkdir()
        (hide / "sitecustomize.py").write_text("import sys\nsys.modules['uvloop'] = None\n")
        env["PYTHONPATH"] = os.pathsep.join([str(hide)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    r = subprocess.run([sys.executable, "-m", "kbroker", "serve", "--config", str(path)], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert EVENT_LOOP_KEY in r.stderr and "Traceback" not in r.stderr
    assert (EVENT_LOOP_ENV in r.stderr) == (kind == "env")
    if value == "uvloop":
        assert "uvloop package is not importable" in r.stderr


def _uvloop_mapped(pid: int) -> bool:
    return any("uvloop" in line for line in Path(f"/proc/{pid}/maps").read_text().splitlines())


@pytest.mark.timeout(240)
@pytest.mark.parametrize("how", ["config-asyncio", "env-asyncio", "config-uvloop", "env-uvloop"])
def test_broker_serves_produce_and_fetch_on_each_loop(tmp_path, how):
    import confluent_kafka as ck

    from kbroker.testing import LocalCluster

    kind, loop = how.split("-")
    overrides = {EVENT_LOOP_KEY: loop} if kind == "config" else {}
    # the environment names the other loop when the config names one: the config must win
    env = {EVENT_LOOP_ENV: ("asyncio" if loop == "uvloop" else "uvloop") if kind == "config" else loop}
    with LocalCluster(tmp_path / "c", num_partitions=1, overrides=overrides, env=env) as c:
        b = c.brokers[0]
        assert f"event loop: {loop} ({EVENT_LOOP_KEY})" in b.log_path.read_text()
        assert _uvloop_mapped(b.pid) == (loop == "uvloop")
        topic = f"loop-{uuid.uuid4().hex[:8]}"
        p = ck.Producer({"bootstrap.servers": c.bootstrap, "linger.ms": 5, "compression.type": "none"})
        # small records (fetch ranges copied into the answer) and 20 KiB ones (ranges ≥ the sendfile
        # threshold: direct os.sendfile on the socket, on both loops)
        values = [os.urandom(100 if i % 2 else 20_000) + i.to_bytes(4, "big") for i in range(400)]
        for v in values:
            p.produce(topic, v, partition=0)
            p.poll(0)
        assert p.flush(60) == 0
        cons = ck.Consumer({"bootstrap.servers": c.bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                            "auto.offset.reset": "earliest", "enable.auto.commit": False,
                            "fetch.max.bytes": 1 << 20, "max.partition.fetch.bytes": 64 << 10})
        try:
            cons.assign([ck.TopicPartition(topic, 0, 0)])
            got, errors = [], []
            for _ in range(600):                      # bounded: 600 polls of at most 0.2 s
                m = cons.poll(0.2)
                if m is None:
                    if len(got) >= len(values):
                        break
                    continue
                if m.error():
                    errors.append(m.error())
                    continue
                got.append(m.value())
                if len(got) >= len(values):
                    break
        finally:
            cons.close()
        assert b.running(), b.log_tail()
    violations = sum(1 for a, g in zip(values, got) if a != g) + abs(len(got) - len(values))
    assert errors == [] and violations == 0, (len(got), errors[:3])
