"""What kopf compares an event against to tell a creation, a change and nothing new apart,
kept in this process's memory instead of an annotation on the resource.

kopf's default keeps the last handled spec, labels and annotations on the resource itself
(`last-handled-configuration`): one more PATCH after every handled creation and change, a
seventh apiserver request per submission. Every handler here reconciles the whole resource
from what the apiserver holds, so a creation, a resume and a change all do the same work; what
the comparison must still give is a wake on every change of the spec or the labels (a Kueue
queue label, `requireQueue`), and none for the operator's own status writes.

So only a digest of each part of the last handled essence is kept per resource (a few hundred
bytes, not the essence), and a resource this process has not handled yet (after a start, or
when it took over the Lease) has no base: kopf takes it as a creation, and it is reconciled
once, as a resume would. Digests are dropped when the resource is deleted.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any, cast

import kopf

#: What stands in for a part that changed since it was handled: a value unlike any part (not a
#: mapping, so that kopf's diff is one change of the whole part, as handlers' fields name it).
CHANGED = "<changed since it was handled>"


def _digest(value: Any) -> bytes:
    encoded = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(encoded.encode(), digest_size=16).digest()


def _parts(essence: Any) -> dict[tuple[str, ...], Any]:
    """The essence's top-level parts, and metadata's one level down (labels, annotations)."""
    parts: dict[tuple[str, ...], Any] = {}
    for key, value in dict(essence).items():
        if key == "metadata" and isinstance(value, dict):
            for sub, subvalue in value.items():
                parts[(key, sub)] = subvalue
        else:
            parts[(key,)] = value
    return parts


def _trimmed(body: kopf.Body, extra_fields: Iterable[Any]) -> kopf.Body:
    """The body without what kopf's essence drops (the status, and metadata but labels and
    annotations) unless a handler's field names it: kopf's `build` deep-copies the whole body
    before it drops them (the status and managedFields are most of it), on every watch event,
    twice (the old essence is built again here to be compared by digest)."""
    paths = (f.split(".") if isinstance(f, str) else f for f in extra_fields)
    roots = {tuple(path)[:2] for path in paths}
    raw = {key: value for key, value in body.items() if key != "metadata"}
    if not any(root[:1] == ("status",) for root in roots):
        raw.pop("status", None)
    metadata = body.get("metadata", {})
    raw["metadata"] = {
        key: value
        for key, value in metadata.items()
        if key in ("labels", "annotations") or ("metadata", key) in roots
    }
    return kopf.Body(cast(Any, raw))


class EssenceMemory(kopf.DiffBaseStorage):
    """kopf's diff base, as digests in memory: no write to the resource."""

    def __init__(self) -> None:
        super().__init__()
        self._digests: dict[str, dict[tuple[str, ...], bytes]] = {}

    def __len__(self) -> int:
        return len(self._digests)

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None
    ) -> kopf.BodyEssence:
        extra = list(extra_fields or ())
        return super().build(body=_trimmed(body, extra), extra_fields=extra)

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        known = self._digests.get(str(body.metadata.uid))
        if known is None:
            return None
        now = _parts(self.build(body=body))
        old: dict[str, Any] = {}
        for path in known.keys() | now.keys():
            if path not in known:
                continue  # a part added since: absent from the base, so the diff shows it
            value = now[path] if path in now and _digest(now[path]) == known[path] else CHANGED
            if len(path) == 1:
                old[path[0]] = value
            else:
                old.setdefault(path[0], {})[path[1]] = value
        return cast(kopf.BodyEssence, old)

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        if body.metadata.deletion_timestamp:
            return  # it is going: nothing will be compared with this any more
        parts = _parts(essence)
        self._digests[str(body.metadata.uid)] = {p: _digest(v) for p, v in parts.items()}

    def forget(self, uid: str) -> None:
        self._digests.pop(uid, None)


#: The one instance: kopf's settings take it at start, the event handler forgets the deleted.
ESSENCES = EssenceMemory()


class UnmarkedProgress(kopf.AnnotationsProgressStorage):
    """kopf's progress annotations (only a deletion that waits keeps one), without the
    `<prefix>/kopf-managed` marker. kopf records a handler's success and purges the record in
    the same cycle, so nothing of it is written, but the marker it adds on the way stayed in
    the patch: one PATCH per new SlurmJob for an annotation that only tells other kopf
    operators' diff bases which annotations to ignore (ours, in memory, clears its own keys).
    Overrides a kopf internal (kopf is pinned below 1.46); `test_diffbase` checks the patch."""

    def _store_marker(self, prefix: str, patch: kopf.Patch, body: kopf.Body) -> None:
        return None
