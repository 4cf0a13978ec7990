"""slurmjob-operator: run Slurm jobs from Kubernetes through slurmrestd."""

__version__ = "0.1.0"

GROUP = "slurmjob.io"
VERSION = "v1alpha1"
KIND = "SlurmJob"
PLURAL = "slurmjobs"
SINGULAR = "slurmjob"
SHORT_NAMES = ("sj",)
PREFIX = "slurmjob.io/"
FINALIZER = f"{GROUP}/finalizer"
