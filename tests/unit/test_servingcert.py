"""The log API's serving certificate with real keys and certificates: the leader's keeper
(creation, renewal, the CA rotated with both CAs in the bundle, the caBundle of its own
APIService only) on an in-memory store and a fake clock, every result checked by a real TLS
handshake verified as the aggregator does (the CA bundle, the Service's DNS name); and the two
sources the log server reads (files, the Secret)."""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Mapping
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509 import verification

from slurmjob_operator.certkeeper import CertKeeper, cert_keeper_from_settings, dns_names
from slurmjob_operator.config import Settings
from slurmjob_operator.core.servingcert import CA_LIFETIME, CA_ROTATE_BEFORE, SETTLE
from slurmjob_operator.servingcert import (
    CA_CRT,
    CA_KEY,
    SECRET_TYPE,
    TLS_CRT,
    TLS_KEY,
    FileServingCert,
    SecretServingCert,
    certificates,
    key_id,
    load_into,
    operator_namespace,
    ready,
    serving_cert_from_settings,
)
from slurmjob_operator.times import utc_now

NS, SECRET, SERVICE = "slurmjob-system", "sj-logs-cert", "sj-logs"
OWN, OTHER = "v1alpha1.logs.slurmjob.io", "v1beta1.metrics.k8s.io"
HOST = f"{SERVICE}.{NS}.svc"
# Real TLS handshakes check validity on the real clock: the simulation starts now.
START = utc_now().replace(microsecond=0)
DAY = timedelta(days=1)


class Store:
    """Secrets and APIServices as the apiserver keeps them (resourceVersion checked)."""

    def __init__(self) -> None:
        self.secrets: dict[tuple[str, str], tuple[dict[str, bytes], int, str]] = {}
        self.apiservices: dict[str, bytes] = {OWN: b"", OTHER: b"other-ca"}
        self.patched: list[str] = []
        self.writes = 0
        self.reads = 0
        self.apiservice_error: Exception | None = None
        self.lose_next_race = False

    async def get_secret(self, namespace: str, name: str) -> tuple[dict[str, bytes], str] | None:
        self.reads += 1
        found = self.secrets.get((namespace, name))
        return (dict(found[0]), str(found[1])) if found else None

    async def write_secret(
        self,
        namespace: str,
        name: str,
        data: Mapping[str, bytes],
        *,
        type_: str,
        labels: Mapping[str, str],
        resource_version: str | None,
    ) -> bool:
        current = self.secrets.get((namespace, name))
        if self.lose_next_race:
            self.lose_next_race = False
            return False
        if (current is None) != (resource_version is None):
            return False
        if current is not None and str(current[1]) != resource_version:
            return False
        version = (current[1] if current else 0) + 1
        self.secrets[(namespace, name)] = (dict(data), version, type_)
        self.writes += 1
        return True

    async def apiservice_ca_bundle(self, name: str) -> bytes | None:
        if self.apiservice_error is not None:
            raise self.apiservice_error
        return self.apiservices.get(name)

    async def set_apiservice_ca_bundle(self, name: str, bundle: bytes) -> bool:
        self.patched.append(name)
        if name not in self.apiservices:
            return False
        self.apiservices[name] = bundle
        return True

    def data(self) -> dict[str, bytes]:
        return self.secrets[(NS, SECRET)][0]


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def keeper(store: Store, clock: Clock, apiservice: str | None = OWN) -> CertKeeper:
    return CertKeeper(
        store, namespace=NS, secret=SECRET, service=SERVICE, apiservice=apiservice, clock=clock
    )


def leaf_of(data: Mapping[str, bytes]) -> x509.Certificate:
    return x509.load_pem_x509_certificate(data[TLS_CRT])


async def handshake(pair: tuple[bytes, bytes], bundle: bytes, host: str = HOST) -> None:
    """A TLS connection on loopback verified as the aggregator verifies the log API: the
    APIService's caBundle and the Service's name (`<service>.<namespace>.svc`)."""
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    load_into(server_ctx, pair)
    client_ctx = ssl.create_default_context(cadata=bundle.decode())

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_ctx, server_hostname=host
        )
        assert await reader.read() == b"ok"
        writer.close()
    finally:
        server.close()
        await server.wait_closed()


def verifies(chain: bytes, bundle: bytes, at: datetime, host: str = HOST) -> bool:
    """The same verification at a simulated moment (OpenSSL's handshake knows only the real
    clock): the chain against the bundle, for the Service's name, as a TLS client checks."""
    store = verification.Store(certificates(bundle))
    verifier = (
        verification.PolicyBuilder().store(store).time(at).build_server_verifier(x509.DNSName(host))
    )
    leaf, *rest = certificates(chain)
    try:
        verifier.verify(leaf, rest)
    except verification.VerificationError:
        return False
    return True


