"""The plugin's way to the cluster: the user's kubeconfig (as kubectl reads it: `KUBECONFIG`,
else `~/.kube/config`; `--context`), or a pod's ServiceAccount, and nothing else.

Every call goes to the kube-apiserver as the user, with whatever credentials the kubeconfig
holds (a token, a client certificate, an exec plugin's either), the log read too: the
operator serves it as an aggregated API (`GET /apis/logs.slurmjob.io/v1alpha1/namespaces/
{ns}/slurmjobs/{name}/log`, asked as `kubectl get --raw` asks). The apiserver authenticates
and authorises the user (`get` on `slurmjobs/log` in `logs.slurmjob.io`) and proxies to the
operator as its front proxy, naming the user in headers the operator takes from it alone:
no credential of the user's goes past the apiserver, and nothing here names the operator's
namespace or Service (the APIService says where it is).

The kubeconfig is never written back (a refreshed OIDC token stays in memory).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import ValidationError

from slurmjob_operator import GROUP, PLURAL, VERSION
from slurmjob_operator.api.logs import (
    API_GROUP,
    API_LOG_PATH,
    API_VERSION,
    ERROR_KIND,
    LogAnswer,
    LogError,
    LogQuery,
)

_MERGE_PATCH = "application/merge-patch+json"
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
#: An answer larger than this is no answer of the operator's (64 KiB of text, JSON-escaped,
#: stays far below).
MAX_ANSWER_BYTES = 2 * 1024 * 1024
REQUEST_TIMEOUT = 30.0


class PluginError(Exception):
    """What the user must be told, and the command ends with exit status 1."""


class OperatorUnavailable(Exception):
    """The log API cannot answer (the operator down or failing, the apiserver unreachable):
    the caller falls back to the status tail, or keeps asking while following."""


class LogsApiAbsent(OperatorUnavailable):
    """No log API for this namespace: the apiserver serves no `logs.slurmjob.io/v1alpha1`
    (its own 404: no APIService), or the release behind it does not watch this namespace
    (the operator's 404 NotWatched)."""


class Unauthorized(PluginError):
    """HTTP 401 from the apiserver: it does not accept the kubeconfig's credentials (an exec
    plugin's token may have expired: it is fetched again once)."""


class ApiserverRefused(PluginError):
    """The apiserver's own refusal (403: the user may not `get slurmjobs/log` there; 400 and
    the like): shown as it is, and no fallback."""


class OperatorRefused(PluginError):
    """The operator answered and refused (no right to the SlurmJob, no such job or attempt,
    a refused file): no fallback would be any better."""

    def __init__(self, error: LogError) -> None:
        super().__init__(error.message)
        self.error = error


def log_path(namespace: str, name: str) -> str:
    """The log's path in the aggregated API, below the apiserver's root."""
    return API_LOG_PATH.format(namespace=namespace, name=name)


class Session:
    """One ApiClient on the user's credentials."""

    def __init__(self, api: k8s.ApiClient, namespace: str, loader: Any = None) -> None:
        self.api = api
        self.namespace = namespace
        self._loader = loader
        self._custom = k8s.CustomObjectsApi(api)

    @classmethod
    async def open(
        cls,
        context: str | None = None,
        *,
        kubeconfig: str | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> Session:
        """The session kubectl would have: `--kubeconfig`, else `$KUBECONFIG` (a list, as
        kubectl merges it), else `~/.kube/config`; inside a pod without any of them, its
        ServiceAccount. Nothing is printed here: a failure is one PluginError saying what to
        set."""
        env = os.environ if environ is None else environ
        files, source = kubeconfig_files(kubeconfig, env)
        configuration = k8s.Configuration()
        if not files:
            if kubeconfig is not None:
                raise PluginError(f"--kubeconfig {kubeconfig}: no such file")
            if context is not None:
                raise PluginError(f"cannot use context {context!r}: no kubeconfig ({source})")
            try:
                k8s_config.load_incluster_config(client_configuration=configuration)
            except k8s_config.ConfigException:
                raise PluginError(
                    f"no kubeconfig ({source}) and not inside a pod: "
                    "set KUBECONFIG or pass --kubeconfig"
                ) from None
            return cls(k8s.ApiClient(configuration), _pod_namespace())
        try:
            loader = await k8s_config.load_kube_config(
                config_file=os.pathsep.join(files),
                context=context,
                client_configuration=configuration,
                persist_config=False,
            )
        except (k8s_config.ConfigException, OSError, ValueError, KeyError) as exc:
            where = ", ".join(files)
            if context is not None:
                raise PluginError(f"cannot use context {context!r} of {where}: {exc}") from None
            raise PluginError(f"cannot use the kubeconfig {where}: {exc}") from None
        current = loader.current_context or {}
        namespace = (current.get("context") or {}).get("namespace") or "default"
        return cls(k8s.ApiClient(configuration), str(namespace), loader)

    async def close(self) -> None:
        await self.api.close()

    async def refresh_credentials(self) -> bool:
        """Run the kubeconfig's exec plugin again (its token may have expired before the time
        it gave) and keep what it gives in memory only; False when there is none to run."""
        loader = self._loader
        if loader is None or "exec" not in (getattr(loader, "_user", None) or {}):
            return False
        if hasattr(loader, "exec_plugin_expiry"):
            del loader.exec_plugin_expiry  # else it answers with the token it has
        await loader.load_from_exec_plugin()
        token = getattr(loader, "token", None)
        if token:
            self.api.configuration.api_key["BearerToken"] = token
        return True

    # -- SlurmJobs, as the user -----------------------------------------------------------

    async def get(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            obj = await self._custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name
            )
        except ApiException as exc:
            raise PluginError(
                _api_error(exc, f"slurmjob {name} in namespace {namespace}")
            ) from None
        result: dict[str, Any] = obj
        return result

    async def exists(self, namespace: str, name: str) -> bool:
        try:
            await self._custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise PluginError(
                _api_error(exc, f"slurmjob {name} in namespace {namespace}")
            ) from None
        return True

    async def list(self, namespace: str | None) -> list[dict[str, Any]]:
        try:
            if namespace is None:
                obj = await self._custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
            else:
                obj = await self._custom.list_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL
                )
        except ApiException as exc:
            where = f"namespace {namespace}" if namespace else "all namespaces"
            raise PluginError(_api_error(exc, f"slurmjobs in {where}")) from None
        items: list[dict[str, Any]] = list(obj.get("items") or [])
        return sorted(items, key=lambda o: (o["metadata"]["namespace"], o["metadata"]["name"]))

    async def delete(self, namespace: str, name: str) -> None:
        try:
            await self._custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name
            )
        except ApiException as exc:
            raise PluginError(
                _api_error(exc, f"slurmjob {name} in namespace {namespace}")
            ) from None

    async def patch(self, namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        try:
            obj = await self._custom.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                dict(patch),
                _content_type=_MERGE_PATCH,
            )
        except ApiException as exc:
            raise PluginError(
                _api_error(exc, f"slurmjob {name} in namespace {namespace}")
            ) from None
        result: dict[str, Any] = obj
        return result

    # -- the operator's Lease -------------------------------------------------------------

    async def leases(self, namespace: str, name: str | None) -> Sequence[dict[str, Any]]:
        """The Lease `name` of `namespace`, or every Lease there (`get` or `list` on leases,
        as the user): who leads the operator's replicas."""
        coordination = k8s.CoordinationV1Api(self.api)
        what = f"lease {name}" if name else "leases"
        try:
            if name:
                found = [await coordination.read_namespaced_lease(name, namespace)]
            else:
                found = list((await coordination.list_namespaced_lease(namespace)).items or [])
        except ApiException as exc:
            raise PluginError(_api_error(exc, f"{what} in namespace {namespace}")) from None
        bodies = [self.api.sanitize_for_serialization(lease) for lease in found]
        return sorted(bodies, key=lambda body: str(body.get("metadata", {}).get("name")))

    # -- the log API ----------------------------------------------------------------------

    async def read_log(self, namespace: str, name: str, query: LogQuery) -> LogAnswer:
        """One read of the aggregated log API, as the user (their credentials only, as the
        kubeconfig gives them to every other call)."""
        try:
            response = await self.api.call_api(
                log_path(namespace, name),
                "GET",
                query_params=query.items(),
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT,
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise OperatorUnavailable(f"the apiserver cannot be reached: {exc}") from None
        try:
            status = int(response.status)
            body = await _read_capped(response.content, MAX_ANSWER_BYTES + 1)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise OperatorUnavailable(f"the answer was cut off: {exc}") from None
        finally:
            response.release()
        if len(body) > MAX_ANSWER_BYTES:
            raise OperatorUnavailable("the answer is larger than any the operator gives")
        return _answer(status, body)


async def _read_capped(stream: aiohttp.StreamReader, limit: int) -> bytes:
    """The body up to its end or `limit` bytes, whichever comes first."""
    chunks: list[bytes] = []
    left = limit
    while left > 0:
        chunk = await stream.read(left)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


#: The operator's reason for a namespace it does not watch: the release that serves the API
#: is not this namespace's (whose own may keep its APIService off), so there is no log API
#: for it, rather than a refusal.
NOT_WATCHED = "NotWatched"


def _answer(status: int, body: bytes) -> LogAnswer:
    """The operator's answer, or the exception that says who refused or failed: the
    operator (its errors are of kind SlurmJobLogError) or the apiserver (a Status, or
    text)."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if status == 200:
        try:
            return LogAnswer.model_validate(data)
        except ValidationError:
            raise OperatorUnavailable("the answer is not the operator's") from None
    if isinstance(data, dict) and data.get("kind") == ERROR_KIND:
        try:
            error = LogError.model_validate(data)
        except ValidationError:
            raise OperatorUnavailable(f"HTTP {status} from the operator") from None
        if error.code >= 500:
            raise OperatorUnavailable(f"the operator failed: {error.message}")
        if error.code == 404 and error.reason == NOT_WATCHED:
            raise LogsApiAbsent(f"the operator serving it does not watch it: {error.message}")
        raise OperatorRefused(error)
    message = data.get("message") if isinstance(data, dict) else None
    detail = message or body[:200].decode("utf-8", "replace").strip() or "no detail"
    if status == 401:
        raise Unauthorized(f"the apiserver does not accept your credentials: {detail}")
    if status == 404:
        raise LogsApiAbsent(f"the apiserver serves no {API_GROUP}/{API_VERSION}: {detail}")
    if status == 429 or status >= 500:
        raise OperatorUnavailable(f"HTTP {status} from the apiserver: {detail}")
    raise ApiserverRefused(f"HTTP {status} from the apiserver: {detail}")


def _api_error(exc: ApiException, what: str) -> str:
    try:
        message = json.loads(exc.body or "").get("message")
    except (TypeError, ValueError, AttributeError):
        message = None
    if exc.status == 404:
        return f"{what} not found"
    return f"{what}: HTTP {exc.status} {message or exc.reason}"


def kubeconfig_files(flag: str | None, environ: Mapping[str, str]) -> tuple[list[str], str]:
    """The kubeconfig files that exist, in kubectl's order, and where they were looked for."""
    if flag is not None:
        candidates, source = [flag], f"--kubeconfig {flag}"
    elif environ.get("KUBECONFIG"):
        candidates = [p for p in environ["KUBECONFIG"].split(os.pathsep) if p]
        source = f"KUBECONFIG={environ['KUBECONFIG']}"
    else:
        candidates, source = ["~/.kube/config"], "~/.kube/config absent"
    files = [os.path.expanduser(p) for p in candidates]
    return [f for f in files if os.path.isfile(f)], source


def _pod_namespace() -> str:
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text(encoding="utf-8").strip() or "default"
    except OSError:
        return "default"
