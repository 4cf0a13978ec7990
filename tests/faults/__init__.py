"""Fault injection between the operator and slurmrestd (see `tests.faults.proxy`)."""