# -- the leader's keeper ------------------------------------------------------------------------


async def test_the_leader_creates_the_secret_and_patches_its_own_apiservice_only() -> None:
    store, clock = Store(), Clock(START)
    assert await keeper(store, clock).step()
    data = store.data()
    assert store.secrets[(NS, SECRET)][2] == SECRET_TYPE == "kubernetes.io/tls"
    assert set(data) == {TLS_CRT, TLS_KEY, CA_CRT, CA_KEY}
    leaf = leaf_of(data)
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == dns_names(SERVICE, NS)
    assert dns_names(SERVICE, NS) == [HOST, f"{HOST}.cluster.local"]
    (ca,) = certificates(data[CA_CRT])
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert store.patched == [OWN]
    assert store.apiservices == {OWN: data[CA_CRT], OTHER: b"other-ca"}
    await handshake((data[TLS_CRT], data[TLS_KEY]), store.apiservices[OWN])
    await handshake((data[TLS_CRT], data[TLS_KEY]), data[CA_CRT], f"{HOST}.cluster.local")
    with pytest.raises(ssl.SSLCertVerificationError):
        await handshake((data[TLS_CRT], data[TLS_KEY]), data[CA_CRT], f"other.{NS}.svc")
    # Nothing due: the next checks write nothing and patch nothing.
    clock.now += DAY
    assert await keeper(store, clock).step()
    assert (store.writes, store.patched) == (1, [OWN])


async def test_the_charts_empty_secret_is_filled_by_an_update_never_a_create() -> None:
    """The chart makes the Secret with no data (the operator has no `create` on Secrets): the
    leader fills the version it read, and the certificate serves."""
    store, clock = Store(), Clock(START)
    store.secrets[(NS, SECRET)] = ({}, 7, "Opaque")
    assert await keeper(store, clock).step()
    data, version, _ = store.secrets[(NS, SECRET)]
    assert version == 8  # a replace of version 7: the store refuses a create over it
    assert set(data) == {TLS_CRT, TLS_KEY, CA_CRT, CA_KEY}
    await handshake((data[TLS_CRT], data[TLS_KEY]), store.apiservices[OWN])


async def test_a_due_certificate_is_renewed_by_the_same_ca() -> None:
    store, clock = Store(), Clock(START)
    k = keeper(store, clock)
    await k.step()
    first = store.data()
    clock.now += 59 * DAY
    await k.step()
    assert store.data() == first
    clock.now += 2 * DAY  # 61 days: within 30 days of the end
    await k.step()
    renewed = store.data()
    assert renewed[TLS_CRT] != first[TLS_CRT]
    assert renewed[TLS_KEY] != first[TLS_KEY]
    assert (renewed[CA_CRT], renewed[CA_KEY]) == (first[CA_CRT], first[CA_KEY])
    assert leaf_of(renewed).not_valid_after_utc > clock.now + 80 * DAY
    assert verifies(renewed[TLS_CRT], store.apiservices[OWN], clock.now)
    assert not verifies(first[TLS_CRT], store.apiservices[OWN], clock.now + 30 * DAY)
    assert store.patched == [OWN]  # the bundle did not change


async def test_the_ca_is_rotated_with_both_in_the_bundle_during_the_overlap() -> None:
    store, clock = Store(), Clock(START)
    k = keeper(store, clock)
    await k.step()
    old_ca = store.data()[CA_CRT]
    rotate_at = START + CA_LIFETIME - CA_ROTATE_BEFORE
    # Daily checks up to the rotation: the certificate renewed by the old CA all along.
    while clock.now < rotate_at:
        clock.now += DAY
        await k.step()
    data = store.data()
    assert data[CA_CRT].startswith(old_ca)
    cas = certificates(data[CA_CRT])
    assert len(cas) == 2
    old_id, new_id = (key_id(c.public_key()) for c in cas)
    signer_key = x509.load_pem_x509_certificate(data[TLS_CRT])
    assert _issuer_id(signer_key, cas) == old_id  # the served certificate is still the old CA's
    assert store.apiservices[OWN] == data[CA_CRT]
    old_pair = (data[TLS_CRT], data[TLS_KEY])
    # Every day on: whatever is served verifies against what the APIService trusts, and the
    # certificate a lagging replica still serves (the previous one) does too.
    switched = None
    while clock.now < START + CA_LIFETIME + 10 * DAY:
        before = store.data()
        clock.now += DAY
        await k.step()
        after = store.data()
        assert verifies(after[TLS_CRT], store.apiservices[OWN], clock.now)
        assert verifies(before[TLS_CRT], store.apiservices[OWN], clock.now)
        issuer = _issuer_id(leaf_of(after), certificates(after[CA_CRT]))
        if switched is None and issuer == new_id:
            switched = clock.now
            assert old_id in {key_id(c.public_key()) for c in certificates(after[CA_CRT])}
    assert switched is not None
    assert rotate_at + SETTLE <= switched < START + CA_LIFETIME
    # The old CA left the bundle when it expired, and the old certificate is then refused.
    final = store.data()
    assert [key_id(c.public_key()) for c in certificates(final[CA_CRT])] == [new_id]
    assert not verifies(old_pair[0], final[CA_CRT], clock.now - 20 * DAY)


