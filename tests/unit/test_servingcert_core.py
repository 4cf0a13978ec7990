"""`core.servingcert.plan`: when the operator's own CA and serving certificate are made anew,
table-tested on a fixed clock (no cryptography: the decisions only)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from slurmjob_operator.core.servingcert import (
    BACKDATE,
    CA_LIFETIME,
    CA_ROTATE_BEFORE,
    LEAF_LIFETIME,
    LEAF_RENEW_BEFORE,
    MAX_AUTHORITIES,
    SETTLE,
    Authority,
    Held,
    Leaf,
    Plan,
    leaf_window,
    plan,
    settled,
)

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
DAY = timedelta(days=1)
NAMES = frozenset({"logs.ops.svc", "logs.ops.svc.cluster.local"})


def ca(key_id: str, made: datetime) -> Authority:
    return Authority(key_id, made - BACKDATE, made - BACKDATE + CA_LIFETIME)


def leaf(issuer: str | None, made: datetime, **changes: object) -> Leaf:
    fields: dict[str, object] = {
        "issuer": issuer,
        "not_before": made - BACKDATE,
        "not_after": made + LEAF_LIFETIME,
        "dns_names": NAMES,
        "key_matches": True,
    }
    fields.update(changes)
    return Leaf(**fields)  # type: ignore[arg-type]


OLD = ca("old", NOW - 100 * DAY)  # 630 days left
FRESH_LEAF = leaf("old", NOW - 10 * DAY)
HEALTHY = Held((OLD,), "old", FRESH_LEAF)


def decide(held: Held, now: datetime = NOW, published: frozenset[str] | None = None) -> Plan:
    return plan(held, NAMES, now, published)


CASES = [
    # (id, held, now, published, new CA, keep, issue leaf)
    ("nothing held: a CA and a certificate", Held(), NOW, None, True, (), True),
    ("all in order: nothing", HEALTHY, NOW, None, False, ("old",), False),
    (
        "certificate due, CA settled and published: renewed",
        Held((OLD,), "old", leaf("old", NOW - 61 * DAY)),
        NOW,
        frozenset({"old"}),
        False,
        ("old",),
        True,
    ),
    (
        "certificate due, the APIService does not trust the CA: wait",
        Held((OLD,), "old", leaf("old", NOW - 61 * DAY)),
        NOW,
        frozenset({"someone-else"}),
        False,
        ("old",),
        False,
    ),
    (
        "certificate due, the APIService unreadable (empty set): wait",
        Held((OLD,), "old", leaf("old", NOW - 61 * DAY)),
        NOW,
        frozenset(),
        False,
        ("old",),
        False,
    ),
    (
        "certificate expired: made at once, whatever the APIService",
        Held((OLD,), "old", leaf("old", NOW - 91 * DAY)),
        NOW,
        frozenset(),
        False,
        ("old",),
        True,
    ),
    (
        "key not the certificate's: made at once",
        Held((OLD,), "old", leaf("old", NOW - DAY, key_matches=False)),
        NOW,
        None,
        False,
        ("old",),
        True,
    ),
    (
        "a DNS name missing (the Service renamed): made at once",
        Held((OLD,), "old", leaf("old", NOW - DAY, dns_names=frozenset({"x.ops.svc"}))),
        NOW,
        None,
        False,
        ("old",),
        True,
    ),
    (
        "certificate of no CA of the bundle: made at once",
        Held((OLD,), "old", leaf(None, NOW - DAY)),
        NOW,
        None,
        False,
        ("old",),
        True,
    ),
    (
        "certificate not yet valid: made at once",
        Held((OLD,), "old", leaf("old", NOW + DAY)),
        NOW,
        None,
        False,
        ("old",),
        True,
    ),
    (
        "CA key lost, certificate still good: a new CA next to the old one, certificate kept",
        Held((OLD,), None, FRESH_LEAF),
        NOW,
        None,
        True,
        ("old",),
        False,
    ),
    (
        "CA near its end: a new CA joins, the old one stays, the certificate waits",
        Held((OLD,), "old", leaf("old", OLD.not_after - CA_ROTATE_BEFORE - 80 * DAY)),
        OLD.not_after - CA_ROTATE_BEFORE,
        None,
        True,
        ("old",),
        False,
    ),
    (
        "CA near its end and the certificate due: new CA, certificate waits for it to settle",
        Held((OLD,), "old", leaf("old", OLD.not_after - CA_ROTATE_BEFORE - 70 * DAY)),
        OLD.not_after - CA_ROTATE_BEFORE,
        None,
        True,
        ("old",),
        False,
    ),
    (
        "an expired CA leaves the bundle",
        Held((ca("gone", NOW - CA_LIFETIME - DAY), OLD), "old", FRESH_LEAF),
        NOW,
        None,
        False,
        ("old",),
        False,
    ),
]


@pytest.mark.parametrize(
    ("held", "now", "published", "new_ca", "keep", "issue"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_plan(
    held: Held,
    now: datetime,
    published: frozenset[str] | None,
    new_ca: bool,
    keep: tuple[str, ...],
    issue: bool,
) -> None:
    decided = decide(held, now, published)
    assert (decided.new_authority, decided.keep, decided.issue_leaf) == (new_ca, keep, issue)
    assert decided.changes == (new_ca or issue or keep != tuple(a.key_id for a in held.authorities))
    if decided.changes:
        assert decided.reasons


NEW = ca("new", NOW - 2 * SETTLE)


@pytest.mark.parametrize(
    ("authority", "now", "published", "expected"),
    [
        (NEW, NOW, None, True),
        (NEW, NOW, frozenset({"new", "old"}), True),
        (NEW, NOW, frozenset({"old"}), False),
        (ca("new", NOW - SETTLE + timedelta(minutes=1)), NOW, None, False),
        (ca("new", NOW - SETTLE), NOW, None, True),
    ],
    ids=["no-apiservice", "published", "not-published", "too-new", "just-settled"],
)
def test_settled(
    authority: Authority, now: datetime, published: frozenset[str] | None, expected: bool
) -> None:
    assert settled(authority, now, published) is expected


def test_a_due_certificate_moves_to_the_new_ca_once_it_settled() -> None:
    """Old CA signs the certificate, a new CA is the signer now: due, it moves once the new
    one is settled and trusted, and the old CA stays in the bundle (the overlap)."""
    due = leaf("old", NOW - 61 * DAY)
    held = Held((OLD, NEW), "new", due)
    assert decide(held, NOW, frozenset({"old"})).issue_leaf is False
    moved = decide(held, NOW, frozenset({"old", "new"}))
    assert (moved.issue_leaf, moved.keep, moved.new_authority) == (True, ("old", "new"), False)


def test_a_certificate_never_outlives_its_ca() -> None:
    short = ca("short", NOW - CA_LIFETIME + 10 * DAY)
    assert leaf_window(short, NOW) == (NOW - BACKDATE, short.not_after)
    assert leaf_window(OLD, NOW) == (NOW - BACKDATE, NOW + LEAF_LIFETIME)


def test_the_bundle_is_bounded_but_keeps_what_signs_and_what_is_served() -> None:
    many = tuple(ca(f"c{i}", NOW - (50 - i) * DAY) for i in range(MAX_AUTHORITIES + 2))
    held = Held(many, "c0", leaf("c1", NOW - DAY))
    decided = decide(held)
    assert len(decided.keep) == MAX_AUTHORITIES
    assert {"c0", "c1"} <= set(decided.keep)
    assert decided.changes


def test_the_timing_leaves_room_for_the_overlap() -> None:
    """A certificate signed by a CA about to be rotated falls due after the new CA settled,
    and before the old CA ends."""
    assert CA_ROTATE_BEFORE > LEAF_RENEW_BEFORE + SETTLE
    assert LEAF_LIFETIME > LEAF_RENEW_BEFORE
    assert CA_LIFETIME > CA_ROTATE_BEFORE + LEAF_LIFETIME


def test_years_of_checks_keep_a_valid_certificate_and_an_overlap() -> None:
    """Every 10 minutes for three years (simulated on plain data): a valid certificate at all
    times, signed by a CA of the bundle; when the signer changes, the old CA is still in the
    bundle."""
    held = Held()
    now = NOW
    made = 0
    step = timedelta(minutes=10)
    published: frozenset[str] | None = frozenset()
    end = NOW + 3 * 365 * DAY
    while now < end:
        decided = decide(held, now, published)
        if decided.changes:
            authorities = [a for a in held.authorities if a.key_id in decided.keep]
            signer = held.signer
            if decided.new_authority:
                made += 1
                signer = f"ca{made}"
                authorities.append(ca(signer, now))
            current = held.leaf
            if decided.issue_leaf:
                by_id = {a.key_id: a for a in authorities}
                start, stop = leaf_window(by_id[signer or ""], now)
                if current is not None and current.issuer != signer:
                    assert current.issuer in by_id, "the old CA left before the switch"
                current = Leaf(signer, start, stop, NAMES, True)
            held = Held(tuple(authorities), signer, current)
            published = frozenset(a.key_id for a in authorities)  # the APIService patched
        assert held.leaf is not None
        assert held.leaf.not_before <= now < held.leaf.not_after
        assert held.leaf.issuer in {a.key_id for a in held.authorities}
        now += step
    assert made >= 2  # the CA was rotated
