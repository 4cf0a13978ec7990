"""The probe book (controller/probebook.py): the probe cache and the avoid lists in one
ConfigMap, read into memory, written through, and bounded by the share rule (`core.shares`):
whoever floods it with failing probes evicts its own entries, and it stays under the
apiserver's 1 MiB whatever is written (issue 42)."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from unittest.mock import patch

from slurmjob_operator.config.site import PROBE_CAPACITY_BYTES, PROBE_CAPACITY_MAX
from slurmjob_operator.controller.probebook import (
    LEGACY_OWNER,
    RELOAD_SECONDS,
    RETRY_SECONDS,
    ProbeBook,
)
from slurmjob_operator.core.probe import ProbeKeys, ProbeRecord, avoid_key, cache_key
from slurmjob_operator.kube import ConfigMapUnavailable

from .controller_fakes import MemoryConfigMaps

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
KEY = cache_key("tenant:a", "c1", "gpu", "sha/ladder", "h100")
AVOID = avoid_key("tenant:a", "c1")
KEYS = ProbeKeys(KEY, AVOID, 3, "tenant:a")
MIB = 1024 * 1024
#: The largest avoid list: 64 nodes, each name as long as NODE_NAME_RE allows.
WIDEST = tuple(f"n{i:02d}".ljust(64, "x") for i in range(64))


def passed(rung: int) -> ProbeRecord:
    return ProbeRecord("Passed", rung)


def failed(*blamed: str) -> ProbeRecord:
    return ProbeRecord("Failed", blamed=blamed)


def keys_of(owner: str, cluster: str = "c1", runtime: str = "sha/ladder") -> ProbeKeys:
    """An owner's keys on one cluster: a flood of distinct keys is what clusters, runtimes and
    series (or a release that read keys from a status) can make."""
    return ProbeKeys(
        cache_key(owner, cluster, "gpu", runtime, "h100"), avoid_key(owner, cluster), 3, owner
    )


@functools.cache
def _quoted(text: str) -> int:
    return len(json.dumps(text).encode())


@functools.cache
def _owner(value: str) -> str:
    return str(json.loads(value).get("owner", LEGACY_OWNER))


class FakeMaps(MemoryConfigMaps):
    """The book's one ConfigMap (`ops/cache`) in memory; `broken`: every call fails."""

    def __init__(self, data: dict[str, str] | None = None) -> None:
        super().__init__()
        if data is not None:
            self.configmaps[("ops", "cache")] = dict(data)
        self.broken = False

    @property
    def data(self) -> dict[str, str]:
        return self.configmaps.get(("ops", "cache"), {})

    @property
    def reads(self) -> int:
        return self.configmap_reads

    def serialized(self) -> int:
        """Bytes of the ConfigMap as the apiserver is sent it (JSON, values quoted)."""
        head = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "slurmjob-probe-cache", "namespace": "slurmjob-system"},
            "data": {},
        }
        # Each entry as json.dumps writes it in the object ("key": "value", ), measured once.
        return len(json.dumps(head)) + sum(
            _quoted(k) + _quoted(v) + 4 for k, v in self.data.items()
        )

    def owners(self) -> dict[str, int]:
        """Bytes (keys and values) each owner holds."""
        used: dict[str, int] = {}
        for key, value in self.data.items():
            owner = _owner(value)
            used[owner] = used.get(owner, 0) + len(key) + len(value)
        return used

    async def read_configmap(self, namespace: str, name: str) -> dict[str, str] | None:
        data = await super().read_configmap(namespace, name)
        if self.broken:
            raise ConfigMapUnavailable("down")
        return data

    async def merge_configmap(
        self, namespace: str, name: str, data: Mapping[str, str | None]
    ) -> None:
        if self.broken:
            raise ConfigMapUnavailable("down")
        await super().merge_configmap(namespace, name, data)


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime:
        return self.now

    def tick(self) -> None:
        self.now += timedelta(seconds=1)


def book(store: FakeMaps, clock: Clock, **bounds: int) -> ProbeBook:
    return ProbeBook(
        store, "ops", "cache", cache_seconds=3600, avoid_seconds=7200, clock=clock, **bounds
    )


async def test_a_passing_rung_is_cached_until_it_expires_and_read_back_by_a_new_leader() -> None:
    store, clock = FakeMaps(), Clock()
    first = book(store, clock)
    await first.refresh()
    assert first.cached_rung(KEY) is None
    await first.remember(KEYS, passed(2))
    assert first.cached_rung(KEY) == 2
    assert json.loads(store.data[KEY]) == {
        "rung": 2,
        "until": "2026-12-05T13:00:00Z",
        "owner": "tenant:a",
    }
    other = book(store, clock)
    await other.refresh()
    assert other.cached_rung(KEY) == 2
    clock.now += timedelta(seconds=3601)
    assert other.cached_rung(KEY) is None


