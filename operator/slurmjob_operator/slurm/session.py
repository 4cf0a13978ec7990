"""What every part of `SlurmClient` shares: the dialect of the version it speaks, the requester
and route table over the caller's transport, the user it acts as, whether accounting is
served; and the ping that proves the server answers with a controller behind it."""

from __future__ import annotations

from slurmjob_operator.slurm.auth import TokenError, TokenProvider, decode_claims
from slurmjob_operator.slurm.dialects import (
    Dialect,
    PingResult,
    dialect_for,
)
from slurmjob_operator.slurm.errors import (
    SlurmAuthError,
    SlurmTransient,
)
from slurmjob_operator.slurm.exchange import OnRequest, Requester
from slurmjob_operator.slurm.http import HttpTransport
from slurmjob_operator.slurm.routes import Routes


def _checked_ping(result: PingResult, status: int, template: str) -> PingResult:
    """`result`, unless it shows the token refused or no controller answering."""
    # 26.05 reports a refused token inside a 200 ping rather than as an error.
    if any("authentication" in (c.status or "").lower() for c in result.controllers):
        raise SlurmAuthError(
            "authentication refused by slurmctld",
            status=status,
            endpoint=template,
            method="GET",
        )
    if not result.responding:
        raise SlurmTransient("no slurmctld is responding", endpoint=template, method="GET")
    return result


class Session:
    """One slurmrestd server and one concrete REST API version."""

    def __init__(
        self,
        transport: HttpTransport,
        base_url: str,
        version: str,
        *,
        token: TokenProvider,
        user: str | None = None,
        timeout: float = 30.0,
        on_request: OnRequest | None = None,
        accounting: bool | None = None,
    ) -> None:
        """`accounting`: whether `/slurmdb/` paths are served; None finds out on first use."""
        self._dialect: Dialect = dialect_for(version)
        self._rest = Requester(
            transport,
            base_url,
            self._dialect,
            token=token,
            user=user,
            timeout=timeout,
            on_request=on_request,
        )
        self._accounting = accounting if self._dialect.supports_accounting else False
        self._user = user
        self._token = token
        self._routes = Routes(self._rest, self._dialect.version, lambda: self.user)

    @property
    def version(self) -> str:
        return self._dialect.version

    def lifecycle_ref(self, job_id: int, sluid: str | None) -> int | str:
        """The SLUID where the version takes it in paths (v0.0.45), else the numeric job id."""
        return sluid if sluid and self.dialect.supports_sluid_paths else job_id

    @property
    def dialect(self) -> Dialect:
        return self._dialect

    @property
    def user(self) -> str | None:
        """The Slurm user this client acts as: the one it names, else its token's (`sun`);
        None when neither can be told."""
        if self._user:
            return self._user
        try:
            claims = decode_claims(self._token.token())
        except TokenError:
            return None
        sun = claims.get("sun") if claims else None
        return sun if isinstance(sun, str) and sun else None

    @property
    def accounting(self) -> bool | None:
        """Whether `/slurmdb/` paths are served, as far as known (None: not asked yet)."""
        return self._accounting

    async def ping(self) -> PingResult:
        """Check that a controller answers with this token; raises when none does."""
        template = self._routes.template("ping")
        answer = await self._routes.send("ping")
        result = answer.parse(self._dialect.parse_ping, template)
        return _checked_ping(result, answer.status, template)
