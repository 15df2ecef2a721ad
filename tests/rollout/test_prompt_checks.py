"""An engine refuses a prompt it cannot sample from before sampling anything, naming the
prompt: an empty one, or one with an id outside the vocabulary (`HFEngine`; vLLM's engine runs
the same check)."""

from __future__ import annotations

import re

import pytest

from agentrl.rollout.engines.base import SamplingParams
from agentrl.rollout.engines.hf import HFEngine


def test_bad_prompts_are_named(tiny_model_dir):
    engine = HFEngine(tiny_model_dir, torch_threads=1)
    vocab = engine._vocab
    assert engine.generate([], SamplingParams()) == []
    for prompts, msg in (([[5], []], "prompt 1 is empty"),
                         ([[5, vocab]], f"prompt 0 has a token id outside [0, {vocab})"),
                         ([[5], [3, -1]], f"prompt 1 has a token id outside [0, {vocab})"),
                         ([[], [vocab]], "prompt 0 is empty")):
        with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
            engine.generate(prompts, SamplingParams(max_tokens=2))
