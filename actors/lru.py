"""A dictionary with a cap: every cache the node keeps for longer than a request.

A node serves for days while scopes, threads and members accumulate, so no
cache may grow with them: each one is an :class:`Lru` with a fixed number of
entries that forgets the least recently used entry to take a new one. The
caps are documented in docs/operations.md; :func:`sizes` lists every cache
alive in the process (its name and entries), which ``/metrics`` reports.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar, overload

K = TypeVar("K")
V = TypeVar("V")
D = TypeVar("D")

_alive: weakref.WeakSet[Lru[object, object]] = weakref.WeakSet()


class Lru(Generic[K, V]):
    """At most ``cap`` entries; a hit makes its entry the most recently used."""

    __slots__ = ("__weakref__", "_entries", "cap", "name")

    def __init__(self, name: str, cap: int) -> None:
        if cap < 1:
            raise ValueError("an Lru holds at least one entry")
        self.name = name
        self.cap = cap
        self._entries: OrderedDict[K, V] = OrderedDict()
        _alive.add(self)  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    @overload
    def get(self, key: K) -> V | None: ...
    @overload
    def get(self, key: K, default: D) -> V | D: ...
    def get(self, key: K, default: object = None) -> object:
        entries = self._entries
        try:
            value = entries[key]
        except KeyError:
            return default
        entries.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        entries = self._entries
        entries[key] = value
        entries.move_to_end(key)
        if len(entries) > self.cap:
            entries.popitem(last=False)

    def intern(self, key: K, make: Callable[[], V]) -> V:
        """The value kept for ``key``, made and kept on a miss: equal values
        read again share one object."""
        found = self.get(key)
        if found is None:
            found = make()
            self.put(key, found)
        return found

    def pop(self, key: K) -> V | None:
        return self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()


def sizes() -> dict[str, int]:
    """Entries of every live cache, summed by name."""
    found: dict[str, int] = {}
    for cache in list(_alive):
        found[cache.name] = found.get(cache.name, 0) + len(cache)
    return found
