"""`kubectl slurmjob logs`: a job's log, read or followed.

It asks the apiserver for the operator's aggregated log API (`api/logs.py`,
`logs.slurmjob.io/v1alpha1`, as `kubectl get --raw` would, with the kubeconfig's own
credentials): up to 64 KiB / 2,000 lines of the file, where the status keeps a few KiB; `-f`
asks again from where it stopped about once a second until the attempt has ended and its file
is read to the end. Where the cluster serves no such API (the apiserver's 404), or the
operator behind it does not answer, it prints the tail the status keeps, with a one-line
note on stderr saying why; a refusal (the apiserver's or the operator's) is an error.
"""

from __future__ import annotations

import argparse
from typing import TextIO

from slurmjob_operator.api.logs import LogAnswer, LogQuery, LogStream
from slurmjob_operator.core.logview import pick_attempt
from slurmjob_operator.plugin.kubeclient import (
    LogsApiAbsent,
    OperatorRefused,
    OperatorUnavailable,
    PluginError,
    Unauthorized,
)
from slurmjob_operator.plugin.render import Job, printable
from slurmjob_operator.plugin.subcommand import EXIT_OK, Cluster, Sleep

#: Seconds between two reads of a followed log.
FOLLOW_INTERVAL = 1.0
#: Seconds a follower keeps asking an operator that stopped answering (a replica restarting).
FOLLOW_PATIENCE = 60.0


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
    query = LogQuery(
        stream=stream,
        attempt=args.attempt,
        index=args.index,
        uid=args.uid,
        offset=0 if args.all else None,
    )
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
    pinned = query.model_copy(update={"attempt": answer.attempt})
    if args.all and not args.follow:
        await _rest(cluster, namespace, name, pinned, answer, writer)
    if not args.follow:
        return EXIT_OK
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


async def _rest(
    cluster: Cluster,
    namespace: str,
    name: str,
    pinned: LogQuery,
    answer: LogAnswer,
    writer: Writer,
) -> None:
    """The log after the first read, up to its size then (`--all` without -f)."""
    end = answer.size
    while answer.found and answer.next_offset < end:
        offset = answer.next_offset
        answer = await _read(cluster, namespace, name, pinned.model_copy(update={"offset": offset}))
        writer.write(answer.text)
        if answer.next_offset <= offset:  # nothing more can be had (a partial last line)
            return


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


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
