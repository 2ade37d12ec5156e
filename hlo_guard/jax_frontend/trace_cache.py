"""A bounded, least-recently-used cache of traced programs.

A traced program holds its jaxpr, whose constants are whatever the function
closed over -- possibly hundreds of MB.  One entry per input signature would
grow without bound in eager code called with many shapes, so the cache keeps
the ``maxsize`` most recently used signatures -- fewer when their constants
together exceed ``max_bytes`` (an array shared by several traces, like the
caller's own parameters, counts once; arrays computed while tracing are new in
every trace) -- and ``jax.clear_caches()`` empties it (as it empties JAX's
own jit caches).  The most recent trace is always kept.

:class:`WeakCacheByJaxpr` is the other kind of cache here: entries weakly
keyed by a library function's jaxpr, for the rewrite's per-body work shared
across traces.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

from hlo_guard.errors import GuardUsageError
from hlo_guard.jax_frontend.compat import register_with_clear_caches

#: traces kept per guarded function; each holds the function's closed-over constants
DEFAULT_CACHE_SIZE = 16
#: bytes of constants the kept traces may hold together (each array counted once,
#: however many traces share it): arrays computed while tracing are new per trace
DEFAULT_CACHE_BYTES = 512 * 2**20
#: smaller arrays are not worth weighing
_WEIGH_FROM = 4096


def arrays_held(closed_jaxpr) -> dict[int, tuple[Any, int]]:
    """{id: (array, nbytes)} of the arrays a closed jaxpr keeps alive: its
    constants and those of every nested closed jaxpr, and large literals."""
    found: dict[int, tuple[Any, int]] = {}
    seen = set()

    def add(x):
        n = int(getattr(x, "nbytes", 0) or 0)
        if n >= _WEIGH_FROM:
            found[id(x)] = (x, n)

    def walk_params(params):
        for p in params.values():
            for q in p if isinstance(p, (tuple, list)) else (p,):
                if hasattr(q, "consts") and hasattr(q, "jaxpr"):
                    walk_closed(q)
                elif hasattr(q, "eqns") and hasattr(q, "invars"):
                    walk_open(q)

    def walk_open(jaxpr):
        if id(jaxpr) in seen:
            return
        seen.add(id(jaxpr))
        for eqn in jaxpr.eqns:
            for v in eqn.invars:
                if hasattr(v, "val"):
                    add(v.val)
            walk_params(eqn.params)

    def walk_closed(closed):
        for c in closed.consts:
            add(c)
        walk_open(closed.jaxpr)

    walk_closed(closed_jaxpr)
    return found


class CacheInfo(NamedTuple):
    hits: int
    misses: int
    maxsize: int
    currsize: int


class TraceCache:
    """``functools.lru_cache``-like: ``get``/``put``, ``cache_info()``, ``cache_clear()``."""

    def __init__(
        self,
        maxsize: int = DEFAULT_CACHE_SIZE,
        what: str = "hlo_guard trace cache",
        max_bytes: int | None = DEFAULT_CACHE_BYTES,
        weigh: Callable[[Any], dict[int, tuple[Any, int]]] | None = None,
    ):
        if isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 0:
            raise GuardUsageError(
                f"cache_size must be a non-negative int (0 disables the cache), got {maxsize!r}"
            )
        if max_bytes is not None and (
            isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0
        ):
            raise GuardUsageError(
                f"cache_bytes must be a non-negative int or None, got {max_bytes!r}"
            )
        self.maxsize = maxsize
        self.max_bytes = max_bytes
        self._weigh = weigh
        self._weights: dict[Hashable, dict[int, tuple[Any, int]]] = {}
        self._entries: OrderedDict[Hashable, Any] = OrderedDict()
        self.hits = self.misses = 0
        self.clears_with_jax = register_with_clear_caches(self, what)

    def get(self, key: Hashable) -> Any | None:
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
        if self._weigh is not None and self.max_bytes is not None:
            self._weights[key] = self._weigh(value)
        while self._over():
            old, _ = self._entries.popitem(last=False)
            self._weights.pop(old, None)

    def _over(self) -> bool:
        if len(self._entries) > self.maxsize:
            return True
        return (
            self._weigh is not None
            and self.max_bytes is not None
            and len(self._entries) > 1
            and self.nbytes() > self.max_bytes
        )

    def nbytes(self) -> int:
        """Bytes of the arrays the kept traces hold, each array counted once."""
        distinct: dict[int, int] = {}
        for held in self._weights.values():
            for i, (_, n) in held.items():
                distinct[i] = n
        return sum(distinct.values())

    def __len__(self) -> int:
        return len(self._entries)

    def values(self):
        return list(self._entries.values())

    # -- the interface jax.clear_caches() expects ------------------------------------
    def cache_clear(self) -> None:
        self._entries.clear()
        self._weights.clear()

    def cache_info(self) -> CacheInfo:
        return CacheInfo(self.hits, self.misses, self.maxsize, len(self._entries))

    def cache_keys(self):
        return list(self._entries.keys())


class WeakCacheByJaxpr:
    """A cache weakly keyed by jaxpr objects (a library's function bodies,
    which JAX's own caches hand to every trace): an entry lives as long as
    its jaxpr, and ``jax.clear_caches()`` empties it, as it empties the caches
    that keep those jaxprs alive.  Subclasses fill ``entries``."""

    def __init__(self, what: str):
        self.entries: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.hits = self.misses = 0
        register_with_clear_caches(self, what)

    # -- the interface jax.clear_caches() expects ------------------------------------
    def cache_clear(self) -> None:
        self.entries = weakref.WeakKeyDictionary()

    def cache_info(self):
        return (self.hits, self.misses, len(self.entries))

    def cache_keys(self):
        return []
