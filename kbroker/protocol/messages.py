"""Our compact definitions of Kafka's request and response schemas.

Each definition mirrors the structure of the corresponding message in Kafka's
``clients/src/main/resources/common/message/*.json``: field names in snake_case, the versions each
field exists in (``"3+"``, ``"0-8"``), the versions in which it is nullable, tags of tagged fields,
and the message's valid and flexible version ranges. Only the APIs kbroker implements or calls are
defined; the registry maps api_key → Schema.
"""
from __future__ import annotations

from .schema import F, Schema, Struct

REQUESTS: dict[int, Schema] = {}
RESPONSES: dict[int, Schema] = {}
API_NAMES: dict[int, str] = {}


def api(key: int, name: str, valid: str, flexible: str, request: list, response: list) -> None:
    API_NAMES[key] = name
    REQUESTS[key] = Schema(name + "Request", valid, flexible, request)
    RESPONSES[key] = Schema(name + "Response", valid, flexible, response)


# --- 18 ApiVersions ---------------------------------------------------------------------------------
api(18, "ApiVersions", "0-4", "3+",
    request=[
        F("client_software_name", "string", "3+"),
        F("client_software_version", "string", "3+"),
    ],
    response=[
        F("error_code", "int16"),
        F("api_keys", [
            F("api_key", "int16"),
            F("min_version", "int16"),
            F("max_version", "int16"),
        ]),
        F("throttle_time_ms", "int32", "1+"),
        F("supported_features", [
            F("name", "string"),
            F("min_version", "int16"),
            F("max_version", "int16"),
        ], "3+", tag=0, tagged="3+"),
        F("finalized_features_epoch", "int64", "3+", default=-1, tag=1, tagged="3+"),
        F("finalized_features", [
            F("name", "string"),
            F("max_version_level", "int16"),
            F("min_version_level", "int16"),
        ], "3+", tag=2, tagged="3+"),
        F("zk_migration_ready", "bool", "3+", tag=3, tagged="3+"),
    ])
