"""SASL mechanisms in process: SCRAM against RFC 7677's worked example, our client against our server
(SHA-256 and SHA-512), the failures the broker must answer (wrong password, unknown user, nonce
mismatch, channel binding, iteration counts out of range, malformed messages), PLAIN's rules, and the
credential text Kafka stores in ZooKeeper."""
from __future__ import annotations

import asyncio
import base64

import pytest

from kbroker.client.sasl import SaslError, scram_client
from kbroker.security.sasl.scram import ScramCredential, saslname_decode, saslname_encode
from kbroker.security.sasl.server import AuthenticationFailed, PlainServer, ScramServer


def run(coro):
    return asyncio.run(coro)


def test_rfc7677_example():
    """SCRAM-SHA-256 with RFC 7677's nonce, salt and password: our client's proof and the server
    signature it accepts are the RFC's."""
    steps = scram_client("SCRAM-SHA-256", "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    assert next(steps) == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    final = steps.send(b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    assert final == (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                     b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    assert steps.send(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=") is None


def _lookup(creds):
    async def lookup(mechanism, user):
        return creds.get((mechanism, user))
    return lookup


def exchange(mechanism, password, stored_password="s3cret", iterations=4096, user="alice"):
    creds = {(mechanism, "alice"): ScramCredential.from_password(mechanism, stored_password, iterations)}
    server = ScramServer(mechanism, _lookup(creds))
    steps = scram_client(mechanism, user, password)

    async def go():
        token = next(steps)
        while token is not None:
            token = steps.send(await server.step(token))
    run(go())
    return server


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_round_trip_and_failures(mechanism):
    server = exchange(mechanism, "s3cret")
    assert server.complete and server.user == "alice"
    with pytest.raises(AuthenticationFailed, match="Invalid user credentials"):
        exchange(mechanism, "wrong")
    with pytest.raises(AuthenticationFailed, match="Invalid user credentials"):
        exchange(mechanism, "s3cret", user="bob")
    with pytest.raises(AuthenticationFailed, match="out of range"):
        exchange(mechanism, "s3cret", iterations=100)


def _started(mechanism="SCRAM-SHA-256", first=b"n,,n=alice,r=cnonce"):
    creds = {(mechanism, "alice"): ScramCredential.from_password(mechanism, "pw", 4096)}
    server = ScramServer(mechanism, _lookup(creds))
    server_first = run(server.step(first)).decode()
    return server, dict(kv.split("=", 1) for kv in server_first.split(","))


def test_scram_message_errors():
    server, attrs = _started()
    assert attrs["r"].startswith("cnonce") and len(attrs["r"]) > len("cnonce") and attrs["i"] == "4096"
    with pytest.raises(AuthenticationFailed, match="nonce mismatch"):
        run(server.step(b"c=biws,r=cnonceWRONG,p=" + base64.b64encode(b"x" * 32)))
    server, attrs = _started()
    with pytest.raises(AuthenticationFailed, match="channel binding"):
        run(server.step(b"c=eSws,r=" + attrs["r"].encode() + b",p=" + base64.b64encode(b"x" * 32)))
    server, attrs = _started()
    with pytest.raises(AuthenticationFailed, match="no proof|Invalid"):
        run(server.step(b"c=biws,r=" + attrs["r"].encode()))
    for bad in (b"x,,n=alice,r=a", b"n,,r=a", b"n,,n=alice", b"\xff\xfe", b"n,,n=a=lice,r=a", b"n,a=bob,n=alice,r=a"):
        server = ScramServer("SCRAM-SHA-256", _lookup({}))
        with pytest.raises(AuthenticationFailed):
            run(server.step(bad))
    # the client refuses a server that drops its nonce or asks for too many iterations
    steps = scram_client("SCRAM-SHA-256", "alice", "pw", nonce="abc")
    next(steps)
    with pytest.raises(SaslError, match="nonce"):
        steps.send(b"r=xyz123,s=AAAA,i=4096")
    steps = scram_client("SCRAM-SHA-256", "alice", "pw", nonce="abc")
    next(steps)
    with pytest.raises(SaslError, match="iteration"):
        steps.send(b"r=abc123,s=AAAA,i=100000")


def test_plain():
    s = PlainServer({"alice": "pw"})
    run(s.step(b"\0alice\0pw"))
    assert s.complete and s.user == "alice"
    s = PlainServer({"alice": "pw"})
    run(s.step(b"alice\0alice\0pw"))
    assert s.user == "alice"
    for bad in (b"\0alice\0nope", b"\0bob\0pw", b"bob\0alice\0pw", b"\0alice", b"\0\0pw"):
        with pytest.raises(AuthenticationFailed):
            run(PlainServer({"alice": "pw"}).step(bad))


def test_credential_text_and_names():
    cred = ScramCredential.from_password("SCRAM-SHA-512", "pw", 8192, salt=b"salt")
    text = cred.encode()
    assert text.startswith("salt=c2FsdA==,stored_key=") and text.endswith(",iterations=8192")
    assert ScramCredential.decode(text) == cred
    assert saslname_decode(saslname_encode("a=b,c")) == "a=b,c"
    with pytest.raises(ValueError):
        saslname_decode("a=b")
