"""Draw a run's allocator figures over time: where its resident set sits.

    python -m bench.scale.allocplot --attach DIR RUN.json   # once: DIR's samples into RUN.json
    python -m bench.scale.allocplot RUN.json OUT.png

RUN.json is a scale bench result with one run (`--json`); DIR is the `BENCH_ALLOCSTATS`
directory of that run, one `allocstats-<pid>.jsonl` per operator process it started.
`--attach` adds every fifth sample of each, under an `allocstats` mapping of process label
("first process", then "restarted process") -> samples, and keeps the JSON self-contained for
docs/benchmarks. For each process the plot draws: its RSS, jemalloc's
`active` pages (those holding at least one live allocation) and `allocated` bytes (what the
program holds), in MB against seconds since the run began, with the run's phases marked. The
gap between `active` and `allocated` is memory no purge can return: pages pinned by a few live
objects among freed ones.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench.scale.report import MB

KEEP_EVERY = 5  # samples are one a second; every fifth keeps the shape at a fifth of the size

# The run's marks drawn as phase boundaries (bench/scale/scenario.py sets them).
PHASES = ("created", "submitted", "steady", "steady_end", "restart", "delete", "delete_end")


def lines(
    run: dict[str, Any], samples: list[dict[str, Any]]
) -> dict[str, list[tuple[float, float]]]:
    """(seconds since the run began, MB) of RSS, active and allocated; a sample without
    jemalloc's figures (another allocator) gives RSS only."""
    begin = float(run["marks"]["begin"])
    out: dict[str, list[tuple[float, float]]] = {"RSS": [], "active": [], "allocated": []}
    for s in samples:
        t = float(s["t"]) - begin
        out["RSS"].append((t, s["rss"] / MB))
        jemalloc = s.get("jemalloc") or {}
        for key in ("active", "allocated"):
            if key in jemalloc:
                out[key].append((t, jemalloc[key] / MB))
    return out


def attach(results: dict[str, Any], stats_dir: Path, every: int = KEEP_EVERY) -> None:
    """Put the samples of `stats_dir` into `results["allocstats"]`, the processes in the order
    they started (the first sample's time), every `every`-th sample of each."""
    processes = []
    for path in stats_dir.glob("allocstats-*.jsonl"):
        samples = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if samples:
            processes.append(samples)
    processes.sort(key=lambda samples: float(samples[0]["t"]))
    labels = ["first process"] + [
        "restarted process" + ("" if i == 1 else f" {i}") for i in range(1, len(processes))
    ]
    results["allocstats"] = {
        label: samples[::every] for label, samples in zip(labels, processes, strict=True)
    }


def plot(results: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = results["runs"][0]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    styles = {"RSS": "-", "active": "--", "allocated": ":"}
    for i, (label, samples) in enumerate(results["allocstats"].items()):
        for what, pts in lines(run, samples).items():
            if pts:
                ax.plot(
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    styles[what],
                    color=f"C{i}",
                    lw=1,
                    label=f"{label}: {what}",
                )
    begin = float(run["marks"]["begin"])
    for name in PHASES:
        if name in run["marks"]:
            x = float(run["marks"][name]) - begin
            ax.axvline(x, color="grey", lw=0.6, ls=":")
            ax.text(x, 1, name, rotation=90, fontsize=7, va="bottom", ha="right", color="grey")
    ax.set_xlabel("seconds since the run began")
    ax.set_ylabel("MB")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Allocator figures, operator {run['shape']} N={run['n']:,}")
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "--attach":
        path = Path(argv[2])
        results = json.loads(path.read_text())
        attach(results, Path(argv[1]))
        path.write_text(json.dumps(results, indent=1, default=str) + "\n")
        return 0
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    plot(json.loads(Path(argv[0]).read_text()), Path(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
