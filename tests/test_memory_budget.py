"""The memory budget: every long-lived cache has a cap, and over the memory
ceiling the node passivates idle actors, least recently used first."""

from __future__ import annotations

import gc
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from actors import lru
from actors.lru import Lru
from node.memory import CollectorWatch, MemoryGovernor, limit_allocator_arenas, rss_bytes
from node.registry import ActorRegistry
from tests.nodes import World, make_channel, running_node
from tests.test_metrics import http_get, samples


def test_an_lru_keeps_its_cap_and_forgets_the_least_recently_used() -> None:
    cache: Lru[str, int] = Lru("test_cache", 3)
    for i, key in enumerate("abc"):
        cache.put(key, i)
    assert cache.get("a") == 0  # a is now the most recent
    cache.put("d", 3)
    assert len(cache) == 3
    assert "b" not in cache
    assert [cache.get(k) for k in "acd"] == [0, 2, 3]
    cache.put("a", 9)  # an update, not a new entry
    assert len(cache) == 3
    assert cache.get("a") == 9
    assert lru.sizes()["test_cache"] == 3


def test_every_cache_of_the_node_is_capped() -> None:
    # Importing the node brings every module-level cache to life; each is an Lru.
    import node.app  # noqa: F401

    names = set(lru.sizes())
    assert {"members_interned", "memberships_interned", "search_sizes"} <= names


class _FakeActor:
    def __init__(self, scope_id: str, last: float, idle: bool = True) -> None:
        self.scope_id = scope_id
        self.last_batch_at = last
        self.idle = idle
        self.stopped = False

    def passivate_if_idle(self) -> bool:
        if not self.idle:
            return False
        self.stopped = True
        return True


def _registry_with(actors: list[_FakeActor]) -> ActorRegistry:
    registry = ActorRegistry.__new__(ActorRegistry)
    registry._actors = {a.scope_id: a for a in actors}  # type: ignore[misc]
    return registry


def test_over_the_ceiling_the_least_recently_used_idle_actors_stop() -> None:
    actors = [_FakeActor(f"s{i}", last=float(i)) for i in range(8)]
    actors[0].idle = False  # the oldest has work queued: skipped
    registry = _registry_with(actors)
    rss = [100]
    governor = MemoryGovernor(registry, 150, read_rss=lambda: rss[0])
    assert governor.check() == 0  # under the ceiling: nothing stops
    rss[0] = 200
    assert governor.check() == 2  # a quarter of 8
    assert [a.scope_id for a in actors if a.stopped] == ["s1", "s2"]
    assert len(registry) == 6
    assert governor.passivated == 2
    assert governor.sweeps == 1
    # Memory the allocator keeps after a sweep does not start another at once.
    assert governor.check() == 0
    rss[0] = 200 + 150 // 50 + 1
    assert governor.check() == 1  # past where the last sweep left it: a quarter of 6


async def test_a_node_over_its_ceiling_passivates_and_reloads_on_the_next_send(
    database_url: str, tmp_path: Path
) -> None:
    # A ceiling of 1 MiB: every check finds the node over it.
    async with running_node(database_url, tmp_path, memory_ceiling_mb=1) as node:
        world = await World.create(node)
        ann = await world.member("ann")
        async with world.client(ann) as client:
            await make_channel(client, "ops")
            await client.send("#ops", "one", clientMessageId="m1")
            registry = node.services.registry
            assert len(registry) >= 1
            while len(registry):
                MemoryGovernor(registry, 2**20).check()  # a fresh one sweeps at once
                await trio.sleep(0)
            # The scope's next send starts a fresh actor from the database.
            second = await client.send("#ops", "two", clientMessageId="m2")
            assert second["acceptedSeq"] == 2
            again = await client.send("#ops", "one", clientMessageId="m1")
            assert again["state"] == "already_sent"
        gc.collect()  # the node runs in this process: its watch sees this one
        _, text = await http_get(node.services.port, "/metrics")
    assert samples(text, "scopenode_memory_ceiling_bytes")[()] == 2**20
    assert samples(text, "scopenode_gc_full_collections")[()] >= 1
    assert samples(text, "scopenode_gc_full_pause_seconds")[()] > 0
    assert samples(text, "scopenode_gc_longest_full_pause_seconds")[()] > 0
    assert samples(text, "scopenode_resident_bytes")[()] > 0
    assert samples(text, "scopenode_cache_entries")[(("cache", "members_interned"),)] >= 1


async def test_a_live_actor_keeps_no_nursery_it_started_in(
    database_url: str, tmp_path: Path
) -> None:
    # Every object a live actor keeps is walked by each full collection.
    def nurseries() -> int:
        gc.collect()
        return sum(isinstance(o, trio.Nursery) for o in gc.get_objects())

    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        ann = await world.member("ann")
        async with world.client(ann) as client:
            await make_channel(client, "first")
            await client.send("#first", "hello", clientMessageId="first")
            actors, before = len(node.services.registry), nurseries()
            for i in range(24):
                await make_channel(client, f"c{i}")
                await client.send(f"#c{i}", "hello", clientMessageId=f"m{i}")
            assert len(node.services.registry) >= actors + 24
            assert nurseries() - before < 12


def test_the_collector_watch_counts_full_collections_only_while_installed() -> None:
    watch = CollectorWatch()
    watch.install()
    try:
        gc.collect(0)
        assert watch.full_collections == 0
        gc.collect()
        gc.collect()
    finally:
        watch.uninstall()
    assert watch.full_collections == 2
    assert 0 < watch.longest_full_pause_s <= watch.full_pause_s
    gc.collect()
    assert watch.full_collections == 2


def test_settling_the_heap_freezes_what_the_process_holds_once() -> None:
    # In a fresh interpreter: freezing this test process would keep its garbage.
    probe = "import gc; from node.memory import settle_heap; "
    probe += "print(settle_heap(), gc.get_freeze_count() > 10_000, settle_heap())"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == ["True", "True", "False"]


def test_the_resident_set_is_read_from_proc() -> None:
    found = rss_bytes()
    assert found is not None
    assert 10 * 2**20 < found < 10 * 2**30


def test_the_allocator_arenas_are_limited_on_glibc() -> None:
    if platform.libc_ver()[0] != "glibc":
        pytest.skip("mallopt is glibc's")
    assert limit_allocator_arenas(2)
