"""Calling user reward functions safely (cases R3, R4).

A reward function takes a batch, `fn(prompts, completions, **kwargs) -> Sequence[float]`, one
value per completion (None for "no reward"). `call_reward_fn`:
- raises ValueError when the function returns the wrong number of values (R4: a programming
  error, fail loudly, naming the function and the expected length);
- never lets one bad sample kill the run (R3): if the batch call raises, each sample is scored
  alone, and a sample whose call raises (or whose value is None, NaN or not a number) gets NaN
  and its error recorded. NaN rewards are excluded from group statistics downstream.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

RewardFn = Callable[..., Sequence[Any]]


@dataclass
class RewardBatch:
    """Values of one reward function over a batch.

    Attributes:
        values: one float per completion; NaN where the reward failed.
        errors: sample index -> reason, for every NaN value.
    """

    values: list[float]
    errors: dict[int, str] = field(default_factory=dict)


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


def _check_len(fn: Any, out: Any, n: int) -> list[Any]:
    try:
        vals = list(out)
    except TypeError:
        raise ValueError(f"reward function {_name(fn)!r} returned {type(out).__name__}, expected a sequence of "
                         f"{n} values (one per completion)") from None
    if len(vals) != n:
        raise ValueError(f"reward function {_name(fn)!r} returned {len(vals)} values for {n} completions; "
                         f"it must return exactly {n} (one per completion)")
    return vals


def _as_float(v: Any) -> tuple[float, str | None]:
    if v is None:
        return math.nan, "reward is None"
    try:
        x = float(v)
    except (TypeError, ValueError):
        return math.nan, f"reward {v!r} is not a number"
    return (x, None) if math.isfinite(x) else (math.nan, f"reward {x} is not finite")


def call_reward_fn(fn: RewardFn, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> RewardBatch:
    """Score `completions` with `fn`, isolating failures per sample.

    Args:
        fn: `fn(prompts, completions, **kwargs) -> Sequence[float | None]`.
        prompts: one prompt per completion.
        completions: the completions.
        **kwargs: per-sample lists (sliced alongside) or shared values, passed to `fn`.

    Returns:
        A `RewardBatch` (NaN + reason for failed samples).

    Raises:
        ValueError: `prompts` and `completions` differ in length, or `fn` returns a number of
            values different from the number of completions (case R4).
    """
    n = len(completions)
    if len(prompts) != n:
        raise ValueError(f"{len(prompts)} prompts for {n} completions")
    try:
        out = fn(prompts, completions, **kwargs)
    except Exception:  # noqa: BLE001 - isolate the failing sample(s): score one at a time
        return _per_sample(fn, prompts, completions, kwargs)
    result = RewardBatch([])
    for i, v in enumerate(_check_len(fn, out, n)):
        _put(result, i, v)
    return result


def _put(result: RewardBatch, i: int, v: Any) -> None:
    x, err = _as_float(v)
    result.values.append(x)
    if err:
        result.errors[i] = err


def _per_sample(fn: RewardFn, prompts: Sequence[Any], completions: Sequence[Any],
                kwargs: dict[str, Any]) -> RewardBatch:
    n = len(completions)
    result = RewardBatch([])
    for i in range(n):
        kw = {k: ([v[i]] if isinstance(v, list) and len(v) == n else v) for k, v in kwargs.items()}
        try:
            out = fn([prompts[i]], [completions[i]], **kw)
        except Exception as e:  # noqa: BLE001 - contract 7: a raising reward is a recorded NaN
            result.values.append(math.nan)
            result.errors[i] = f"{_name(fn)} raised {type(e).__name__}: {e}"
            continue
        _put(result, i, _check_len(fn, out, 1)[0])
    return result
