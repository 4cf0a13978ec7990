"""Certificates for tests on real TLS sockets: CAs, the front proxy's client certificates and
serving certificates for 127.0.0.1, made with `cryptography` (EC P-256: fast)."""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Issued:
    cert: x509.Certificate
    cert_pem: bytes
    key_pem: bytes

    @property
    def pair(self) -> tuple[bytes, bytes]:
        return self.cert_pem, self.key_pem

    @property
    def der(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.DER)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


class CA:
    def __init__(self, name: str) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )

    @property
    def pem(self) -> str:
        return self.cert.public_bytes(serialization.Encoding.PEM).decode()

    def issue(self, cn: str, *, server: bool = False) -> Issued:
        """A client certificate (the front proxy's) or, `server`, one for 127.0.0.1."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(cn))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False,
            )
        cert = builder.sign(self.key, hashes.SHA256())
        return Issued(cert, cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def client_context(server_ca: CA, client: Issued | None = None) -> ssl.SSLContext:
    """A client trusting `server_ca`, presenting `client` when given."""
    context = ssl.create_default_context(cadata=server_ca.pem)
    if client is not None:
        fd = os.memfd_create("test-client-cert")
        try:
            os.write(fd, client.cert_pem + client.key_pem)
            context.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
    return context


class FakeServingCert:
    """A ServingCert whose pair the test swaps."""

    def __init__(self, issued: Issued | None) -> None:
        self.issued = issued
        self.generation = 1
        self.closed = False

    def pem(self) -> tuple[bytes, bytes] | None:
        return self.issued.pair if self.issued is not None else None

    def replace(self, issued: Issued) -> None:
        self.issued = issued
        self.generation += 1

    async def close(self) -> None:
        self.closed = True
