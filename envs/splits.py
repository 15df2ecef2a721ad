"""Train/held-out splits keyed on a task's content, so that the same problem under two ids never
lands in both splits (OpenRLHF #1089: HumanEval plus relabelled copies of its problems put 51
problems in both).

A task's split is a fixed hash of its id (`split_fraction(id) < heldout_fraction`: held out),
as before, except that tasks with the same *content key* (the problem with its whitespace
normalised; for code, plus the entry point) form a group and every member takes the split of
the group's canonical member, its smallest id (string order). A dataset without duplicates
therefore splits exactly as it did when the id alone was hashed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def split_fraction(key: str) -> float:
    """A stable pseudo-random number in [0, 1) for `key` (SHA-256; the same on every machine
    and Python process, unlike `hash`)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2.0**64


def normalise_text(text: str) -> str:
    """`text` with every run of whitespace made one space and the ends stripped."""
    return " ".join(text.split())


def canonical_ids(ids: Sequence[str], keys: Sequence[str]) -> list[str]:
    """For each task (its id and content key, aligned lists), the smallest id among the tasks
    with its content key: the id its split is hashed from."""
    first: dict[str, str] = {}
    for i, k in zip(ids, keys, strict=True):
        first[k] = min(first.get(k, i), i)
    return [first[k] for k in keys]


def duplicate_groups(ids: Sequence[str], keys: Sequence[str]) -> list[list[str]]:
    """The groups (ids in input order) of two or more tasks sharing a content key, in the order
    of their first member."""
    groups: dict[str, list[str]] = {}
    for i, k in zip(ids, keys, strict=True):
        groups.setdefault(k, []).append(i)
    return [g for g in groups.values() if len(g) > 1]


def duplicates_line(name: str, ids: Sequence[str], keys: Sequence[str]) -> str | None:
    """One line reporting a file's duplicate problems (None when it has none): how many tasks
    repeat another task's problem, in how many groups, an example, and the split rule."""
    groups = duplicate_groups(ids, keys)
    if not groups:
        return None
    extra = sum(len(g) - 1 for g in groups)
    return (f"[dataset] {name}: {extra} task(s) repeat the problem of another task ({len(groups)} "
            f"problem(s) under several ids, e.g. {' = '.join(groups[0][:3])}); each such group is kept "
            "in one split, the split of its smallest id")


def heldout_mask(ids: Sequence[str], keys: Sequence[str], heldout_fraction: float) -> list[bool]:
    """Is each task held out: `split_fraction` of its group's canonical id < `heldout_fraction`."""
    return [split_fraction(c) < heldout_fraction for c in canonical_ids(ids, keys)]
