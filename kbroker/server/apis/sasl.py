"""SaslHandshake (17) and SaslAuthenticate (36): the client picks a mechanism the listener enables,
then its tokens go to that mechanism's server side (kbroker.security.sasl.server), wrapped in
SaslAuthenticate (KIP-152) after a v1 handshake or as bare size-prefixed frames after a v0 one, as
Kafka serves them. Success sets the connection's principal; a failure answers
SASL_AUTHENTICATION_FAILED and closes the connection after connection.failed.authentication.delay.ms.
Every other request before that closes the connection (kbroker.network.connection)."""
from __future__ import annotations

import asyncio
import logging

from ...protocol.errors import Errors
from ...security.sasl.scram import MAX_ITERATIONS, MIN_ITERATIONS, ScramCredential
from ...security.sasl.server import AuthenticationFailed
from ...zk.credentials import alter_user_config, get_user_config, list_users

log = logging.getLogger(__name__)


def sasl_handshake(broker, conn, header, body):
    sasl = conn.listener.sasl
    mechanisms = list(sasl.mechanisms) if sasl is not None else []
    # KIP-368: an authenticated connection may authenticate again (v1 handshake) when sessions expire
    reauth = conn.authenticated and sasl is not None and sasl.reauth_ms > 0 and header.api_version >= 1
    if sasl is None or (conn.authenticated and not reauth) or conn.sasl_server is not None:
        return {"error_code": int(Errors.ILLEGAL_SASL_STATE), "mechanisms": mechanisms}
    mechanism = body["mechanism"]
    if mechanism not in mechanisms:
        conn.authentication_failed(sasl.failed_delay_s)
        return {"error_code": int(Errors.UNSUPPORTED_SASL_MECHANISM), "mechanisms": mechanisms}
    conn.sasl_server = sasl.new_server(mechanism)
    conn.sasl_raw = header.api_version == 0
    return {"error_code": 0, "mechanisms": mechanisms}


async def sasl_authenticate(broker, conn, header, body):
    server_side = conn.sasl_server
    if conn.listener.sasl is None:
        # a listener without SASL answers, as Kafka's request handler does, and stays open
        return _answer(Errors.ILLEGAL_SASL_STATE, "SaslAuthenticate on a listener without SASL")
    if server_side is None:
        # no handshake (a re-authentication starts with one too)
        conn.authentication_failed(0)
        return _answer(Errors.ILLEGAL_SASL_STATE, "SaslAuthenticate without a SaslHandshake choosing a mechanism")
    try:
        token = await server_side.step(body["auth_bytes"])
    except AuthenticationFailed as e:
        log.info("SASL/%s authentication of %s failed: %s", server_side.mechanism, conn.peer, e)
        conn.authentication_failed(conn.listener.sasl.failed_delay_s)
        return _answer(Errors.SASL_AUTHENTICATION_FAILED, str(e))
    lifetime = 0
    if server_side.complete:
        if not conn.authenticated_as(server_side.user):
            conn.authentication_failed(conn.listener.sasl.failed_delay_s)
            return _answer(Errors.SASL_AUTHENTICATION_FAILED, "Cannot change principals during re-authentication")
        lifetime = conn.listener.sasl.reauth_ms
    return _answer(Errors.NONE, None, token, lifetime)


def _answer(code, message, token=b"", lifetime_ms=0):
    """``session_lifetime_ms``: connections.max.reauth.ms once authenticated (0: the session never ends)."""
    return {"error_code": int(code), "error_message": message, "auth_bytes": token, "session_lifetime_ms": lifetime_ms}


# ---- DescribeUserScramCredentials (50), AlterUserScramCredentials (51) ------------------------------
# Kafka's ScramMechanism ids; the credentials live in ZooKeeper /config/users/<user> (zk/credentials.py)
MECHANISM_IDS = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}
_IDS = {name: i for i, name in MECHANISM_IDS.items()}


