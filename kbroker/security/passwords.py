"""Passwords in dynamic broker configs, encoded as Kafka's ZooKeeper mode stores them: a password
config written to /config/brokers/<id> is encrypted with ``password.encoder.secret`` (PBKDF2 with
HMAC-SHA512 derives an AES key; AES/CBC with PKCS#5 padding encrypts) and stored as comma-separated
``name:value`` fields (salt, IV and ciphertext in base64). Without a secret a broker refuses to store
one, as Kafka does, so no password lands in ZooKeeper in clear."""
from __future__ import annotations

import base64
import os

from ..config import ConfigError

CIPHER = "AES/CBC/PKCS5Padding"
KEY_FACTORY = "PBKDF2WithHmacSHA512"
SALT_BYTES = 256
# Kafka's field name, spelling included: its brokers read the stored form back by this name.
_ENCRYPTED = "encyrptedPassword"


def _key(secret: str, salt: bytes, iterations: int, key_bits: int) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.pbkdf2 import PBKDF2HMAC
    return PBKDF2HMAC(hashes.SHA512(), key_bits // 8, salt, iterations).derive(secret.encode())


def encode(password: str, secret: str | None, iterations: int = 4096, key_bits: int = 128) -> str:
    if not secret:
        raise ConfigError("Password encoder secret not configured: set password.encoder.secret on every "
                          "broker to store password configs dynamically", "password.encoder.secret")
    if key_bits not in (128, 192, 256):
        raise ConfigError(f"Invalid value {key_bits} for configuration password.encoder.key.length: AES "
                          f"takes 128, 192 or 256", "password.encoder.key.length")
    from cryptography.hazmat.primitives import padding
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
    salt, iv = os.urandom(SALT_BYTES), os.urandom(16)
    padder = padding.PKCS7(128).padder()
    plain = padder.update(password.encode()) + padder.finalize()
    enc = Cipher(algorithms.AES(_key(secret, salt, iterations, key_bits)), modes.CBC(iv)).encryptor()
    sealed = enc.update(plain) + enc.finalize()
    b64 = lambda b: base64.b64encode(b).decode()   # noqa: E731
    fields = {"keyFactoryAlgorithm": KEY_FACTORY, "cipherAlgorithm": CIPHER, "keyLength": str(key_bits),
              "salt": b64(salt), "iterations": str(iterations), _ENCRYPTED: b64(sealed),
              "passwordLength": str(len(password)), "initializationVector": b64(iv)}
    return ",".join(f"{k}:{v}" for k, v in fields.items())


def decode(stored: str, secret: str | None, key: str) -> str:
    """The password of a stored encoded value; ConfigError naming ``key`` when it cannot be read."""
    if not secret:
        raise ConfigError(f"{key} is stored encoded but password.encoder.secret is not set", key)
    from cryptography.hazmat.primitives import padding
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
    try:
        fields = dict(f.split(":", 1) for f in stored.split(","))
        if fields.get("cipherAlgorithm") != CIPHER or fields.get("keyFactoryAlgorithm") != KEY_FACTORY:
            raise ValueError(f"kbroker decodes {CIPHER} with {KEY_FACTORY} only")
        aes = _key(secret, base64.b64decode(fields["salt"]), int(fields["iterations"]), int(fields["keyLength"]))
        dec = Cipher(algorithms.AES(aes), modes.CBC(base64.b64decode(fields["initializationVector"]))).decryptor()
        padded = dec.update(base64.b64decode(fields[_ENCRYPTED])) + dec.finalize()
        unpadder = padding.PKCS7(128).unpadder()
        return (unpadder.update(padded) + unpadder.finalize()).decode()
    except (ValueError, KeyError) as e:
        raise ConfigError(f"cannot decode the stored {key} with password.encoder.secret: {e}", key) from None
