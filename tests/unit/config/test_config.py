"""BrokerConfig: parsing, Kafka defaults, precedence rules, errors naming the key, the serve CLI."""
import ast
import io
import logging
import re
import socket
import subprocess
import sys

import pytest
from paths import ROOT

from kbroker.config import (
    BROKER_CONFIGS, LONG_MAX, TOPIC_CONFIGS, BrokerConfig, ConfigError, parse_properties,
    parse_topic_config,
)
from kbroker.logging_setup import setup_logging
import paths

ZK = "zookeeper.connect=127.0.0.1:2181\n"

KAFKA_39_SAMPLE = (paths.DATA / "kafka39_server.properties").read_text()


def load(text: str, overrides=()) -> BrokerConfig:
    return BrokerConfig.from_text(text, overrides)


def error_for(text: str, overrides=()) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load(text, overrides)
    return info.value


# ---------------------------------------------------------------------------------------------- loading

def test_kafka_39_sample_loads_and_warns_only_about_unimplemented_keys(caplog):
    with caplog.at_level(logging.WARNING, logger="kbroker.config"):
        config = load(KAFKA_39_SAMPLE)
    # The sample sets three thread counts kbroker has no use for: one event loop does that work.
    unimplemented = ["num.network.threads", "num.io.threads", "num.recovery.threads.per.data.dir"]
    assert [w.split()[2] for w in config.warnings] == unimplemented
    assert [r.levelno for r in caplog.records] == [logging.WARNING] * 3
    assert [r.getMessage().split()[2] for r in caplog.records] == unimplemented
    assert config.broker_id == 0
    assert config.log_dirs == ["/tmp/kafka-logs"]
    assert config.get("num.io.threads") == 8
    assert config.get("offsets.topic.replication.factor") == 1
    assert config.get("group.initial.rebalance.delay.ms") == 0
    assert config.zookeeper_connect == "localhost:2181"
    assert config.zookeeper_connection_timeout_ms == 18000
    assert config.log_retention_ms == 168 * 3_600_000
    # Default listener: bind every interface, advertise this machine's name.
    [listener] = config.listeners
    assert (listener.listener_name, listener.host, listener.port) == ("PLAINTEXT", "", 9092)
    [advertised] = config.advertised_listeners
    assert (advertised.host, advertised.port) == (socket.getfqdn(), 9092)
    assert str(advertised) == f"PLAINTEXT://{socket.getfqdn()}:9092"


def test_every_implemented_key_has_kafkas_default():
    config = load(ZK)
    expected = {
        "broker.id": -1, "listeners": "PLAINTEXT://:9092", "advertised.listeners": None,
        "log.dirs": None, "log.dir": "/tmp/kafka-logs", "num.partitions": 1,
        "default.replication.factor": 1, "min.insync.replicas": 1, "auto.create.topics.enable": True,
        "delete.topic.enable": True, "log.segment.bytes": 1073741824, "log.roll.ms": None,
        "log.roll.hours": 168, "log.retention.ms": None, "log.retention.minutes": None,
        "log.retention.hours": 168, "log.retention.bytes": -1, "log.retention.check.interval.ms": 300000,
        "log.index.interval.bytes": 4096, "log.index.size.max.bytes": 10485760,
        "log.flush.interval.messages": LONG_MAX, "log.flush.interval.ms": None,
        "log.flush.offset.checkpoint.interval.ms": 60000, "log.flush.scheduler.interval.ms": LONG_MAX,
        "log.message.timestamp.type": "CreateTime", "message.max.bytes": 1048588,
        "socket.request.max.bytes": 104857600, "queued.max.request.bytes": -1,
        "connections.max.idle.ms": 600000,
        "zookeeper.session.timeout.ms": 18000, "zookeeper.connection.timeout.ms": None,
        "offsets.topic.replication.factor": 3, "transaction.state.log.replication.factor": 3,
        "transaction.state.log.min.isr": 2, "group.initial.rebalance.delay.ms": 3000, "broker.rack": None,
        "replica.lag.time.max.ms": 30000, "unclean.leader.election.enable": False,
        "socket.send.buffer.bytes": 102400, "socket.receive.buffer.bytes": 102400,
        "kbroker.metrics.port": -1, "replication.quota.window.num": 11,
        "replication.quota.window.size.seconds": 1,
    }
    for key, value in expected.items():
        assert BROKER_CONFIGS[key].implemented, key
        assert config.get(key) == value, key
    assert config.log_dirs == ["/tmp/kafka-logs"]
    assert config.log_retention_ms == 7 * 24 * 3_600_000
    assert config.log_roll_ms == 7 * 24 * 3_600_000
    assert config.log_flush_interval_ms == LONG_MAX
    assert config.zookeeper_connection_timeout_ms == 18000  # falls back to the session timeout
    assert config.warnings == []