async def describe_user_scram_credentials(broker, conn, header, body):
    kazoo = broker.zk.kazoo
    names = [u["name"] for u in body["users"] or []]
    if not names:
        names = await asyncio.to_thread(list_users, kazoo)
        wanted = False
    else:
        wanted = True
    results, seen = [], set()
    for name in names:
        if name in seen:
            results.append(_user_result(name, Errors.DUPLICATE_RESOURCE, "Cannot describe SCRAM credentials for "
                                                                       f"the same user twice in a single request: {name}"))
            continue
        seen.add(name)
        try:
            config = await asyncio.to_thread(get_user_config, kazoo, name)
        except ValueError:
            config = {}
        infos = [{"mechanism": i, "iterations": ScramCredential.decode(config[m]).iterations}
                 for i, m in MECHANISM_IDS.items() if m in config]
        if infos:
            results.append(_user_result(name, Errors.NONE, None, infos))
        elif wanted:
            results.append(_user_result(name, Errors.RESOURCE_NOT_FOUND,
                                        f"Attempt to describe a user credential that does not exist: {name}"))
    return {"throttle_time_ms": 0, "error_code": 0, "error_message": None, "results": results}


def _user_result(name, code, message, infos=()):
    return {"user": name, "error_code": int(code), "error_message": message, "credential_infos": list(infos)}


def _alter_error(op) -> tuple[Errors, str] | None:
    if not op["name"]:
        return Errors.UNACCEPTABLE_CREDENTIAL, "Username must not be empty"
    if op["mechanism"] not in MECHANISM_IDS:
        return Errors.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism"
    iterations = op.get("iterations")
    if iterations is not None and iterations < MIN_ITERATIONS:
        return Errors.UNACCEPTABLE_CREDENTIAL, f"Too few iterations: {iterations} (at least {MIN_ITERATIONS})"
    if iterations is not None and iterations > MAX_ITERATIONS:
        return Errors.UNACCEPTABLE_CREDENTIAL, f"Too many iterations: {iterations} (at most {MAX_ITERATIONS})"
    return None


async def alter_user_scram_credentials(broker, conn, header, body):
    """Each user's deletions and upsertions in one write of /config/users/<user> (with its change
    notification); the stored and server keys come from the salted password the client computed."""
    ops = [("delete", d) for d in body["deletions"]] + [("upsert", u) for u in body["upsertions"]]
    counts: dict[str, int] = {}
    for _, op in ops:
        counts[op["name"]] = counts.get(op["name"], 0) + 1
    failed: dict[str, tuple] = {}
    for _, op in ops:
        err = _alter_error(op)
        if counts[op["name"]] > 1 and op["name"] not in failed:
            failed[op["name"]] = (Errors.DUPLICATE_RESOURCE, "A user credential cannot be altered twice in the same "
                                                             "request")
        elif err is not None and op["name"] not in failed:
            failed[op["name"]] = err
    kazoo = broker.zk.kazoo
    results = []
    for name in dict.fromkeys(op["name"] for _, op in ops):
        if name in failed:
            code, message = failed[name]
            results.append({"user": name, "error_code": int(code), "error_message": message})
            continue
        kind, op = next((k, o) for k, o in ops if o["name"] == name)
        mechanism = MECHANISM_IDS[op["mechanism"]]
        try:
            if kind == "delete":
                current = await asyncio.to_thread(get_user_config, kazoo, name)
                if mechanism not in current:
                    results.append({"user": name, "error_code": int(Errors.RESOURCE_NOT_FOUND),
                                    "error_message": f"Attempt to delete a user credential that does not exist: {name}"})
                    continue
                await asyncio.to_thread(alter_user_config, kazoo, name, {}, [mechanism])
            else:
                cred = ScramCredential.from_salted(mechanism, bytes(op["salted_password"]), bytes(op["salt"]),
                                                   op["iterations"])
                await asyncio.to_thread(alter_user_config, kazoo, name, {mechanism: cred.encode()})
        except ValueError as e:     # a user name ZooKeeper cannot hold
            results.append({"user": name, "error_code": int(Errors.UNACCEPTABLE_CREDENTIAL), "error_message": str(e)})
            continue
        log.info("SCRAM credential %s of user %s %s", mechanism, name, "deleted" if kind == "delete" else "set")
        results.append({"user": name, "error_code": 0, "error_message": None})
    return {"throttle_time_ms": 0, "results": results}
