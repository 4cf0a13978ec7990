"""The checks that talk to slurmrestd: the connection and its API version, the token, the
default partition, accounting, how a lost submit ends, and the GPU series' node features.
A step that fails skips the ones that need it, so one problem is reported once."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from slurmjob_operator.config import AUTO, ConfigError, Settings
from slurmjob_operator.core.absence import Mode, Window, mode
from slurmjob_operator.doctor.report import Outcome, Report
from slurmjob_operator.site.catalogs import GpuSeriesCatalog
from slurmjob_operator.slurm.auth import TokenError, TokenProvider
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.connect import connect, make_token_provider, open_transport
from slurmjob_operator.slurm.errors import SlurmAuthError, SlurmError
from slurmjob_operator.slurm.nodes import NodeInfo
from slurmjob_operator.times import rfc3339


def _check_series(series: GpuSeriesCatalog, nodes: list[NodeInfo], report: Report) -> None:
    features = {f for n in nodes for f in n.features}
    for entry in series.series:
        name = f"gpu series {entry.name}"
        if not entry.slurm_constraint:
            report.add(
                name,
                Outcome.WARN,
                "no slurmConstraint: usable in single-pool jobs only (heterogeneous jobs are "
                "refused, fail-closed)",
            )
            continue
        wanted = {part for part in _constraint_features(entry.slurm_constraint)}
        missing = sorted(wanted - features)
        if missing:
            report.add(
                name,
                Outcome.FAIL,
                f"constraint {entry.slurm_constraint!r}: no node has feature(s) "
                f"{', '.join(missing)}",
            )
        else:
            holders = sorted(n.name for n in nodes if wanted & n.features)
            report.add(
                name,
                Outcome.OK,
                f"constraint {entry.slurm_constraint!r} on {', '.join(holders)}",
            )


def _constraint_features(expression: str) -> list[str]:
    """Feature names in a Slurm constraint expression (`a&b`, `a|b`, `[a|b]`, `a*2`)."""
    cleaned = expression
    for char in "[]()!":
        cleaned = cleaned.replace(char, " ")
    for sep in "&|,":
        cleaned = cleaned.replace(sep, " ")
    return [word.split("*")[0] for word in cleaned.split() if word.split("*")[0]]


def _expiry_text(token: TokenProvider) -> str:
    expires = token.expires_at
    if expires is None:
        return "token has no exp claim"
    left = int((expires - datetime.now(tz=UTC)).total_seconds())
    return f"token expires {rfc3339(expires)} (in {left} s)"


#: What a credential that cannot be made, or is refused, is fixed by.
_AUTH_SETTINGS = (
    "the credentials: SLURMJOB_SLURM_JWT_KEY_FILE (the key slurmctld signs with) or "
    "SLURMJOB_SLURM_JWT_FILE (a token for SLURMJOB_SLURM_REST_USER), readable by this pod"
)


async def _step(
    report: Report, name: str, action: Callable[[], Awaitable[str]], fix: str = ""
) -> bool:
    """Run one check; a failure says what to change (`fix`) besides what went wrong."""
    try:
        detail = await action()
    except (SlurmError, TokenError, ConfigError, OSError) as exc:
        if isinstance(exc, TokenError | SlurmAuthError):
            name, fix = "auth", _AUTH_SETTINGS  # slurmrestd is reached, or never asked
        hint = f" ({fix})" if fix else ""
        report.add(name, Outcome.FAIL, f"{type(exc).__name__}: {exc}{hint}")
        return False
    report.add(name, Outcome.OK, detail)
    return True


async def check_slurm(settings: Settings, series: GpuSeriesCatalog, report: Report) -> None:
    try:
        token = make_token_provider(settings)
    except ConfigError as exc:
        report.add(
            "auth",
            Outcome.FAIL,
            f"{exc} ({_AUTH_SETTINGS})",
        )
        return
    async with open_transport(settings) as transport:
        client: SlurmClient | None = None

        async def _connect() -> str:
            nonlocal client
            client = await connect(settings, transport, token=token)
            how = "discovered" if settings.slurm_rest_api_version == AUTO else "configured"
            return f"{settings.slurm_rest_url} speaks {client.version} ({how})"

        reach = (
            "is slurmrestd reachable at SLURMJOB_SLURM_REST_URL from this pod "
            "(SLURMJOB_SLURM_CA_BUNDLE for a private CA)?"
        )
        if not await _step(report, "slurmrestd", _connect, reach) or client is None:
            return
        ready: SlurmClient = client

        async def _ping() -> str:
            result = await ready.ping()
            release = f"Slurm {result.release}, " if result.release else ""
            cluster = f"cluster {result.cluster}; " if result.cluster else ""
            return f"{release}{cluster}{_expiry_text(token)}"

        if not await _step(report, "auth", _ping, _AUTH_SETTINGS):
            return

        async def _partition() -> str:
            wanted = settings.slurm_partition
            names = await ready.list_partitions()
            if wanted is None:
                return f"no default partition set; jobs must name one of {', '.join(names)}"
            if wanted not in names:
                raise ConfigError(
                    f"SLURMJOB_SLURM_PARTITION={wanted!r} is not a partition "
                    f"(known: {', '.join(names) or 'none'})"
                )
            return f"{wanted} exists"

        await _step(report, "partition", _partition)
        await _check_accounting(ready, report)
        _check_absence_mode(settings, ready, report)
        if series.series:
            try:
                nodes = await ready.list_nodes()
            except SlurmError as exc:
                report.add("gpu series", Outcome.FAIL, f"cannot list nodes: {exc}")
            else:
                _check_series(series, nodes, report)


async def _check_accounting(client: SlurmClient, report: Report) -> None:
    """Whether the job records slurmctld purges can still be read: without accounting a job
    that ended and was purged while the operator was away ends `Unknown` (reason JobLost), and
    a lost submit whose job was purged is not found again."""
    try:
        served = await client.has_accounting()
    except SlurmError as exc:
        report.add(
            "accounting",
            Outcome.WARN,
            f"/slurmdb/{client.version} is served but does not answer ({type(exc).__name__}: "
            f"{exc}); purged jobs cannot be read until it does",
        )
        return
    if served:
        report.add(
            "accounting",
            Outcome.OK,
            f"slurmdbd answers through /slurmdb/{client.version}: a job purged from slurmctld "
            "is read from accounting (final state, exit code, times; adoption by name)",
        )
    else:
        report.add(
            "accounting",
            Outcome.WARN,
            "no accounting through slurmrestd: a job purged from slurmctld (MinJobAge after "
            "its end) while the operator is away ends Unknown (JobLost), and a lost submit "
            "whose job was purged is not found again",
        )


def _check_absence_mode(settings: Settings, client: SlurmClient, report: Report) -> None:
    """How an unconfirmed submit that is found nowhere ends on this cluster."""
    window = Window(
        settings.slurm_rest_timeout, settings.slurm_message_timeout, settings.absence_margin
    )
    if mode(client.accounting) is Mode.PROOF:
        report.add(
            "exactly-once",
            Outcome.OK,
            f"proof mode: an unconfirmed submit found neither in slurmctld nor in accounting "
            f"{window.seconds:.0f} s after it was sent (rest timeout + MessageTimeout + "
            "margin), with nothing queued for slurmdbd, is proven absent and resubmitted",
        )
    else:
        report.add(
            "exactly-once",
            Outcome.WARN,
            "manual mode (no accounting): an unconfirmed submit found nowhere waits for a "
            "person to check Slurm and set the slurmjob.io/declare-lost annotation",
        )
