"""Replication throttling as Kafka does it (its ReplicationQuotaManager, ZooKeeper mode).

Two quotas per broker, in bytes/s: ``leader.replication.throttled.rate`` (what this broker serves
to followers) and ``follower.replication.throttled.rate`` (what its fetchers copy). Both default to
Long.MAX (no limit). They apply only to the replicas a topic lists in
``leader.replication.throttled.replicas`` / ``follower.replication.throttled.replicas``
("partition:broker,..." naming this broker, or "*" for every partition of the topic).

- Rate: bytes recorded over ``replication.quota.window.num`` samples of
  ``replication.quota.window.size.seconds`` each, divided by the elapsed time, which counts at
  least ``num - 1`` full windows (Kafka's Rate over a SampledStat): a fresh quota lets about
  ``(num - 1) x size x rate`` bytes through at once, then holds the average. Exceeded = rate > bound.
- Leader side: a follower fetch gets no records for a throttled partition while the leader quota
  is exceeded, unless that follower is in the ISR (throttling never takes an in-sync replica out).
  The bytes served for throttled partitions are recorded.
- Follower side: the fetcher leaves a throttled partition out of its Fetch while the follower
  quota is exceeded, unless it has caught up with the leader's high watermark (Kafka's
  isReplicaInSync); the bytes it appends for throttled partitions are recorded.
- The rates are dynamic broker configs: ZooKeeper's /config/brokers/<id> overrides
  /config/brokers/<default>, which overrides the static broker config. ``ThrottleConfigWatcher``
  follows both znodes (data watches) and sets the quotas' bounds.

Threads: the event-loop thread (the watcher's ZooKeeper reads run on worker threads).
"""
from __future__ import annotations

import asyncio
import logging
import time

log = logging.getLogger(__name__)

LONG_MAX = 2**63 - 1
LEADER_RATE = "leader.replication.throttled.rate"
FOLLOWER_RATE = "follower.replication.throttled.rate"
LEADER_REPLICAS = "leader.replication.throttled.replicas"
FOLLOWER_REPLICAS = "follower.replication.throttled.replicas"
ALL = "*"


def parse_throttled_replicas(key: str, value, broker_id: int):
    """The partitions of one topic throttled on ``broker_id`` by config ``key``'s ``value``
    (a list of "partition:broker" strings or Kafka's comma-separated text) -> ALL, or a frozenset
    of partition ids (empty: none). A malformed entry raises ValueError naming the key."""
    if value is None:
        return frozenset()
    items = value.split(",") if isinstance(value, str) else value
    out = set()
    for raw in items:
        item = str(raw).strip()
        if not item:
            continue
        if item == ALL:
            return ALL
        p, sep, b = item.partition(":")
        if not sep or not p.strip().isdigit() or not b.strip().isdigit():
            raise ValueError(f"{key}: {item!r} is neither '*' nor 'partition:broker'")
        if int(b) == broker_id:
            out.add(int(p))
    return frozenset(out)


def format_throttled_replicas(pairs) -> str:
    """[(partition, broker)] -> Kafka's "p:b,p:b" text (sorted, no duplicates)."""
    return ",".join(f"{p}:{b}" for p, b in sorted(set(pairs)))


