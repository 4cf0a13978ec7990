"""`kubectl slurmjob leader` (issue 21, section 4): the leader is the Lease's holder, shown
from the Lease (pods carry no leader label any more)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from slurmjob_operator.plugin.args import DEFAULT_OPERATOR_NAMESPACE, build_parser
from slurmjob_operator.plugin.kubeclient import PluginError
from slurmjob_operator.plugin.leader import expired, leader_table
from slurmjob_operator.plugin.main import run
from slurmjob_operator.plugin.subcommand import EXIT_ERROR, EXIT_OK

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def lease(
    name: str = "slurmjob-slurmjob-operator",
    holder: str | None = "slurmjob-slurmjob-operator-7d9f-abcde",
    renewed: str | None = "2026-03-01T11:59:58.123456+00:00",
    duration: int | None = 15,
    transitions: int = 2,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"leaseTransitions": transitions}
    if holder is not None:
        spec["holderIdentity"] = holder
    if renewed is not None:
        spec["renewTime"] = renewed
    if duration is not None:
        spec["leaseDurationSeconds"] = duration
    return {"metadata": {"name": name, "namespace": "slurmjob-system"}, "spec": spec}


def test_the_holder_of_a_live_lease_leads() -> None:
    text = leader_table([lease()], NOW)
    header, row = text.splitlines()
    assert header.split() == ["LEASE", "HOLDER", "RENEWED", "DURATION", "TRANSITIONS"]
    assert row.split() == [
        "slurmjob-slurmjob-operator",
        "slurmjob-slurmjob-operator-7d9f-abcde",
        "2s",
        "ago",
        "15",
        "2",
    ]


def test_a_lease_not_renewed_in_time_or_given_up_has_no_leader() -> None:
    stale = lease(renewed="2026-03-01T11:59:00.000000Z")
    assert expired(stale["spec"], NOW)
    assert "(expired)" in leader_table([stale], NOW)
    given_up = lease(holder=None, duration=1)
    assert "<none>" in leader_table([given_up], NOW)
    assert expired(lease(renewed=None)["spec"], NOW)
    assert expired(lease(duration=None)["spec"], NOW)
    assert not expired(lease()["spec"], NOW)


def test_what_others_wrote_in_a_lease_is_printed_harmlessly() -> None:
    text = leader_table([lease(holder="evil\x1b[2J\nreplica", renewed="not a time")], NOW)
    assert "\x1b" not in text
    assert len(text.splitlines()) == 2


class Leases:
    """The part of a cluster `leader` uses."""

    namespace = "team-a"

    def __init__(self, found: Sequence[dict[str, Any]], refuse: bool = False) -> None:
        self.found = found
        self.refuse = refuse
        self.asked: list[tuple[str, str | None]] = []

    async def leases(self, namespace: str, name: str | None) -> Sequence[dict[str, Any]]:
        self.asked.append((namespace, name))
        if self.refuse:
            raise PluginError('leases is forbidden: User "alice" cannot list resource "leases"')
        return [b for b in self.found if name is None or b["metadata"]["name"] == name]

    async def close(self) -> None:
        return None


async def _leader(argv: list[str], cluster: Leases) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()

    async def connect(_: str | None) -> Any:
        return cluster

    try:
        code = await run(
            build_parser({}).parse_args(argv), out, err, connect=connect, now=lambda: NOW
        )
    except PluginError as exc:
        return EXIT_ERROR, out.getvalue(), str(exc)
    return code, out.getvalue(), err.getvalue()


async def test_leader_reads_the_lease_in_the_operators_namespace() -> None:
    cluster = Leases([lease(), lease(name="other", holder="x")])
    code, out, _ = await _leader(["leader"], cluster)
    assert code == EXIT_OK
    assert cluster.asked == [(DEFAULT_OPERATOR_NAMESPACE, None)]
    assert "slurmjob-slurmjob-operator-7d9f-abcde" in out
    code, out, _ = await _leader(
        ["leader", "--operator-namespace", "ops", "--lease", "other"], cluster
    )
    assert cluster.asked[-1] == ("ops", "other")
    assert [line.split()[0] for line in out.splitlines()] == ["LEASE", "other"]


async def test_leader_says_when_there_is_no_lease_or_no_right_to_read_it() -> None:
    code, out, err = await _leader(["leader"], Leases([]))
    assert (code, out) == (EXIT_OK, "")
    assert "No Leases found in namespace slurmjob-system" in err
    code, _, err = await _leader(["leader"], Leases([], refuse=True))
    assert code == EXIT_ERROR
    assert "forbidden" in err
