"""The log endpoint: `kubectl slurmjob logs` reads a job's log through the operator
(`api/logs.py` is the wire format, `controller/logaccess.py` the read).

Only `GET /v1/namespaces/{namespace}/slurmjobs/{name}/log` is served, on its own port
(`SLURMJOB_LOGS_PORT`, 0: not at all), by every replica. It is reached through the
kube-apiserver's service proxy, which authenticates the caller, deletes the Authorization
header and passes no identity on; so nothing about the connection is trusted, wherever it
comes from. Each request carries the user's own bearer token in `X-Slurmjob-Token`:

1. no token (or one longer than 16 KiB): 401;
2. a TokenReview: a token the apiserver does not accept: 401;
3. a SubjectAccessReview: may that user (name, uid, groups, extra) `get` that SlurmJob, as
   `kubectl get slurmjob NAME -n NAMESPACE` would be decided? No: 403;
4. only then is the SlurmJob read, with the operator's credentials, and its log.

The port is held to the limits every listener of the operator has (`listeners`: a deadline
for a request's head, a short keep-alive, a cap on connections, bounded heads and no body),
with room in one header for the longest token taken.

An allowed decision is kept for `DECISION_TTL` seconds, keyed by a SHA-256 of the token with
the namespace and name, in a bounded cache (a refusal is never kept: a right granted works at
once). The token is never logged, never kept, and never part of an answer or an exception.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from slurmjob_operator.api.logs import (
    LOG_PATH,
    MAX_TOKEN_LENGTH,
    TOKEN_HEADER,
    LogError,
    LogQuery,
    QueryError,
    dns_name,
)
from slurmjob_operator.config import Settings
from slurmjob_operator.controller.logaccess import CACHE_ENTRIES, LogAccess, LogFailure
from slurmjob_operator.core.ttlcache import TtlCache
from slurmjob_operator.kube import AccessReviewer, KubeApi, ReviewedUser, ReviewUnavailable
from slurmjob_operator.listeners import Limits, Listener, serve_app

log = logging.getLogger(__name__)

#: Seconds an allowed decision is kept: a follower asks about once a second, and a right
#: taken away stops working within this.
DECISION_TTL = 10.0

#: One header field: the longest token taken, with room for its name.
FIELD_BYTES = MAX_TOKEN_LENGTH + 1024
#: A request's whole head: that token and everything the apiserver's proxy adds.
HEAD_BYTES = FIELD_BYTES + 16 * 1024


class _NoHeaderValues(logging.Filter):
    """aiohttp logs a request its parser refuses (a header too long, say) with the start of
    the bytes it choked on, which may be a token: such a record keeps its kind only."""

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
    """Who sends a request, and whether they may read that SlurmJob's logs."""

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
        self._allowed: TtlCache[tuple[str, str, str], str] = TtlCache(ttl, max_entries)

    async def check(self, token: str | None, namespace: str, name: str) -> str:
        """The user's name when allowed; LogFailure 401 or 403 when not, 503 when the
        apiserver cannot be asked."""
        token = (token or "").strip()
        if not token:
            raise LogFailure(
                401,
                "TokenMissing",
                f"no bearer token in {TOKEN_HEADER}: the operator cannot tell who asks",
            )
        if len(token) > MAX_TOKEN_LENGTH:
            raise LogFailure(401, "TokenRefused", "the token is too long")
        digest = hashlib.sha256(token.encode("utf-8", errors="replace")).hexdigest()
        key = (digest, namespace, name)
        known = self._allowed.get(key, self._clock())
        if known is not None:
            return known
        try:
            user = await self.reviewer.review_token(token)
            if user is None:
                raise LogFailure(401, "TokenRefused", "the apiserver does not accept the token")
            allowed, why = await self.reviewer.may_get_slurmjob(user, namespace, name)
        except ReviewUnavailable as exc:
            log.warning("cannot review a log request: %s", exc)
            raise LogFailure(
                503, "ReviewUnavailable", "the operator cannot check the token now"
            ) from None
        if not allowed:
            log.info("refused %s the logs of %s/%s: %s", user.username, namespace, name, why)
            raise LogFailure(403, "Forbidden", _forbidden(user, namespace, name))
        self._allowed.put(key, user.username, self._clock())
        return user.username


def _forbidden(user: ReviewedUser, namespace: str, name: str) -> str:
    return (
        f'user "{user.username}" may not get slurmjobs.slurmjob.io "{name}" in namespace '
        f'"{namespace}", so it may not read its logs'
    )


def _error(code: int, reason: str, message: str) -> web.Response:
    body = LogError(code=code, reason=reason, message=message)
    return web.json_response(
        body.model_dump(mode="json", by_alias=True),
        status=code,
        headers={"Cache-Control": "no-store"},
    )


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own refusals (no such path, another method) in the endpoint's JSON too."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _error(exc.status, exc.reason.replace(" ", ""), exc.reason)


def make_app(access: LogAccess, authoriser: Authoriser) -> web.Application:
    async def get_log(request: web.Request) -> web.StreamResponse:
        namespace = request.match_info["namespace"]
        name = request.match_info["name"]
        try:
            await authoriser.check(request.headers.get(TOKEN_HEADER), namespace, name)
            if not dns_name(namespace, 63, dots=False) or not dns_name(name, 253, dots=True):
                raise LogFailure(400, "BadName", "not a namespace and SlurmJob name")
            try:
                query = LogQuery.parse(request.query.items())
            except QueryError as exc:
                raise LogFailure(400, "BadQuery", str(exc)) from None
            answer = await access.read(namespace, name, query)
        except LogFailure as failure:
            return _error(failure.code, failure.reason, failure.message)
        return web.json_response(
            answer.model_dump(mode="json", by_alias=True), headers={"Cache-Control": "no-store"}
        )

    # Room in a header for the longest token taken (aiohttp's default is 8 KiB), and the
    # parser's complaints without the bytes they hold.
    handler = {"max_field_size": FIELD_BYTES, "logger": _protocol_log}
    app = web.Application(middlewares=[_json_errors], handler_args=handler)
    app.router.add_get(LOG_PATH, get_log, allow_head=False)
    return app


async def serve_logs(
    settings: Settings, kube: KubeApi, namespaces: Sequence[str] = ()
) -> Listener | None:
    """Start the endpoint on `SLURMJOB_LOGS_ADDRESS:SLURMJOB_LOGS_PORT` under the listener
    limits (`listeners`); None when the port is 0. The caller closes it."""
    if not settings.logs_port:
        return None
    access = LogAccess.from_settings(settings, kube, namespaces)
    app = make_app(access, Authoriser(kube))
    limits = Limits.from_settings(settings).with_fields(FIELD_BYTES, HEAD_BYTES)
    listener = await serve_app(app, settings.logs_address, settings.logs_port, limits, name="logs")
    log.info("serving logs on %s:%s", settings.logs_address, settings.logs_port)
    return listener
