"""`map_spread`: step a batch's envs with each group's episodes apart, so that the verdict caches
of envs (`code_sandbox`'s `cache_verdicts`) see a program's first run end before its twins ask."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Executor
from typing import Any, TypeVar

T = TypeVar("T")


def spread_order(groups: Sequence[Hashable]) -> list[int]:
    """Positions 0..len(groups)-1 round-robin over the groups: the first episode of every group
    (in the order groups first appear), then the second of every group, and so on.

    E.g. groups [7, 7, 7, 9, 9, 4] -> [0, 3, 5, 1, 4, 2]. Episodes of a group are the same task,
    and their answers repeat (benchmarks/results/verdict_cache.md); run
    in the given order, the threads of a pool all wait on the one run of a repeated answer
    while the other sandbox workers idle."""
    rank: dict[Hashable, int] = {}
    first: dict[Hashable, int] = {}
    keys = []
    for k, g in enumerate(groups):
        first.setdefault(g, len(first))
        keys.append((rank.get(g, 0), first[g], k))
        rank[g] = rank.get(g, 0) + 1
    return [k for _, _, k in sorted(keys)]


def map_spread(pool: Executor, fn: Callable[[Any, Any], T], items: Sequence[Any], args: Sequence[Any],
               groups: Sequence[Hashable]) -> list[T]:
    """`[fn(items[k], args[k]) for k]` run on `pool`, submitted in `spread_order(groups)`;
    returned in the given order. Raises what `fn` raises (as `Executor.map`)."""
    order = spread_order(groups)
    done = dict(zip(order, pool.map(lambda k: fn(items[k], args[k]), order)))
    return [done[k] for k in range(len(items))]
