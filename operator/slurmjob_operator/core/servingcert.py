"""When the operator's own serving certificate and its CA are made anew (`servingcert.py` does
the cryptography and the Kubernetes I/O; this decides, on plain data and a given clock).

The Secret holds a CA bundle (every CA the apiserver is to trust, in `ca.crt`), the key of the
newest CA (`ca.key`: the one that signs) and the serving certificate with its key. The rules:

* A CA is made when there is none whose key is held, or when the signing one is within
  `CA_ROTATE_BEFORE` of its end. The new CA joins the bundle next to the old ones, which stay
  until they expire: a replica that has not yet re-read the Secret still serves a certificate
  of the old CA, and the apiserver must go on trusting it.
* The serving certificate is made at once when it is missing, unusable (its key is not the
  one stored, a DNS name is missing, it is outside its validity, or no CA of the bundle signed
  it). When it is merely due (`LEAF_RENEW_BEFORE` of its end), it is renewed only by a CA that
  has *settled*: in the bundle for `SETTLE` and trusted by the APIService (where there is one
  to trust it), so the apiserver never meets a certificate of a CA it does not yet know.
* A certificate never outlives the CA that signed it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

CA_LIFETIME = timedelta(days=730)
#: A new CA is made this long before the signing one ends; the serving certificate moves to it
#: when that certificate is next due, at least LEAF_RENEW_BEFORE before the old CA ends.
CA_ROTATE_BEFORE = timedelta(days=90)
LEAF_LIFETIME = timedelta(days=90)
LEAF_RENEW_BEFORE = timedelta(days=30)
#: How long a new CA is in the published bundle before it signs a certificate that replaces
#: a still valid one (the apiserver and every reader of the bundle have picked it up).
SETTLE = timedelta(hours=1)
#: Certificates start this long before they are made: clocks of other hosts may lag.
BACKDATE = timedelta(minutes=5)
#: CAs kept in the bundle at most; the oldest ones that sign nothing served go first.
MAX_AUTHORITIES = 3


@dataclass(frozen=True)
class Authority:
    """A CA of the bundle. `key_id` tells CAs apart (a digest of the public key)."""

    key_id: str
    not_before: datetime
    not_after: datetime


@dataclass(frozen=True)
class Leaf:
    """The serving certificate as read: who signed it (None: no CA of the bundle) and whether
    the stored key is its key."""

    issuer: str | None
    not_before: datetime
    not_after: datetime
    dns_names: frozenset[str]
    key_matches: bool


@dataclass(frozen=True)
class Held:
    """What the Secret holds. `signer`: the key id of the CA whose key `ca.key` holds (None:
    no usable key)."""

    authorities: tuple[Authority, ...] = ()
    signer: str | None = None
    leaf: Leaf | None = None


@dataclass(frozen=True)
class Plan:
    """What to write. `keep`: the held CAs that stay in the bundle, in order; `new_authority`:
    make a CA, append it, and sign with it from now on; `issue_leaf`: a new serving
    certificate from the signing CA. `reasons` are for the log."""

    keep: tuple[str, ...]
    new_authority: bool
    issue_leaf: bool
    reasons: tuple[str, ...]
    changes: bool


def authority_window(now: datetime) -> tuple[datetime, datetime]:
    return now - BACKDATE, now + CA_LIFETIME


def leaf_window(signer: Authority, now: datetime) -> tuple[datetime, datetime]:
    return now - BACKDATE, min(now + LEAF_LIFETIME, signer.not_after)


def leaf_unusable(
    leaf: Leaf | None, names: frozenset[str], trusted: Iterable[str], now: datetime
) -> str:
    """Why the serving certificate cannot be served now ("" when it can)."""
    if leaf is None:
        return "no serving certificate"
    if not leaf.key_matches:
        return "the serving key is not the certificate's"
    if not names <= leaf.dns_names:
        return f"the certificate lacks {', '.join(sorted(names - leaf.dns_names))}"
    if not leaf.not_before <= now < leaf.not_after:
        return "the certificate is outside its validity"
    if leaf.issuer is None or leaf.issuer not in set(trusted):
        return "no CA of the bundle signed the certificate"
    return ""


def settled(authority: Authority, now: datetime, published: frozenset[str] | None) -> bool:
    """Whether `authority` may replace a valid certificate: in the bundle long enough, and
    trusted by the APIService (`published`: the key ids it trusts; None: there is none)."""
    if now < authority.not_before + BACKDATE + SETTLE:
        return False
    return published is None or authority.key_id in published


def _kept(held: Held, live: list[Authority], signer: str | None) -> list[Authority]:
    """The live CAs, the oldest ones beyond MAX_AUTHORITIES dropped unless they sign or signed
    what is served."""
    needed = {signer, held.leaf.issuer if held.leaf else None}
    room = MAX_AUTHORITIES - (0 if signer is not None else 1)
    kept = list(live)
    for authority in sorted(live, key=lambda a: a.not_before):
        if len(kept) <= room:
            break
        if authority.key_id not in needed:
            kept.remove(authority)
    return kept


def plan(
    held: Held, names: frozenset[str], now: datetime, published: frozenset[str] | None
) -> Plan:
    """What the leader writes now, given what is held (`Held()` when there is no Secret)."""
    reasons: list[str] = []
    live = [a for a in held.authorities if now < a.not_after]
    if len(live) < len(held.authorities):
        reasons.append("a CA expired")
    by_id = {a.key_id: a for a in live}
    signer = by_id.get(held.signer) if held.signer else None
    new_authority = False
    if signer is None:
        new_authority = True
        reasons.append("no CA whose key is held")
    elif now >= signer.not_after - CA_ROTATE_BEFORE:
        new_authority = True
        reasons.append("the CA is near its end")
    kept = _kept(held, live, None if new_authority else held.signer)
    if len(kept) < len(live):
        reasons.append("too many CAs")
    trusted = {a.key_id for a in kept}
    unusable = leaf_unusable(held.leaf, names, trusted, now)
    issue = False
    if unusable:
        issue = True
        reasons.append(unusable)
    elif held.leaf is not None and now >= held.leaf.not_after - LEAF_RENEW_BEFORE:
        if new_authority or signer is None:
            reasons.append("the certificate is due; waiting for the new CA to settle")
        elif settled(signer, now, published):
            issue = True
            reasons.append("the certificate is due")
        else:
            reasons.append("the certificate is due; waiting for the CA to settle")
    keep = tuple(a.key_id for a in kept)
    changes = new_authority or issue or keep != tuple(a.key_id for a in held.authorities)
    return Plan(keep, new_authority, issue, tuple(reasons), changes)
