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
