"""`kubectl slurmjob`: SlurmJobs from the user's side, with nothing but their kubeconfig.

    kubectl slurmjob logs NAME [-f] [--stderr] [--attempt N] [--index I]
    kubectl slurmjob get [NAME] [-A]
    kubectl slurmjob describe NAME
    kubectl slurmjob cancel NAME [--suspend] [--wait]
    kubectl slurmjob leader [--operator-namespace NS] [--lease NAME]

(each with `-n NAMESPACE` and `--context CONTEXT`). kubectl finds the console script
`kubectl-slurmjob` on the PATH and runs it with the words after `slurmjob`.

`logs` asks the apiserver for the operator's aggregated log API (`api/logs.py`,
`logs.slurmjob.io/v1alpha1`, as `kubectl get --raw` would, with the kubeconfig's own
credentials): up to 64 KiB / 2,000 lines of the file, where the status keeps a few KiB; `-f`
asks again from where it stopped about once a second until the attempt has ended and its file
is read to the end. Where the cluster serves no such API (the apiserver's 404), or the
operator behind it does not answer, it prints the tail the status keeps, with a one-line
note on stderr saying why; a refusal (the apiserver's or the operator's) is an error.

Exit status: 0 done, 1 an error (on stderr), 2 bad usage, 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any, Protocol, TextIO

from slurmjob_operator.api.logs import LogAnswer, LogQuery, LogStream, dns_name
from slurmjob_operator.core.logview import pick_attempt
from slurmjob_operator.plugin.kubeclient import (
    LogsApiAbsent,
    OperatorRefused,
    OperatorUnavailable,
    PluginError,
    Session,
    Unauthorized,
)
from slurmjob_operator.plugin.leader import leader_table
from slurmjob_operator.plugin.render import (
    Job,
    delete_effect,
    describe,
    get_table,
    printable,
    suspend_effect,
)
from slurmjob_operator.times import utc_now

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

#: Where `leader` looks for the operator's Lease by default: the namespace the README installs
#: the operator into (`logs` needs no such guess: the apiserver knows its APIService).
DEFAULT_OPERATOR_NAMESPACE = "slurmjob-system"
OPERATOR_NAMESPACE_ENV = "KUBECTL_SLURMJOB_OPERATOR_NAMESPACE"
#: Seconds between two reads of a followed log.
FOLLOW_INTERVAL = 1.0
#: Seconds a follower keeps asking an operator that stopped answering (a replica restarting).
FOLLOW_PATIENCE = 60.0
#: Seconds between two looks at a SlurmJob `cancel --wait` waits for.
WAIT_INTERVAL = 1.0


class Cluster(Protocol):
    """What the commands need of a `Session` (tests give a fake)."""

    namespace: str

    async def refresh_credentials(self) -> bool: ...
    async def get(self, namespace: str, name: str) -> dict[str, Any]: ...
    async def exists(self, namespace: str, name: str) -> bool: ...
    async def list(self, namespace: str | None) -> list[dict[str, Any]]: ...
    async def delete(self, namespace: str, name: str) -> None: ...
    async def patch(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]: ...
    async def read_log(self, namespace: str, name: str, query: LogQuery) -> LogAnswer: ...
    async def leases(self, namespace: str, name: str | None) -> Sequence[dict[str, Any]]: ...
    async def close(self) -> None: ...


Sleep = Callable[[float], Awaitable[None]]


def _name(value: str) -> str:
    if not dns_name(value, 253, dots=True):
        raise argparse.ArgumentTypeError(f"{value!r} is not a SlurmJob name")
    return value


def _namespace(value: str) -> str:
    if not dns_name(value, 63, dots=False):
        raise argparse.ArgumentTypeError(f"{value!r} is not a namespace name")
    return value


def _count(low: int, high: int) -> Callable[[str], int]:
    def parse(value: str) -> int:
        if not value.isascii() or not value.isdigit() or not low <= int(value) <= high:
            raise argparse.ArgumentTypeError(f"{value!r} is not an integer from {low} to {high}")
        return int(value)

    return parse


def build_parser(environ: dict[str, str] | None = None) -> argparse.ArgumentParser:
    env = os.environ if environ is None else environ
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-n", "--namespace", type=_namespace, help="the namespace (default: the context's)"
    )
    common.add_argument("--context", help="the kubeconfig context to use")

    parser = argparse.ArgumentParser(
        prog="kubectl slurmjob",
        description="SlurmJobs from the user's side: logs, get, describe, cancel; the leader.",
    )
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


class Writer:
    """The log text to stdout, control characters shown as `\\xNN` on a terminal (a job's
    output must not drive the user's terminal), flushed after every piece."""

    def __init__(self, out: TextIO, *, raw: bool) -> None:
        self.out = out
        self.raw = raw

    def write(self, text: str) -> None:
        if not text:
            return
        self.out.write(text if self.raw else printable(text, keep=frozenset("\n\t\r")))
        self.out.flush()


def _note(err: TextIO, text: str) -> None:
    # Notes carry what others wrote (a status message, the operator's or apiserver's answer).
    err.write(f"note: {printable(text)}\n")
    err.flush()


async def _read(cluster: Cluster, namespace: str, name: str, query: LogQuery) -> LogAnswer:
    """One read; credentials the apiserver refuses are fetched again once (an exec plugin's
    token may have expired)."""
    try:
        return await cluster.read_log(namespace, name, query)
    except Unauthorized:
        if not await cluster.refresh_credentials():
            raise
        return await cluster.read_log(namespace, name, query)


async def cmd_logs(
    args: argparse.Namespace, cluster: Cluster, out: TextIO, err: TextIO, sleep: Sleep
) -> int:
    namespace = args.namespace or cluster.namespace
    name: str = args.name
    if args.ignored:
        _note(
            err,
            "--operator-namespace/--operator-service are ignored: logs come through the apiserver",
        )
    stream = LogStream.STDERR if args.stderr else LogStream.STDOUT
    query = LogQuery(stream=stream, attempt=args.attempt, index=args.index)
    writer = Writer(out, raw=args.raw or not _isatty(out))
    try:
        answer = await _first_read(cluster, namespace, name, query, args, err, sleep)
    except LogsApiAbsent as exc:
        why = f"no log API here ({exc})"
        return await _fallback(cluster, namespace, name, query, writer, err, why, args.follow)
    except OperatorUnavailable as exc:
        why = f"the operator's log API does not answer ({exc})"
        return await _fallback(cluster, namespace, name, query, writer, err, why, args.follow)
    except OperatorRefused as exc:
        raise PluginError(exc.error.message) from None
    what = f"{_file(answer)} of attempt {answer.attempt}"
    if not answer.found:
        _note(err, f"{what} does not exist {'(yet)' if not answer.ended else ''}".rstrip())
    elif answer.truncated:
        _note(err, f"{what}: its last 64 KiB / 2,000 lines, earlier lines left out")
    writer.write(answer.text)
    if not args.follow:
        return EXIT_OK
    pinned = query.model_copy(update={"attempt": answer.attempt})
    current, offset, waited = answer, answer.next_offset, 0.0
    while not (current.ended and offset >= current.size):
        await sleep(FOLLOW_INTERVAL)
        try:
            current = await _read(
                cluster, namespace, name, pinned.model_copy(update={"offset": offset})
            )
        except OperatorUnavailable as exc:
            if waited == 0:
                _note(err, f"the operator does not answer ({exc}); asking again")
            waited += FOLLOW_INTERVAL
            if waited >= FOLLOW_PATIENCE:
                raise PluginError(
                    f"the operator has not answered for {FOLLOW_PATIENCE:.0f} s: {exc}"
                ) from None
            continue
        except OperatorRefused as exc:
            if exc.error.reason == "NotFound":
                _note(err, f"slurmjob {name} was deleted")
                return EXIT_OK
            raise PluginError(exc.error.message) from None
        waited = 0.0
        if current.offset is not None and current.offset != offset:
            _note(err, f"{_file(current)} was replaced or cut short: reading it from its start")
        writer.write(current.text)
        offset = current.next_offset
    if current.latest_attempt > current.attempt:
        _note(
            err,
            f"attempt {current.latest_attempt} has started: kubectl slurmjob logs {name} "
            f"--attempt {current.latest_attempt} -f",
        )
    return EXIT_OK


async def _first_read(
    cluster: Cluster,
    namespace: str,
    name: str,
    query: LogQuery,
    args: argparse.Namespace,
    err: TextIO,
    sleep: Sleep,
) -> LogAnswer:
    """The first read; with -f and no attempt named, a SlurmJob not submitted yet is waited
    for (as long as it may still be: one that ended without an attempt is an error)."""
    told = False
    while True:
        try:
            return await _read(cluster, namespace, name, query)
        except OperatorRefused as exc:
            if exc.error.reason != "NoAttempt" or not args.follow or query.attempt is not None:
                raise
        job = Job.of(await cluster.get(namespace, name))
        phase = job.status.phase
        if phase is not None and phase.is_terminal:
            why = f": {job.status.message}" if job.status.message else ""
            raise PluginError(f"slurmjob {name} is {phase} without any attempt{why}")
        if not told:
            _note(err, f"slurmjob {name} has no attempt yet; waiting for its submission")
            told = True
        await sleep(FOLLOW_INTERVAL)


def _file(answer: LogAnswer) -> str:
    index = f"-{answer.index}" if answer.index is not None else ""
    return f"{answer.stream}{index}.log"


async def _fallback(
    cluster: Cluster,
    namespace: str,
    name: str,
    query: LogQuery,
    writer: Writer,
    err: TextIO,
    why: str,
    follow: bool,
) -> int:
    """The tail the status keeps, with a note saying why it is all there is."""
    job = Job.of(await cluster.get(namespace, name))
    status = job.status
    if query.index is not None:
        raise PluginError(f"{why}; and the status keeps no log per array task")
    current = status.current_attempt
    if query.attempt is not None and pick_attempt(status, query.attempt) is not current:
        raise PluginError(f"{why}; and the status keeps the newest attempt's tail only")
    logs = status.logs
    tail = None
    if logs is not None:
        tail = logs.stderr if query.stream is LogStream.STDERR else logs.stdout
    if tail is None:
        _note(err, f"{why}; the status keeps no {query.stream} tail (yet)")
        return EXIT_OK
    cut = ", earlier lines left out" if tail.truncated else ""
    after = "; not following (-f needs the operator)" if follow else ""
    _note(err, f"{why}; this is the {query.stream} tail the status keeps{cut}{after}")
    writer.write(tail.tail)
    return EXIT_OK


async def cmd_get(
    args: argparse.Namespace, cluster: Cluster, out: TextIO, err: TextIO, now: datetime
) -> int:
    namespace = args.namespace or cluster.namespace
    if args.name:
        bodies = [await cluster.get(namespace, args.name)]
    else:
        bodies = await cluster.list(None if args.all_namespaces else namespace)
    if not bodies:
        where = "any namespace" if args.all_namespaces else f"namespace {namespace}"
        err.write(f"No SlurmJobs found in {where}.\n")
        return EXIT_OK
    jobs = [Job.of(b) for b in bodies]
    out.write(get_table(jobs, now, namespaces=bool(args.all_namespaces and not args.name)))
    return EXIT_OK


async def cmd_describe(
    args: argparse.Namespace, cluster: Cluster, out: TextIO, now: datetime
) -> int:
    namespace = args.namespace or cluster.namespace
    out.write(describe(Job.of(await cluster.get(namespace, args.name)), now))
    return EXIT_OK


async def cmd_cancel(args: argparse.Namespace, cluster: Cluster, out: TextIO, sleep: Sleep) -> int:
    namespace = args.namespace or cluster.namespace
    name: str = args.name
    job = Job.of(await cluster.get(namespace, name))
    if args.suspend:
        if args.wait:
            raise PluginError("--wait waits for a deletion; --suspend deletes nothing")
        if not job.suspend:
            await cluster.patch(namespace, name, {"spec": {"suspend": True}})
        already = " (it was already)" if job.suspend else ""
        out.write(f"slurmjob.slurmjob.io/{name} suspended{already}: {suspend_effect(job)}\n")
        return EXIT_OK
    await cluster.delete(namespace, name)
    out.write(f"slurmjob.slurmjob.io/{name} deleted: {delete_effect(job)}\n")
    if not args.wait:
        return EXIT_OK
    deadline = time.monotonic() + args.timeout
    while await cluster.exists(namespace, name):
        if time.monotonic() >= deadline:
            raise PluginError(
                f"slurmjob {name} is still there after {args.timeout} s: its finalizer waits "
                f"for the Slurm job to end (kubectl slurmjob describe {name} -n {namespace})"
            )
        await sleep(WAIT_INTERVAL)
    out.write(f"slurmjob.slurmjob.io/{name} is gone\n")
    return EXIT_OK


async def cmd_leader(
    args: argparse.Namespace, cluster: Cluster, out: TextIO, err: TextIO, now: datetime
) -> int:
    leases = await cluster.leases(args.operator_namespace, args.lease)
    if not leases:
        err.write(f"No Leases found in namespace {args.operator_namespace}.\n")
        return EXIT_OK
    out.write(leader_table(leases, now))
    return EXIT_OK


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


async def run(
    args: argparse.Namespace,
    out: TextIO,
    err: TextIO,
    *,
    connect: Callable[[str | None], Awaitable[Cluster]] | None = None,
    sleep: Sleep = asyncio.sleep,
    now: Callable[[], datetime] = utc_now,
) -> int:
    cluster = await (connect or Session.open)(args.context)
    try:
        if args.command == "logs":
            return await cmd_logs(args, cluster, out, err, sleep)
        if args.command == "get":
            return await cmd_get(args, cluster, out, err, now())
        if args.command == "describe":
            return await cmd_describe(args, cluster, out, now())
        if args.command == "leader":
            return await cmd_leader(args, cluster, out, err, now())
        return await cmd_cancel(args, cluster, out, sleep)
    finally:
        await cluster.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out, err = sys.stdout, sys.stderr
    for stream in (out, err):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="replace")  # a log in any encoding prints, whatever the locale
    try:
        return asyncio.run(run(args, out, err))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except PluginError as exc:
        err.write(f"error: {printable(str(exc))}\n")
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
