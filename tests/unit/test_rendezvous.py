"""Rendezvous ports (issue 42, part 3): no fixed port in a job's script unless its spec sets
masterPort; the batch script picks free ones on the first node at run time, and the picker
itself, run here in bash, yields ports free on this machine and never one a socket holds."""

from __future__ import annotations

import random
import re
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from slurmjob_operator.api.spec import SlurmJobSpec
from slurmjob_operator.core.launch import RAY_PICKED_PORTS, picked_ports
from slurmjob_operator.gen.crd import build_crd
from slurmjob_operator.site.render import render_attempt

from .test_render_support import (
    make_context,
    make_spec,
    pools_for,
    profile_format,
    run_attempt,
    stand_in_settings,
    write_artifact,
)

#: Ports the script used to fix (MASTER_PORT's old default, Ray's GCS) and Ray's own defaults
#: (client server, dashboard, dashboard agent).
FIXED = ("29500", "6379", "10001", "8265", "52365")
PORT_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _script(tmp: Path, shape: str, launch: dict[str, Any] | None) -> str:
    settings = stand_in_settings(tmp)
    artifact = write_artifact(settings, profile_format(settings.slurm_runtime_profile))
    extra = {"launch": launch} if launch is not None else {}
    pools = pools_for(shape)
    if launch is not None and launch.get("shape") == "tasks":
        pools[0]["tasksPerNode"] = 2 if shape == "gpu" else 1
    spec = make_spec(shape, pools=pools, **extra)
    return render_attempt(spec, make_context(spec, settings, artifact)).launch.script


def _free_ports_function(script: str) -> str:
    """The picker's definition, as the rendered script has it."""
    match = re.search(r"^free_ports\(\) \{\n.*?^\}\n", script, re.MULTILINE | re.DOTALL)
    assert match is not None
    return match.group(0)


@pytest.mark.parametrize(
    ("ray", "master_port", "expected"),
    [
        (False, None, ("master_port",)),
        (False, 29500, ()),  # a stored or explicit masterPort: nothing picked, as before
        (True, None, ("master_port", *RAY_PICKED_PORTS)),
        (True, 29611, RAY_PICKED_PORTS),  # Ray's own ports are never the spec's
    ],
)
def test_which_ports_the_script_picks(
    ray: bool, master_port: int | None, expected: tuple[str, ...]
) -> None:
    assert picked_ports(ray=ray, master_port=master_port) == expected


def test_master_port_has_no_default_and_a_stored_one_is_kept() -> None:
    launch = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ]["launch"]["properties"]["masterPort"]
    assert "default" not in launch
    body = make_spec("gpu").model_dump(by_alias=True, exclude_none=True)
    assert SlurmJobSpec.model_validate(body).master_port is None
    body["launch"] = {"shape": "nodes", "masterPort": 29500}  # as the old CRD default stored it
    assert SlurmJobSpec.model_validate(body).master_port == 29500


@pytest.mark.parametrize(
    ("shape", "launch"),
    [
        ("cpu", None),
        ("cpu", {"shape": "tasks"}),
        ("gpu", None),  # ray
        ("het", None),
        ("gpu", {"shape": "nodes"}),
        ("het", {"shape": "torchrun"}),
        ("gpu", {"shape": "tasks"}),
    ],
)
def test_a_job_without_master_port_has_no_fixed_port(
    tmp_path: Path, shape: str, launch: dict[str, Any] | None
) -> None:
    script = _script(tmp_path, shape, launch)
    for port in FIXED:
        assert re.search(rf"\b{port}\b", script) is None, port
    assert "export MASTER_PORT=$master_port" in script
    assert 'mapfile -t job_ports < <(free_ports 1 "$port_low" "$port_high")' in script or (
        "ray start --head" in script
    )


