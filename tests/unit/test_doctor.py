"""`doctor` says what it does and what to set: a malformed setting exits 2 as every command
does, the probe jobs are announced before they are submitted, and each failure names the
setting to change (slurmrestd's reachability apart from its authentication)."""

from __future__ import annotations

import io
import socket
from pathlib import Path

import pytest

from slurmjob_operator.cli import EXIT_INVALID, main
from slurmjob_operator.config import Settings
from slurmjob_operator.doctor import Outcome, Report, run_doctor
from slurmjob_operator.doctor.slurmrestd import check_slurm
from slurmjob_operator.doctor.storage import check_storage
from slurmjob_operator.site.catalogs import GpuSeriesCatalog


def doctor(monkeypatch: pytest.MonkeyPatch, *argv: str, **env: str) -> tuple[int, str, str]:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    out, err = io.StringIO(), io.StringIO()
    code = main(["doctor", *argv], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_a_malformed_setting_exits_2_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = doctor(monkeypatch, "--no-probe", SLURMJOB_POLL_INTERVAL="soon")
    assert code == EXIT_INVALID
    assert "SLURMJOB_POLL_INTERVAL" in out
    assert "probe" not in err  # --no-probe: nothing announced, nothing submitted


def test_the_probe_jobs_are_announced_before_anything_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A malformed setting stops doctor before any probe: the note comes first all the same.
    code, _, err = doctor(monkeypatch, SLURMJOB_POLL_INTERVAL="soon")
    assert code == EXIT_INVALID
    assert "submits probe jobs" in err
    assert "--no-probe" in err


async def test_a_malformed_clusters_file_is_invalid_too(tmp_path: Path) -> None:
    clusters = tmp_path / "clusters.yaml"
    clusters.write_text("clusters: [{name: 'bad name!'}]\n")
    report = await run_doctor(
        {"SLURMJOB_CLUSTERS_FILE": str(clusters), "SLURMJOB_STORAGE_ROOT": str(tmp_path)},
        probe=False,
    )
    assert report.invalid
    assert "SLURMJOB_CLUSTERS_FILE" in report.checks[-1].detail


def test_an_unwritable_storage_root_names_its_setting(tmp_path: Path) -> None:
    report = Report()
    check_storage(Settings(storage_root=tmp_path / "missing"), report)
    [check] = report.checks
    assert check.outcome is Outcome.FAIL
    assert "SLURMJOB_STORAGE_ROOT" in check.detail


async def test_slurmrestd_unreachable_is_told_apart_from_refused_credentials(
    tmp_path: Path,
) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    token = tmp_path / "token"
    token.write_text("eyJhbGciOiJIUzI1NiJ9.e30.sig\n")
    report = Report()
    settings = Settings(
        slurm_rest_url=f"http://127.0.0.1:{port}",
        slurm_jwt_file=token,
        slurm_rest_api_version="v0.0.45",
        slurm_rest_timeout=2.0,
    )
    await check_slurm(settings, GpuSeriesCatalog(), report)
    [check] = report.checks
    assert (check.name, check.outcome) == ("slurmrestd", Outcome.FAIL)
    assert "SLURMJOB_SLURM_REST_URL" in check.detail
    missing = Report()
    await check_slurm(
        Settings(slurm_jwt_file=tmp_path / "none", slurm_rest_api_version="v0.0.45"),
        GpuSeriesCatalog(),
        missing,
    )
    [auth] = missing.checks
    assert (auth.name, auth.outcome) == ("auth", Outcome.FAIL)
    assert "SLURMJOB_SLURM_JWT_FILE" in auth.detail
