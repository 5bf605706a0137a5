"""Client quotas as Kafka's ZooKeeper mode applies them (its ClientQuotaManager with the default
quota callback): which bound applies to a (user, client-id), the rates measured against it, and the
throttle time a client over its bound is given.

Entities and precedence. A quota is a key of an entity's config (zk/quotas.py): ``producer_byte_rate``,
``consumer_byte_rate`` (bytes/s) or ``request_percentage`` (percent of one request thread). For each
key on its own, the bound of a connection with user U and client-id C is the first entity that sets it:

  users/U/clients/C, users/U/clients/<default>, users/U, users/<default>/clients/C,
  users/<default>/clients/<default>, users/<default>, clients/C, clients/<default>.

The rate is measured per matched entity *as named for this client*: a bound from ``users/<default>``
is shared by all of U's client-ids but each user has its own; one from ``clients/C`` by every user of C.
``controller_mutation_rate`` (KIP-599) bounds the partitions a (user, client-id) creates or deletes
per second (CreateTopics, CreatePartitions, DeleteTopics), with the same precedence; it is measured by
``mutation`` per request, never on the Produce/Fetch path (below).

Rates and throttle time. Each (key, user part, client part) has a ``SampledRate`` over
``quota.window.num`` windows of ``quota.window.size.seconds`` (Kafka's Rate, which counts at least
``num - 1`` windows of elapsed time: a fresh client may send about that many windows' worth of its
bound at once). Over the bound, the throttle time is Kafka's ``(rate - bound) / bound x elapsed`` —
the time until the average falls back to the bound if nothing more is sent.

Controller mutations are measured with Kafka's TokenBucket over ``controller.quota.window.num`` x
``controller.quota.window.size.seconds``: the bucket holds that many seconds' worth of the rate (the
burst), refills at the rate, and each mutation takes its partitions from it. A request version that
can answer THROTTLING_QUOTA_EXCEEDED is strict: a topic is refused while the bucket is below zero (one
may take it below zero); an older one is permissive: every topic goes ahead and the answer is throttled
by the debt. Either way the throttle time is the time the refill takes to bring the bucket back to zero.

Threads: the event loop (configs loaded and reloaded from ZooKeeper on worker threads).
"""
from __future__ import annotations

import time

from ..replica.throttle import SampledRate

PRODUCE = "producer_byte_rate"
FETCH = "consumer_byte_rate"
REQUEST = "request_percentage"
MUTATION = "controller_mutation_rate"
ENFORCED = (PRODUCE, FETCH, REQUEST)
KEYS = ENFORCED + (MUTATION,)
DEFAULT = "<default>"
INT32_MAX = 2**31 - 1
# Rates kept at most (one per (key, user, client-id) seen with a bound): a client cycling client-ids
# under a default bound cannot grow them without end; over it they start afresh.
MAX_SENSORS = 100_000


def user_of(principal: str) -> str:
    """The quota user of a principal: its name without the type (``User:alice`` -> ``alice``)."""
    return principal.partition(":")[2] or principal


def parse_quotas(config: dict[str, str]) -> dict[str, float]:
    """The quota keys of an entity's config, as numbers (others, e.g. SCRAM credentials, left out)."""
    out = {}
    for k in KEYS:
        v = config.get(k)
        if v is not None:
            try:
                out[k] = float(v)
            except ValueError:
                continue        # unreadable: no bound (as a missing key)
    return out


def validate(key: str, value: float) -> str | None:
    """Why ``key=value`` is not a valid client quota (None when it is)."""
    if key not in KEYS:
        return f"Invalid configuration key {key}"
    if value <= 0:
        return f"Invalid quota value {value} for {key}: it must be positive"
    if key in (PRODUCE, FETCH) and value != int(value):
        return f"Invalid quota value {value} for {key}: it must be a whole number of bytes per second"
    return None


def precedence(user: str, client: str):
    """The entities a (user, client-id) takes a bound from, first match wins (module docstring)."""
    return ((user, client), (user, DEFAULT), (user, None), (DEFAULT, client), (DEFAULT, DEFAULT),
            (DEFAULT, None), (None, client), (None, DEFAULT))


class ClientQuota:
    """The bounds and rates of one (user, client-id) that has at least one bound."""

    __slots__ = ("bounds",)

    def __init__(self, bounds: dict[str, tuple[float, SampledRate]]):
        self.bounds = bounds

    def record(self, key: str, value: float, now: float | None = None) -> None:
        got = self.bounds.get(key)
        if got is not None:
            got[1].record(value, now)

    def throttle_ms(self, key: str, now: float | None = None) -> int:
        """How long this client must wait for its ``key`` rate to be back at the bound (0: within it)."""
        got = self.bounds.get(key)
        if got is None:
            return 0
        bound, sensor = got
        total, elapsed = sensor.measure(now)
        if elapsed <= 0 or total / elapsed <= bound:
            return 0
        return min(int((total / bound - elapsed) * 1000), INT32_MAX)

    def has(self, key: str) -> bool:
        return key in self.bounds


