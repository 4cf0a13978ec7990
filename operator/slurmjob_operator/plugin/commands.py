"""`kubectl slurmjob get`, `describe`, `cancel` and `leader` (`logs` is `plugin.logs`): each
reads or changes SlurmJobs (or Leases) through the apiserver and prints what `plugin.render`
and `plugin.leader` make of them.
"""

from __future__ import annotations

import argparse
import time
from datetime import datetime
from typing import TextIO

from slurmjob_operator.plugin.kubeclient import PluginError
from slurmjob_operator.plugin.leader import leader_table
from slurmjob_operator.plugin.render import (
    Job,
    delete_effect,
    describe,
    get_table,
    suspend_effect,
)
from slurmjob_operator.plugin.subcommand import EXIT_OK, Cluster, Sleep

#: Seconds between two looks at a SlurmJob `cancel --wait` waits for.
WAIT_INTERVAL = 1.0


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
