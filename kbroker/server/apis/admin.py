"""Topic administration: CreateTopics, DeleteTopics, CreatePartitions and Metadata's auto-creation.

ZooKeeper is the source of truth, so every handler validates against the metadata cache, writes
ZooKeeper through ``BrokerZk`` on a worker thread (the calls block), then refreshes the cache so
the logs exist (or are gone) before the client hears back. Writes are controller-only; with a lone
broker this broker is the controller. Error codes and messages follow Kafka 3.9 in ZooKeeper mode.
"""
from __future__ import annotations

import asyncio
import logging
import random

from ...config import ConfigError, TOPIC_CONFIGS, parse_topic_config
from ...protocol import api
from ...protocol.errors import Errors
from ...zk.client import NotControllerError, StaleVersionError, TopicExistsError, TopicNotFoundError
from ..metadata import topic_name_error

log = logging.getLogger(__name__)

GROUP_METADATA_TOPIC = "__consumer_offsets"
TRANSACTION_STATE_TOPIC = "__transaction_state"


class AdminError(Exception):
    """A per-topic failure that becomes ``error_code`` + ``error_message`` in the response."""

    def __init__(self, code: int, message: str | None = None):
        super().__init__(message)
        self.code = int(code)
        self.message = message


def register(broker, handlers):
    api.advertise(19, 0, 4)
    api.advertise(20, 0, 3)
    api.advertise(37, 0, 1)
    handlers[19] = lambda conn, header, body: create_topics(broker, header, body)
    handlers[20] = lambda conn, header, body: delete_topics(broker, header, body)
    handlers[37] = lambda conn, header, body: create_partitions(broker, header, body)


# ---- shared helpers ------------------------------------------------------------------------------

def assign_replicas(brokers, n_partitions: int, replication_factor: int, *, start_partition: int = 0,
                    start_index: int = -1) -> dict[int, list[int]]:
    """Kafka's rack-unaware assignment: leaders round-robin over the sorted brokers from a random
    start, followers at a shift that grows every time the leaders wrap around, so partitions of
    one topic spread their replicas (and leadership) evenly."""
    ids = sorted(brokers)
    n = len(ids)
    if n_partitions <= 0:
        raise AdminError(Errors.INVALID_PARTITIONS, "Number of partitions must be larger than 0.")
    if replication_factor <= 0:
        raise AdminError(Errors.INVALID_REPLICATION_FACTOR, "Replication factor must be larger than 0.")
    if replication_factor > n:
        raise AdminError(Errors.INVALID_REPLICATION_FACTOR,
                         f"Replication factor: {replication_factor} larger than available brokers: {n}.")
    start = start_index if start_index >= 0 else random.randrange(n)
    shift = start_index if start_index >= 0 else random.randrange(n)
    out = {}
    p = max(0, start_partition)
    for _ in range(n_partitions):
        if p > 0 and p % n == 0:
            shift += 1
        first = (p + start) % n
        replicas = [ids[first]]
        for j in range(replication_factor - 1):
            replicas.append(ids[(first + 1 + (shift + j) % (n - 1)) % n])
        out[p] = replicas
        p += 1
    return out


def _check_manual_assignment(replica_lists: list[list[int]], live: set[int], expected_rf: int | None,
                             first_partition: int) -> None:
    for i, replicas in enumerate(replica_lists):
        p = first_partition + i
        if not replicas:
            raise AdminError(Errors.INVALID_REPLICA_ASSIGNMENT, f"Replica list of partition {p} is empty.")
        if len(set(replicas)) != len(replicas):
            raise AdminError(Errors.INVALID_REPLICA_ASSIGNMENT,
                             f"Duplicate brokers not allowed in replica assignment: {_ids(replicas)} "
                             f"for partition id {p}.")
        unknown = [b for b in replicas if b not in live]
        if unknown:
            raise AdminError(Errors.INVALID_REPLICA_ASSIGNMENT,
                             f"Unknown broker(s) in replica assignment: {_ids(unknown)}.")
        if expected_rf is None:
            expected_rf = len(replicas)
        elif len(replicas) != expected_rf:
            raise AdminError(Errors.INVALID_REPLICA_ASSIGNMENT,
                             f"Inconsistent replication factor between partitions, partition {first_partition} "
                             f"has {expected_rf} while partition {p} has {len(replicas)}.")


