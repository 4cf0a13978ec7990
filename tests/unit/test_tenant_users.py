"""Tenants with their own Slurm user and uid (issue 9), at the controller tier: a tenant's jobs
are submitted, cancelled, held and released as its `slurmUser` while every read (confirmation,
adoption lookups, the poller's sweep) stays the operator's. What cannot work (a slurmUser
without the JWT key, a uid on storage without ACLs) stops the start, and doctor says so. The
tenant's files (ACLs for its `uid`) are test_tenant_files.py's.

`MemorySlurm` lets only a job's own user change it, as the test cluster does for an operator
user that is no Slurm admin, so a cancel or hold sent as the operator fails here as it would
there.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from slurmjob_operator.api.status import Phase, get_condition
from slurmjob_operator.config import ConfigError, Settings
from slurmjob_operator.controller import Controller, RetryLater, Tracked
from slurmjob_operator.controller.pipeline import Site
from slurmjob_operator.controller.poller import Poller
from slurmjob_operator.controller.slurmlink import SlurmLink
from slurmjob_operator.core import naming
from slurmjob_operator.doctor import Outcome, Report
from slurmjob_operator.doctor.tenancy import check_tenancy
from slurmjob_operator.metrics import Metrics
from slurmjob_operator.site.catalogs import RuntimeRegistry
from slurmjob_operator.slurm.auth import MintedToken, decode_claims
from slurmjob_operator.slurm.client import SlurmClient

from .controller_fakes import (
    OPERATOR_USER,
    Bed,
    MemorySlurm,
    StubToken,
    cpu_spec,
    make_bed,
    make_settings,
)

TENANT = 12345  # team-a's uid
STRANGER = 12346  # team-b's uid
ME = os.geteuid()
SECRET_ENV = [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}]


def tenants_file(root: Path, **team_a: Any) -> Path:
    entries: list[dict[str, Any]] = [
        {
            "name": "team-a",
            "namespaces": ["team-a"],
            "accounts": ["team-a"],
            "partitions": ["debug"],
            "slurmUser": "team-a",
            "uid": TENANT,
            **team_a,
        },
        {
            "name": "team-b",
            "namespaces": ["team-b"],
            "accounts": ["team-b"],
            "partitions": ["debug"],
            "slurmUser": "team-b",
            "uid": STRANGER,
        },
        {"name": "plain", "namespaces": ["plain"], "accounts": ["p"], "partitions": ["debug"]},
    ]
    path = root / "tenants.yaml"
    path.write_text(
        yaml.safe_dump(
            {"tenants": [{k: v for k, v in e.items() if v is not None} for e in entries]}
        )
    )
    return path


def key_file(root: Path) -> Path:
    path = root / "jwt.key"
    path.write_bytes(b"unit-jwt-key")
    return path


def tenant_settings(root: Path, **overrides: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "tenants_file": tenants_file(root),
        "slurm_jwt_key_file": key_file(root),
        "slurm_rest_user": OPERATOR_USER,
    }
    values.update(overrides)
    return values


@pytest.fixture
def bed(tmp_path: Path) -> Bed:
    return make_bed(tmp_path, **tenant_settings(tmp_path))


async def submit(bed: Bed, name: str = "train", namespace: str = "team-a", **spec: Any) -> Any:
    ref = bed.store.create(name, cpu_spec(**spec), namespace=namespace)
    with contextlib.suppress(RetryLater):
        await bed.controller.reconcile(ref)
    return ref


def condition(bed: Bed, ref: Any, type_: str) -> tuple[str, str] | None:
    cond = get_condition(bed.store.status(ref).conditions, type_)
    return (cond.status, cond.reason) if cond is not None else None


def tracked(bed: Bed, ref: Any) -> Tracked:
    [item] = [t for t in bed.controller.followed() if t.ref == ref]
    return item


async def refresh(bed: Bed, ref: Any) -> None:
    item = tracked(bed, ref)
    await bed.controller.refresh(item, await bed.slurm.get_job(item.job_id))


def attempt_path(bed: Bed, ref: Any, number: int = 1) -> Path:
    return naming.staging_dir(bed.settings.storage_root, ref.namespace, ref.name, ref.uid, number)


# -- as whom Slurm is asked -----------------------------------------------------------------


async def test_a_tenants_job_is_submitted_as_its_slurm_user_and_confirmed_as_the_operator(
    bed: Bed,
) -> None:
    ref = await submit(bed)
    status = bed.store.status(ref)
    assert status.phase is Phase.QUEUED
    assert bed.slurm.made_as("team-a") == ["submit"]
    assert bed.slurm.made_as(None) == ["get_job 100"]
    assert bed.slurm.jobs[100].user == "team-a"


async def test_each_tenant_submits_as_its_own_user_and_one_without_as_the_operator(
    bed: Bed,
) -> None:
    await submit(bed, "a", "team-a")
    await submit(bed, "b", "team-b")
    await submit(bed, "p", "plain")
    assert [bed.slurm.jobs[i].user for i in (100, 101, 102)] == ["team-a", "team-b", OPERATOR_USER]
    assert bed.slurm.made_as("team-b") == ["submit"]
    assert set(bed.slurm.user_clients) == {"team-a", "team-b"}


async def test_the_poller_sweeps_once_as_the_operator_whatever_the_number_of_tenants(
    bed: Bed,
) -> None:
    for namespace in ("team-a", "team-b", "plain"):
        await submit(bed, "train", namespace)
    poller = Poller(bed.controller)
    bed.slurm.acted.clear()
    await poller.cycle()
    await poller.cycle()
    assert bed.slurm.acted[:1] == [("jobs_state", None)]
    assert [c for c, _ in bed.slurm.acted].count("jobs_state") == 2
    assert all(user is None for _, user in bed.slurm.acted), bed.slurm.acted


async def test_hold_and_release_are_sent_as_the_tenants_user(bed: Bed) -> None:
    ref = await submit(bed)
    bed.store.update(ref, suspend=True)
    assert await bed.controller.reconcile(ref) is None
    assert condition(bed, ref, "Suspended") == ("True", "Held")
    bed.store.update(ref, suspend=False)
    assert await bed.controller.reconcile(ref) is None
    assert condition(bed, ref, "Suspended") == ("False", "Released")
    assert bed.slurm.made_as("team-a") == ["submit", "hold 100", "release 100"]
    assert "get_job 100" in bed.slurm.made_as(None), "the job is looked at as the operator"


async def test_deleting_cancels_as_the_tenants_user_found_from_the_namespace(bed: Bed) -> None:
    ref = await submit(bed)
    await bed.controller.finalize(bed.store.body(ref))
    assert bed.slurm.made_as("team-a") == ["submit", "cancel_many s00000100"]
    assert bed.slurm.jobs[100].base_state == "CANCELLED"
    assert "Cancelled" in bed.store.reasons()
    assert not any(c.startswith("cancel") for c in bed.slurm.made_as(None))


async def test_deleting_an_unconfirmed_attempt_cancels_as_the_tenants_user(bed: Bed) -> None:
    bed.slurm.faults = ["lost"]
    ref = await submit(bed)
    assert bed.store.status(ref).attempts[0].job_id is None
    await bed.controller.finalize(bed.store.body(ref))
    assert bed.slurm.made_as("team-a") == ["submit", "cancel_many s00000100"]
    assert bed.slurm.jobs[100].base_state == "CANCELLED"
    assert "list_jobs" in bed.slurm.made_as(None), "found by name, as the operator"


async def test_a_duplicate_found_at_adoption_is_cancelled_as_the_tenants_user(bed: Bed) -> None:
    bed.slurm.faults = ["twice"]
    ref = await submit(bed)
    assert await bed.controller.reconcile(ref) is None
    assert bed.store.status(ref).attempts[0].job_id == 100
    assert bed.slurm.jobs[101].base_state == "CANCELLED"
    assert "cancel 101" in bed.slurm.made_as("team-a")
    assert any(c.startswith("find_by_name") for c in bed.slurm.made_as(None))


async def test_a_record_made_despite_a_refusal_is_cancelled_as_the_tenants_user(bed: Bed) -> None:
    bed.slurm.faults = ["rejected-record"]
    ref = await submit(bed)
    assert bed.store.status(ref).phase is Phase.FAILED
    assert bed.slurm.made_as("team-a") == ["submit", "cancel 100"]
    assert bed.slurm.jobs[100].base_state == "CANCELLED"


async def test_slurmlink_mints_tokens_for_the_tenants_user_over_the_same_transport(
    tmp_path: Path,
) -> None:
    settings = make_settings(tmp_path, **tenant_settings(tmp_path))
    transport: Any = object()  # never used: nothing is sent
    link = SlurmLink(settings, transport, StubToken(), lambda *a: None, users={"team-a"})
    # As `connect` would have left it: discovery done, accounting known.
    base = link._client = SlurmClient(
        transport,
        settings.slurm_rest_url,
        "v0.0.45",
        token=StubToken(),  # type: ignore[arg-type]
        user=OPERATOR_USER,
        accounting=True,
    )
    as_a = await link.client_for("team-a")
    assert await link.client_for("team-a") is as_a, "one client per user, kept"
    assert await link.client_for(None) is base
    assert await link.client_for(OPERATOR_USER) is base
    assert as_a.version == base.version
    assert as_a._rest._transport is base._rest._transport
    assert as_a.accounting is True
    token = as_a._rest._token
    assert isinstance(token, MintedToken)
    assert token.user == "team-a"
    assert token.key_file == settings.slurm_jwt_key_file
    assert (decode_claims(token.token()) or {})["sun"] == "team-a"
    assert as_a._rest._user == "team-a"
    with pytest.raises(ValueError, match="no tenant's slurmUser"):
        await link.client_for("root")


# -- what stops the start -------------------------------------------------------------------


def _controller(settings: Settings) -> Controller:
    return Controller(
        settings,
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        Metrics(),
        token=StubToken(),  # type: ignore[arg-type]
        link=MemorySlurm(),  # type: ignore[arg-type]
    )


def test_a_slurm_user_without_the_jwt_key_stops_the_start(tmp_path: Path) -> None:
    jwt = tmp_path / "token"
    jwt.write_text("a.b.c")
    settings = make_settings(
        tmp_path, **tenant_settings(tmp_path, slurm_jwt_key_file=None, slurm_jwt_file=jwt)
    )
    with pytest.raises(ConfigError) as info:
        _controller(settings)
    message = str(info.value)
    assert message.startswith("SLURMJOB_SLURM_JWT_KEY_FILE: required by tenant(s)")
    assert "team-a (slurmUser team-a), team-b (slurmUser team-b)" in message
    assert str(settings.tenants_file) in message


def test_a_tenant_without_a_slurm_user_needs_no_jwt_key(tmp_path: Path) -> None:
    path = tmp_path / "plain.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "tenants": [
                    {"name": "p", "namespaces": ["p"], "accounts": ["p"], "partitions": ["debug"]}
                ]
            }
        )
    )
    _controller(make_settings(tmp_path, tenants_file=path))


@pytest.mark.parametrize("code", [errno.EOPNOTSUPP, errno.ENOTSUP])
def test_a_tenant_uid_on_storage_without_acls_stops_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    settings = make_settings(tmp_path, **tenant_settings(tmp_path))

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "setxattr", refuse)
    with pytest.raises(ConfigError) as info:
        _controller(settings)
    assert str(info.value).startswith(
        "SLURMJOB_STORAGE_ROOT: tenant(s) team-a, team-b have a uid, so their attempt files are "
        "shared through POSIX ACLs, but"
    )
    assert "does not support POSIX ACLs" in str(info.value)
    report = Report()
    check_tenancy(settings, RuntimeRegistry(), report)
    [files] = [c for c in report.checks if c.name == "tenant files"]
    assert files.outcome is Outcome.FAIL
    assert "does not support POSIX ACLs" in files.detail


def test_a_storage_root_the_probe_cannot_use_stops_the_start(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, **tenant_settings(tmp_path))
    missing = settings.model_copy(update={"storage_root": tmp_path / "missing"})
    with pytest.raises(ConfigError, match="cannot create an ACL probe"):
        _controller(missing)


def test_doctor_reports_tenant_users_and_acls(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, **tenant_settings(tmp_path))
    report = Report()
    check_tenancy(settings, RuntimeRegistry(), report)
    checks = {(c.name, c.outcome): c.detail for c in report.checks}
    assert (
        "team-a, team-b: jobs submitted, cancelled, held and released as their slurmUser"
        in (checks[("tenant users", Outcome.OK)])
    )
    assert "keeps POSIX ACLs" in checks[("tenant files", Outcome.OK)]
    no_uid = tenants_file(tmp_path, uid=None)
    report = Report()
    check_tenancy(settings.model_copy(update={"tenants_file": no_uid}), RuntimeRegistry(), report)
    [warned] = [c for c in report.checks if c.outcome is Outcome.WARN and c.name == "tenant files"]
    assert warned.detail.startswith("tenant(s) team-a have a slurmUser but no uid")


def test_site_names_the_user_and_uid_of_a_namespace(tmp_path: Path) -> None:
    site = Site.load(make_settings(tmp_path, **tenant_settings(tmp_path)))
    assert (site.slurm_user("team-a"), site.job_uid("team-a")) == ("team-a", TENANT)
    assert (site.slurm_user("plain"), site.job_uid("plain")) == (None, None)
    assert (site.slurm_user("nobody"), site.job_uid("nobody")) == (None, None)
    assert site.slurm_users == {"team-a", "team-b"}
    single = Site.load(make_settings(tmp_path))
    assert (single.slurm_user("team-a"), single.slurm_users) == (None, frozenset())
