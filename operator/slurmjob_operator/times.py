"""The one timestamp form the operator writes and reads: RFC 3339 in UTC, to the second
(`2026-01-02T03:04:05Z`), as Kubernetes writes its own timestamps."""

from __future__ import annotations

from datetime import UTC, datetime

_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def utc_now() -> datetime:
    return datetime.now(tz=UTC)


def rfc3339(moment: datetime) -> str:
    if moment.tzinfo is None:
        raise ValueError("timestamps must be timezone-aware")
    return moment.astimezone(UTC).strftime(_FORMAT)


def parse_rfc3339(text: str | None) -> datetime | None:
    """The moment `rfc3339` wrote; None for an empty value."""
    if not text:
        return None
    return datetime.strptime(text, _FORMAT).replace(tzinfo=UTC)
