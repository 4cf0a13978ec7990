"""The operator's records of verified registry artifacts, kept as the image records are
(imagecache/store.py): one ConfigMap of its namespace per record (`slurmjob-artifact-...`,
key `record`), written by the leader only, one decision at a time per record, read from the
apiserver the first time it is needed and again after `RELOAD_SECONDS`.

A record that does not parse is reported and treated as absent: the artifact is verified
again (a job's time on a CPU node, never a pass). Nothing here is read from a SlurmJob.
"""

from __future__ import annotations

from slurmjob_operator.imagecache.store import ConfigMapRecords, RecordKind
from slurmjob_operator.imagecache.verifyrecord import RECORD_KEY_PREFIX, ArtifactRecord
from slurmjob_operator.kube.ports import ConfigMapStore

ARTIFACT_RECORDS = RecordKind(
    "artifact record", RECORD_KEY_PREFIX, ArtifactRecord.from_json, "verifying it again"
)


class ArtifactRecordStore(ConfigMapRecords[ArtifactRecord]):
    def __init__(self, configmaps: ConfigMapStore, namespace: str) -> None:
        super().__init__(configmaps, namespace, ARTIFACT_RECORDS)
