"""`agentrl.rollout.spread`: a batch's env steps submitted round-robin over groups, results in
the batch's order."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from agentrl.rollout.spread import map_spread, spread_order


def test_spread_order_by_hand():
    assert spread_order([7, 7, 7, 9, 9, 4]) == [0, 3, 5, 1, 4, 2]
    assert spread_order([0] * 4) == [0, 1, 2, 3]  # one group: as given
    assert spread_order([1, 2, 3]) == [0, 1, 2]  # all distinct: as given
    assert spread_order([5, 3, 5, 3]) == [0, 1, 2, 3]  # interleaved already
    assert spread_order([]) == []
    n = 16 * 8  # the main job's batch: 16 tasks x 8 samples, groups contiguous
    order = spread_order([k // 8 for k in range(n)])
    assert order[:16] == [8 * g for g in range(16)] and sorted(order) == list(range(n))


def test_map_spread_submits_spread_returns_in_order():
    seen: list[int] = []
    with ThreadPoolExecutor(1) as pool:  # one thread: calls run in submission order
        out = map_spread(pool, lambda i, a: seen.append(i) or (i, a), [10, 11, 12, 13], "abcd", [0, 0, 1, 1])
    assert seen == [10, 12, 11, 13]
    assert out == [(10, "a"), (11, "b"), (12, "c"), (13, "d")]


def test_map_spread_raises_what_fn_raises():
    def fn(i, a):
        if i == 2:
            raise KeyError("boom")
        return i

    with ThreadPoolExecutor(2) as pool, pytest.raises(KeyError):
        map_spread(pool, fn, [1, 2, 3], [None] * 3, [0, 1, 2])
