"""The scale results as a table, three PNG plots and the generated part of docs/benchmarks.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any

DOC_BEGIN = "<!-- scale:begin -->"
DOC_END = "<!-- scale:end -->"
IMG = Path("docs") / "benchmarks"
MB = 1e6
#: Issue 24's floor for the operator's submission rate over the baseline's (median of three).
TARGET_RATIO = 0.75


def _num(value: float | None, unit: str = "", digits: int = 1) -> str:
    if value is None:
        return "—"
    if abs(value) >= 1000:
        return f"{value:,.0f}{unit}"
    if 0 < abs(value) < 0.1:
        return f"{value:.3f}{unit}"
    return f"{value:.{digits}f}{unit}"


def _ratio(base: float | None, ours: float | None) -> str:
    if not base or not ours:
        return ""
    r = base / ours
    return f" ({r:.1f}x less)" if r >= 1 else f" ({1 / r:.1f}x more)"


def _get(run: dict[str, Any] | None, *path: str) -> Any:
    value: Any = run
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


ROWS: list[tuple[str, tuple[str, ...], float, str, bool]] = [
    # label, path in a run, scale, unit, lower is better
    ("RSS empty", ("rss_empty",), MB, " MB", True),
    ("RSS peak", ("rss_peak",), MB, " MB", True),
    ("RSS steady (median)", ("steady", "rss_median"), MB, " MB", True),
    ("CPU s per steady interval", ("steady", "cpu_per_interval"), 1, " s", True),
    ("apply → Submitted, per s", ("submit", "per_second"), 1, "/s", False),
    ("apply → Submitted p50", ("submit", "p50"), 1, " s", True),
    ("apply → Submitted p99", ("submit", "p99"), 1, " s", True),
    ("apiserver requests per submission", ("submit", "apiserver_per_submission"), 1, "", True),
    ("slurmrestd requests per steady interval", ("steady", "slurm", "requests"), 1, "", True),
    ("slurmrestd body bytes per steady interval", ("steady", "slurm", "bytes"), 1e3, " kB", True),
    ("apiserver requests per steady interval", ("steady", "apiserver", "operator"), 1, "", True),
    (
        "slurmrestd requests per interval, 1 % changing",
        ("change", "window", "slurm", "requests"),
        1,
        "",
        True,
    ),
    (
        "apiserver requests per interval, 1 % changing",
        ("change", "window", "apiserver", "operator"),
        1,
        "",
        True,
    ),
    ("Slurm cancel → phase Cancelled p50", ("change", "p50"), 1, " s", True),
    ("Slurm cancel → phase Cancelled p99", ("change", "p99"), 1, " s", True),
    ("restart: requests until first steady cycle", ("restart", "requests"), 1, "", True),
    ("restart: seconds until first steady cycle", ("restart", "seconds"), 1, " s", True),
    ("bulk delete, SlurmJobs per s", ("delete", "per_second"), 1, "/s", False),
    ("status bytes per SlurmJob (mean)", ("status_bytes", "mean"), 1, " B", True),
    ("etcd database size", ("etcd", "etcd_mvcc_db_total_size_in_bytes"), MB, " MB", True),
]


def _runs(results: dict[str, Any], kind: str, n: int, shape: str) -> list[dict[str, Any]]:
    """The runs of one operator at one N and shape, in the order they were made."""
    return [r for r in results["runs"] if (r["operator"], r["shape"], r["n"]) == (kind, shape, n)]


def middle(values: list[float]) -> float:
    """The median, the lower middle of an even count: a figure that was measured, not a mean
    of two."""
    return float(sorted(values)[(len(values) - 1) // 2])


def _median(runs: list[dict[str, Any]], path: tuple[str, ...]) -> float | None:
    """The median of a figure over the runs that have it."""
    values = [v for v in (_get(r, *path) for r in runs) if isinstance(v, int | float)]
    return middle(values) if values else None


def submit_ratios(results: dict[str, Any], n: int, shape: str) -> list[float]:
    """The operator's apply → Submitted throughput over the baseline's, per repeat (the two
    runs of a repeat follow each other on the same machine)."""
    ratios = []
    for base in _runs(results, "baseline", n, shape):
        ours = next(
            (
                r
                for r in _runs(results, "operator", n, shape)
                if r.get("repeat", 0) == base.get("repeat", 0)
            ),
            None,
        )
        b, o = _get(base, "submit", "per_second"), _get(ours, "submit", "per_second")
        if b and o:
            ratios.append(o / b)
    return ratios


def _combos(results: dict[str, Any]) -> list[tuple[int, str]]:
    """(N, shape) of the runs, by N, live before backlog."""
    return sorted(
        {(r["n"], r["shape"]) for r in results["runs"]}, key=lambda c: (c[0], c[1] != "live")
    )


def ratio_rows(results: dict[str, Any]) -> list[tuple[str, list[float]]]:
    """("N shape", the submission ratio of each repeat) where both operators ran."""
    rows = [(f"{n:,} {shape}", submit_ratios(results, n, shape)) for n, shape in _combos(results)]
    return [(label, ratios) for label, ratios in rows if ratios]


def table(results: dict[str, Any]) -> str:
    out = []
    for n, shape in _combos(results):
        base, ours = _runs(results, "baseline", n, shape), _runs(results, "operator", n, shape)
        what = "created while it runs" if shape == "live" else "backlog created before it starts"
        count = max(len(base), len(ours))
        median = f", median of {count} runs each" if count > 1 else ""
        out += [
            f"#### N = {n:,}, {what}{median}",
            "",
            "| measured | baseline (per-object timers) | operator |",
            "| --- | ---: | ---: |",
        ]
        for label, path, scale, unit, lower in ROWS:
            b, o = _median(base, path), _median(ours, path)
            if b is None and o is None:
                continue
            bs = _num(b / scale if b is not None else None, unit)
            os_ = _num(o / scale if o is not None else None, unit)
            if label.startswith("etcd"):  # cumulative over the invocation's runs: no ratio
                note = ""
            elif lower:
                note = _ratio(b, o)
            else:  # higher is better: ours as a multiple of the baseline's
                note = f" ({o / b:.2g}x)" if b and o else ""
            if label.startswith("bulk delete") and shape == "backlog":
                label += ", right after a SIGKILL and restart"
            out.append(f"| {label} | {bs} | {os_}{note} |")
        ratios = submit_ratios(results, n, shape)
        if len(ratios) > 1:
            each = " / ".join(f"{r:.2f}" for r in ratios)
            out.append(
                f"| apply → Submitted, operator over baseline per run | | {each}; "
                f"median **{middle(ratios):.2f}x** |"
            )
        for run in (*base, *ours):
            if run.get("error"):
                out.append(
                    f"\n{run['operator']} (run {run.get('repeat', 0) + 1}): stopped early: "
                    f"`{run['error']}`"
                )
        out.append("")
    return "\n".join(out)


RssLine = tuple[str, str, list[float], list[float]]


def first_repeats(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs drawn over time: one of each (the first repeat), three would hide one another."""
    return [r for r in results["runs"] if r.get("repeat", 0) == 0]


