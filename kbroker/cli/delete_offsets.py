"""``kbroker consumer-groups --delete-offsets --group g --topic t[:p,...]``: kafka-consumer-groups.sh's
offset deletion (OffsetDelete to the group's coordinator).

A topic without partitions means all of its partitions (from Metadata; an unknown one is reported with
partition "Not Provided"). Output as Kafka's ConsumerGroupCommand.deleteOffsets: on success
``Request succeed for deleting offsets with topic t group g``; on a top-level failure a message on
stderr; then a table (each row led by a line break, columns %-30s %-15s %-15s) of
TOPIC / PARTITION / STATUS, rows sorted by topic name followed by the partition number as text.
"""
from __future__ import annotations

import sys

from kbroker.cli.topics import describe_error
from kbroker.client.connection import KafkaError
from kbroker.protocol.errors import Errors

OFFSET_DELETE = 47

TOP_LEVEL_MESSAGES = {
    Errors.INVALID_GROUP_ID: "'{g}' is not valid.",
    Errors.GROUP_ID_NOT_FOUND: "'{g}' does not exist.",
    Errors.GROUP_AUTHORIZATION_FAILED: "Access to '{g}' is not authorized.",
    Errors.NON_EMPTY_GROUP: "Deleting offsets of a consumer group '{g}' is forbidden if the group is not empty.",
    Errors.GROUP_SUBSCRIBED_TO_TOPIC: "Encounter some partition level error, see the follow-up details:",
    Errors.TOPIC_AUTHORIZATION_FAILED: "Encounter some partition level error, see the follow-up details:",
    Errors.UNKNOWN_TOPIC_OR_PARTITION: "Encounter some partition level error, see the follow-up details:",
}
ROW = "\n{:<30} {:<15} {:<15}"


def _status(code: int) -> str:
    if not code:
        return "Successful"
    message, cls = describe_error(KafkaError(code))
    return f"Error: :{cls}: {message}"


async def delete_offsets(gc, group: str, topic_args: list[str], out, err=sys.stderr) -> int:
    results: dict[tuple[str, int], int] = {}
    partitions: list[tuple[str, int]] = []
    whole = [t for t in topic_args if ":" not in t]
    for t in topic_args:
        if ":" in t:
            name, parts = t.split(":", 1)
            partitions += [(name, int(p)) for p in parts.split(",") if p.strip()]
    if whole:
        await gc.cluster.fetch_metadata(whole, allow_auto_topic_creation=False)
        for name in whole:
            known = gc.cluster.partitions_for(name)
            if not known or gc.cluster.topics[name].error_code:
                results[(name, -1)] = Errors.UNKNOWN_TOPIC_OR_PARTITION
            else:
                partitions += [(name, p) for p in known]
    top = Errors.NONE
    if partitions:
        by_topic: dict[str, list] = {}
        for name, p in dict.fromkeys(partitions):
            by_topic.setdefault(name, []).append({"partition_index": p})
        body = {"group_id": group, "topics": [{"name": n, "partitions": ps} for n, ps in by_topic.items()]}
        _, resp = await gc.send_to_coordinator(group, OFFSET_DELETE, body)
        top = Errors(resp["error_code"])
        for t in resp["topics"]:
            for r in t["partitions"]:
                results[(t["name"], r["partition_index"])] = r["error_code"] or int(top)
        for tp in partitions:       # a top-level error answers no partition: each fails with it
            results.setdefault(tp, int(top))
        if top == Errors.NONE:
            top = next((Errors(c) for c in results.values() if c), Errors.NONE)
    if top == Errors.NONE:
        print(f"Request succeed for deleting offsets with topic {', '.join(topic_args)} group {group}", file=out)
    else:
        text = TOP_LEVEL_MESSAGES.get(top, "Encounter some unknown error: {name}").format(g=group, name=top.name)
        print(f"\nError: {text}", file=err)
    out.write(ROW.format("TOPIC", "PARTITION", "STATUS"))
    for (name, p), code in sorted(results.items(), key=lambda e: e[0][0] + str(e[0][1])):
        out.write(ROW.format(name, p if p >= 0 else "Not Provided", _status(code)))
    out.write("\n")
    return 0
