"""Evaluation: pass@k (`pass_at_k`, `pass_at_k_many`), the harness (`run_eval`) and reports
(`summarize`, `compare`). See docs/eval.md.

`pass_at_k` and `pass_at_k_many` import only numpy; `run_eval`, `compare` and `summarize` are
imported on first use (the harness imports torch through the agent loop).
"""

from __future__ import annotations

from typing import Any

from agentrl.eval import report
from agentrl.eval.harness import run_eval
from agentrl.eval.metrics import pass_at_k, pass_at_k_many

__all__ = ["pass_at_k", "pass_at_k_many", "run_eval", "compare", "summarize"]


def __getattr__(name: str) -> Any:
    if name == "run_eval":
        return run_eval
    if name in ("compare", "summarize"):
        return getattr(report, name)
    raise AttributeError(f"module 'agentrl.eval' has no attribute {name!r}")
