"""The leader's half of the log API's own serving certificate: the Secret (`servingcert.py`
names its keys) made when missing, renewed when `core.servingcert` says it is due, and its CA
bundle put into the operator's own APIService (`spec.caBundle` of that one name only; RBAC
allows no other). Keys are ECDSA P-256, signatures SHA-256.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from slurmjob_operator.config import Settings
from slurmjob_operator.core.servingcert import (
    Authority,
    Held,
    Leaf,
    Plan,
    authority_window,
    leaf_window,
    plan,
)
from slurmjob_operator.servingcert import (
    CA_CRT,
    CA_KEY,
    SECRET_TYPE,
    TLS_CRT,
    TLS_KEY,
    Pem,
    SecretReader,
    bundle_key_ids,
    certificates,
    key_id,
    operator_namespace,
    serving_pair,
)
from slurmjob_operator.times import utc_now

log = logging.getLogger(__name__)

#: Seconds between two checks by the leader (two GETs): a caBundle taken away (an upgrade
#: from the admin's certificate mode) is put back within this. After a lost write race the next
#: check is sooner; after failures, later each time, up to the interval.
KEEPER_INTERVAL = 60.0
KEEPER_RETRY = 5.0
MANAGED_BY = {"app.kubernetes.io/managed-by": "slurmjob-operator"}
_USAGES = (
    "digital_signature",
    "content_commitment",
    "key_encipherment",
    "data_encipherment",
    "key_agreement",
    "key_cert_sign",
    "crl_sign",
    "encipher_only",
    "decipher_only",
)


class CertStore(SecretReader, Protocol):
    async def write_secret(
        self,
        namespace: str,
        name: str,
        data: Mapping[str, bytes],
        *,
        type_: str,
        labels: Mapping[str, str],
        resource_version: str | None,
    ) -> bool: ...

    async def apiservice_ca_bundle(self, name: str) -> bytes | None: ...

    async def set_apiservice_ca_bundle(self, name: str, bundle: bytes) -> bool: ...


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _usage(**on: bool) -> x509.KeyUsage:
    return x509.KeyUsage(**{n: on.get(n, False) for n in _USAGES})


def _authority(now: datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    # A name of its own per CA: during an overlap two CAs are in the bundle at once.
    cn = f"slurmjob-operator-logs-ca@{int(now.timestamp())}-{secrets.token_hex(4)}"
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    start, end = authority_window(now)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            _usage(digital_signature=True, key_cert_sign=True, crl_sign=True), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _leaf(
    ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, names: list[str], now: datetime
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    start, end = leaf_window(_authority_of(ca), now)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(digital_signature=True), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def _authority_of(cert: x509.Certificate) -> Authority:
    return Authority(key_id(cert.public_key()), cert.not_valid_before_utc, cert.not_valid_after_utc)


def _issuer(cert: x509.Certificate, cas: Mapping[str, x509.Certificate]) -> str | None:
    for kid, ca in cas.items():
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            continue
        return kid
    return None


@dataclass
class Material:
    """The Secret's data parsed: what `core.servingcert.plan` reads, and what stays as it is."""

    cas: dict[str, x509.Certificate] = field(default_factory=dict)
    signer_key: ec.EllipticCurvePrivateKey | None = None
    held: Held = field(default_factory=Held)
    tls: Pem = (b"", b"")

    @classmethod
    def read(cls, data: Mapping[str, bytes]) -> Material:
        cas = {key_id(c.public_key()): c for c in certificates(data.get(CA_CRT, b""))}
        signer_key: ec.EllipticCurvePrivateKey | None = None
        signer = None
        try:
            private = serialization.load_pem_private_key(data.get(CA_KEY, b""), password=None)
        except (ValueError, TypeError):
            private = None
        if isinstance(private, ec.EllipticCurvePrivateKey) and key_id(private.public_key()) in cas:
            signer_key, signer = private, key_id(private.public_key())
        tls = (data.get(TLS_CRT, b""), data.get(TLS_KEY, b""))
        held = Held(tuple(_authority_of(c) for c in cas.values()), signer, _read_leaf(tls, cas))
        return cls(cas, signer_key, held, tls)

    def written(self, step: Plan, names: list[str], now: datetime) -> dict[str, bytes]:
        """The Secret's data after `step`."""
        cas = [self.cas[k] for k in step.keep]
        key = self.signer_key
        signer = self.cas.get(self.held.signer or "")
        if step.new_authority or signer is None or key is None:
            signer, key = _authority(now)
            cas.append(signer)
        tls = self.tls
        if step.issue_leaf:
            cert, cert_key = _leaf(signer, key, names, now)
            tls = (_pem(cert), _key_pem(cert_key))
        bundle = b"".join(_pem(c) for c in cas)
        return {TLS_CRT: tls[0], TLS_KEY: tls[1], CA_CRT: bundle, CA_KEY: _key_pem(key)}


