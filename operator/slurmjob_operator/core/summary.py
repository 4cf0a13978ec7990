"""What every status write carries besides its transition: the fields `kubectl get` columns
read (a printer column can neither count a list nor subtract two times) and the `Finished`
condition, derived from the status itself so that no transition can leave them behind."""

from __future__ import annotations

from datetime import datetime

from slurmjob_operator.api.status import SlurmJobStatus
from slurmjob_operator.core.claims import claimed_cluster, segment_of
from slurmjob_operator.core.finality import is_final, with_finished
from slurmjob_operator.times import parse_rfc3339


def human_duration(seconds: float) -> str:
    """`45s`, `3m12s`, `2h5m7s`, `3d4h`: kubectl's style, at most two units past a day."""
    total = max(0, int(seconds))
    days, rest = divmod(total, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h" if hours else f"{days}d"
    parts = [(hours, "h"), (minutes, "m"), (secs, "s")]
    text = "".join(f"{n}{unit}" for n, unit in parts if n)
    return text or "0s"


def _duration(status: SlurmJobStatus) -> str | None:
    if not is_final(status):
        return None
    try:
        start = parse_rfc3339(status.start_time)
        end = parse_rfc3339(status.completion_time)
    except ValueError:
        return None  # a time written oddly: the column stays empty, nothing fails
    if start is None or end is None:
        return None
    return human_duration((end - start).total_seconds())


def with_summary(status: SlurmJobStatus, generation: int | None, now: datetime) -> SlurmJobStatus:
    """`status` with `attempt`, `cluster`, `segment`, `duration` and `Finished` in step with
    the rest."""
    current = status.current_attempt
    record = segment_of(current) if current is not None else None
    update = {
        "attempt": current.number if current is not None else None,
        # Shown as the attempt's record says (printer columns); nothing decides on them.
        "cluster": claimed_cluster(current) if current is not None else None,
        "segment": record.index if record is not None else None,
        "duration": _duration(status),
    }
    if any(getattr(status, key) != value for key, value in update.items()):
        status = status.model_copy(update=update)
    return with_finished(status, generation, now)
