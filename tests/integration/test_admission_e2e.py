"""Refused at apply time, with the reconciler's own words (issue 45, section 1), on the test
bed's kube-apiserver: the chart's admission policies (`templates/admission.yaml`, rendered by
helm) refuse each refused manifest of tests/unit/admission_oracle.py's table with exactly the
reason and message the reconciler's own functions give for it with no policy
(`reconciler_refusal`), and admit the others; a maxTimeLimit tightened later holds back neither
the finalizer nor the deletion of an older SlurmJob that breaks it, nor its namespace's; a
status write by anyone but the release's ServiceAccount is refused; two releases judge only
their own namespaces and never refuse each other's ServiceAccount.

No operator runs here: the policies are the apiserver's alone. Every binding is limited to this
module's namespaces (release 1 by its watchNamespaces, release 2, a cluster-wide one, by a
namespaceSelector added to its binding), so no other module's SlurmJobs are ever judged. The
test bed has no controller-manager: a namespace's deletion is carried out by hand (its
SlurmJobs deleted, then their finalizer removed as the operator removes it)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.k8s.kube import KubeTestbed
from tests.unit.admission_oracle import (
    CASES,
    CHART_SITE,
    Case,
    manifest,
    reconciler_refusal,
    site_settings,
    tenants,
)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "slurmjob-operator"
FINALIZER = "slurmjob.io/finalizer"
WAIT = 30.0
RBAC = "rbac.authorization.k8s.io"


@dataclass
class Release:
    name: str
    namespace: str
    values: dict[str, Any]
    #: Namespaces a binding is limited to on top of the chart's own scoping (release 2).
    fence: list[str] = field(default_factory=list)

    @property
    def operator(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.name}-slurmjob-operator"

    def policy(self, kind: str) -> str:
        return f"{self.name}-slurmjob-operator-{kind}"


@dataclass
class Bed:
    kube: KubeTestbed
    ns: dict[str, str]
    one: Release
    two: Release
    tmp: Path


def render(kube: KubeTestbed, release: Release, tmp: Path) -> list[dict[str, Any]]:
    path = tmp / f"{release.name}-values.yaml"
    path.write_text(yaml.safe_dump(release.values))
    text = kube.helm(
        "template", release.name, str(CHART), "-n", release.namespace,
        "-f", str(CHART / "ci" / "default-values.yaml"), "-f", str(path),
        "--show-only", "templates/admission.yaml",
    ).stdout  # fmt: skip
    docs = [d for d in yaml.safe_load_all(text) if d]
    assert sorted(d["kind"] for d in docs) == [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicyBinding",
    ]
    for doc in docs:
        if doc["kind"] == "ValidatingAdmissionPolicyBinding" and release.fence:
            assert "matchResources" not in doc["spec"]  # a cluster-wide release's
            doc["spec"]["matchResources"] = {
                "namespaceSelector": {
                    "matchExpressions": [
                        {
                            "key": "kubernetes.io/metadata.name",
                            "operator": "In",
                            "values": release.fence,
                        }
                    ]
                }
            }
    return docs


def install(kube: KubeTestbed, release: Release, tmp: Path) -> None:
    docs = render(kube, release, tmp)
    # The apiserver compiles the CEL when it takes the objects (a refusal fails here). Its
    # type check against the CRD's schema lands in the policy's status by kube-controller-
    # manager, which the test bed does not run: the verdicts below stand for it.
    kube.apply(yaml.safe_dump_all(docs))


def dry_run(kube: KubeTestbed, obj: dict[str, Any]) -> tuple[int, str]:
    proc = kube.kubectl(
        "create", "--dry-run=server", "-o", "name", "-f", "-", input=json.dumps(obj), check=False
    )
    return proc.returncode, proc.stderr


def eventually(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        assert time.monotonic() < deadline, f"not within {WAIT:.0f} s: {what}"
        time.sleep(0.3)


def denial(reason: str, message: str) -> str:
    return f"denied request: {reason}: {message}"


def grant_status(kube: KubeTestbed, namespace: str, users: list[str]) -> None:
    """RBAC lets these users write slurmjobs/status here: what stops them is the policy."""
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "admission-e2e-status", "namespace": namespace},
        "rules": [
            {
                "apiGroups": ["slurmjob.io"],
                "resources": ["slurmjobs", "slurmjobs/status"],
                "verbs": ["get", "patch"],
            }
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "admission-e2e-status", "namespace": namespace},
        "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": "admission-e2e-status"},
        "subjects": [{"apiGroup": RBAC, "kind": "User", "name": user} for user in users],
    }
    kube.apply(yaml.safe_dump_all([role, binding]))


def write_status(kube: KubeTestbed, namespace: str, name: str, user: str | None) -> tuple[int, str]:
    patch = json.dumps({"status": {"message": f"written by {user or 'the admin'}"}})
    args = ["patch", "slurmjob", name, "-n", namespace, "--subresource=status", "--type=merge",
            "-p", patch]  # fmt: skip
    if user is not None:
        args.append(f"--as={user}")
    proc = kube.kubectl(*args, check=False)
    return proc.returncode, proc.stderr


def create(kube: KubeTestbed, obj: dict[str, Any]) -> None:
    obj = json.loads(json.dumps(obj))
    obj["metadata"]["finalizers"] = [FINALIZER]  # as the operator's first pass adds it
    kube.kubectl("create", "-f", "-", input=json.dumps(obj))


def release_finalizer(kube: KubeTestbed, namespace: str, name: str) -> None:
    kube.kubectl(
        "patch", "slurmjob", name, "-n", namespace, "--type=merge",
        "-p", '{"metadata":{"finalizers":null}}',
    )  # fmt: skip


@pytest.fixture(scope="module")
def bed(kube: KubeTestbed, crd: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    run = uuid.uuid4().hex[:6]
    ns = {role: f"adm-{run}-{role}" for role in ("alpha", "queued", "beta", "none")}
    ns["two"] = f"adm-{run}-two"
    tmp = tmp_path_factory.mktemp("admission")
    one = Release(
        f"adm{run}a",
        f"adm-{run}-sys1",
        {
            **CHART_SITE,
            "watchNamespaces": [ns[r] for r in ("alpha", "queued", "beta", "none")],
            "catalogs": {"tenants": tenants(ns)},
        },
    )
    gamma = {
        "name": "gamma",
        "namespaces": [ns["two"]],
        "accounts": ["acct-g"],
        "partitions": ["debug"],
    }
    two = Release(
        f"adm{run}b",
        f"adm-{run}-sys2",
        {"catalogs": {"tenants": [gamma]}, "admission": {"refuseUnclaimedNamespaces": False}},
        fence=sorted(ns.values()),
    )  # fmt: skip
    names = [*ns.values(), one.namespace, two.namespace]
    for name in names:
        kube.kubectl("create", "namespace", name)
    bed = Bed(kube, ns, one, two, tmp)
    try:
        install(kube, one, tmp)
        # Active once a namespace of no tenant is refused.
        orphan = manifest(next(c for c in CASES if c.id == "tenant-unknown"), ns, "probe")
        eventually(lambda: dry_run(kube, orphan)[0] != 0, "release 1's policy in effect")
        yield bed
    finally:
        for release in (one, two):
            for kind in ("slurmjobs", "status"):
                kube.kubectl(
                    "delete", "validatingadmissionpolicybinding,validatingadmissionpolicy",
                    release.policy(kind), "--ignore-not-found", check=False,
                )  # fmt: skip
        for name in names:
            proc = kube.kubectl("get", "slurmjobs", "-n", name, "-o", "name", check=False)
            for ref in proc.stdout.split():
                kube.kubectl("patch", ref, "-n", name, "--type=merge",
                             "-p", '{"metadata":{"finalizers":null}}', check=False)  # fmt: skip
            kube.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_each_manifest_is_refused_with_the_reconcilers_words(bed: Bed, case: Case) -> None:
    obj = manifest(case, bed.ns)
    expected = reconciler_refusal(obj, site_settings(bed.tmp / case.id, bed.ns))
    assert (expected is not None) is case.refused, expected
    code, err = dry_run(bed.kube, obj)
    if expected is None:
        assert code == 0, err
    else:
        assert code != 0
        assert denial(*expected) in err, err
        assert f"ValidatingAdmissionPolicy '{bed.one.policy('slurmjobs')}'" in err


def test_a_tightened_rule_holds_back_no_finalizer_nor_deletion(bed: Bed) -> None:
    kube, ns = bed.kube, bed.ns
    admitted = next(c for c in CASES if c.id == "admitted")
    older = manifest(admitted, ns, "older")
    older["spec"]["timeLimit"] = 100  # within alpha's 2h
    create(kube, older)
    doomed = manifest(admitted, ns, "doomed")
    doomed["spec"]["timeLimit"] = 100
    doomed["metadata"]["namespace"] = ns["queued"]
    doomed["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "q"}
    create(kube, doomed)
    # The admin lowers alpha's and queued's maxTimeLimit to 30 minutes.
    values = json.loads(json.dumps(bed.one.values))
    for tenant in values["catalogs"]["tenants"]:
        tenant["maxTimeLimit"] = "30m"
    tightened = Release(bed.one.name, bed.one.namespace, values)
    install(kube, tightened, bed.tmp)
    again = manifest(admitted, ns, "again")
    again["spec"]["timeLimit"] = 100
    eventually(lambda: dry_run(kube, again)[0] != 0, "the tightened rule in effect")
    expected = reconciler_refusal(again, _settings(bed, "tightened", values))
    assert expected is not None
    assert denial(*expected) in dry_run(kube, again)[1]
    try:
        # What the operator writes on the older SlurmJob still goes through: a label, its
        # status (as its ServiceAccount), spec.suspend, the finalizer on deletion.
        kube.kubectl("label", "slurmjob", "older", "-n", ns["alpha"], "touched=yes")
        kube.kubectl("patch", "slurmjob", "older", "-n", ns["alpha"], "--type=merge",
                     "-p", '{"spec":{"suspend":true}}')  # fmt: skip
        grant_status(kube, ns["alpha"], [bed.one.operator])
        code, err = write_status(kube, ns["alpha"], "older", bed.one.operator)
        assert code == 0, err
        kube.kubectl("delete", "slurmjob", "older", "-n", ns["alpha"], "--wait=false")
        release_finalizer(kube, ns["alpha"], "older")
        assert kube.kubectl("get", "slurmjob", "older", "-n", ns["alpha"], check=False).returncode
        # Its namespace deleted: the namespace controller's part by hand (no controller here).
        kube.kubectl("delete", "namespace", ns["queued"], "--wait=false")
        kube.kubectl("delete", "slurmjobs", "--all", "-n", ns["queued"], "--wait=false")
        release_finalizer(kube, ns["queued"], "doomed")
        left = kube.kubectl("get", "slurmjobs", "-n", ns["queued"], "-o", "name").stdout
        assert left.strip() == ""
    finally:
        install(kube, bed.one, bed.tmp)  # the table's rules again, for the other tests
        eventually(lambda: dry_run(kube, again)[0] == 0, "the table's rules back in effect")


def _settings(bed: Bed, label: str, values: dict[str, Any], **overrides: Any) -> Any:
    """The reconciler's settings for a release's values (its tenants file; the table's site)."""
    tmp = bed.tmp / label
    tmp.mkdir(exist_ok=True)
    settings = site_settings(tmp, bed.ns, **overrides)
    assert settings.tenants_file is not None
    settings.tenants_file.write_text(yaml.safe_dump({"tenants": values["catalogs"]["tenants"]}))
    return settings


def test_status_is_written_by_the_operator_alone(bed: Bed) -> None:
    kube, ns = bed.kube, bed.ns
    admitted = next(c for c in CASES if c.id == "admitted-defaults")
    create(kube, manifest(admitted, ns, "claimed"))
    intruder = f"system:serviceaccount:{ns['beta']}:intruder"
    grant_status(kube, ns["beta"], [bed.one.operator, intruder, "alice"])
    code, err = write_status(kube, ns["beta"], "claimed", bed.one.operator)
    assert code == 0, err
    for user in (intruder, "alice", None):  # None: the admin (system:masters) too
        code, err = write_status(kube, ns["beta"], "claimed", user)
        assert code != 0
        assert f"slurmjobs/status of {ns['beta']}/claimed is written by the operator only" in err
        assert bed.one.policy("status") in err
    release_finalizer(kube, ns["beta"], "claimed")
    kube.kubectl("delete", "slurmjob", "claimed", "-n", ns["beta"])


def test_two_releases_judge_only_their_own_namespaces(bed: Bed) -> None:
    kube, ns, one, two = bed.kube, bed.ns, bed.one, bed.two
    install(kube, two, bed.tmp)
    theirs = manifest(next(c for c in CASES if c.id == "admitted"), ns, "theirs")
    theirs["metadata"]["namespace"] = ns["two"]
    theirs["spec"]["account"] = "acct-a"  # alpha's: not gamma's
    settings = _settings(bed, "two", two.values, images_enabled=False)
    expected = reconciler_refusal(theirs, settings, ("default",))
    assert expected is not None
    eventually(
        lambda: denial(*expected) in dry_run(kube, theirs)[1], "release 2's policy in effect"
    )
    assert two.policy("slurmjobs") in dry_run(kube, theirs)[1]
    # Release 1 (watchNamespaces) never judges release 2's namespace, though it lists no tenant
    # there; release 2 (cluster-wide, refuseUnclaimedNamespaces false) leaves release 1's alone.
    ok = json.loads(json.dumps(theirs))
    ok["spec"]["account"] = "acct-g"
    code, err = dry_run(kube, ok)
    assert code == 0, err
    code, err = dry_run(kube, manifest(next(c for c in CASES if c.id == "admitted"), ns, "mine"))
    assert code == 0, err
    image = json.loads(json.dumps(ok))
    image["spec"]["framework"] = {
        "kind": "custom",
        "name": "custom",
        "image": "registry.example/g/x:1",
    }
    expected = reconciler_refusal(image, settings, ("default",))
    assert expected is not None
    assert "does not enable images" in expected[1]
    assert denial(*expected) in dry_run(kube, image)[1]
    # Each release's ServiceAccount writes its own namespaces' status; neither refuses the
    # other's where the other's SlurmJobs are.
    create(kube, ok)
    mine = manifest(next(c for c in CASES if c.id == "admitted"), ns, "mine")
    create(kube, mine)
    grant_status(kube, ns["two"], [one.operator, two.operator])
    grant_status(kube, ns["alpha"], [one.operator, two.operator])
    try:
        assert write_status(kube, ns["two"], "theirs", two.operator)[0] == 0
        assert write_status(kube, ns["alpha"], "mine", one.operator)[0] == 0
        code, err = write_status(kube, ns["two"], "theirs", one.operator)
        assert code != 0
        assert two.policy("status") in err, err
        code, err = write_status(kube, ns["alpha"], "mine", two.operator)
        assert code != 0
        assert one.policy("status") in err, err
    finally:
        release_finalizer(kube, ns["two"], "theirs")
        release_finalizer(kube, ns["alpha"], "mine")
