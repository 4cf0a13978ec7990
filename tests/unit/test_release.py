"""One version: the package's `__version__` is what the wheel, the chart, the image label and
`--version` say, and CHANGELOG.md has its section (`make release` checks the same); the licence
and the security policy ship in the wheel and the image."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import subprocess
import sys
import tomllib
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


# -- the licence and the security policy ship with the wheel and the image -----------------------

SHIPPED = ("LICENSE", "SECURITY.md")
DOC_DIR = "/usr/share/doc/slurmjob-operator/"


def test_the_licence_is_the_one_pyproject_declares() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == {"text": "Apache-2.0"}
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_pyproject_puts_both_files_into_the_wheel_and_the_sdist() -> None:
    """hatchling writes `license-files` to .dist-info/licenses/ and `extra-metadata` to
    .dist-info/extra_metadata/ (tests/integration/test_image.py builds the wheel and looks)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["license-files"] == ["LICENSE"]
    wheel = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert wheel["extra-metadata"] == {"SECURITY.md": "SECURITY.md"}
    sdist = pyproject["tool"]["hatch"]["build"]["targets"]["sdist"]["include"]
    assert set(SHIPPED) <= set(sdist)


def _instructions(stage: str) -> list[str]:
    """The Dockerfile's instructions of one stage (`FROM ... AS <stage>`), continuation lines
    joined."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    stages = re.split(r"(?m)^FROM ", text)
    (body,) = [s for s in stages if s.split("\n", 1)[0].rstrip().endswith(f"AS {stage}")]
    return [line for line in body.splitlines() if line and not line.startswith("#")]


def test_the_image_copies_both_files_and_the_context_has_them() -> None:
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    for name in SHIPPED:
        assert f"!{name}" in ignore, f".dockerignore keeps {name} out of the build context"
    # The build stage needs them for the wheel (license-files must exist), the runtime stage
    # keeps them where a Debian-based image keeps a package's documents.
    build = [i.split()[1:] for i in _instructions("build") if i.startswith("COPY ")]
    assert any(set(SHIPPED) <= set(args[:-1]) and args[-1] == "./" for args in build), build
    runtime = [i.split()[1:] for i in _instructions("runtime") if i.startswith("COPY ")]
    copied = {src for args in runtime if args[-1] == DOC_DIR for src in args[:-1]}
    assert copied == set(SHIPPED), runtime
