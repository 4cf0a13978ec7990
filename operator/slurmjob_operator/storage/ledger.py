"""What the storage says of a resource's attempts: the highest number among the attempt
directories the operator made for it.

A status's attempt list is a claim (anyone who may write `slurmjobs/status` can shorten it);
the attempt directories are made by the operator under a path it derives itself
(`naming.resource_dir`) and stay until the resource is deleted, so their highest number is a
count the status cannot roll back. `core.claims` takes the higher of the two.

The walk follows no link and checks each directory's owner (`nofollow.walk`); the listing
reads at most `MAX_ENTRIES` names, so a directory a job filled costs a bounded read (and is
refused: the count cannot be told). A name the job planted (where the job's user owns the
resource directory) can only raise the count, which spends its own resource's budget sooner.
"""

from __future__ import annotations

import os
import re

from slurmjob_operator.config import Settings
from slurmjob_operator.core import naming
from slurmjob_operator.storage.nofollow import below, dir_owners, job_owner, walk

#: Names read from a resource directory at most (attempt directories, the checkpoint
#: directory and the secrets' copies: a resource that legitimately made this many attempts
#: has long spent every budget).
MAX_ENTRIES = 4096
_ATTEMPT = re.compile(r"attempt-([1-9][0-9]{0,8})")


class LedgerUnreadable(OSError):
    """The resource directory cannot be listed safely: its attempts cannot be counted."""


def attempts_made(settings: Settings, namespace: str, name: str, uid: str) -> int:
    """The highest attempt number among the resource's attempt directories (0: none made
    yet, or no resource directory). Raises `UnsafePath` where the walk is refused (a tree
    nothing can be staged in either) and `LedgerUnreadable` past `MAX_ENTRIES`."""
    path = naming.resource_dir(settings.storage_root, namespace, name, uid)
    highest = 0
    try:
        with (
            walk(
                settings.storage_root,
                below(settings.storage_root, path),
                dir_owners(job_owner(settings)),
            ) as fd,
            os.scandir(fd) as entries,
        ):
            for seen, entry in enumerate(entries):
                if seen >= MAX_ENTRIES:
                    raise LedgerUnreadable(f"{path}: more than {MAX_ENTRIES} entries")
                match = _ATTEMPT.fullmatch(entry.name)
                if match is not None:
                    highest = max(highest, int(match.group(1)))
    except FileNotFoundError:
        return 0
    return highest
