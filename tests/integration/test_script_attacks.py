"""Manifests that tried to make the batch script act on the host, on the real Slurm 26.05.

Each attack is first refused by validation, which names the field. Then, as if such a spec had
slipped through (validation skipped, render's and the preflight's own checks switched off), it
goes through the real pipeline to slurmrestd and must fail on the compute node:

- spec.env `PATH=<a tenant's folder>:...` whose folder holds a sha256sum that always answers
  the expected hash, with the runtime image tampered with after the operator's own check: the
  job fails with exit 97, and the tenant's sha256sum never ran (nothing of spec.env reaches the
  batch shell, whose tools run under the site's PATH);
- the srun option injection `command: ["--container-mounts=/:/host", "--jobid=<another job>",
  "bash", "-c", "ls /host"]`: the words come after srun's `--`, so srun runs no step with
  `/:/host` mounted and none inside the other job's allocation; the step fails (no such
  command).

Both runtime profiles run, through the real Pyxis and Apptainer; the test bed's recording
SPANK plugin, beside Pyxis, says what each step's task was given on the host side (its argv).
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.integration.helpers import cpu_spec, step_records, wait_for_job
from tests.integration.sitefiles import IMAGE, site_env
from tests.testbed import images
from tests.testbed.handles import cancel_own
from tests.testbed.slurm import SlurmTestbed

from slurmjob_operator.api.errors import SpecError, parse_spec
from slurmjob_operator.api.spec import EnvVar, SlurmJobSpec
from slurmjob_operator.config import Settings
from slurmjob_operator.controller.pipeline import (
    PreparedAttempt,
    Site,
    prepare_attempt,
    stage,
    verify_runtime,
)
from slurmjob_operator.core.jobview import BaseState, SlurmJobView
from slurmjob_operator.site import preflight, render
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.connect import connect, open_transport

pytestmark = [pytest.mark.integration, pytest.mark.slurm2605]

ATTACK_RUNTIME = "custom-attack"


@dataclass(frozen=True)
class Bed:
    testbed: SlurmTestbed
    settings: Settings
    site: Site
    namespace: str
    runtime_file: Path
    """This test's own runtime artifact (the PATH attack tampers with it)."""


