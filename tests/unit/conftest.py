"""Fixtures shared by the slurm client tests: an in-process fake slurmrestd and a transport."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from aiohttp.test_utils import TestServer

from slurmjob_operator.core import verified
from slurmjob_operator.slurm.http import HttpTransport

from .slurm_fakes import FakeSlurm


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlurm]:
    fake = FakeSlurm()
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    fake.base_url = str(server.make_url("")).rstrip("/")
    yield fake
    fake.release.set()
    await server.close()


@pytest.fixture
async def session() -> AsyncIterator[HttpTransport]:
    async with HttpTransport() as s:
        yield s


@pytest.fixture
def step() -> Iterator[verified.Step]:
    """A `core.verified` step around the test: the handles it makes live until it ends."""
    with verified.step() as current:
        yield current
