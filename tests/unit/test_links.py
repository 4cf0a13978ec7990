"""The documentation holds together (issue 25): the README is the front door and the manual
lives in docs/, so a section that moves must not leave links pointing at where it was.

* every relative markdown link of the README, docs/, the chart's README and examples/*.md
  reaches a file, and its `#anchor` a heading of that file by GitHub's slug rules;
* every SlurmJob of the user guide is one the operator accepts and renders with the example
  site catalogs, so that a reader who copies one starts from a job that runs.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
import yaml

from slurmjob_operator.api.errors import parse_spec
from slurmjob_operator.cli import EXIT_OK, main
from slurmjob_operator.config import Settings

ROOT = Path(__file__).resolve().parents[2]
USER_GUIDE = ROOT / "docs" / "user-guide.md"
SITE = ROOT / "examples" / "site"


def markdown_files() -> list[Path]:
    files = [
        ROOT / "README.md",
        *(ROOT / "docs").rglob("*.md"),
        ROOT / "charts" / "slurmjob-operator" / "README.md",
        *(ROOT / "examples").glob("*.md"),
    ]
    return sorted(set(files))


# -- reading markdown as GitHub does --------------------------------------------------------

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
# A code span ends with a run of backticks as long as the one it opened with, and never
# crosses a blank line (the paragraph ends there).
_CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)((?:(?!\n[ \t]*\n).)+?)(?<!`)\1(?!`)", re.S)
# [text](target) or [text](target "title"); an image's ![alt](src) is a link too. The text
# may hold one level of brackets ([`a[0]`](b)) and may wrap onto the next line.
_LINK = re.compile(r"\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$", re.M)
_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
_HTML_ANCHOR = re.compile(r"<a\s[^>]*\b(?:id|name)\s*=\s*[\"']([^\"']+)[\"']", re.I)
_SKIPPED = ("http://", "https://", "mailto:")


def without_fences(text: str) -> str:
    """The text with every fenced code block blanked out, every offset kept: a `#` line in a
    shell example is no heading, and a link in one no link."""
    lines = text.split("\n")
    fence: str | None = None
    for i, line in enumerate(lines):
        match = _FENCE.match(line)
        if fence is None:
            if match:
                fence = match.group(1)
                lines[i] = " " * len(line)
        else:
            if match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence):
                fence = None
            lines[i] = " " * len(line)
    return "\n".join(lines)


def prose(text: str) -> str:
    """The text without its code, fenced or inline, every other character kept in place (so
    offsets still give line numbers): links in code are examples, not links."""
    return _CODE_SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), without_fences(text))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its rendered text, lowercased, with everything but
    letters, digits, spaces, hyphens and underscores dropped and each space made a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link reads as its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML renders no text of its own
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """Every anchor GitHub gives the file: one per heading (a repeated one gets -1, -2, ...)
    and every explicit `<a id=...>` or `<a name=...>`."""
    text = path.read_text(encoding="utf-8")
    found: set[str] = set()
    seen: dict[str, int] = {}
    # Code spans stay: their words are part of the heading's text, and so of its anchor.
    for line in without_fences(text).split("\n"):
        match = _HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    found.update(_HTML_ANCHOR.findall(prose(text)))
    return frozenset(found)


@dataclass(frozen=True)
class Link:
    source: Path
    line: int
    text: str
    target: str

    def __str__(self) -> str:
        return f"{shown(self.source)}:{self.line}: [{self.text}]({self.target})"


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def links(path: Path) -> list[Link]:
    original = path.read_text(encoding="utf-8")
    text = prose(original)  # the same offsets, without the code

    def line(offset: int) -> int:
        return text.count("\n", 0, offset) + 1

    # The text shown is the one written, code spans included, on one line.
    found = [
        Link(path, line(m.start()), " ".join(original[m.start(1) : m.end(1)].split()), m[2])
        for m in _LINK.finditer(text)
    ]
    found += [Link(path, line(m.start()), "reference", m[1]) for m in _REFERENCE.finditer(text)]
    return found


def problem(link: Link) -> str | None:
    """Why the link leads nowhere, or None."""
    target = link.target
    if not target:
        return "empty target"
    if target.startswith(_SKIPPED):
        return None
    path_part, _, anchor = target.partition("#")
    if not path_part:
        dest = link.source
    elif path_part.startswith("/"):
        dest = ROOT / unquote(path_part).lstrip("/")  # GitHub: from the repository's root
    else:
        dest = (link.source.parent / unquote(path_part)).resolve()
    if not dest.exists():
        return f"no such file: {shown(dest)}"
    if anchor and dest.suffix == ".md" and unquote(anchor) not in anchors(dest):
        return f"no heading with the anchor #{anchor} in {shown(dest)}"
    return None


def test_the_link_checker_reads_markdown_as_github_does(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# The `kubectl slurmjob` plugin\n"
        "## Retries: the operator's, never Slurm's\n"
        "## Retries: the operator's, never Slurm's\n"
        "```bash\n# not a heading [nor](a-link.md)\n```\n"
        "Text with `[code](nowhere.md)` and [a link](#retries-the-operators-never-slurms-1),\n"
        "[one that\nwraps](page.md#the-kubectl-slurmjob-plugin) and [a bad one](#nope).\n",
        encoding="utf-8",
    )
    assert anchors(page) == {
        "the-kubectl-slurmjob-plugin",
        "retries-the-operators-never-slurms",
        "retries-the-operators-never-slurms-1",
    }
    found = links(page)
    assert [(link.line, link.target) for link in found] == [
        (7, "#retries-the-operators-never-slurms-1"),
        (8, "page.md#the-kubectl-slurmjob-plugin"),
        (9, "#nope"),
    ]
    assert [problem(link) is None for link in found] == [True, True, False]


def test_every_relative_link_resolves() -> None:
    files = markdown_files()
    assert ROOT / "docs" / "user-guide.md" in files
    broken = [f"{link}: {why}" for f in files for link in links(f) if (why := problem(link))]
    assert not broken, f"{len(broken)} broken link(s):\n" + "\n".join(broken)


# -- the user guide's SlurmJobs ------------------------------------------------------------

_YAML_BLOCK = re.compile(r"^```ya?ml[ \t]*\n(.*?)^```", re.M | re.S)


def guide_slurmjobs() -> list[dict[str, Any]]:
    """Every SlurmJob of the user guide's ```yaml blocks (a block may hold several)."""
    found: list[dict[str, Any]] = []
    for block in _YAML_BLOCK.findall(USER_GUIDE.read_text(encoding="utf-8")):
        if re.search(r"^kind:[ \t]*SlurmJob\b", block, re.M):
            found += [d for d in yaml.safe_load_all(block) if d and d.get("kind") == "SlurmJob"]
    return found