def _issuer_id(cert: x509.Certificate, cas: list[x509.Certificate]) -> str | None:
    for ca in cas:
        try:
            cert.verify_directly_issued_by(ca)
        except Exception:
            continue
        return key_id(ca.public_key())
    return None


async def test_a_new_ca_signs_a_due_certificate_only_once_the_apiservice_trusts_it() -> None:
    store, clock = Store(), Clock(START)
    k = keeper(store, clock)
    await k.step()
    clock.now = START + CA_LIFETIME - CA_ROTATE_BEFORE
    await k.step()  # a second CA joins
    served = store.data()[TLS_CRT]
    store.apiservice_error = RuntimeError("HTTP 503")  # from now on unreadable
    clock.now = leaf_of(store.data()).not_valid_after_utc - 10 * DAY  # due
    await k.step()
    assert store.data()[TLS_CRT] == served  # waits: nothing shows the APIService trusts it
    store.apiservice_error = None
    await k.step()
    assert store.data()[TLS_CRT] != served


async def test_a_broken_secret_is_mended_and_a_lost_race_writes_nothing() -> None:
    store, clock = Store(), Clock(START)
    k = keeper(store, clock)
    await k.step()
    good = store.data()
    data, version, kind = store.secrets[(NS, SECRET)]
    store.secrets[(NS, SECRET)] = ({**data, TLS_KEY: b"garbage"}, version, kind)
    store.lose_next_race = True
    assert await k.step() is False
    assert store.data()[TLS_KEY] == b"garbage"
    assert await k.step() is True
    mended = store.data()
    assert mended[TLS_KEY] != b"garbage"
    assert mended[CA_CRT] == good[CA_CRT]  # the CA is kept
    await handshake((mended[TLS_CRT], mended[TLS_KEY]), store.apiservices[OWN])


async def test_without_an_apiservice_nothing_is_patched() -> None:
    store, clock = Store(), Clock(START)
    del store.apiservices[OWN]
    await keeper(store, clock).step()  # named but absent: nothing to wait for or patch
    await keeper(store, clock, apiservice=None).step()
    assert store.patched == []
    assert store.apiservices == {OTHER: b"other-ca"}


async def test_a_caBundle_changed_by_someone_else_is_put_back() -> None:
    store, clock = Store(), Clock(START)
    k = keeper(store, clock)
    await k.step()
    store.apiservices[OWN] = b"tampered"
    await k.step()
    assert store.apiservices[OWN] == store.data()[CA_CRT]
    assert store.patched == [OWN, OWN]


async def test_run_keeps_checking_after_errors_later_each_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, clock = Store(), Clock(START)
    outcomes: list[bool | Exception] = [RuntimeError("apiserver away")] * 4 + [True, False]
    slept: list[float] = []

    async def step() -> bool:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        if not outcomes:
            raise asyncio.CancelledError

    k = keeper(store, clock)
    monkeypatch.setattr(k, "step", step)
    monkeypatch.setattr("slurmjob_operator.certkeeper.asyncio.sleep", sleep)
    with pytest.raises(asyncio.CancelledError):
        await k.run(interval=60, retry=5)
    # Failures back off up to the interval; a check done waits the interval; a lost race
    # looks again soon.
    assert slept == [10, 20, 40, 60, 60, 5]


def test_the_keeper_runs_only_with_the_log_api_and_a_secret() -> None:
    store = Store()
    assert cert_keeper_from_settings(Settings(logs_cert_secret=SECRET), store) is None
    assert cert_keeper_from_settings(Settings(logs_port=8443), store) is None
    made = cert_keeper_from_settings(
        Settings(
            logs_port=8443,
            logs_cert_secret=SECRET,
            logs_service=SERVICE,
            logs_apiservice=OWN,
            pod_namespace=NS,
        ),
        store,
    )
    assert made is not None
    assert (made.namespace, made.secret, made.apiservice) == (NS, SECRET, OWN)
    assert made.names == [HOST, f"{HOST}.cluster.local"]