class TokenBucket:
    """Kafka's TokenBucket: full (the burst) at first, refilled at the rate, emptied by records; the
    rate and burst are passed at each use, so a changed bound applies at once."""

    __slots__ = ("tokens", "last")

    def __init__(self, now: float):
        self.tokens = float("inf")      # capped to the burst at the first refill
        self.last = now

    def measure(self, rate: float, burst: float, now: float) -> float:
        self.tokens = min(burst, self.tokens + rate * max(now - self.last, 0.0))
        self.last = now
        return self.tokens

    def record(self, n: float, rate: float, burst: float, now: float) -> None:
        self.tokens = min(burst, self.measure(rate, burst, now) - n)


class MutationQuota:
    """One request's controller mutation quota (module docstring): ``admit`` each topic's partitions in
    turn; ``throttle_ms`` is the answer's throttle time once they are all admitted or refused."""

    __slots__ = ("rate", "burst", "bucket", "strict", "clock", "throttle_ms")

    def __init__(self, rate: float, burst: float, bucket: TokenBucket, strict: bool, clock):
        self.rate, self.burst, self.bucket, self.strict, self.clock = rate, burst, bucket, strict, clock
        self.throttle_ms = 0

    def _debt_ms(self, tokens: float) -> int:
        return min(round(-tokens / self.rate * 1000), INT32_MAX)

    def admit(self, partitions: int) -> bool:
        """Whether ``partitions`` creations or deletions may go ahead now (recorded when they do)."""
        now = self.clock()
        if self.strict:
            tokens = self.bucket.measure(self.rate, self.burst, now)
            if tokens < 0:
                self.throttle_ms = self._debt_ms(tokens)
                return False
            self.bucket.record(partitions, self.rate, self.burst, now)
            return True
        self.bucket.record(partitions, self.rate, self.burst, now)
        if self.bucket.tokens < 0:
            self.throttle_ms = self._debt_ms(self.bucket.tokens)
        return True


class QuotaManager:
    """Every entity's quotas (kept equal to ZooKeeper by the broker) and the shared rates."""

    def __init__(self, samples: int = 11, window_s: float = 1.0, clock=time.monotonic,
                 mutation_samples: int = 11, mutation_window_s: float = 1.0):
        self.samples, self.window_s, self.clock = samples, window_s, clock
        self.mutation_burst_s = mutation_samples * mutation_window_s
        self.entities: dict[tuple[str | None, str | None], dict[str, float]] = {}
        self._sensors: dict[tuple[str, str, str], SampledRate] = {}
        self.version = 0

    @classmethod
    def from_config(cls, get) -> "QuotaManager":
        return cls(get("quota.window.num"), get("quota.window.size.seconds"),
                   mutation_samples=get("controller.quota.window.num"),
                   mutation_window_s=get("controller.quota.window.size.seconds"))

    def set_entity(self, user: str | None, client: str | None, config: dict[str, str]) -> bool:
        """Make the entity's quotas those of ``config`` (its whole znode); True when they changed."""
        quotas = parse_quotas(config)
        key = (user, client)
        if self.entities.get(key, {}) == quotas:
            return False
        if quotas:
            self.entities[key] = quotas
        else:
            self.entities.pop(key, None)
        self.version += 1
        return True

    def any(self) -> bool:
        return bool(self.entities)

    def bound(self, user: str, client: str, key: str):
        """(bound, matched entity) of ``key`` for the (user, client-id); None without one."""
        entities = self.entities
        for entity in precedence(user, client):
            quotas = entities.get(entity)
            if quotas is not None and key in quotas:
                return quotas[key], entity
        return None

    def _sensor(self, tags, make):
        sensor = self._sensors.get(tags)
        if sensor is None:
            if len(self._sensors) >= MAX_SENSORS:
                self._sensors.clear()
            sensor = self._sensors[tags] = make()
        return sensor

    @staticmethod
    def _tags(key: str, user: str, client: str, entity) -> tuple[str, str, str]:
        """The rate a bound from ``entity`` is measured by, as the entity names this client."""
        eu, ec = entity
        return key, user if eu is not None else "", client if ec is not None else ""

    def mutation(self, principal: str, client_id: str | None, strict: bool) -> MutationQuota | None:
        """The controller mutation quota of one CreateTopics/CreatePartitions/DeleteTopics (None when no
        bound applies)."""
        if not self.entities:
            return None
        user, client = user_of(principal), client_id or ""
        got = self.bound(user, client, MUTATION)
        if got is None:
            return None
        rate, entity = got
        bucket = self._sensor(self._tags(MUTATION, user, client, entity), lambda: TokenBucket(self.clock()))
        return MutationQuota(rate, rate * self.mutation_burst_s, bucket, strict, self.clock)

    def lookup(self, principal: str, client_id: str | None) -> ClientQuota | None:
        """The connection's quotas (None when no bound applies to it)."""
        if not self.entities:
            return None
        user, client = user_of(principal), client_id or ""
        bounds = {}
        for key in ENFORCED:
            got = self.bound(user, client, key)
            if got is None:
                continue
            value, entity = got
            bounds[key] = (value, self._sensor(self._tags(key, user, client, entity),
                                               lambda: SampledRate(self.samples, self.window_s, self.clock)))
        return ClientQuota(bounds) if bounds else None
