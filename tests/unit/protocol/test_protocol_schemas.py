"""Oracle test: our schema definitions (kbroker.protocol.messages) against Kafka's JSON definitions.

The JSON comes from the kafka-python package installed in the venv (it ships Kafka's message JSON
files as package data), loaded at test time. kafka-python carries newer Kafka schemas than 3.9, so:

* our valid range must be Kafka 3.9's (table below, from the facts sheet / apache/kafka 3.9.0);
* field trees are compared for every version in our range that the installed JSON also covers
  (newer Kafka removed some old versions from its files, e.g. Produce 0-2, Fetch 0-3);
* the ZK inter-broker APIs (4-7) are not in kafka-python. Running this file as a script,
  ``python tests/test_protocol_schemas.py DIR`` with DIR a copy of Kafka 3.9's
  ``clients/src/main/resources/common/message`` JSON files, runs the same check over every version of
  every API against 3.9 itself (a developer check: those files are not in this repository).
"""
from __future__ import annotations

import copy
import importlib.resources
import json
import pathlib
import re

import pytest

from kbroker.protocol import messages
from kbroker.protocol.schema import MAX_VERSION, NULL, Field, Schema, Struct, parse_versions

# Kafka 3.9 valid versions (and first flexible version) of every API we define.
AK39 = {
    0: ("Produce", (0, 11), 9), 1: ("Fetch", (0, 17), 12), 2: ("ListOffsets", (0, 9), 6),
    3: ("Metadata", (0, 12), 9), 4: ("LeaderAndIsr", (0, 7), 4), 5: ("StopReplica", (0, 4), 2),
    6: ("UpdateMetadata", (0, 8), 6), 7: ("ControlledShutdown", (0, 3), 3),
    8: ("OffsetCommit", (0, 9), 8), 9: ("OffsetFetch", (0, 9), 6), 10: ("FindCoordinator", (0, 6), 3),
    11: ("JoinGroup", (0, 9), 6), 12: ("Heartbeat", (0, 4), 4), 13: ("LeaveGroup", (0, 5), 4),
    14: ("SyncGroup", (0, 5), 4), 15: ("DescribeGroups", (0, 5), 5), 16: ("ListGroups", (0, 5), 3),
    17: ("SaslHandshake", (0, 1), None), 18: ("ApiVersions", (0, 4), 3), 19: ("CreateTopics", (0, 7), 5),
    20: ("DeleteTopics", (0, 6), 4), 21: ("DeleteRecords", (0, 2), 2), 22: ("InitProducerId", (0, 5), 2),
    23: ("OffsetForLeaderEpoch", (0, 4), 4), 24: ("AddPartitionsToTxn", (0, 4), 3),
    25: ("AddOffsetsToTxn", (0, 3), 3), 26: ("EndTxn", (0, 3), 3), 27: ("WriteTxnMarkers", (0, 1), 1),
    28: ("TxnOffsetCommit", (0, 3), 3), 29: ("DescribeAcls", (0, 3), 2), 30: ("CreateAcls", (0, 3), 2),
    31: ("DeleteAcls", (0, 3), 2), 32: ("DescribeConfigs", (0, 4), 4),
    33: ("AlterConfigs", (0, 2), 2), 34: ("AlterReplicaLogDirs", (0, 2), 2), 35: ("DescribeLogDirs", (0, 4), 2), 36: ("SaslAuthenticate", (0, 2), 2),
    37: ("CreatePartitions", (0, 3), 2), 42: ("DeleteGroups", (0, 2), 2), 43: ("ElectLeaders", (0, 2), 2),
    44: ("IncrementalAlterConfigs", (0, 1), 1), 45: ("AlterPartitionReassignments", (0, 0), 0),
    46: ("ListPartitionReassignments", (0, 0), 0), 47: ("OffsetDelete", (0, 0), None),
    48: ("DescribeClientQuotas", (0, 1), 1), 49: ("AlterClientQuotas", (0, 1), 1),
    50: ("DescribeUserScramCredentials", (0, 0), 0), 51: ("AlterUserScramCredentials", (0, 0), 0),
    60: ("DescribeCluster", (0, 1), 0), 61: ("DescribeProducers", (0, 0), 0),
    65: ("DescribeTransactions", (0, 0), 0),
    66: ("ListTransactions", (0, 1), 0),
}

