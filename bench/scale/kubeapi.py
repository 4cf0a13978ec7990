"""The bench's own Kubernetes client: raw HTTPS to the testbed's kube-apiserver as its admin.

Raw aiohttp rather than kubectl or kubernetes_asyncio: creation runs with many requests in
flight on a pool of connections (so creation is not what the bench measures), and the watch is
read in chunks of any size (a status with two 64 KiB tails is longer than a line reader takes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import ssl
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

GROUP_PATH = "/apis/slurmjob.io/v1alpha1"
SUBMITTED_PHASES = frozenset({"Queued", "Running", "Succeeded", "Failed", "Cancelled"})
_LABELS = re.compile(r'(\w+)="([^"]*)"')


def _ssl(ca: Path, cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.load_cert_chain(str(cert), str(key))
    return ctx


@dataclass
class Seen:
    """What the watch saw of one object, as wall times."""

    submitted: float | None = None
    job_id: int | None = None
    phase: str | None = None
    phases: dict[str, float] = field(default_factory=dict)  # first time in each phase
    deleted: float | None = None
    status_bytes: int = 0


#: The label that splits the bench's objects into collection DELETEs the apiserver can serve.
BATCH_LABEL = "bench.slurmjob.io/batch"
#: Objects per collection DELETE: 1,000 ran past the apiserver's 60 s timeout too (HTTP 504) when
#: sent right after a restart with 10,000 SlurmJobs (2026-12-06).
BATCH_SIZE = 250


class Kube:
    def __init__(self, server: str, ca: Path, cert: Path, key: Path, connections: int = 32) -> None:
        self.server = server
        self._ctx = _ssl(ca, cert, key)
        self._connections = connections
        self.session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Kube:
        connector = aiohttp.TCPConnector(limit=self._connections, ssl=self._ctx)
        self.session = aiohttp.ClientSession(
            self.server, connector=connector, timeout=aiohttp.ClientTimeout(total=None)
        )
        return self

    async def __aexit__(self, *_: object) -> None:
        if self.session is not None:
            await self.session.close()

    @property
    def http(self) -> aiohttp.ClientSession:
        assert self.session is not None
        return self.session

    def _objects(self, namespace: str) -> str:
        return f"{GROUP_PATH}/namespaces/{namespace}/slurmjobs"

    async def ensure_namespace(self, namespace: str) -> None:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        async with self.http.post("/api/v1/namespaces", json=body) as resp:
            if resp.status not in (201, 409):
                raise RuntimeError(f"namespace {namespace}: HTTP {resp.status}")

    async def create_all(
        self, namespace: str, bodies: Iterable[dict[str, Any]], concurrency: int
    ) -> dict[str, float]:
        """POST every body with `concurrency` in flight; name -> wall time of the answer."""
        done: dict[str, float] = {}
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        for body in bodies:
            queue.put_nowait(body)

        async def worker() -> None:
            while not queue.empty():
                body = queue.get_nowait()
                for attempt in range(5):
                    async with self.http.post(self._objects(namespace), json=body) as resp:
                        if resp.status == 201:
                            done[body["metadata"]["name"]] = time.time()
                            break
                        text = await resp.text()
                        if (resp.status < 500 and resp.status != 429) or attempt == 4:
                            raise RuntimeError(f"create: HTTP {resp.status}: {text[:300]}")
                    await asyncio.sleep(0.5)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done

    async def list_all(self, namespace: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            params = {"limit": "500", **({"continue": token} if token else {})}
            async with self.http.get(self._objects(namespace), params=params) as resp:
                page = await resp.json()
            items += page.get("items") or []
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return items

    async def resource_version(self, namespace: str) -> str:
        async with self.http.get(self._objects(namespace), params={"limit": "1"}) as resp:
            page = await resp.json()
        return str(page["metadata"]["resourceVersion"])

    async def delete_collection(self, namespace: str, selector: str | None = None) -> None:
        params = {"labelSelector": selector} if selector else {}
        async with self.http.delete(self._objects(namespace), params=params) as resp:
            if resp.status != 200:
                raise RuntimeError(f"delete collection: HTTP {resp.status}: {await resp.text()}")

    async def delete_in_batches(self, namespace: str, batches: int) -> None:
        """Every object of the bench, one collection DELETE per `BATCH_LABEL` value: one
        DELETE of 10,000 SlurmJobs ran past the apiserver's 60 s request timeout (HTTP 504)."""
        for batch in range(batches):
            await self.delete_collection(namespace, f"{BATCH_LABEL}={batch}")

    async def drop_finalizers(self, namespace: str, names: Iterable[str]) -> None:
        """For clean-up after a run: objects whose operator is gone cannot be finalized."""
        headers = {"Content-Type": "application/merge-patch+json"}
        body = json.dumps({"metadata": {"finalizers": None}})
        slots = asyncio.Semaphore(self._connections)

        async def one(name: str) -> None:
            async with (
                slots,
                self.http.patch(
                    f"{self._objects(namespace)}/{name}", data=body, headers=headers
                ) as resp,
            ):
                await resp.read()

        await asyncio.gather(*(one(n) for n in names))

    async def apiserver_requests(self) -> dict[str, float]:
        """`apiserver_request_total` summed per `VERB resource[/subresource]`."""
        async with self.http.get("/metrics") as resp:
            text = await resp.text()
        totals: dict[str, float] = {}
        for line in text.splitlines():
            if not line.startswith("apiserver_request_total{"):
                continue
            labels_text, _, value = line.rpartition("} ")
            labels = dict(_LABELS.findall(labels_text))
            if not labels.get("resource"):
                continue  # /metrics, /healthz: the bench's own, not the operator's
            key = f"{labels.get('verb')} {labels['resource']}"
            if labels.get("subresource"):
                key += f"/{labels['subresource']}"
            totals[key] = totals.get(key, 0.0) + float(value)
        return totals

    async def open_watches(self) -> int:
        """Watches on SlurmJobs open right now: one more than the bench's own once the
        operator under test listens (it may talk to slurmrestd only at its first object)."""
        async with self.http.get("/metrics") as resp:
            text = await resp.text()
        total = 0.0
        for line in text.splitlines():
            if (
                line.startswith("apiserver_longrunning_requests{")
                and 'resource="slurmjobs"' in line
                and 'verb="WATCH"' in line
            ):
                total += float(line.rsplit(" ", 1)[1])
        return int(total)


