"""The node's memory ceiling: passivate scope actors, least recently used first.

Actors are the node's largest cache (a roster, a tail of recent sends and an
idempotency window each) and every one can be rebuilt from the database, so
when the process's resident memory passes ``Settings.memory_ceiling_mb`` the
governor stops a quarter of the idle actors, oldest batch first, and hands
the freed pages back to the operating system; it sweeps again when the
resident set grows past where the last sweep left it. Every
other cache has a fixed cap (``actors/lru.py``; docs/operations.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import gc
import itertools
import os
import time
from collections.abc import Callable

import structlog
import trio

from node.registry import ActorRegistry

log = structlog.get_logger(__name__)

CHECK_EVERY_S = 5.0
# Every this many checks (a minute) freed heap pages go back to the system
# even under the ceiling: the resident set then shows what the node holds.
TRIM_EVERY_CHECKS = 12
_M_ARENA_MAX = -8  # glibc's malloc.h
# A sweep stops this share of the actors at most; the next check sees the effect.
SWEEP_SHARE = 0.25
# After a sweep the next one waits for the resident set to grow by a fiftieth
# of the ceiling past where the sweep left it.
SETTLE_SHARE = 50
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int | None:
    """This process's resident set (Linux ``/proc``); None elsewhere."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


@functools.cache
def _libc() -> ctypes.CDLL | None:
    # Looked up once: find_library runs `ldconfig -p` in a subprocess.
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name else None


def limit_allocator_arenas(arenas: int = 2) -> bool:
    """glibc's ``mallopt(M_ARENA_MAX, arenas)``, before any thread starts.

    glibc gives each thread that allocates (trio's worker threads: file I/O of
    attachments, name lookups) an arena of its own, up to eight per core; what
    one frees another never reuses, and the resident set creeps up while the
    heap does not grow. Returns False where the C library has no mallopt.
    """
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None) if libc is not None else None
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(_M_ARENA_MAX, arenas))


def _malloc_trim() -> Callable[[], None]:
    """glibc's ``malloc_trim(0)``: free heap pages back to the system (a no-op
    where the C library has none)."""
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    if trim is None:
        return lambda: None
    trim.argtypes = [ctypes.c_size_t]
    return lambda: trim(0)


def settle_heap() -> bool:
    """Move what the process holds once the node is up (modules, classes, the
    node's own services) out of the cyclic collector's way (``gc.freeze``).

    A full collection walks every object the collector tracks and stops the
    node while it does: at start about 70,000 objects, 36 ms here, paid again
    by every full collection for the life of the process, for objects that
    never become garbage. ``scopenode serve`` calls it once its node is ready
    (``serve_node``'s ``on_ready``); a process that embeds nodes decides for
    itself. Only the first call freezes; returns whether this one did.
    """
    if gc.get_freeze_count():
        return False
    gc.collect()
    gc.freeze()
    return True


class CollectorWatch:
    """How often the cyclic collector stopped the node for a full collection,
    and for how long (``gc.callbacks``): the pauses that grow with the heap."""

    def __init__(self) -> None:
        self.full_collections = 0
        self.full_pause_s = 0.0
        self.longest_full_pause_s = 0.0
        self._started = 0.0

    def install(self) -> None:
        gc.callbacks.append(self._observe)

    def uninstall(self) -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._observe)

    def _observe(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
            return
        pause = time.perf_counter() - self._started
        self.full_collections += 1
        self.full_pause_s += pause
        self.longest_full_pause_s = max(self.longest_full_pause_s, pause)


class MemoryGovernor:
    def __init__(
        self,
        registry: ActorRegistry,
        ceiling_bytes: int,
        *,
        read_rss: Callable[[], int | None] = rss_bytes,
    ) -> None:
        self._registry = registry
        self.ceiling_bytes = ceiling_bytes
        self._read_rss = read_rss
        self._trim = _malloc_trim()
        self.sweeps = 0
        self.passivated = 0
        self.last_rss = read_rss() or 0
        self._settled = 0

    def check(self) -> int:
        """One look at the resident set; passivates when over the ceiling.
        Returns the actors stopped."""
        rss = self._read_rss()
        if rss is None:
            return 0
        self.last_rss = rss
        if rss <= max(self.ceiling_bytes, self._settled) or not len(self._registry):
            return 0
        count = max(1, int(len(self._registry) * SWEEP_SHARE))
        stopped = self._registry.passivate_least_recent(count)
        gc.collect()
        self._trim()
        self.sweeps += 1
        self.passivated += stopped
        after = self._read_rss()
        # Freed memory the allocator keeps (fragmented pages) is reused by the
        # next actors without showing in the resident set: the next sweep waits
        # until the node grows past where this one left it, instead of
        # passivating a quarter of the actors every few seconds for nothing.
        self._settled = (after or rss) + self.ceiling_bytes // SETTLE_SHARE
        log.warning(
            "memory_ceiling_sweep",
            rss_mb=rss // 2**20,
            after_mb=(after or 0) // 2**20,
            ceiling_mb=self.ceiling_bytes // 2**20,
            passivated=stopped,
            actors=len(self._registry),
        )
        return stopped

    async def run(self) -> None:
        for n in itertools.count(1):
            await trio.sleep(CHECK_EVERY_S)
            if not self.check() and n % TRIM_EVERY_CHECKS == 0:
                self._trim()
