"""The Slurm test bed itself works: raw slurmrestd HTTP only, no project code."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
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


def records(tb: SlurmTestbed, kind: str, job_id: int, wd: Path) -> list[dict[str, Any]]:
    """Records of this job: job ids repeat across runs (fresh state), so match the dir too."""
    path = tb.record_dir / f"{kind}.jsonl"
    found = []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("cluster") != tb.cluster_name or rec.get("cwd") != str(wd):
            continue
        if str(rec.get("job_id", rec.get("slurm_job_id"))) == str(job_id):
            found.append(rec)
    return found


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


def test_pyxis_spank_double_records_srun_options(slurm: SlurmTestbed) -> None:
    wd = workdir(slurm, "pyxis")
    script = (
        "#!/bin/bash\n"
        "set -e\n"
        "srun --container-image=/x.sqsh --container-mounts=/a:/b:ro "
        "--container-workdir=/w true\n"
        "srun --container-image=/y.sqsh --container-env=A,B --container-writable "
        "--no-container-mount-home true\n"
        "srun true\n"
        "echo ok\n"
    )
    job_id = submit(slurm, script, [component(slurm, wd, "tb-pyxis")])
    jobs = wait_done(slurm, job_id)
    assert "ok" in assert_completed(slurm, jobs, wd, job_id)
    recs = sorted(records(slurm, "pyxis", job_id, wd), key=lambda r: r["step_id"])
    assert len(recs) == 2, recs  # the plain `srun true` is not recorded
    first, second = recs
    assert first["container_image"] == "/x.sqsh"
    assert first["container_mounts"] == "/a:/b:ro"
    assert first["container_workdir"] == "/w"
    assert first["container_env"] is None
    assert first["container_writable"] is False
    assert first["nodename"] == "n1"
    assert second["container_image"] == "/y.sqsh"
    assert second["container_env"] == "A,B"
    assert second["container_writable"] is True
    assert second["no_container_mount_home"] is True


def test_apptainer_and_ray_standins(slurm: SlurmTestbed) -> None:
    wd = workdir(slurm, "app")
    sif = wd / "image.sif"
    sif.write_bytes(
        b"#!/usr/bin/env run-singularity\n".ljust(32, b"\n") + b"SIF_MAGIC01" + bytes(64)
    )
    (wd / "not.sif").write_bytes(b"x" * 100)
    script = f"""#!/bin/bash
set -u
apptainer exec --nv --bind /a:/b:ro --pwd /tmp {sif} echo hi
apptainer exec --pwd /tmp {sif} pwd
srun apptainer exec --cleanenv {sif} sh -c 'echo task=$SLURM_PROCID'
apptainer exec --bogus {sif} true; echo "bogus rc=$?"
apptainer exec {wd}/not.sif true; echo "notsif rc=$?"
ray start --head --port=6379 --num-gpus=2 --block &
pid=$!
sleep 0.5
ray health-check --address=$SLURMD_NODENAME:6379; echo "health rc=$?"
ray start --address=$SLURMD_NODENAME:6379 --num-gpus=2; echo "worker rc=$?"
ray stop; echo "stop rc=$?"
ray start --nope; echo "badray rc=$?"
kill $pid; wait $pid; echo "head rc=$?"
"""
    job_id = submit(slurm, script, [component(slurm, wd, "tb-app")])
    jobs = wait_done(slurm, job_id)
    text = assert_completed(slurm, jobs, wd, job_id)
    lines = text.splitlines()
    assert "hi" in lines
    assert "/tmp" in lines
    assert "task=0" in lines
    for expected in (
        "bogus rc=2",
        "notsif rc=255",
        "health rc=0",
        "worker rc=0",
        "stop rc=0",
        "badray rc=2",
        "head rc=0",
    ):
        assert expected in lines, text
    app = records(slurm, "apptainer", job_id, wd)
    assert len(app) == 3, app
    assert app[0]["argv"] == [
        "apptainer", "exec", "--nv", "--bind", "/a:/b:ro", "--pwd", "/tmp", str(sif), "echo", "hi",
    ]  # fmt: skip
    assert app[0]["nv"] is True
    assert app[0]["binds"] == [{"src": "/a", "dst": "/b", "mode": "ro"}]
    assert app[0]["nodename"] == "n1"
    assert app[2]["slurm_procid"] == "0"
    ray = records(slurm, "ray", job_id, wd)
    assert [r["command"] for r in ray] == ["start", "health-check", "start", "stop"], ray
    assert ray[0]["options"] == {
        "--head": True,
        "--port": "6379",
        "--num-gpus": "2",
        "--block": True,
    }
    assert ray[2]["options"]["--address"] == "n1:6379"
