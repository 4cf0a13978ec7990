"""What every subcommand of `kubectl slurmjob` shares: the cluster it talks to (a
`kubeclient.Session`, or a test's fake), the sleep it waits with, and the exit statuses.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from slurmjob_operator.api.logs import LogAnswer, LogQuery

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class Cluster(Protocol):
    """What the commands need of a `Session` (tests give a fake)."""

    namespace: str

    async def refresh_credentials(self) -> bool: ...
    async def get(self, namespace: str, name: str) -> dict[str, Any]: ...
    async def exists(self, namespace: str, name: str) -> bool: ...
    async def list(self, namespace: str | None) -> list[dict[str, Any]]: ...
    async def delete(self, namespace: str, name: str) -> None: ...
    async def patch(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]: ...
    async def read_log(self, namespace: str, name: str, query: LogQuery) -> LogAnswer: ...
    async def leases(self, namespace: str, name: str | None) -> Sequence[dict[str, Any]]: ...
    async def close(self) -> None: ...


Sleep = Callable[[float], Awaitable[None]]
