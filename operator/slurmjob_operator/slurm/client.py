"""`SlurmClient`: every slurmrestd operation the operator makes, over one shared `HttpTransport`.

Nothing here retries. Failures are raised as the `slurm.errors` taxonomy so the caller can
decide: `SlurmTransient` means nothing was done, `SlurmAmbiguous` (submit only) means a job
may exist and must be looked for (`find_by_name`) before submitting again.

The transport is the caller's (`slurm.http`: one connection per request, and tolerant of the
malformed responses some slurmrestd releases write). Choosing the version to speak is
`slurm.discovery`; one request and its answer is `slurm.exchange`.

Every answer is untrusted. One that cannot be read raises `SlurmMalformed` (a submit's:
`SlurmAmbiguous`, since the job may exist); ids outside Slurm's range are refused as
`InvalidJobRef` before anything is sent. A record of a list that cannot be read is left out
with a warning where the list is a sweep (`list_jobs`, `jobs_state`, the accounting search of
`find_by_name`): the other jobs go on. Where the answer is one job (`get_job`,
`get_job_accounting`) an unreadable record makes the answer `SlurmMalformed`: leaving out a
component or a run would misstate the job, and an empty answer would read as "gone".
"""

from __future__ import annotations

from slurmjob_operator.slurm.facts import ClusterFacts
from slurmjob_operator.slurm.jobchanges import JobChanges
from slurmjob_operator.slurm.jobreads import DEFAULT_LOOKBACK, JobReads

__all__ = ["DEFAULT_LOOKBACK", "SlurmClient"]


class SlurmClient(JobReads, JobChanges, ClusterFacts):
    """slurmrestd operations for one server and one concrete REST API version: its reads of
    jobs (jobreads.py), its changes of jobs (jobchanges.py) and its reads of the cluster
    (facts.py), over one session (session.py)."""
