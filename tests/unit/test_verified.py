"""`core.verified`: a `VerifiedJob` is made in that module only, from views of the attempt's
own job run by a Slurm user the resource may own, and every mutating slurmrestd call takes
one and checks it at run time (live, minted there, of its step, owned by the acting user)."""

from __future__ import annotations

import ast
import copy
import dataclasses
import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import pytest

from slurmjob_operator.api.status import Attempt
from slurmjob_operator.core import verified
from slurmjob_operator.core.jobview import JobSource, SlurmJobView
from slurmjob_operator.core.verified import NotVerified, Unverified, VerifiedJob, Why, vouch
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.http import HttpTransport
from slurmjob_operator.slurm.routes import MUTATING, ROUTES

from .slurm_fakes import FakeSlurm, StaticToken, envelope

PACKAGE = Path(verified.__file__).resolve().parents[1]
UID = "u-1"
ATTEMPT = Attempt(number=1, job_name="sj-team-a-train-u1-a1", job_id=100)
COMMENT = f"slurmjob.io ns=team-a name=train uid={UID} attempt=1"


def view(job_id: int = 100, **update: Any) -> SlurmJobView:
    values: dict[str, Any] = {
        "job_id": job_id,
        "name": ATTEMPT.job_name,
        "comment": COMMENT,
        "user": "team-a",
    }
    values.update(update)
    return SlurmJobView(**values)


def made(views: Sequence[SlurmJobView], owners: frozenset[str] = frozenset({"team-a"})) -> Any:
    return verified.verify(views, UID, ATTEMPT, owners=owners, cluster="default")


# -- what makes a handle --------------------------------------------------------------------


def test_the_attempts_own_job_of_an_owned_user_makes_a_handle(step: verified.Step) -> None:
    job = made([view()])
    assert isinstance(job, VerifiedJob)
    assert (job.job_id, job.owner, job.components, job.cluster) == (
        100,
        "team-a",
        (100,),
        "default",
    )
    assert vouch(job, "team-a") is job


def test_every_heterogeneous_component_is_covered_the_leaders_last(step: verified.Step) -> None:
    views = [
        view(101, het_job_id=100, het_job_offset=1),
        view(100, het_job_id=100, het_job_offset=0, sluid="s0000000000001"),
        view(102, het_job_id=100, het_job_offset=2),
    ]
    job = made(views)
    assert isinstance(job, VerifiedJob)
    assert job.components == (101, 102, 100)
    assert job.sluid == "s0000000000001"


@pytest.mark.parametrize(
    ("views", "why"),
    [
        ([view(name="sj-team-b-other-a1")], Why.IDENTITY),
        ([view(comment="slurmjob.io ns=team-b name=x uid=u-2 attempt=1")], Why.IDENTITY),
        ([view(comment=None)], Why.IDENTITY),  # a live job always keeps its comment
        ([view(555)], Why.IDENTITY),  # Slurm answered for another id
        ([view(user="team-b")], Why.OWNER),
        ([view(user=None)], Why.OWNER),  # a user Slurm does not show is no owner
        ([view(), view(101, het_job_id=100, het_job_offset=1, user="team-b")], Why.OWNER),
        ([], Why.NOTHING),
        ([view(source=JobSource.ACCOUNTING, comment=None)], Why.NOTHING),
        ([view(), view(101, source=JobSource.ACCOUNTING)], Why.NOTHING),
    ],
)
def test_anything_else_makes_no_handle(
    step: verified.Step, views: list[SlurmJobView], why: Why
) -> None:
    answer = made(views)
    assert isinstance(answer, Unverified)
    assert answer.why is why


def test_no_handle_is_made_outside_a_step() -> None:
    with pytest.raises(NotVerified, match="inside a step"):
        made([view()])


# -- what a mutating call accepts -----------------------------------------------------------


def test_a_copied_replaced_or_forged_handle_is_refused(step: verified.Step) -> None:
    job = made([view()])
    assert isinstance(job, VerifiedJob)
    forged = [
        copy.copy(job),
        copy.deepcopy(job),
        dataclasses.replace(job, job_id=555),
        VerifiedJob(555, None, (555,), (), "team-a", "default", step),
        cast(VerifiedJob, view()),
    ]
    for fake in forged:
        with pytest.raises(NotVerified):
            vouch(fake, "team-a")


def test_a_handle_changed_in_place_is_refused(step: verified.Step) -> None:
    job = made([view()])
    assert isinstance(job, VerifiedJob)
    object.__setattr__(job, "job_id", 999)  # `frozen` is no lock against this
    with pytest.raises(NotVerified, match="changed after it was verified"):
        vouch(job, "team-a")


def test_a_handle_dies_with_its_step() -> None:
    with verified.step():
        job = made([view()])
        assert isinstance(job, VerifiedJob)
        vouch(job, "team-a")
    with pytest.raises(NotVerified, match="step that has ended"):
        vouch(job, "team-a")


def test_a_change_is_made_as_the_jobs_owner_only(step: verified.Step) -> None:
    job = made([view()], frozenset({"team-a", "slurmci"}))
    assert isinstance(job, VerifiedJob)
    for other in ("slurmci", "team-b", None):
        with pytest.raises(NotVerified, match="belongs to Slurm user"):
            vouch(job, other)


