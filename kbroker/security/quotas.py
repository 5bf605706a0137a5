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
(``controller_mutation_rate`` is stored and described, not enforced: kbroker has no controller
mutation quota.)

Rates and throttle time. Each (key, user part, client part) has a ``SampledRate`` over
``quota.window.num`` windows of ``quota.window.size.seconds`` (Kafka's Rate, which counts at least
``num - 1`` windows of elapsed time: a fresh client may send about that many windows' worth of its
bound at once). Over the bound, the throttle time is Kafka's ``(rate - bound) / bound x elapsed`` —
the time until the average falls back to the bound if nothing more is sent.

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


class QuotaManager:
    """Every entity's quotas (kept equal to ZooKeeper by the broker) and the shared rates."""

    def __init__(self, samples: int = 11, window_s: float = 1.0, clock=time.monotonic):
        self.samples, self.window_s, self.clock = samples, window_s, clock
        self.entities: dict[tuple[str | None, str | None], dict[str, float]] = {}
        self._sensors: dict[tuple[str, str, str], SampledRate] = {}
        self.version = 0

    @classmethod
    def from_config(cls, get) -> "QuotaManager":
        return cls(get("quota.window.num"), get("quota.window.size.seconds"))

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
            value, (eu, ec) = got
            tags = (key, user if eu is not None else "", client if ec is not None else "")
            sensor = self._sensors.get(tags)
            if sensor is None:
                if len(self._sensors) >= MAX_SENSORS:
                    self._sensors.clear()
                sensor = self._sensors[tags] = SampledRate(self.samples, self.window_s, self.clock)
            bounds[key] = (value, sensor)
        return ClientQuota(bounds) if bounds else None