def _catalog(name: str, key: str, field: str) -> set[str]:
    return {entry[field] for entry in yaml.safe_load((SITE / name).read_text())[key]}


@pytest.fixture
def example_site(monkeypatch: pytest.MonkeyPatch) -> None:
    """The example catalogs, and nothing of the environment the test happens to run in."""
    for name in Settings.model_fields:
        monkeypatch.delenv(Settings.env_name(name), raising=False)
    monkeypatch.setenv("SLURMJOB_RUNTIME_REGISTRY_FILE", str(SITE / "runtime-registry.yaml"))
    monkeypatch.setenv("SLURMJOB_GPU_SERIES_FILE", str(SITE / "gpu-series.yaml"))
    monkeypatch.setenv("SLURMJOB_STORAGE_ROOT", "/lustre/slurmjob")


def test_the_user_guide_has_its_cookbook() -> None:
    # The resource's overview and the cookbook's five recipes (one of them a chain of two).
    assert len(guide_slurmjobs()) >= 7


@pytest.mark.parametrize("doc", guide_slurmjobs(), ids=lambda d: str(d["metadata"]["name"]))
def test_every_slurmjob_of_the_user_guide_is_accepted(
    doc: dict[str, Any], example_site: None
) -> None:
    assert doc["apiVersion"] == "slurmjob.io/v1alpha1"
    spec = parse_spec(doc["spec"])
    assert spec.framework.runtime_id in _catalog("runtime-registry.yaml", "runtimes", "id")
    series = {p.gpu_series for p in spec.pools if p.gpu_series}
    assert series <= _catalog("gpu-series.yaml", "series", "name")
    # What the catalogs rule beyond names (a series' constraint in a heterogeneous job, the
    # runtime's format for the profile) is checked where the operator checks it: in render.
    out, err = io.StringIO(), io.StringIO()
    code = main(["render", "-f", "-"], out=out, err=err, stdin=io.StringIO(yaml.safe_dump(doc)))
    assert code == EXIT_OK, err.getvalue()
    assert json.loads(out.getvalue())