def _ids(ids) -> str:
    return ", ".join(str(i) for i in ids)


def validate_topic_configs(configs) -> dict[str, str]:
    """[(name, text)] → the override dict stored in ZooKeeper; ConfigError text → INVALID_CONFIG."""
    out = {}
    for name, value in configs:
        if value is None:
            raise AdminError(Errors.INVALID_CONFIG, f"Null value not supported for topic configs: {name}")
        try:
            parse_topic_config(name, value)
        except ConfigError as e:
            raise AdminError(Errors.INVALID_CONFIG, str(e)) from None
        out[name] = value
    check_config_consistency(out)
    return out


def check_config_consistency(overrides: dict[str, str]) -> None:
    """Cross-key rules Kafka's LogConfig.validate applies to a topic's overrides."""
    lo = overrides.get("min.compaction.lag.ms")
    hi = overrides.get("max.compaction.lag.ms")
    lo_v = parse_topic_config("min.compaction.lag.ms", lo) if lo is not None else TOPIC_CONFIGS["min.compaction.lag.ms"].default
    hi_v = parse_topic_config("max.compaction.lag.ms", hi) if hi is not None else TOPIC_CONFIGS["max.compaction.lag.ms"].default
    if lo_v > hi_v:
        raise AdminError(Errors.INVALID_CONFIG,
                         f"conflict topic config setting min.compaction.lag.ms ({lo_v}) > "
                         f"max.compaction.lag.ms ({hi_v})")


def _is_controller(broker) -> bool:
    return broker.zk is not None and broker.zk.is_controller


def _collides(name: str, existing) -> str | None:
    """Kafka forbids topics whose names differ only in '.' vs '_' (they share metric names)."""
    key = name.replace(".", "_")
    for other in existing:
        if other != name and other.replace(".", "_") == key:
            return other
    return None


def _timeout_s(timeout_ms) -> float | None:
    return timeout_ms / 1000 if timeout_ms and timeout_ms > 0 else None


async def _run_bounded(work, timeout_ms) -> bool:
    """Run ``work`` (a coroutine) to completion in the background; wait at most ``timeout_ms``.

    Never cancelled on timeout: half-applied ZooKeeper writes would be worse than a late one, and
    Kafka also lets the operation finish while answering REQUEST_TIMED_OUT."""
    task = asyncio.ensure_future(work)
    done, _ = await asyncio.wait({task}, timeout=_timeout_s(timeout_ms))
    if task in done:
        task.result()   # re-raise a failure
        return True
    task.add_done_callback(lambda t: t.cancelled() or t.exception())  # no "never retrieved" noise
    return False


def internal_topic_spec(broker, name: str) -> tuple[int, int, dict[str, str]] | None:
    """(partitions, replication factor, configs) Kafka gives its internal topics on auto-creation."""
    cfg = broker.config
    if name == GROUP_METADATA_TOPIC:
        return (cfg.get("offsets.topic.num.partitions"), cfg.get("offsets.topic.replication.factor"),
                {"cleanup.policy": "compact", "compression.type": "producer",
                 "segment.bytes": str(cfg.get("offsets.topic.segment.bytes"))})
    if name == TRANSACTION_STATE_TOPIC:
        return (cfg.get("transaction.state.log.num.partitions"),
                cfg.get("transaction.state.log.replication.factor"),
                {"cleanup.policy": "compact", "compression.type": "uncompressed",
                 "min.insync.replicas": str(cfg.get("transaction.state.log.min.isr")),
                 "segment.bytes": str(cfg.get("transaction.state.log.segment.bytes"))})
    return None


# ---- auto-creation (Metadata) --------------------------------------------------------------------

