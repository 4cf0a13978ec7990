"""The operator's one slurmrestd client, connected (and its API version chosen) on first use
and shared by every part of the controller."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from slurmjob_operator.config import Settings
from slurmjob_operator.slurm.auth import TokenProvider
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.connect import connect
from slurmjob_operator.slurm.errors import SlurmError, SlurmNotFound
from slurmjob_operator.slurm.http import HttpTransport

log = logging.getLogger(__name__)

OnRequest = Callable[[str, str, str, float], None]


class ClientSource(Protocol):
    """Where the controller gets its client: `SlurmLink`, or a test's in-memory Slurm."""

    async def client(self) -> SlurmClient: ...


class SlurmLink:
    def __init__(
        self,
        settings: Settings,
        transport: HttpTransport,
        token: TokenProvider,
        on_request: OnRequest,
    ) -> None:
        self.settings = settings
        self.transport = transport
        self.token = token
        self._on_request = on_request
        self._client: SlurmClient | None = None
        self._connecting = asyncio.Lock()

    async def client(self) -> SlurmClient:
        if self._client is None:
            async with self._connecting:
                if self._client is None:
                    self._client = await connect(
                        self.settings,
                        self.transport,
                        token=self.token,
                        on_request=self._on_request,
                    )
                    log.info("slurmrestd speaks %s", self._client.version)
        return self._client


async def cancel_quietly(client: SlurmClient, ref: int | str) -> None:
    """Cancel a job the operator does not wait for (a duplicate, a refused record): gone
    already is fine, and a failure is only logged."""
    try:
        await client.cancel(ref)
    except SlurmNotFound:
        pass
    except SlurmError:
        log.exception("cannot cancel Slurm job %s", ref)
