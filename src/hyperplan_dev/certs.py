"""Certificates and keys for the local control plane, made with the project's own code.

One CA signs a serving certificate for kube-apiserver and a client certificate for the
admin (group ``system:masters``); an RSA key pair signs service-account tokens.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

API_SERVER_DNS = (
    "localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
API_SERVER_IPS = ("127.0.0.1", "::1", "10.0.0.1")


@dataclass(frozen=True)
class Pki:
    dir: Path

    @property
    def ca_cert(self) -> Path: return self.dir / "ca.crt"
    @property
    def ca_key(self) -> Path: return self.dir / "ca.key"
    @property
    def serving_cert(self) -> Path: return self.dir / "apiserver.crt"
    @property
    def serving_key(self) -> Path: return self.dir / "apiserver.key"
    @property
    def admin_cert(self) -> Path: return self.dir / "admin.crt"
    @property
    def admin_key(self) -> Path: return self.dir / "admin.key"
    @property
    def sa_key(self) -> Path: return self.dir / "sa.key"
    @property
    def sa_pub(self) -> Path: return self.dir / "sa.pub"


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _write_key(path: Path, key: rsa.RSAPrivateKey) -> None:
    path.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption()))
    path.chmod(0o600)


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _sign(subject: x509.Name, key: rsa.RSAPrivateKey, issuer: x509.Name,
          issuer_key: rsa.RSAPrivateKey, *, ca: bool, sans: list[x509.GeneralName] | None = None,
          usages: list[x509.ObjectIdentifier] | None = None) -> x509.Certificate:
    now = dt.datetime.now(dt.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject).issuer_name(issuer).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_encipherment=not ca, key_cert_sign=ca, crl_sign=ca,
            content_commitment=False, data_encipherment=False, key_agreement=False,
            encipher_only=False, decipher_only=False), critical=True)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def generate(directory: Path) -> Pki:
    """Write a fresh CA, serving, admin and service-account material into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(directory)
    ca_key = _key()
    ca_name = _name("hyperplan-dev-ca")
    _write_key(pki.ca_key, ca_key)
    _write_cert(pki.ca_cert, _sign(ca_name, ca_key, ca_name, ca_key, ca=True))

    serving_key = _key()
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in API_SERVER_DNS]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in API_SERVER_IPS]
    _write_key(pki.serving_key, serving_key)
    _write_cert(pki.serving_cert, _sign(
        _name("kube-apiserver"), serving_key, ca_name, ca_key, ca=False, sans=sans,
        usages=[ExtendedKeyUsageOID.SERVER_AUTH]))

    admin_key = _key()
    _write_key(pki.admin_key, admin_key)
    _write_cert(pki.admin_cert, _sign(
        _name("hyperplan-admin", "system:masters"), admin_key, ca_name, ca_key, ca=False,
        usages=[ExtendedKeyUsageOID.CLIENT_AUTH]))

    sa_key = _key()
    _write_key(pki.sa_key, sa_key)
    pki.sa_pub.write_bytes(sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return pki


def issue_serving_cert(pki: Pki, common_name: str, ips: tuple[str, ...], directory: Path) -> tuple[Path, Path]:
    """A serving certificate for ``ips`` signed by the plane's CA: ``directory/tls.{crt,key}``.

    For servers the API server calls back (Kueue's webhooks on loopback): the API server
    trusts them through the CA bundle of the webhook configuration, which is ``pki.ca_cert``.
    """
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    directory.mkdir(parents=True, exist_ok=True)
    key = _key()
    cert, key_path = directory / "tls.crt", directory / "tls.key"
    _write_key(key_path, key)
    _write_cert(cert, _sign(
        _name(common_name), key, ca_cert.subject, ca_key, ca=False,
        sans=[x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips],
        usages=[ExtendedKeyUsageOID.SERVER_AUTH]))
    return cert, key_path
