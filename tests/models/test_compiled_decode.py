"""`rollout.compile`: the static decode step and its sampler as one `torch.compile` graph.

Fast tests trace with dynamo's "eager" backend (the graph, the guards and the dynamic-shape
hints are dynamo's; the kernels are the eager ones), so they check what compiling changes in
the engine (no data-dependent branch, symbolic column, dynamic batch and capacity, fallback)
in seconds; the slow test builds the real inductor/C++ graph."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from agentrl.config import Config
from agentrl.models import static_decode
from agentrl.models.tiny import build_tiny_model
from agentrl.rollout.engines.base import SamplingParams
from agentrl.rollout.engines.hf import HFEngine
from agentrl.run import rollout_compile_note

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    import textwrap

    texts = [open(textwrap.__file__, encoding="utf-8").read()]
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", texts, vocab_size=384,
                            num_layers=2, hidden_size=64, intermediate_size=128)


@pytest.fixture
def fresh_compile(monkeypatch):
    """A clean compile state for `static_decode`, restored afterwards.

    `torch.compiler.config.dynamic_sources` is set with the config module's own `patch`, not
    `monkeypatch.setattr`: pytest 9.2's undo deletes an attribute that is not in the module's
    `__dict__` (a torch config entry never is), which removes the entry for every later test."""
    monkeypatch.setattr(static_decode, "_COMPILED", {})
    torch._dynamo.reset()
    counters.clear()
    with torch.compiler.config.patch(dynamic_sources=""):
        yield
    torch._dynamo.reset()


@pytest.fixture
def eager_backend(fresh_compile, monkeypatch):
    monkeypatch.setattr(static_decode, "COMPILE_BACKEND", "eager")


def _prompts(engine, texts):
    return [engine.tokenizer.encode(t, add_special_tokens=False) for t in texts]


def _same(a, b, atol=1e-5):
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert [o.finish_reason for o in a] == [o.finish_reason for o in b]
    for x, y in zip(a, b, strict=True):
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=atol, rtol=0)


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.8, max_tokens=10, n=3, seed=5),
    SamplingParams(temperature=1.0, top_p=0.7, max_tokens=10, n=2, seed=1),
    SamplingParams(temperature=0.0, max_tokens=10),
])
def test_compiled_decode_gives_the_eager_completions(model_dir, eager_backend, params):
    eager, comp = HFEngine(model_dir), HFEngine(model_dir, compile=True)
    prompts = _prompts(eager, ["def f(x):", "import os\nprint(", "a"])
    ref = eager.generate(prompts, params)
    _same(comp.generate(prompts, params), ref)
    assert "eager" in static_decode._COMPILED and "failed" not in static_decode._COMPILED


def test_compiled_decode_with_rows_stopping_at_different_steps(model_dir, eager_backend):
    # Stops on the 2 most frequent sampled tokens: rows end early, the batch is compacted
    # (dynamic batch dim) and the rest keep decoding with the same results as eager.
    eager, comp = HFEngine(model_dir), HFEngine(model_dir, compile=True)
    prompts = _prompts(eager, ["x = ", "class A:", "for i in", "return", "def g(", "# a"])
    free = eager.generate(prompts, SamplingParams(temperature=1.0, max_tokens=12, seed=3, n=2))
    ids = torch.tensor([t for o in free for t in o.token_ids])
    stops = torch.bincount(ids).topk(2).indices.tolist()
    params = SamplingParams(temperature=1.0, max_tokens=12, seed=3, n=2, stop_token_ids=stops)
    ref = eager.generate(prompts, params)
    assert 2 <= sum(o.finish_reason == "stop" for o in ref) < len(ref)
    _same(comp.generate(prompts, params), ref)
    # one graph: the batch shrank (dynamic), never to a single row (which would specialise)
    assert counters["stats"]["unique_graphs"] == 1
    # Two rows, the first stopping at its first token and the other running on: eager goes on
    # with one row; compiled keeps both (no size-1 batch), with the same completions.
    for seed in range(50):
        free = eager.generate(prompts[:1], SamplingParams(temperature=1.0, max_tokens=12, seed=seed, n=2))
        first = free[0].token_ids[0]
        if first not in free[1].token_ids:
            break
    last = SamplingParams(temperature=1.0, max_tokens=12, seed=seed, n=2, stop_token_ids=[first])
    ref = eager.generate(prompts[:1], last)
    assert [len(o.token_ids) for o in ref] == [1, 12]
    _same(comp.generate(prompts[:1], last), ref)
    assert counters["stats"]["unique_graphs"] == 1


def test_one_graph_for_every_batch_width_and_column(model_dir, eager_backend):
    """The batch size, the cache capacity (prompt width + max tokens) and the column are
    dynamic: calls with other prompts, n and max_tokens reuse the first graph."""
    comp = HFEngine(model_dir, compile=True)
    p = _prompts(comp, ["def f(x):", "import os", "a b c d e f g h i j", "if x:\n    return 1"])
    comp.generate(p[:2], SamplingParams(temperature=1.0, max_tokens=6, n=3, seed=0))
    assert counters["stats"]["unique_graphs"] == 1
    comp.generate(p[2:], SamplingParams(temperature=1.0, max_tokens=9, n=2, seed=0))
    comp.generate(p, SamplingParams(temperature=1.0, max_tokens=4, n=2, seed=1))
    assert counters["stats"]["unique_graphs"] == 1
    comp.generate(p[:2], SamplingParams(temperature=0.5, max_tokens=4, n=2, seed=1))  # a new setting
    assert counters["stats"]["unique_graphs"] == 2
    # A one-row call specialises once (size-1 batch); its draws keep stride 1 whatever the
    # width of the last block of draws (33 tokens: a block of 32, then one of 1).
    comp.generate(p[:1], SamplingParams(temperature=0.5, max_tokens=12, seed=0))
    comp.generate(p[:1], SamplingParams(temperature=0.5, max_tokens=33, seed=0))
    assert counters["stats"]["unique_graphs"] == 3
    assert "L['decode_col']" in torch.compiler.config.dynamic_sources


def test_compile_failure_falls_back_to_eager_with_a_warning(model_dir, fresh_compile, monkeypatch):
    def broken(fn, **kw):  # what a machine without a C++ compiler gives at the first call
        def call(*a, **k):
            raise RuntimeError("InductorError: no working C++ compiler found")
        return call

    monkeypatch.setattr(torch, "compile", broken)
    eager, comp = HFEngine(model_dir), HFEngine(model_dir, compile=True)
    prompts = _prompts(eager, ["def f(x):", "a"])
    params = SamplingParams(temperature=1.0, max_tokens=8, n=2, seed=2)
    ref = eager.generate(prompts, params)
    with pytest.warns(RuntimeWarning, match="compile of the decode step failed"):
        out = comp.generate(prompts, params)
    _same(out, ref, atol=0)
    assert "C++ compiler" in static_decode._COMPILED["failed"]
    _same(comp.generate(prompts, params), ref, atol=0)  # eager from now on, no second warning


def test_compile_notes(model_dir):
    assert HFEngine(model_dir).compile_note() == ""
    assert "compiled at the first generate" in HFEngine(model_dir, compile=True).compile_note()
    off = HFEngine(model_dir, compile=True, static_decode=False).compile_note()
    assert off.startswith("rollout.compile has no effect") and "static_decode=False" in off
    assert rollout_compile_note(Config(), None) == ""
    vllm = Config.model_validate({"rollout": {"engine": "vllm", "compile": True}})
    assert "no effect on engine 'vllm'" in rollout_compile_note(vllm, None)
    ray = Config.model_validate({"rollout": {"num_workers": 2, "compile": True}})
    assert "each rollout worker" in rollout_compile_note(ray, object())
    bf16 = Config.model_validate({"rollout": {"num_workers": 2, "compile": True}, "model": {"dtype": "bfloat16"}})
    assert "needs float32" in rollout_compile_note(bf16, object())


@pytest.mark.parametrize("compile", [False, True])
def test_diverged_weights_raise_a_clear_error(model_dir, eager_backend, compile):
    """NaN weights (a diverged policy) make every logit NaN: generate says so instead of an
    index error, and compiling is not blamed (it stays on)."""
    eng = HFEngine(model_dir, compile=compile)
    with torch.no_grad():
        for prm in eng.model.parameters():
            prm.fill_(float("nan"))
    prompts = _prompts(eng, ["def f(x):", "a"])
    for params in (SamplingParams(temperature=1.0, max_tokens=5, n=2, seed=0), SamplingParams(temperature=0.0, max_tokens=5)):
        with pytest.raises(FloatingPointError, match="non-finite logits"):
            eng.generate(prompts, params)
    assert "failed" not in static_decode._COMPILED


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_compiled_decode_on_cuda(model_dir, eager_backend):
    eager, comp = HFEngine(model_dir, device="cuda"), HFEngine(model_dir, device="cuda", compile=True)
    prompts = _prompts(eager, ["def f(x):", "import os\nprint(", "a"])
    params = SamplingParams(temperature=1.0, max_tokens=12, n=3, seed=5)
    _same(comp.generate(prompts, params), eager.generate(prompts, params))


@pytest.mark.slow
def test_inductor_compiled_decode_equals_eager(model_dir, fresh_compile):
    """The real inductor build with its C++ wrapper (tens of seconds): same completions as
    eager up to float32 rounding (which could flip a near-tie; none does here)."""
    eager, comp = HFEngine(model_dir), HFEngine(model_dir, compile=True)
    prompts = _prompts(eager, ["def f(x):", "import os\nprint(", "a", "class B:"])
    params = SamplingParams(temperature=1.0, max_tokens=16, n=2, seed=7)
    ref = eager.generate(prompts, params)
    _same(comp.generate(prompts, params), ref, atol=1e-4)
    assert "inductor" in static_decode._COMPILED and "failed" not in static_decode._COMPILED
