"""The learner off the CPU's defaults (issue 19, in-process learner): the device (`train.device`),
bf16 autocast with float32 master weights (`train.precision`), gradient checkpointing, skipped
non-finite steps (`train.max_nonfinite_steps`) and dropout off in every logprob/value forward."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from test_learner import _group_batch

from agentrl.algos import get_algorithm
from agentrl.config import algo_config, load_config
from agentrl.infra.devices import resolve_device
from agentrl.learner.forward import checkpointing_enabled, disable_dropout, token_logprobs
from agentrl.learner.local import Learner
from agentrl.learner.optim import NonFiniteGradientError
from agentrl.models.tiny import load_model

CUDA = torch.cuda.is_available()


def _grpo_batch(seed=0, cfg=None):
    cfg = cfg or algo_config(name="grpo")
    batch = _group_batch(seed)
    batch["advantages"], _ = get_algorithm("grpo").advantages(batch, cfg)
    return batch


def _grads(model):
    return torch.cat([p.grad.flatten().float().cpu() for p in model.parameters()])


def _rel(a, b):
    return float((a - b).norm() / b.norm())


# -- devices ----------------------------------------------------------------------------------
def test_resolve_device_names_the_key():
    assert resolve_device("auto").type == ("cuda" if CUDA else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match=r"train.device=tpu"):
        resolve_device("tpu")
    if not CUDA:
        with pytest.raises(ValueError, match=r"train.device=cuda: no CUDA device"):
            resolve_device("cuda")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")


def test_resolve_device_has_one_definition():
    """One rule for every device key (learner, rollout, reward models): a single definition,
    in agentrl/infra/devices.py (the learner and the rollout side import it)."""
    import ast
    from pathlib import Path

    import agentrl.learner.local as local

    root = Path(__file__).resolve().parents[2] / "agentrl"
    defs = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                  for n in ast.walk(ast.parse(p.read_text()))
                  if isinstance(n, ast.FunctionDef) and n.name == "resolve_device")
    assert defs == ["infra/devices.py"]
    assert local.resolve_device is resolve_device


@pytest.mark.skipif(CUDA, reason="checks the failure without a CUDA device")
def test_cuda_without_a_device_fails_at_start_up(tmp_path):
    from agentrl.run import set_up

    cfg = load_config(overrides=["train.device=cuda", f"out={tmp_path / 'run'}"])
    with pytest.raises(ValueError, match=r"train.device=cuda"):
        set_up(cfg)
    assert not (tmp_path / "run").exists()  # before any work
    from typer.testing import CliRunner

    from agentrl.cli import app

    r = CliRunner().invoke(app, ["train", "train.device=cuda", "--out", str(tmp_path / "cli")])
    assert r.exit_code == 2 and "train.device=cuda" in r.output


def test_learner_on_cpu_returns_results_on_the_batch_device(tiny_model_dir):
    model, _ = load_model(tiny_model_dir)
    learner = Learner(model, lr=1e-3, device="cpu", value_head=True)
    assert learner.device.type == "cpu" and learner.value_head.weight.device.type == "cpu"
    batch = _grpo_batch()
    lp, v, last = learner.logprobs_and_values(batch)
    assert lp.device == batch["loss_mask"].device == v.device == last.device


# -- precision --------------------------------------------------------------------------------
def _update(model_dir, precision, *, prefix_share=True, epochs=1, minibatches=2, **kw):
    """One GRPO update (2 minibatches: old logprobs from a separate no-grad forward) of
    `_grpo_batch()`; returns (metrics, gradient of the last step, learner)."""
    model, _ = load_model(model_dir)
    learner = Learner(model, lr=1e-3, micro_batch_size=4, precision=precision,
                      prefix_share=prefix_share, grad_clip=1e9, **kw)
    cfg = algo_config(name="grpo")
    m = learner.update(_grpo_batch(cfg=cfg), get_algorithm("grpo"), cfg, epochs=epochs,
                       minibatches=minibatches)
    return m, _grads(model), learner


@pytest.mark.parametrize("prefix_share", [False, True], ids=["plain", "prefix_share"])
def test_bf16_update_on_cpu_is_finite_close_to_fp32_and_keeps_fp32_weights(tiny_model_dir,
                                                                          prefix_share):
    """bf16 autocast on CPU, against the fp32 update on the same batch and weights: the loss
    (about -0.131 here) within 0.1% relative (measured 2e-4), the entropy within 0.1% (1e-7),
    the gradient within 2% relative L2 (measured 3e-3 to 4e-3; bf16 keeps 8 bits of
    mantissa), and the weights, gradients and AdamW state stay float32."""
    m32, g32, _ = _update(tiny_model_dir, "fp32", prefix_share=prefix_share)
    m16, g16, learner = _update(tiny_model_dir, "bf16", prefix_share=prefix_share)
    for k in ("loss", "entropy", "grad_norm"):
        assert math.isfinite(m16[k])
    assert m16["loss"] == pytest.approx(m32["loss"], rel=1e-3)
    assert m16["entropy"] == pytest.approx(m32["entropy"], rel=1e-3)
    assert _rel(g16, g32) < 2e-2 and not torch.equal(g16, g32)  # bf16 did run
    assert {p.dtype for p in learner.model.parameters()} == {torch.float32}
    assert {p.grad.dtype for p in learner.model.parameters()} == {torch.float32}
    states = [s for s in learner.optimizer.state.values()]
    assert states and all(s["exp_avg"].dtype == s["exp_avg_sq"].dtype == torch.float32 for s in states)


def test_bf16_logprobs_are_float32_from_upcast_logits(tiny_model_dir):
    model, _ = load_model(tiny_model_dir)
    learner = Learner(model, lr=1e-3, precision="bf16")
    batch = _grpo_batch()
    with learner.autocast():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        lp, ent = token_logprobs(model, batch["input_ids"], batch["attention_mask"], with_entropy=True)
    assert logits.dtype == torch.bfloat16  # the forward ran in bf16
    assert lp.dtype == ent.dtype == torch.float32
    want = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    assert torch.allclose(lp[:, 1:], want, atol=1e-6)  # log-softmax of the upcast logits
    out = learner.logprobs(batch)
    assert out.dtype == torch.float32 and bool(torch.isfinite(out).all())


def test_bf16_turns_off_the_static_decoder_and_compile(tiny_model_dir, monkeypatch):
    """The fallback decision: under bf16 the prefix-shared forward never calls the static
    float32 decoder (nor compiles it), and the learner says so in one line."""
    import agentrl.learner.prefix_share as ps

    calls = []
    real = ps.forward_hidden
    monkeypatch.setattr(ps, "forward_hidden", lambda *a, **k: calls.append(k) or real(*a, **k))
    for precision, used in (("fp32", True), ("bf16", False)):
        calls.clear()
        m, _, learner = _update(tiny_model_dir, precision, compile=False)
        assert bool(calls) is used and learner.static_ok is used
    assert learner.fast_path_notes() == [
        "train.precision=bf16: the learner's prefix-shared forward runs the transformers decoder "
        "under autocast (the static decoder, agentrl/models/static_forward.py, is float32 only)"]
    model, _ = load_model(tiny_model_dir)
    note = Learner(model, lr=1e-3, precision="bf16", compile=True).compile_note()
    assert note.startswith("train.compile has no effect: train.precision=bf16")
    assert Learner(model, lr=1e-3).fast_path_notes() == []
    with pytest.raises(ValueError, match="precision='fp16'"):
        Learner(model, lr=1e-3, precision="fp16")


# -- gradient checkpointing -------------------------------------------------------------------
@pytest.mark.parametrize("prefix_share", [False, True], ids=["plain", "prefix_share"])
def test_gradient_checkpointing_gives_the_same_gradient(tiny_model_dir, prefix_share):
    grads, layer_calls = [], []
    for ckpt in (False, True):
        model, _ = load_model(tiny_model_dir)
        n, mlp = [0], model.model.layers[0].mlp
        fwd = mlp.forward  # counted in the forward and in the backward's recompute
        mlp.forward = lambda *a, _f=fwd, _n=n, **k: (_n.__setitem__(0, _n[0] + 1), _f(*a, **k))[1]
        learner = Learner(model, lr=1e-3, micro_batch_size=4, prefix_share=prefix_share,
                          gradient_checkpointing=ckpt)
        assert checkpointing_enabled(model) is ckpt  # any transformers version's name
        cfg = algo_config(name="grpo")
        m = learner.update(_grpo_batch(cfg=cfg), get_algorithm("grpo"), cfg)
        assert math.isfinite(m["loss"])
        grads.append(_grads(model))
        layer_calls.append(n[0])
    assert layer_calls[1] > layer_calls[0]  # the layers ran again in the backward's recompute
    if not prefix_share:  # (prefix sharing without checkpointing runs the static decoder)
        assert layer_calls[1] == 2 * layer_calls[0]
    assert float((grads[1] - grads[0]).abs().max()) <= 1e-5 * float(grads[0].abs().max())
    if prefix_share:
        assert "without sharing the prompt" in learner.fast_path_notes()[0]


# -- non-finite steps -------------------------------------------------------------------------
class NaNAdvantages:
    """GRPO whose advantages get a NaN on the first agent token (a broken reward pipeline)."""

    def __init__(self):
        self.grpo = get_algorithm("grpo")

    def __getattr__(self, name):
        return getattr(self.grpo, name)

    def advantages(self, batch, cfg):
        adv, stats = self.grpo.advantages(batch, cfg)
        adv = adv.clone()
        r, c = (batch["loss_mask"] != 0).nonzero()[0]
        adv[r, c] = float("nan")
        return adv, stats


def test_a_nonfinite_gradient_skips_the_step_and_repeated_ones_stop(tiny_model_dir):
    model, _ = load_model(tiny_model_dir)
    learner = Learner(model, lr=1e-2, micro_batch_size=4, max_nonfinite_steps=2,
                      lr_schedule=lambda s: 1.0 / (s + 1))
    cfg, bad, grpo = algo_config(name="grpo"), NaNAdvantages(), get_algorithm("grpo")
    learner.update(_grpo_batch(cfg=cfg), grpo, cfg)  # one real step: AdamW state exists
    weights = [p.detach().clone() for p in model.parameters()]
    state = {k: v.clone() for k, v in learner.optimizer.state[next(model.parameters())].items()}
    lr, sched = learner.optimizer.param_groups[0]["lr"], learner.scheduler.last_epoch
    batch = _grpo_batch(1, cfg)
    batch["advantages"], _ = bad.advantages(batch, cfg)
    m = learner.update(batch, bad, cfg)
    assert m["skipped_nonfinite"] == 1.0 and math.isnan(m["grad_norm"]) and math.isnan(m["loss"])
    for a, b in zip(weights, model.parameters()):
        assert torch.equal(a, b)
    after = learner.optimizer.state[next(model.parameters())]
    assert all(torch.equal(state[k], after[k]) for k in state)
    assert (learner.optimizer.param_groups[0]["lr"], learner.scheduler.last_epoch) == (lr, sched)
    assert learner.optimizer_steps == 1 and learner.nonfinite_streak == 1
    m = learner.update(_grpo_batch(2, cfg), grpo, cfg)  # a finite step resets the count
    assert m["skipped_nonfinite"] == 0.0 and learner.nonfinite_streak == 0
    learner.update(batch, bad, cfg)
    with pytest.raises(NonFiniteGradientError, match=r"2 optimizer steps in a row .* after "
                                                     r"optimizer step 2"):
        learner.update(batch, bad, cfg)


def test_the_loop_logs_skipped_steps_and_names_the_step_that_stops(tiny_model_dir):
    from agentrl.train import update

    model, _ = load_model(tiny_model_dir)
    cfg = load_config(overrides=["train.max_nonfinite_steps=2", "algo.group_size=3"])
    said = []
    lp = SimpleNamespace(cfg=cfg, algo=NaNAdvantages(), pad_id=0, say=said.append,
                         learner=Learner(model, lr=1e-2, micro_batch_size=4,
                                         max_nonfinite_steps=cfg.train.max_nonfinite_steps))
    from agentrl.types import Trajectory

    def episodes(seed):
        g = torch.Generator().manual_seed(seed)
        out = []
        for i in range(6):
            t = Trajectory(group_id=i // 3)
            t.append_context(torch.randint(3, 380, (4,), generator=g).tolist())
            t.append_sampled(torch.randint(3, 380, (5,), generator=g).tolist(), [-3.0] * 5,
                             reward=float(i % 2))
            out.append(t)
        return out

    m = {}
    update(lp, episodes(0), 6, m)
    assert m["loss/skipped_nonfinite"] == 1.0
    assert said and said[-1].startswith("[warning] step 7: 1 optimizer step(s) skipped: non-finite")
    with pytest.raises(NonFiniteGradientError, match=r"^step 8: 2 optimizer steps in a row"):
        update(lp, episodes(1), 7, {})


def test_finite_updates_report_no_skipped_steps(tiny_model_dir):
    m, _, learner = _update(tiny_model_dir, "fp32")
    assert m["skipped_nonfinite"] == 0.0 and learner.optimizer_steps == 2


# -- dropout ----------------------------------------------------------------------------------
def _dropout_model(model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, attention_dropout=0.1, dtype=torch.float32)
    assert model.config.attention_dropout == 0.1
    return model


def test_dropout_is_off_in_every_logprob_and_value_forward(tiny_model_dir):
    batch = _grpo_batch()
    ids, am = batch["input_ids"], batch["attention_mask"]
    model = _dropout_model(tiny_model_dir).train()
    with torch.no_grad():  # the model as configured: two forwards differ (dropout is on)
        a, b = (token_logprobs(model, ids, am)[0] for _ in range(2))
    assert not torch.equal(a, b)
    learner = Learner(model, lr=1e-3, use_ref=True, micro_batch_size=4)
    assert model.training and model.config.attention_dropout == 0.1  # mode and config kept
    lp = learner.logprobs(batch)
    assert torch.equal(lp, learner.logprobs(batch))
    assert torch.equal(learner.logprobs(batch, ref=True), lp)  # the reference: same weights
    ppo = Learner(_dropout_model(tiny_model_dir), lr=1e-3, value_head=True, micro_batch_size=4)
    first, second = ppo.logprobs_and_values(batch), ppo.logprobs_and_values(batch)
    assert all(torch.equal(x, y) for x, y in zip(first, second))
    assert disable_dropout(ppo.model) == 0  # nothing left to turn off


def test_ppo_ratio_is_exactly_one_before_any_update_with_a_dropout_config(tiny_model_dir):
    """The update's old logprobs (a no-grad forward) and its first training forward (the same
    plain forward, with gradient) agree bit for bit, although the config says dropout 0.1."""
    cfg = algo_config(name="grpo")
    grpo = get_algorithm("grpo")
    ratios = []

    class Spy:
        def __getattr__(self, name):
            return getattr(grpo, name)

        def loss(self, logp, sub, cfg, **kw):
            mask = sub["loss_mask"] != 0
            ratios.append(torch.exp(logp.detach() - sub["old_logprobs"])[mask])
            return grpo.loss(logp, sub, cfg, **kw)

    learner = Learner(_dropout_model(tiny_model_dir), lr=1e-3, micro_batch_size=32,
                      prefix_share=False)
    batch = _grpo_batch(cfg=cfg)
    m = learner.update(batch, Spy(), cfg, epochs=2)  # old logprobs first, then the forwards
    assert torch.equal(ratios[0], torch.ones_like(ratios[0]))
    assert m["clipfrac"] >= 0.0


# -- CUDA ---------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_learner_on_cuda_pushes_weights_to_the_cpu_engine(tiny_model_dir):
    """`train.device=cuda` in process: the model moves to the GPU at construction, batches stay
    on the CPU for the loop (logprobs come back there), the update's gradient equals the CPU
    one to float32 rounding, and the in-process HFEngine (its own CPU copy, made before the
    learner moved the model) loads the learner's CUDA weights."""
    from agentrl.learner.lora import merged_state_dict, plain_copy
    from agentrl.rollout.engines.hf import HFEngine

    cfg = algo_config(name="grpo")
    grpo = get_algorithm("grpo")
    grads = []
    for dev in ("cpu", "cuda"):
        model, tok = load_model(tiny_model_dir)
        engine = HFEngine(plain_copy(model).eval(), tok)
        learner = Learner(model, lr=1e-3, micro_batch_size=4, device=dev, use_ref=True)
        assert {p.device.type for p in learner.ref_model.parameters()} == {dev}
        batch = _grpo_batch(cfg=cfg)
        ref = learner.logprobs(batch, ref=True)
        assert ref.device.type == "cpu"
        learner.update(batch, grpo, cfg)
        assert batch["input_ids"].device.type == "cpu"
        grads.append(_grads(model))
        engine.update_weights(merged_state_dict(model), 1)
        for k, v in engine._model.state_dict().items():
            assert v.device.type == "cpu" and torch.equal(v, model.state_dict()[k].cpu())
    assert _rel(grads[1], grads[0]) < 1e-4
    m16, g16, learner = _update(tiny_model_dir, "bf16", device="cuda")
    assert math.isfinite(m16["loss"]) and {p.dtype for p in learner.model.parameters()} == {torch.float32}
    _, g32, _ = _update(tiny_model_dir, "fp32", device="cuda")
    assert _rel(g16, g32) < 5e-2