def test_nested_steps_share_the_outer_one(step: verified.Step) -> None:
    with verified.step() as inner:
        assert inner is step


# -- the request table ----------------------------------------------------------------------


def test_the_mutating_calls_are_every_post_and_delete_but_the_submit() -> None:
    assert {"hold", "set_dependency", "cancel", "cancel_many"} == MUTATING
    assert "submit" in ROUTES
    assert ROUTES["submit"].method == "POST"


def test_each_mutating_call_takes_verified_jobs_and_nothing_else() -> None:
    taken = {}
    for name in MUTATING:
        parameters = list(inspect.signature(getattr(SlurmClient, name)).parameters.values())
        taken[name] = parameters[1].annotation  # a string: the module defers annotations
    assert taken == {
        "hold": "VerifiedJob",
        "set_dependency": "VerifiedJob",
        "cancel": "VerifiedJob",
        "cancel_many": "Sequence[VerifiedJob]",
    }


async def test_the_client_refuses_a_forged_or_foreign_handle_and_sends_nothing(
    fake: FakeSlurm, step: verified.Step
) -> None:
    fake.json("DELETE", "/slurm/v0.0.45/job/100", envelope(status=[]))
    async with HttpTransport() as transport:
        client = SlurmClient(
            transport, fake.base_url, "v0.0.45", token=StaticToken(), user="team-a", timeout=2
        )
        job = made([view()])
        assert isinstance(job, VerifiedJob)
        theirs = made([view(user="team-b")], frozenset({"team-b"}))
        for bad in (dataclasses.replace(job), theirs, cast(VerifiedJob, view())):
            with pytest.raises(NotVerified):
                await client.cancel(bad)  # type: ignore[arg-type]
            with pytest.raises(NotVerified):
                await client.hold(bad, True)  # type: ignore[arg-type]
            with pytest.raises(NotVerified):
                await client.set_dependency(bad, "")  # type: ignore[arg-type]
            with pytest.raises(NotVerified):
                await client.cancel_many([bad])  # type: ignore[list-item]
        with pytest.raises(NotVerified, match="no verified job"):
            await client.cancel_many([])
        assert fake.seen == []
        await client.cancel(job)
        assert [s.path for s in fake.seen] == ["/slurm/v0.0.45/job/100"]


# -- nothing outside core.verified makes one -------------------------------------------------


def _calls_it(node: ast.Call) -> bool:
    return any(
        (isinstance(n, ast.Name) and n.id == "VerifiedJob")
        or (isinstance(n, ast.Attribute) and n.attr == "VerifiedJob")
        or (isinstance(n, ast.Constant) and n.value == "VerifiedJob")
        for arg in node.args
        for n in ast.walk(arg)
    )


def constructions(source: str) -> list[str]:
    """Where `source` makes, copies or casts to a VerifiedJob: a call of the class, `cast`
    to it or `__new__` of it, and, in a module that names the class, `dataclasses.replace`
    and `copy.copy`/`deepcopy` (a handle is a dataclass: these are its copiers)."""
    tree = ast.parse(source)
    names_it = any(
        (isinstance(node, ast.Name) and node.id == "VerifiedJob")
        or (isinstance(node, ast.Attribute) and node.attr == "VerifiedJob")
        or (isinstance(node, ast.alias) and node.name == "VerifiedJob")
        for node in ast.walk(tree)
    )
    found: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        owner = (
            func.value.id
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
            else None
        )
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        copier = (name == "replace" and (owner == "dataclasses" or isinstance(func, ast.Name))) or (
            name in ("copy", "deepcopy") and (owner == "copy" or isinstance(func, ast.Name))
        )
        if (
            name == "VerifiedJob"
            or (name in ("cast", "__new__") and _calls_it(node))
            or (names_it and copier)
        ):
            found.append(f"line {node.lineno}: {ast.unparse(node)[:80]}")
    return found


SNIPPETS = [
    "from slurmjob_operator.core.verified import VerifiedJob\nVerifiedJob(1, None, 'u')",
    "from slurmjob_operator.core import verified\nverified.VerifiedJob(1, None, (), 'u', 's')",
    "from typing import cast\nfrom x import VerifiedJob\ncast(VerifiedJob, object())",
    "from typing import cast\ncast('VerifiedJob', object())",
    "import dataclasses\nfrom x import VerifiedJob\ndataclasses.replace(job, job_id=2)",
    "from dataclasses import replace\nfrom x import VerifiedJob\nreplace(job, job_id=2)",
    "import copy\nfrom x import VerifiedJob\ncopy.copy(job)",
    "from x import VerifiedJob\nobject.__new__(VerifiedJob)",
]


@pytest.mark.parametrize("snippet", SNIPPETS)
def test_the_scan_finds_each_way_of_making_one(snippet: str) -> None:
    assert constructions(snippet), snippet


def test_no_module_but_core_verified_makes_one() -> None:
    own = Path(verified.__file__).resolve()
    found = {
        str(path.relative_to(PACKAGE)): hits
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.resolve() != own and (hits := constructions(path.read_text(encoding="utf-8")))
    }
    assert found == {}
