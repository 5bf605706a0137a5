"""Log lines shaped like Kafka's log4j pattern, so people and log tooling read them the same way:

    [2026-11-21 22:30:01,123] INFO Registered broker 0 at path /brokers/ids/0 (kbroker.zk.client)
"""
from __future__ import annotations

import logging
import sys
from typing import TextIO

# log4j level names: Python's WARNING/CRITICAL print as WARN/FATAL.
_LEVEL_NAMES = {logging.WARNING: "WARN", logging.CRITICAL: "FATAL"}
LEVELS = ("TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL")


class KafkaStyleFormatter(logging.Formatter):
    def __init__(self) -> None:
        # Python's default asctime is already "yyyy-MM-dd HH:mm:ss,SSS", as log4j's ISO8601.
        super().__init__("[%(asctime)s] %(kafka_level)s %(message)s (%(name)s)")

    def format(self, record: logging.LogRecord) -> str:
        record.kafka_level = _LEVEL_NAMES.get(record.levelno, record.levelname)
        return super().format(record)


def level_number(name: str) -> int:
    """Accept log4j names (WARN, FATAL, TRACE) as well as Python's."""
    name = name.upper()
    mapping = {"TRACE": logging.DEBUG, "WARN": logging.WARNING, "FATAL": logging.CRITICAL}
    if name in mapping:
        return mapping[name]
    number = logging.getLevelName(name)
    if not isinstance(number, int):
        raise ValueError(f"unknown log level {name!r}; use one of {', '.join(LEVELS)}")
    return number


def setup_logging(level: str = "INFO", stream: TextIO | None = None) -> None:
    """Route every logger to ``stream`` (stderr by default) in Kafka's format; idempotent."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_kbroker", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(KafkaStyleFormatter())
    handler._kbroker = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level_number(level))
    # kazoo logs every connection state change at INFO; keep its warnings only.
    logging.getLogger("kazoo").setLevel(max(logging.WARNING, root.level))