async def etcd_db_size(url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as resp:
        text = await resp.text()
    out = {}
    for line in text.splitlines():
        for name in ("etcd_mvcc_db_total_size_in_bytes", "etcd_mvcc_db_total_size_in_use_in_bytes"):
            if line.startswith(name + " "):
                out[name] = float(line.split()[1])
    return out


class Watcher:
    """One watch on the namespace's SlurmJobs, re-opened where it ended; keeps `Seen`s."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.seen: dict[str, Seen] = {}
        self._task: asyncio.Task[None] | None = None
        self.events = 0

    async def start(self) -> None:
        rv = await self.kube.resource_version(self.namespace)
        self._task = asyncio.create_task(self._run(rv))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _on(self, event: dict[str, Any]) -> str | None:
        obj = event.get("object") or {}
        meta = obj.get("metadata") or {}
        if event.get("type") == "BOOKMARK":
            return str(meta.get("resourceVersion") or "") or None
        name = meta.get("name")
        if not name:
            return None
        now = time.time()
        self.events += 1
        seen = self.seen.setdefault(name, Seen())
        if event.get("type") == "DELETED":
            seen.deleted = seen.deleted or now
            return str(meta.get("resourceVersion") or "") or None
        status = obj.get("status") or {}
        phase = status.get("phase")
        if phase and phase not in seen.phases:
            seen.phases[phase] = now
        seen.phase = phase
        if status.get("slurmJobId"):
            seen.job_id = int(status["slurmJobId"])
        if seen.submitted is None and (seen.job_id or phase in SUBMITTED_PHASES):
            seen.submitted = now
        seen.status_bytes = len(json.dumps(status, separators=(",", ":")))
        return str(meta.get("resourceVersion") or "") or None

    async def _run(self, rv: str) -> None:
        path = self.kube._objects(self.namespace)
        while True:
            params = {
                "watch": "true",
                "allowWatchBookmarks": "true",
                "resourceVersion": rv,
                "timeoutSeconds": "1800",
            }
            try:
                async with self.kube.http.get(path, params=params) as resp:
                    buffer = b""
                    async for chunk in resp.content.iter_any():
                        buffer += chunk
                        *lines, buffer = buffer.split(b"\n")
                        for line in lines:
                            if not line.strip():
                                continue
                            event = json.loads(line)
                            if event.get("type") == "ERROR":  # 410 Gone: start from now
                                rv = await self.kube.resource_version(self.namespace)
                                break
                            rv = self._on(event) or rv
            except (aiohttp.ClientError, ValueError):
                await asyncio.sleep(0.5)
