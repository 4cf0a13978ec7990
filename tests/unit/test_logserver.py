"""The log endpoint (issue 13, part 4) in process: aiohttp's test server, a fake apiserver
(the SlurmJob, its Secret, the token and access reviews) and real files below a storage root.

Authorised reads (tail, from an offset, an array task's log, redacted), refusals (no token, a
token the apiserver does not accept, no right to the SlurmJob, a namespace not watched) and
hostile files (a symlinked log, a FIFO, a huge file, a path-like index, a status naming
another directory)."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from slurmjob_operator.api.logs import LOG_PATH, TOKEN_HEADER
from slurmjob_operator.api.resource import ObjectRef
from slurmjob_operator.config import Settings
from slurmjob_operator.controller.logaccess import ClusterFiles, LogAccess
from slurmjob_operator.core import naming
from slurmjob_operator.core.placement import Clusters
from slurmjob_operator.kube import ReviewedUser, ReviewUnavailable, SecretError
from slurmjob_operator.logserver import Authoriser, make_app

NS, NAME, UID = "team-a", "train", "0b7d9f2a-1111-2222-3333-444455556666"
TOKEN = "alice-token-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
SECRET = "s3cr3t-api-key-value"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeApiserver:
    """The SlurmJobs, a Secret, who each token is and what each user may get."""

    objects: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    secrets: dict[tuple[str, str, str], str] = field(default_factory=dict)
    tokens: dict[str, ReviewedUser] = field(default_factory=dict)
    allowed: set[tuple[str, str, str]] = field(default_factory=set)
    reviews: list[str] = field(default_factory=list)
    gets: int = 0
    down: bool = False

    # ResourceStore (what LogAccess uses)
    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.gets += 1
        return self.objects.get((namespace, name))

    async def read_secret_value(self, namespace: str, name: str, key: str) -> str:
        try:
            return self.secrets[(namespace, name, key)]
        except KeyError:
            raise SecretError(f"Secret {namespace}/{name} does not exist") from None

    async def patch_status(self, ref: ObjectRef, patch: Any) -> None:
        raise AssertionError("the log endpoint writes nothing")

    async def post_event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        raise AssertionError("the log endpoint writes nothing")

    async def close(self) -> None:
        return None

    # AccessReviewer
    async def review_token(self, token: str) -> ReviewedUser | None:
        self.reviews.append("token")
        if self.down:
            raise ReviewUnavailable("TokenReview: HTTP 503 Service Unavailable")
        return self.tokens.get(token)

    async def may_get_slurmjob(
        self, user: ReviewedUser, namespace: str, name: str
    ) -> tuple[bool, str]:
        self.reviews.append("access")
        allowed = (user.username, namespace, name) in self.allowed
        return allowed, "" if allowed else "no RBAC policy matched"


ALICE = ReviewedUser("alice", "uid-a", ("team-a-users", "system:authenticated"))
MALLORY = ReviewedUser("mallory", "uid-m", ("system:authenticated",))


def body(
    *, attempts: int = 1, phase: str = "Running", staging: str | None = None, secret: bool = False
) -> dict[str, Any]:
    spec: dict[str, Any] = {"command": ["true"]}
    if secret:
        spec["env"] = [
            {"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "k"}}}
        ]
    status = {
        "phase": phase,
        "attempts": [
            {"number": n, "jobName": f"sj-{n}", "jobId": 100 + n, "stagingDir": staging}
            for n in range(1, attempts + 1)
        ],
    }
    for a in status["attempts"]:
        if a["stagingDir"] is None:
            del a["stagingDir"]
    return {"metadata": {"namespace": NS, "name": NAME, "uid": UID}, "spec": spec, "status": status}


@dataclass
class Bed:
    client: TestClient[Any, Any]
    api: FakeApiserver
    root: Path
    clock: Clock

    def attempt_dir(self, number: int = 1, name: str = NAME) -> Path:
        path = naming.staging_dir(self.root, NS, name, UID, number)
        path.mkdir(parents=True, exist_ok=True)
        return path

    async def get(
        self, name: str = NAME, token: str | None = TOKEN, namespace: str = NS, **query: str
    ) -> tuple[int, dict[str, Any]]:
        headers = {TOKEN_HEADER: token} if token is not None else {}
        path = LOG_PATH.format(namespace=namespace, name=name)
        resp = await self.client.get(path, params=query, headers=headers)
        data: dict[str, Any] = await resp.json()
        assert resp.headers["Cache-Control"] == "no-store"
        return resp.status, data


@pytest.fixture
async def bed(tmp_path: Path) -> AsyncIterator[Bed]:
    api = FakeApiserver()
    api.tokens[TOKEN] = ALICE
    api.tokens["mallory-token-xxxxxxxxxxxxxxxxxxxx"] = MALLORY
    api.allowed.add(("alice", NS, NAME))
    api.objects[(NS, NAME)] = body()
    settings = Settings(storage_root=tmp_path)
    clock = Clock()
    access = LogAccess(
        api,
        {"default": ClusterFiles(settings, lambda ns: None)},
        Clusters(("default",)),
        namespaces=(NS, "team-b"),
        clock=clock,
    )
    app = make_app(access, Authoriser(api, clock=clock))
    async with TestClient(TestServer(app)) as client:
        yield Bed(client, api, tmp_path, clock)


# -- authorised -----------------------------------------------------------------------------


async def test_an_authorised_user_reads_the_tail(bed: Bed) -> None:
    (bed.attempt_dir() / "stdout.log").write_text("".join(f"line {i}\n" for i in range(3000)))
    status, data = await bed.get()
    assert status == 200
    assert data["found"] is True
    lines = data["text"].splitlines()
    assert len(lines) == 2000  # the seeds' read limit, more than any status tail
    assert lines[-1] == "line 2999"
    assert data["truncated"] is True
    assert data["nextOffset"] == data["size"] == (bed.attempt_dir() / "stdout.log").stat().st_size
    assert (data["attempt"], data["latestAttempt"], data["ended"]) == (1, 1, False)
    assert data["offset"] is None
    assert bed.api.reviews == ["token", "access"]


async def test_a_follower_reads_on_from_an_offset(bed: Bed) -> None:
    log = bed.attempt_dir() / "stdout.log"
    log.write_text("first\nsec")
    status, data = await bed.get(offset="0")
    assert (status, data["text"], data["nextOffset"], data["offset"]) == (200, "first\n", 6, 0)
    with log.open("a") as f:
        f.write("ond\n")
    status, data = await bed.get(offset="6")
    assert (data["text"], data["nextOffset"]) == ("second\n", 13)


async def test_stderr_an_older_attempt_and_an_array_task(bed: Bed) -> None:
    bed.api.objects[(NS, NAME)] = body(attempts=2)
    (bed.attempt_dir(1) / "stderr.log").write_text("attempt one failed\n")
    (bed.attempt_dir(2) / "stdout-7.log").write_text("task seven\n")
    _, data = await bed.get(stream="stderr", attempt="1")
    assert (data["text"], data["attempt"], data["latestAttempt"], data["ended"]) == (
        "attempt one failed\n",
        1,
        2,
        True,  # a newer attempt replaced it
    )
    _, data = await bed.get(index="7")
    assert (data["text"], data["index"]) == ("task seven\n", 7)


async def test_a_log_not_written_yet(bed: Bed) -> None:
    bed.attempt_dir()
    status, data = await bed.get()
    assert (status, data["found"], data["text"], data["nextOffset"]) == (200, False, "", 0)


async def test_secret_values_are_hidden_also_split_between_reads(bed: Bed) -> None:
    bed.api.objects[(NS, NAME)] = body(secret=True, phase="Succeeded")
    bed.api.secrets[(NS, "creds", "k")] = SECRET
    text = f"using key {SECRET} now\n"
    (bed.attempt_dir() / "stdout.log").write_text(text)
    _, data = await bed.get()
    assert data["text"] == "using key *** now\n"
    _, data = await bed.get(offset=str(text.index(SECRET) + 6))
    assert data["text"] == "*** now\n"
    assert data["ended"] is True


async def test_unknown_secret_values_show_nothing(bed: Bed) -> None:
    bed.api.objects[(NS, NAME)] = body(secret=True)  # the Secret is gone
    (bed.attempt_dir() / "stdout.log").write_text(f"key {SECRET}\n")
    status, data = await bed.get()
    assert (status, data["reason"]) == (503, "SecretsUnknown")
    assert SECRET not in str(data)


async def test_a_positive_decision_is_kept_briefly(bed: Bed) -> None:
    bed.attempt_dir()
    await bed.get()
    await bed.get(offset="0")
    assert bed.api.reviews == ["token", "access"]  # the second one from the cache
    bed.clock.now += 10.0
    await bed.get()
    assert bed.api.reviews == ["token", "access"] * 2


async def test_a_read_of_the_slurmjob_is_shared_for_a_second(bed: Bed) -> None:
    bed.attempt_dir()
    await bed.get()
    await bed.get()
    assert bed.api.gets == 1
    bed.clock.now += 1.0
    await bed.get()
    assert bed.api.gets == 2


# -- refused --------------------------------------------------------------------------------


async def test_no_token_is_refused(bed: Bed) -> None:
    (bed.attempt_dir() / "stdout.log").write_text("private\n")
    for token in (None, "", "   "):
        status, data = await bed.get(token=token)
        assert (status, data["kind"], data["reason"]) == (401, "SlurmJobLogError", "TokenMissing")
    assert bed.api.reviews == []
    assert bed.api.gets == 0


async def test_a_token_the_apiserver_does_not_accept_is_refused(bed: Bed) -> None:
    status, data = await bed.get(token="forged-token-zzzzzzzzzzzzzzzzzz")
    assert (status, data["reason"]) == (401, "TokenRefused")
    status, data = await bed.get(token="x" * (16 * 1024 + 1))
    assert (status, data["reason"]) == (401, "TokenRefused")
    assert bed.api.gets == 0


async def test_a_header_the_parser_refuses_is_not_logged_with_its_bytes(
    bed: Bed, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    token = "leaked-" + "y" * (20 * 1024)
    path = LOG_PATH.format(namespace=NS, name=NAME)
    resp = await bed.client.get(path, headers={TOKEN_HEADER: token})
    assert resp.status == 400
    assert "refused by the HTTP parser (LineTooLong)" in caplog.text
    assert "leaked-" not in caplog.text


async def test_a_user_without_get_slurmjobs_is_refused_and_nothing_is_read(
    bed: Bed, caplog: pytest.LogCaptureFixture
) -> None:
    (bed.attempt_dir() / "stdout.log").write_text("private\n")
    caplog.set_level(logging.DEBUG)
    status, data = await bed.get(token="mallory-token-xxxxxxxxxxxxxxxxxxxx")
    assert status == 403
    assert data["message"] == (
        'user "mallory" may not get slurmjobs.slurmjob.io "train" in namespace "team-a", '
        "so it may not read its logs"
    )
    assert bed.api.gets == 0
    # Another SlurmJob in the same namespace is another decision.
    status, _ = await bed.get(name="other")
    assert status == 403
    assert "mallory-token" not in caplog.text
    assert TOKEN not in caplog.text


async def test_a_refusal_is_never_cached(bed: Bed) -> None:
    bed.api.allowed.clear()
    status, _ = await bed.get()
    assert status == 403
    bed.api.allowed.add(("alice", NS, NAME))
    bed.attempt_dir()
    status, _ = await bed.get()
    assert status == 200


async def test_the_apiserver_away_is_503(bed: Bed) -> None:
    bed.api.down = True
    status, data = await bed.get()
    assert (status, data["reason"]) == (503, "ReviewUnavailable")


async def test_a_namespace_not_watched_and_a_missing_slurmjob(bed: Bed) -> None:
    bed.api.allowed.add(("alice", "team-c", NAME))
    status, data = await bed.get(namespace="team-c")
    assert (status, data["reason"]) == (404, "NotWatched")
    bed.api.allowed.add(("alice", NS, "gone"))
    status, data = await bed.get(name="gone")
    assert (status, data["reason"]) == (404, "NotFound")


async def test_bad_names_queries_paths_and_methods(bed: Bed) -> None:
    bed.api.allowed.add(("alice", NS, "UPPER"))
    status, data = await bed.get(name="UPPER")
    assert (status, data["reason"]) == (400, "BadName")
    status, data = await bed.get(index="../../../etc/passwd")
    assert (status, data["reason"]) == (400, "BadQuery")
    assert "index" in data["message"]
    status, data = await bed.get(attempt="9")
    assert (status, data["reason"]) == (404, "NoAttempt")
    resp = await bed.client.get("/metrics")
    assert (resp.status, (await resp.json())["kind"]) == (404, "SlurmJobLogError")
    path = LOG_PATH.format(namespace=NS, name=NAME)
    resp = await bed.client.post(path, headers={TOKEN_HEADER: TOKEN})
    assert resp.status == 405


# -- hostile files --------------------------------------------------------------------------


async def test_a_symlinked_log_is_refused_and_its_target_never_shown(bed: Bed) -> None:
    target = bed.root / "operator-token"
    target.write_text("the operator's own token\n")
    (bed.attempt_dir() / "stdout.log").symlink_to(target)
    status, data = await bed.get()
    assert (status, data["reason"]) == (422, "UnsafeFile")
    assert "operator's own token" not in str(data)
    assert str(bed.root) not in data["message"]
    status, data = await bed.get(offset="0")
    assert (status, data["reason"]) == (422, "UnsafeFile")


async def test_a_symlinked_attempt_directory_is_refused_without_the_roots_path(
    bed: Bed,
) -> None:
    elsewhere = bed.root / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "stdout.log").write_text("not this job's\n")
    attempt = naming.staging_dir(bed.root, NS, NAME, UID, 1)
    attempt.parent.mkdir(parents=True)
    attempt.symlink_to(elsewhere)
    status, data = await bed.get()
    assert (status, data["reason"]) == (422, "UnsafeFile")
    assert "not this job's" not in str(data)
    assert str(bed.root) not in data["message"]
    assert "attempt-1" in data["message"]


async def test_a_fifo_does_not_hang_the_endpoint(bed: Bed) -> None:
    os.mkfifo(bed.attempt_dir() / "stdout.log")
    status, data = await bed.get(offset="0")
    assert (status, data["reason"]) == (422, "UnsafeFile")


async def test_a_huge_file_is_capped(bed: Bed) -> None:
    log = bed.attempt_dir() / "stdout.log"
    with log.open("wb") as f:
        f.truncate(1024 * 1024 * 1024)  # 1 GiB, sparse
        f.seek(0, 2)
        f.write(b"the end\n")
    _, tail = await bed.get()
    assert tail["text"].endswith("the end\n")
    assert len(tail["text"].encode()) <= 64 * 1024
    _, piece = await bed.get(offset="0")
    assert piece["nextOffset"] == 64 * 1024
    assert piece["size"] == log.stat().st_size


async def test_a_status_naming_another_directory_is_not_followed(bed: Bed) -> None:
    other = naming.staging_dir(bed.root, "team-b", "theirs", "ffffffff-0000", 1)
    other.mkdir(parents=True)
    (other / "stdout.log").write_text("team b's results\n")
    bed.api.objects[(NS, NAME)] = body(staging=str(other))
    (bed.attempt_dir() / "stdout.log").write_text("mine\n")
    _, data = await bed.get()
    assert data["text"] == "mine\n"


async def test_a_log_owned_by_someone_else_is_refused(bed: Bed, tmp_path: Path) -> None:
    (bed.attempt_dir() / "stdout.log").write_text("x\n")
    root = bed.root
    access = LogAccess(
        bed.api,
        {"default": ClusterFiles(Settings(storage_root=root), lambda ns: os.geteuid() + 1)},
        Clusters(("default",)),
    )
    app = make_app(access, Authoriser(bed.api))
    async with TestClient(TestServer(app)) as client:
        resp = await client.get(
            LOG_PATH.format(namespace=NS, name=NAME), headers={TOKEN_HEADER: TOKEN}
        )
        data = await resp.json()
    assert (resp.status, data["reason"]) == (422, "UnsafeFile")
    assert "not by the job user" in data["message"]


async def test_an_attempt_on_a_cluster_not_configured(bed: Bed) -> None:
    obj = body()
    obj["status"]["attempts"][0]["cluster"] = "west"
    bed.api.objects[(NS, NAME)] = obj
    status, data = await bed.get()
    assert (status, data["reason"]) == (409, "ClusterUnknown")


# -- serving ----------------------------------------------------------------------------------


async def test_serve_logs_listens_on_the_setting_and_not_at_all_on_0(tmp_path: Path) -> None:
    import socket

    import aiohttp

    from slurmjob_operator.logserver import serve_logs

    api = FakeApiserver()
    assert await serve_logs(Settings(storage_root=tmp_path), api) is None  # type: ignore[arg-type]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = Settings(storage_root=tmp_path, logs_port=port, logs_address="127.0.0.1")
    listener = await serve_logs(settings, api)  # type: ignore[arg-type]
    assert listener is not None
    try:
        url = f"http://127.0.0.1:{port}" + LOG_PATH.format(namespace=NS, name=NAME)
        async with aiohttp.ClientSession() as http, http.get(url) as resp:
            assert resp.status == 401
            assert (await resp.json())["reason"] == "TokenMissing"
    finally:
        await listener.close()
