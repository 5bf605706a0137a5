"""TLS with Python's ``ssl`` and Kafka's ``ssl.*`` keys: server contexts for SSL/SASL_SSL listeners,
client contexts for the broker's own outgoing connections (and kbroker's client), and the principal of
a client certificate (``ssl.principal.mapping.rules``).

Keys, read per listener (``listener.name.<l>.ssl.*`` wins over ``ssl.*``):

* ``ssl.keystore.type`` PEM (``ssl.keystore.location``: the private key and its certificate chain in
  one PEM file, the key encrypted with ``ssl.key.password`` or not) or PKCS12 (decrypted with
  ``ssl.keystore.password``, read with ``cryptography``). JKS (Kafka's default type) is a Java format
  that cannot be read here: a keystore of that type is refused, naming ``ssl.keystore.type``.
* ``ssl.truststore.type`` PEM (CA certificates) or PKCS12 (its certificates), ``ssl.truststore.location``.
* ``ssl.client.auth``: none | requested | required (CERT_NONE / CERT_OPTIONAL / CERT_REQUIRED).
* ``ssl.enabled.protocols``: the lowest and highest named version bound the handshake.
* ``ssl.cipher.suites``: given to OpenSSL as cipher names for TLS 1.2 (OpenSSL's names, e.g.
  ECDHE-RSA-AES128-GCM-SHA256, where Kafka takes the Java/IANA ones); TLS 1.3 keeps OpenSSL's suites,
  as Python's ``ssl`` cannot choose them.
* ``ssl.endpoint.identification.algorithm``: "https" (the default) verifies the server's host name on
  the broker's outgoing connections; empty turns that off.
"""
from __future__ import annotations

import os
import re
import ssl
import tempfile

from ..config import ConfigError

_VERSIONS = {"TLSv1": ssl.TLSVersion.TLSv1, "TLSv1.1": ssl.TLSVersion.TLSv1_1,
             "TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
_CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


def _bad(key: str, value, why: str) -> ConfigError:
    return ConfigError(f"Invalid value {value} for configuration {key}: {why}", key)


def _read(key: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise _bad(key, path, f"cannot read it: {e.strerror}") from None


def _password(value) -> bytes | None:
    return None if value is None else str(value).encode()


def _load_keystore(ctx: ssl.SSLContext, get) -> bool:
    """The key and certificate chain into ``ctx``; False when no keystore is configured."""
    location = get("ssl.keystore.location")
    if not location:
        return False
    kind = (get("ssl.keystore.type") or "JKS").upper()
    if kind == "PEM":
        try:
            ctx.load_cert_chain(location, password=_password(get("ssl.key.password")))
        except (OSError, ssl.SSLError) as e:
            raise _bad("ssl.keystore.location", location, f"not a PEM private key and certificate chain "
                                                           f"(or wrong ssl.key.password): {e}") from None
        return True
    if kind == "PKCS12":
        key_pem, chain_pem = _pkcs12_pem(location, get("ssl.keystore.password"))
        # ssl loads a chain only from a file: a private temporary one, removed at once
        fd, path = tempfile.mkstemp(prefix="kbroker-key-", suffix=".pem")
        try:
            os.write(fd, key_pem + chain_pem)
            os.close(fd)
            fd = -1
            ctx.load_cert_chain(path)
        finally:
            if fd >= 0:
                os.close(fd)
            os.unlink(path)
        return True
    raise _bad("ssl.keystore.type", kind, "kbroker reads PEM and PKCS12 keystores only (JKS is a Java "
                                          "format: convert it with keytool -importkeystore -deststoretype PKCS12)")


def _pkcs12_entry(location: str, password):
    """(key, certificate, extra certificates) of a PKCS12 keystore."""
    from cryptography.hazmat.primitives.serialization import pkcs12
    data = _read("ssl.keystore.location", location)
    try:
        key, cert, extra = pkcs12.load_key_and_certificates(data, _password(password))
    except ValueError as e:
        raise _bad("ssl.keystore.location", location, f"not a PKCS12 keystore this ssl.keystore.password "
                                                       f"opens: {e}") from None
    if key is None or cert is None:
        raise _bad("ssl.keystore.location", location, "the PKCS12 keystore holds no private key and certificate")
    return key, cert, extra


_PEM_CERT = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.S)


def keystore_certificate(get):
    """The certificate a keystore serves (``cryptography``'s x509.Certificate; the first of a PEM chain,
    as OpenSSL takes it), or None when no keystore is configured."""
    location = get("ssl.keystore.location")
    if not location:
        return None
    from cryptography import x509
    if (get("ssl.keystore.type") or "JKS").upper() == "PKCS12":
        return _pkcs12_entry(location, get("ssl.keystore.password"))[1]
    m = _PEM_CERT.search(_read("ssl.keystore.location", location))
    if m is None:
        raise _bad("ssl.keystore.location", location, "the PEM keystore holds no certificate")
    return x509.load_pem_x509_certificate(m.group(0))


def _pkcs12_pem(location: str, password) -> tuple[bytes, bytes]:
    from cryptography.hazmat.primitives import serialization
    key, cert, extra = _pkcs12_entry(location, password)
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    chain = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in [cert, *extra])
    return key_pem, chain


