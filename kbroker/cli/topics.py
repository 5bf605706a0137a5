"""``kbroker topics``: kafka-topics.sh's everyday surface, with its output lines.

Output follows Kafka's TopicCommand: ``Created topic t.``; ``--list`` one name per line (sorted,
internal topics included); ``--describe`` a topic line then one tab-led line per partition;
failures print ``Error while executing topic command : <message>`` on stdout, the exception on
stderr, and exit 1.
"""
from __future__ import annotations

import argparse
import asyncio
import re
import sys

from kbroker.cli.tool import add_command_config, command_security
from kbroker.client.admin import Admin, ConfigResource, NewTopic, uuid_str
from kbroker.client.connection import KafkaError
from kbroker.protocol.errors import Errors

# Java exception class and default message the Java admin client would raise for an error code
# (used when the broker sends no error_message).
_JAVA = {
    Errors.TOPIC_ALREADY_EXISTS: ("TopicExistsException", "Topic with this name already exists."),
    Errors.UNKNOWN_TOPIC_OR_PARTITION: ("UnknownTopicOrPartitionException",
                                        "This server does not host this topic-partition."),
    Errors.INVALID_PARTITIONS: ("InvalidPartitionsException", "Number of partitions is below 1."),
    Errors.INVALID_REPLICATION_FACTOR: ("InvalidReplicationFactorException",
                                        "Replication factor is below 1 or larger than the number of available brokers."),
    Errors.INVALID_REPLICA_ASSIGNMENT: ("InvalidReplicaAssignmentException", "Replica assignment is invalid."),
    Errors.INVALID_CONFIG: ("InvalidConfigurationException", "Configuration is invalid."),
    Errors.INVALID_TOPIC_EXCEPTION: ("InvalidTopicException",
                                     "The request attempted to perform an operation on an invalid topic."),
    Errors.TOPIC_DELETION_DISABLED: ("TopicDeletionDisabledException", "Topic deletion is disabled."),
    Errors.POLICY_VIOLATION: ("PolicyViolationException", "Request parameters do not satisfy the configured policy."),
    Errors.UNSUPPORTED_VERSION: ("UnsupportedVersionException", "The version of API is not supported."),
    Errors.INVALID_REQUEST: ("InvalidRequestException", "This most likely occurs because of a request being "
                             "malformed by the client library or the message was sent to an incompatible broker. "
                             "See the broker logs for more details."),
    Errors.NOT_CONTROLLER: ("NotControllerException", "This is not the correct controller for this cluster."),
    Errors.REQUEST_TIMED_OUT: ("TimeoutException", "The request timed out."),
    Errors.NETWORK_EXCEPTION: ("NetworkException", "The server disconnected before a response was received."),
    Errors.GROUP_ID_NOT_FOUND: ("GroupIdNotFoundException", "The group id does not exist."),
    Errors.NON_EMPTY_GROUP: ("GroupNotEmptyException", "The group is not empty."),
    Errors.GROUP_SUBSCRIBED_TO_TOPIC: ("GroupSubscribedToTopicException",
                                       "The consumer group is actively subscribed to the topic"),
    Errors.OFFSET_OUT_OF_RANGE: ("OffsetOutOfRangeException",
                                 "The requested offset is not within the range of offsets maintained by the server."),
    Errors.NOT_LEADER_OR_FOLLOWER: ("NotLeaderOrFollowerException",
                                    "For requests intended only for the leader, this error indicates that the broker "
                                    "is not the current leader. For requests intended for any replica, this error "
                                    "indicates that the broker is not a replica of the topic partition."),
}


class CommandError(Exception):
    """A failure the tool reports as Kafka's does (IllegalArgumentException and friends)."""

    def __init__(self, message: str, java_class: str = "java.lang.IllegalArgumentException"):
        super().__init__(message)
        self.java_class = java_class


def describe_error(e: BaseException) -> tuple[str, str]:
    """-> (message, exception class name) as the Java tool would show them."""
    if isinstance(e, CommandError):
        return str(e), e.java_class
    if isinstance(e, KafkaError):
        cls, default = _JAVA.get(e.error, (f"{e.name.title().replace('_', '')}Exception", e.name))
        return (e.message or default), f"org.apache.kafka.common.errors.{cls}"
    return str(e), type(e).__name__


def register(subparsers) -> None:
    p = subparsers.add_parser("topics", help="create, delete, describe, alter or list topics (kafka-topics.sh)",
                              description="This tool helps to create, delete, describe, or change a topic.")
    p.add_argument("--bootstrap-server", required=True, help="REQUIRED: The Kafka server to connect to.")
    add_command_config(p)
    action = p.add_mutually_exclusive_group(required=True)
    for name, text in (("create", "Create a new topic."), ("list", "List all available topics."),
                       ("describe", "List details for the given topics."), ("delete", "Delete a topic."),
                       ("alter", "Alter the number of partitions of a topic.")):
        action.add_argument(f"--{name}", action="store_true", help=text)
    p.add_argument("--topic", help="The topic to create, alter, describe or delete (a regular expression "
                                   "except with --create).")
    p.add_argument("--partitions", type=int, help="The number of partitions for the topic being created or altered.")
    p.add_argument("--replication-factor", type=int, help="The replication factor for each partition.")
    p.add_argument("--config", action="append", default=[], metavar="name=value",
                   help="A topic configuration override for the topic being created.")
    p.add_argument("--if-not-exists", action="store_true", help="With --create: do nothing if the topic exists.")
    p.add_argument("--if-exists", action="store_true",
                   help="With --alter/--delete/--describe: only act if the topic exists.")
    p.add_argument("--exclude-internal", action="store_true", help="Exclude internal topics when listing or describing.")
    p.add_argument("--under-replicated-partitions", action="store_true",
                   help="With --describe: only partitions whose ISR is smaller than their replica list.")
    p.add_argument("--unavailable-partitions", action="store_true",
                   help="With --describe: only partitions without a leader, or whose leader is not available.")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(run(args, sys.stdout))
    except (KafkaError, CommandError) as e:
        message, cls = describe_error(e)
        print(f"Error while executing topic command : {message}", flush=True)
        print(f"ERROR {cls}: {message} (kbroker.cli.topics)", file=sys.stderr)
        return 1