# Deliberate differences from the 3.9 valid range.
RANGE_EXCEPTIONS = {
    7: (1, 3),   # ControlledShutdown v0 has a request header without client_id
    60: (0, 2),  # DescribeCluster v2 (Kafka 4.0, KIP-1073): a broker that fenced itself says so
}

# Deliberate differences from the JSON defaults: (message name, field path) -> our default.
DEFAULT_EXCEPTIONS = {("ListOffsetsRequest", "replica_id"): -1}

ZK_ONLY = {4, 5, 6, 7}  # not shipped with kafka-python


def snake(name: str) -> str:
    """Kafka JSON field name -> our dict key: PartitionIndex -> partition_index, IsrNodes -> isr_nodes,
    isKRaftController -> is_k_raft_controller, V0Host -> v0_host."""
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    name = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return name.lower()


def strip_comments(text: str) -> str:
    return re.sub(r"(?m)^\s*//.*$", "", text)


def kp_json(msg_name: str) -> dict | None:
    res = importlib.resources.files("kafka.protocol.schemas.resources").joinpath(msg_name + ".json")
    if not res.is_file():
        return None
    return json.loads(strip_comments(res.read_text()))


def resolve_common_structs(doc: dict) -> dict:
    common = {s["name"]: s["fields"] for s in doc.get("commonStructs", [])}

    def walk(fields):
        for f in fields:
            t = f["type"]
            inner = t[2:] if t.startswith("[]") else t
            if "fields" not in f and inner in common:
                f["fields"] = copy.deepcopy(common[inner])
            if "fields" in f:
                walk(f["fields"])
    walk(doc["fields"])
    return doc


def _in(rng, v):
    return rng is not None and rng[0] <= v <= rng[1]


def json_versions(spec):
    if spec is None or spec == "none":
        return None
    return parse_versions(spec)


def json_default(f: dict):
    """-> (has_explicit_default, value) in our representation."""
    d = f.get("default")
    if d is None or d == "":
        return False, None
    if d == "null":
        return True, None
    t = f["type"]
    if t in ("int8", "int16", "int32", "int64", "uint16", "uint32"):
        if isinstance(d, str) and d.lower().startswith("0x"):
            return True, int(d, 16)
        return True, int(d)
    if t == "bool":
        return True, d if isinstance(d, bool) else d == "true"
    if t == "float64":
        return True, float(d)
    return True, d


def _type_zero(t):
    return {"bool": False, "string": "", "float64": 0.0}.get(t, 0)


