"""The operator's one slurmrestd client, connected (and its API version chosen) on first use
and shared by every part of the controller; and, on top of it, one client per tenant Slurm
user (`client_for`) for what must be done as the job's own user.

Which calls are made as whom: a tenant's jobs are submitted, cancelled, held and released as
its `slurmUser` (Slurm lets only the job's owner, an operator or an admin do that, and the
operator's Slurm user need be neither); everything that reads (confirmation, adoption
lookups, the poller's one sweep, accounting) stays the operator's own, so the number of
requests does not grow with the number of tenants."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from typing import Protocol

from slurmjob_operator.config import Settings
from slurmjob_operator.slurm.auth import TokenProvider
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.connect import client_as, connect
from slurmjob_operator.slurm.http import HttpTransport

log = logging.getLogger(__name__)

OnRequest = Callable[[str, str, str, float], None]


class ClientSource(Protocol):
    """Where the controller gets its client: `SlurmLink`, or a test's in-memory Slurm."""

    async def client(self) -> SlurmClient: ...

    async def client_for(self, user: str | None) -> SlurmClient:
        """The client that acts as Slurm user `user` (None: the operator's own)."""
        ...


class SlurmLink:
    def __init__(
        self,
        settings: Settings,
        transport: HttpTransport,
        token: TokenProvider,
        on_request: OnRequest,
        users: Collection[str] = (),
    ) -> None:
        """`users`: the tenants' Slurm users, the only ones `client_for` acts as."""
        self.settings = settings
        self.transport = transport
        self.token = token
        self._on_request = on_request
        self._client: SlurmClient | None = None
        self._connecting = asyncio.Lock()
        self._users = frozenset(users)
        self._as_user: dict[str, SlurmClient] = {}

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

    async def client_for(self, user: str | None) -> SlurmClient:
        """A client that shares the operator's transport, version and accounting but whose
        requests carry `user`'s name and a token minted for it; one per user, kept (at most
        one per tenant). None, or the operator's own user: the operator's client."""
        base = await self.client()
        if user is None or user == self.settings.slurm_rest_user or user == base.user:
            return base
        if user not in self._users:
            # Only the tenants file names users: anything else is a bug, never a guess.
            raise ValueError(f"Slurm user {user!r} is no tenant's slurmUser")
        client = self._as_user.get(user)
        if client is None:
            client = client_as(
                self.settings, self.transport, base, user, on_request=self._on_request
            )
            self._as_user[user] = client
        return client
