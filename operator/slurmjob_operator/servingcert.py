"""The log API's serving certificate: where the log server (`logserver.py`) takes it from.

Two sources, both read by every replica:

* `FileServingCert`: a certificate and key mounted as files (cert-manager's Secret, or one the
  admin gives), re-read when they change, looked at no more than once a second.
* `SecretServingCert`: the operator's own, in a Secret of its namespace (type
  kubernetes.io/tls: `tls.crt`, `tls.key`, and `ca.crt` with every CA the apiserver is to
  trust, `ca.key` the newest CA's key), read through the API every `SECRET_REREAD` seconds.

The leader keeps that Secret (`certkeeper.py`; `core/servingcert.py` decides when).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes

from slurmjob_operator.config import Settings

log = logging.getLogger(__name__)

SECRET_TYPE = "kubernetes.io/tls"  # noqa: S105 (a type, not a secret)
TLS_CRT, TLS_KEY, CA_CRT, CA_KEY = "tls.crt", "tls.key", "ca.crt", "ca.key"
#: Seconds between two reads of the Secret by a replica (a renewal is picked up within this),
#: and between two attempts while it is missing or unreadable.
SECRET_REREAD = 30.0
SECRET_RETRY = 2.0
#: Seconds between two looks at mounted files.
FILE_RECHECK = 1.0
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

Pem = tuple[bytes, bytes]


class ServingCert(Protocol):
    def pem(self) -> Pem | None:
        """(certificate chain, private key) in PEM; None: none yet."""
        ...

    @property
    def generation(self) -> int:
        """Bumped whenever `pem()` changes."""
        ...


# -- reading PEM -------------------------------------------------------------------------------


def key_id(public_key: PublicKeyTypes) -> str:
    """A digest of a public key: what tells CAs (and a certificate's key) apart."""
    der = public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(der).hexdigest()[:40]


def serving_pair(chain: bytes, key: bytes) -> Pem | None:
    """The pair when both parse and the key is the first certificate's; None otherwise (a
    file half rewritten, a key of another certificate)."""
    try:
        cert = x509.load_pem_x509_certificate(chain)
        private = serialization.load_pem_private_key(key, password=None)
    except (ValueError, TypeError):
        return None
    if key_id(cert.public_key()) != key_id(private.public_key()):
        return None
    return chain, key


def certificates(data: bytes) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(data) if data.strip() else []
    except ValueError:
        return []


def bundle_key_ids(bundle: bytes) -> frozenset[str]:
    return frozenset(key_id(c.public_key()) for c in certificates(bundle))


def load_into(context: ssl.SSLContext, pair: Pem) -> None:
    """`context.load_cert_chain` from memory: the ssl module reads files only, so the pair
    goes through a private directory that is removed at once."""
    with tempfile.TemporaryDirectory(prefix="slurmjob-tls-") as tmp:
        cert, key = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
        cert.write_bytes(pair[0])
        key.touch(mode=0o600)
        key.write_bytes(pair[1])
        context.load_cert_chain(cert, key)


async def ready(cert: ServingCert, within: float, poll: float = 0.1) -> bool:
    """Wait until `cert` has a pair (the first read of a Secret is in the background)."""
    deadline = time.monotonic() + within
    while cert.pem() is None:
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(poll)
    return True


# -- the sources -------------------------------------------------------------------------------


class FileServingCert:
    """A certificate and key in files; re-read when either changes (the kubelet swaps a
    mounted Secret's files at once), looked at no more than once per `recheck` seconds."""

    def __init__(
        self,
        cert_file: Path,
        key_file: Path,
        *,
        recheck: float = FILE_RECHECK,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cert_file, self.key_file = cert_file, key_file
        self._recheck, self._clock = recheck, clock
        self._looked: float | None = None
        self._seen: tuple[tuple[int, int, int, int], ...] | None = None
        self._refused: tuple[tuple[int, int, int, int], ...] | None = None
        self._pem: Pem | None = None
        self._generation = 0

    def _stat(self) -> tuple[tuple[int, int, int, int], ...] | None:
        try:
            stats = [p.stat() for p in (self.cert_file, self.key_file)]
        except OSError:
            return None
        return tuple((s.st_dev, s.st_ino, s.st_mtime_ns, s.st_size) for s in stats)

    def _look(self) -> None:
        now = self._clock()
        if self._looked is not None and now - self._looked < self._recheck:
            return
        self._looked = now
        seen = self._stat()
        if seen is None or seen == self._seen:
            return
        try:
            pair = serving_pair(self.cert_file.read_bytes(), self.key_file.read_bytes())
        except OSError:
            pair = None
        if pair is None:  # mid-rewrite or wrong: keep what was served, look again later
            if seen != self._refused:
                log.warning("certificate files %s, %s unusable", self.cert_file, self.key_file)
                self._refused = seen
            return
        self._seen = seen
        if pair != self._pem:
            self._pem = pair
            self._generation += 1

    def pem(self) -> Pem | None:
        self._look()
        return self._pem

    @property
    def generation(self) -> int:
        self._look()
        return self._generation

    async def close(self) -> None:
        return None


class SecretReader(Protocol):
    async def get_secret(
        self, namespace: str, name: str
    ) -> tuple[dict[str, bytes], str] | None: ...


class SecretServingCert:
    """`tls.crt`/`tls.key` of the operator's own Secret, read in the background when asked for
    and older than `reread` seconds (`retry` while the Secret is missing)."""

    def __init__(
        self,
        store: SecretReader,
        namespace: str,
        name: str,
        *,
        reread: float = SECRET_REREAD,
        retry: float = SECRET_RETRY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store, self.namespace, self.name = store, namespace, name
        self._reread, self._retry, self._clock = reread, retry, clock
        self._due = float("-inf")
        self._task: asyncio.Task[None] | None = None
        self._pem: Pem | None = None
        self._generation = 0
        self._version = ""
        self._missing_told = False
        self._poke()  # made in the event loop (serve_logs): the first read starts at once

    async def refresh(self) -> None:
        """Read the Secret now; keep what was served when it is missing or unusable."""
        self._due = self._clock() + self._retry
        try:
            found = await self.store.get_secret(self.namespace, self.name)
        except Exception as exc:  # the apiserver away: serve on, try again soon
            log.warning("serving certificate Secret %s/%s: %s", self.namespace, self.name, exc)
            return
        if found is None:
            if not self._missing_told:  # the leader makes it: say so once, not every retry
                log.info(
                    "serving certificate Secret %s/%s not there yet", self.namespace, self.name
                )
                self._missing_told = True
            return
        data, version = found
        self._due = self._clock() + self._reread
        if version == self._version:
            return
        pair = serving_pair(data.get(TLS_CRT, b""), data.get(TLS_KEY, b""))
        if pair is None:
            log.warning("Secret %s/%s holds no usable certificate", self.namespace, self.name)
            return
        self._version = version
        if pair != self._pem:
            self._pem = pair
            self._generation += 1

    def _poke(self) -> None:
        if self._clock() < self._due or (self._task is not None and not self._task.done()):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._task = loop.create_task(self.refresh(), name=f"secret-{self.name}")

    def pem(self) -> Pem | None:
        self._poke()
        return self._pem

    @property
    def generation(self) -> int:
        self._poke()
        return self._generation

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


# -- from the settings -------------------------------------------------------------------------


def operator_namespace(settings: Settings, pod_namespace: Path = SERVICE_ACCOUNT_NAMESPACE) -> str:
    """SLURMJOB_POD_NAMESPACE, else the pod's own namespace in a cluster, else `default`."""
    if settings.pod_namespace:
        return settings.pod_namespace
    try:
        return pod_namespace.read_text(encoding="utf-8").strip() or "default"
    except OSError:
        return "default"


def serving_cert_from_settings(settings: Settings, kube: SecretReader) -> ServingCert | None:
    """The files when SLURMJOB_LOGS_TLS_CERT_FILE/_KEY_FILE are set, the operator's Secret when
    SLURMJOB_LOGS_CERT_SECRET is; None when neither is."""
    if settings.logs_tls_cert_file and settings.logs_tls_key_file:
        return FileServingCert(settings.logs_tls_cert_file, settings.logs_tls_key_file)
    if settings.logs_cert_secret:
        return SecretServingCert(kube, operator_namespace(settings), settings.logs_cert_secret)
    return None
