"""One version: the package's `__version__` is what the wheel, the chart, the image label and
`--version` say, and CHANGELOG.md has its section (`make release` checks the same)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from slurmjob_operator import __version__

ROOT = Path(__file__).resolve().parents[2]


def release_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("release", ROOT / ".ci" / "release.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_place_carries_the_one_version() -> None:
    release = release_script()
    assert release.version() == __version__
    assert release.disagreements(__version__) == []
    assert importlib.metadata.version("slurmjob-operator") == __version__


def test_a_version_not_carried_everywhere_is_named() -> None:
    wrong = release_script().disagreements("9.9.9")
    assert wrong == [
        "charts/slurmjob-operator/Chart.yaml version",
        "charts/slurmjob-operator/Chart.yaml appVersion",
        "Dockerfile ARG VERSION",
        "CHANGELOG.md has no '## 9.9.9' section",
    ]


def test_the_cli_says_its_version() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "slurmjob_operator", "--version"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert proc.stdout.strip() == f"slurmjob-operator {__version__}"
