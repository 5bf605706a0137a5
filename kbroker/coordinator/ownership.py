"""Which partitions of a coordinator's internal topic this broker leads, loading and unloading them, and
the coordinators' periodic tasks: shared by the group and the transaction coordinator."""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from ..protocol.errors import Errors

log = logging.getLogger(__name__)


def led_partitions(broker, topic: str) -> dict[int, int]:
    """{partition: leader epoch} of ``topic``'s partitions this broker leads: the ReplicaManager's view
    when there is one (it learns leadership first), else the metadata cache's."""
    rm = getattr(broker, "replica_manager", None)
    if rm is not None:
        return {tp[1]: part.leader_epoch for tp, part in list(rm.partitions.items())
                if tp[0] == topic and part.is_leader}
    t = broker.metadata.topics.get(topic)
    if t is None:
        return {}
    me = broker.broker_id
    return {p: info.leader_epoch for p, info in t.partitions.items() if info.leader == me}


def leader_epoch(broker, topic: str, p: int):
    """This broker's leader epoch of ``topic``-``p``, or None if it does not lead it."""
    rm = getattr(broker, "replica_manager", None)
    if rm is not None:
        part = rm.partitions.get((topic, p))
        return part.leader_epoch if part is not None and part.is_leader else None
    t = broker.metadata.topics.get(topic)
    info = t.partitions.get(p) if t is not None else None
    return info.leader_epoch if info is not None and info.leader == broker.broker_id else None


async def periodic(interval_s: float, fn, what: str) -> None:
    """Run ``fn`` (plain or coroutine function) every ``interval_s`` until cancelled; a failure is logged."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            r = fn()
            if asyncio.iscoroutine(r):
                await r
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s periodic task failed", what)


LOADING, LOADED = "loading", "loaded"
LOAD_YIELD_RECORDS = 2000        # records read between two yields to the loop while loading


@dataclass
class LoadedPartition:
    """A partition of a coordinator's internal topic this broker leads: loading, then loaded."""
    index: int
    epoch: int                     # the leader epoch it is loaded for (the transaction coordinator's epoch)
    status: str = LOADING
    keys: set = field(default_factory=set)    # the group ids / transactional ids read from it
    task: asyncio.Task | None = None


class PartitionLoader:
    """The led partitions of a coordinator's internal ``topic``: a periodic ``reconcile`` (and
    ``owner``, on any request) loads a newly led partition from its log in yielding chunks
    (COORDINATOR_LOAD_IN_PROGRESS meanwhile) and unloads one no longer led (NOT_COORDINATOR).

    The coordinator supplies what a record means: ``read(scratch, key, value, pending_pid)`` folds one
    record (key not None) into a dict of its own, raising ``record_error`` for an unreadable one (skipped);
    ``install(ps, scratch)`` takes the result once the load is complete and still current, adding the
    ids it keeps to ``ps.keys``; ``drop(ps)`` forgets a partition's ids when it is unloaded."""

    def __init__(self, broker, topic: str, store, buffer_key: str, noun: str, read, install, drop,
                 record_error: type[Exception]):
        self.broker = broker
        self.topic = topic
        self.store = store
        self.buffer_key = buffer_key
        self.noun = noun
        self._read = read
        self._install = install
        self._drop = drop
        self._record_error = record_error
        self.partitions: dict[int, LoadedPartition] = {}
        self.loop: asyncio.AbstractEventLoop | None = None

    def led(self) -> dict[int, int]:
        return led_partitions(self.broker, self.topic)

    def reconcile(self) -> None:
        led = self.led()
        for p, ps in list(self.partitions.items()):
            if led.get(p) != ps.epoch:
                self.unload(p)
        for p, epoch in led.items():
            if p not in self.partitions and self.broker.logs.get((self.topic, p)) is not None:
                self.begin_load(p, epoch)

    def begin_load(self, p: int, epoch: int) -> None:
        ps = self.partitions[p] = LoadedPartition(p, epoch)
        ps.task = self.loop.create_task(self._load(ps))

    async def _load(self, ps: LoadedPartition) -> None:
        t0 = self.broker.now_ms()
        scratch: dict = {}
        n = 0
        try:
            chunk = self.broker.config.get(self.buffer_key)
            for _offset, key, value, pending_pid in self.store.read_all(ps.index, chunk):
                n += 1
                if n % LOAD_YIELD_RECORDS == 0:
                    await asyncio.sleep(0)
                    if self.partitions.get(ps.index) is not ps:
                        return
                if key is None:
                    continue
                try:
                    self._read(scratch, key, value, pending_pid)
                except self._record_error as e:
                    log.warning("skipping unreadable record in %s-%d: %s", self.topic, ps.index, e)
        except Exception:
            log.exception("loading %s-%d failed", self.topic, ps.index)
            if self.partitions.get(ps.index) is ps:
                del self.partitions[ps.index]
            return
        if self.partitions.get(ps.index) is not ps:
            return
        self._install(ps, scratch)
        ps.status = LOADED
        log.info("loaded %s-%d: %d %s from %d records in %d ms", self.topic, ps.index, len(ps.keys), self.noun,
                 n, self.broker.now_ms() - t0)

    def unload(self, p: int) -> None:
        ps = self.partitions.pop(p, None)
        if ps is None:
            return
        if ps.task is not None and not ps.task.done():
            ps.task.cancel()
        self._drop(ps)
        log.info("unloaded %s-%d", self.topic, p)

    def owner(self, p: int) -> tuple[int, LoadedPartition | None]:
        """(error, loaded partition) for serving an id of partition ``p`` here: NOT_COORDINATOR when not
        led, COORDINATOR_LOAD_IN_PROGRESS while (re)loading, COORDINATOR_NOT_AVAILABLE without a log."""
        epoch = leader_epoch(self.broker, self.topic, p)
        if epoch is None:
            return int(Errors.NOT_COORDINATOR), None
        ps = self.partitions.get(p)
        if ps is not None and ps.epoch != epoch:
            self.unload(p)   # lost and regained leadership since the load: reload
            ps = None
        if ps is None:
            if self.broker.logs.get((self.topic, p)) is None:
                return int(Errors.COORDINATOR_NOT_AVAILABLE), None
            self.begin_load(p, epoch)
            return int(Errors.COORDINATOR_LOAD_IN_PROGRESS), None
        if ps.status != LOADED:
            return int(Errors.COORDINATOR_LOAD_IN_PROGRESS), None
        return 0, ps

    async def all_loaded(self, timeout_s: float = 5.0) -> bool:
        """Start loading what is led and not loaded, wait up to ``timeout_s`` for the loads (they are
        short: this spares clients that do not retry a listing); True when every led partition is loaded."""
        self.reconcile()
        loading = [ps.task for ps in self.partitions.values() if ps.status != LOADED and ps.task is not None]
        if loading:
            await asyncio.wait(loading, timeout=timeout_s)
        return all(ps.status == LOADED for ps in self.partitions.values())

    def unload_all(self) -> None:
        for p in list(self.partitions):
            self.unload(p)
