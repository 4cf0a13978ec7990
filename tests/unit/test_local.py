"""`submit`'s local store (merge patches, atomic files, secrets, events) and the exit codes
of `slurmjob-operator submit` for invalid input; nothing here talks to Slurm."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from slurmjob_operator.api.resource import ObjectRef
from slurmjob_operator.cli import EXIT_INVALID, main
from slurmjob_operator.config import Settings
from slurmjob_operator.kube import KubeApi, SecretError
from slurmjob_operator.kube.ports import KeepsDeleted
from slurmjob_operator.local import (
    LocalInputError,
    LocalStore,
    default_state_dir,
    load_secrets_file,
    new_object,
    object_key,
)

REPO = Path(__file__).resolve().parents[2]
CPU_EXAMPLE = REPO / "examples/cpu-job.yaml"


def _body(name: str = "job", namespace: str = "team-a", uid: str = "u-1") -> dict[str, Any]:
    return {
        "apiVersion": "slurmjob.io/v1alpha1",
        "kind": "SlurmJob",
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "generation": 1},
        "spec": {"command": ["true"]},
    }


# -- the store --------------------------------------------------------------------------


def test_only_the_local_store_says_it_keeps_deleted_slurmjobs(tmp_path: Path) -> None:
    """Its files stay after a cancel, so a deletion writes the last tails there; the
    Kubernetes API removes a SlurmJob with its last finalizer (no tails written for no one)."""
    assert isinstance(LocalStore(tmp_path), KeepsDeleted)
    assert not hasattr(KubeApi, "keeps_deleted")


async def test_patch_status_merges_into_the_stored_status(tmp_path: Path) -> None:
    events = io.StringIO()
    store = LocalStore(tmp_path, events=events)
    store.create(_body())
    ref = ObjectRef("team-a", "job", "u-1")
    first = await store.patch_status(ref, {"phase": "Queued", "attempts": [{"number": 1}]})
    assert first is not None
    assert first["status"] == {"phase": "Queued", "attempts": [{"number": 1}]}
    second = await store.patch_status(
        ref, {"phase": "Running", "logs": {"stdout": {"tail": "x"}}, "attempts": None}
    )
    assert second is not None
    assert second["status"] == {"phase": "Running", "logs": {"stdout": {"tail": "x"}}}
    stored = await store.get("team-a", "job")
    assert stored == second
    assert stored["spec"] == {"command": ["true"]}, "only the status is patched"
    assert events.getvalue().splitlines() == ["phase: Queued", "phase: Running"]


async def test_patch_status_of_a_missing_or_replaced_object_is_none(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    assert await store.patch_status(ObjectRef("team-a", "job", "u-1"), {"phase": "X"}) is None
    store.create(_body(uid="u-2"))
    assert await store.patch_status(ObjectRef("team-a", "job", "u-1"), {"phase": "X"}) is None
    body = await store.get("team-a", "job")
    assert body is not None
    assert "status" not in body


async def test_get_of_an_unknown_object_is_none(tmp_path: Path) -> None:
    assert await LocalStore(tmp_path).get("team-a", "nothing") is None


def test_objects_live_in_namespace_folders_as_json(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.create(_body())
    path = tmp_path / "team-a" / "job.json"
    assert store.path("team-a", "job") == path
    assert json.loads(path.read_text())["metadata"]["uid"] == "u-1"
    assert path.stat().st_mode & 0o777 == 0o600


def test_create_never_overwrites(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.create(_body(uid="u-1"))
    with pytest.raises(FileExistsError):
        store.create(_body(uid="u-2"))
    assert json.loads((tmp_path / "team-a/job.json").read_text())["metadata"]["uid"] == "u-1"
    assert [p.name for p in (tmp_path / "team-a").iterdir()] == ["job.json"]


def test_remove(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.create(_body())
    assert store.remove("team-a", "job") is True
    assert store.remove("team-a", "job") is False
    assert store.load("team-a", "job") is None


def test_names_that_would_leave_the_state_dir_are_refused(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    for namespace, name in [("..", "x"), ("ns", "../x"), ("ns", "a/b"), ("NS", "x"), ("ns", "")]:
        with pytest.raises(LocalInputError, match=r"metadata\.(name|namespace)"):
            store.path(namespace, name)


async def test_events_are_lines_on_the_stream(tmp_path: Path) -> None:
    events = io.StringIO()
    store = LocalStore(tmp_path, events=events)
    ref = ObjectRef("team-a", "job", "u-1")
    await store.post_event(ref, "Normal", "Submitted", "attempt 1 submitted as Slurm job 7")
    await store.post_event(ref, "Warning", "Failed", "NonZeroExitCode: exit code 3")
    assert events.getvalue() == (
        "Normal Submitted: attempt 1 submitted as Slurm job 7\n"
        "Warning Failed: NonZeroExitCode: exit code 3\n"
    )


# -- secrets ----------------------------------------------------------------------------


async def test_secrets_come_from_the_secrets_file(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets.yaml"
    secrets.write_text(yaml.safe_dump({"hf": {"token": "s3cret"}, "db": {"password": "pw"}}))
    store = LocalStore(tmp_path / "state", secrets_file=secrets)
    assert await store.read_secret_value("team-a", "hf", "token") == "s3cret"
    assert await store.read_secret_value("team-a", "db", "password") == "pw"
    with pytest.raises(SecretError, match=r"Secret team-a/nope does not exist"):
        await store.read_secret_value("team-a", "nope", "token")
    with pytest.raises(SecretError, match=r"Secret team-a/hf has no key 'other'"):
        await store.read_secret_value("team-a", "hf", "other")


async def test_secrets_file_is_read_again_on_each_lookup(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets.yaml"
    secrets.write_text("{}\n")
    store = LocalStore(tmp_path / "state", secrets_file=secrets)
    with pytest.raises(SecretError):
        await store.read_secret_value("ns", "hf", "token")
    secrets.write_text("hf: {token: abc}\n")
    assert await store.read_secret_value("ns", "hf", "token") == "abc"


async def test_without_a_secrets_file_every_secret_is_missing(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    with pytest.raises(SecretError, match="no --secrets-file given"):
        await store.read_secret_value("ns", "hf", "token")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("- a\n- b\n", "expected a mapping"),
        ("hf: token\n", "hf: expected a mapping"),
        ("hf: {token: 123}\n", r"hf\.token: expected a string"),
        ("hf: {token: [\n", "not valid YAML"),
    ],
)
def test_malformed_secrets_files_are_refused(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "secrets.yaml"
    path.write_text(text)
    with pytest.raises(LocalInputError, match=match):
        load_secrets_file(path)


def test_a_missing_secrets_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(LocalInputError, match="cannot read"):
        load_secrets_file(tmp_path / "nope.yaml")


# -- objects and defaults ---------------------------------------------------------------


def test_new_object_has_the_metadata_an_api_server_would_add() -> None:
    manifest = yaml.safe_load(CPU_EXAMPLE.read_text())
    first = new_object(manifest, "default", "cpu-hello")
    second = new_object(manifest, "default", "cpu-hello")
    meta = first["metadata"]
    assert meta["name"] == "cpu-hello"
    assert meta["namespace"] == "default"
    assert meta["generation"] == 1
    assert meta["creationTimestamp"].endswith("Z")
    assert meta["uid"] != second["metadata"]["uid"]
    assert first["spec"] == manifest["spec"]
    assert "status" not in first


def test_object_key_defaults_and_conflicts() -> None:
    assert object_key({"metadata": {"name": "a"}}) == ("default", "a")
    assert object_key({"metadata": {"name": "a"}}, "team-b") == ("team-b", "a")
    assert object_key({"metadata": {"name": "a", "namespace": "x"}}, "x") == ("x", "a")
    with pytest.raises(LocalInputError, match=r"metadata\.namespace: 'x' does not match"):
        object_key({"metadata": {"name": "a", "namespace": "x"}}, "y")
    with pytest.raises(LocalInputError, match=r"metadata\.name: required"):
        object_key({"metadata": {}})


def test_default_state_dir() -> None:
    assert default_state_dir({"XDG_STATE_HOME": "/x/state", "HOME": "/home/u"}) == Path(
        "/x/state/slurmjob-operator"
    )
    assert default_state_dir({"HOME": "/home/u"}) == Path("/home/u/.local/state/slurmjob-operator")
    assert default_state_dir({"XDG_STATE_HOME": "relative", "HOME": "/home/u"}) == Path(
        "/home/u/.local/state/slurmjob-operator"
    )


# -- the command: invalid input is exit 2 and reaches nothing ---------------------------


@pytest.fixture
def site(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in Settings.model_fields:
        monkeypatch.delenv(Settings.env_name(name), raising=False)
    monkeypatch.setenv(
        "SLURMJOB_RUNTIME_REGISTRY_FILE", str(REPO / "examples/site/runtime-registry.yaml")
    )
    monkeypatch.setenv("SLURMJOB_GPU_SERIES_FILE", str(REPO / "examples/site/gpu-series.yaml"))
    monkeypatch.setenv("SLURMJOB_STORAGE_ROOT", str(tmp_path / "storage"))
    # Nothing listens there: a test that reached Slurm would fail with exit 1, not 2.
    monkeypatch.setenv("SLURMJOB_SLURM_REST_URL", "http://127.0.0.1:9")
    token = tmp_path / "jwt"
    token.write_text("not-a-token\n")
    monkeypatch.setenv("SLURMJOB_SLURM_JWT_FILE", str(token))
    return tmp_path / "state"


def submit(*argv: str, stdin: str = "") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["submit", *argv], out=out, err=err, stdin=io.StringIO(stdin))
    return code, out.getvalue(), err.getvalue()


def _manifest(**changes: Any) -> str:
    manifest = yaml.safe_load(CPU_EXAMPLE.read_text())
    for path, value in changes.items():
        node = manifest
        keys = path.split("__")
        for key in keys[:-1]:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[keys[-1]] = value
    return yaml.safe_dump(manifest)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (_manifest(kind="Job"), "kind"),
        (_manifest(apiVersion="v1"), "apiVersion"),
        (_manifest(metadata={"namespace": "default"}), "metadata.name"),
        (_manifest(metadata={"name": "Bad_Name"}), "metadata.name"),
        (_manifest(metadata={"name": "ok", "namespace": "a/b"}), "metadata.namespace"),
        (_manifest(spec__pools=[]), "spec.pools"),
        (_manifest(spec__framework__runtimeId="custom-missing"), "spec.framework.runtimeId"),
        ("{not yaml", "not valid YAML"),
    ],
)
def test_invalid_manifests_exit_2_naming_the_field(site: Path, text: str, field: str) -> None:
    code, out, err = submit("-f", "-", "--state-dir", str(site), stdin=text)
    assert code == EXIT_INVALID, err
    assert out == ""
    assert err.startswith("error: ")
    assert field in err
    assert not site.exists(), "nothing was stored"


def test_gpu_field_errors_name_the_pool(site: Path) -> None:
    manifest = yaml.safe_load(CPU_EXAMPLE.read_text())
    manifest["spec"]["pools"][0]["gpusPerNode"] = -1
    code, _, err = submit("-f", "-", "--state-dir", str(site), stdin=yaml.safe_dump(manifest))
    assert code == EXIT_INVALID
    assert "spec.pools[0].gpusPerNode" in err


def test_namespace_option_must_match_the_manifest(site: Path) -> None:
    code, _, err = submit("-f", str(CPU_EXAMPLE), "-n", "other", "--state-dir", str(site))
    assert code == EXIT_INVALID
    assert "metadata.namespace" in err


def test_bad_settings_exit_2_naming_the_variable(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURMJOB_POLL_INTERVAL", "soon")
    code, _, err = submit("-f", str(CPU_EXAMPLE), "--state-dir", str(site))
    assert code == EXIT_INVALID
    assert "SLURMJOB_POLL_INTERVAL" in err


def test_missing_credentials_exit_2_before_anything_is_stored(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SLURMJOB_SLURM_JWT_FILE")
    code, _, err = submit("-f", str(CPU_EXAMPLE), "--state-dir", str(site))
    assert code == EXIT_INVALID
    assert "SLURMJOB_SLURM_JWT_FILE" in err
    assert not (site / "default" / "cpu-hello.json").exists()


def test_malformed_secrets_file_exits_2(site: Path, tmp_path: Path) -> None:
    secrets = tmp_path / "secrets.yaml"
    secrets.write_text("hf: {token: 1}\n")
    code, _, err = submit(
        "-f", str(CPU_EXAMPLE), "--state-dir", str(site), "--secrets-file", str(secrets)
    )
    assert code == EXIT_INVALID
    assert "--secrets-file" in err
    assert "hf.token" in err


def test_non_positive_timeout_exits_2(site: Path) -> None:
    code, _, err = submit("-f", str(CPU_EXAMPLE), "--state-dir", str(site), "--timeout", "0")
    assert code == EXIT_INVALID
    assert "--timeout" in err


def test_a_name_already_submitted_exits_2(site: Path) -> None:
    store = LocalStore(site)
    store.create(_body(name="cpu-hello", namespace="default", uid="u-old"))
    code, out, err = submit("-f", str(CPU_EXAMPLE), "--state-dir", str(site))
    assert code == EXIT_INVALID, err
    assert out == ""
    assert "metadata.name: default/cpu-hello was already submitted" in err
    assert "--cancel cpu-hello" in err
    body = store.load("default", "cpu-hello")
    assert body is not None
    assert body["metadata"]["uid"] == "u-old", "the earlier job's state is kept"


@pytest.mark.parametrize("option", ["--status", "--cancel"])
def test_status_or_cancel_of_an_unknown_name_exits_2(site: Path, option: str) -> None:
    code, out, err = submit(option, "nothing", "-n", "team-a", "--state-dir", str(site))
    assert code == EXIT_INVALID
    assert out == ""
    assert "team-a/nothing: nothing was submitted under that name" in err


def test_exactly_one_of_file_status_cancel(site: Path) -> None:
    assert submit("--state-dir", str(site))[0] == EXIT_INVALID
    assert submit("-f", str(CPU_EXAMPLE), "--status", "x")[0] == EXIT_INVALID


# -- the command: what cannot proceed is retried until --timeout, then forgotten ---------

GPU_EXAMPLE = REPO / "examples/gpu-single-pool.yaml"  # reads Secret hf/token


def test_a_missing_secret_is_retried_until_the_timeout(site: Path) -> None:
    code, out, err = submit("-f", str(GPU_EXAMPLE), "--state-dir", str(site), "--timeout", "1")
    assert code == 1, err
    status = json.loads(out)
    assert status["phase"] == "Pending"
    assert status["message"] == ("Secret team-a/hf does not exist (no --secrets-file given)")
    assert "Warning SecretNotFound: Secret team-a/hf does not exist" in err
    assert re.search(r"retrying in [01]\.\d s: Secret team-a/hf does not exist", err)
    assert "nothing was submitted" in err
    assert not (site / "team-a" / "llama-finetune.json").exists(), "the name can be used again"


def test_an_unreachable_slurmrestd_is_retried_until_the_timeout(site: Path, tmp_path: Path) -> None:
    secrets = tmp_path / "secrets.yaml"
    secrets.write_text("hf: {token: s3cret}\n")
    code, out, err = submit(
        "-f",
        str(GPU_EXAMPLE),
        "--state-dir",
        str(site),
        "--secrets-file",
        str(secrets),
        "--timeout",
        "1",
    )
    assert code == 1, err
    status = json.loads(out)
    assert status["phase"] == "Pending"
    assert [c["reason"] for c in status["conditions"] if c["type"] == "Ready"] == [
        "SlurmUnavailable"
    ]
    assert "s3cret" not in out + err
