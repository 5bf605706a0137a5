"""The path switches: every ``KBROKER_*`` environment variable the broker reads, read once, here, when
this module is first imported (a broker subprocess reads its own environment at its start). Every other
module reads ``kbroker.switches.current``; the broker logs ``current.describe()`` once at start.

Each native path has a reference path (the Python code it must agree with) and a differential test
that runs both on the same input. Supported combinations: each switch on or off independently of the
others (the default, every native path on, is the one production runs):

- ``KBROKER_NATIVE_REQUESTS=0``: Produce/Fetch parsed and encoded by the schema codec (``protocol/``),
  not ``ext/request.pyx``; with it off the two fast paths below are never reached either.
  Differential: tests/cluster/test_native_differential.py.
- ``KBROKER_FAST_PRODUCE=0``: Produce of armed partitions through ``produce.handle_native``, not
  ``FastProduce``. Differential: tests/cluster/test_native_differential.py, test_produce_fast.py.
- ``KBROKER_FAST_FETCH=0``: small Fetch (consumer and ISR follower) through ``fetch.handle_native``,
  not ``FastFetch``. Differential: tests/cluster/test_native_differential.py, test_fetch_fast.py,
  test_follower_fast.py.
- ``KBROKER_NATIVE_READ=0``: readable events in ``Connection._read_py``, not ``on_read``/``recv_ready``.
  Differential: tests/cluster/test_native_read.py.
- asyncio's transport internals are used on CPython ``ASYNCIO_INTERNALS_VERSION`` only (not an
  environment variable); elsewhere the selector loop's public transport serves.
  Covered by tests/cluster/test_native_read.py (internals switched off on a live server).

Measurement-only (a benchmark or test sets them to compare; production leaves them unset):

- ``KBROKER_CODEC_STREAMING=0``: compressed sections decompressed whole, then walked (perf attack_bench;
  differential: tests/unit/record/test_codec.py, tests/cluster/test_produce_offloop.py).
- ``KBROKER_SEGMENT_READ_BLOCKS`` (blocks kept for small fetches, 0 = none) and
  ``KBROKER_SEGMENT_TAIL_BATCHES`` (recent batches a segment remembers, 0 = none): perf tail_reads and
  request_bench; tests/cluster/test_fetch_read_block.py checks reads with and without blocks.
- ``KBROKER_SENDFILE_MIN_BYTES``: the sendfile threshold (perf request_bench sendfile-threshold);
  tests/cluster/test_send_path.py, test_sendfile.py.
- ``KBROKER_LOOP_LAG_LOG``: a file for the loop-lag sampler (diagnostic, network/looplag.py).

``KBROKER_EVENT_LOOP`` is the value of the config key ``kbroker.event.loop`` when a config leaves it
unset (config.py validates it).
"""
from __future__ import annotations

import dataclasses
import os
import sys
from typing import Mapping, Optional

# The CPython minor version whose asyncio selector transport internals the native read was checked
# against: its readable-callback hook (``_read_ready_cb``) and the state a direct send must respect
# (``_buffer``, ``_conn_lost``, ``_empty_waiter``, ``_eof``). They are private, so on any other version
# the plain Python read and the transport's own writes serve instead (as on uvloop).
ASYNCIO_INTERNALS_VERSION = (3, 11)


@dataclasses.dataclass(frozen=True)
class Switches:
    native_requests: bool = True
    fast_produce: bool = True
    fast_fetch: bool = True
    native_read: bool = True
    asyncio_internals: bool = True
    codec_streaming: bool = True
    segment_read_blocks: int = 256
    segment_tail_batches: int = 64
    sendfile_min_bytes: Optional[int] = None     # None: the server's own threshold
    loop_lag_log: Optional[str] = None
    event_loop: Optional[str] = None

    def describe(self) -> str:
        """One line: every switch and its value, the off/unset ones too."""
        def show(v):
            return ("on" if v else "off") if isinstance(v, bool) else ("unset" if v is None else str(v))
        return " ".join(f"{f.name}={show(getattr(self, f.name))}" for f in dataclasses.fields(self))


def _on(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "1") != "0"


def _int(env: Mapping[str, str], name: str, default: Optional[int]) -> Optional[int]:
    raw = env.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


def from_environ(env: Mapping[str, str] = os.environ) -> Switches:
    return Switches(
        native_requests=_on(env, "KBROKER_NATIVE_REQUESTS"),
        fast_produce=_on(env, "KBROKER_FAST_PRODUCE"),
        fast_fetch=_on(env, "KBROKER_FAST_FETCH"),
        native_read=_on(env, "KBROKER_NATIVE_READ"),
        asyncio_internals=sys.version_info[:2] == ASYNCIO_INTERNALS_VERSION,
        codec_streaming=_on(env, "KBROKER_CODEC_STREAMING"),
        segment_read_blocks=_int(env, "KBROKER_SEGMENT_READ_BLOCKS", 256),
        segment_tail_batches=_int(env, "KBROKER_SEGMENT_TAIL_BATCHES", 64),
        sendfile_min_bytes=_int(env, "KBROKER_SENDFILE_MIN_BYTES", None),
        loop_lag_log=env.get("KBROKER_LOOP_LAG_LOG") or None,
        event_loop=env.get("KBROKER_EVENT_LOOP"),
    )


current = from_environ()
