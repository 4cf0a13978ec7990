"""TLS of the log API (`logserver.py`): whom it trusts and what it presents.

* `FrontProxyTrust` keeps the requestheader trust (`core.requestheader`) read from the
  ConfigMap `kube-system/extension-apiserver-authentication`, read again every
  `TRUST_POLL` seconds: the kube-apiserver rewrites it when its front-proxy CA, allowed
  names or header names change. A ConfigMap that is gone trusts nobody; one that cannot be
  read (the apiserver away, a missing right) or whose content is broken keeps the last good
  trust, as Kubernetes' own dynamic CA loading does.
* `TlsContexts` gives the server context a new connection is handshaken with: the serving
  certificate (`pem()` of a `ServingCertSource`, taken again when its `generation` changes)
  and the CA client certificates must chain to. A context is made per (certificate
  generation, CA bundle) and kept while both hold, so a new CA or certificate takes effect
  for the next connection. OpenSSL's verification store only ever grows
  (`load_verify_locations` adds), hence a new context rather than a changed one; and since a
  connection's context is fixed at its handshake, `trusts` tells the server whether the CA
  that context checked is still the trusted one (a kept-alive connection of a CA since
  removed is refused).

A client certificate is requested but not required, so that a connection without one gets a
401 (as Kubernetes answers) rather than a failed handshake; one that does not chain to the
CA fails the handshake. No session is resumed (no tickets): each connection is verified.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import tempfile
import weakref
from pathlib import Path
from typing import Protocol

from slurmjob_operator.core.requestheader import (
    CONFIGMAP_NAME,
    CONFIGMAP_NAMESPACE,
    RequestHeaderTrust,
    TrustError,
)
from slurmjob_operator.kube import ConfigMapUnavailable

log = logging.getLogger(__name__)

#: Seconds between two reads of the ConfigMap: a rotated front-proxy CA is trusted (and a
#: removed one refused) within this.
TRUST_POLL = 10.0
#: Seconds one read of the ConfigMap may take.
TRUST_READ_TIMEOUT = 10.0


class ConfigMapReader(Protocol):
    async def read_configmap(self, namespace: str, name: str) -> dict[str, str] | None: ...


class ServingCertSource(Protocol):
    """The serving certificate (`servingcert.ServingCert`): the PEM chain and key, None while
    there is none yet; `generation` changes whenever they do."""

    def pem(self) -> tuple[bytes, bytes] | None: ...

    @property
    def generation(self) -> int: ...


class FrontProxyTrust:
    """The requestheader trust as last read (None: nobody is trusted)."""

    def __init__(
        self,
        reader: ConfigMapReader,
        *,
        interval: float = TRUST_POLL,
        read_timeout: float = TRUST_READ_TIMEOUT,
    ) -> None:
        self._reader = reader
        self.interval = interval
        self._read_timeout = read_timeout
        self.current: RequestHeaderTrust | None = None
        self._problem = ""

    async def refresh(self) -> None:
        """Read the ConfigMap once and take what it says (see the module's docstring)."""
        try:
            async with asyncio.timeout(self._read_timeout):
                data = await self._reader.read_configmap(CONFIGMAP_NAMESPACE, CONFIGMAP_NAME)
        except (ConfigMapUnavailable, TimeoutError) as exc:
            self._warn(f"cannot read it ({str(exc) or 'timed out'}); the last trust read is kept")
            return
        if data is None:
            self._take(None, "it does not exist: no client certificate is trusted")
            return
        try:
            trust = RequestHeaderTrust.from_configmap(data)
            if trust is not None:
                _check_bundle(trust.ca_pem)
        except (TrustError, ssl.SSLError, ValueError) as exc:
            self._warn(f"its content is refused ({exc}); the last trust read is kept")
            return
        if trust is None:
            self._take(None, "it names no requestheader CA: no client certificate is trusted")
            return
        self._take(trust, "")

    async def run(self) -> None:
        """Read it again every `interval` seconds, until cancelled."""
        while True:
            await asyncio.sleep(self.interval)
            await self.refresh()

    def _take(self, trust: RequestHeaderTrust | None, problem: str) -> None:
        if trust != self.current:
            log.info(
                "front-proxy trust from ConfigMap %s/%s: %s",
                CONFIGMAP_NAMESPACE,
                CONFIGMAP_NAME,
                "changed" if trust is not None else "none",
            )
        self.current = trust
        if problem:
            self._warn(problem)
        else:
            self._problem = ""

    def _warn(self, problem: str) -> None:
        # Once per problem, not once per poll.
        if problem != self._problem:
            self._problem = problem
            log.warning("ConfigMap %s/%s: %s", CONFIGMAP_NAMESPACE, CONFIGMAP_NAME, problem)


class TlsContexts:
    """The server context for the next connection (None: no certificate to serve yet)."""

    def __init__(self, cert: ServingCertSource, trust: FrontProxyTrust) -> None:
        self._cert = cert
        self._trust = trust
        self._key: tuple[int, str] | None = None
        self._failed: tuple[int, str] | None = None
        self._context: ssl.SSLContext | None = None
        self._chain: tuple[bytes, bytes] | None = None
        self._generation: int | None = None
        # The CA bundle each context still in use was made with.
        self._cas: weakref.WeakKeyDictionary[ssl.SSLContext, str] = weakref.WeakKeyDictionary()
        self._problem = ""

    def context(self) -> ssl.SSLContext | None:
        generation = self._cert.generation
        if generation != self._generation:
            self._generation = generation
            chain = self._cert.pem()
            if chain is not None:
                self._chain = chain
        if self._chain is None:
            self._warn("no serving certificate yet: connections are refused")
            return None
        trust = self._trust.current
        key = (generation, trust.ca_pem if trust is not None else "")
        if key not in (self._key, self._failed):
            try:
                context = server_context(*self._chain, ca_pem=key[1])
            except (ssl.SSLError, ValueError, OSError) as exc:
                # A broken new certificate: the one served so far stays.
                self._warn(f"cannot use the serving certificate ({exc})")
                self._failed = key
                return self._context
            self._key, self._context = key, context
            self._cas[context] = key[1]
            self._problem = ""
        return self._context

    def trusts(self, context: object, trust: RequestHeaderTrust) -> bool:
        """Whether a connection handshaken with `context` had its client certificate checked
        against `trust`'s CA bundle."""
        if not isinstance(context, ssl.SSLContext):
            return False
        made_with = self._cas.get(context)
        return made_with is not None and made_with == trust.ca_pem

    def _warn(self, problem: str) -> None:
        if problem != self._problem:
            self._problem = problem
            log.warning("log API: %s", problem)


def server_context(chain: bytes, key: bytes, *, ca_pem: str) -> ssl.SSLContext:
    """A TLS server context presenting `chain` (PEM, leaf first) with `key`, asking for a
    client certificate chaining to `ca_pem` (none: every client certificate fails)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_TICKET
    context.num_tickets = 0
    context.set_alpn_protocols(["http/1.1"])
    _load_chain(context, chain, key)
    context.verify_mode = ssl.CERT_OPTIONAL
    if ca_pem:
        context.load_verify_locations(cadata=ca_pem)
    return context


def _check_bundle(ca_pem: str) -> None:
    """SSLError or ValueError when `ca_pem` holds no certificate OpenSSL reads."""
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    probe.load_verify_locations(cadata=ca_pem)
    if not probe.get_ca_certs():
        raise ValueError("no CA certificate in the bundle")


def _load_chain(context: ssl.SSLContext, chain: bytes, key: bytes) -> None:
    """`load_cert_chain` reads files only: the key is handed over in an anonymous memory file
    (Linux), never written to a disk; elsewhere in a private temporary directory."""
    pem = chain.rstrip(b"\n") + b"\n" + key
    memfd = getattr(os, "memfd_create", None)
    if memfd is not None:
        fd = memfd("slurmjob-serving-cert", getattr(os, "MFD_CLOEXEC", 0))
        try:
            with open(fd, "wb", closefd=False) as file:
                file.write(pem)
            context.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        return
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "tls.pem"
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with open(descriptor, "wb") as file:
            file.write(pem)
        try:
            context.load_cert_chain(path)
        finally:
            with contextlib.suppress(OSError):
                path.unlink()