async def test_memory_is_read_again_only_after_the_reload_interval() -> None:
    store, clock = FakeMaps(), Clock()
    b = book(store, clock)
    for _ in range(5):
        await b.refresh()
    await b.remember(KEYS, passed(0))
    assert store.reads == 1
    clock.now += timedelta(seconds=RELOAD_SECONDS + 1)
    await b.refresh()
    assert store.reads == 2


async def test_a_failed_probe_forgets_the_rung_and_avoids_the_blamed_nodes_for_a_while() -> None:
    store, clock = FakeMaps(), Clock()
    b = book(store, clock)
    await b.refresh()
    await b.remember(KEYS, passed(1))
    await b.remember(KEYS, failed("n2", "n1"))
    assert b.cached_rung(KEY) is None
    assert KEY not in store.data
    assert b.avoided(AVOID) == ("n1", "n2")
    assert json.loads(store.data[AVOID])["owner"] == "tenant:a"
    assert b.avoided(avoid_key("tenant:b", "c1")) == ()
    clock.now += timedelta(seconds=7201)
    assert b.avoided(AVOID) == ()


async def test_entries_not_the_operators_are_ignored() -> None:
    hostile = {
        KEY: json.dumps({"rung": 1, "until": "2026-12-05T13:00:00Z"}),
        "probe-zz": json.dumps({"rung": 1, "until": "2026-12-05T13:00:00Z"}),
        AVOID: json.dumps({"n1;reboot": "2026-12-05T13:00:00Z"}),
        cache_key("x", "c", None, "r", "s"): "not json",
        cache_key("y", "c", None, "r", "s"): json.dumps(
            {"rung": 1, "until": "2026-12-05T13:00:00Z", "owner": "tenant:../../x"}
        ),
        avoid_key("z", "c"): json.dumps({"owner": "tenant:z", "nodes": "n1"}),
    }
    b = book(FakeMaps(hostile), Clock())
    await b.refresh()
    assert b.cached_rung(KEY) == 1
    assert b.cached_rung(cache_key("y", "c", None, "r", "s")) is None
    assert b.avoided(AVOID) == ()
    assert b.avoided(avoid_key("z", "c")) == ()


async def test_entries_the_previous_release_wrote_are_read_as_one_legacy_owner() -> None:
    """Without an owner (the release before issue 42): still read, weighed as one owner of
    their own, and the first to go when the ConfigMap is full and they are the most."""
    legacy = {
        avoid_key(f"old{i}", "c1"): json.dumps({n: f"2026-12-05T13:{i:02d}:00Z" for n in WIDEST})
        for i in range(20)
    }
    legacy[KEY] = json.dumps({"rung": 1, "until": "2026-12-05T13:00:00Z"})
    store, clock = FakeMaps(legacy), Clock()
    b = book(store, clock, capacity=128 * 1024, floor=0)
    await b.refresh()
    assert b.cached_rung(KEY) == 1
    assert len(b.avoided(avoid_key("old0", "c1"))) == 64
    for i in range(10):
        clock.tick()
        await b.remember(keys_of(f"tenant:t{i}"), failed(*WIDEST))
    assert set(store.owners()) == {LEGACY_OWNER} | {f"tenant:t{i}" for i in range(10)}
    assert sum(store.owners().values()) <= 128 * 1024
    assert avoid_key("old0", "c1") not in store.data  # the oldest legacy entries went


async def test_a_configmap_that_cannot_be_read_or_written_costs_a_probe_not_a_job() -> None:
    store, clock = FakeMaps(), Clock()
    store.broken = True
    b = book(store, clock)
    await b.refresh()
    await b.remember(KEYS, passed(0))
    assert b.cached_rung(KEY) == 0  # memory keeps it; never written unread
    for _ in range(5):  # the submissions that follow do not each read again
        await b.refresh()
    assert store.reads == 1
    clock.now += timedelta(seconds=RETRY_SECONDS + 1)
    store.broken = False
    await b.refresh()
    assert store.reads == 2


async def test_nothing_is_written_before_the_configmap_was_read_once() -> None:
    """A full ConfigMap weighed as an empty memory would be written past its bound."""
    store, clock = FakeMaps(), Clock()
    store.broken = True
    b = book(store, clock)
    await b.refresh()
    store.broken = False
    await b.remember(KEYS, failed("n1"))
    assert store.data == {}
    clock.now += timedelta(seconds=RETRY_SECONDS + 1)
    await b.remember(KEYS, failed("n1"))
    assert store.reads == 2
    assert AVOID in store.data