def test_defaults_of_a_default_broker_equal_kafkas_topic_defaults():
    defaults = load(ZK).topic_defaults()
    assert set(defaults) == {k for k, spec in TOPIC_CONFIGS.items() if spec.implemented}
    for key, value in defaults.items():
        assert TOPIC_CONFIGS[key].default == value, key


def test_topic_defaults_follow_the_broker_keys():
    config = load(ZK + """
log.segment.bytes=1048576
log.roll.ms=60000
log.retention.minutes=10
log.retention.bytes=5000000
message.max.bytes=2000000
log.message.timestamp.type=LogAppendTime
log.index.interval.bytes=1024
log.index.size.max.bytes=65536
log.flush.interval.messages=100
log.flush.scheduler.interval.ms=2000
min.insync.replicas=2
log.cleanup.policy=compact,delete
unclean.leader.election.enable=true
log.cleaner.delete.retention.ms=1000
log.cleaner.min.compaction.lag.ms=5
log.cleaner.max.compaction.lag.ms=60000
log.cleaner.min.cleanable.ratio=0.25
""")
    assert config.topic_defaults() == {
        "segment.bytes": 1048576, "segment.ms": 60000, "retention.ms": 600000,
        "retention.bytes": 5000000, "max.message.bytes": 2000000,
        "message.timestamp.type": "LogAppendTime", "index.interval.bytes": 1024,
        "segment.index.bytes": 65536, "flush.messages": 100, "flush.ms": 2000,
        "min.insync.replicas": 2, "cleanup.policy": ["compact", "delete"],
        "unclean.leader.election.enable": True,
        "delete.retention.ms": 1000, "min.compaction.lag.ms": 5,
        "max.compaction.lag.ms": 60000, "min.cleanable.dirty.ratio": 0.25,
        "file.delete.delay.ms": 60000,
        "leader.replication.throttled.replicas": [], "follower.replication.throttled.replicas": [],
    }
    assert not config.warnings


# ---------------------------------------------------------------------------------------------- precedence

def test_overrides_win_over_the_file_and_later_lines_win_over_earlier():
    config = load(ZK + "num.partitions=2\nnum.partitions=4\nbroker.id=1\n",
                  ["num.partitions=6", "log.dirs=/a, /b"])
    assert config.get("num.partitions") == 6
    assert config.broker_id == 1
    assert config.log_dirs == ["/a", "/b"]
    assert config.is_set("num.partitions") and not config.is_set("num.io.threads")


@pytest.mark.parametrize("lines, expected_ms", [
    ("log.retention.hours=1", 3_600_000),
    ("log.retention.hours=1\nlog.retention.minutes=3", 180_000),
    ("log.retention.hours=1\nlog.retention.minutes=3\nlog.retention.ms=1234", 1234),
    ("log.retention.ms=-1\nlog.retention.hours=1", -1),
    ("log.retention.hours=-1", -1),
    ("log.retention.minutes=-5", -1),
])
def test_retention_precedence_ms_over_minutes_over_hours(lines, expected_ms):
    config = load(ZK + lines)
    assert config.log_retention_ms == expected_ms
    assert config.topic_defaults()["retention.ms"] == expected_ms


def test_roll_flush_dir_and_zookeeper_fallbacks():
    config = load(ZK + "log.roll.hours=2\nlog.dir=/data/one\nzookeeper.session.timeout.ms=6000\n"
                       "log.flush.scheduler.interval.ms=3000")
    assert config.log_roll_ms == 7_200_000
    assert config.log_dirs == ["/data/one"]
    assert config.zookeeper_connection_timeout_ms == 6000
    assert config.log_flush_interval_ms == 3000
    config = load(ZK + "log.roll.hours=2\nlog.roll.ms=500\nlog.dir=/x\nlog.dirs=/y\nlog.flush.interval.ms=10\n"
                       "log.flush.scheduler.interval.ms=3000")
    assert config.log_roll_ms == 500
    assert config.log_dirs == ["/y"]
    assert config.log_flush_interval_ms == 10


