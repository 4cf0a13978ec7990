"""`make release`: the artifacts of one version, from the committed tree.

One version source, `slurmjob_operator.__version__`: the wheel and sdist take it through
hatch, and this refuses to build when the chart's `version`/`appVersion`, the Dockerfile's
`VERSION` default or CHANGELOG.md disagree with it. Writes to `dist/` (or `--out`):

* the wheel and the sdist (`python -m build`, no isolation: the dev extra has the backend);
* the Helm chart package `slurmjob-operator-<version>.tgz`;
* the image build context `slurmjob-operator-<version>-image-context.tar.gz` (`git archive`
  of HEAD, so a dirty tree is refused) and `IMAGE-BUILD.txt`, the command that builds it with
  the version and revision labels.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def version() -> str:
    text = (ROOT / "operator" / "slurmjob_operator" / "__init__.py").read_text()
    match = re.search(r'^__version__ = "([^"]+)"$', text, re.M)
    if match is None:
        raise SystemExit("operator/slurmjob_operator/__init__.py has no __version__")
    return match.group(1)


def disagreements(ver: str) -> list[str]:
    """Every place that must carry `ver` and does not."""
    found: list[str] = []
    chart = (ROOT / "charts" / "slurmjob-operator" / "Chart.yaml").read_text()
    for key in ("version", "appVersion"):
        match = re.search(rf'^{key}: "?([^"\n]+)"?$', chart, re.M)
        if match is None or match.group(1) != ver:
            found.append(f"charts/slurmjob-operator/Chart.yaml {key}")
    if f"ARG VERSION={ver}\n" not in (ROOT / "Dockerfile").read_text():
        found.append("Dockerfile ARG VERSION")
    changelog = ROOT / "CHANGELOG.md"
    if not changelog.is_file() or not re.search(
        rf"^## {re.escape(ver)}\b", changelog.read_text(), re.M
    ):
        found.append(f"CHANGELOG.md has no '## {ver}' section")
    return found


def run(*argv: str) -> str:
    return subprocess.run(argv, cwd=ROOT, check=True, capture_output=True, text=True).stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist")
    parser.add_argument("--helm", default="helm", help="the helm binary")
    parser.add_argument("--check", action="store_true", help="only check the versions agree")
    args = parser.parse_args()
    ver = version()
    wrong = disagreements(ver)
    if wrong:
        print(f"version {ver} is not carried by: " + "; ".join(wrong), file=sys.stderr)
        return 1
    if args.check:
        print(ver)
        return 0
    if run("git", "status", "--porcelain", "--untracked-files=no").strip():
        print("the tree has uncommitted changes: commit them first", file=sys.stderr)
        return 1
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    python = sys.executable
    run(python, "-m", "build", "--no-isolation", "--wheel", "--sdist", "--outdir", str(out))
    run(args.helm, "package", str(ROOT / "charts" / "slurmjob-operator"), "-d", str(out))
    revision = run("git", "rev-parse", "HEAD").strip()
    context = out / f"slurmjob-operator-{ver}-image-context.tar.gz"
    run("git", "archive", "--format=tar.gz", "-o", str(context), "HEAD")
    (out / "IMAGE-BUILD.txt").write_text(
        f"mkdir ctx && tar -xzf {context.name} -C ctx && docker build "
        f"--build-arg VERSION={ver} --build-arg REVISION={revision} "
        f"-t <registry>/slurmjob-operator:{ver} ctx\n"
    )
    for path in sorted(out.iterdir()):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
