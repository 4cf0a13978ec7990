"""The Kubernetes edge: one `KubeApi` per process on one ApiClient, opened at startup and
closed at cleanup, made of one part per thing it talks to: SlurmJobs and their status and
Events (slurmjobs.py), Kueue's Workloads (workloads.py), Secrets (secrets.py), Namespaces' uids
(namespaces.py), and what the log API asks (logapi.py: APIService, the front proxy's ConfigMap,
SubjectAccessReviews). The Lease is leases.py's, on the same ApiClient (`KubeApi.api`).

kopf drives the handlers; these calls are the operator's own writes, made *when* the decision
core says (a status write must land before the submit POST, not after the handler returns).
"""

from __future__ import annotations

from slurmjob_operator.kube.base import COMPONENT, REVIEWS_AT_ONCE
from slurmjob_operator.kube.configmaps import ConfigMaps
from slurmjob_operator.kube.logapi import LogApiAccess
from slurmjob_operator.kube.namespaces import Namespaces
from slurmjob_operator.kube.ports import (
    AccessReviewer,
    ConfigMapUnavailable,
    NamespaceReader,
    ResourceStore,
    ReviewUnavailable,
    SecretError,
    StatusConflict,
    WorkloadError,
    WorkloadStore,
)
from slurmjob_operator.kube.secrets import Secrets
from slurmjob_operator.kube.slurmjobs import SlurmJobs
from slurmjob_operator.kube.workloads import KUEUE_GROUP, KUEUE_VERSION, Workloads

__all__ = [
    "COMPONENT",
    "KUEUE_GROUP",
    "KUEUE_VERSION",
    "REVIEWS_AT_ONCE",
    "AccessReviewer",
    "ConfigMapUnavailable",
    "KubeApi",
    "NamespaceReader",
    "ResourceStore",
    "ReviewUnavailable",
    "SecretError",
    "StatusConflict",
    "WorkloadError",
    "WorkloadStore",
]


class KubeApi(SlurmJobs, Workloads, Secrets, LogApiAccess, Namespaces, ConfigMaps):
    """The few Kubernetes calls the operator makes, on one ApiClient."""
