"""Connection creation rates as Kafka's ConnectionQuotas applies them (KIP-612).

- Per client address: ``connection_creation_rate`` of the ``ips/<ip>`` entity, else of ``ips/<default>``
  (/config/ips in ZooKeeper, zk/quotas.py). A connection that would take its address over the bound is
  not served: it is closed after the throttle time (so the client does not reconnect at once) and not
  counted in the rate.
- Broker-wide: ``max.connection.creation.rate`` over every listener but the inter-broker one (when it is
  not the only listener). A
  connection over it is served late: it waits the throttle time, and nothing more is accepted meanwhile
  (new clients wait in the listen backlog), as Kafka's acceptor waits.
- Per listener: ``listener.name.<l>.max.connection.creation.rate`` over that listener's connections (the
  inter-broker one too). A connection over it is served late likewise, and that listener alone stops
  accepting meanwhile (Kafka's acceptor of that listener waits). A connection is counted in both rates;
  it waits the longer of the two throttle times.
- Both bounds follow the dynamic broker configs (``set_rates``): already counted connections stay counted.

Rates are measured over ``quota.window.num`` windows of ``quota.window.size.seconds`` (Kafka's Rate), the
throttle time is Kafka's ``(rate - bound) / bound x elapsed``, at most one window.

Threads: the event loop.
"""
from __future__ import annotations

import time

from ..replica.throttle import SampledRate

RATE_KEY = "connection_creation_rate"
DEFAULT = "<default>"
UNBOUNDED = 2**31 - 1
# Rates kept at most (one per address with a bound): many addresses under a default bound cannot grow
# them without end; over it they start afresh.
MAX_RATES = 100_000


def parse_rate(config: dict[str, str]) -> int | None:
    """The entity's connection_creation_rate (None: none, or unreadable)."""
    value = config.get(RATE_KEY)
    try:
        return int(float(value)) if value is not None else None
    except ValueError:
        return None


class ConnectionQuotas:
    def __init__(self, broker_rate: int = UNBOUNDED, samples: int = 11, window_s: float = 1.0,
                 clock=time.monotonic):
        self.samples, self.window_s, self.clock = samples, window_s, clock
        self.broker_rate = broker_rate
        self._broker = SampledRate(samples, window_s, clock)
        self.listener_rates: dict[str, int] = {}        # listener name (upper case) -> bound
        self._listeners: dict[str, SampledRate] = {}
        self.ips: dict[str, int] = {}           # address or DEFAULT -> bound
        self._rates: dict[str, SampledRate] = {}

    @classmethod
    def from_config(cls, get) -> "ConnectionQuotas":
        return cls(get("max.connection.creation.rate"), get("quota.window.num"), get("quota.window.size.seconds"))

    def set_rates(self, broker_rate: int, listener_rates: dict[str, int]) -> None:
        """The broker-wide bound and the listeners' (a listener not named has none)."""
        self.broker_rate = broker_rate
        self.listener_rates = dict(listener_rates)
        for name in list(self._listeners):
            if name not in self.listener_rates:
                del self._listeners[name]

    def set_ip(self, ip: str, config: dict[str, str]) -> bool:
        """Make the address's (or DEFAULT's) bound that of ``config``; True when it changed."""
        rate = parse_rate(config)
        if self.ips.get(ip) == rate:
            return False
        if rate is None:
            self.ips.pop(ip, None)
        else:
            self.ips[ip] = rate
        return True

    def _throttle_ms(self, sensor: SampledRate, bound: int, now: float) -> int:
        total, elapsed = sensor.measure(now)
        limit = int(self.window_s * 1000)
        if bound <= 0:
            return limit
        if elapsed <= 0 or total / elapsed <= bound:
            return 0
        return min(int((total / bound - elapsed) * 1000), limit)

    def ip_throttle_ms(self, ip: str) -> int:
        """A new connection from ``ip``: 0 when it may be served (recorded), else how long to hold it
        before closing it (not recorded)."""
        bound = self.ips.get(ip)
        if bound is None:
            bound = self.ips.get(DEFAULT)
            if bound is None:
                return 0
        sensor = self._rates.get(ip)
        if sensor is None:
            if len(self._rates) >= MAX_RATES:
                self._rates.clear()
            sensor = self._rates[ip] = SampledRate(self.samples, self.window_s, self.clock)
        now = self.clock()
        sensor.record(1, now)
        ms = self._throttle_ms(sensor, bound, now)
        if ms > 0:
            sensor.record(-1, now)
        return ms

    def accept_delay_ms(self, listener: str, protected: bool) -> tuple[int, int]:
        """A new connection on ``listener``: recorded, and how long it must wait for the broker-wide
        rate (0 for the ``protected`` inter-broker listener: accepting on every listener waits that
        long) and for its listener's rate (that listener's accepting waits) to be back at their bounds."""
        now = self.clock()
        listener_ms = 0
        bound = self.listener_rates.get(listener)
        if bound is not None and bound < UNBOUNDED:
            sensor = self._listeners.get(listener)
            if sensor is None:
                sensor = self._listeners[listener] = SampledRate(self.samples, self.window_s, self.clock)
            sensor.record(1, now)
            listener_ms = self._throttle_ms(sensor, bound, now)
        if protected or self.broker_rate >= UNBOUNDED:
            return 0, listener_ms
        self._broker.record(1, now)
        return self._throttle_ms(self._broker, self.broker_rate, now), listener_ms
