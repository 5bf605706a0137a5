"""One table of topic settings: kbroker.config.TOPIC_CONFIGS. The storage layer's defaults and
broker-key translation, and the broker's topic_defaults(), must agree with it (they drifted apart
once: file.delete.delay.ms was missing on one side)."""
from types import SimpleNamespace

from kbroker.config import TOPIC_CONFIGS, BrokerConfig
from kbroker.log.log import DEFAULTS, LOG_KEYS, LogConfig
from kbroker.server.apis.configs import topic_default


def test_log_keys_are_implemented_topic_keys_with_the_tables_defaults():
    for k in LOG_KEYS:
        spec = TOPIC_CONFIGS[k]
        assert spec.implemented, k
        assert DEFAULTS[k] == spec.default, k


def test_broker_topic_defaults_cover_every_log_key_with_the_tables_defaults():
    cfg = BrokerConfig.from_text("broker.id=0\nzookeeper.connect=127.0.0.1:2181\n")
    defaults = cfg.topic_defaults()
    missing = [k for k in LOG_KEYS if k not in defaults]
    assert missing == []
    # With every broker key at its default, the broker's topic defaults are the table's.
    for k in LOG_KEYS:
        want = TOPIC_CONFIGS[k].default
        assert defaults[k] == want or (k == "flush.ms" and defaults[k] >= 2**62), (k, defaults[k], want)
    assert LogConfig(defaults).values == LogConfig().values


def test_broker_synonyms_translate_with_units_and_precedence():
    got = LogConfig.from_broker({"log.retention.hours": "2", "log.retention.minutes": "3",
                                 "log.roll.hours": 1, "log.segment.delete.delay.ms": 5,
                                 "message.max.bytes": 2000})
    assert got["retention.ms"] == 3 * 60_000          # minutes beat hours
    assert got["segment.ms"] == 3_600_000
    assert got["file.delete.delay.ms"] == 5
    assert got["max.message.bytes"] == 2000


def test_broker_config_storage_and_describe_configs_agree_on_broker_synonyms():
    """The broker's topic_defaults(), the storage layer's from_broker() and DescribeConfigs'
    topic_default() read one synonym table, so the same server.properties gives one value."""
    text = ("broker.id=0\nzookeeper.connect=127.0.0.1:2181\nlog.retention.minutes=3\nlog.retention.hours=2\n"
            "log.roll.hours=5\nlog.flush.scheduler.interval.ms=700\n")
    cfg = BrokerConfig.from_text(text)
    props = dict(line.split("=", 1) for line in text.split())
    from_broker = LogConfig.from_broker(props)
    broker = SimpleNamespace(config=cfg)
    for key, want in (("retention.ms", 3 * 60_000), ("segment.ms", 5 * 3_600_000), ("flush.ms", 700)):
        assert cfg.topic_defaults()[key] == want, key
        assert int(from_broker[key]) == want, key
        assert topic_default(broker, key) == want, key
