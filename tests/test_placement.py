"""Placement of the models of a run (issue #23): the rollout engine's dtype in-process, the
reference and reward models on Ray workers of their own, the pipeline, the measured bf16 gap
and the cost profile."""

from __future__ import annotations

import pytest
import torch

from agentrl.config import load_config


def _engine(tiny_model_dir, tmp_path, dtype):
    from agentrl.model import load_model
    from agentrl.run import make_engine

    cfg = load_config(overrides=[f"model.dtype={dtype}", f"model.path={tiny_model_dir}"])
    model, tok = load_model(tiny_model_dir)
    return model, make_engine(cfg, model, tok, tmp_path)


def test_model_dtype_bfloat16_is_honoured_in_process(tiny_model_dir, tmp_path):
    """`model.dtype=bfloat16` makes the in-process engine hold bf16 weights (it was silently
    float32); the learner's policy stays float32; pushed float32 weights are cast on load."""
    model, eng = _engine(tiny_model_dir, tmp_path, "bfloat16")
    assert {p.dtype for p in eng._model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    eng.update_weights(model.state_dict(), 1)
    w, v = next(iter(model.state_dict().items()))
    assert eng._model.state_dict()[w].dtype == torch.bfloat16
    assert torch.equal(eng._model.state_dict()[w], v.to(torch.bfloat16))


def test_model_dtype_default_keeps_float32(tiny_model_dir, tmp_path):
    model, eng = _engine(tiny_model_dir, tmp_path, "float32")
    assert {p.dtype for p in eng._model.parameters()} == {torch.float32}
    for (k, a), b in zip(model.state_dict().items(), eng._model.state_dict().values()):
        assert torch.equal(a, b), k


def test_unknown_dtype_is_refused_naming_the_key():
    from agentrl.config import ConfigError

    with pytest.raises(ConfigError, match="model.dtype"):
        load_config(overrides=["model.dtype=float16"])