def rss_panels(results: dict[str, Any]) -> dict[str, list[RssLine]]:
    """The RSS lines of each operator's panel: (label, colour, seconds, MB) of its first repeats.

    One panel per operator, because the baseline's gigabytes would flatten the operator's
    lines; one colour per N and shape in both, so a line is found in the other panel by it."""
    colour = {combo: f"C{i % 10}" for i, combo in enumerate(_combos(results))}
    panels: dict[str, list[RssLine]] = {"baseline": [], "operator": []}
    for r in first_repeats(results):
        series = r.get("rss_series") or []
        if not series or r["operator"] not in panels:
            continue
        panels[r["operator"]].append(
            (
                f"{r['shape']} N={r['n']:,}",
                colour[(r["n"], r["shape"])],
                [s[0] for s in series],
                [s[1] / MB for s in series],
            )
        )
    return panels


def plots(results: dict[str, Any], root: Path, stem: str = "scale") -> list[Path]:
    """The PNGs under docs/benchmarks, named `<stem>-<what>.png`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    img = root / IMG
    img.mkdir(parents=True, exist_ok=True)
    written = []
    runs = results["runs"]

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    panels = rss_panels(results)
    for ax, kind in zip(axes, ("baseline", "operator"), strict=True):
        for label, colour, xs, ys in panels[kind]:
            ax.plot(xs, ys, lw=1, color=colour, label=label)
        ax.set_title(kind)
        ax.set_xlabel("seconds since the run began")
        ax.set_ylabel("RSS (MB)")
        ax.set_ylim(bottom=0)
        if panels[kind]:
            ax.legend(fontsize=7)
    fig.suptitle("RSS over a run (submit, steady, change, restart, delete)")
    fig.tight_layout()
    written.append(img / f"{stem}-rss.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for kind in ("baseline", "operator"):
        for shape in ("live", "backlog"):
            sizes = sorted({r["n"] for r in runs if (r["operator"], r["shape"]) == (kind, shape)})
            medians = (
                (n, _median(_runs(results, kind, n, shape), ("steady", "slurm", "requests")))
                for n in sizes
            )
            pts = [(n, m) for n, m in medians if m is not None]
            if pts:
                ax.plot(
                    [p[0] for p in pts],
                    [max(p[1], 0.1) for p in pts],
                    marker="o",
                    label=f"{kind} ({shape})",
                )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("SlurmJobs (N)")
    ax.set_ylabel(f"slurmrestd requests per {results['interval']:g} s interval")
    ax.set_title("Steady polling cost against N")
    ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(img / f"{stem}-requests.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for r in first_repeats(results):
        delays = _get(r, "change", "delays") or []
        if delays:
            ax.step(
                delays,
                [(i + 1) / len(delays) for i in range(len(delays))],
                where="post",
                label=f"{r['operator']} {r['shape']} N={r['n']:,}",
            )
    ax.axvline(results["interval"], color="grey", ls=":", lw=1)
    ax.set_xlabel("seconds from the cancel in Slurm to phase Cancelled")
    ax.set_ylabel("fraction of cancelled jobs")
    ax.set_title("State-change propagation (CDF)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    written.append(img / f"{stem}-propagation.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    rows = ratio_rows(results)
    if rows:
        fig, ax = plt.subplots(figsize=(6.5, 0.6 * len(rows) + 1.6))
        for y, (_, ratios) in enumerate(rows):
            ax.plot(ratios, [y] * len(ratios), "o", color="tab:blue", alpha=0.6)
            ax.plot([middle(ratios)], [y], "|", color="black", markersize=18)
        ax.axvline(TARGET_RATIO, color="tab:red", ls=":", lw=1, label=f"target {TARGET_RATIO}x")
        ax.set_yticks(range(len(rows)), [label for label, _ in rows])
        ax.set_ylim(len(rows) - 0.3, -0.7)  # the first row on top
        ax.set_xlabel("apply → Submitted rate, operator over baseline (dots: runs; bar: median)")
        ax.legend(fontsize=8, loc="lower right")
        fig.tight_layout()
        written.append(img / f"{stem}-ratios.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    return written


def section(results: dict[str, Any]) -> str:
    lines = [
        f"Measured {results['started']} with `{results['command']}`.",
        "",
        f"Machine: {results['machine']}; Slurm {results['slurm']}; poll interval "
        f"{results['interval']:g} s; kube-apiserver, etcd, slurmrestd, the bench and the operator "
        "on that machine over loopback.",
        "",
        table(results),
    ]
    tail = results.get("logtail")
    if tail:
        lines += [
            f"10 GB log tail (`storage.logs.read_tail`, sparse {tail['file_bytes'] / 1e9:.0f} GB "
            f"file, median of {tail['runs']}): **{tail['median_ms']:.2f} ms** "
            f"(max {tail['max_ms']:.2f} ms) for {tail['tail_bytes']:,} bytes of tail; reading the "
            "whole file front to back would take about "
            f"{tail['whole_file_seconds_estimate']:.1f} s here even with no disk involved "
            "(priced from a 256 MiB read of the sparse file).",
            "",
        ]
    walls = [
        f"{r['operator']} {r['shape']} N={r['n']:,}"
        f"{' run ' + str(r['repeat'] + 1) if 'repeat' in r else ''}: "
        f"{r.get('wall_seconds', 0):.0f} s"
        for r in results["runs"]
    ]
    lines += ["Wall time per run: " + "; ".join(walls) + ".", ""]
    lines += [
        "![RSS over time](benchmarks/scale-rss.png)",
        "![slurmrestd requests per interval against N](benchmarks/scale-requests.png)",
        "![propagation CDF](benchmarks/scale-propagation.png)",
    ]
    if any(len(ratios) > 1 for _, ratios in ratio_rows(results)):
        lines.append("![submission rate ratio per run](benchmarks/scale-ratios.png)")
    return "\n".join(lines)


def _own_apiserver(results: dict[str, Any]) -> None:
    """Results written before the `operator` field existed: derive it from the counts."""
    from bench.scale.scenario import own_apiserver_requests

    for run in results["runs"]:
        for window in (_get(run, "steady"), _get(run, "change", "window")):
            api = _get(window, "apiserver")
            if isinstance(api, dict) and "operator" not in api:
                api["operator"] = own_apiserver_requests(api.get("by_kind") or {})


def write(results: dict[str, Any], root: Path) -> None:
    _own_apiserver(results)
    plots(results, root)
    doc = root / "docs" / "benchmarks.md"
    text = doc.read_text()
    if DOC_BEGIN not in text:
        raise SystemExit(f"{doc} has no {DOC_BEGIN} ... {DOC_END} section to fill")
    head, rest = text.split(DOC_BEGIN, 1)
    _, after = rest.split(DOC_END, 1)
    doc.write_text(f"{head}{DOC_BEGIN}\n{section(results)}\n{DOC_END}{after}")