def _read_leaf(tls: Pem, cas: Mapping[str, x509.Certificate]) -> Leaf | None:
    try:
        cert = x509.load_pem_x509_certificate(tls[0])
    except ValueError:
        return None
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = frozenset(san.get_values_for_type(x509.DNSName))
    except (x509.ExtensionNotFound, ValueError):
        names = frozenset()
    return Leaf(
        issuer=_issuer(cert, cas),
        not_before=cert.not_valid_before_utc,
        not_after=cert.not_valid_after_utc,
        dns_names=names,
        key_matches=serving_pair(tls[0], tls[1]) is not None,
    )


def dns_names(service: str, namespace: str) -> list[str]:
    """The names the aggregator checks (`<service>.<namespace>.svc`) and the long form."""
    return [f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


class CertKeeper:
    """The leader's half: the Secret made when missing and renewed when due (`core.servingcert`
    decides), the bundle put into the APIService `apiservice` (None: none to patch)."""

    def __init__(
        self,
        store: CertStore,
        *,
        namespace: str,
        secret: str,
        service: str,
        apiservice: str | None,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.store, self.namespace, self.secret = store, namespace, secret
        self.apiservice = apiservice
        self.names = dns_names(service, namespace)
        self._clock = clock

    async def _published(self) -> tuple[frozenset[str] | None, bytes | None]:
        """The key ids the APIService trusts and its bundle; (None, None) when there is no
        APIService to wait for; an empty set when it cannot be read."""
        if not self.apiservice:
            return None, None
        try:
            bundle = await self.store.apiservice_ca_bundle(self.apiservice)
        except Exception as exc:
            log.warning("APIService %s: %s", self.apiservice, exc)
            return frozenset(), None
        if bundle is None:
            return None, None
        return bundle_key_ids(bundle), bundle

    async def step(self) -> bool:
        """One check; False when another writer changed the Secret first (look again soon)."""
        now = self._clock()
        found = await self.store.get_secret(self.namespace, self.secret)
        data, version = found if found is not None else ({}, None)
        material = Material.read(data)
        published, bundle = await self._published()
        decided = plan(material.held, frozenset(self.names), now, published)
        if decided.changes:
            data = material.written(decided, self.names, now)
            written = await self.store.write_secret(
                self.namespace,
                self.secret,
                data,
                type_=SECRET_TYPE,
                labels=MANAGED_BY,
                resource_version=version,
            )
            if not written:
                return False
            log.info(
                "serving certificate Secret %s/%s written: %s",
                self.namespace,
                self.secret,
                "; ".join(decided.reasons),
            )
        wanted = data.get(CA_CRT, b"")
        if self.apiservice and bundle is not None and bundle != wanted:
            await self.store.set_apiservice_ca_bundle(self.apiservice, wanted)
            log.info("APIService %s: caBundle updated", self.apiservice)
        return True

    async def run(self, interval: float = KEEPER_INTERVAL, retry: float = KEEPER_RETRY) -> None:
        """Check every `interval` seconds until cancelled."""
        failures = 0
        while True:
            try:
                done = await self.step()
                failures = 0
            except Exception as exc:  # the apiserver away, a refusal: try again later
                log.warning(
                    "serving certificate Secret %s/%s: %s", self.namespace, self.secret, exc
                )
                done = False
                failures += 1
            await asyncio.sleep(interval if done else min(interval, retry * 2 ** min(failures, 8)))


def cert_keeper_from_settings(settings: Settings, kube: CertStore) -> CertKeeper | None:
    """The leader's keeper of the operator's own certificate: only with the log API on and
    SLURMJOB_LOGS_CERT_SECRET set."""
    if not (settings.logs_port and settings.logs_cert_secret):
        return None
    return CertKeeper(
        kube,
        namespace=operator_namespace(settings),
        secret=settings.logs_cert_secret,
        service=settings.logs_service,
        apiservice=settings.logs_apiservice,
    )
