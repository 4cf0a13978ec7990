"""The docs say what the chart and the repository are (issue 47, "the docs say what is true").

Each test reads a claim the docs make in one shape and checks it against its source: the
links and cited files against the tree, the RBAC the docs list against the chart's rules, the
required values against the render's own checks, the `kubectl ... deploy/` commands against
the name and namespace the install makes, what a job does without Secret access against the
failure table, and NOTES.txt's warnings against the values that need them (rendered by helm,
where the test bed built it).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from slurmjob_operator.core.decisions import FAILURES, Failure, Retry
from slurmjob_operator.core.reasons import Reason

from .test_chart_files import CHART, _granted, _rules_helper

ROOT = Path(__file__).resolve().parents[2]
HELM_MD = ROOT / "docs" / "helm.md"
VALUES_YAML = CHART / "values.yaml"
HELPERS = CHART / "templates" / "_helpers.tpl"
NOTES = CHART / "templates" / "NOTES.txt"

#: Every prose file a user reads: the docs, the READMEs, the policy files, the chart's notes.
PROSE = sorted(
    [
        *ROOT.glob("docs/**/*.md"),
        *ROOT.glob("*.md"),
        CHART / "README.md",
        NOTES,
        VALUES_YAML,
    ]
)


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# -- links and cited files -----------------------------------------------------------------------

LINK = re.compile(r"\]\(([^)\s]+)\)")
CITED_MD = re.compile(r"`([\w./-]+\.md)`")


def _resolves(doc: Path, target: str) -> bool:
    """A relative target from the doc's folder, or a path named from the repository's root or
    from docs/ (how the prose cites files in backticks)."""
    return any((base / target).exists() for base in (doc.parent, ROOT, ROOT / "docs", CHART))


def test_every_markdown_link_and_cited_md_file_exists() -> None:
    broken = []
    for doc in PROSE:
        text = doc.read_text(encoding="utf-8")
        for target in LINK.findall(re.sub(r"`[^`\n]*`", "", text)):  # not in code
            path = target.split("#", 1)[0]
            if not path or re.match(r"[a-z]+:", path):
                continue  # an anchor of the same page, or a URL
            if not (doc.parent / path).exists():
                broken.append(f"{_rel(doc)}: ({target})")
        for cited in CITED_MD.findall(text):
            if not _resolves(doc, cited):
                broken.append(f"{_rel(doc)}: `{cited}`")
    assert not broken, f"links or cited files that are not in the repository: {broken}"


# -- RBAC ----------------------------------------------------------------------------------------


def _slurmjob_verbs() -> set[str]:
    return {v for _, resource, v in _granted(_rules_helper()) if resource == "slurmjobs"}


def test_the_slurmjob_verbs_the_docs_list_are_the_charts() -> None:
    granted = _slurmjob_verbs()
    assert "delete" in granted  # the TTL after the end
    helm = HELM_MD.read_text()
    (row,) = [
        line for line in helm.splitlines() if line.startswith("| `slurmjob.io` `slurmjobs` |")
    ]
    assert set(re.findall(r"`(\w+)`", row.split(" | ")[1])) == granted, row
    security = (ROOT / "docs" / "security.md").read_text()
    (row,) = [
        line for line in security.splitlines() if line.startswith("| `slurmjobs.slurmjob.io` |")
    ]
    assert set(row.split(" | ")[1].split(", ")) == granted, row
    readme = (CHART / "README.md").read_text()
    listed = re.search(r"`([a-z/]+)` SlurmJobs", readme)
    assert listed, "the chart README lists the operator's SlurmJob verbs"
    assert set(listed.group(1).split("/")) == granted, listed.group(0)
    # What helm.md says the integration test proves denied: none of it granted.
    denied = re.search(r"allowed and that ((?:`\w+`,?\s+)+)on SlurmJobs", helm)
    assert denied, "helm.md names the verbs denied on SlurmJobs"
    assert not set(re.findall(r"`(\w+)`", denied.group(1))) & granted, denied.group(0)


def test_every_role_the_chart_makes_is_named_in_helms_rbac_section() -> None:
    rbac = (CHART / "templates" / "rbac.yaml").read_text()
    suffixes = set(
        re.findall(
            r"kind: (?:Cluster)?Role\nmetadata:\n  name: \{\{ \$fullname \}\}-([a-z-]+)", rbac
        )
    )
    assert {"probe-cache", "leader-election", "secrets", "serving-cert"} <= suffixes
    helm = HELM_MD.read_text()
    section = helm[helm.index("## RBAC") : helm.index("\n## ", helm.index("## RBAC") + 1)]
    missing = sorted(s for s in suffixes if f"`<release>-slurmjob-operator-{s}`" not in section)
    assert not missing, f"docs/helm.md's RBAC section does not name the Roles {missing}"


# -- required values -----------------------------------------------------------------------------


def _required_values() -> set[str]:
    """What the render refuses to go without: each `required` of the validate helper, and
    the storage sources it wants one of."""
    helpers = HELPERS.read_text()
    validate = helpers[helpers.index('define "slurmjob-operator.validate"') :]
    validate = validate[: validate.index("{{- end }}\n\n")]
    required = set(re.findall(r'required "[^"]*" \.Values\.([\w.]+)', validate))
    either = re.findall(r"if not \(or \.Values\.([\w.]+) \.Values\.([\w.]+)\)", validate)
    return required | {name for pair in either for name in pair}


def test_the_required_values_are_the_ones_the_docs_name() -> None:
    required = _required_values()
    assert {"image.repository", "podSecurityContext.runAsUser", "slurm.restUrl"} <= required
    header = VALUES_YAML.read_text().split("Required at install:", 1)[1].split("\n\n", 1)[0]
    named = set(re.findall(r"[a-zA-Z]+(?:\.[a-zA-Z]+)+", header))
    assert named == required, f"values.yaml's header: {named ^ required}"
    helm = HELM_MD.read_text()
    paragraphs = [re.sub(r"\s+", " ", p) for p in helm.split("\n\n")]
    (paragraph,) = [p for p in paragraphs if " are required;" in p]
    sentence = paragraph.split(" are required;", 1)[0]
    named = set(re.findall(r"`([\w.]+)`", sentence))
    assert named == required, f"docs/helm.md: {named ^ required}"
    # The chart README's sentence also says what goes with them (the signing key's mode).
    readme = (CHART / "README.md").read_text().split("Required values:", 1)[1].split("\n\n")[0]
    assert required <= set(re.findall(r"`([\w.]+)`", readme)), "the chart README"


# -- commands --------------------------------------------------------------------------------------

DEPLOYMENT = ("slurmjob-slurmjob-operator", "<release>-slurmjob-operator")


def test_kubectl_deploy_commands_name_the_namespace_and_the_installs_name() -> None:
    wrong = []
    for doc in PROSE:
        for line in doc.read_text(encoding="utf-8").splitlines():
            if "kubectl" not in line or "deploy/" not in line:
                continue
            names = re.findall(r"deploy/(\S+)", line)
            if not re.search(r"\s(-n|--namespace)[ =]\S", line):
                wrong.append(f"{_rel(doc)}: no namespace: {line.strip()}")
            if doc != NOTES and any(n not in DEPLOYMENT for n in names):
                wrong.append(f"{_rel(doc)}: not the install's Deployment: {line.strip()}")
    assert not wrong, wrong


# -- Secret access off -----------------------------------------------------------------------------

SAYS_FAILS = re.compile(r"\bfails?\s+with\s+[\"`]?not allowed to read Secret", re.I)


def test_a_job_without_secret_access_is_said_to_wait_as_it_does() -> None:
    """An unreadable Secret is retried (Pending, SecretNotFound), never the end of the job:
    no doc may say such jobs fail."""
    plan = FAILURES[Failure.SECRET_MISSING]
    assert plan.reason is Reason.SECRET_NOT_FOUND
    assert plan.retry is not Retry.NEVER
    said = [
        f"{_rel(doc)}: {m.group(0)!r}"
        for doc in PROSE
        for m in SAYS_FAILS.finditer(re.sub(r"\s+", " ", doc.read_text(encoding="utf-8")))
    ]
    assert not said, said


# -- NOTES.txt, rendered -------------------------------------------------------------------------


def _helm() -> str | None:
    found = sorted(Path("/var/cache/slurmjob-testbed/k8s").glob("helm-*/helm"))
    return str(found[-1]) if found else shutil.which("helm")


SHOW_NOTES = ("--show-only", "templates/notes-check.yaml")


def render_notes(tmp_path: Path, *sets: str) -> str:
    """NOTES.txt as `helm install` prints it. `helm template` leaves NOTES.txt out, so a copy
    of the chart gets it as a named template and one manifest that includes it."""
    helm = _helm()
    if helm is None:
        pytest.skip("no helm binary (make testbed builds it)")
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    body = NOTES.read_text()
    (chart / "templates" / "_notes_check.tpl").write_text(
        '{{- define "notes-check" -}}\n' + body + "\n{{- end }}\n"
    )
    (chart / "templates" / "notes-check.yaml").write_text(
        'notes: {{ include "notes-check" . | toJson }}\n'
    )
    base = [
        "slurm.restUrl=https://slurmrestd.example:6820",
        "slurm.auth.existingSecret=jwt",
        "image.repository=registry.example/slurmjob-operator",
        "podSecurityContext.runAsUser=1000",
        "storage.hostPath.path=/lustre/slurmjob",
    ]
    args = [a for s in (*base, *sets) for a in ("--set", s)]
    proc = subprocess.run(
        [helm, "template", "rel", str(chart), "-n", "slurmjob-system", *SHOW_NOTES, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return str(yaml.safe_load(proc.stdout)["notes"])


def test_notes_warn_for_every_staging_owner_the_pod_cannot_chown_for(tmp_path: Path) -> None:
    plain = render_notes(tmp_path / "plain")
    assert "stagingOwner" not in plain
    cluster = render_notes(
        tmp_path / "cluster", "clusters[0].name=west", "clusters[0].stagingOwner=1000:1000"
    )
    assert "WARNING: clusters[west].stagingOwner is set" in cluster
    assert "needs CAP_CHOWN" in cluster
    both = render_notes(
        tmp_path / "both",
        "storage.stagingOwner=1000:1000",
        "clusters[0].name=west",
        "clusters[0].stagingOwner=1000:1000",
    )
    assert "WARNING: storage.stagingOwner, clusters[west].stagingOwner are set" in both
    # A pod given back its capabilities is not warned.
    kept = render_notes(
        tmp_path / "kept",
        "clusters[0].name=west",
        "clusters[0].stagingOwner=1000:1000",
        "securityContext.capabilities.drop=null",
    )
    assert "stagingOwner" not in kept
