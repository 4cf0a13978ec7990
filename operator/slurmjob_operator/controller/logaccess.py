"""Reading one log file of one attempt for the log endpoint (`logserver.py`), by the same
rules as the status tails.

The SlurmJob is read from the apiserver (with the operator's own credentials, once the
caller has been authorised); a SlurmJob deleted since is read from the log archive when the
query names its uid (`_archived`). Its attempt's directory is derived from the resource
(`storage.locate.attempt_dir`: never the status's stagingDir), on the storage root of the
cluster the attempt went to, and the file is reached without following a link and owned by
the job's user (the tenant's uid, or the job user). Its text is redacted with the secret
values the spec names, read now, and those the attempt was staged with; when neither is
known, nothing is given out. The read runs in a worker thread bounded by `READ_TIMEOUT`, at
most `concurrency` at once, on the log-reads pool the status tails share and no removal or
archive write does (`storage.executors`).

Every replica serves this, the standbys too: it needs nothing of the leader's state.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurmjob_operator.api.logs import READ_BYTES, READ_LINES, LogAnswer, LogQuery
from slurmjob_operator.api.resource import ResourceView
from slurmjob_operator.api.status import Attempt
from slurmjob_operator.config import Settings
from slurmjob_operator.controller.pipeline import Site
from slurmjob_operator.core.claims import claimed_cluster
from slurmjob_operator.core.logview import attempt_ended, pick_attempt
from slurmjob_operator.core.naming import log_file
from slurmjob_operator.core.placement import Clusters
from slurmjob_operator.core.redact import Redactor
from slurmjob_operator.core.ttlcache import TtlCache
from slurmjob_operator.kube import NamespaceReader, ResourceStore, SecretError
from slurmjob_operator.site.clusters import cluster_names, load_clusters
from slurmjob_operator.storage.archive import archived_file, read_record
from slurmjob_operator.storage.executors import Pool, run_in
from slurmjob_operator.storage.locate import attempt_dir
from slurmjob_operator.storage.logs import (
    READ_TIMEOUT,
    SecretsUnknown,
    UnsafePath,
    attempt_redactor,
    read_from,
    read_tail,
)
from slurmjob_operator.storage.nofollow import job_owner

log = logging.getLogger(__name__)

#: A SlurmJob read is shared this long by the requests for it (several followers, each
#: asking about once a second).
OBJECT_TTL = 1.0
#: The secret values of a resource are read again after this long.
SECRETS_TTL = 30.0
CACHE_ENTRIES = 1024


class LogFailure(Exception):
    """A read that cannot be answered with text: `code` is the HTTP status, `reason` a word."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class ClusterFiles:
    """Where one cluster's attempt files are and whose they must be."""

    settings: Settings
    job_uid: Callable[[str], int | None]

    def owner(self, namespace: str) -> int:
        uid = self.job_uid(namespace)
        return job_owner(self.settings) if uid is None else uid