def compare_fields(ours: list[Field], theirs: list[dict], version: int, path: str, msg: str,
                   errors: list[str]) -> None:
    """Compare one struct level at one version; appends human-readable mismatches to errors."""
    def ours_present(f):
        return _in(f.versions, version) and not (f.tag is not None and _in(f.tagged, version))

    def ours_tagged(f):
        return f.tag is not None and _in(f.tagged, version)

    def theirs_tagged(j):
        return "tag" in j and _in(json_versions(j.get("taggedVersions")), version)

    def theirs_present(j):
        return _in(json_versions(j["versions"]), version) and not theirs_tagged(j)

    o_plain = [f for f in ours if ours_present(f)]
    t_plain = [j for j in theirs if theirs_present(j)]
    o_names = [f.name for f in o_plain]
    t_names = [snake(j["name"]) for j in t_plain]
    if o_names != t_names:
        errors.append(f"{msg} v{version} {path}: fields {o_names} != JSON {t_names}")
    o_tags = {f.tag: f for f in ours if ours_tagged(f)}
    t_tags = {j["tag"]: j for j in theirs if theirs_tagged(j)}
    if {k: f.name for k, f in o_tags.items()} != {k: snake(j["name"]) for k, j in t_tags.items()}:
        errors.append(f"{msg} v{version} {path}: tagged fields "
                      f"{ {k: f.name for k, f in o_tags.items()} } != JSON "
                      f"{ {k: snake(j['name']) for k, j in t_tags.items()} }")
    # Every field we define must exist in the JSON with the same version ranges, as far as this
    # version can tell (a field absent here must be absent in the JSON too).
    by_name = {snake(j["name"]): j for j in theirs}
    for f in ours:
        if f.name not in by_name:
            if _in(f.versions, version):
                errors.append(f"{msg} v{version} {path}.{f.name}: not in the JSON")
            continue
        j = by_name[f.name]
        if _in(f.versions, version) != _in(json_versions(j["versions"]), version):
            errors.append(f"{msg} v{version} {path}.{f.name}: presence differs")
            continue
        if not _in(f.versions, version):
            continue
        if ours_tagged(f) != theirs_tagged(j) or (ours_tagged(f) and f.tag != j["tag"]):
            errors.append(f"{msg} v{version} {path}.{f.name}: tag {f.tag if ours_tagged(f) else None} "
                          f"!= JSON {j.get('tag') if theirs_tagged(j) else None}")
        if _in(f.nullable, version) != _in(json_versions(j.get("nullableVersions")), version):
            errors.append(f"{msg} v{version} {path}.{f.name}: nullable {_in(f.nullable, version)} "
                          f"!= JSON {_in(json_versions(j.get('nullableVersions')), version)}")
        jt = j["type"]
        sub = f"{path}.{f.name}"
        if "fields" in j:
            if jt.startswith("[]"):
                if not isinstance(f.type, list):
                    errors.append(f"{msg} v{version} {sub}: type {f.type!r} != JSON struct array {jt}")
                    continue
                compare_fields(f.type, j["fields"], version, sub + "[]", msg, errors)
            else:
                if not isinstance(f.type, Struct):
                    errors.append(f"{msg} v{version} {sub}: type {f.type!r} != JSON struct {jt}")
                    continue
                compare_fields(f.type.fields, j["fields"], version, sub, msg, errors)
            continue
        if f.type != jt:
            errors.append(f"{msg} v{version} {sub}: type {f.type!r} != JSON {jt}")
            continue
        has, want = json_default(j)
        key = (msg, sub.lstrip("."))
        if key in DEFAULT_EXCEPTIONS:
            want, has = DEFAULT_EXCEPTIONS[key], True
        if has and want is None and f.default is not NULL:
            errors.append(f"{msg} v{version} {sub}: JSON default null, ours {f.default!r} (want NULL)")
        elif has:
            got = f.default_value(version)
            if got != want:
                errors.append(f"{msg} v{version} {sub}: default {got!r} != JSON {want!r}")
        elif f.default is not None and f.default != _type_zero(jt):
            errors.append(f"{msg} v{version} {sub}: default {f.default!r} but the JSON has none")


def check_schema(schema: Schema, doc: dict, versions) -> list[str]:
    """All mismatches between one of our schemas and one JSON message, over the given versions."""
    errors = []
    jflex = json_versions(doc["flexibleVersions"])
    if jflex is not None:
        jflex = (jflex[0], MAX_VERSION)
    if schema.flexible != jflex:
        errors.append(f"{schema.name}: flexible {schema.flexible} != JSON {doc['flexibleVersions']}")
    jvalid = json_versions(doc["validVersions"])
    for v in versions:
        if not _in(jvalid, v):
            continue
        compare_fields(schema.fields, doc["fields"], v, "", schema.name, errors)
    return errors


def _all_versions(schema):
    return range(schema.valid[0], schema.valid[1] + 1)


def _schemas():
    for key in sorted(messages.REQUESTS):
        yield key, messages.REQUESTS[key]
        yield key, messages.RESPONSES[key]


# ---- the checks ----------------------------------------------------------------------------------

def test_every_brief_api_is_defined_with_the_39_ranges():
    assert set(messages.REQUESTS) == set(AK39) == set(messages.RESPONSES)
    for key, (name, valid, flex) in AK39.items():
        assert messages.API_NAMES[key] == name
        want = RANGE_EXCEPTIONS.get(key, valid)
        for s in (messages.REQUESTS[key], messages.RESPONSES[key]):
            assert s.valid == want, (name, s.valid)
            assert s.flexible == (None if flex is None else (flex, MAX_VERSION)), (name, s.flexible)


@pytest.mark.parametrize("key,schema", [(k, s) for k, s in _schemas() if k not in ZK_ONLY],
                         ids=lambda x: x.name if isinstance(x, Schema) else str(x))
