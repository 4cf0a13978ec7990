"""The command line of `kubectl slurmjob`: its subcommands, their options, and the checks
that refuse a malformed name or number before anything is asked of the apiserver.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

from slurmjob_operator.api.logs import UID_RE, dns_name

#: Where `leader` looks for the operator's Lease by default: the namespace the README installs
#: the operator into (`logs` needs no such guess: the apiserver knows its APIService).
DEFAULT_OPERATOR_NAMESPACE = "slurmjob-system"
OPERATOR_NAMESPACE_ENV = "KUBECTL_SLURMJOB_OPERATOR_NAMESPACE"


def _name(value: str) -> str:
    if not dns_name(value, 253, dots=True):
        raise argparse.ArgumentTypeError(f"{value!r} is not a SlurmJob name")
    return value


def _namespace(value: str) -> str:
    if not dns_name(value, 63, dots=False):
        raise argparse.ArgumentTypeError(f"{value!r} is not a namespace name")
    return value


def _uid(value: str) -> str:
    if not UID_RE.fullmatch(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a SlurmJob's uid")
    return value


def _count(low: int, high: int) -> Callable[[str], int]:
    def parse(value: str) -> int:
        if not value.isascii() or not value.isdigit() or not low <= int(value) <= high:
            raise argparse.ArgumentTypeError(f"{value!r} is not an integer from {low} to {high}")
        return int(value)

    return parse


def _kubectl_flags(parser: argparse.ArgumentParser, *, default: object) -> None:
    parser.add_argument(
        "-n",
        "--namespace",
        type=_namespace,
        default=default,
        help="the namespace (default: the context's)",
    )
    parser.add_argument("--context", default=default, help="the kubeconfig context to use")
    parser.add_argument(
        "--kubeconfig",
        default=default,
        metavar="PATH",
        help="the kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)",
    )


def build_parser(environ: dict[str, str] | None = None) -> argparse.ArgumentParser:
    env = os.environ if environ is None else environ
    # kubectl's own flags go before or after the subcommand; given after it, they win. The
    # subcommands' copies default to "not given" so that they never undo the first ones.
    common = argparse.ArgumentParser(add_help=False)
    _kubectl_flags(common, default=argparse.SUPPRESS)

    parser = argparse.ArgumentParser(
        prog="kubectl slurmjob",
        description="SlurmJobs from the user's side: logs, get, describe, cancel; the leader.",
    )
    _kubectl_flags(parser, default=None)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    logs = commands.add_parser(
        "logs", parents=[common], help="print a job's log (64 KiB / 2,000 lines); -f follows it"
    )
    logs.add_argument("name", type=_name, metavar="NAME")
    logs.add_argument("-f", "--follow", action="store_true", help="follow until the job ends")
    logs.add_argument("--stderr", action="store_true", help="standard error, not output")
    logs.add_argument(
        "--attempt", type=_count(1, 1_000_000), help="this attempt (default: the newest)"
    )
    logs.add_argument(
        "--index", type=_count(0, 999_999), help="the log of this task of a job array"
    )
    logs.add_argument(
        "--all", action="store_true", help="the whole log from its start, not its last 64 KiB"
    )
    logs.add_argument(
        "--uid",
        type=_uid,
        help="the SlurmJob of this uid, from the log archive once it is deleted",
    )
    logs.add_argument(
        "--raw",
        action="store_true",
        help="write control characters as they are, also to a terminal",
    )
    # Deprecated: the log went through the operator's Service; taken and ignored (a note
    # says so) for one release, so that scripts passing them still run.
    for flag in ("--operator-namespace", "--operator-service"):
        logs.add_argument(flag, dest="ignored", action="append", help=argparse.SUPPRESS)

    get = commands.add_parser(
        "get", parents=[common], help="attempts, Slurm ids, SLUIDs, arrays and reasons"
    )
    get.add_argument("name", type=_name, nargs="?", metavar="NAME")
    get.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")

    desc = commands.add_parser(
        "describe", parents=[common], help="one SlurmJob: attempts, conditions, log tails"
    )
    desc.add_argument("name", type=_name, metavar="NAME")

    cancel = commands.add_parser(
        "cancel",
        parents=[common],
        help="delete the SlurmJob (its Slurm job is cancelled first), or --suspend it",
    )
    cancel.add_argument("name", type=_name, metavar="NAME")
    cancel.add_argument(
        "--suspend",
        action="store_true",
        help="set spec.suspend instead: hold a queued job, submit nothing more",
    )
    cancel.add_argument(
        "--wait", action="store_true", help="wait until the SlurmJob is gone (after delete)"
    )
    cancel.add_argument(
        "--timeout", type=_count(1, 86_400), default=300, help="seconds --wait waits (300)"
    )

    leader = commands.add_parser(
        "leader", parents=[common], help="which operator replica leads (its Lease's holder)"
    )
    leader.add_argument(
        "--operator-namespace",
        type=_namespace,
        default=env.get(OPERATOR_NAMESPACE_ENV) or DEFAULT_OPERATOR_NAMESPACE,
        help=f"the operator's namespace (${OPERATOR_NAMESPACE_ENV}, "
        f"default {DEFAULT_OPERATOR_NAMESPACE})",
    )
    leader.add_argument(
        "--lease", type=_name, help="the Lease (default: every Lease of that namespace)"
    )
    return parser
