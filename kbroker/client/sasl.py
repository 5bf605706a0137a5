"""SASL from kbroker's client: SaslHandshake v1, then SaslAuthenticate (KIP-152 framing) carrying
PLAIN's one token or SCRAM's two rounds, checking the server's signature and its iteration count."""
from __future__ import annotations

import base64
import hashlib
import hmac
import os

from ..protocol.errors import Errors
from .connection import KafkaError
from ..security.sasl.scram import (MAX_ITERATIONS, MECHANISMS as SCRAM_MECHANISMS, MIN_ITERATIONS, hmac_,
                                   parse_attributes, salted_password, saslname_encode, xor)

SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36


class SaslError(KafkaError):
    """Authentication failed or could not be carried out (callers that retry on KafkaError retry)."""

    def __init__(self, message: str):
        super().__init__(Errors.SASL_AUTHENTICATION_FAILED, message)


def scram_client(mechanism: str, user: str, password: str, nonce: str | None = None):
    """A generator: yields the client's tokens, is sent the server's answers; None once the server's
    signature checked out."""
    h = SCRAM_MECHANISMS[mechanism]
    nonce = nonce or base64.b64encode(os.urandom(24)).decode().rstrip("=")
    first_bare = f"n={saslname_encode(user)},r={nonce}"
    server_first = (yield ("n,," + first_bare).encode()).decode()
    attrs = parse_attributes(server_first)
    if not attrs.get("r", "").startswith(nonce) or len(attrs["r"]) == len(nonce):
        raise SaslError("SCRAM: the server's nonce does not extend ours")
    iterations = int(attrs["i"])
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise SaslError(f"SCRAM: iteration count {iterations} outside [{MIN_ITERATIONS}, {MAX_ITERATIONS}]")
    salted = salted_password(h, password, base64.b64decode(attrs["s"]), iterations)
    client_key = hmac_(h, salted, b"Client Key")
    final_wo_proof = f"c={base64.b64encode(b'n,,').decode()},r={attrs['r']}"
    auth_message = f"{first_bare},{server_first},{final_wo_proof}".encode()
    proof = xor(client_key, hmac_(h, hashlib.new(h, client_key).digest(), auth_message))
    server_final = (yield f"{final_wo_proof},p={base64.b64encode(proof).decode()}".encode()).decode()
    want = base64.b64encode(hmac_(h, hmac_(h, salted, b"Server Key"), auth_message)).decode()
    if not hmac.compare_digest(parse_attributes(server_final).get("v", ""), want):
        raise SaslError("SCRAM: the server's signature is wrong")
    yield None


def _plain_client(user: str, password: str):
    yield f"\0{user}\0{password}".encode()
    yield None


async def authenticate(conn, security) -> None:
    """Authenticate ``conn`` (a BrokerConnection, ApiVersions already negotiated or not) as
    ``security.username``; SaslError with the broker's message when it fails."""
    mechanism = security.sasl_mechanism
    if mechanism == "PLAIN":
        steps = _plain_client(security.username, security.password)
    elif mechanism in SCRAM_MECHANISMS:
        steps = scram_client(mechanism, security.username, security.password)
    else:
        raise SaslError(f"SASL mechanism {mechanism} is not supported by kbroker's client")
    _, resp = await conn.send(SASL_HANDSHAKE, {"mechanism": mechanism}, version=1)
    if resp["error_code"]:
        raise SaslError(f"SaslHandshake: error {resp['error_code']} (the broker offers "
                        f"{', '.join(resp['mechanisms'])})")
    theirs = conn.broker_versions.get(SASL_AUTHENTICATE, (0, 1))
    version = min(theirs[1], 2)
    token = next(steps)
    while token is not None:
        _, resp = await conn.send(SASL_AUTHENTICATE, {"auth_bytes": token}, version=version)
        if resp["error_code"]:
            name = Errors(resp["error_code"]).name if resp["error_code"] in Errors._value2member_map_ else ""
            raise SaslError(f"SaslAuthenticate: error {resp['error_code']} {name}: {resp['error_message']}")
        token = steps.send(bytes(resp["auth_bytes"]))
