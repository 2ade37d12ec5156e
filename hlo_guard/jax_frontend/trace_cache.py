"""A bounded, least-recently-used cache of traced programs.

A traced program holds its jaxpr, whose constants are whatever the function
closed over -- possibly hundreds of MB.  One entry per input signature would
grow without bound in eager code called with many shapes, so the cache keeps
the ``maxsize`` most recently used signatures, and ``jax.clear_caches()``
empties it (as it empties JAX's own jit caches).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Hashable, NamedTuple, Optional

from hlo_guard.errors import GuardUsageError
from hlo_guard.jax_frontend.compat import register_with_clear_caches

#: traces kept per guarded function; each holds the function's closed-over constants
DEFAULT_CACHE_SIZE = 16


class CacheInfo(NamedTuple):
    hits: int
    misses: int
    maxsize: int
    currsize: int


class TraceCache:
    """``functools.lru_cache``-like: ``get``/``put``, ``cache_info()``, ``cache_clear()``."""

    def __init__(self, maxsize: int = DEFAULT_CACHE_SIZE, what: str = "hlo_guard trace cache"):
        if isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 0:
            raise GuardUsageError(
                f"cache_size must be a non-negative int (0 disables the cache), got {maxsize!r}")
        self.maxsize = maxsize
        self._entries: "OrderedDict[Hashable, Any]" = OrderedDict()
        self.hits = self.misses = 0
        self.clears_with_jax = register_with_clear_caches(self, what)

    def get(self, key: Hashable) -> Optional[Any]:
        value = self._entries.get(key)
        if value is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(key)
        return value

    def put(self, key: Hashable, value: Any) -> None:
        if self.maxsize == 0:
            return
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.maxsize:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)

    def values(self):
        return list(self._entries.values())

    # -- the interface jax.clear_caches() expects ------------------------------------
    def cache_clear(self) -> None:
        self._entries.clear()

    def cache_info(self) -> CacheInfo:
        return CacheInfo(self.hits, self.misses, self.maxsize, len(self._entries))

    def cache_keys(self):
        return list(self._entries.keys())
