"""Topic administration: CreateTopics, DeleteTopics, CreatePartitions and Metadata's auto-creation.

As Kafka's ZooKeeper-mode admin: the handlers validate against the metadata cache and write only the
request into ZooKeeper (a topic's assignment and config, a deletion mark) on a worker thread; the
controller reacts (partition states, leaders, StopReplica) and tells every broker through
UpdateMetadata. A handler answers when this broker's cache shows the outcome (a leader for every new
partition, the deleted topic gone) or at ``timeout_ms`` with REQUEST_TIMED_OUT. CreateTopics,
CreatePartitions and DeleteTopics are served by the controller's broker (others: NOT_CONTROLLER);
auto-creation by any broker. Error codes and messages follow Kafka 3.9 in ZooKeeper mode.
"""
from __future__ import annotations

import asyncio
import logging

from ...config import ConfigError, TOPIC_CONFIGS, parse_topic_config
from ...network.connection import EncodeOffLoop
from ...controller.assignment import AssignmentError as AdminError
from ...controller.assignment import assign_replicas, check_manual_assignment
from ...protocol.errors import Errors
from ...zk.client import StaleVersionError, TopicExistsError, TopicNotFoundError
from ..metadata import topic_name_error
from . import authz
from .quotas import THROTTLED_MESSAGE, mutation_answer, mutation_quota
from ...topics import GROUP_METADATA_TOPIC, INTERNAL_TOPICS, TRANSACTION_STATE_TOPIC

log = logging.getLogger(__name__)


# ---- shared helpers ------------------------------------------------------------------------------

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
    return broker.controller is not None and broker.controller.active


async def _live_brokers(broker) -> dict[int, str | None]:
    """{broker id: rack} of the registered brokers, read from ZooKeeper (placement must not
    depend on how fresh this broker's cache is)."""
    regs = await asyncio.to_thread(broker.zk.get_live_brokers)
    return {bid: reg.rack for bid, (reg, _) in regs.items()}


def _has_leaders(broker, name: str, partitions) -> bool:
    info = broker.metadata.topics.get(name)
    return info is not None and all(p in info.partitions and info.partitions[p].leader >= 0 for p in partitions)


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

AUTO_CREATE_WAIT_S = 10.0


async def auto_create_topics(broker, names) -> list[str]:
    """Create the missing, validly named topics with the broker defaults; return those that have a
    leader for every partition in this broker's cache when we answer (others are reported
    LEADER_NOT_AVAILABLE and the client retries, as with Kafka).

    A topic someone else created meanwhile counts as existing, not as created. A replication factor
    larger than the live brokers leaves the topic uncreated."""
    live = None
    created = {}
    for name in dict.fromkeys(names):
        if name in broker.metadata.topics or topic_name_error(name) is not None:
            continue
        if _collides(name, broker.metadata.topics):
            continue
        spec = internal_topic_spec(broker, name)
        if spec is None:
            spec = (broker.config.get("num.partitions"), broker.config.get("default.replication.factor"), {})
        partitions, rf, configs = spec
        if live is None:
            live = await _live_brokers(broker)
        try:
            assignment = assign_replicas(live, partitions, rf, racks=live)
        except AdminError as e:
            log.warning("not auto-creating topic %s: %s", name, e.message)
            continue
        try:
            await asyncio.to_thread(broker.zk.create_topic, name, assignment, configs)
        except TopicExistsError:
            continue
        log.info("auto-created topic %s with %d partitions, replication factor %d", name, partitions, rf)
        created[name] = list(assignment)
    if created:
        await broker.metadata.wait_for(lambda: all(_has_leaders(broker, n, ps) for n, ps in created.items()),
                                       AUTO_CREATE_WAIT_S)
    return [n for n, ps in created.items() if _has_leaders(broker, n, ps)]


# ---- CreateTopics (19) ---------------------------------------------------------------------------

