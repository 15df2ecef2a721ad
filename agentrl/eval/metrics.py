"""pass@k: the unbiased estimator of Chen et al. (2021), "Evaluating Large Language Models
Trained on Code" (the Codex / HumanEval paper), section 2.1 and its Figure 3.

With `n` samples of a problem of which `c` are correct, the probability that at least one of
`k` samples drawn without replacement from the `n` is correct is

    pass@k = 1 - C(n - c, k) / C(n, k)

Binomials overflow floats long before n = 1000 (C(1000, 500) ~ 1e299), so it is computed as the
paper's numerically stable product

    C(n - c, k) / C(n, k) = prod_{i = n - c + 1}^{n} (1 - k / i)

(each factor is in [0, 1), so the product never overflows; relative error ~ c * 1e-16).
Fewer samples than k (n < k) has no estimate: `pass_at_k` raises, `pass_at_k_many` excludes
the problem and counts it (case E5). Nothing here imports torch.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np


def _as_int(name: str, x: Any) -> int:
    if isinstance(x, bool):
        raise TypeError(f"pass_at_k: {name} must be an int, got a bool")
    try:
        return operator.index(x)  # int, numpy integers; never a float
    except TypeError:
        raise TypeError(f"pass_at_k: {name} must be an int, got {type(x).__name__} {x!r}") from None


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem: `1 - C(n - c, k) / C(n, k)`.

    Args:
        n: samples drawn for the problem (>= 1).
        c: correct samples among them (0 <= c <= n).
        k: the k of pass@k (>= 1, <= n).

    Returns:
        The probability in [0, 1] that a random k-subset of the n samples holds a correct one.
        1.0 exactly when `n - c < k` (every k-subset holds a correct sample); 0.0 when c = 0.

    Raises:
        ValueError: `k > n` (fewer samples than k: no estimate, case E5), `n < 1`, `k < 1`,
            or `c` outside [0, n].
        TypeError: an argument is not an integer.

    Source: Chen et al. 2021, arXiv:2107.03374, eq. (1) and Figure 3 (product form).

    Examples (cases E1-E4): `pass_at_k(5, 0, 1) == 0.0`, `pass_at_k(5, 2, 2) == 0.7`,
    `pass_at_k(10, 3, 1) == 0.3` (to 1e-15), `pass_at_k(5, 5, 3) == 1.0`.
    """
    n, c, k = _as_int("n", n), _as_int("c", c), _as_int("k", k)
    if n < 1:
        raise ValueError(f"pass_at_k: n must be >= 1 sample, got n={n}")
    if k < 1:
        raise ValueError(f"pass_at_k: k must be >= 1, got k={k}")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: c must be in [0, n={n}], got c={c}")
    if k > n:
        raise ValueError(f"pass_at_k: k={k} > n={n} samples: pass@{k} needs at least {k} samples "
                         "per problem (draw more samples or exclude the problem)")
    if n - c < k:
        return 1.0
    fail = 1.0
    for i in range(n - c + 1, n + 1):
        fail *= 1.0 - k / i
    return 1.0 - fail


def pass_at_k_many(ns: Sequence[int] | int, cs: Sequence[int], k: int) -> tuple[np.ndarray, int]:
    """pass@k of many problems, excluding those with fewer than `k` samples.

    Args:
        ns: samples per problem, shape (P,), or one int for all problems.
        cs: correct samples per problem, shape (P,).
        k: the k of pass@k (>= 1).

    Returns:
        `(values, excluded)`: `values` is a float64 array of shape (P - excluded,) with
        `pass_at_k(n_p, c_p, k)` of each problem that has `n_p >= k`, in input order;
        `excluded` is the number of problems left out because `n_p < k` (case E5: they are
        counted, never given a number). The benchmark score is `values.mean()` when
        `values.size > 0`.

    Raises:
        ValueError: `ns` and `cs` differ in length, `k < 1`, or a problem has `c` outside
            [0, n] or `n < 1` (see `pass_at_k`).
        TypeError: a non-integer count.
    """
    cs = list(cs)
    ns = [ns] * len(cs) if isinstance(ns, (int, np.integer)) and not isinstance(ns, bool) else list(ns)  # type: ignore[arg-type]
    if len(ns) != len(cs):
        raise ValueError(f"pass_at_k_many: {len(ns)} sample counts but {len(cs)} correct counts")
    k = _as_int("k", k)
    if k < 1:
        raise ValueError(f"pass_at_k_many: k must be >= 1, got k={k}")
    values, excluded = [], 0
    for n, c in zip(ns, cs, strict=True):
        n, c = _as_int("n", n), _as_int("c", c)
        if n < k and 0 <= c <= n:
            excluded += 1
            continue
        values.append(pass_at_k(n, c, k))
    return np.asarray(values, dtype=np.float64), excluded


def mean_se(values: Sequence[float] | np.ndarray) -> tuple[float | None, float | None]:
    """The mean of per-task values and its standard error over tasks,
    `std(values, ddof=1) / sqrt(m)` for m values (the spread a different draw of m tasks would
    give; Miller 2024, "Adding Error Bars to Evals", eq. 1). `(None, None)` for no value, SE
    None for one."""
    a = np.asarray(values, dtype=float)
    return (float(a.mean()) if a.size else None,
            float(a.std(ddof=1) / math.sqrt(a.size)) if a.size > 1 else None)
