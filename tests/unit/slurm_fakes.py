"""Fixtures for the slurm tests: sample files, launch requests, an in-process fake slurmrestd."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from slurmjob_operator.core.launch import JobComponent, LaunchRequest

# Verbatim copies of captured slurmrestd traffic, kept in the repository (see its README.md).
SAMPLES = Path(__file__).resolve().parent.parent / "data" / "slurm-samples"
S2205 = SAMPLES / "slurm-22.05"
S2605 = SAMPLES / "slurm-26.05"


CAPTURES = SAMPLES.parent / "slurm-captures" / "slurm-26.05.5"


def capture(name: str) -> Any:
    """One of this project's own captures of Slurm 26.05.5 (tests/data/slurm-captures)."""
    return json.loads((CAPTURES / name).read_text(encoding="utf-8"))


def sample(relative: str) -> Any:
    return json.loads((SAMPLES / relative).read_text(encoding="utf-8"))


def sample_json_22(name: str) -> Any:
    # Some 22.05 captures end with curl's "HTTP 200 <time>" line after the JSON.
    text = (S2205 / name).read_text(encoding="utf-8")
    obj, _ = json.JSONDecoder().raw_decode(text)
    return obj


BASE_ENV = {"PATH": "/usr/bin:/bin", "SLURMJOB_UID": "abc-123"}


def cpu_request(**overrides: Any) -> LaunchRequest:
    values: dict[str, Any] = {
        "job_name": "sj-default-train-abc123",
        "comment": "slurmjob-uid=abc-123",
        "script": "#!/bin/bash\nsrun hostname\n",
        "working_directory": "/shared/jobs/abc",
        "standard_output": "/shared/jobs/abc/out-%j.log",
        "standard_error": "/shared/jobs/abc/err-%j.log",
        "environment": dict(BASE_ENV),
        "components": [
            JobComponent(pool="cpu", nodes=1, tasks_per_node=1, cpus_per_task=2, memory_mb=2048)
        ],
        "partition": "debug",
        "time_limit_minutes": 30,
    }
    values.update(overrides)
    return LaunchRequest(**values)


def gpu_request() -> LaunchRequest:
    return cpu_request(
        components=[
            JobComponent(
                pool="h100",
                nodes=2,
                tasks_per_node=4,
                cpus_per_task=8,
                memory_mb=64000,
                gpus_per_node=4,
                constraints="h100",
                exclusive=True,
            )
        ],
        account="ml",
        qos="high",
    )


def het_request() -> LaunchRequest:
    return cpu_request(
        components=[
            JobComponent(pool="cpu", nodes=1, cpus_per_task=2, memory_mb=1024),
            JobComponent(
                pool="a100",
                nodes=2,
                tasks_per_node=2,
                cpus_per_task=4,
                memory_mb=32000,
                gpus_per_node=2,
                constraints="a100",
            ),
        ],
        partition=None,
        time_limit_minutes=None,
    )


@dataclass
class Seen:
    method: str
    path: str
    query: list[tuple[str, str]]
    headers: dict[str, str]
    body: Any


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class FakeSlurm:
    """A slurmrestd stand-in: register answers per (method, path); every request is kept."""

    routes: dict[tuple[str, str], Handler] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    base_url: str = ""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        return app

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode()
        self.seen.append(
            Seen(
                request.method,
                request.path,
                list(request.query.items()),
                dict(request.headers),
                body,
            )
        )
        handler = self.routes.get((request.method, request.path))
        if handler is None:
            return web.Response(
                status=404, text="Unable to find requested URL endpoint.", content_type="text/plain"
            )
        return await handler(request)

    def json(self, method: str, path: str, payload: Any, status: int = 200) -> None:
        async def handler(_: web.Request) -> web.StreamResponse:
            return web.json_response(payload, status=status)

        self.routes[(method, path)] = handler

    def text(self, method: str, path: str, text: str, status: int) -> None:
        async def handler(_: web.Request) -> web.StreamResponse:
            return web.Response(status=status, text=text, content_type="text/plain")

        self.routes[(method, path)] = handler

    def drop(self, method: str, path: str) -> None:
        """Read the request, then close the connection without answering."""

        async def handler(request: web.Request) -> web.StreamResponse:
            assert request.transport is not None
            request.transport.close()
            await asyncio.sleep(0.05)
            return web.Response(status=200)

        self.routes[(method, path)] = handler

    def hang(self, method: str, path: str) -> None:
        """Read the request and never answer (until the test ends)."""

        async def handler(_: web.Request) -> web.StreamResponse:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.release.wait(), timeout=10)
            return web.Response(status=200)

        self.routes[(method, path)] = handler


def envelope(**fields: Any) -> dict[str, Any]:
    """A v0.0.40+ style answer body with empty errors/warnings unless given."""
    body: dict[str, Any] = {"meta": {"slurm": {"release": "26.05.3"}}, "errors": [], "warnings": []}
    body.update(fields)
    return body


class StaticToken:
    """A token provider that always hands out the same token."""

    expires_at = None

    def token(self) -> str:
        return "tok"
