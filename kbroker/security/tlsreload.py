"""Certificate reload without restart, as Kafka's dynamic SSL configs: the keystore and truststore keys
(``ssl.keystore.*``, ``ssl.key.password``, ``ssl.truststore.*``, each also as
``listener.name.<l>.<key>``) set per broker in /config/brokers/<id> replace the TLS context of the
SSL and SASL_SSL listeners. A listener's new connections get the new context; a connection keeps the
context it was accepted with. A value for one listener is read before a value for all, a dynamic value
before a static one of the same scope (Kafka's order: dynamic over static, then listener over
broker-wide). Password values are stored encoded (kbroker/security/passwords.py).

A new keystore must serve a certificate of the same subject (DN) as the one it replaces and keep all of
its SubjectAltNames (more are fine), unless ``ssl.allow.dn.changes`` / ``ssl.allow.san.changes``
(per listener as the other ssl keys) allow the change: clients and brokers that check host names or
map principals from the DN keep working, as Kafka's keystore update check."""
from __future__ import annotations

import logging

from ..config import BROKER_CONFIGS, LISTENER_PREFIX, ConfigError
from . import passwords, tls

log = logging.getLogger(__name__)

RELOADABLE = frozenset({"ssl.keystore.type", "ssl.keystore.location", "ssl.keystore.password",
                        "ssl.key.password", "ssl.truststore.type", "ssl.truststore.location",
                        "ssl.truststore.password"})
SECURE = ("SSL", "SASL_SSL")


def split(key: str) -> tuple[str | None, str] | None:
    """(listener upper-cased or None, base key) of a reloadable key, else None."""
    if key in RELOADABLE:
        return None, key
    if key.startswith(LISTENER_PREFIX):
        listener, _, base = key[len(LISTENER_PREFIX):].partition(".")
        if listener and base in RELOADABLE:
            return listener.upper(), base
    return None


def is_password(key: str) -> bool:
    parts = split(key)
    return parts is not None and BROKER_CONFIGS[parts[1]].type == "password"


class DynamicTls:
    """The dynamic TLS keys of this broker over its static config, and the listeners' contexts from them."""

    def __init__(self, config):
        self.config = config
        self.secret = config.get("password.encoder.secret")
        self.dynamic: dict[tuple[str | None, str], str] = {}   # (listener or None, base) -> clear value
        self.served: dict[str, object] = {}     # listener -> the certificate its new connections get

    def encode(self, key: str, value: str) -> str:
        """The stored form of a value being set: passwords encrypted, the rest as given."""
        if not is_password(key):
            return value
        return passwords.encode(value, self.secret, self.config.get("password.encoder.iterations"),
                                self.config.get("password.encoder.key.length"))

    def _decoded(self, stored: dict[str, str]) -> dict[tuple[str | None, str], str]:
        out = {}
        for key, value in stored.items():
            parts = split(key)
            if parts is not None:
                out[parts] = passwords.decode(value, self.secret, key) if is_password(key) else value
        return out

    def getter(self, listener: str, dynamic=None):
        dynamic = self.dynamic if dynamic is None else dynamic
        name = listener.upper()
        cfg = self.config

        def get(key: str):
            for scope in (name, None):
                if (scope, key) in dynamic:
                    return dynamic[(scope, key)]
                if scope is not None:
                    static = cfg.listener_overrides(name)
                    if key in static:
                        return static[key]
            return cfg.get(key) if key in BROKER_CONFIGS else None
        return get

    def _build(self, listeners, stored: dict[str, str]) -> dict[str, tuple]:
        """(context, served certificate, key getter) of each TLS listener under ``stored``."""
        dynamic = self._decoded(stored)
        out = {}
        for name, protocol in listeners:
            if protocol in SECURE:
                get = self.getter(name, dynamic)
                out[name] = (tls.server_context(get), tls.keystore_certificate(get), get)
        return out

    def contexts(self, listeners, stored: dict[str, str]) -> dict[str, object]:
        """New server contexts of the TLS listeners among ``listeners`` ((name, security protocol)
        pairs), by name, under the per-broker dynamic configs ``stored``; ConfigError (naming the key)
        if one cannot be built or its certificate may not replace the one served."""
        built = self._build(listeners, stored)
        for name, (_ctx, cert, get) in built.items():
            old = self.served.get(name)
            if old is not None and cert is not None:
                check_replacement(old, cert, get)
        return {name: ctx for name, (ctx, _cert, _get) in built.items()}

    def load(self, listeners, stored: dict[str, str]) -> None:
        """At start: the stored dynamic values, unless they do not make a context (a keystore file gone
        since), in which case the static configs serve, as Kafka ignores an invalid dynamic config."""
        built = None
        if self._decoded(stored):
            try:
                built = self._build(listeners, stored)
            except ConfigError as e:
                log.error("ignoring the dynamic TLS configs of this broker in /config/brokers: %s", e)
            else:
                self.dynamic = self._decoded(stored)
        if built is None:
            built = self._build(listeners, {})
        self.served = {name: cert for name, (_ctx, cert, _get) in built.items()}

    def apply(self, listeners, stored: dict[str, str]) -> None:
        """Serve new connections of the server's ``listeners`` (network.server.Listener) with contexts
        from ``stored``, which ``contexts`` validated before it was stored."""
        built = self._build([(l.name, l.security_protocol) for l in listeners], stored)
        for l in listeners:
            if l.name in built:
                l.ssl_context, self.served[l.name], _get = built[l.name]
        self.dynamic = self._decoded(stored)
        if built:
            log.info("TLS listeners %s serve new connections with the dynamic keystore/truststore configs",
                     ", ".join(sorted(built)))


def _alt_names(cert) -> frozenset:
    from cryptography import x509
    try:
        return frozenset(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)
    except x509.ExtensionNotFound:
        return frozenset()


def _show(names) -> str:
    return "[" + ", ".join(sorted(f"{type(n).__name__}:{n.value}" for n in names)) + "]"


def check_replacement(old, new, get) -> None:
    """ConfigError naming the key that would allow it when certificate ``new`` may not replace ``old``:
    a different subject (compared as names, or as RFC 2253 strings ignoring case), or a SubjectAltName
    of ``old`` that ``new`` lacks."""
    if not get("ssl.allow.dn.changes") and old.subject != new.subject and \
            old.subject.rfc4514_string().lower() != new.subject.rfc4514_string().lower():
        raise ConfigError(f"Keystore DistinguishedName does not match: existing={{DN={old.subject.rfc4514_string()}}}, "
                          f"new={{DN={new.subject.rfc4514_string()}}} (ssl.allow.dn.changes is false)",
                          "ssl.allow.dn.changes")
    old_names, new_names = _alt_names(old), _alt_names(new)
    if not get("ssl.allow.san.changes") and not old_names <= new_names:
        raise ConfigError(f"Keystore SubjectAltNames do not match: existing={{SAN={_show(old_names)}}}, "
                          f"new={{SAN={_show(new_names)}}} (ssl.allow.san.changes is false)",
                          "ssl.allow.san.changes")
