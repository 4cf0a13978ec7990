"""Carries out what the decision core decides, against Kubernetes, Slurm and the storage."""

from slurmjob_operator.controller.core_tmp import Controller, RetryLater, Tracked, lifecycle_ref

__all__ = ["Controller", "RetryLater", "Tracked", "lifecycle_ref"]
