"""The periodic trim gives free heap pages back, and the kopf settings that keep memory down."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path

import kopf
import pytest

from slurmjob_operator import memtrim
from slurmjob_operator.config import RuntimeProfile, Settings
from slurmjob_operator.handlers.lifecycle import configure

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not memtrim.available(), reason="no glibc malloc_trim here")


def test_a_freed_burst_is_given_back_to_the_system() -> None:
    """Under PYTHONMALLOC=malloc, a burst of small objects freed except for one survivor per
    page-ful keeps its pages resident until malloc_trim returns them: the trim measurably
    lowers RSS in a fresh interpreter (the state the operator is in after a start-up burst)."""
    program = textwrap.dedent(
        """
        import json
        from slurmjob_operator import memtrim
        burst = [{"name": f"sj-{i:06d}", "spec": {"cpus": i}} for i in range(300_000)]
        keep = burst[::500]  # a long-lived object in the middle of many pages
        del burst
        before = memtrim.resident_bytes()
        returned = memtrim.trim()
        after = memtrim.resident_bytes()
        print(json.dumps([before, returned, after, len(keep)]))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", program],
        env={"PYTHONMALLOC": "malloc", "PYTHONPATH": ":".join(sys.path)},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    before, returned, after, kept = __import__("json").loads(out)
    assert kept == 600
    assert returned >= 20 * 2**20, (before, returned, after)
    assert after < before


def test_under_jemalloc_the_trim_purges_its_arenas() -> None:
    """As the image runs it (jemalloc preloaded, here with its own purging off so that only
    the trim returns pages): the trim talks to jemalloc, not glibc, and a freed burst's pages
    go back to the system."""
    program = textwrap.dedent(
        """
        import json
        from slurmjob_operator import memtrim
        burst = [{"name": f"sj-{i:06d}", "spec": {"cpus": i}} for i in range(300_000)]
        keep = burst[::500]
        del burst
        before = memtrim.resident_bytes()
        returned = memtrim.trim()
        after = memtrim.resident_bytes()
        print(json.dumps([memtrim.allocator(), before, returned, after, len(keep)]))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", program],
        env={
            "PYTHONMALLOC": "malloc",
            "LD_PRELOAD": "libjemalloc.so.2",
            "MALLOC_CONF": "dirty_decay_ms:-1,muzzy_decay_ms:-1",
            "PYTHONPATH": ":".join(sys.path),
        },
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert "cannot be preloaded" not in out.stderr, "libjemalloc2 is missing (make testbed)"
    allocator, before, returned, after, kept = __import__("json").loads(out.stdout)
    assert (allocator, kept) == ("jemalloc", 600)
    assert returned >= 20 * 2**20, (before, returned, after)
    assert after < before


def test_resident_bytes_reads_this_process() -> None:
    resident = memtrim.resident_bytes()
    assert resident is not None
    assert 10 * 2**20 < resident < 8 * 2**30


async def test_the_periodic_trim_reports_each_trim_and_stops_when_cancelled() -> None:
    seen: list[int] = []
    third = asyncio.Event()

    def on_trim(returned: int) -> None:
        seen.append(returned)
        if len(seen) == 3:
            third.set()

    task = asyncio.create_task(memtrim.trim_periodically(0.01, on_trim))
    await asyncio.wait_for(third.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert all(n >= 0 for n in seen)


async def test_an_interval_of_zero_never_trims() -> None:
    seen: list[int] = []
    await asyncio.wait_for(memtrim.trim_periodically(0, seen.append), 1)
    assert seen == []


def test_the_kopf_settings_follow_the_operator_settings() -> None:
    settings = kopf.OperatorSettings()
    configure(settings, Settings())
    assert settings.watching.chunk_size == 500
    assert settings.queueing.idle_timeout == 0.5
    assert settings.persistence.finalizer == "slurmjob.io/finalizer"
    configure(settings, Settings(watch_page_size=0, worker_idle_timeout=5))
    assert settings.watching.chunk_size is None  # the whole list in one answer
    assert settings.queueing.idle_timeout == 5


def test_the_bench_measures_the_allocator_the_image_and_the_chart_ship() -> None:
    from bench.scale.scenario import IMAGE_ONLY_ENV, OPERATOR_ALLOCATOR_ENV

    dockerfile = (REPO / "Dockerfile").read_text()
    helpers = (REPO / "charts/slurmjob-operator/templates/_helpers.tpl").read_text()
    env = helpers[helpers.index('{{- define "slurmjob-operator.env" -}}') :]
    for name, value in OPERATOR_ALLOCATOR_ENV.items():
        assert f"    {name}={value} \\\n" in dockerfile
        if name in IMAGE_ONLY_ENV:
            assert f"- name: {name}\n" not in env
        else:
            assert f"- name: {name}\n  value: {value}\n" in env
    assert "apt-get install -y --no-install-recommends libjemalloc2" in dockerfile
    assert "COPY --from=jemalloc /jemalloc/libjemalloc.so.2 /usr/local/lib/" in dockerfile


def test_the_operators_allocator_settings_never_reach_a_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The image's LD_PRELOAD and MALLOC_CONF are the operator's own: the job's environment
    is the explicit one the render writes, so a cluster node without jemalloc never sees a
    preload it cannot satisfy, and nothing of the operator's environment crosses into a job."""
    from tests.unit.test_render import golden_render

    monkeypatch.setenv("LD_PRELOAD", "libjemalloc.so.2")
    monkeypatch.setenv("MALLOC_CONF", "background_thread:true")
    monkeypatch.setenv("PYTHONMALLOC", "malloc")
    rendered = golden_render(RuntimeProfile.APPTAINER, "cpu")
    carried = [
        rendered.launch.script,
        repr(rendered.launch.environment),
        *(f.content.decode() for f in rendered.files.values()),
    ]
    for name in ("LD_PRELOAD", "MALLOC_CONF", "PYTHONMALLOC", "jemalloc"):
        assert not any(name in text for text in carried), name
