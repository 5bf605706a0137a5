"""SCRAM (RFC 5802, RFC 7677 for SHA-256; SHA-512 as Kafka): the key derivation, the credential
Kafka stores in ZooKeeper (``/config/users/<user>``: ``salt=..,stored_key=..,server_key=..,
iterations=..``, base64 values) and the message parsing both sides use."""
from __future__ import annotations

import base64
import hashlib
import hmac
import os
from dataclasses import dataclass

MECHANISMS = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
# Kafka's ScramMechanism bounds
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def hmac_(hash_name: str, key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hash_name).digest()


def xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b))


def salted_password(hash_name: str, password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac(hash_name, password.encode(), salt, iterations)


@dataclass(frozen=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    @classmethod
    def from_password(cls, mechanism: str, password: str, iterations: int = MIN_ITERATIONS,
                      salt: bytes | None = None) -> "ScramCredential":
        salt = os.urandom(32) if salt is None else salt
        return cls.from_salted(mechanism, salted_password(MECHANISMS[mechanism], password, salt, iterations),
                               salt, iterations)

    @classmethod
    def from_salted(cls, mechanism: str, salted: bytes, salt: bytes, iterations: int) -> "ScramCredential":
        """From SaltedPassword (what AlterUserScramCredentials carries): the keys the server keeps."""
        h = MECHANISMS[mechanism]
        client_key = hmac_(h, salted, b"Client Key")
        return cls(salt, hashlib.new(h, client_key).digest(), hmac_(h, salted, b"Server Key"), iterations)

    def encode(self) -> str:
        """Kafka's ScramCredentialUtils form, as stored in /config/users/<user>."""
        return (f"salt={_b64(self.salt)},stored_key={_b64(self.stored_key)},"
                f"server_key={_b64(self.server_key)},iterations={self.iterations}")

    @classmethod
    def decode(cls, text: str) -> "ScramCredential":
        fields = dict(item.split("=", 1) for item in text.split(","))
        return cls(base64.b64decode(fields["salt"]), base64.b64decode(fields["stored_key"]),
                   base64.b64decode(fields["server_key"]), int(fields["iterations"]))


def parse_attributes(message: str) -> dict[str, str]:
    """``a=..,b=..`` of a SCRAM message; ValueError when malformed or an attribute repeats."""
    out: dict[str, str] = {}
    for item in message.split(","):
        if len(item) < 2 or item[1] != "=" or item[0] in out:
            raise ValueError(f"malformed SCRAM attribute {item[:20]!r}")
        out[item[0]] = item[2:]
    return out


def saslname_decode(name: str) -> str:
    """RFC 5802's escaping of ',' and '=' in user names; ValueError on a stray '='."""
    if "=" in name.replace("=2C", "").replace("=3D", ""):
        raise ValueError("invalid escape in the user name")
    return name.replace("=2C", ",").replace("=3D", "=")


def saslname_encode(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")
