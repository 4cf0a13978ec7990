"""The Slurm test bed itself works: raw slurmrestd HTTP only, no project code."""

from __future__ import annotations

import json
import os
import shlex
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from tests.integration.helpers import step_records
from tests.integration.sitefiles import image_on_storage
from tests.testbed.slurm import SlurmTestbed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

TERMINAL = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "PREEMPTED",
}


# ----------------------------------------------------------------------------- helpers


def api(tb: SlurmTestbed, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    url = f"{tb.rest_url}/slurm/{tb.api_version}/{path}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=tb.headers())
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw or b"{}")
    except ValueError:
        return status, {"raw": raw.decode(errors="replace")}


def workdir(tb: SlurmTestbed, tag: str) -> Path:
    d = tb.storage_root / f"testbed-{tb.cluster_name}-{tag}-{uuid.uuid4().hex[:8]}"
    d.mkdir(mode=0o755)
    os.chown(d, tb.uid, tb.gid)
    return d


def component(tb: SlurmTestbed, wd: Path, name: str, **props: Any) -> dict[str, Any]:
    env: Any = {"PATH": tb.job_path} if tb.api_version == "v0.0.38" else [f"PATH={tb.job_path}"]
    return {
        "name": name,
        "partition": tb.partition,
        "environment": env,
        "current_working_directory": str(wd),
        "standard_output": str(wd / "out-%j.txt"),
        "standard_error": str(wd / "err-%j.txt"),
        **props,
    }


def submit(tb: SlurmTestbed, script: str, comps: list[dict[str, Any]]) -> int:
    if tb.api_version == "v0.0.38":
        body: dict[str, Any] = {"script": script}
        if len(comps) == 1:
            body["job"] = comps[0]
        else:
            body["jobs"] = comps
    else:
        comps = [dict(comps[0], script=script), *comps[1:]]
        body = {"job": comps[0]} if len(comps) == 1 else {"jobs": comps}
    status, resp = api(tb, "POST", "job/submit", body)
    assert status == 200, (status, resp)
    assert not resp.get("errors"), resp
    job_id = resp["job_id"]
    assert isinstance(job_id, int)
    return job_id


def number(value: Any) -> Any:
    """v0.0.39+ dump NO_VAL numbers as {"set", "infinite", "number"}; v0.0.38 as plain ints."""
    return value["number"] if isinstance(value, dict) else value


def states(job: dict[str, Any]) -> set[str]:
    st = job["job_state"]
    return set(st) if isinstance(st, list) else {st}


def wait_done(tb: SlurmTestbed, job_id: int, timeout: float = 45) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    jobs: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        status, resp = api(tb, "GET", f"job/{job_id}")
        assert status == 200, (status, resp)
        jobs = resp["jobs"]
        if jobs and all(states(j) & TERMINAL for j in jobs):
            return jobs
        time.sleep(0.2)
    summary = [(j["job_id"], j["job_state"], j.get("state_reason")) for j in jobs]
    pytest.fail(f"job {job_id} on {tb.name} not finished after {timeout} s: {summary}")


def output(wd: Path, job_id: int) -> str:
    out = wd / f"out-{job_id}.txt"
    assert out.is_file(), f"missing {out}; dir has {sorted(p.name for p in wd.iterdir())}"
    err = wd / f"err-{job_id}.txt"
    text = out.read_text()
    if err.is_file() and err.read_text().strip():
        text += "\n--- stderr ---\n" + err.read_text()
    return text


def assert_completed(tb: SlurmTestbed, jobs: list[dict[str, Any]], wd: Path, job_id: int) -> str:
    text = output(wd, job_id)
    for j in jobs:
        assert "COMPLETED" in states(j), (j["job_id"], j["job_state"], j.get("state_reason"), text)
    return text


# ----------------------------------------------------------------------------- tests


def test_authenticated_ping(slurm: SlurmTestbed) -> None:
    status, resp = api(slurm, "GET", "ping")
    assert status == 200, resp
    assert resp["pings"], resp
    assert not resp.get("errors")
    # no auth headers -> 401
    req = urllib.request.Request(f"{slurm.rest_url}/slurm/{slurm.api_version}/ping")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=5)
    info.value.close()
    assert info.value.code == 401