async def auto_create_topics(broker, names) -> list[str]:
    """Create the missing, validly named topics with the broker defaults; return those we created.

    A topic someone else created meanwhile counts as existing, not as created. A replication factor
    larger than the live brokers leaves the topic uncreated (Kafka answers the Metadata request with
    an error for it and the client retries)."""
    if not _is_controller(broker):
        return []
    live = list(broker.metadata.brokers)
    created = []
    for name in dict.fromkeys(names):
        if name in broker.metadata.topics or topic_name_error(name) is not None:
            continue
        if _collides(name, broker.metadata.topics):
            continue
        spec = internal_topic_spec(broker, name)
        if spec is None:
            spec = (broker.config.get("num.partitions"), broker.config.get("default.replication.factor"), {})
        partitions, rf, configs = spec
        try:
            assignment = assign_replicas(live, partitions, rf)
        except AdminError as e:
            log.warning("not auto-creating topic %s: %s", name, e.message)
            continue
        try:
            await asyncio.to_thread(broker.zk.create_topic, name, assignment, configs)
        except TopicExistsError:
            continue
        except NotControllerError:
            break
        log.info("auto-created topic %s with %d partitions, replication factor %d", name, partitions, rf)
        created.append(name)
    if created:
        await broker.refresh_metadata(created)
    return created


# ---- CreateTopics (19) ---------------------------------------------------------------------------

