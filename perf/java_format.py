"""Load tools that print Apache Kafka's perf-tool lines (kafka-producer-perf-test.sh,
kafka-consumer-perf-test.sh), byte for byte, so parsers written for Kafka read ours.

Kafka formats its numbers with Java's ``String.format``, which differs from Python's ``%``:

* ``%.Nf`` rounds HALF_UP on the double's shortest decimal form (what ``Double.toString`` /
  Python's ``repr`` give), so ``0.125`` -> ``"0.13"`` and ``1.005`` -> ``"1.01"``; Python's ``%``
  rounds the exact binary value half-even (``"0.12"``, ``"1.00"``).
* ``%f`` without a precision means six places.
* NaN and infinities print as ``NaN``, ``Infinity``, ``-Infinity`` (a rate over 0 ms).

:func:`java_format` implements the handful of conversions the tools use (``%d %s %f %.Nf %n %%``,
with an optional width and ``-`` flag); :func:`java_date` renders SimpleDateFormat patterns made of
``yyyy MM dd HH mm ss SSS`` in local time.
"""
from __future__ import annotations

import math
import re
import time
from decimal import ROUND_HALF_UP, Decimal

__all__ = ["check_date_pattern", "half_up", "java_date", "java_format", "mib"]

_SPEC = re.compile(r"%(-)?(\d+)?(?:\.(\d+))?([dfsn%])")
_QUANTA: dict[int, Decimal] = {}


def mib(nbytes: int | float) -> float:
    """Kafka's "MB": bytes / 1024²."""
    return nbytes / (1024.0 * 1024.0)


def half_up(x: float, places: int) -> str:
    """``x`` with ``places`` decimals the way Java's ``%.{places}f`` prints a double."""
    x = float(x)
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    q = _QUANTA.get(places)
    if q is None:
        q = _QUANTA[places] = Decimal(1).scaleb(-places)
    # repr() is the shortest decimal that reads back as the same double: the digits Java rounds.
    return format(Decimal(repr(x)).quantize(q, rounding=ROUND_HALF_UP), "f")


def java_format(fmt: str, *args) -> str:
    """A small ``String.format``: ``%d``, ``%s``, ``%f`` (6 places), ``%.Nf``, ``%n``, ``%%``,
    each with an optional ``-`` flag and width."""
    it = iter(args)

    def conv(m: re.Match) -> str:
        left, width, prec, kind = m.groups()
        if kind == "%":
            return "%"
        if kind == "n":
            return "\n"
        v = next(it)
        if kind == "d":
            if isinstance(v, float) or not isinstance(v, int):
                raise TypeError(f"%d needs an integer, got {v!r}")   # Java throws too
            s = str(v)
        elif kind == "f":
            s = half_up(v, 6 if prec is None else int(prec))
        else:
            s = "null" if v is None else str(v)
        if width:
            s = s.ljust(int(width)) if left else s.rjust(int(width))
        return s

    out = _SPEC.sub(conv, fmt)
    leftover = next(it, _SPEC)
    if leftover is not _SPEC:
        raise TypeError("too many arguments for format")
    return out


_DATE_TOKENS = re.compile(r"yyyy|MM|dd|HH|mm|ss|SSS|'[^']*'|[A-Za-z]")


def java_date(ms: int, pattern: str = "yyyy-MM-dd HH:mm:ss:SSS") -> str:
    """``new SimpleDateFormat(pattern).format(ms)`` (local time zone) for patterns made of
    ``yyyy MM dd HH mm ss SSS``, literals and quoted text; other letters raise ValueError."""
    secs, frac = divmod(int(ms), 1000)
    t = time.localtime(secs)
    fields = {"yyyy": f"{t.tm_year:04d}", "MM": f"{t.tm_mon:02d}", "dd": f"{t.tm_mday:02d}",
              "HH": f"{t.tm_hour:02d}", "mm": f"{t.tm_min:02d}", "ss": f"{t.tm_sec:02d}",
              "SSS": f"{frac:03d}"}

    def conv(m: re.Match) -> str:
        tok = m.group(0)
        if tok in fields:
            return fields[tok]
        if tok.startswith("'"):
            return tok[1:-1] if len(tok) > 2 else "'"
        raise ValueError(f"unsupported date pattern letter {tok!r} in {pattern!r}")

    return _DATE_TOKENS.sub(conv, pattern)


def check_date_pattern(pattern: str) -> None:
    """Raise ValueError now rather than at the first line printed."""
    java_date(0, pattern)
