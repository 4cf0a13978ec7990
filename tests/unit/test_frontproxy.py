"""controller.frontproxy: the trust read from the authentication ConfigMap (kept when it
cannot be read or does not parse, dropped when the ConfigMap is gone, one warning per
problem) and the TLS contexts (one per certificate generation and CA bundle, a broken new
certificate not taken, the key never written to a file where memory files exist)."""

from __future__ import annotations

import asyncio
import os
import ssl

import pytest

from slurmjob_operator.controller import frontproxy
from slurmjob_operator.controller.frontproxy import FrontProxyTrust, TlsContexts, server_context
from slurmjob_operator.kube import ConfigMapUnavailable

from .tlscerts import CA, FakeServingCert


class Reader:
    def __init__(self, data: dict[str, str] | None) -> None:
        self.data = data
        self.fail: Exception | None = None
        self.stall = False

    async def read_configmap(self, namespace: str, name: str) -> dict[str, str] | None:
        if self.stall:
            await asyncio.sleep(60)
        if self.fail is not None:
            raise self.fail
        return self.data


BAD_PEM = "-----BEGIN CERTIFICATE-----\nAA\n-----END CERTIFICATE-----\n"


def configmap(ca: CA) -> dict[str, str]:
    return {
        "requestheader-client-ca-file": ca.pem,
        "requestheader-username-headers": '["X-Remote-User"]',
    }


async def test_the_last_trust_is_kept_while_the_configmap_cannot_be_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ca = CA("front-proxy-ca")
    reader = Reader(configmap(ca))
    trust = FrontProxyTrust(reader, read_timeout=0.05)
    await trust.refresh()
    assert trust.current is not None
    kept = trust.current
    reader.fail = ConfigMapUnavailable("ConfigMap kube-system/x: HTTP 403 Forbidden")
    for _ in range(3):
        await trust.refresh()
    assert trust.current is kept
    assert caplog.text.count("HTTP 403 Forbidden") == 1  # once per problem, not per poll
    reader.fail, reader.stall = None, True
    await trust.refresh()
    assert trust.current is kept
    assert "timed out" in caplog.text
    reader.stall = False
    reader.data = None
    await trust.refresh()
    assert trust.current is None


@pytest.mark.parametrize(
    "broken",
    [
        {"requestheader-client-ca-file": BAD_PEM},
        {"requestheader-client-ca-file": "no PEM here"},
        {"requestheader-username-headers": "X-Remote-User"},
    ],
)
async def test_a_broken_configmap_keeps_the_last_trust(broken: dict[str, str]) -> None:
    ca = CA("front-proxy-ca")
    reader = Reader(configmap(ca))
    trust = FrontProxyTrust(reader)
    await trust.refresh()
    kept = trust.current
    reader.data = {**configmap(ca), **broken}
    await trust.refresh()
    assert trust.current is kept


async def test_a_context_per_certificate_and_ca_and_the_trust_it_was_made_with() -> None:
    serving_ca, proxy_ca = CA("serving"), CA("front-proxy-ca")
    reader = Reader(configmap(proxy_ca))
    trust = FrontProxyTrust(reader)
    await trust.refresh()
    cert = FakeServingCert(serving_ca.issue("logs", server=True))
    contexts = TlsContexts(cert, trust)
    first = contexts.context()
    assert first is not None
    assert contexts.context() is first  # nothing changed: the same context
    assert trust.current is not None
    assert contexts.trusts(first, trust.current)
    reader.data = configmap(CA("front-proxy-ca-2"))
    await trust.refresh()
    second = contexts.context()
    assert second is not None
    assert second is not first
    assert trust.current is not None
    assert contexts.trusts(second, trust.current)
    assert not contexts.trusts(first, trust.current)
    assert not contexts.trusts(object(), trust.current)


async def test_a_broken_new_certificate_is_not_taken(caplog: pytest.LogCaptureFixture) -> None:
    serving_ca = CA("serving")
    trust = FrontProxyTrust(Reader(None))
    cert = FakeServingCert(serving_ca.issue("logs", server=True))
    contexts = TlsContexts(cert, trust)
    served = contexts.context()
    good, other = serving_ca.issue("logs", server=True), serving_ca.issue("other", server=True)
    cert.issued = None
    cert.replace(good)
    cert.issued = type(good)(good.cert, good.cert_pem, other.key_pem)  # a key of another
    for _ in range(3):
        assert contexts.context() is served
    assert caplog.text.count("cannot use the serving certificate") == 1
    cert.replace(good)
    assert contexts.context() not in (None, served)


def test_the_key_goes_through_a_memory_file_or_a_private_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: os.PathLike[str]
) -> None:
    pair = CA("serving").issue("logs", server=True).pair
    written: list[str] = []
    real_open = os.open

    def spy(path: str, *args: object, **kwargs: object) -> int:
        if str(path).endswith(".pem"):
            written.append(str(path))
        return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(frontproxy.os, "open", spy)
    assert isinstance(server_context(*pair, ca_pem=""), ssl.SSLContext)
    assert written == []  # Linux: a memfd, no file
    monkeypatch.delattr(frontproxy.os, "memfd_create")
    assert isinstance(server_context(*pair, ca_pem=""), ssl.SSLContext)
    assert len(written) == 1
    assert not os.path.exists(written[0])  # removed at once


def test_a_server_context_asks_for_a_client_certificate_and_resumes_nothing() -> None:
    pair = CA("serving").issue("logs", server=True).pair
    context = server_context(*pair, ca_pem=CA("front-proxy-ca").pem)
    assert context.verify_mode == ssl.CERT_OPTIONAL
    assert context.num_tickets == 0
    assert context.options & ssl.OP_NO_TICKET
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert len(context.get_ca_certs()) == 1