class LogAccess:
    def __init__(
        self,
        store: ResourceStore,
        clusters: Mapping[str, ClusterFiles],
        names: Clusters,
        *,
        namespaces: Sequence[str] = (),
        concurrency: int = 8,
        clock: Callable[[], float] = time.monotonic,
        archive_root: Path | None = None,
    ) -> None:
        """`clusters` by name; `names`: their order and the cluster of an attempt that names
        none; `namespaces`: the ones the operator watches (empty: all); `archive_root`: the
        log archive deleted SlurmJobs are read from (`storage.archive`)."""
        self.archive_root = archive_root
        self.namespace_uids = store if isinstance(store, NamespaceReader) else None
        self.store = store
        self.clusters = dict(clusters)
        self.names = names
        self.namespaces = frozenset(namespaces)
        self._clock = clock
        self._reads = asyncio.Semaphore(concurrency)
        self._objects: TtlCache[tuple[str, str], dict[str, Any]] = TtlCache(
            OBJECT_TTL, CACHE_ENTRIES
        )
        self._secrets: TtlCache[str, list[str]] = TtlCache(SECRETS_TTL, CACHE_ENTRIES)

    @classmethod
    def from_settings(
        cls, settings: Settings, store: ResourceStore, namespaces: Sequence[str] = ()
    ) -> LogAccess:
        """Every cluster of the settings (the clusters file), with its tenants' uids."""
        sites = load_clusters(settings)
        names = cluster_names(sites, settings.cluster_name)
        files = {
            site.name: ClusterFiles(site.settings, Site.load(site.settings, names.names).job_uid)
            for site in sites
        }
        return cls(store, files, names, namespaces=namespaces, archive_root=settings.archive_root)

    async def read(self, namespace: str, name: str, query: LogQuery) -> LogAnswer:
        """One read (a tail without `query.offset`, else from it); LogFailure otherwise."""
        if self.namespaces and namespace not in self.namespaces:
            raise LogFailure(404, "NotWatched", f"namespace {namespace} is not watched here")
        if query.uid is not None:
            body = await self._body(namespace, name)
            if body is None or ResourceView.of(body).ref.uid != query.uid:
                return await self._archived(namespace, name, query.uid, query)
        view = await self._view(namespace, name)
        status = view.status
        attempt = pick_attempt(status, query.attempt)
        if attempt is None:
            which = f"attempt {query.attempt}" if query.attempt else "an attempt"
            raise LogFailure(404, "NoAttempt", f"SlurmJob {namespace}/{name} has no {which} yet")
        files = self._files(attempt)
        base = attempt_dir(files.settings.storage_root, view.ref, attempt.number, None)
        path = base / log_file(query.stream, query.index)
        ended = attempt_ended(status, attempt)
        owner = files.owner(namespace)
        current = await self._secret_values(view)
        latest = status.current_attempt
        answer = {
            "namespace": namespace,
            "name": name,
            "attempt": attempt.number,
            "latest_attempt": latest.number if latest is not None else attempt.number,
            "stream": query.stream,
            "index": query.index,
            "ended": ended,
            "phase": str(status.phase) if status.phase is not None else None,
        }

        def read() -> dict[str, Any]:
            redactor = attempt_redactor(files.settings, base, current, owner)
            return _read_log(path, files.settings.storage_root, owner, redactor, query, ended)

        result = await self._run(read, path, f"{namespace}/{name}", base, files.settings)
        return LogAnswer.model_validate({**answer, **result})

    async def _archived(self, namespace: str, name: str, uid: str, query: LogQuery) -> LogAnswer:
        """A read of the archive entry of `uid`: only while it is the SlurmJob `name` of this
        namespace, the very namespace it was archived from (a new one of the same name sees
        nothing). Its files were redacted when they were archived."""
        root = self.archive_root
        gone = LogFailure(404, "NotFound", f"SlurmJob {namespace}/{name} of uid {uid} not found")
        if root is None or self.namespace_uids is None:
            raise gone
        try:
            record = await run_in(Pool.ARCHIVE, read_record, root, namespace, uid)
        except (OSError, ValueError) as exc:
            log.warning("refusing the archive of %s/%s (%s): %s", namespace, name, uid, exc)
            raise gone from None
        if record is None or record.name != name:
            raise gone
        if record.namespace_uid != await self.namespace_uids.namespace_uid(namespace):
            raise gone
        archived = record.attempt(query.attempt)
        if archived is None:
            which = f"attempt {query.attempt}" if query.attempt else "an attempt"
            raise LogFailure(404, "NoAttempt", f"the archive of {namespace}/{name} has no {which}")
        try:
            path = archived_file(
                root, namespace, uid, archived.number, log_file(query.stream, query.index)
            )
        except ValueError:  # a task index no array has
            raise LogFailure(
                404, "NotFound", f"the archive of {namespace}/{name} has no such log"
            ) from None
        answer = {
            "namespace": namespace,
            "name": name,
            "attempt": archived.number,
            "latest_attempt": record.attempts[-1].number,
            "stream": query.stream,
            "index": query.index,
            "ended": True,
            "phase": record.phase,
        }

        def read() -> dict[str, Any]:
            return _read_log(path, root, os.geteuid(), Redactor(()), query, True)

        result = await self._run(read, path, f"{namespace}/{name}", path.parent, None)
        return LogAnswer.model_validate({**answer, **result})

    async def _run(
        self,
        read: Callable[[], dict[str, Any]],
        path: Path,
        what: str,
        base: Path,
        settings: Settings | None,
    ) -> dict[str, Any]:
        """`read` in a worker thread, bounded in time and number; its failures as LogFailure."""
        try:
            async with asyncio.timeout(READ_TIMEOUT):
                async with self._reads:
                    return await run_in(Pool.LOG_READS, read)
        except TimeoutError:  # an OSError too: first
            log.warning("reading %s took over %s s", path, READ_TIMEOUT)
            raise LogFailure(504, "ReadTimeout", "the log could not be read in time") from None
        except SecretsUnknown:
            raise LogFailure(
                503,
                "SecretsUnknown",
                "the secret values to hide in this log cannot be read now; nothing is shown "
                "rather than an unredacted log",
            ) from None
        except UnsafePath as exc:
            log.warning("refusing the log of %s: %s", what, exc)
            root = settings.storage_root if settings is not None else base
            where = _relative(exc, base, root)
            raise LogFailure(422, "UnsafeFile", f"the log file is refused: {where}") from None
        except OSError as exc:
            log.warning("cannot read the log of %s: %s", what, exc)
            raise LogFailure(500, "ReadError", f"the log cannot be read: {exc.strerror}") from None

    async def _body(self, namespace: str, name: str) -> dict[str, Any] | None:
        key = (namespace, name)
        body = self._objects.get(key, self._clock())
        if body is None:
            body = await self.store.get(namespace, name)
            if body is not None:
                self._objects.put(key, body, self._clock())
        return body

    async def _view(self, namespace: str, name: str) -> ResourceView:
        body = await self._body(namespace, name)
        if body is None:
            raise LogFailure(404, "NotFound", f"SlurmJob {namespace}/{name} not found")
        return ResourceView.of(body)

    def _files(self, attempt: Attempt) -> ClusterFiles:
        # The files of this resource's own attempt (paths derived, never read from the status)
        # on the storage of the cluster its record names: a claim can only point the read at
        # its own resource's directory on another cluster's storage.
        named = claimed_cluster(attempt)
        cluster = named if named is not None else self.names.unnamed
        files = self.clusters.get(cluster) if cluster is not None else None
        if files is None:
            raise LogFailure(
                409,
                "ClusterUnknown",
                f"attempt {attempt.number} went to cluster {named or '(unnamed)'}, "
                "whose storage this operator does not know",
            )
        return files

    async def _secret_values(self, view: ResourceView) -> list[str] | None:
        """The values of the spec's secret env vars now; None when one cannot be read."""
        if not view.secret_refs:
            return []
        uid = view.ref.uid
        cached = self._secrets.get(uid, self._clock())
        if cached is not None:
            return cached
        values: list[str] = []
        for ref in view.secret_refs:
            try:
                values.append(
                    await self.store.read_secret_value(view.ref.namespace, ref.secret, ref.key)
                )
            except SecretError:
                return None
        self._secrets.put(uid, values, self._clock())
        return values