# CreateTopics validates and plans this many topics per event-loop turn (each checks its name, configs
# and replica assignment).
TOPICS_PER_TURN = 500


async def create_topics(broker, conn, header, body):
    validate_only = bool(body.get("validate_only", False))
    md = broker.metadata
    results: dict[str, dict] = {}
    order: list[str] = []
    counts: dict[str, int] = {}
    for t in body["topics"]:
        counts[t["name"]] = counts.get(t["name"], 0) + 1

    to_create = []   # (name, assignment, configs)
    live = await _live_brokers(broker) if _is_controller(broker) else {}
    for i, t in enumerate(body["topics"]):
        if i and i % TOPICS_PER_TURN == 0:
            await asyncio.sleep(0)      # a request naming 100,000 topics must not hold the loop
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
            if not authz.may_create_topic(broker, conn, name):
                raise AdminError(Errors.TOPIC_AUTHORIZATION_FAILED, "Authorization failed.")
            to_create.append((name, *_plan_topic(broker, md, t, live)))
        except AdminError as e:
            res["error_code"], res["error_message"] = e.code, e.message

    quota = mutation_quota(broker, conn, header) if to_create and not validate_only else None
    if quota is not None:
        to_create = _admitted(quota, to_create, results, lambda plan: len(plan[1]))
    if to_create and not validate_only:
        done: set[str] = set()

        async def work():
            written = {}
            for name, assignment, configs in to_create:
                try:
                    await asyncio.to_thread(broker.zk.create_topic, name, assignment, configs)
                except TopicExistsError:
                    _fail(results[name], Errors.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.")
                except Exception as e:   # a ZooKeeper failure must not lose the other topics' answers
                    log.exception("creating topic %s failed", name)
                    _fail(results[name], Errors.UNKNOWN_SERVER_ERROR, f"Creating topic {name} failed: {e}")
                else:
                    log.info("created topic %s with %d partitions, replication factor %d", name,
                             len(assignment), len(assignment[0]))
                    written[name] = list(assignment)
                done.add(name)
            # The controller elects the leaders and tells us through UpdateMetadata.
            await broker.metadata.wait_for(
                lambda: all(_has_leaders(broker, n, ps) for n, ps in written.items()), None)

        if not await _run_bounded(work(), body.get("timeout_ms", 60000)):
            for name, _, _ in to_create:
                res = results[name]
                if res["error_code"] == 0:
                    _fail(res, Errors.REQUEST_TIMED_OUT,
                          f"Timed out waiting for topic {name} to be created "
                          f"({'waiting for its leaders' if name in done else 'not yet written'}).")
    if header.api_version >= 5:
        _describe_created(broker, results, to_create)
    # error_message only exists from v1; the encoder leaves out fields the version lacks.
    answer = mutation_answer(conn, quota, {"throttle_time_ms": 0, "topics": [results[n] for n in order]})
    return EncodeOffLoop(answer) if len(order) > TOPICS_PER_TURN else answer


def _describe_created(broker, results: dict, planned) -> None:
    """CreateTopics v5+: a topic created (or validated) without error is answered with its partition
    count, replication factor and every config (v7+ also its id, zero while validating only)."""
    from .configs import topic_config_entries
    for name, assignment, overrides in planned:
        res = results[name]
        if res["error_code"]:
            continue
        info = broker.metadata.topics.get(name)
        res["topic_id"] = info.topic_id if info is not None else bytes(16)
        res["num_partitions"] = len(assignment)
        res["replication_factor"] = len(assignment[0]) if assignment else -1
        res["configs"] = [{"name": e["name"], "value": e["value"], "read_only": e["read_only"],
                           "config_source": e["config_source"], "is_sensitive": e["is_sensitive"]}
                          for e in topic_config_entries(broker, overrides)]


def _fail(res: dict, code: int, message: str) -> None:
    res["error_code"], res["error_message"] = int(code), message


def _admitted(quota, plans: list, results: dict, partitions) -> list:
    """The ``plans`` (name first) the controller mutation quota admits, in order; the others answered
    THROTTLING_QUOTA_EXCEEDED."""
    out = []
    for plan in plans:
        if quota.admit(partitions(plan)):
            out.append(plan)
        else:
            _fail(results[plan[0]], Errors.THROTTLING_QUOTA_EXCEEDED, THROTTLED_MESSAGE)
    return out


# ZooKeeper refuses a znode larger than jute.maxbuffer (1 MiB by default), and the whole assignment
# lives in /brokers/topics/<t>: a partition count that cannot fit is refused before anything is built
# (planning the assignment of a huge count would itself take gigabytes).
ZNODE_LIMIT_BYTES = 0xFFFFF


def _check_fits_znode(n_partitions: int, rf: int, live) -> None:
    widest_id = max((len(str(b)) for b in live), default=1)
    estimate = n_partitions * (len(str(max(n_partitions, 1))) + 5 + max(rf, 1) * (widest_id + 1))
    if estimate > ZNODE_LIMIT_BYTES:
        raise AdminError(Errors.INVALID_PARTITIONS,
                         f"{n_partitions} partitions with replication factor {rf} do not fit in the topic's "
                         f"ZooKeeper znode (about {estimate} bytes, limit {ZNODE_LIMIT_BYTES}).")


def _plan_topic(broker, md, t, live: dict[int, str | None]) -> tuple[dict[int, list[int]], dict[str, str]]:
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
        check_manual_assignment(lists, set(live), None, 0)
        return dict(enumerate(lists)), configs
    if n_parts == -1:
        n_parts = broker.config.get("num.partitions")
    if rf == -1:
        rf = broker.config.get("default.replication.factor")
    _check_fits_znode(n_parts, rf, live)
    return assign_replicas(live, n_parts, rf, racks=live), configs


# ---- DeleteTopics (20) ---------------------------------------------------------------------------

def _deletion_targets(broker, version, body) -> tuple[list[str], dict[str, dict]]:
    """-> (topic names, answers already decided): v6+ names a topic by name or by id (UNKNOWN_TOPIC_ID
    for an id we do not know; both at once is INVALID_REQUEST, as Kafka)."""
    if version < 6:
        return list(body.get("topic_names") or []), {}
    names, decided = [], {}
    for t in body["topics"]:
        name, tid = t["name"], bytes(t["topic_id"])
        if name is not None and any(tid):
            decided[f"id:{tid.hex()}:{name}"] = {"name": name, "topic_id": tid, "error_code": Errors.INVALID_REQUEST,
                                                 "error_message": "You may not specify both topic name and topic id."}
        elif name is None:
            known = broker.metadata.topic_ids.get(tid)
            if known is None:
                decided[f"id:{tid.hex()}"] = {"name": None, "topic_id": tid, "error_code": Errors.UNKNOWN_TOPIC_ID,
                                              "error_message": "This server does not host this topic ID."}
            else:
                names.append(known)
        else:
            names.append(name)
    return names, decided


async def delete_topics(broker, conn, header, body):
    version = header.api_version
    names, decided = _deletion_targets(broker, version, body)
    responses = dict(decided)
    order = list(decided)
    to_delete = []
    enabled = broker.config.get("delete.topic.enable")
    for name in names:
        if name in responses:
            continue
        order.append(name)
        info = broker.metadata.topics.get(name)
        res = responses[name] = {"name": name, "error_code": 0,
                                 "topic_id": info.topic_id if info is not None else bytes(16)}
        if not enabled:
            # Kafka: INVALID_REQUEST before v3, which has no dedicated code for it.
            res["error_code"] = Errors.TOPIC_DELETION_DISABLED if version >= 3 else Errors.INVALID_REQUEST
        elif names.count(name) > 1:
            res["error_code"] = Errors.INVALID_REQUEST
        elif not authz.allowed(broker, conn, authz.DELETE, authz.TOPIC, name):
            res["error_code"] = Errors.TOPIC_AUTHORIZATION_FAILED
        elif name not in broker.metadata.topics:
            res["error_code"] = Errors.UNKNOWN_TOPIC_OR_PARTITION
        elif name in INTERNAL_TOPICS:
            # Deleting __consumer_offsets would drop every group's committed offsets.
            res["error_code"] = Errors.INVALID_TOPIC_EXCEPTION
        elif not _is_controller(broker):
            res["error_code"] = Errors.NOT_CONTROLLER
        else:
            to_delete.append(name)
    quota = mutation_quota(broker, conn, header) if to_delete else None
    if quota is not None:
        to_delete = [p[0] for p in _admitted(quota, [(n,) for n in to_delete], responses,
                                             lambda p: len(broker.metadata.topics[p[0]].partitions))]

    if to_delete:
        async def work():
            marked = []
            for name in to_delete:
                try:
                    await asyncio.to_thread(broker.zk.mark_topic_for_deletion, name)
                except Exception:
                    log.exception("marking topic %s for deletion failed", name)
                    responses[name]["error_code"] = Errors.UNKNOWN_SERVER_ERROR
                    continue
                marked.append(name)
            # The controller stops the replicas, removes the znodes, then tells every broker.
            await broker.metadata.wait_for(lambda: not any(n in broker.metadata.topics for n in marked), None)
            for name in marked:
                log.info("deleted topic %s", name)

        if not await _run_bounded(work(), body.get("timeout_ms", 0)):
            for name in to_delete:
                if responses[name]["error_code"] == 0:
                    responses[name]["error_code"] = Errors.REQUEST_TIMED_OUT
    return mutation_answer(conn, quota, {"throttle_time_ms": 0, "responses": [responses[n] for n in order]})


# ---- CreatePartitions (37) -----------------------------------------------------------------------

async def create_partitions(broker, conn, header, body):
    validate_only = bool(body.get("validate_only", False))
    md = broker.metadata
    names = [t["name"] for t in body["topics"]]
    results = {}
    order = []
    plans = []    # (name, new assignment)
    live = await _live_brokers(broker) if _is_controller(broker) else {}
    for t in body["topics"]:
        name = t["name"]
        if name in results:
            continue
        order.append(name)
        res = results[name] = {"name": name, "error_code": 0, "error_message": None}
        try:
            if names.count(name) > 1:
                raise AdminError(Errors.INVALID_REQUEST, "Duplicate topic in request.")
            if not authz.allowed(broker, conn, authz.ALTER, authz.TOPIC, name):
                raise AdminError(Errors.TOPIC_AUTHORIZATION_FAILED, "The topic authorization is failed.")
            if not _is_controller(broker):
                raise AdminError(Errors.NOT_CONTROLLER, "This is not the correct controller for this cluster.")
            plans.append((name, _plan_partitions(md, t, live)))
        except AdminError as e:
            res["error_code"], res["error_message"] = e.code, e.message

    quota = mutation_quota(broker, conn, header) if plans and not validate_only else None
    if quota is not None:
        plans = _admitted(quota, plans, results, lambda plan: len(plan[1]))
    if plans and not validate_only:

        async def work():
            written = {}
            for name, new in plans:
                try:
                    await asyncio.to_thread(broker.zk.add_partitions, name, new)
                except TopicNotFoundError:
                    _fail(results[name], Errors.UNKNOWN_TOPIC_OR_PARTITION, f"The topic '{name}' does not exist.")
                except StaleVersionError:
                    _fail(results[name], Errors.INVALID_PARTITIONS,
                          f"Topic {name} was changed concurrently; retry with its current partition count.")
                except ValueError as e:
                    _fail(results[name], Errors.INVALID_PARTITIONS, str(e))
                else:
                    log.info("added partitions %d..%d to topic %s", min(new), max(new), name)
                    written[name] = list(new)
            await broker.metadata.wait_for(
                lambda: all(_has_leaders(broker, n, ps) for n, ps in written.items()), None)

        if not await _run_bounded(work(), body.get("timeout_ms", 0)):
            for name, _ in plans:
                if results[name]["error_code"] == 0:
                    _fail(results[name], Errors.REQUEST_TIMED_OUT,
                          f"Timed out waiting for the new partitions of {name}.")
    return mutation_answer(conn, quota, {"throttle_time_ms": 0, "results": [results[n] for n in order]})


def _plan_partitions(md, t, live: dict[int, str | None]) -> dict[int, list[int]]:
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
    _check_fits_znode(count, rf, live)
    adding = count - current
    manual = t.get("assignments")
    if manual is not None:
        if len(manual) != adding:
            raise AdminError(Errors.INVALID_REPLICA_ASSIGNMENT,
                             f"Increasing the number of partitions by {adding} but {len(manual)} "
                             f"assignments provided.")
        lists = [list(a["broker_ids"]) for a in manual]
        check_manual_assignment(lists, set(live), rf, current)
        return {current + i: r for i, r in enumerate(lists)}
    # Continue Kafka's round-robin from where partition 0's leader sits, as its ZooKeeper admin does.
    ids = sorted(live)
    leader0 = p0.replicas[0] if p0 is not None and p0.replicas else None
    start = next((i for i, b in enumerate(ids) if leader0 is not None and b >= leader0), 0)
    return assign_replicas(ids, adding, rf, start_partition=current, start_index=start, racks=live)


# ---- ElectLeaders (43) -----------------------------------------------------------------------------

def _elect_refused(header, parts):
    """Alter on the cluster missing: CLUSTER_AUTHORIZATION_FAILED (v1+ at the top, v0 per partition)."""
    code = Errors.CLUSTER_AUTHORIZATION_FAILED
    if header.api_version >= 1:
        return {"throttle_time_ms": 0, "error_code": code, "replica_election_results": []}
    by_topic: dict[str, list] = {}
    for t, p in parts or ():
        by_topic.setdefault(t, []).append({"partition_id": p, "error_code": code, "error_message": None})
    return {"throttle_time_ms": 0, "error_code": 0,
            "replica_election_results": [{"topic": t, "partition_result": r} for t, r in by_topic.items()]}


async def elect_leaders(broker, conn, header, body):
    """Preferred (type 0) or unclean (type 1) leader election, served by the controller."""
    unclean = body.get("election_type", 0) == 1
    requested = body.get("topic_partitions")
    parts = None if requested is None else [(t["topic"], p) for t in requested for p in t["partitions"]]
    if not authz.cluster(broker, conn, authz.ALTER):
        return _elect_refused(header, parts)
    results = None
    if _is_controller(broker):
        task = asyncio.ensure_future(broker.controller.elect_leaders(parts, unclean))
        done, _ = await asyncio.wait({task}, timeout=_timeout_s(body.get("timeout_ms", 60000)))
        if task in done:
            results = task.result()
        else:
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            results = {tp: (Errors.REQUEST_TIMED_OUT, "Timed out waiting for the election.")
                       for tp in parts or ()}
    if results is None:   # not (or no longer) the controller
        if header.api_version >= 1:
            return {"throttle_time_ms": 0, "error_code": Errors.NOT_CONTROLLER, "replica_election_results": []}
        results = {tp: (Errors.NOT_CONTROLLER, "This is not the correct controller for this cluster.")
                   for tp in parts or ()}
    by_topic: dict[str, list] = {}
    for (t, p), (code, message) in sorted(results.items()):
        by_topic.setdefault(t, []).append({"partition_id": p, "error_code": code, "error_message": message})
    return {"throttle_time_ms": 0, "error_code": 0,
            "replica_election_results": [{"topic": t, "partition_result": r} for t, r in by_topic.items()]}