def test_a_ray_job_picks_every_port_its_head_would_fix(tmp_path: Path) -> None:
    script = _script(tmp_path, "gpu", {"shape": "ray", "masterPort": 29611})
    assert "export MASTER_PORT=29611" in script
    assert 'free_ports 4 "$port_low" "$port_high"' in script
    head = script[script.index("ray start --head") :].split("--block")[0]
    for flag in ("--port", "--ray-client-server-port", "--dashboard-port"):
        assert re.search(rf'{flag}="\$ray_\w+"', head), flag
    # The node manager, object manager and workers bind port 0 on every node.
    assert "--node-manager-port=0" in script
    assert "--min-worker-port=0 --max-worker-port=0" in script
    assert '"${ray_node_ports[@]}"' in head


def test_an_explicit_master_port_is_used_and_nothing_is_picked(tmp_path: Path) -> None:
    script = _script(tmp_path, "gpu", {"shape": "torchrun", "masterPort": 29611})
    assert "export MASTER_PORT=29611" in script
    assert "free_ports" not in script
    assert "SLURMD_NODENAME" not in script  # runs wherever it ran before


def _run_picker(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "bash",
            "-c",
            f'set -euo pipefail\n{_free_ports_function(script)}free_ports "$@"',
            "-",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )


@contextmanager
def _held(kind: socket.SocketKind, family: socket.AddressFamily) -> Iterator[int]:
    """A socket bound (and, for TCP, listening) on a free port below the kernel's ephemeral
    range: once it is closed, no socket of the suite's other processes (which bind port 0)
    is given that port before the test asks for it again."""
    low = int(PORT_RANGE.read_text().split()[0])
    sock = socket.socket(family, kind)
    try:
        for port in random.sample(range(max(1024, low - 12000), low), 200):
            try:
                sock.bind(("::" if family == socket.AF_INET6 else "127.0.0.1", port))
            except OSError:
                continue
            break
        else:
            pytest.skip("no free port below the ephemeral range")
        if kind == socket.SOCK_STREAM:
            sock.listen()
        yield int(sock.getsockname()[1])
    finally:
        sock.close()


def test_the_picker_yields_distinct_ports_free_on_this_machine(tmp_path: Path) -> None:
    script = _script(tmp_path, "gpu", None)
    low, high = PORT_RANGE.read_text().split()
    done = _run_picker(script, "5", low, high)
    assert done.returncode == 0, done.stderr
    ports = [int(p) for p in done.stdout.split()]
    assert len(set(ports)) == 5
    for port in ports:
        assert int(low) <= port <= int(high)
        with socket.socket() as sock:  # free: this machine lets us bind it
            sock.bind(("0.0.0.0", port))


@pytest.mark.parametrize(
    ("kind", "family"),
    [
        (socket.SOCK_STREAM, socket.AF_INET),
        (socket.SOCK_DGRAM, socket.AF_INET),
        (socket.SOCK_STREAM, socket.AF_INET6),
    ],
)
def test_the_picker_never_yields_a_port_a_socket_holds(
    tmp_path: Path, kind: socket.SocketKind, family: socket.AddressFamily
) -> None:
    if family == socket.AF_INET6 and not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    script = _script(tmp_path, "gpu", None)
    with _held(kind, family) as port:
        # The only port in range is the held one: there is none to give.
        held = _run_picker(script, "1", str(port), str(port))
        assert held.returncode == 1
        assert held.stdout == ""
    # Released, the same range gives exactly that port.
    free = _run_picker(script, "1", str(port), str(port))
    assert free.returncode == 0, free.stderr
    assert free.stdout.split() == [str(port)]


def test_a_script_not_on_the_first_node_refuses_to_pick(tmp_path: Path) -> None:
    settings = stand_in_settings(tmp_path)
    artifact = write_artifact(settings, profile_format(settings.slurm_runtime_profile))
    spec = make_spec("gpu", env=[], launch={"shape": "nodes"})
    rendered = render_attempt(spec, make_context(spec, settings, artifact))
    moved = run_attempt(rendered, settings, tmp_path / "work", extra_env={"SLURMD_NODENAME": "n2"})
    assert moved.returncode == 95
    assert "not on the job's first node n1" in moved.stderr
    assert moved.steps == []
