"""SaslHandshake (17) and SaslAuthenticate (36): the client picks a mechanism the listener enables,
then its tokens go to that mechanism's server side (kbroker.security.sasl.server), wrapped in
SaslAuthenticate (KIP-152) after a v1 handshake or as bare size-prefixed frames after a v0 one, as
Kafka serves them. Success sets the connection's principal; a failure answers
SASL_AUTHENTICATION_FAILED and closes the connection after connection.failed.authentication.delay.ms.
Every other request before that closes the connection (kbroker.network.connection)."""
from __future__ import annotations

import logging

from ...protocol.errors import Errors
from ...security.sasl.server import AuthenticationFailed

log = logging.getLogger(__name__)


def sasl_handshake(broker, conn, header, body):
    sasl = conn.listener.sasl
    mechanisms = list(sasl.mechanisms) if sasl is not None else []
    if sasl is None or conn.authenticated or conn.sasl_server is not None:
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
    if server_side is None:
        # no handshake, or already authenticated (re-authentication is not offered: session 0)
        conn.authentication_failed(0)
        return _answer(Errors.ILLEGAL_SASL_STATE, "SaslAuthenticate without a SaslHandshake choosing a mechanism")
    try:
        token = await server_side.step(body["auth_bytes"])
    except AuthenticationFailed as e:
        log.info("SASL/%s authentication of %s failed: %s", server_side.mechanism, conn.peer, e)
        conn.authentication_failed(conn.listener.sasl.failed_delay_s)
        return _answer(Errors.SASL_AUTHENTICATION_FAILED, str(e))
    if server_side.complete:
        conn.authenticated_as(server_side.user)
    return _answer(Errors.NONE, None, token)


def _answer(code, message, token=b""):
    return {"error_code": int(code), "error_message": message, "auth_bytes": token, "session_lifetime_ms": 0}
