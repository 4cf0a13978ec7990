"""Which connections a `Listener` holds, and which one gives way to a new one.

A connection is **proven** once it has shown what only a legitimate client has (the log API:
a TLS handshake done with a client certificate that passed the front proxy's checks); every
other one is **unproven**: one still in its TLS handshake, one handshaken without such a
certificate, and every connection of a plain-HTTP listener (the health probe, /metrics),
where nothing can be proven.

* At most `max_per_source` unproven connections from one address: one more from it is
  refused, so one pod never holds a listener's whole cap. Proven ones are not counted (the
  apiserver keeps as many as it needs).
* At most `max_connections` in all. A new connection over that is not refused while an
  unproven one is held: the **oldest unproven connection of the address holding the most
  unproven ones** is closed in its place (the address that has the most to lose gives way;
  between addresses holding as many, the one whose connection is oldest). So however many
  silent connections are held or renewed, a client with a proof still gets in and stays in,
  and a client of an address holding few connections (the kubelet's probe, the scraper) is
  the last to give way. Only when every held connection is proven is a new one refused: a
  proven connection is never closed for an unproven one.
* On a listener where a proof exists (`guarded`: the log API's TLS), every connection that
  takes another's place costs a TLS handshake, and an attacker renewing its connections as
  fast as it can would make the operator do handshakes at that rate (its memory grew by
  160 MiB in 5 s). There, an address that proved itself in the last `PROVEN_FOR` seconds
  (the apiserver's) always takes a place; any other does so at most `churn` times a second
  for the whole listener, and is refused before any handshake otherwise.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from slurmjob_operator.core.budget import Bucket, take

T = TypeVar("T", bound=Hashable)

#: Seconds an address that proved itself keeps its right to take an unproven one's place.
PROVEN_FOR = 600.0
#: Addresses remembered as proven, at most (the apiserver's few; the oldest forgotten first).
PROVEN_ADDRESSES = 64
#: Places an address not proven may take each second on a guarded listener, as a share of
#: the cap (measured: 16 a second at the default cap kept a renewing attacker's cost within
#: the listener's 30 MB budget; 600 a second, unbounded, cost 160 MiB).
CHURN_SHARE = 0.25


@dataclass(frozen=True)
class Decision(Generic[T]):
    """What `Admission.admit` decided: refused (and why: "source" or "cap"), or admitted,
    with the connection to close in its place if any."""

    admitted: bool
    reason: str = ""
    victim: T | None = None


class Admission(Generic[T]):
    """The held connections of one listener (see the module's docstring)."""

    def __init__(
        self,
        max_connections: int,
        max_per_source: int,
        *,
        guarded: bool = False,
        churn: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`guarded`: connections can prove themselves (TLS); `churn`: how many times a
        second an address not proven may take another's place there (default: a quarter of
        the cap)."""
        self.max_connections = max_connections
        self.max_per_source = max_per_source
        self.guarded = guarded
        self.churn = churn if churn is not None else max(1.0, max_connections * CHURN_SHARE)
        self._clock = clock
        self._bucket: Bucket | None = None  # the places taken by addresses not proven
        self._proven: dict[str, float] = {}  # address -> when it last proved itself
        self._source: dict[T, str] = {}  # every held connection, and its address
        # The unproven ones by address, each with its order of admission (oldest first).
        self._unproven: dict[str, dict[T, int]] = {}
        self._order = 0

    def __len__(self) -> int:
        return len(self._source)

    def __iter__(self) -> Iterator[T]:
        return iter(list(self._source))

    @property
    def unproven(self) -> int:
        return sum(len(held) for held in self._unproven.values())

    def unproven_from(self, source: str) -> int:
        return len(self._unproven.get(source, ()))

    def admit(self, conn: T, source: str) -> Decision[T]:
        """Take `conn` from `source` as unproven, closing another in its place if need be
        (the caller closes the victim; it is no longer held)."""
        if self.unproven_from(source) >= self.max_per_source:
            return Decision(False, "source")
        victim: T | None = None
        if len(self._source) >= self.max_connections:
            if self.guarded and not self._known(source) and not self._take_token():
                return Decision(False, "cap")
            victim = self._victim()
            if victim is None:
                return Decision(False, "cap")
            self.discard(victim)
        self._order += 1
        self._source[conn] = source
        self._unproven.setdefault(source, {})[conn] = self._order
        return Decision(True, victim=victim)

    def prove(self, conn: T) -> None:
        """`conn` has shown its proof: never closed for an unproven one, not counted against
        its address."""
        source = self._source.get(conn)
        if source is not None:
            self._forget_unproven(conn, source)
            self._proven.pop(source, None)
            self._proven[source] = self._clock()
            while len(self._proven) > PROVEN_ADDRESSES:
                del self._proven[next(iter(self._proven))]

    def _known(self, source: str) -> bool:
        proved = self._proven.get(source)
        return proved is not None and self._clock() - proved < PROVEN_FOR

    def _take_token(self) -> bool:
        # `churn` places at once, as many again each second.
        capacity = max(1, round(self.churn))
        allowed, self._bucket = take(self._bucket, self._clock(), capacity, 1.0)
        return allowed

    def is_proven(self, conn: T) -> bool:
        source = self._source.get(conn)
        return source is not None and conn not in self._unproven.get(source, {})

    def discard(self, conn: T) -> None:
        source = self._source.pop(conn, None)
        if source is not None:
            self._forget_unproven(conn, source)

    def _forget_unproven(self, conn: T, source: str) -> None:
        held = self._unproven.get(source)
        if held is not None:
            held.pop(conn, None)
            if not held:
                del self._unproven[source]

    def _victim(self) -> T | None:
        """The oldest unproven connection of the address holding the most (None: every held
        connection is proven). Dicts keep their order, so an address's first is its oldest."""
        best: tuple[int, int] | None = None
        victim: T | None = None
        for held in self._unproven.values():
            oldest, order = next(iter(held.items()))
            rank = (len(held), -order)
            if best is None or rank > best:
                best, victim = rank, oldest
        return victim