def test_listeners_hosts_and_advertising():
    config = load(ZK + "listeners=PLAINTEXT://127.0.0.1:9093")
    assert [str(e) for e in config.advertised_listeners] == ["PLAINTEXT://127.0.0.1:9093"]
    config = load(ZK + "listeners=PLAINTEXT://0.0.0.0:9092\nadvertised.listeners=PLAINTEXT://10.1.2.3:19092")
    assert config.listeners[0].host == "0.0.0.0"
    assert str(config.advertised_listeners[0]) == "PLAINTEXT://10.1.2.3:19092"
    config = load(ZK + "listeners=INTERNAL://[::1]:9092,EXTERNAL://:9094\n"
                       "listener.security.protocol.map=INTERNAL:PLAINTEXT,EXTERNAL:PLAINTEXT\n"
                       "inter.broker.listener.name=internal")
    assert config.inter_broker_listener.listener_name == "INTERNAL"
    assert [(e.listener_name, e.host, e.port) for e in config.listeners] == [
        ("INTERNAL", "::1", 9092), ("EXTERNAL", "", 9094)]
    assert str(config.advertised_listeners[0]) == "INTERNAL://[::1]:9092"
    assert config.advertised_listeners[1].host == socket.getfqdn()


def test_inter_broker_listener_rules():
    two = ZK + ("listeners=A://127.0.0.1:9092,B://127.0.0.2:9092\n"
                "listener.security.protocol.map=A:PLAINTEXT,B:PLAINTEXT,PLAINTEXT:PLAINTEXT\n")
    assert load(two + "inter.broker.listener.name=B").inter_broker_listener.port == 9092
    # as Kafka: the listener named as security.inter.broker.protocol (PLAINTEXT) must exist
    err = error_for(two)
    assert err.key == "security.inter.broker.protocol" and "valid options" in str(err) and "A,B" in str(err)
    err = error_for(two + "inter.broker.listener.name=C")
    assert err.key == "inter.broker.listener.name"
    err = error_for(two + "inter.broker.listener.name=A\nsecurity.inter.broker.protocol=PLAINTEXT")
    assert "Only one of inter.broker.listener.name and security.inter.broker.protocol" in str(err)


def test_per_listener_overrides():
    config = load(ZK + "listeners=PLAINTEXT://:9092\nconnections.max.idle.ms=1000\n"
                       "listener.name.plaintext.connections.max.idle.ms=2000\n"
                       "listener.name.plaintext.plain.sasl.jaas.config=x required;")
    assert config.listener_get("PLAINTEXT", "connections.max.idle.ms") == 2000
    assert config.listener_get("OTHER", "connections.max.idle.ms") == 1000
    assert config.listener_get("plaintext", "plain.sasl.jaas.config") == "x required;"
    assert config.listener_overrides("PLAINTEXT") == {"connections.max.idle.ms": 2000,
                                                      "plain.sasl.jaas.config": "x required;"}
    err = error_for(ZK + "listener.name.plaintext.no.such.key=1")
    assert err.key == "listener.name.plaintext.no.such.key"
    err = error_for(ZK + "listener.name.plaintext.connections.max.idle.ms=soon")
    assert "Not a number of type LONG" in str(err) or "Not a number of type INT" in str(err)


def test_typed_accessors():
    config = load(ZK + "auto.create.topics.enable=FALSE\nlog.message.timestamp.type=LogAppendTime")
    assert config.get_int("num.partitions") == 1
    assert config.get_int("log.retention.bytes") == -1
    assert config.get_bool("auto.create.topics.enable") is False
    assert config.get_str("log.message.timestamp.type") == "LogAppendTime"
    assert config.get_list("log.cleanup.policy") == ["delete"]
    with pytest.raises(TypeError, match="num.partitions is of type INT"):
        config.get_bool("num.partitions")
    with pytest.raises(KeyError, match="no.such.key"):
        config.get("no.such.key")


