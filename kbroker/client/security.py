"""How kbroker's client reaches a secured listener: Kafka's client properties (``security.protocol``,
``ssl.*``, ``sasl.mechanism``, ``sasl.jaas.config``) turned into a TLS context and SASL credentials,
as the CLI's ``--command-config`` file and the broker's own inter-broker connections give them."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Mapping

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


def is_security_key(key: str) -> bool:
    """A client property that says how to connect (security.protocol, ssl.*, sasl.*)."""
    return key == "security.protocol" or key.startswith(("ssl.", "sasl."))


def security_from(props: Mapping[str, str], error=ValueError) -> "ClientSecurity":
    """The security part of a tool's client properties; ``error(message)`` is raised for a bad one."""
    from ..config import ConfigError
    try:
        return ClientSecurity.from_properties({k: v for k, v in props.items() if is_security_key(k)})
    except ConfigError as e:
        raise error(str(e)) from None

# username="..." / password="..." inside a JAAS line (PlainLoginModule / ScramLoginModule)
_JAAS_OPTION = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')


def jaas_options(text: str | None) -> dict[str, str]:
    """The quoted options of a JAAS config line: ``username``, ``password``, ``user_<name>``."""
    return {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _JAAS_OPTION.findall(text or "")}


@dataclass
class ClientSecurity:
    protocol: str = "PLAINTEXT"
    ssl_context: object = None          # ssl.SSLContext for SSL / SASL_SSL
    sasl_mechanism: str | None = None   # PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 (SASL_*)
    username: str | None = None
    password: str | None = None

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @classmethod
    def from_lookup(cls, get: Callable[[str], object], protocol: str | None = None, mechanism: str | None = None,
                    jaas: str | None = None) -> "ClientSecurity":
        """From Kafka's client keys read through ``get`` (None when unset); ``protocol``, ``mechanism``
        and ``jaas`` override ``security.protocol``, ``sasl.mechanism`` and ``sasl.jaas.config`` (a
        broker's own inter-broker connections take them from its listener settings)."""
        from ..config import ConfigError
        proto = (protocol or get("security.protocol") or "PLAINTEXT").upper()
        if proto not in PROTOCOLS:
            raise ConfigError(f"Invalid value {proto} for configuration security.protocol: "
                              f"String must be one of: {', '.join(PROTOCOLS)}", "security.protocol")
        out = cls(proto)
        if out.tls:
            from ..security.tls import client_context
            out.ssl_context = client_context(get)
        if out.sasl:
            out.sasl_mechanism = (mechanism or get("sasl.mechanism") or "GSSAPI").upper()
            opts = jaas_options(jaas if jaas is not None else get("sasl.jaas.config"))
            out.username, out.password = opts.get("username"), opts.get("password")
            if out.username is None or out.password is None:
                raise ConfigError("sasl.jaas.config must give username=\"...\" and password=\"...\"",
                                  "sasl.jaas.config")
        return out

    @classmethod
    def from_properties(cls, props: Mapping[str, str]) -> "ClientSecurity":
        """Kafka client properties (a ``--command-config`` file); ssl.endpoint.identification.algorithm
        defaults to https, as in Kafka's clients."""
        defaults = {"ssl.endpoint.identification.algorithm": "https", "ssl.truststore.type": "JKS",
                    "ssl.keystore.type": "JKS"}

        def get(key):
            v = props.get(key, defaults.get(key))
            if key in ("ssl.enabled.protocols", "ssl.cipher.suites") and isinstance(v, str):
                return [p.strip() for p in v.split(",") if p.strip()]
            return v
        return cls.from_lookup(get)