async def test_after_a_write_that_failed_the_configmap_is_read_before_the_next() -> None:
    store, clock = FakeMaps(), Clock()
    b = book(store, clock)
    await b.refresh()
    store.broken = True
    await b.remember(KEYS, failed("n1"))
    store.broken = False
    store.configmaps[("ops", "cache")] = {"probe-" + "0" * 40: "written by another leader"}
    await b.remember(keys_of("tenant:b"), passed(0))
    assert store.reads == 2


async def test_a_configmap_call_that_hangs_is_given_up() -> None:
    class Hanging(FakeMaps):
        async def read_configmap(self, namespace: str, name: str) -> dict[str, str] | None:
            self.configmap_reads += 1
            await asyncio.sleep(3600)
            return None

    store = Hanging()
    b = book(store, Clock())
    with patch("slurmjob_operator.controller.probebook.CALL_TIMEOUT", 0.05):
        async with asyncio.timeout(5):
            await b.refresh()
    assert store.reads == 1
    assert b.cached_rung(KEY) is None


async def test_one_owners_flood_of_failing_probes_evicts_only_its_own_entries() -> None:
    """Issue 42: a flood of failing probes, each blaming 64 nodes of the longest names under
    a key of its own, evicts the flooder's oldest entries; another owner under its share keeps
    its cached rungs and its avoid list, and the ConfigMap never reaches 1 MiB."""
    store, clock = FakeMaps(), Clock()
    b = book(store, clock)  # the defaults: 900 KiB, floor 16 KiB
    await b.refresh()
    quiet = [keys_of("tenant:quiet", runtime=f"r{i}") for i in range(3)]
    for keys in quiet:
        await b.remember(keys, passed(1))
    await b.remember(keys_of("tenant:quiet", runtime="other"), failed(*WIDEST[:8]))
    mine = set(store.data)
    flood = [keys_of("tenant:" + "f" * 63, cluster=f"c{i}") for i in range(400)]
    for keys in flood:
        clock.tick()
        await b.remember(keys, failed(*WIDEST))
        assert store.serialized() < MIB
        assert sum(store.owners().values()) <= PROBE_CAPACITY_BYTES
        assert keys.avoid in store.data  # the entry written now stays
    assert mine <= set(store.data)
    assert [b.cached_rung(k.cache) for k in quiet] == [1, 1, 1]
    assert len(b.avoided(quiet[0].avoid)) == 8
    kept = [k.avoid for k in flood if k.avoid in store.data]
    assert kept == [k.avoid for k in flood[-len(kept) :]]  # the flooder's oldest went
    assert 145 < len(kept) < 155  # about 5.9 KiB each in 900 KiB
    assert store.serialized() > 0.9 * PROBE_CAPACITY_BYTES  # the bound was really reached
    whole = {"apiVersion": "v1", "kind": "ConfigMap", "data": store.data}
    whole["metadata"] = {"name": "slurmjob-probe-cache", "namespace": "slurmjob-system"}
    assert len(json.dumps(whole)) <= store.serialized()


async def test_a_thousand_owners_of_full_avoid_lists_stay_under_one_mib() -> None:
    """More owners than full avoid lists fit (about 140 in 900 KiB): the floor shrinks to one
    entry each, and then a new owner's entry evicts the oldest entry of the largest owner
    (here first the one owner holding three, oldest first)."""
    store, clock = FakeMaps(), Clock()
    b = book(store, clock, capacity=PROBE_CAPACITY_MAX)  # the largest a site may set
    await b.refresh()
    big = [keys_of("tenant:big", cluster=f"c{i}") for i in range(3)]
    for keys in big:
        clock.tick()
        await b.remember(keys, failed(*WIDEST))
    gone: list[tuple[str, str]] = []
    for i in range(1000):
        clock.tick()
        before = dict(store.data)
        used = store.owners()
        keys = keys_of(f"tenant:o{i:04d}")
        await b.remember(keys, failed(*WIDEST))
        assert store.serialized() < MIB
        assert keys.avoid in store.data
        for key in set(before) - set(store.data):
            owner = json.loads(before[key])["owner"]
            assert used[owner] == max(used.values())  # the largest owner's
            gone.append((owner, key))
    assert gone[:2] == [("tenant:big", big[0].avoid), ("tenant:big", big[1].avoid)]
    assert len(gone) > 800
    assert len(store.data) == len(store.owners())  # one entry each
