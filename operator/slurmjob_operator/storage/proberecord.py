"""The collective probe's record of an attempt (`probe.record`, written by the batch script
as the job user): read with the tails' no-follow and owner rules, and bounded."""

from __future__ import annotations

import os
from pathlib import Path

from slurmjob_operator.config import Settings
from slurmjob_operator.core.naming import PROBE_RECORD_FILE
from slurmjob_operator.core.probe import MAX_RECORD_BYTES
from slurmjob_operator.storage.nofollow import (
    below,
    dir_owners,
    job_owner,
    open_file,
    read_at_most,
    walk,
)


def read_probe_record(
    settings: Settings, staging_dir: Path, owner: int | None = None
) -> bytes | None:
    """The record's bytes (at most one more than a record may have, so a longer one shows);
    None while there is none. UnsafePath (an OSError) when it is not a plain file of the job
    user's, or its directory is not the attempt's."""
    owner = job_owner(settings) if owner is None else owner
    parts = below(settings.storage_root, staging_dir / PROBE_RECORD_FILE)
    try:
        with walk(settings.storage_root, parts[:-1], dir_owners(owner)) as parent:
            fd = open_file(parent, parts[-1], owner, str(staging_dir / PROBE_RECORD_FILE))
    except FileNotFoundError:
        return None
    try:
        return read_at_most(fd, MAX_RECORD_BYTES + 1)
    finally:
        os.close(fd)