def test_cpu_job_completes_and_writes_output(slurm: SlurmTestbed) -> None:
    wd = workdir(slurm, "cpu")
    script = (
        "#!/bin/bash\n"
        'echo "hello from $SLURMD_NODENAME as $(id -u):$(id -g) in $PWD"\n'
        'echo "cluster=$SLURM_CLUSTER_NAME"\n'
        "echo data > result.txt\n"
    )
    job_id = submit(slurm, script, [component(slurm, wd, "tb-cpu")])
    jobs = wait_done(slurm, job_id)
    text = assert_completed(slurm, jobs, wd, job_id)
    assert f"as {slurm.uid}:{slurm.gid} in {wd}" in text
    assert f"cluster={slurm.cluster_name}" in text
    assert (wd / "result.txt").read_text() == "data\n"
    assert (wd / "result.txt").stat().st_uid == slurm.uid


def test_sluid_on_2605(slurm_2605: SlurmTestbed) -> None:
    tb = slurm_2605
    wd = workdir(tb, "sluid")
    job_id = submit(tb, "#!/bin/bash\necho SLUID=$SLURM_JOB_SLUID\n", [component(tb, wd, "tb-s")])
    jobs = wait_done(tb, job_id)
    assert_completed(tb, jobs, wd, job_id)
    status, resp = api(tb, "GET", f"job/{job_id}")
    assert status == 200
    sluid = resp["jobs"][0]["step_id"]["sluid"]
    assert isinstance(sluid, str)
    assert sluid.startswith("s")
    assert len(sluid) == 14


def test_heterogeneous_gpu_job_spans_both_nodes(slurm: SlurmTestbed) -> None:
    wd = workdir(slurm, "het")
    if slurm.api_version == "v0.0.38":
        gpus: dict[str, Any] = {"gpus_per_node": 2}
    else:
        gpus = {"tres_per_node": "gres/gpu:2"}
    comps = [
        component(slurm, wd, "tb-het", constraints="h100", nodes=1, tasks=1, **gpus),
        component(slurm, wd, "tb-het", constraints="a100", nodes=1, tasks=1, **gpus),
    ]
    script = (
        "#!/bin/bash\n"
        "set -e\n"
        "echo leader=$SLURMD_NODENAME size=$SLURM_HET_SIZE\n"
        "srun --het-group=0,1 bash -c 'echo TASK $SLURMD_NODENAME gpus=$SLURM_GPUS_ON_NODE'\n"
    )
    job_id = submit(slurm, script, comps)
    jobs = wait_done(slurm, job_id)
    assert len(jobs) == 2
    text = assert_completed(slurm, jobs, wd, job_id)
    by_offset = {number(j["het_job_offset"]): j for j in jobs}
    assert by_offset[0]["nodes"] == "n1"
    assert by_offset[1]["nodes"] == "n2"
    tasks = sorted(line for line in text.splitlines() if line.startswith("TASK "))
    assert tasks == ["TASK n1 gpus=2", "TASK n2 gpus=2"], text
    assert "leader=n1 size=2" in text


def _in_image_script(launch: str, wd: Path) -> str:
    """A batch script whose step runs `launch` + a probe of what the container sees: the
    image's marker and release, the working directory, the user, a read-only mount."""
    probe = (
        "cat /etc/slurmjob-testbed-image; . /etc/os-release; echo codename=$VERSION_CODENAME; "
        "echo pwd=$(pwd) id=$(id -u):$(id -g); ls /data/marker.txt; "
        "touch /data/new 2>/dev/null && echo data-writable || echo data-read-only; "
        f"test -e {wd}/host-only.txt && echo host-file-visible || echo host-file-invisible"
    )
    return f"#!/bin/bash\nset -e\n{launch} sh -c {shlex.quote(probe)}\necho step-rc=$?\n"