def _relative(exc: UnsafePath, base: Path, root: Path) -> str:
    """The refusal without the storage root's path (the user needs the file, not the root):
    a file of the attempt by its name, a directory above it from below the root."""
    return str(exc).replace(str(base) + "/", "").replace(str(root) + "/", "")


def _read_log(
    path: Path, root: Path, owner: int, redactor: Redactor, query: LogQuery, ended: bool
) -> dict[str, Any]:
    """A tail of `path` without `query.offset`, else the bytes from it (see `LogAnswer`)."""
    if query.offset is None:
        tail = read_tail(
            path,
            root=root,
            owner=owner,
            max_bytes=READ_BYTES,
            max_lines=READ_LINES,
            redact=redactor,
        )
        if tail is None:
            return {"found": False, "next_offset": 0, "size": 0}
        return {
            "found": True,
            "text": tail.tail,
            "truncated": tail.truncated,
            "next_offset": tail.bytes,
            "size": tail.bytes,
        }
    chunk = read_from(
        path,
        query.offset,
        root=root,
        owner=owner,
        complete=ended,
        max_bytes=READ_BYTES,
        redact=redactor,
    )
    if chunk is None:
        return {"found": False, "next_offset": query.offset, "size": 0}
    return {
        "found": True,
        "text": chunk.text,
        "offset": chunk.start,
        "next_offset": chunk.next_offset,
        "size": chunk.size,
    }
