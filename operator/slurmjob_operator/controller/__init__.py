"""Carries out what the decision core decides, against Kubernetes, Slurm and the storage:
`Controller` composes submission, following and deletion around one resource edge."""

from slurmjob_operator.controller.controller import Controller
from slurmjob_operator.controller.registry import Tracked
from slurmjob_operator.controller.resource import RetryLater

__all__ = ["Controller", "RetryLater", "Tracked"]