def _check_in_image(tb: SlurmTestbed, wd: Path, job_id: int) -> str:
    jobs = wait_done(tb, job_id, timeout=90)
    text = assert_completed(tb, jobs, wd, job_id)
    lines = text.splitlines()
    assert any(line.startswith("slurmjob-testbed-image name=base ") for line in lines), text
    assert "codename=trixie" in lines, text  # neither the host's bookworm nor the chroot's forky
    assert f"pwd=/data id={tb.uid}:{tb.gid}" in lines, text
    assert "/data/marker.txt" in lines, text
    assert "data-read-only" in lines, text
    assert "host-file-invisible" in lines, text
    assert "step-rc=0" in lines, text
    return text


def _data_dir(tb: SlurmTestbed, wd: Path) -> Path:
    data = wd / "data"
    data.mkdir()
    (data / "marker.txt").write_text("data\n")
    os.chown(data, tb.uid, tb.gid)
    # On the node's own filesystem (the host, or the chroot slurmd runs in), not mounted.
    (wd / "host-only.txt").write_text("host\n")
    return data


def test_pyxis_runs_the_step_in_the_image(slurm: SlurmTestbed) -> None:
    """Real Pyxis and Enroot: the step runs in the test bed's image, as the job's user, with
    the read-only mount and the working directory it was given; the recording plugin saw the
    command's words as the task's argv."""
    wd = workdir(slurm, "pyxis")
    data = _data_dir(slurm, wd)
    image = image_on_storage(slurm, "base", "sqsh")
    launch = (
        f"srun --container-image={image} --no-container-mount-home "
        f"--container-mounts={data}:/data:ro --container-workdir=/data"
    )
    job_id = submit(slurm, _in_image_script(launch, wd), [component(slurm, wd, "tb-pyxis")])
    _check_in_image(slurm, wd, job_id)
    [step] = step_records(slurm.record_dir, slurm.cluster_name, cwd=str(wd), step_id=0)
    assert step["argv"][:2] == ["sh", "-c"]
    assert step["uid"] == slurm.uid


def test_apptainer_runs_the_step_in_the_image(slurm: SlurmTestbed) -> None:
    """Real Apptainer (non-setuid, unprivileged): the same, with --no-home and --contain."""
    wd = workdir(slurm, "app")
    data = _data_dir(slurm, wd)
    image = image_on_storage(slurm, "base", "sif")
    launch = f"srun apptainer exec --no-home --contain --bind {data}:/data:ro --pwd /data {image}"
    job_id = submit(slurm, _in_image_script(launch, wd), [component(slurm, wd, "tb-app")])
    _check_in_image(slurm, wd, job_id)
    [step] = step_records(slurm.record_dir, slurm.cluster_name, cwd=str(wd), step_id=0)
    assert step["argv"][:3] == ["apptainer", "exec", "--no-home"]


def test_a_signalled_apptainer_step_keeps_its_image(slurm: SlurmTestbed) -> None:
    """A step signal (what a walltime warning is) reaches every process of the step, the
    squashfuse_ll serving the SIF included: the test bed's must survive it, as a site's must
    (README, Slurm-side checklist), or the program dies of SIGBUS at its next page of the
    image. srun forwards the USR1 the batch shell sends it to the step, as Slurm's warning."""
    wd = workdir(slurm, "app-sig")
    image = image_on_storage(slurm, "base", "sif")
    # After the signal, the program opens files and runs a binary it has not read before.
    program = (
        "trap 'got=1' USR1; touch /w/ready; while [ -z \"$got\" ]; do sleep 0.1; done; "
        "python3 -c 'print(\"after-signal\")'; . /etc/os-release; echo codename=$VERSION_CODENAME"
    )
    script = (
        "#!/bin/bash\n"
        f"srun apptainer --quiet exec --no-home --contain --bind {wd}:/w --pwd /w {image} "
        f"sh -c {shlex.quote(program)} &\n"
        "until [ -e ready ]; do sleep 0.1; done\n"
        "kill -USR1 $!\n"
        "wait $!\necho step-rc=$?\n"
    )
    job_id = submit(slurm, script, [component(slurm, wd, "tb-app-sig")])
    text = assert_completed(slurm, wait_done(slurm, job_id, timeout=90), wd, job_id)
    lines = text.splitlines()
    assert "after-signal" in lines, text
    assert "codename=trixie" in lines, text
    assert "step-rc=0" in lines, text