def _load_truststore(ctx: ssl.SSLContext, get) -> bool:
    location = get("ssl.truststore.location")
    if not location:
        return False
    kind = (get("ssl.truststore.type") or "JKS").upper()
    if kind == "PEM":
        try:
            ctx.load_verify_locations(cafile=location)
        except (OSError, ssl.SSLError) as e:
            raise _bad("ssl.truststore.location", location, f"not a PEM file of certificates: {e}") from None
        return True
    if kind == "PKCS12":
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.serialization import pkcs12
        data = _read("ssl.truststore.location", location)
        try:
            store = pkcs12.load_pkcs12(data, _password(get("ssl.truststore.password")))
        except ValueError as e:
            raise _bad("ssl.truststore.location", location, f"not a PKCS12 truststore: {e}") from None
        certs = ([store.cert.certificate] if store.cert else []) + [c.certificate for c in store.additional_certs]
        if not certs:
            raise _bad("ssl.truststore.location", location, "the PKCS12 truststore holds no certificate")
        ctx.load_verify_locations(cadata="".join(
            c.public_bytes(serialization.Encoding.PEM).decode() for c in certs))
        return True
    raise _bad("ssl.truststore.type", kind, "kbroker reads PEM and PKCS12 truststores only (JKS is a Java "
                                            "format: convert it with keytool -importkeystore -deststoretype PKCS12)")


def _protocols_and_ciphers(ctx: ssl.SSLContext, get) -> None:
    enabled = [p.strip() for p in (get("ssl.enabled.protocols") or []) if p.strip()]
    if enabled:
        unknown = [p for p in enabled if p not in _VERSIONS]
        if unknown:
            raise _bad("ssl.enabled.protocols", ",".join(enabled), f"unknown protocol {unknown[0]} "
                                                                     f"(one of {', '.join(_VERSIONS)})")
        versions = sorted(_VERSIONS[p] for p in enabled)
        ctx.minimum_version, ctx.maximum_version = versions[0], versions[-1]
    ciphers = [c.strip() for c in (get("ssl.cipher.suites") or []) if c.strip()]
    if ciphers:
        try:
            ctx.set_ciphers(":".join(ciphers))
        except ssl.SSLError:
            raise _bad("ssl.cipher.suites", ",".join(ciphers), "no cipher OpenSSL knows by these names") from None


def server_context(get) -> ssl.SSLContext:
    """The context of an SSL or SASL_SSL listener; ``get(key)`` reads that listener's value of a key."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    if not _load_keystore(ctx, get):
        raise ConfigError("ssl.keystore.location must be set on a listener that uses SSL", "ssl.keystore.location")
    auth = (get("ssl.client.auth") or "none").lower()
    if auth not in _CLIENT_AUTH:
        raise _bad("ssl.client.auth", auth, "String must be one of: required, requested, none")
    has_trust = _load_truststore(ctx, get)
    if auth != "none" and not has_trust:
        ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)
    ctx.verify_mode = _CLIENT_AUTH[auth]
    _protocols_and_ciphers(ctx, get)
    return ctx


def client_context(get) -> ssl.SSLContext:
    """The context of an outgoing TLS connection (the broker to another broker, kbroker's client):
    the truststore verifies the server (the system's CAs without one), a keystore is offered as the
    client certificate, the host name is checked unless ``ssl.endpoint.identification.algorithm`` is
    empty."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if not _load_truststore(ctx, get):
        ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    _load_keystore(ctx, get)
    algorithm = get("ssl.endpoint.identification.algorithm")
    ctx.check_hostname = bool(algorithm and algorithm.strip())
    _protocols_and_ciphers(ctx, get)
    return ctx


# ---- principals of client certificates (ssl.principal.mapping.rules) -----------------------------

# One rule of Kafka's syntax: DEFAULT, or RULE:pattern/replacement/ with an optional L or U (lower or
# upper case the result); "/" inside pattern or replacement is written "\/". Rules are comma separated.
_RULE = re.compile(r"\s*(?:(DEFAULT)|RULE:((?:\\/|[^/])*)/((?:\\/|[^/])*)/([LU]?))\s*(?:,|$)")


class PrincipalMapper:
    """``ssl.principal.mapping.rules``: the first rule whose pattern matches the whole distinguished
    name (RFC 2253 form, e.g. "CN=alice,OU=eng,O=example") gives the user name; DEFAULT keeps the
    name as it is. No rule matching is an error (Kafka fails the authentication)."""

    def __init__(self, text: str | None):
        text = (text or "DEFAULT").strip()
        self.rules: list[tuple[re.Pattern, str, str] | None] = []   # None = DEFAULT
        pos = 0
        while pos < len(text):
            m = _RULE.match(text, pos)
            if m is None or m.end() == pos:
                raise _bad("ssl.principal.mapping.rules", text, f"cannot parse the rule at '{text[pos:]}'")
            if m.group(1):
                self.rules.append(None)
            else:
                pattern = m.group(2).replace("\\/", "/")
                # Java's $1 group references in Python's form
                replacement = re.sub(r"\$(\d+)", r"\\g<\1>", m.group(3).replace("\\/", "/"))
                try:
                    self.rules.append((re.compile(pattern), replacement, m.group(4)))
                except re.error as e:
                    raise _bad("ssl.principal.mapping.rules", text, f"bad pattern {pattern}: {e}") from None
            pos = m.end()

    def name(self, dn: str) -> str:
        for rule in self.rules:
            if rule is None:
                return dn
            pattern, replacement, case = rule
            if pattern.fullmatch(dn):
                out = pattern.sub(replacement, dn)
                return out.lower() if case == "L" else out.upper() if case == "U" else out
        raise ValueError(f"no rule of ssl.principal.mapping.rules applies to {dn}")


def peer_dn(ssl_object) -> str | None:
    """The client certificate's subject in RFC 2253 form (as Java's X500Principal prints it), or None
    when the client sent no certificate."""
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    if not der:
        return None
    from cryptography import x509
    return x509.load_der_x509_certificate(der).subject.rfc4514_string()
