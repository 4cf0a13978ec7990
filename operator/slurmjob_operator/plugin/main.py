"""`kubectl slurmjob`: SlurmJobs from the user's side, with nothing but their kubeconfig.

    kubectl slurmjob logs NAME [-f] [--stderr] [--attempt N] [--index I]
    kubectl slurmjob get [NAME] [-A]
    kubectl slurmjob describe NAME
    kubectl slurmjob cancel NAME [--suspend] [--wait]
    kubectl slurmjob leader [--operator-namespace NS] [--lease NAME]

(each with kubectl's `-n NAMESPACE`, `--context CONTEXT` and `--kubeconfig PATH`, before or
after the subcommand). kubectl finds the console script
`kubectl-slurmjob` on the PATH and runs it with the words after `slurmjob`.

The command line is `plugin.args`; `logs` (where the log comes from, and what is printed when
the operator cannot say) is `plugin.logs`, the other subcommands `plugin.commands`.

Exit status: 0 done, 1 an error (on stderr), 2 bad usage, 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import TextIO

from slurmjob_operator.plugin.args import build_parser
from slurmjob_operator.plugin.commands import cmd_cancel, cmd_describe, cmd_get, cmd_leader
from slurmjob_operator.plugin.kubeclient import PluginError, Session
from slurmjob_operator.plugin.logs import cmd_logs
from slurmjob_operator.plugin.render import printable
from slurmjob_operator.plugin.subcommand import EXIT_ERROR, EXIT_INTERRUPTED, Cluster, Sleep
from slurmjob_operator.times import utc_now


async def run(
    args: argparse.Namespace,
    out: TextIO,
    err: TextIO,
    *,
    connect: Callable[[str | None], Awaitable[Cluster]] | None = None,
    sleep: Sleep = asyncio.sleep,
    now: Callable[[], datetime] = utc_now,
) -> int:
    if connect is None:
        cluster: Cluster = await Session.open(args.context, kubeconfig=args.kubeconfig)
    else:
        cluster = await connect(args.context)
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