async def create_topics(broker, header, body):
    validate_only = bool(body.get("validate_only", False))
    md = broker.metadata
    results: dict[str, dict] = {}
    order: list[str] = []
    counts: dict[str, int] = {}
    for t in body["topics"]:
        counts[t["name"]] = counts.get(t["name"], 0) + 1

    to_create = []   # (name, assignment, configs)
    for t in body["topics"]:
        name = t["name"]
        if name in results:
            continue
        order.append(name)
        res = results[name] = {"name": name, "error_code": 0, "error_message": None}
        try:
            if counts[name] > 1:
                raise AdminError(Errors.INVALID_REQUEST,
                                 f"Create topics request from client `{header.client_id}` contains multiple "
                                 f"entries for the following topics: {name}")
            if not _is_controller(broker):
                raise AdminError(Errors.NOT_CONTROLLER, "This is not the correct controller for this cluster.")
            to_create.append((name, *_plan_topic(broker, md, t)))
        except AdminError as e:
            res["error_code"], res["error_message"] = e.code, e.message

    if to_create and not validate_only:
        done: set[str] = set()

        async def work():
            for name, assignment, configs in to_create:
                try:
                    await asyncio.to_thread(broker.zk.create_topic, name, assignment, configs)
                except TopicExistsError:
                    _fail(results[name], Errors.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.")
                except NotControllerError as e:
                    _fail(results[name], Errors.NOT_CONTROLLER, str(e))
                except Exception as e:   # a ZooKeeper failure must not lose the other topics' answers
                    log.exception("creating topic %s failed", name)
                    _fail(results[name], Errors.UNKNOWN_SERVER_ERROR, f"Creating topic {name} failed: {e}")
                else:
                    log.info("created topic %s with %d partitions, replication factor %d", name,
                             len(assignment), len(assignment[0]))
                done.add(name)
            await broker.refresh_metadata([name for name, _, _ in to_create])

        if not await _run_bounded(work(), body.get("timeout_ms", 60000)):
            for name, _, _ in to_create:
                res = results[name]
                if res["error_code"] == 0:
                    _fail(res, Errors.REQUEST_TIMED_OUT,
                          f"Timed out waiting for topic {name} to be created "
                          f"({'written to ZooKeeper' if name in done else 'not yet written'}).")
    # error_message only exists from v1; the encoder leaves out fields the version lacks.
    return {"throttle_time_ms": 0, "topics": [results[n] for n in order]}


def _fail(res: dict, code: int, message: str) -> None:
    res["error_code"], res["error_message"] = int(code), message


def _plan_topic(broker, md, t) -> tuple[dict[int, list[int]], dict[str, str]]:
    """Validate one CreatableTopic; return (assignment, config overrides) or raise AdminError."""
    name = t["name"]
    bad = topic_name_error(name)
    if bad is not None:
        raise AdminError(Errors.INVALID_TOPIC_EXCEPTION, f"Topic name is illegal: {bad}")
    if name in md.topics:
        raise AdminError(Errors.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.")
    other = _collides(name, md.topics)
    if other is not None:
        raise AdminError(Errors.INVALID_TOPIC_EXCEPTION, f"Topic '{name}' collides with existing topic: {other}")
    configs = validate_topic_configs((c["name"], c["value"]) for c in t.get("configs") or ())
    n_parts, rf = t["num_partitions"], t["replication_factor"]
    manual = t.get("assignments") or []
    live = set(md.brokers)
    if manual:
        if n_parts != -1 or rf != -1:
            raise AdminError(Errors.INVALID_REQUEST,
                             "Both numPartitions or replicationFactor and replicasAssignments were set. "
                             "Both cannot be used at the same time.")
        by_partition = {}
        for a in manual:
            by_partition[a["partition_index"]] = list(a["broker_ids"])
        if sorted(by_partition) != list(range(len(by_partition))):
            raise AdminError(Errors.INVALID_REPLICA_ASSIGNMENT,
                             "Partitions should be a consecutive 0-based integer sequence.")
        lists = [by_partition[p] for p in range(len(by_partition))]
        _check_manual_assignment(lists, live, None, 0)
        return dict(enumerate(lists)), configs
    if n_parts == -1:
        n_parts = broker.config.get("num.partitions")
    if rf == -1:
        rf = broker.config.get("default.replication.factor")
    return assign_replicas(live, n_parts, rf), configs


# ---- DeleteTopics (20) ---------------------------------------------------------------------------

async def delete_topics(broker, header, body):
    version = header.api_version
    names = list(body.get("topic_names") or [])
    responses = {}
    order = []
    to_delete = []
    enabled = broker.config.get("delete.topic.enable")
    for name in names:
        if name in responses:
            continue
        order.append(name)
        res = responses[name] = {"name": name, "error_code": 0}
        if not enabled:
            # Kafka: INVALID_REQUEST before v3, which has no dedicated code for it.
            res["error_code"] = Errors.TOPIC_DELETION_DISABLED if version >= 3 else Errors.INVALID_REQUEST
        elif names.count(name) > 1:
            res["error_code"] = Errors.INVALID_REQUEST
        elif name not in broker.metadata.topics:
            res["error_code"] = Errors.UNKNOWN_TOPIC_OR_PARTITION
        elif not _is_controller(broker):
            res["error_code"] = Errors.NOT_CONTROLLER
        else:
            to_delete.append(name)

    if to_delete:
        async def work():
            deleted = []
            for name in to_delete:
                info = broker.metadata.topics.get(name)
                try:
                    await asyncio.to_thread(broker.zk.delete_topic, name)
                except TopicNotFoundError:
                    responses[name]["error_code"] = Errors.UNKNOWN_TOPIC_OR_PARTITION
                    continue
                except NotControllerError:
                    responses[name]["error_code"] = Errors.NOT_CONTROLLER
                    continue
                except Exception:
                    log.exception("deleting topic %s failed", name)
                    responses[name]["error_code"] = Errors.UNKNOWN_SERVER_ERROR
                    continue
                deleted.append((name, info))
            # Refresh before touching the logs: once this refresh (which holds the metadata lock)
            # has read ZooKeeper, no later refresh can see the topic and reopen its logs.
            await broker.refresh_metadata([name for name, _ in deleted])
            for name, info in deleted:
                for p in sorted(info.partitions) if info is not None else ():
                    if broker.logs.get((name, p)) is not None:
                        broker.logs.delete(name, p)
                log.info("deleted topic %s", name)

        if not await _run_bounded(work(), body.get("timeout_ms", 0)):
            for name in to_delete:
                if responses[name]["error_code"] == 0:
                    responses[name]["error_code"] = Errors.REQUEST_TIMED_OUT
    return {"throttle_time_ms": 0, "responses": [responses[n] for n in order]}


# ---- CreatePartitions (37) -----------------------------------------------------------------------

async def create_partitions(broker, header, body):
    validate_only = bool(body.get("validate_only", False))
    md = broker.metadata
    names = [t["name"] for t in body["topics"]]
    results = {}
    order = []
    plans = []    # (name, new assignment)
    for t in body["topics"]:
        name = t["name"]
        if name in results:
            continue
        order.append(name)
        res = results[name] = {"name": name, "error_code": 0, "error_message": None}
        try:
            if names.count(name) > 1:
                raise AdminError(Errors.INVALID_REQUEST, "Duplicate topic in request.")
            if not _is_controller(broker):
                raise AdminError(Errors.NOT_CONTROLLER, "This is not the correct controller for this cluster.")
            plans.append((name, _plan_partitions(md, t)))
        except AdminError as e:
            res["error_code"], res["error_message"] = e.code, e.message

    if plans and not validate_only:
        async def work():
            for name, new in plans:
                try:
                    await asyncio.to_thread(broker.zk.add_partitions, name, new)
                except TopicNotFoundError:
                    _fail(results[name], Errors.UNKNOWN_TOPIC_OR_PARTITION, f"The topic '{name}' does not exist.")
                except StaleVersionError:
                    _fail(results[name], Errors.INVALID_PARTITIONS,
                          f"Topic {name} was changed concurrently; retry with its current partition count.")
                except (NotControllerError, ValueError) as e:
                    _fail(results[name], Errors.NOT_CONTROLLER if isinstance(e, NotControllerError)
                          else Errors.INVALID_PARTITIONS, str(e))
                else:
                    log.info("added partitions %d..%d to topic %s", min(new), max(new), name)
            await broker.refresh_metadata([name for name, _ in plans])

        if not await _run_bounded(work(), body.get("timeout_ms", 0)):
            for name, _ in plans:
                if results[name]["error_code"] == 0:
                    _fail(results[name], Errors.REQUEST_TIMED_OUT,
                          f"Timed out waiting for the new partitions of {name}.")
    return {"throttle_time_ms": 0, "results": [results[n] for n in order]}


def _plan_partitions(md, t) -> dict[int, list[int]]:
    name, count = t["name"], t["count"]
    info = md.topics.get(name)
    if info is None:
        raise AdminError(Errors.UNKNOWN_TOPIC_OR_PARTITION, f"The topic '{name}' does not exist.")
    current = len(info.partitions)
    if count == current:
        raise AdminError(Errors.INVALID_PARTITIONS, f"Topic already has {count} partitions.")
    if count < current:
        raise AdminError(Errors.INVALID_PARTITIONS,
                         f"The number of partitions for a topic can only be increased. Topic {name} currently "
                         f"has {current} partitions, {count} would not be an increase.")
    p0 = info.partitions.get(0)
    rf = len(p0.replicas) if p0 is not None and p0.replicas else 1
    live = set(md.brokers)
    adding = count - current
    manual = t.get("assignments")
    if manual is not None:
        if len(manual) != adding:
            raise AdminError(Errors.INVALID_REPLICA_ASSIGNMENT,
                             f"Increasing the number of partitions by {adding} but {len(manual)} "
                             f"assignments provided.")
        lists = [list(a["broker_ids"]) for a in manual]
        _check_manual_assignment(lists, live, rf, current)
        return {current + i: r for i, r in enumerate(lists)}
    # Continue Kafka's round-robin from where partition 0's leader sits, as its ZooKeeper admin does.
    ids = sorted(live)
    leader0 = p0.replicas[0] if p0 is not None and p0.replicas else None
    start = next((i for i, b in enumerate(ids) if leader0 is not None and b >= leader0), 0)
    return assign_replicas(ids, adding, rf, start_partition=current, start_index=start)
