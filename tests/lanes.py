"""`make test`'s pytest step: the suite in lanes that share one set of test daemons.

Most integration modules spend their time waiting (for a job to end, for slurmctld to purge,
for an operator to poll), so running two of them at once on two cores costs little more than
one. This runner:

1. starts the shared daemons once, itself: both Slurm clusters, etcd + kube-apiserver and
   Kueue, and the OCI registries (tests/testbed/registry.py, which also push their images),
   the four stacks at once (with $SLURMJOB_TESTBED_KEEP set, running ones are re-used and
   left running);
2. runs the modules that must be alone (``[lanes] exclusive`` in tests/budgets.toml: they stop
   slurmctld or slurmrestd, or change what every module sees), one after another, in one
   pytest process;
3. runs every other module (the unit tier as one) in ``--lanes`` pytest processes at once,
   each module in the lane with the least budgeted time so far (longest first), and beside
   them each module of ``[lanes] own`` in a process of its own (modules that mostly wait on
   Slurm's clock, such as two-minute walltime segments, and would only lengthen a lane);
4. prints each lane's output, one combined time table against the budgets, and the time of
   each phase; stops the daemons it started.

Each pytest process runs with $SLURMJOB_TESTBED_KEEP=1: its session fixtures attach to the
running daemons and never stop them, so no process kills another one's "stale" daemons. A
module is isolated from its neighbours by its own namespaces, operator Lease and Slurm job
names. The exit status is the first non-zero pytest status (5, nothing collected, included),
0 when every process passed.

``python -m tests.lanes --serial`` runs the same modules in one process (the baseline
``docs/benchmarks.md`` compares with); ``--plan`` prints the lanes and exits.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.testbed.procs import SHARED_ENV  # noqa: E402
from tests.timing import BUDGETS_FILE, Row, format_table, load_budgets, to_json  # noqa: E402

UNIT = "tests/unit"
#: The budget of a module missing from tests/budgets.toml, for planning only.
DEFAULT_BUDGET = 30.0
KEEP_ENV = "SLURMJOB_TESTBED_KEEP"


@dataclass
class Lane:
    name: str
    modules: list[str] = field(default_factory=list)
    budget: float = 0.0


@dataclass(frozen=True)
class Plan:
    exclusive: list[str]  # one by one, nothing else on the daemons meanwhile
    beside: list[str]  # at the same time as the exclusive ones: the unit tier, no daemons
    lanes: list[Lane]


@dataclass(frozen=True)
class Rules:
    """``[lanes]`` of tests/budgets.toml."""

    exclusive: list[str]
    together: list[list[str]]  # modules that clash only with each other: one lane
    own: list[str] = field(default_factory=list)
    """Modules that mostly wait (on Slurm's clock) and use little CPU: each in a lane of
    its own, beside the others, so their waiting adds nothing to the wall time."""


def parse_rules(text: str) -> Rules:
    """``[lanes]`` of a budget file; raises ValueError naming what is malformed."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"not TOML: {e}") from e
    table = data.get("lanes", {})
    if not isinstance(table, dict):
        raise ValueError("[lanes] is not a table")
    exclusive = table.get("exclusive", [])
    if not isinstance(exclusive, list) or not all(isinstance(m, str) for m in exclusive):
        raise ValueError("[lanes] exclusive is not a list of module paths")
    together = table.get("together", [])
    if not isinstance(together, list) or not all(
        isinstance(g, list) and all(isinstance(m, str) for m in g) for g in together
    ):
        raise ValueError("[lanes] together is not a list of lists of module paths")
    seen = [m for g in together for m in g]
    if len(seen) != len(set(seen)):
        raise ValueError("[lanes] together names a module in two groups")
    if set(seen) & set(exclusive):
        raise ValueError("[lanes] a module is both exclusive and in a group")
    own = table.get("own", [])
    if not isinstance(own, list) or not all(isinstance(m, str) for m in own):
        raise ValueError("[lanes] own is not a list of module paths")
    if set(own) & (set(seen) | set(exclusive)):
        raise ValueError("[lanes] a module in a lane of its own is also exclusive or grouped")
    return Rules(list(exclusive), [list(g) for g in together], list(own))


def modules(repo: Path) -> list[str]:
    """The suite's parts: each integration module, and the unit tier as one."""
    found = sorted(str(p.relative_to(repo)) for p in (repo / "tests/integration").glob("test_*.py"))
    return [*found, UNIT]


def budget_of(module: str, budgets: Mapping[str, float]) -> float:
    if module == UNIT:
        unit = [s for m, s in budgets.items() if m.startswith(UNIT + "/")]
        return sum(unit) if unit else DEFAULT_BUDGET
    return budgets.get(module, DEFAULT_BUDGET)


def budget_sum(parts: Sequence[str], budgets: Mapping[str, float]) -> float:
    return sum(budget_of(m, budgets) for m in parts)


def plan(parts: Sequence[str], rules: Rules, budgets: Mapping[str, float], lanes: int) -> Plan:
    """Exclusive modules in path order, the unit tier beside them (when there are any); each
    of ``own`` in a lane of its own; the other modules spread over ``lanes`` lanes: each group
    of ``together`` (what of it is to run) or single module, longest budget first, to the lane
    with the least budget so far (ties: the first lane)."""
    if lanes < 1:
        raise ValueError("at least one lane")
    alone = sorted(m for m in parts if m in set(rules.exclusive))
    beside = [UNIT] if alone and UNIT in parts else []
    own = [m for m in parts if m in set(rules.own)]
    rest = [m for m in parts if m not in set(alone) | set(beside) | set(own)]
    units: list[list[str]] = []
    for group in rules.together:
        members = [m for m in rest if m in group]
        if members:
            units.append(members)
    grouped = {m for unit in units for m in unit}
    units += [[m] for m in rest if m not in grouped]
    units.sort(key=lambda unit: (-budget_sum(unit, budgets), unit[0]))
    out = [Lane(f"lane-{i + 1}") for i in range(lanes)]
    for unit in units:
        lane = min(out, key=lambda lane: lane.budget)
        lane.modules += unit
        lane.budget += budget_sum(unit, budgets)
    mine = [Lane(f"own-{i + 1}", [m], budget_of(m, budgets)) for i, m in enumerate(own)]
    return Plan(alone, beside, [lane for lane in out if lane.modules] + mine)


# -------------------------------------------------------------------------- the daemons


class Daemons:
    """Starts the shared daemons (unless re-used) and stops what it started."""

    def __init__(self, keep: bool) -> None:
        self.keep = keep

    def start(self) -> None:
        from tests.k8s import kube, kueue
        from tests.testbed import registry, slurm

        slurm.prepare_host()  # users and shared directories once, before the threads
        errors: list[str] = []

        def run(what: str, start: Callable[[], object]) -> None:
            try:
                start()
            except Exception as e:  # reported together below
                errors.append(f"{what}: {e}")

        def kube_and_kueue() -> None:
            bed = kube.start_testbed(reuse=self.keep)
            kueue.start_kueue(bed, reuse=self.keep)

        threads = [
            threading.Thread(
                target=run, args=(f"Slurm {n}", lambda n=n: slurm.start_cluster(n, reuse=self.keep))
            )
            for n in slurm.SPECS
        ]
        threads.append(threading.Thread(target=run, args=("kube-apiserver", kube_and_kueue)))
        threads.append(
            threading.Thread(
                target=run,
                args=("registries", lambda: registry.start_registries(reuse=self.keep)),
            )
        )
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise RuntimeError("the test daemons did not start:\n" + "\n".join(errors))

    def stop(self) -> None:
        if self.keep:
            return
        from tests.k8s import kube, kueue
        from tests.testbed import registry, slurm

        registry.stop_registries()
        kueue.stop_kueue()
        kube.stop_testbed()
        for name in slurm.SPECS:
            slurm.stop_cluster(name)


# -------------------------------------------------------------------------- the processes


@dataclass
class Run:
    name: str
    modules: list[str]
    log: Path
    timings: Path
    stream: bool = False  # its output straight to ours (one process at a time only)
    # Added to its scheduling niceness: the unit tier only needs to end before the exclusive
    # modules beside it, whose operators, daemons and deadlines must get the CPUs first.
    niceness: int = 0
    code: int | None = None
    seconds: float = 0.0


#: The unit tier's niceness beside the exclusive modules (see `Run.niceness`).
UNIT_NICENESS = 10


def _pytest(run: Run, options: Sequence[str]) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "pytest", *options, "--timings-json", str(run.timings)]
    if run.niceness:
        argv = ["nice", "-n", str(run.niceness), *argv]
    env = {**os.environ, KEEP_ENV: "1", SHARED_ENV: "1"}
    if run.stream:
        return subprocess.Popen([*argv, *run.modules], cwd=REPO, env=env)
    out = run.log.open("wb")
    try:
        return subprocess.Popen(
            [*argv, *run.modules], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    finally:
        out.close()


def _phase(runs: Sequence[Run], options: Sequence[str]) -> None:
    """Run ``runs`` at once; the output of each after the phase (the streamed one's as it goes)."""
    started = time.monotonic()
    pending = {i: _pytest(run, options) for i, run in enumerate(runs)}
    try:
        while pending:
            for i, proc in list(pending.items()):
                code = proc.poll()
                if code is None:
                    continue
                run = runs[i]
                run.code, run.seconds = code, time.monotonic() - started
                del pending[i]
                print(
                    f"[lanes] {run.name} ended: exit {code} after {run.seconds:.0f} s", flush=True
                )
            time.sleep(0.5)
    finally:
        for proc in pending.values():  # interrupted: no pytest outlives the runner
            proc.terminate()
            proc.wait()
    for run in runs:  # after the phase: never in the middle of the streamed one's lines
        if not run.stream and run.log.exists():
            print(f"\n{'=' * 20} {run.name}: {' '.join(run.modules)}", flush=True)
            sys.stdout.buffer.write(run.log.read_bytes())
            sys.stdout.flush()


def _rows(runs: Sequence[Run], budgets: Mapping[str, float]) -> list[Row]:
    table: list[Row] = []
    for run in runs:
        try:
            data: dict[str, Any] = json.loads(run.timings.read_text())
        except (OSError, ValueError):
            continue
        for m in data.get("modules", []):
            table.append(Row(m["module"], m["tests"], m["seconds"], budgets.get(m["module"])))
    return sorted(table, key=lambda r: (-r.seconds, r.module))


def _show(the_plan: Plan, budgets: Mapping[str, float]) -> None:
    named = [("exclusive", the_plan.exclusive), ("beside them", the_plan.beside)]
    named += [(lane.name, lane.modules) for lane in the_plan.lanes]
    for name, parts in named:
        if parts:
            short = " ".join(m.removeprefix("tests/integration/") for m in parts)
            print(f"[lanes] {name} ({budget_sum(parts, budgets):.0f} s budgeted): {short}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.lanes",
        description="the whole suite, in lanes sharing one set of test daemons (any option "
        "it does not know goes to every pytest process)",
    )
    parser.add_argument("--lanes", type=int, default=2, help="concurrent lanes (default 2)")
    parser.add_argument("--serial", action="store_true", help="every module in one process")
    parser.add_argument("--plan", action="store_true", help="print the plan and exit")
    parser.add_argument("--timings-json", metavar="PATH", help="the combined table as JSON")
    parser.add_argument("--budgets", metavar="PATH", default=str(BUDGETS_FILE))
    args, options = parser.parse_known_args(argv)
    budgets_path = Path(args.budgets)
    budgets, problem = load_budgets(budgets_path)
    if problem:
        print(f"[lanes] {problem}")
    rules = parse_rules(budgets_path.read_text(encoding="utf-8"))
    parts = modules(REPO)
    if args.serial:
        the_plan = Plan([], [], [Lane("serial", parts, budget_sum(parts, budgets))])
    else:
        the_plan = plan(parts, rules, budgets, args.lanes)
    _show(the_plan, budgets)
    if args.plan:
        return 0
    keep = os.environ.get(KEEP_ENV, "") not in ("", "0", "false", "no")
    daemons = Daemons(keep)
    phases: list[tuple[str, float]] = []
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="slurmjob-lanes-") as tmp:
        work = Path(tmp)

        def run(name: str, parts: list[str], stream: bool = False) -> Run:
            return Run(name, parts, work / f"{name}.log", work / f"{name}.json", stream)

        try:
            t0 = time.monotonic()
            daemons.start()
            phases.append(("daemons started", time.monotonic() - t0))
            if the_plan.exclusive:
                first = [run("exclusive", the_plan.exclusive, stream=True)]
                if the_plan.beside:
                    first.append(run("unit", the_plan.beside))
                    first[-1].niceness = UNIT_NICENESS
                t0 = time.monotonic()
                _phase(first, options)
                phases.append(("exclusive modules (the unit tier beside)", time.monotonic() - t0))
                runs += first
            lanes = [run(lane.name, lane.modules) for lane in the_plan.lanes]
            if len(lanes) == 1:
                lanes[0].stream = True
            t0 = time.monotonic()
            _phase(lanes, options)
            phases.append((f"{len(lanes)} lane(s) at once", time.monotonic() - t0))
            runs += lanes
        finally:
            t0 = time.monotonic()
            daemons.stop()
            phases.append(("daemons kept" if keep else "daemons stopped", time.monotonic() - t0))
        table = _rows(runs, budgets)
    print(f"\n{'=' * 20} time per module, every process (budgets: {budgets_path.name})")
    for line in format_table(table):
        print(line)
    for what, seconds in phases:
        print(f"[lanes] {what}: {seconds:.1f} s")
    print(f"[lanes] wall time: {sum(s for _, s in phases):.1f} s")
    if args.timings_json:
        Path(args.timings_json).write_text(json.dumps(to_json(table), indent=1) + "\n")
    for r in runs:
        print(f"[lanes] {r.name}: pytest exit {r.code}")
    return next((r.code for r in runs if r.code), 0) or 0


if __name__ == "__main__":
    sys.exit(main())
