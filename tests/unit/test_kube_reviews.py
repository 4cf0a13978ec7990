"""`KubeApi.review_token` and `may_get_slurmjob` against an in-process stand-in for the
apiserver's review APIs: the bodies sent (the token in the TokenReview's spec only; the
reviewed user's name, uid, groups and extra with `get slurmjobs.slurmjob.io NAME` in the
SubjectAccessReview) and the answers read back, refusals and failures included."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio import client as k8s

from slurmjob_operator.kube import KubeApi, ReviewedUser, ReviewUnavailable

TOKEN = "tok-0123456789abcdef"


class Reviews:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any], dict[str, str]]] = []
        self.token_answer: dict[str, Any] = {}
        self.access_answer: dict[str, Any] = {}
        self.fail = 0

    def app(self) -> web.Application:
        async def tokens(request: web.Request) -> web.Response:
            return await self._answer(request, "token", self.token_answer)

        async def access(request: web.Request) -> web.Response:
            return await self._answer(request, "access", self.access_answer)

        app = web.Application()
        app.router.add_post("/apis/authentication.k8s.io/v1/tokenreviews", tokens)
        app.router.add_post("/apis/authorization.k8s.io/v1/subjectaccessreviews", access)
        return app

    async def _answer(
        self, request: web.Request, kind: str, status: dict[str, Any]
    ) -> web.Response:
        body = await request.json()
        self.seen.append((kind, body, dict(request.headers)))
        if self.fail:
            return web.json_response({"kind": "Status", "code": self.fail}, status=self.fail)
        return web.json_response({**body, "status": status}, status=201)


@pytest.fixture
async def bed() -> AsyncIterator[tuple[Reviews, KubeApi]]:
    reviews = Reviews()
    server = TestServer(reviews.app())
    await server.start_server()
    configuration = k8s.Configuration(host=str(server.make_url("")).rstrip("/"))
    api = KubeApi(k8s.ApiClient(configuration))
    yield reviews, api
    await api.close()
    await server.close()


async def test_a_token_is_reviewed_and_its_user_read_back(bed: tuple[Reviews, KubeApi]) -> None:
    reviews, api = bed
    reviews.token_answer = {
        "authenticated": True,
        "user": {
            "username": "system:serviceaccount:team-a:reader",
            "uid": "u-1",
            "groups": ["system:serviceaccounts", "system:authenticated"],
            "extra": {"authentication.kubernetes.io/pod-name": ["p-1"]},
        },
    }
    user = await api.review_token(TOKEN)
    assert user == ReviewedUser(
        "system:serviceaccount:team-a:reader",
        "u-1",
        ("system:serviceaccounts", "system:authenticated"),
        {"authentication.kubernetes.io/pod-name": ("p-1",)},
    )
    kind, body, headers = reviews.seen[0]
    assert kind == "token"
    assert body["spec"] == {"token": TOKEN}
    assert TOKEN not in json.dumps(headers)  # the operator's own credentials, never the user's


@pytest.mark.parametrize(
    "answer",
    [
        {"authenticated": False, "error": "token expired"},
        {"authenticated": True},
        {"authenticated": True, "user": {"username": ""}},
        {},
    ],
)
async def test_a_token_not_accepted_is_none(
    bed: tuple[Reviews, KubeApi], answer: dict[str, Any]
) -> None:
    reviews, api = bed
    reviews.token_answer = answer
    assert await api.review_token(TOKEN) is None


async def test_the_access_review_asks_for_get_on_that_slurmjob(
    bed: tuple[Reviews, KubeApi],
) -> None:
    reviews, api = bed
    reviews.access_answer = {"allowed": True, "reason": 'RBAC: allowed by RoleBinding "r"'}
    user = ReviewedUser("alice", "u-9", ("devs",), {"scopes": ("a", "b")})
    allowed, why = await api.may_get_slurmjob(user, "team-a", "train")
    assert (allowed, why) == (True, 'RBAC: allowed by RoleBinding "r"')
    kind, body, _ = reviews.seen[0]
    assert kind == "access"
    assert body["spec"] == {
        "user": "alice",
        "uid": "u-9",
        "groups": ["devs"],
        "extra": {"scopes": ["a", "b"]},
        "resourceAttributes": {
            "namespace": "team-a",
            "verb": "get",
            "group": "slurmjob.io",
            "version": "v1alpha1",
            "resource": "slurmjobs",
            "name": "train",
        },
    }


@pytest.mark.parametrize(
    ("answer", "allowed"),
    [
        ({"allowed": False}, False),
        ({"allowed": True, "denied": True}, False),  # a deny wins
    ],
)
async def test_access_refused(
    bed: tuple[Reviews, KubeApi], answer: dict[str, Any], allowed: bool
) -> None:
    reviews, api = bed
    reviews.access_answer = answer
    result, _ = await api.may_get_slurmjob(ReviewedUser("bob"), "team-a", "train")
    assert result is allowed
    assert "uid" not in reviews.seen[0][1]["spec"]  # none known, none claimed


async def test_a_failing_apiserver_raises_without_the_token(bed: tuple[Reviews, KubeApi]) -> None:
    reviews, api = bed
    reviews.fail = 403  # the operator may not create reviews (the chart's ClusterRole missing)
    with pytest.raises(ReviewUnavailable, match="TokenReview: HTTP 403") as caught:
        await api.review_token(TOKEN)
    assert TOKEN not in str(caught.value)
    assert caught.value.__cause__ is None
    with pytest.raises(ReviewUnavailable, match="SubjectAccessReview: HTTP 403"):
        await api.may_get_slurmjob(ReviewedUser("bob"), "team-a", "train")


async def test_an_answer_without_its_required_fields_is_no_answer(
    bed: tuple[Reviews, KubeApi],
) -> None:
    reviews, api = bed
    reviews.access_answer = {"reason": "no allowed field"}
    with pytest.raises(ReviewUnavailable, match="no SubjectAccessReview"):
        await api.may_get_slurmjob(ReviewedUser("bob"), "team-a", "train")
