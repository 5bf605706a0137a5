"""Certificates for a local cluster and for tests, made with ``cryptography``: a CA, then keys and
certificates it signs (servers naming their hosts in subjectAltName, clients for mTLS), written as
PEM files (key + chain in one file: Kafka's PEM keystore) and, on request, as a PKCS12 keystore."""
from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 825
LOOPBACK = ("127.0.0.1", "localhost")      # the names a client on this host dials a local broker by


def _name(dn: dict[str, str]) -> x509.Name:
    """``dn`` in RFC 2253 order (CN first), stored most significant first as certificates do."""
    oids = {"CN": NameOID.COMMON_NAME, "OU": NameOID.ORGANIZATIONAL_UNIT_NAME, "O": NameOID.ORGANIZATION_NAME,
            "C": NameOID.COUNTRY_NAME}
    return x509.Name([x509.NameAttribute(oids[k], v) for k, v in reversed(dn.items())])


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


@dataclass
class CA:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @classmethod
    def create(cls, common_name: str = "kbroker local CA") -> "CA":
        key = ec.generate_private_key(ec.SECP256R1())
        name = _name({"CN": common_name})
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False,
                                             encipher_only=False, decipher_only=False), critical=True)
                .sign(key, hashes.SHA256()))
        return cls(key, cert)

    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, dn: dict[str, str], hosts: list[str] = (), client: bool = False):
        """(key, certificate) for ``dn``; ``hosts`` (names and IP addresses) go into subjectAltName."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        b = (x509.CertificateBuilder().subject_name(_name(dn)).issuer_name(self.cert.subject)
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(minutes=5))
             .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
             .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH] if client else
                                                  [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                            critical=False))
        if hosts:
            alt = []
            for h in hosts:
                try:
                    alt.append(x509.IPAddress(ipaddress.ip_address(h)))
                except ValueError:
                    alt.append(x509.DNSName(h))
            b = b.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        return key, b.sign(self.key, hashes.SHA256())

    def write_pem_keystore(self, path: Path, key, cert, password: str | None = None) -> Path:
        """Kafka's PEM keystore: the private key (encrypted when ``password``) then the chain."""
        enc = (serialization.BestAvailableEncryption(password.encode()) if password
               else serialization.NoEncryption())
        data = (key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc)
                + cert.public_bytes(serialization.Encoding.PEM) + self.pem())
        _write_private(Path(path), data)
        return Path(path)

    def write_pkcs12(self, path: Path, key, cert, password: str, alias: str = "kbroker") -> Path:
        data = pkcs12.serialize_key_and_certificates(alias.encode(), key, cert, [self.cert],
                                                     serialization.BestAvailableEncryption(password.encode()))
        _write_private(Path(path), data)
        return Path(path)

    def issue_to(self, path: Path, dn: dict[str, str], hosts: list[str] = (), client: bool = False,
                 password: str | None = None, pkcs12_password: str | None = None):
        """Issue for ``dn`` and write the PEM keystore ``path`` (and, with ``pkcs12_password``, the PKCS12
        keystore beside it, ``.p12``); returns (key, certificate)."""
        key, cert = self.issue(dn, hosts, client)
        self.write_pem_keystore(path, key, cert, password)
        if pkcs12_password is not None:
            self.write_pkcs12(Path(path).with_suffix(".p12"), key, cert, pkcs12_password)
        return key, cert


def loopback_pki(folder: Path, name: str = "broker", password: str | None = None,
                 pkcs12_password: str | None = None, ca_name: str = "kbroker local CA") -> CA:
    """A new CA in ``folder/ca.pem`` and a server certificate for ``CN=<name>`` on loopback
    (127.0.0.1, localhost) in ``folder/<name>.pem`` (and ``<name>.p12`` with ``pkcs12_password``).
    Returns the CA, to issue more (clients, a second server)."""
    folder = Path(folder)
    ca = CA.create(ca_name)
    (folder / "ca.pem").write_bytes(ca.pem())
    ca.issue_to(folder / f"{name}.pem", {"CN": name}, list(LOOPBACK), password=password,
                pkcs12_password=pkcs12_password)
    return ca
