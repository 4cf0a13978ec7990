"""The image cache's metrics (docs/images.md, "Metrics"), on the registry of `metrics.Metrics`
(its `images`): kept apart so that `metrics` stays one screenful of the operator's own.

`scope` is the cache's scope word, `public` or `tenant-<name>`: as many values as the tenants
file has tenants. Never an image reference or a SlurmJob: those are unbounded. The counters
and the histogram are moved by `imagecache.meter` as the gate writes its decisions; the gauges
are set from every record at each sweep of the cache (`set_sizes`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# An import is a batch job: seconds when its layers are cached, up to its 2 h limit
# (SLURMJOB_IMAGE_IMPORT_TIME_MINUTES) for a large pull behind a busy partition's queue.
IMPORT_BUCKETS: Final = (10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0)
IMPORT_OUTCOMES: Final = ("ready", "failed")


class ImageCacheMetrics:
    """* `image_cache_hits_total{scope}`: SlurmJob passes given an entry (bound or Ready)
      without sending an import;
    * `image_cache_misses_total{scope}`: imports sent, one per import however many
      SlurmJobs wait on it;
    * `image_import_seconds{outcome}`: ended imports, write-ahead to recorded end, `ready` or
      `failed`;
    * `image_cache_bytes{scope}`, `image_cache_entries{scope}`: what the records say each scope
      holds (a file of several records counted once).
    """

    def __init__(self, registry: CollectorRegistry, prefix: str) -> None:
        scope = ["scope"]
        self.hits_total = Counter(
            f"{prefix}_image_cache_hits",
            "SlurmJob passes the image cache gave an entry (bound or Ready) without sending an "
            "import, by scope (public or tenant-<name>).",
            scope,
            registry=registry,
        )
        self.misses_total = Counter(
            f"{prefix}_image_cache_misses",
            "Image imports sent (one per import, however many SlurmJobs wait on it), by scope.",
            scope,
            registry=registry,
        )
        self.import_seconds = Histogram(
            f"{prefix}_image_import_seconds",
            "Ended image imports, from the write-ahead before the submit to the recorded end, "
            "by outcome (ready, failed).",
            ["outcome"],
            buckets=IMPORT_BUCKETS,
            registry=registry,
        )
        self.bytes = Gauge(
            f"{prefix}_image_cache_bytes",
            "Bytes of the image cache's entries by scope, as the operator's records say.",
            scope,
            registry=registry,
        )
        self.entries = Gauge(
            f"{prefix}_image_cache_entries",
            "Files of the image cache's entries by scope, as the operator's records say.",
            scope,
            registry=registry,
        )
        for outcome in IMPORT_OUTCOMES:
            self.import_seconds.labels(outcome=outcome)
        self._scopes: set[str] = set()

    def set_sizes(self, per_scope: Mapping[str, tuple[int, int]]) -> None:
        """Bytes and entries from (bytes, entries) per scope (`imagecache.usage.summarise` of
        every record). A scope not given any more is removed: a tenant whose entries are all
        evicted, or who left the tenants file, leaves no stale series."""
        for scope in self._scopes - per_scope.keys():
            self.bytes.remove(scope)
            self.entries.remove(scope)
        for scope, (size, entries) in per_scope.items():
            self.bytes.labels(scope=scope).set(size)
            self.entries.labels(scope=scope).set(entries)
        self._scopes = set(per_scope)
