"""The log API: `kubectl slurmjob logs` reads a job's log through the kube-apiserver, which
serves `logs.slurmjob.io/v1alpha1` by proxying to this server (an aggregated API, as
metrics-server serves metrics). `api/logs.py` is the wire format, `controller/logaccess.py`
the read, `controller/frontproxy.py` the TLS trust.

Every replica listens on `SLURMJOB_LOGS_ADDRESS:SLURMJOB_LOGS_PORT`, TLS only, under the
limits every listener of the operator has (`listeners`: the handshake and the request's head
within one deadline, a short keep-alive, a cap on connections, bounded heads, no body). A
connection whose certificate passes 1 below is proven to the listener: never closed to make
room for one that has not (silent connections or stalled handshakes of anyone else). No
user credential ever reaches it; who asks is what the apiserver says, and the apiserver is
recognised by its front-proxy client certificate:

1. the connection's client certificate must chain to the requestheader CA and its common name
   be one of the allowed names (none listed: any that CA signed), both as the ConfigMap
   `kube-system/extension-apiserver-authentication` says now; otherwise 401 and the
   `X-Remote-*` headers are not read;
2. the user, uid, groups and extra are read from the headers that ConfigMap names, and only
   from them (`core.requestheader`);
3. `GET /apis/logs.slurmjob.io/v1alpha1` (discovery: the aggregator's availability check and
   its discovery ask it) is answered to any request that passed 1; `/openapi/v2` and
   `/openapi/v3` answer 404, which the aggregator takes as "no OpenAPI document";
4. for a log: namespace and name are checked to be Kubernetes names, the query parsed, and a
   namespace this operator does not watch answers 404, all before anything is asked of the
   apiserver; then a SubjectAccessReview: may that user `get` `slurmjobs/log` in
   `logs.slurmjob.io` for that namespace and name? No: 403;
5. only then is the SlurmJob read, with the operator's credentials, and its log.

An allowed decision is kept for `DECISION_TTL` seconds, keyed by user, uid, groups, extra,
namespace and name, in a bounded cache; a refusal is never kept (a right granted works at
once). Whatever comes from a request is escaped before it is logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import replace

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from slurmjob_operator.api.logs import (
    API_GROUP,
    API_LOG_PATH,
    API_PATH,
    API_RESOURCE,
    API_SUBRESOURCE,
    LogError,
    LogQuery,
    QueryError,
    api_resource_list,
    dns_name,
)
from slurmjob_operator.config import Settings
from slurmjob_operator.controller.frontproxy import (
    FrontProxyTrust,
    ServingCertSource,
    TlsContexts,
)
from slurmjob_operator.controller.logaccess import CACHE_ENTRIES, LogAccess, LogFailure
from slurmjob_operator.core.requestheader import (
    RemoteUser,
    RequestHeaderTrust,
    common_name,
    printable,
)
from slurmjob_operator.core.ttlcache import TtlCache
from slurmjob_operator.kube import AccessReviewer, KubeApi, ReviewUnavailable
from slurmjob_operator.listeners import Limits, Listener, serve_app
from slurmjob_operator.servingcert import serving_cert_from_settings

log = logging.getLogger(__name__)

#: Seconds an allowed decision is kept: a follower asks about once a second, and a right
#: taken away stops working within this.
DECISION_TTL = 10.0
#: The apiserver sends one X-Remote-Group header per group of the user and one header per
#: extra value: room for users in many groups, still a few MiB for a full cap of heads.
MAX_HEADERS = 256
HEAD_BYTES = 64 * 1024

_USER = web.RequestKey("slurmjob_remote_user", RemoteUser)


class _NoHeaderValues(logging.Filter):
    """aiohttp logs a request its parser refuses with the start of the bytes it choked on,
    which are anyone's (and may hold what looks like a log line): such a record keeps its
    kind only."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.msg = "a request was refused by the HTTP parser (%s)"
            record.args = (type(exc).__name__,)
            record.exc_info = None
            record.exc_text = None
        return True


