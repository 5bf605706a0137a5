"""The broker's side of SASL/PLAIN and SASL/SCRAM, one exchange per connection.

``step(token)`` takes the client's next token and returns the server's answer; it raises
``AuthenticationFailed`` (SASL_AUTHENTICATION_FAILED, then the connection closes) for any wrong
credential or malformed message, and ``complete``/``user`` tell the outcome. SCRAM looks up the
user's stored credential through ``lookup(mechanism, user)`` (ZooKeeper's /config/users/<user>,
an awaitable), so its step is a coroutine; PLAIN's users come from the listener's JAAS config.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

from .scram import (MAX_ITERATIONS, MECHANISMS as SCRAM_MECHANISMS, MIN_ITERATIONS, hmac_, parse_attributes,
                    saslname_decode, xor)

SUPPORTED = ("PLAIN", *SCRAM_MECHANISMS)


class AuthenticationFailed(Exception):
    pass


class PlainServer:
    """RFC 4616: one token ``authzid NUL user NUL password``; the users are the JAAS config's
    ``user_<name>="<password>"`` options (Kafka's PlainLoginModule)."""

    mechanism = "PLAIN"

    def __init__(self, users: dict[str, str]):
        self.users = users
        self.complete = False
        self.user: str | None = None

    async def step(self, token: bytes) -> bytes:
        if self.complete:
            raise AuthenticationFailed("the PLAIN exchange is already complete")
        parts = bytes(token).split(b"\0")
        if len(parts) != 3:
            raise AuthenticationFailed("Invalid SASL/PLAIN response: expected 3 tokens")
        try:
            authzid, user, password = (p.decode() for p in parts)
        except UnicodeDecodeError:
            raise AuthenticationFailed("Invalid SASL/PLAIN response: not UTF-8") from None
        if not user:
            raise AuthenticationFailed("Authentication failed: username not specified")
        if authzid and authzid != user:
            raise AuthenticationFailed("Authentication failed: Client requested an authorization id "
                                       "that is different from username")
        expected = self.users.get(user)
        # compared in constant time; an unknown user costs the same comparison
        ok = hmac.compare_digest((expected or "\0").encode(), password.encode()) and expected is not None
        if not ok:
            raise AuthenticationFailed("Authentication failed: Invalid username or password")
        self.complete, self.user = True, user
        return b""


class ScramServer:
    """RFC 5802 server: client-first -> server-first (our nonce appended, the salt and iterations of
    the stored credential), client-final (channel binding "n", the same nonce, the proof checked
    against the stored key) -> server-final (the server signature)."""

    def __init__(self, mechanism: str, lookup):
        self.mechanism = mechanism
        self.hash = SCRAM_MECHANISMS[mechanism]
        self.lookup = lookup
        self.complete = False
        self.user: str | None = None
        self._state = "first"

    async def step(self, token: bytes) -> bytes:
        try:
            text = bytes(token).decode()
        except UnicodeDecodeError:
            raise AuthenticationFailed("Invalid SCRAM message: not UTF-8") from None
        if self._state == "first":
            return await self._first(text)
        if self._state == "final":
            return self._final(text)
        raise AuthenticationFailed("the SCRAM exchange is already complete")

    async def _first(self, text: str) -> bytes:
        # gs2-header: "n,," (no channel binding) or "y,,"; an authzid "a=" must name the user itself
        gs2, sep, bare = text.partition(",")
        authz, sep2, bare = bare.partition(",")
        if not sep or not sep2 or gs2 not in ("n", "y") or (authz and not authz.startswith("a=")):
            raise AuthenticationFailed("Invalid SCRAM client first message")
        try:
            attrs = parse_attributes(bare)
            user = saslname_decode(attrs["n"])
            client_nonce = attrs["r"]
        except (KeyError, ValueError) as e:
            raise AuthenticationFailed(f"Invalid SCRAM client first message: {e}") from None
        if authz and saslname_decode(authz[2:]) != user:
            raise AuthenticationFailed("Authentication failed: Invalid authorization id")
        if not client_nonce or any(c in client_nonce for c in ", "):
            raise AuthenticationFailed("Invalid SCRAM client first message: bad nonce")
        cred = await self.lookup(self.mechanism, user)
        if cred is None:
            raise AuthenticationFailed("Authentication failed: Invalid user credentials")
        if not MIN_ITERATIONS <= cred.iterations <= MAX_ITERATIONS:
            raise AuthenticationFailed(f"Authentication failed: Iterations {cred.iterations} is out of "
                                       f"range [{MIN_ITERATIONS}, {MAX_ITERATIONS}]")
        self._cred = cred
        self._user = user
        self._gs2 = text[:len(text) - len(bare)]
        self._nonce = client_nonce + secrets.token_hex(16)
        self._server_first = f"r={self._nonce},s={base64.b64encode(cred.salt).decode()},i={cred.iterations}"
        self._client_first_bare = bare
        self._state = "final"
        return self._server_first.encode()

    def _final(self, text: str) -> bytes:
        self._state = "done"
        without_proof, sep, proof_attr = text.rpartition(",p=")
        try:
            attrs = parse_attributes(without_proof)
            channel = base64.b64decode(attrs["c"], validate=True).decode()
            proof = base64.b64decode(proof_attr, validate=True)
        except (KeyError, ValueError, UnicodeDecodeError) as e:
            raise AuthenticationFailed(f"Invalid SCRAM client final message: {e}") from None
        if not sep:
            raise AuthenticationFailed("Invalid SCRAM client final message: no proof")
        if channel != self._gs2:
            raise AuthenticationFailed("Invalid SCRAM client final message: channel binding mismatch")
        # Kafka accepts a final nonce that ends with the server-first one (librdkafka before 2.2 repeats
        # its own nonce in front), and so must we; the proof still covers the message as sent.
        if not attrs.get("r", "").endswith(self._nonce):
            raise AuthenticationFailed("Invalid SCRAM client final message: nonce mismatch")
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        cred = self._cred
        signature = hmac_(self.hash, cred.stored_key, auth_message)
        client_key = xor(proof, signature)
        if len(proof) != len(signature) or \
                not hmac.compare_digest(hashlib.new(self.hash, client_key).digest(), cred.stored_key):
            raise AuthenticationFailed("Authentication failed: Invalid user credentials")
        self.complete, self.user = True, self._user
        return ("v=" + base64.b64encode(hmac_(self.hash, cred.server_key, auth_message)).decode()).encode()


class SaslListener:
    """A SASL listener's settings: its enabled mechanisms (``sasl.enabled.mechanisms``), PLAIN's users
    (``listener.name.<l>.plain.sasl.jaas.config``), how SCRAM credentials are found, the delay
    before a failed connection closes (``connection.failed.authentication.delay.ms``) and the session
    lifetime (``connections.max.reauth.ms``, KIP-368)."""

    def __init__(self, mechanisms, plain_users: dict[str, str], scram_lookup, failed_delay_ms: int,
                 reauth_ms: int = 0):
        self.mechanisms = list(mechanisms)
        self.plain_users = plain_users
        self.scram_lookup = scram_lookup
        self.failed_delay_s = failed_delay_ms / 1000
        self.reauth_ms = reauth_ms      # connections.max.reauth.ms: a session's lifetime (0: unlimited)

    def new_server(self, mechanism: str):
        if mechanism == "PLAIN":
            return PlainServer(self.plain_users)
        return ScramServer(mechanism, self.scram_lookup)
