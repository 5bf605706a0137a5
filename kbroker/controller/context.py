"""What the controller knows of the cluster: live brokers, topics, assignments, partition states
(with their znode versions, the expected version of the next conditional write)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..zk import layout as L


@dataclass(slots=True)
class LiveBroker:
    broker_id: int
    host: str           # its inter-broker listener's endpoint (the controller channel's address)
    port: int
    rack: str | None
    epoch: int          # czxid of its registration
    endpoints: list = field(default_factory=list)              # [(listener, host, port)], as registered
    protocols: dict = field(default_factory=dict)              # listener -> security protocol


@dataclass(slots=True)
class ControllerContext:
    epoch: int = 0
    brokers: dict[int, LiveBroker] = field(default_factory=dict)
    shutting_down: set[int] = field(default_factory=set)
    topic_ids: dict[str, str | None] = field(default_factory=dict)
    assignments: dict[str, dict[int, list[int]]] = field(default_factory=dict)
    states: dict[tuple[str, int], tuple[L.PartitionState, int]] = field(default_factory=dict)
    reassigning: dict[tuple[str, int], list[int]] = field(default_factory=dict)   # target replicas
    # replicas of deleted topics that were on a broker down at the time: deleted when it returns
    # (this term only; a new controller does not know them)
    stray: dict[int, set[tuple[str, int]]] = field(default_factory=dict)

    def live(self) -> set[int]:
        return set(self.brokers)

    def replicas(self, tp) -> list[int]:
        return self.assignments.get(tp[0], {}).get(tp[1], [])

    def all_partitions(self):
        for t, parts in self.assignments.items():
            for p in parts:
                yield (t, p)

    def partitions_with_replica(self, broker_id: int) -> list[tuple[str, int]]:
        return [tp for tp in self.all_partitions() if broker_id in self.replicas(tp)]

    def partitions_led_by(self, broker_id: int) -> list[tuple[str, int]]:
        return [tp for tp, (st, _) in self.states.items() if st.leader == broker_id]

    def offline_partitions(self) -> list[tuple[str, int]]:
        """Partitions with a state but no live leader."""
        return [tp for tp, (st, _) in self.states.items() if st.leader not in self.brokers]

    def remove_topic(self, topic: str) -> None:
        self.topic_ids.pop(topic, None)
        parts = self.assignments.pop(topic, {})
        for p in parts:
            self.states.pop((topic, p), None)
