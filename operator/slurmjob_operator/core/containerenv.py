"""How a value of spec.env reaches the program inside the container unchanged.

The batch script hands each variable to the runtime on the host side; what the runtime then
does with the bytes differs:

- Pyxis takes the step's environment as it is (``--container-env`` names the variables):
  the value is carried verbatim.
- Apptainer (1.5 here) reads ``APPTAINERENV_<NAME>`` values the way a shell reads a
  double-quoted string: ``$NAME``, ``${...}``, ``$(...)`` and backquotes are expanded (a
  command substitution runs inside the container), a backslash escapes ``\\``, ``$`` and the
  backquote, and one carriage return right before each line feed is dropped. Found by running
  the test bed's jobs in real Apptainer: ``$(not run)`` in a value became an empty string.

`carried` gives the bytes to hand the runtime so that the program sees the value exactly;
tests/unit/test_containerenv.py checks the inverse model of each runtime, and the
integration tests check both against the real runtimes.
"""

from __future__ import annotations

from slurmjob_operator.config.slurm import RuntimeProfile

#: Characters Apptainer's reading of a value treats as special; each is escaped with "\".
APPTAINER_SPECIAL = frozenset("\\$`")


def carried(profile: RuntimeProfile, value: str) -> str:
    """The value to hand ``profile``'s runtime so that the container sees ``value``."""
    if profile is not RuntimeProfile.APPTAINER:
        return value
    escaped = "".join("\\" + c if c in APPTAINER_SPECIAL else c for c in value)
    # One CR before each LF is dropped on the way in: give it one more to drop.
    return escaped.replace("\r\n", "\r\r\n")


#: What a step's srun passes on of the batch environment besides Slurm's own `SLURM_*`
#: (which srun always passes): the site's PATH, the operator's variables of the job's
#: description, and those the script sets for the launch (rendezvous, Ray's). Nothing else of
#: the batch environment (a site's TaskProlog, a variable a script of the site exports) reaches
#: a container. The operator's variables set only inside a step (SLURMJOB_NODE_RANK and the
#: like, by the launch wrappers) need no passing.
STEP_EXPORT_NAMES = (
    "PATH",
    "SLURMJOB_NAMESPACE",
    "SLURMJOB_NAME",
    "SLURMJOB_UID",
    "SLURMJOB_ATTEMPT",
    "SLURMJOB_STAGING_DIR",
    "SLURMJOB_NODE_COUNT",
    "SLURMJOB_ARRAY_INDEX",
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "NODE_RANK",
    "NUM_GPU_PER_NODE",
    "RAY_ADDRESS",
    "RAY_AUTH_MODE",
    "RAY_AUTH_TOKEN",
)


def step_export(profile: RuntimeProfile, env_names: list[str]) -> str:
    """srun's `--export` list for a step: STEP_EXPORT_NAMES and spec.env's names (under
    Apptainer's prefix with that runtime, as the script hands them over)."""
    prefix = "APPTAINERENV_" if profile is RuntimeProfile.APPTAINER else ""
    return ",".join([*STEP_EXPORT_NAMES, *(prefix + name for name in env_names)])
