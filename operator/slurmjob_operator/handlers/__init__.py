"""kopf handlers: importing this package registers them (thin: they unpack and delegate)."""

from slurmjob_operator.handlers import lifecycle, slurmjob

__all__ = ["lifecycle", "slurmjob"]
