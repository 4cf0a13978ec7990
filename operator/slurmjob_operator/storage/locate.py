"""Where an attempt's files are: derived from the resource and the attempt's number, never
taken from the status.

`status.attempts[].stagingDir` is written by the operator, but anyone allowed to patch the
status subresource can rewrite it: to another tenant's attempt directory (whose logs would
then be published here, whose files would be removed) or anywhere else. So every read and
removal goes to `naming.staging_dir(root, namespace, name, uid, number)`; a status that says
otherwise is logged, once per resource and value, and not followed.
"""

from __future__ import annotations

import logging
from pathlib import Path

from slurmjob_operator.api.resource import ObjectRef
from slurmjob_operator.core import naming

log = logging.getLogger(__name__)

_WARNED_MAX = 1024
_warned: set[tuple[str, str]] = set()


def attempt_dir(storage_root: Path, ref: ObjectRef, number: int, recorded: str | None) -> Path:
    """The staging directory of attempt `number` of `ref`; `recorded` is what the status says
    (compared, never used)."""
    derived = naming.staging_dir(storage_root, ref.namespace, ref.name, ref.uid, number)
    if recorded is not None and Path(recorded) != derived:
        key = (ref.uid, recorded)
        if key not in _warned:
            if len(_warned) >= _WARNED_MAX:  # bounded, whatever a status is made to say
                _warned.clear()
            _warned.add(key)
            log.warning(
                "%s/%s attempt %s: the status names the staging directory %r, but it is %s; "
                "using %s",
                ref.namespace,
                ref.name,
                number,
                recorded,
                derived,
                derived,
            )
    return derived