_protocol_log = logging.getLogger(f"{__name__}.http")
_protocol_log.addFilter(_NoHeaderValues())


class Authoriser:
    """Whether a user the apiserver named may read that SlurmJob's logs."""

    def __init__(
        self,
        reviewer: AccessReviewer,
        *,
        ttl: float = DECISION_TTL,
        max_entries: int = CACHE_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reviewer = reviewer
        self._clock = clock
        self._allowed: TtlCache[tuple[RemoteUser, str, str], bool] = TtlCache(ttl, max_entries)

    async def check(self, user: RemoteUser, namespace: str, name: str) -> None:
        """Nothing when allowed; LogFailure 403 when not, 503 when the apiserver cannot be
        asked."""
        key = (user, namespace, name)
        if self._allowed.get(key, self._clock()):
            return
        try:
            allowed, why = await self.reviewer.may_read_log(user, namespace, name)
        except ReviewUnavailable as exc:
            log.warning("cannot review a log request: %s", exc)
            raise LogFailure(
                503, "ReviewUnavailable", "the operator cannot ask the apiserver now"
            ) from None
        if not allowed:
            log.info(
                "refused %s the logs of %s/%s: %s",
                printable(user.username),
                namespace,
                name,
                printable(why),
            )
            raise LogFailure(403, "Forbidden", _forbidden(user, namespace, name))
        self._allowed.put(key, True, self._clock())


def _forbidden(user: RemoteUser, namespace: str, name: str) -> str:
    return (
        f'{API_RESOURCE}.{API_GROUP} "{name}" is forbidden: User "{user.username}" cannot get '
        f'resource "{API_RESOURCE}/{API_SUBRESOURCE}" in API group "{API_GROUP}" in the '
        f'namespace "{namespace}"'
    )


class FrontProxyGate:
    """Whether a request comes from the apiserver's front proxy, and whom it names."""

    def __init__(self, trust: FrontProxyTrust, contexts: TlsContexts) -> None:
        self.trust = trust
        self.contexts = contexts

    def user(self, request: web.BaseRequest) -> RemoteUser | None:
        """The user the headers name (None when none is); LogFailure 401 when the
        connection's client certificate does not pass, whatever the headers say."""
        return self._passed(request.transport).user(request.headers.items())

    def proven(self, transport: asyncio.BaseTransport) -> bool:
        """Whether a handshaken connection's client certificate passes now: the listener
        never closes such a connection to take an unproven one (`listeners.admission`)."""
        try:
            self._passed(transport)
        except LogFailure:
            return False
        return True

    def _passed(self, transport: asyncio.BaseTransport | None) -> RequestHeaderTrust:
        """The trust the connection's client certificate passes; LogFailure 401 when none."""
        trust = self.trust.current
        peer = transport.get_extra_info("peercert") if transport is not None else None
        if transport is None or trust is None or not peer:
            raise LogFailure(401, "Unauthorized", "no client certificate of the front proxy")
        if not self.contexts.trusts(transport.get_extra_info("sslcontext"), trust):
            # Verified against a CA the apiserver no longer names: a new connection is.
            raise LogFailure(401, "Unauthorized", "the client certificate's CA is not trusted")
        subject = peer.get("subject") if isinstance(peer, dict) else None
        if not trust.name_allowed(common_name(subject)):
            raise LogFailure(401, "Unauthorized", "the client certificate's name is not allowed")
        return trust


def _error(code: int, reason: str, message: str, *, close: bool = False) -> web.Response:
    body = LogError(code=code, reason=reason, message=message)
    response = web.json_response(
        body.model_dump(mode="json", by_alias=True),
        status=code,
        headers={"Cache-Control": "no-store"},
    )
    if close:
        response.force_close()
    return response


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def make_app(access: LogAccess, authoriser: Authoriser, gate: FrontProxyGate) -> web.Application:
    @web.middleware
    async def front_proxy_only(request: web.Request, handler: Handler) -> web.StreamResponse:
        """The certificate first, for every path; aiohttp's own refusals (no such path,
        another method) in the API's JSON too."""
        try:
            user = gate.user(request)
        except LogFailure as failure:
            return _error(failure.code, failure.reason, failure.message, close=True)
        if user is not None:
            request[_USER] = user
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return _error(exc.status, exc.reason.replace(" ", ""), exc.reason)

    async def discovery(_: web.Request) -> web.StreamResponse:
        return web.json_response(api_resource_list())

    async def get_log(request: web.Request) -> web.StreamResponse:
        user = request.get(_USER)
        namespace = request.match_info["namespace"]
        name = request.match_info["name"]
        try:
            if user is None:
                raise LogFailure(401, "Unauthorized", "the front proxy named no user")
            if not dns_name(namespace, 63, dots=False) or not dns_name(name, 253, dots=True):
                raise LogFailure(400, "BadName", "not a namespace and SlurmJob name")
            try:
                query = LogQuery.parse(request.query.items())
            except QueryError as exc:
                raise LogFailure(400, "BadQuery", str(exc)) from None
            if access.namespaces and namespace not in access.namespaces:
                raise LogFailure(404, "NotWatched", f"namespace {namespace} is not watched here")
            await authoriser.check(user, namespace, name)
            answer = await access.read(namespace, name, query)
        except LogFailure as failure:
            return _error(failure.code, failure.reason, failure.message)
        return web.json_response(
            answer.model_dump(mode="json", by_alias=True), headers={"Cache-Control": "no-store"}
        )

    app = web.Application(middlewares=[front_proxy_only], handler_args={"logger": _protocol_log})
    app.router.add_get(API_PATH, discovery, allow_head=False)
    app.router.add_get(API_LOG_PATH, get_log, allow_head=False)
    return app


def log_limits(settings: Settings) -> Limits:
    """The listener limits, with room for the headers of a user in many groups."""
    return replace(
        Limits.from_settings(settings), max_headers=MAX_HEADERS, max_head_bytes=HEAD_BYTES
    )


async def start_log_api(
    access: LogAccess,
    authoriser: Authoriser,
    trust: FrontProxyTrust,
    cert: ServingCertSource,
    host: str,
    port: int,
    limits: Limits,
) -> Listener:
    """Serve the log API on host:port (TLS, see the module's docstring): the trust is read
    before the first connection is taken and again every `trust.interval` seconds until the
    listener is closed."""
    contexts = TlsContexts(cert, trust)
    gate = FrontProxyGate(trust, contexts)
    app = make_app(access, authoriser, gate)

    async def keep_trust(_: web.Application) -> AsyncIterator[None]:
        contexts.context()  # a certificate read in the background starts now
        await trust.refresh()
        task = asyncio.create_task(trust.run(), name="slurmjob-front-proxy-trust")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        close = getattr(cert, "close", None)
        if close is not None:
            await close()

    app.cleanup_ctx.append(keep_trust)
    return await serve_app(
        app, host, port, limits, name="logs", tls=contexts.context, prove=gate.proven
    )


async def serve_logs(
    settings: Settings,
    kube: KubeApi,
    namespaces: Sequence[str] = (),
    *,
    cert: ServingCertSource | None = None,
) -> Listener | None:
    """Start the log API on `SLURMJOB_LOGS_ADDRESS:SLURMJOB_LOGS_PORT`; None when the port is
    0 or there is no serving certificate source. The caller closes it."""
    if not settings.logs_port:
        return None
    if cert is None:
        cert = serving_cert_from_settings(settings, kube)
        if cert is None:
            log.warning("no serving certificate for the log API: it is not served")
            return None
    access = LogAccess.from_settings(settings, kube, namespaces)
    listener = await start_log_api(
        access,
        Authoriser(kube),
        FrontProxyTrust(kube),
        cert,
        settings.logs_address,
        settings.logs_port,
        log_limits(settings),
    )
    log.info("serving the log API on %s:%s (TLS)", settings.logs_address, settings.logs_port)
    return listener