class SampledRate:
    """Bytes per second over a ring of ``samples`` windows of ``window_s`` seconds (Kafka's Rate)."""

    __slots__ = ("samples", "window_s", "_starts", "_values", "_current", "clock")

    def __init__(self, samples: int, window_s: float, clock=time.monotonic):
        self.samples = max(int(samples), 1)
        self.window_s = float(window_s)
        self.clock = clock
        now = clock()
        self._starts = [now] * self.samples
        self._values = [0.0] * self.samples
        self._current = 0

    def _advance(self, now: float) -> None:
        if now - self._starts[self._current] >= self.window_s:
            self._current = (self._current + 1) % self.samples
            self._starts[self._current] = now
            self._values[self._current] = 0.0

    def record(self, n: float, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        self._advance(now)
        self._values[self._current] += n

    def rate(self, now: float | None = None) -> float:
        total, elapsed = self.measure(now)
        return total / elapsed if elapsed > 0 else 0.0

    def measure(self, now: float | None = None) -> tuple[float, float]:
        """(recorded total, elapsed seconds) the rate divides: client quotas derive their throttle time
        from both, as Kafka does."""
        now = self.clock() if now is None else now
        horizon = self.samples * self.window_s
        total = 0.0
        oldest = now
        for start, value in zip(self._starts, self._values):
            if now - start >= horizon:
                continue                  # obsolete sample (Kafka purges it)
            total += value
            oldest = min(oldest, start)
        elapsed = now - oldest
        full = int(elapsed // self.window_s)
        if full < self.samples - 1:
            elapsed += (self.samples - 1 - full) * self.window_s
        return total, elapsed


class ReplicationQuota:
    """One side's quota (leader or follower): the bound, the measured rate, and which partitions
    are throttled (read from the topics' configs through ``topic_config(topic) -> dict``)."""

    def __init__(self, key: str, replicas_key: str, broker_id: int, bound: int, samples: int, window_s: float,
                 topic_config, clock=time.monotonic):
        self.key = key
        self.replicas_key = replicas_key
        self.broker_id = broker_id
        self.bound = bound
        self.rate = SampledRate(samples, window_s, clock)
        self.topic_config = topic_config
        self._parsed: dict = {}          # topic -> (raw value, parsed)
        self.throttled_bytes = 0         # recorded in total (metrics / tests)
        self.skipped = 0                 # partitions left out because the quota was exceeded

    def set_bound(self, bound: int) -> None:
        if bound != self.bound:
            log.info("%s = %s bytes/s", self.key, "unlimited" if bound >= LONG_MAX else bound)
        self.bound = bound

    def is_throttled(self, tp) -> bool:
        raw = (self.topic_config(tp[0]) or {}).get(self.replicas_key)
        if not raw:
            return False
        cached = self._parsed.get(tp[0])
        if cached is None or cached[0] != raw:
            try:
                parsed = parse_throttled_replicas(self.replicas_key, raw, self.broker_id)
            except ValueError as e:
                log.warning("topic %s: %s; not throttled", tp[0], e)
                parsed = frozenset()
            cached = self._parsed[tp[0]] = (list(raw) if isinstance(raw, list) else raw, parsed)
        parsed = cached[1]
        return parsed is ALL or tp[1] in parsed

    def is_exceeded(self, now: float | None = None) -> bool:
        return self.bound < LONG_MAX and self.rate.rate(now) > self.bound

    def record(self, n: int, now: float | None = None) -> None:
        self.throttled_bytes += n
        self.rate.record(n, now)


def _parse_rate(key: str, text) -> int:
    try:
        v = int(str(text).strip())
    except ValueError:
        raise ValueError(f"{key}: {text!r} is not a number of bytes/s") from None
    if v < 0:
        raise ValueError(f"{key}: {v} must be >= 0")
    return v


class ThrottleConfigWatcher:
    """Follows /config/brokers/<id> and /config/brokers/<default> and sets the two quotas' bounds
    (per-broker value, else the cluster default, else the static broker config)."""

    def __init__(self, zk, broker_id: int, quotas: dict, static: dict):
        self.zk = zk
        self.broker_id = broker_id
        self.quotas = quotas              # key -> ReplicationQuota
        self.static = static              # key -> static value
        self.active = False
        self.loop = None
        self._dirty = False
        self._task = None
        # The dynamic configs as last read (DescribeConfigs shows what this broker applied, as Kafka's
        # DynamicBrokerConfig does): /config/brokers/<id> and /config/brokers/<default>.
        self.broker_configs: dict[str, str] = {}
        self.default_configs: dict[str, str] = {}
        # Other followers of these dynamic configs, called (on the loop) with both after each read.
        self.on_reload: list = []

    def start(self) -> None:
        self.active = True
        self.loop = asyncio.get_running_loop()
        for entity in (str(self.broker_id), "<default>"):
            self.zk.watch_data(f"/config/brokers/{entity}", self._changed, lambda: self.active)

    def stop(self) -> None:
        self.active = False

    def _changed(self, _exists) -> None:
        # From the loop, or from BrokerZk's worker thread when it has no loop to hand events to.
        try:
            self.loop.call_soon_threadsafe(self._schedule)
        except RuntimeError:
            pass        # the loop is closed: shutting down

    def _schedule(self) -> None:
        # One reader at a time, re-reading while changes keep coming: the last read wins.
        self._dirty = True
        if self.active and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._reload_while_dirty())

    async def _reload_while_dirty(self) -> None:
        while self._dirty and self.active:
            self._dirty = False
            await self.reload()

    async def reload(self) -> None:
        try:
            mine, default = await asyncio.to_thread(
                lambda: (self.zk.get_broker_config(str(self.broker_id)), self.zk.get_broker_config("<default>")))
        except Exception as e:
            log.warning("cannot read the replication throttle configs: %r", e)
            return
        self.broker_configs, self.default_configs = mine, default
        for follower in self.on_reload:
            follower(mine, default)
        for key, quota in self.quotas.items():
            text = mine.get(key, default.get(key))
            try:
                bound = self.static[key] if text is None else _parse_rate(key, text)
            except ValueError as e:
                log.warning("%s; keeping %s", e, quota.bound)
                continue
            quota.set_bound(bound)