def test_describe_hides_passwords():
    config = load(ZK + "ssl.keystore.password=s3cret")
    lines = config.describe()
    assert "ssl.keystore.password = [hidden]" in lines
    assert not any("s3cret" in line for line in lines)
    assert "num.partitions = 1" in lines


# ---------------------------------------------------------------------------------------------- errors

@pytest.mark.parametrize("line, key, why", [
    ("num.partitions=abc", "num.partitions",
     "Invalid value abc for configuration num.partitions: Not a number of type INT"),
    ("num.partitions=1.5", "num.partitions", "Not a number of type INT"),
    ("num.partitions=3000000000", "num.partitions", "Not a number of type INT"),
    ("num.partitions=0", "num.partitions",
     "Invalid value 0 for configuration num.partitions: Value must be at least 1"),
    ("log.retention.bytes=lots", "log.retention.bytes", "Not a number of type LONG"),
    ("offsets.topic.replication.factor=40000", "offsets.topic.replication.factor", "Not a number of type SHORT"),
    ("delete.topic.enable=yes", "delete.topic.enable", "Expected value to be either true or false"),
    ("log.message.timestamp.type=createtime", "log.message.timestamp.type",
     "String must be one of: CreateTime, LogAppendTime"),
    ("log.cleanup.policy=delete,shred", "log.cleanup.policy", "String must be one of: compact, delete"),
    ("kbroker.metrics.port=70000", "kbroker.metrics.port", "Value must be no more than 65535"),
    ("log.retention.hour=5", "log.retention.hour", "did you mean log.retention.hours?"),
    ("totally.made.up=1", "totally.made.up", "Unknown configuration totally.made.up"),
    ("broker.id=-2", "broker.id", "broker.id must be at least -1"),
    ("listeners=PLAINTEXT:/localhost:9092", "listeners", "Unable to parse"),
    ("listeners=PLAINTEXT://:99999", "listeners", "not in [0, 65535]"),
    ("listeners=PLAINTEXT://:9092,PLAINTEXT://:9093", "listeners", "PLAINTEXT is repeated"),
    ("listeners=CLIENT://:9092", "listeners", "No security protocol defined for listener CLIENT"),
    ("listener.security.protocol.map=CLIENT:TLS", "listener.security.protocol.map", "Unknown security protocol TLS"),
    ("advertised.listeners=PLAINTEXT://0.0.0.0:9092", "advertised.listeners", "nonroutable meta-address 0.0.0.0"),
    ("advertised.listeners=OTHER://h:9092\nlistener.security.protocol.map=OTHER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
     "advertised.listeners", "Listener OTHER is not defined in listeners"),
])
def test_errors_name_the_key(line, key, why):
    err = error_for(ZK + line)
    assert err.key == key
    assert key in str(err) and why in str(err)


def test_secured_listeners_are_accepted():
    config = load(ZK + "listeners=PLAINTEXT://:9092,EXTERNAL://:9096,SASL_SSL://:9095\n"
                       "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,EXTERNAL:SSL,SASL_SSL:SASL_SSL\n")
    assert [e.security_protocol for e in config.listeners] == ["PLAINTEXT", "SSL", "SASL_SSL"]


def test_missing_zookeeper_connect_and_bad_override():
    err = error_for("broker.id=0")
    assert err.key == "zookeeper.connect" and "Missing required configuration zookeeper.connect" in str(err)
    with pytest.raises(ConfigError, match="Invalid override 'num.partitions'"):
        load(ZK, ["num.partitions"])
    err = error_for(ZK, ["num.partitions=x"])
    assert err.key == "num.partitions"


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="Cannot read config file"):
        BrokerConfig.from_file(tmp_path / "absent.properties")


# ---------------------------------------------------------------------------------------------- .properties syntax

def test_properties_syntax():
    text = (
        "# comment\n"
        "! also a comment\n"
        "   \n"
        "a=1\n"
        "b : 2\n"
        "c 3\n"
        "d=one, \\\n"
        "    two\n"
        "e\\=x=y\n"
        "f=tab\\there \\u0041\n"
        "g=\n"
        "  h = spaced  \n"
    )
    assert parse_properties(text) == {
        "a": "1", "b": "2", "c": "3", "d": "one, two", "e=x": "y", "f": "tab\there A", "g": "",
        "h": "spaced  ",
    }