def test_schema_matches_kafka_python_json(key, schema):
    doc = kp_json(schema.name)
    assert doc is not None, f"{schema.name}.json missing from kafka-python"
    assert doc["apiKey"] == key
    resolve_common_structs(doc)
    # the versions the installed JSON can speak for must cover most of our range
    jvalid = json_versions(doc["validVersions"])
    covered = [v for v in _all_versions(schema) if _in(jvalid, v)]
    assert covered, f"{schema.name}: no overlap with the installed JSON"
    assert check_schema(schema, doc, _all_versions(schema)) == []


# ---- the checker itself must be able to fail -----------------------------------------------------

def _altered(schema: Schema, mutate) -> Schema:
    fields = copy.deepcopy(schema.fields)
    mutate(fields)
    return Schema(schema.name, schema.valid, schema.flexible, fields)


def _find(fields, name):
    return next(f for f in fields if f.name == name)


def _fetch_partitions(fields):
    return _find(_find(fields, "responses").type, "partitions").type


MUTATIONS = {
    "renamed": lambda fs: setattr(_find(fs, "throttle_time_ms"), "name", "throttle_ms"),
    "wrong_type": lambda fs: setattr(_find(fs, "error_code"), "type", "int32"),
    "wrong_versions": lambda fs: setattr(_find(fs, "error_code"), "versions", (6, MAX_VERSION)),
    "not_nullable": lambda fs: setattr(_find(_fetch_partitions(fs), "aborted_transactions"),
                                       "nullable", None),
    "wrong_tag": lambda fs: setattr(_find(_fetch_partitions(fs), "current_leader"), "tag", 5),
    "untagged": lambda fs: setattr(_find(_fetch_partitions(fs), "snapshot_id"), "tag", None),
    "wrong_default": lambda fs: setattr(_find(_fetch_partitions(fs), "last_stable_offset"),
                                        "default", None),
    "lost_null_default": lambda fs: setattr(_find(_find(fs, "node_endpoints").type, "rack"), "default", None),
    "reordered": lambda fs: fs.reverse(),
    "dropped": lambda fs: fs.pop(),
    "nested_type": lambda fs: setattr(_find(_fetch_partitions(fs), "records"), "type", "bytes"),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_checker_catches_an_altered_schema(mutation):
    schema = messages.RESPONSES[1]  # Fetch response: nested arrays, tagged structs, nullables
    doc = resolve_common_structs(kp_json("FetchResponse"))
    assert check_schema(schema, doc, _all_versions(schema)) == []
    broken = _altered(schema, MUTATIONS[mutation])
    assert check_schema(broken, doc, _all_versions(broken)) != []


def test_checker_catches_a_wrong_flexible_threshold():
    schema = messages.REQUESTS[3]
    doc = kp_json("MetadataRequest")
    broken = Schema(schema.name, schema.valid, "8+", schema.fields)
    assert any("flexible" in e for e in check_schema(broken, doc, _all_versions(broken)))


def test_snake_case():
    assert snake("PartitionIndex") == "partition_index"
    assert snake("TopicId") == "topic_id"
    assert snake("IsrNodes") == "isr_nodes"
    assert snake("ThrottleTimeMs") == "throttle_time_ms"
    assert snake("isKRaftController") == "is_k_raft_controller"
    assert snake("V0Host") == "v0_host"


def check_against_kafka_39(json_dir) -> list[str]:
    """Every version of every API we define against Kafka 3.9's own JSON files; -> problems."""
    problems = []
    for key, schema in _schemas():
        doc = json.loads(strip_comments((pathlib.Path(json_dir) / (schema.name + ".json")).read_text()))
        resolve_common_structs(doc)
        if doc["apiKey"] != key:
            problems.append(f"{schema.name}: apiKey {doc['apiKey']} != {key}")
        if schema.valid != RANGE_EXCEPTIONS.get(key, json_versions(doc["validVersions"])):
            problems.append(f"{schema.name}: valid versions {schema.valid} != {doc['validVersions']}")
        problems += [f"{schema.name}: {p}" for p in check_schema(schema, doc, _all_versions(schema))]
    return problems


if __name__ == "__main__":
    import sys

    found = check_against_kafka_39(sys.argv[1])
    print("\n".join(found) or f"all {len(list(_schemas()))} schemas match Kafka 3.9")
    sys.exit(1 if found else 0)