@pytest.fixture(params=["apptainer", "enroot-pyxis"])
def profile(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _own_runtime(testbed: SlurmTestbed, profile: str, registry: Path) -> Path:
    """A runtime of this test alone, added to the registry site_env wrote."""
    fmt = "sif" if profile == "apptainer" else "sqsh"
    # The real image with bytes of its own at the end (past what squashfs and SIF read): a
    # file no other test shares, that still runs.
    content = images.image(IMAGE, fmt).read_bytes() + uuid.uuid4().bytes
    path = testbed.storage_root / "runtimes" / f"attack-{uuid.uuid4().hex[:10]}.{fmt}"
    path.write_bytes(content)
    os.chown(path, testbed.uid, testbed.gid)
    path.chmod(0o644)
    doc = json.loads(registry.read_text())
    doc["runtimes"].append(
        {
            "id": ATTACK_RUNTIME,
            "format": fmt,
            "path": str(path.relative_to(testbed.storage_root)),
            "sha256": hashlib.sha256(content).hexdigest(),
        }
    )
    registry.write_text(json.dumps(doc))
    return path


@pytest.fixture
def bed(slurm_2605: SlurmTestbed, profile: str, tmp_path: Path) -> Bed:
    env = site_env(slurm_2605, profile, tmp_path)
    runtime_file = _own_runtime(slurm_2605, profile, Path(env["SLURMJOB_RUNTIME_REGISTRY_FILE"]))
    settings = Settings.from_env(env)
    return Bed(
        slurm_2605, settings, Site.load(settings), f"atk-{uuid.uuid4().hex[:10]}", runtime_file
    )


@pytest.fixture
async def client(bed: Bed) -> AsyncIterator[SlurmClient]:
    async with open_transport(bed.settings) as session:
        yield await connect(bed.settings, session)


@pytest.fixture
def no_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if the spec had slipped past every check: render's and the preflight's rules off."""
    monkeypatch.setattr(render, "reserved_env_name", lambda name: False)
    monkeypatch.setattr(render, "command_problem", lambda words: None)
    monkeypatch.setattr(preflight, "reserved_env_name", lambda name: False)


def _manifest_spec(bed: Bed, command: list[str], **extra: Any) -> dict[str, Any]:
    profile = bed.settings.slurm_runtime_profile
    return cpu_spec(command, profile, **{"timeLimit": "5m", **extra})


def _prepare(bed: Bed, client: SlurmClient, spec: SlurmJobSpec, name: str) -> PreparedAttempt:
    return prepare_attempt(
        spec,
        bed.site,
        namespace=bed.namespace,
        name=name,
        uid=str(uuid.uuid4()),
        attempt=1,
        api_version=client.version,
        secret_values={},
    )


async def _wait(
    client: SlurmClient, ref: int | str, *, final: bool = True, within: float = 60.0
) -> list[SlurmJobView]:
    return await wait_for_job(client, ref, final=final, within=within)


def _steps(bed: Bed, sluid: str) -> list[dict[str, Any]]:
    """The recording plugin's records of the job's own steps (not its batch step)."""
    return step_records(bed.testbed.record_dir, bed.testbed.cluster_name, sluid=sluid)


def _tenant_folder(bed: Bed, expected_sha256: str) -> tuple[Path, Path]:
    """A tenant's folder under the storage root with a sha256sum that says what the script
    expects to hear; it leaves a mark when it runs."""
    folder = bed.testbed.storage_root / f"tenant-{uuid.uuid4().hex[:10]}"
    tools = folder / "bin"
    tools.mkdir(parents=True)
    mark = folder / "sha256sum-ran"
    fake = tools / "sha256sum"
    fake.write_text(f'#!/bin/bash\ntouch "{mark}"\necho "{expected_sha256}  -"\n')
    fake.chmod(0o755)
    for path in (folder, tools, fake):
        os.chown(path, bed.testbed.uid, bed.testbed.gid)
    return tools, mark


async def test_user_path_cannot_pass_a_tampered_image(
    bed: Bed, client: SlurmClient, no_checks: None
) -> None:
    sha = hashlib.sha256(bed.runtime_file.read_bytes()).hexdigest()
    tools, mark = _tenant_folder(bed, sha)
    path = f"{tools}:{bed.settings.slurm_job_path}"
    framework = {"kind": "custom", "name": "custom", "runtimeId": ATTACK_RUNTIME}
    manifest = _manifest_spec(
        bed,
        ["bash", "-c", "echo the-tampered-image-ran"],
        framework=framework,
        env=[{"name": "PATH", "value": path}, {"name": "LD_PRELOAD", "value": "/nonexistent.so"}],
    )
    with pytest.raises(SpecError) as refused:
        parse_spec(manifest)
    fields = {m.split(": ")[0] for m in refused.value.messages}
    assert fields == {"spec.env[0].name", "spec.env[1].name"}, refused.value.messages

    slipped = parse_spec({**manifest, "env": []}).model_copy(
        update={
            "env": [
                EnvVar.model_construct(name="PATH", value=path, value_from=None),
                EnvVar.model_construct(name="LD_PRELOAD", value="/nonexistent.so", value_from=None),
            ]
        }
    )
    prepared = _prepare(bed, client, slipped, "path-attack")
    verify_runtime(prepared, bed.settings)  # the operator's check: the image is intact now
    stage(prepared, bed.settings)
    good = bed.runtime_file.read_bytes()
    bed.runtime_file.write_bytes(good[:-16] + b"tampered-after!!")  # same magic, other bytes
    receipt = await client.submit(prepared.rendered.launch)
    [job] = await _wait(client, receipt.job_id)

    staging = prepared.rendered.staging_dir
    stderr = (staging / "stderr.log").read_text()
    assert job.base_state is BaseState.FAILED, (job, stderr)
    assert job.exit.return_code == 97, stderr
    assert "sha256" in stderr
    assert "LD_PRELOAD" not in stderr  # no host tool of the script started with it
    assert not mark.exists(), "the tenant's sha256sum ran on the compute node"
    assert "the-tampered-image-ran" not in (staging / "stdout.log").read_text()


async def test_srun_option_injection_stays_the_command(
    bed: Bed, client: SlurmClient, no_checks: None
) -> None:
    victim_spec = parse_spec(_manifest_spec(bed, ["sleep", "120"]))
    victim = _prepare(bed, client, victim_spec, "victim")
    verify_runtime(victim, bed.settings)
    stage(victim, bed.settings)
    victim_id = (await client.submit(victim.rendered.launch)).job_id
    try:
        await _wait(client, victim_id, final=False)
        command = ["--container-mounts=/:/host", f"--jobid={victim_id}", "bash", "-c", "ls /host"]
        with pytest.raises(SpecError) as refused:
            parse_spec(_manifest_spec(bed, command))
        assert [m.split(": ")[0] for m in refused.value.messages] == ["spec.command"]
        assert "starts with '-'" in refused.value.messages[0]

        slipped = parse_spec(_manifest_spec(bed, ["true"])).model_copy(update={"command": command})
        prepared = _prepare(bed, client, slipped, "injection")
        verify_runtime(prepared, bed.settings)
        stage(prepared, bed.settings)
        attacker_id = (await client.submit(prepared.rendered.launch)).job_id
        [job] = await _wait(client, attacker_id)
        stderr = (prepared.rendered.staging_dir / "stderr.log").read_text()
        assert job.base_state is BaseState.FAILED, (job, stderr)
        assert job.exit.return_code != 0
        # The victim is still running and nothing joined it.
        [still] = await client.get_job(victim_id)
        assert still.base_state is BaseState.RUNNING
    finally:
        await cancel_own(client, victim_id)

    # By SLUID: job ids start again when a test cluster is rebuilt, and the record files
    # keep earlier runs' lines.
    sluids = {still.sluid, job.sluid}
    assert None not in sluids
    # What each step's task was given: the victim's own `sleep`, and the attacker's words,
    # all of them, as the command after the runtime's own options (never srun's options).
    [victim_step] = _steps(bed, still.sluid)
    assert victim_step["argv"][-2:] == ["sleep", "120"]
    [attacker] = _steps(bed, job.sluid)
    assert attacker["argv"][-len(command) :] == command
    if bed.settings.slurm_runtime_profile == "apptainer":
        image = str(bed.settings.storage_root) + "/" + prepared.resolution.runtime.path
        assert attacker["argv"][attacker["argv"].index(image) + 1 :] == command
