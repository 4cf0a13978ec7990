"""What a manifest's words may be, where they reach the batch script: env names, paths, command.

The batch script hands `spec.env`, `spec.mounts`, `spec.workingDir` and `spec.command` to srun
and the container runtime. These rules keep each of them what it claims to be: a variable of the
container (never one a host program acts on), a path (never shell or a list separator), the
command (never an option of srun or of the runtime). `api.spec` validates with them, `gen.crd`
turns them into the CRD's patterns and CEL rules, `site.render` checks them again.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# Environment names a manifest cannot set. spec.env reaches the container only, but on the way
# Pyxis takes it from the step's environment (`--container-env`), so srun, slurmstepd, the SPANK
# plugins and enroot (bash scripts, run with the step's environment on the compute node) see
# it too, under the same names. These are the names those host programs, the batch shell, the
# dynamic loader and libc act on, or that the batch script sets itself.
RESERVED_ENV_PREFIXES: tuple[str, ...] = (
    "SLURM",  # SLURM_*, SLURMD_*, SLURM_SPANK_* (srun options), this operator's SLURMJOB_*
    "_SLURM",  # _SLURM_SPANK_OPTION_*: SPANK plugin options (Pyxis' --container-*) in the env
    "SPANK_",  # the job control environment of SPANK plugins
    "SRUN_",  # input variables of Slurm's clients
    "SBATCH_",
    "SALLOC_",
    "SCRUN_",
    "PYXIS_",
    "ENROOT_",  # enroot's configuration: mounts, hooks, remapping, paths
    "XDG_",  # enroot's default config, data, cache and runtime paths
    "APPTAINER",  # APPTAINER_* configuration, APPTAINERENV_* (sets container variables)
    "SINGULARITY",
    "LD_",  # the dynamic loader: LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, ...
    "BASH_",  # BASH_ENV, BASH_XTRACEFD, BASH_COMPAT, ... and bash's read-only BASH_* variables
    "NVIDIA_REQUIRE_",  # enroot's NVIDIA hook (libnvidia-container) runs on the host
)
RESERVED_ENV_NAMES: frozenset[str] = frozenset(
    {
        # the shell and the process: what to run, where, and code run at startup or on trace
        *("PATH", "HOME", "TMPDIR", "IFS", "ENV", "BASHOPTS", "SHELLOPTS", "POSIXLY_CORRECT"),
        *("PS1", "PS2", "PS4", "PROMPT_COMMAND", "CDPATH", "GLOBIGNORE", "EXECIGNORE"),
        *("EUID", "UID", "PPID", "GROUPS", "FUNCNAME"),  # bash refuses to assign these
        # libc: the variables glibc ignores for setuid programs (besides LD_* and TMPDIR)
        *("GCONV_PATH", "GETCONF_DIR", "GLIBC_TUNABLES", "HOSTALIASES", "LOCALDOMAIN"),
        *("LOCPATH", "MALLOC_TRACE", "NIS_PATH", "NLSPATH", "RESOLV_HOST_CONF", "RES_OPTIONS"),
        "TZDIR",
        # enroot's NVIDIA hook: which devices and driver parts enter the container
        *("NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_DISABLE_REQUIRE"),
        *("NVIDIA_MIG_CONFIG_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES"),
        # set by the batch script for the launchers (a user value would override them)
        *("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NODE_RANK", "NUM_GPU_PER_NODE"),
        "RAY_ADDRESS",
    }
)

# Paths of mounts and workingDir: only these characters (no quote, `$`, space, `,` or `:`: Pyxis
# writes mounts into an enroot file that bash reads, and `,`/`:` separate mount lists), and
# components that are neither empty, `.` nor `..`, so that one place has one spelling.
PATH_CHARS = "A-Za-z0-9._+-"
_COMPONENT = f"[{PATH_CHARS}]+"
RELATIVE_PATH_RE = f"^{_COMPONENT}(/{_COMPONENT})*$"
ABSOLUTE_PATH_RE = f"^(/{_COMPONENT})+$"
WORKING_DIR_RE = f"^(/|(/{_COMPONENT})+)$"
PATH_TEXT = "letters, digits, '.', '_', '+', '-' and '/' between non-empty parts"

MAX_COMMAND_WORDS = 4096


def reserved_env_name(name: str) -> bool:
    """Whether spec.env may not set `name` (RESERVED_ENV_NAMES, RESERVED_ENV_PREFIXES)."""
    return name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES)


def path_problem(value: str, *, absolute: bool) -> str | None:
    """What makes `value` unfit as a mount path or working directory (None: nothing)."""
    if re.fullmatch(f"[/{PATH_CHARS}]*", value) is None:
        return f"may only use {PATH_TEXT}"
    parts = value.split("/")
    if absolute:
        if not value.startswith("/"):
            return "must be an absolute path"
        parts = parts[1:]
    if "" in parts:
        return "cannot have empty parts ('//', or '/' at the end)"
    if "." in parts or ".." in parts:
        return "cannot have '.' or '..' parts"
    return None


def command_problem(words: Sequence[str]) -> str | None:
    """What makes `words` unsafe as the command after srun's `--` (None: nothing)."""
    if any("\0" in word for word in words):
        return "command arguments cannot contain NUL bytes"
    if not words:
        return "command cannot be empty"
    if not words[0]:
        return "command[0] cannot be empty"
    if words[0].startswith("-"):
        return (
            f"command[0] {words[0]!r} starts with '-': srun or the container runtime would read "
            "it as one of their own options"
        )
    for index, word in enumerate(words):
        if word == ":":
            return (
                f"command[{index}] is ':', which srun reads as the separator of heterogeneous "
                "job components, even after '--'"
            )
    return None