# -- the sources --------------------------------------------------------------------------------


async def _pair(store: Store | None = None) -> tuple[bytes, bytes]:
    store = store or Store()
    await keeper(store, Clock(START)).step()
    return store.data()[TLS_CRT], store.data()[TLS_KEY]


class Tick:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_file_certificates_are_reread_when_they_change_at_most_once_a_period(
    tmp_path: Path,
) -> None:
    first, second = await _pair(), await _pair()
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(first[0])
    key.write_bytes(first[1])
    tick = Tick()
    source = FileServingCert(cert, key, recheck=1.0, clock=tick)
    assert source.pem() == first
    assert source.generation == 1
    # The kubelet's way: a new directory, then one rename swaps both files.
    for path, body in ((cert, second[0]), (key, second[1])):
        new = path.with_suffix(".new")
        new.write_bytes(body)
        os.replace(new, path)
    assert source.pem() == first  # not looked at again within the period
    tick.now += 1.0
    assert source.pem() == second
    assert source.generation == 2
    # Half rewritten (a key of another certificate): what was served stays.
    key.write_bytes(first[1])
    tick.now += 1.0
    assert source.pem() == second
    assert source.generation == 2
    key.write_bytes(second[1])
    tick.now += 1.0
    assert source.pem() == second
    assert source.generation == 2  # the same pair again is no change


def test_missing_files_give_no_certificate(tmp_path: Path) -> None:
    assert FileServingCert(tmp_path / "a", tmp_path / "b").pem() is None


async def test_the_secret_is_read_in_the_background_and_reread_when_due() -> None:
    store = Store()
    tick = Tick()
    source = SecretServingCert(store, NS, SECRET, reread=30.0, retry=2.0, clock=tick)
    assert source.pem() is None  # the first read is under way
    assert await ready(source, within=0.5, poll=0.01) is False  # no Secret yet
    reads = store.reads
    assert reads == 1  # missing: not read again before `retry`
    tick.now += 2.0
    await keeper(store, Clock(START)).step()
    assert await ready(source, within=1.0, poll=0.01)
    first = source.pem()
    assert first == (store.data()[TLS_CRT], store.data()[TLS_KEY])
    assert source.generation == 1
    # Renewed by the leader: taken once the reread is due, not before.
    await keeper(store, Clock(START + 70 * DAY)).step()
    for _ in range(5):
        source.pem()
        await asyncio.sleep(0)
    assert source.pem() == first
    tick.now += 30.0
    source.pem()
    await asyncio.sleep(0.05)
    assert source.pem() == (store.data()[TLS_CRT], store.data()[TLS_KEY])
    assert source.generation == 2
    await source.close()


async def test_the_first_read_starts_when_the_source_is_made() -> None:
    """Made in the event loop (the log server's start), the source reads the Secret at once,
    so the apiserver's first connection finds a certificate."""
    store = Store()
    await keeper(store, Clock(START)).step()
    reads = store.reads
    source = SecretServingCert(store, NS, SECRET)
    for _ in range(3):
        await asyncio.sleep(0)
    assert store.reads == reads + 1
    assert source.pem() == (store.data()[TLS_CRT], store.data()[TLS_KEY])
    await source.close()


async def test_an_unusable_secret_keeps_what_was_served() -> None:
    store = Store()
    await keeper(store, Clock(START)).step()
    source = SecretServingCert(store, NS, SECRET)
    await source.refresh()
    served = source.pem()
    data, version, kind = store.secrets[(NS, SECRET)]
    store.secrets[(NS, SECRET)] = ({**data, TLS_KEY: b"-----BEGIN nothing"}, version + 1, kind)
    await source.refresh()
    assert source.pem() == served
    assert source.generation == 1


def test_the_source_follows_the_settings(tmp_path: Path) -> None:
    store = Store()
    assert serving_cert_from_settings(Settings(), store) is None
    files = serving_cert_from_settings(
        Settings(logs_tls_cert_file=tmp_path / "c", logs_tls_key_file=tmp_path / "k"), store
    )
    assert isinstance(files, FileServingCert)
    assert files.cert_file == tmp_path / "c"
    secret = serving_cert_from_settings(Settings(logs_cert_secret=SECRET, pod_namespace=NS), store)
    assert isinstance(secret, SecretServingCert)
    assert (secret.namespace, secret.name) == (NS, SECRET)


def test_the_operator_namespace(tmp_path: Path) -> None:
    file = tmp_path / "namespace"
    assert operator_namespace(Settings(pod_namespace="ops"), file) == "ops"
    assert operator_namespace(Settings(), file) == "default"
    file.write_text("team-ops\n")
    assert operator_namespace(Settings(), file) == "team-ops"