def _parse_configs(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        parts = re.split(r"\s*=\s*", item)
        if len(parts) != 2:
            raise CommandError('requirement failed: Invalid topic config: all configs to be added must be in '
                               'the format "key=val".')
        out[parts[0].strip()] = parts[1].strip()
    return out


def _matching(all_topics: list[str], pattern: str | None, exclude_internal: bool, internal: set[str]) -> list[str]:
    names = sorted(all_topics)
    if exclude_internal:
        names = [n for n in names if n not in internal]
    if pattern is None:
        return names
    try:
        rx = re.compile(pattern)
    except re.error:
        return [n for n in names if n == pattern]
    return [n for n in names if rx.fullmatch(n)]


async def run(args, out) -> int:
    async with Admin(args.bootstrap_server, client_id="kbroker-topics", security=command_security(args)) as admin:
        if args.create:
            return await _create(admin, args, out)
        names = await admin.list_topics(include_internal=True)
        internal = {n for n, t in admin.cluster.topics.items() if t.is_internal}
        topics = _matching(names, args.topic, args.exclude_internal, internal)
        if args.list:
            print("\n".join(topics), file=out)
            return 0
        if args.topic and not topics and not args.if_exists:
            raise CommandError(f"Topic '{args.topic}' does not exist as expected")
        if args.describe:
            await _describe(admin, topics, out, args.under_replicated_partitions, args.unavailable_partitions)
            await _warn_fenced(admin)
        elif args.delete:
            if topics:
                await admin.delete_topics(topics)
        elif args.alter:
            if args.partitions is None:
                raise CommandError("Missing required argument \"[partitions]\"")
            if topics:
                await admin.create_partitions({t: args.partitions for t in topics})
        return 0


async def _create(admin: Admin, args, out) -> int:
    if not args.topic:
        raise CommandError("Missing required argument \"[topic]\"")
    if args.replication_factor is not None and not 1 <= args.replication_factor <= 32767:
        raise CommandError("The replication factor must be between 1 and 32767 inclusive")
    if args.partitions is not None and args.partitions < 1:
        raise CommandError("The partitions must be greater than 0")
    configs = _parse_configs(args.config)
    if "." in args.topic or "_" in args.topic:
        print("WARNING: Due to limitations in metric names, topics with a period ('.') or underscore ('_') could "
              "collide. To avoid issues it is best to use either, but not both.", file=out)
    topic = NewTopic(args.topic, -1 if args.partitions is None else args.partitions,
                     -1 if args.replication_factor is None else args.replication_factor, configs)
    try:
        await admin.create_topics([topic])
    except KafkaError as e:
        if e.error == Errors.TOPIC_ALREADY_EXISTS and args.if_not_exists:
            return 0
        raise
    print(f"Created topic {args.topic}.", file=out)
    return 0


async def _warn_fenced(admin: Admin) -> None:
    """Name a bootstrap broker that fenced itself: its partitions show ``Leader: none`` above because it
    stepped down when its ZooKeeper session may have expired, not because no replica is alive."""
    try:
        fenced = await admin.self_fenced_brokers()
    except KafkaError:
        return          # the description above stands on its own
    for bid in sorted(fenced):
        print(f"WARNING: broker {bid} has fenced itself: it lost ZooKeeper for longer than its session "
              f"timeout and leads no partition until the controller's LeaderAndIsr says so.", file=sys.stderr)


async def _describe(admin: Admin, topics: list[str], out, under_replicated: bool = False,
                    unavailable: bool = False) -> None:
    """Kafka's describe: a topic line and its partition lines; with a partition filter
    (--under-replicated-partitions / --unavailable-partitions) only the matching partition lines."""
    if not topics:
        return
    filtered = under_replicated or unavailable
    descs = await admin.describe_topics(topics)
    resources = [ConfigResource.topic(t) for t in topics]
    configs = await admin.describe_configs(resources, raise_on_error=False)
    for name in topics:
        d = descs.get(name)
        if d is None or isinstance(d, KafkaError):
            continue
        entries = configs.get(ConfigResource.topic(name))
        if isinstance(entries, KafkaError):
            raise entries
        overrides = ",".join(f"{e.name}={e.value}" for e in entries.values() if not e.is_default)
        rf = len(d.partitions[0].replicas) if d.partitions else 0
        line = f"Topic: {name}"
        if any(d.topic_id):
            line += f"\tTopicId: {uuid_str(d.topic_id)}"
        line += f"\tPartitionCount: {len(d.partitions)}\tReplicationFactor: {rf}\tConfigs: {overrides}"
        if not filtered:
            print(line, file=out)
        live = set(admin.cluster.brokers)
        for p in d.partitions:
            if filtered and not ((under_replicated and len(p.isr) < len(p.replicas))
                                 or (unavailable and (p.leader < 0 or p.leader not in live))):
                continue
            leader = p.leader if p.leader >= 0 else "none"
            print(f"\tTopic: {name}\tPartition: {p.partition}\tLeader: {leader}"
                  f"\tReplicas: {','.join(map(str, p.replicas))}\tIsr: {','.join(map(str, p.isr))}"
                  f"\tElr: N/A\tLastKnownElr: N/A", file=out)
