"""docs/algos.md's offline-DPO example runs as written against the class-based algorithms (a
new-user pass found the old module-based one broken after the refactor)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from agentrl.models.tiny import load_model

DOC = Path(__file__).resolve().parents[2] / "docs" / "algos.md"


def _example() -> str:
    text = DOC.read_text()
    start = text.index("```python\nfrom agentrl.algos import get_algorithm")
    return text[start + len("```python\n"):text.index("```\n", start + 10)]


def test_the_offline_dpo_example_of_the_docs_runs(tiny_model_dir, tmp_path, monkeypatch):
    model, tok = load_model(tiny_model_dir)
    (tmp_path / "prefs.jsonl").write_text("".join(
        json.dumps({"prompt": "Write a Python function `add_seven(x)` that returns x plus 7.",
                    "chosen": "def add_seven(x):\n    return x + 7", "rejected": "no"}) + "\n"
        for _ in range(4)))
    monkeypatch.chdir(tmp_path)
    before = [p.detach().clone() for p in model.parameters()]
    ns = {"model": model, "tok": tok}
    exec(_example(), ns)  # noqa: S102 - the documented example itself
    m = ns["metrics"]
    assert math.isfinite(m["dpo_loss"]) and abs(m["dpo_loss"] - math.log(2)) < 1e-4  # policy = reference
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