def test_values_are_trimmed_like_kafka():
    config = load(ZK + "num.partitions=  7  \nbroker.rack= r1 ")
    assert config.get("num.partitions") == 7
    assert config.get("broker.rack") == "r1"


# ---------------------------------------------------------------------------------------------- topic configs

def test_parse_topic_config():
    assert parse_topic_config("retention.ms", "-1") == -1
    assert parse_topic_config("cleanup.policy", "compact,delete") == ["compact", "delete"]
    assert parse_topic_config("unclean.leader.election.enable", "True") is True
    with pytest.raises(ConfigError, match="Unknown topic config name: retention.hours") as info:
        parse_topic_config("retention.hours", "1")
    assert info.value.key == "retention.hours"
    with pytest.raises(ConfigError, match="Invalid value -2 for configuration retention.ms: Value must be at least -1"):
        parse_topic_config("retention.ms", "-2")
    with pytest.raises(ConfigError, match="segment.bytes: Not a number of type INT"):
        parse_topic_config("segment.bytes", "1GB")


def test_every_implemented_topic_config_has_a_broker_synonym():
    # Kafka gives the throttled-replica lists no broker key: they exist per topic only.
    topic_only = {"leader.replication.throttled.replicas", "follower.replication.throttled.replicas"}
    for key, spec in TOPIC_CONFIGS.items():
        if spec.implemented and key not in topic_only:
            assert spec.synonyms, key
        for synonym in spec.synonyms:
            assert synonym in BROKER_CONFIGS, (key, synonym)


# ---------------------------------------------------------------------------------------------- logging format

def test_log_lines_look_like_kafkas():
    stream = io.StringIO()
    setup_logging("INFO", stream)
    try:
        logging.getLogger("kbroker.test").warning("disk %s is slow", "/d1")
        logging.getLogger("kbroker.test").debug("not shown")
    finally:
        setup_logging("WARN", io.StringIO())
    assert re.fullmatch(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\] WARN disk /d1 is slow \(kbroker\.test\)\n",
                        stream.getvalue())


# ---------------------------------------------------------------------------------------------- CLI

def _serve(tmp_path, text, *extra):
    path = tmp_path / "bad.properties"
    path.write_text(text)
    return subprocess.run([sys.executable, "-m", "kbroker", "serve", "--config", str(path), *extra],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("text, extra, key", [
    (ZK + "num.partitions=abc\n", (), "num.partitions"),
    (ZK + "log.retention.hour=5\n", (), "log.retention.hour"),
    (ZK + "listeners=SSL://:9093\n", (), "listeners"),
    (ZK, ("--override", "log.message.timestamp.type=Now"), "log.message.timestamp.type"),
])
def test_serve_exits_non_zero_naming_the_key(tmp_path, text, extra, key):
    result = _serve(tmp_path, text, *extra)
    assert result.returncode == 2, result.stderr
    assert key in result.stderr
    assert "Traceback" not in result.stderr


def _string_literals_outside_the_tables() -> dict[str, set[str]]:
    """Every string literal of the broker's code (kbroker/, zk/) -> the files holding it, leaving out
    the key names in the _impl/_known rows of the config tables themselves."""
    root = ROOT
    found: dict[str, set[str]] = {}
    for base in (root / "kbroker", root / "zk"):
        for path in base.rglob("*.py"):
            tree = ast.parse(path.read_text())
            names = {id(node.args[0]) for node in ast.walk(tree)
                     if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                     and node.func.id in ("_impl", "_known") and node.args}
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in names:
                    found.setdefault(node.value, set()).add(str(path.relative_to(root)))
    return found


def test_every_key_labelled_implemented_has_a_reader():
    # A key is read by name: cfg.get("key"), the typed properties, or a topic key's synonym list
    # (broker_synonym_value). A key labelled implemented with no reader would be silently ignored.
    literals = _string_literals_outside_the_tables()
    unread = [k for k, spec in BROKER_CONFIGS.items()
              if spec.implemented and k not in literals]
    assert unread == []
    for key in ("replication.quota.window.num", "replication.quota.window.size.seconds"):
        assert BROKER_CONFIGS[key].implemented and "kbroker/replica/manager.py" in literals[key]
