"""`KubeApi.may_read_log` and `read_configmap` against an in-process stand-in for the
apiserver: the SubjectAccessReview's body (the user, uid, groups and extra the front proxy
named, with `get slurmjobs/log` in `logs.slurmjob.io` for that namespace and name), the
answers read back, refusals and failures included; the authentication ConfigMap's data."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio import client as k8s

from slurmjob_operator.core.requestheader import RemoteUser
from slurmjob_operator.kube import ConfigMapUnavailable, KubeApi, ReviewUnavailable

CONFIGMAP_PATH = "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication"


class Apiserver:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []
        self.access_answer: dict[str, Any] = {}
        self.configmap: dict[str, Any] | None = None
        self.fail = 0

    def app(self) -> web.Application:
        async def access(request: web.Request) -> web.Response:
            body = await request.json()
            self.seen.append(("access", body))
            if self.fail:
                return web.json_response({"kind": "Status", "code": self.fail}, status=self.fail)
            return web.json_response({**body, "status": self.access_answer}, status=201)

        async def configmap(request: web.Request) -> web.Response:
            self.seen.append(("configmap", {}))
            if self.fail:
                return web.json_response({"kind": "Status", "code": self.fail}, status=self.fail)
            if self.configmap is None:
                return web.json_response({"kind": "Status", "code": 404}, status=404)
            return web.json_response(
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": "extension-apiserver-authentication"},
                    **self.configmap,
                }
            )

        app = web.Application()
        app.router.add_post("/apis/authorization.k8s.io/v1/subjectaccessreviews", access)
        app.router.add_get(CONFIGMAP_PATH, configmap)
        return app


@pytest.fixture
async def bed() -> AsyncIterator[tuple[Apiserver, KubeApi]]:
    apiserver = Apiserver()
    server = TestServer(apiserver.app())
    await server.start_server()
    configuration = k8s.Configuration(host=str(server.make_url("")).rstrip("/"))
    api = KubeApi(k8s.ApiClient(configuration))
    yield apiserver, api
    await api.close()
    await server.close()


async def test_the_access_review_asks_for_get_on_that_slurmjobs_log(
    bed: tuple[Apiserver, KubeApi],
) -> None:
    apiserver, api = bed
    apiserver.access_answer = {"allowed": True, "reason": 'RBAC: allowed by RoleBinding "r"'}
    user = RemoteUser("alice", "u-9", ("devs", "system:authenticated"), (("scopes", ("a", "b")),))
    allowed, why = await api.may_read_log(user, "team-a", "train")
    assert (allowed, why) == (True, 'RBAC: allowed by RoleBinding "r"')
    kind, body = apiserver.seen[0]
    assert kind == "access"
    assert body["spec"] == {
        "user": "alice",
        "uid": "u-9",
        "groups": ["devs", "system:authenticated"],
        "extra": {"scopes": ["a", "b"]},
        "resourceAttributes": {
            "namespace": "team-a",
            "verb": "get",
            "group": "logs.slurmjob.io",
            "version": "v1alpha1",
            "resource": "slurmjobs",
            "subresource": "log",
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
    bed: tuple[Apiserver, KubeApi], answer: dict[str, Any], allowed: bool
) -> None:
    apiserver, api = bed
    apiserver.access_answer = answer
    result, _ = await api.may_read_log(RemoteUser("bob"), "team-a", "train")
    assert result is allowed
    assert "uid" not in apiserver.seen[0][1]["spec"]  # none known, none claimed


async def test_a_failing_apiserver_raises(bed: tuple[Apiserver, KubeApi]) -> None:
    apiserver, api = bed
    apiserver.fail = 403  # the operator may not create reviews (the chart's ClusterRole missing)
    with pytest.raises(ReviewUnavailable, match="SubjectAccessReview: HTTP 403") as caught:
        await api.may_read_log(RemoteUser("bob"), "team-a", "train")
    assert caught.value.__cause__ is None
    with pytest.raises(ConfigMapUnavailable, match="HTTP 403"):
        await api.read_configmap("kube-system", "extension-apiserver-authentication")


async def test_an_answer_without_its_required_fields_is_no_answer(
    bed: tuple[Apiserver, KubeApi],
) -> None:
    apiserver, api = bed
    apiserver.access_answer = {"reason": "no allowed field"}
    with pytest.raises(ReviewUnavailable, match="no SubjectAccessReview"):
        await api.may_read_log(RemoteUser("bob"), "team-a", "train")


async def test_the_authentication_configmap_is_read(bed: tuple[Apiserver, KubeApi]) -> None:
    apiserver, api = bed
    assert await api.read_configmap("kube-system", "extension-apiserver-authentication") is None
    apiserver.configmap = {"data": {"requestheader-allowed-names": '["front-proxy-client"]'}}
    assert await api.read_configmap("kube-system", "extension-apiserver-authentication") == {
        "requestheader-allowed-names": '["front-proxy-client"]'
    }
    apiserver.configmap = {}
    assert await api.read_configmap("kube-system", "extension-apiserver-authentication") == {}
