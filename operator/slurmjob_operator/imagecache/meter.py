"""What the image gate counts, on the operator's metrics (`metrics.Metrics`, the
`image_cache_*` and `image_import_seconds` series); without metrics it counts nothing.

The gate calls it once a decision is written, never before: a pass whose record write fails
is decided again and must not count twice. The cache's sweep gives `sizes` every record it
read (the bytes and entries per scope).
"""

from __future__ import annotations

from collections.abc import Iterable

from slurmjob_operator.imagecache.record import ImageRecord
from slurmjob_operator.imagecache.usage import ended_import, summarise
from slurmjob_operator.metrics import Metrics


class CacheMeter:
    def __init__(self, metrics: Metrics | None) -> None:
        self._metrics = metrics

    def hit(self, scope: str) -> None:
        """A SlurmJob's pass was given an entry and submitted no import."""
        if self._metrics is not None:
            self._metrics.images.hits_total.labels(scope=scope).inc()

    def miss(self, scope: str) -> None:
        """An import is sent (its write-ahead written): once per import, not per SlurmJob
        waiting on it."""
        if self._metrics is not None:
            self._metrics.images.misses_total.labels(scope=scope).inc()

    def written(self, before: ImageRecord | None, after: ImageRecord) -> None:
        """`after` was written in place of `before`: the import's seconds if it ended there."""
        ended = ended_import(before, after)
        if self._metrics is not None and ended is not None:
            outcome, seconds = ended
            self._metrics.images.import_seconds.labels(outcome=outcome).observe(seconds)

    def sizes(self, records: Iterable[ImageRecord]) -> None:
        """Every record there is (the sweep's read): the bytes and entries per scope, a scope
        with none left removed."""
        if self._metrics is not None:
            self._metrics.images.set_sizes(summarise(records))
