"""SASL sessions on a real socket against the network layer (in-process server, both event loops):
KIP-368 re-authentication with connections.max.reauth.ms - the session lifetime in the answer, a
request after the session ended closes the connection, a re-authentication before the end keeps it,
and re-authenticating as another user fails - plus the v0 handshake's bare-token framing."""
from __future__ import annotations

import functools
import socket
import struct
import time

import pytest

from kbroker.network.server import Listener
from kbroker.protocol import api
from kbroker.security.sasl.server import SaslListener
from kbroker.server.apis import sasl
from netserver import LOOPS, ServerThread

LIFETIME_MS = 1000


def api_versions(conn, header, body):
    return {"error_code": 0, "api_keys": [{"api_key": 18, "min_version": 0, "max_version": 3}], "throttle_time_ms": 0}


def describe_cluster(conn, header, body):
    """A request that needs an authenticated session (anything but ApiVersions and SASL)."""
    return {"throttle_time_ms": 0, "error_code": 0, "error_message": None, "cluster_id": "c", "controller_id": -1,
            "brokers": [], "cluster_authorized_operations": 0}


def start(loop_name):
    async def no_scram(mechanism, user):
        return None
    listener = Listener("SASL_PLAINTEXT", "SASL_PLAINTEXT", "127.0.0.1", 0,
                        sasl=SaslListener(["PLAIN"], {"alice": "a-pw", "bob": "b-pw"}, no_scram, 0, LIFETIME_MS))
    handlers = {18: api_versions, 60: describe_cluster, 17: functools.partial(sasl.sasl_handshake, None),
                36: functools.partial(sasl.sasl_authenticate, None)}
    return ServerThread(handlers, loop_name, listeners=[listener])


def frame(s):
    head = s.recv(4, socket.MSG_WAITALL)
    if len(head) < 4:
        return None
    return s.recv(struct.unpack(">i", head)[0], socket.MSG_WAITALL)


def login(s, user, password, cid=1):
    s.sendall(api.encode_request(17, 1, cid, "t", {"mechanism": "PLAIN"}))
    assert frame(s) is not None
    s.sendall(api.encode_request(36, 1, cid + 1, "t", {"auth_bytes": f"\0{user}\0{password}".encode()}))
    _, body = api.decode_response(36, 1, memoryview(frame(s)))
    return body


def answered(s, cid) -> bool:
    """A DescribeCluster answered (False: the connection closed instead)."""
    s.sendall(api.encode_request(60, 0, cid, "t", {"include_cluster_authorized_operations": False}))
    try:
        f = frame(s)
    except OSError:
        return False
    return f is not None and f[:4] == cid.to_bytes(4, "big")


@pytest.mark.parametrize("loop_name", LOOPS)
def test_session_lifetime_and_reauthentication(loop_name):
    with start(loop_name) as srv:
        port = srv.server.listeners[0].port
        # logged in: the answer carries the lifetime; after it, a non-SASL request closes the connection
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            body = login(s, "alice", "a-pw")
            assert body["error_code"] == 0 and body["session_lifetime_ms"] == LIFETIME_MS
            assert answered(s, 5)
            time.sleep(LIFETIME_MS / 1000 + 0.3)
            assert not answered(s, 6)
        # re-authenticated before the end: the connection lives on past the first session's end
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            assert login(s, "alice", "a-pw")["error_code"] == 0
            time.sleep(LIFETIME_MS / 2000)
            assert login(s, "alice", "a-pw", cid=10)["error_code"] == 0
            time.sleep(LIFETIME_MS / 2000 + 0.2)
            assert answered(s, 20)
            principals = srv.call(lambda: {c.principal for c in srv.server.connections if c.authenticated})
            assert principals == {"User:alice"}
        # another user on re-authentication: refused and closed
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            assert login(s, "alice", "a-pw")["error_code"] == 0
            body = login(s, "bob", "b-pw", cid=10)
            assert body["error_code"] == 58 and "principal" in body["error_message"]
            s.settimeout(5)
            assert s.recv(1) == b""


@pytest.mark.parametrize("loop_name", LOOPS)
def test_v0_handshake_bare_tokens(loop_name):
    with start(loop_name) as srv:
        port = srv.server.listeners[0].port
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(api.encode_request(17, 0, 1, "t", {"mechanism": "PLAIN"}))
            assert frame(s) is not None
            token = b"\0alice\0a-pw"
            s.sendall(struct.pack(">i", len(token)) + token)        # a bare token, no request header
            assert frame(s) == b""                                    # PLAIN's empty answer, bare too
            assert answered(s, 5)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(api.encode_request(17, 0, 1, "t", {"mechanism": "PLAIN"}))
            assert frame(s) is not None
            token = b"\0alice\0wrong"
            s.sendall(struct.pack(">i", len(token)) + token)
            s.settimeout(5)
            assert s.recv(1) == b""                                   # no error field: the close
