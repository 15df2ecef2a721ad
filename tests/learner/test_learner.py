"""Learner: tempered logprobs (L4), the update loop (two steps move the parameters with a
finite loss; micro-batching gives the full-batch gradient, L2), checkpoints."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from agentrl.algos import get_algorithm
from agentrl.config import algo_config
from agentrl.learner.checkpoints import latest_checkpoint
from agentrl.learner.forward import token_logprobs
from agentrl.learner.local import Learner
from agentrl.models.tiny import load_model
from agentrl.types import Trajectory


class FixedLogits(torch.nn.Module):
    """A 'model' whose next-token logits are always [2, 1, 0] (one parameter so it can train)."""

    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.tensor([2.0, 1.0, 0.0]))

    def forward(self, input_ids, attention_mask=None):
        B, T = input_ids.shape
        return SimpleNamespace(logits=self.bias.expand(B, T, 3))


def test_l4_learner_uses_tempered_logits_like_the_sampler():
    m = FixedLogits()
    ids = torch.tensor([[1, 0]])  # token 0 sampled after context [1]
    lp_t, _ = token_logprobs(m, ids, torch.ones_like(ids), temperature=0.6)
    lp_raw, _ = token_logprobs(m, ids, torch.ones_like(ids), temperature=1.0)
    sampler = torch.log_softmax(torch.tensor([2.0, 1.0, 0.0]) / 0.6, -1)[0]
    # hand-computed: log_softmax([3.333, 1.667, 0])[0] = -0.202573
    assert lp_t[0, 1].item() == pytest.approx(-0.202573, abs=1e-5)
    assert torch.exp(lp_t[0, 1] - sampler).item() == pytest.approx(1.0, abs=1e-6)  # ratio 1
    # raw logprobs would give the wrong ratio exp(-0.202573 - (-0.407606)) = 1.2276
    assert torch.exp(sampler - lp_raw[0, 1]).item() == pytest.approx(1.2276, abs=1e-4)
    assert lp_t[0, 0].item() == 0.0  # the first token has no context


def test_entropy_matches_definition():
    m = FixedLogits()
    ids = torch.tensor([[1, 0, 2]])
    _, ent = token_logprobs(m, ids, torch.ones_like(ids), with_entropy=True)
    p = torch.softmax(torch.tensor([2.0, 1.0, 0.0]), -1)
    assert ent[0, 1].item() == pytest.approx(float(-(p * p.log()).sum()), abs=1e-6)


def _batch(tok_model, n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    trajs = []
    for i in range(n):
        t = Trajectory(group_id=i // 2)
        t.append_context(torch.randint(3, 50, (3 + i,), generator=g).tolist())
        t.append_sampled(torch.randint(3, 50, (4 + 2 * i,), generator=g).tolist(), [-3.0] * (4 + 2 * i),
                         reward=float(i % 2))
        trajs.append(t)
    from agentrl.algos.shaping import build_batch

    return build_batch(trajs, pad_id=0)


def test_two_grpo_steps_move_parameters_with_finite_loss(tiny_model_dir):
    model, _ = load_model(tiny_model_dir)
    before = [p.detach().clone() for p in model.parameters()]
    cfg = algo_config(name="grpo")
    algo = get_algorithm("grpo")
    learner = Learner(model, lr=1e-2, micro_batch_size=2)
    for step in range(2):
        batch = _batch(model, seed=step)
        batch["advantages"], stats = algo.advantages(batch, cfg)
        m = learner.update(batch, algo, cfg)
        assert math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"]) and m["grad_norm"] > 0
    moved = sum(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert moved == len(before)
    assert learner.optimizer_steps == 2


def test_micro_batches_give_the_full_batch_gradient(tiny_model_dir):
    """L2 end to end: micro_batch_size 1 and 4 give the same gradient (token-mean over the
    minibatch's global token count)."""
    cfg = algo_config(name="grpo")
    algo = get_algorithm("grpo")
    grads = []
    for mbs in (1, 4):
        model, _ = load_model(tiny_model_dir)
        learner = Learner(model, lr=0.0 + 1e-12, micro_batch_size=mbs, grad_clip=1e9)
        batch = _batch(model)
        batch["advantages"], _ = algo.advantages(batch, cfg)
        learner.update(batch, algo, cfg)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4)


def test_multi_epoch_update_recomputes_old_logprobs(tiny_model_dir):
    model, _ = load_model(tiny_model_dir)
    cfg = algo_config(name="grpo", update_epochs=2, minibatches=2)
    algo = get_algorithm("grpo")
    learner = Learner(model, lr=1e-2, micro_batch_size=2)
    batch = _batch(model)
    batch["advantages"], _ = algo.advantages(batch, cfg)
    m = learner.update(batch, algo, cfg, epochs=2, minibatches=2)
    assert learner.optimizer_steps == 4
    assert "old_logprobs" in batch and batch["old_logprobs"].shape == batch["loss_mask"].shape
    assert m["clipfrac"] >= 0.0


def test_checkpoint_roundtrip_is_atomic(tiny_model_dir, tiny_tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    model, _ = load_model(tiny_model_dir)
    learner = Learner(model, lr=1e-3, use_ref=True)
    p = learner.save(tmp_path / "checkpoints" / "step_3", tiny_tokenizer, {"step": 3, "policy_version": 3})
    (tmp_path / "checkpoints" / "step_9.tmp").mkdir()  # an interrupted save is never picked
    assert latest_checkpoint(tmp_path) == p
    reloaded = AutoModelForCausalLM.from_pretrained(p)
    for a, b in zip(model.state_dict().values(), reloaded.state_dict().values()):
        assert torch.equal(a, b)
    learner2 = Learner(load_model(p)[0], lr=1e-3, use_ref=True)
    assert learner2.load(p) == {"step": 3, "policy_version": 3}


# -- prefix sharing (agentrl/learner/prefix_share.py) and the fused optimizer ---------------------------
def _rows(rows):
    """Right-padded (ids, attention, loss mask) from [(ids, loss mask), ...] lists."""
    T = max(len(r) for r, _ in rows)
    ids = torch.zeros((len(rows), T), dtype=torch.long)
    am = torch.zeros((len(rows), T), dtype=torch.long)
    lm = torch.zeros((len(rows), T))
    for b, (r, m) in enumerate(rows):
        ids[b, : len(r)] = torch.tensor(r)
        am[b, : len(r)] = 1
        lm[b, : len(r)] = torch.tensor(m, dtype=torch.float32)
    return ids, am, lm


def _prefix_cases():
    g = torch.Generator().manual_seed(0)

    def toks(n):
        return torch.randint(3, 380, (n,), generator=g).tolist()

    groups = []  # 2 groups x 3 rows: prompts of 5 and 8 tokens, completions of 6, 9, 3 tokens
    for plen in (5, 8):
        prompt = toks(plen)
        groups += [(prompt + toks(c), [0] * plen + [1] * c) for c in (6, 9, 3)]
    opening = toks(6)
    multi = []  # shared opening, then agent turns (1) interleaved with env messages (0)
    for turns in ((4, 3, 5), (2, 4, 1), (6, 2, 3)):
        ids, mask = list(opening), [0] * 6
        for k, n in enumerate(turns):
            ids += toks(n) + (toks(3) if k < len(turns) - 1 else [])
            mask += [1] * n + ([0] * 3 if k < len(turns) - 1 else [])
        multi.append((ids, mask))
    unmasked = toks(11)
    return {
        # (rows, batch sizes of the model forwards: distinct prefixes, then the rows)
        "2_groups_x_3_rows": (groups, [2, 6]),
        "no_shared_prefix": ([(toks(4 + i) + toks(5), [0] * (4 + i) + [1] * 5) for i in range(3)], [3]),
        "single_row_T1_completion": ([(toks(6) + toks(1), [0] * 6 + [1])], [1]),
        "all_masked_rows": (groups[:3] + [(unmasked, [0] * 11), (unmasked, [1] + [0] * 10)]
                            + groups[3:], [2, 6]),
        "multi_turn": (multi, [1, 3]),
        "groups_not_consecutive": ([groups[0], groups[3], groups[1], groups[4]], [2, 4]),
        "all_rows_masked": ([(toks(7), [0] * 7), (toks(5), [0] * 5)], [2]),
    }


def _forward_sizes(model):
    """Batch sizes of the model's forwards (a pre-hook on its decoder), and the handle."""
    from agentrl.learner.lora import is_peft

    base = model.get_base_model() if is_peft(model) else model
    sizes: list[int] = []
    h = base.model.register_forward_pre_hook(
        lambda m, args, kw: sizes.append((kw.get("input_ids") if kw.get("input_ids") is not None
                                          else args[0]).shape[0]), with_kwargs=True)
    return sizes, h


def _compare_prefix_share(model, rows, sizes_expected, entropy_grad=True, static=True):
    """Logprobs, entropies and gradients of `prefix_shared_logprobs` against the plain forward.
    With `entropy_grad=False` the shared path takes the fused lm_head (`logprob_head`) and the
    loss has no entropy term; then `static` runs the decoder as `static_forward.forward_hidden`
    (where the model supports it) or as the transformers forward."""
    from agentrl.learner import prefix_share
    from agentrl.learner.prefix_share import prefix_shared_logprobs
    from agentrl.models.static_forward import static_forward_supported

    static_calls = []

    def recorded(model, ids, *a, **kw):  # the static forward's batch sizes, like the hook's
        sizes.append(ids.shape[0])
        static_calls.append(ids.shape[0])
        return forward_hidden(model, ids, *a, **kw)

    forward_hidden = prefix_share.forward_hidden

    ids, am, lm = _rows(rows)
    out = {}
    for which in ("plain", "shared"):
        model.zero_grad(set_to_none=True)
        sizes, h = _forward_sizes(model)
        if which == "plain":
            lp, ent = token_logprobs(model, ids, am, temperature=0.7, with_entropy=True, entropy_grad=True)
        else:
            prefix_share.forward_hidden = recorded
            try:
                lp, ent = prefix_shared_logprobs(model, ids, am, lm, temperature=0.7,
                                                 with_entropy=True, entropy_grad=entropy_grad,
                                                 static=static)
            finally:
                prefix_share.forward_hidden = forward_hidden
        h.remove()
        # a loss of the kind GRPO uses: weighted logprobs plus an entropy bonus
        w = torch.linspace(-1.0, 1.0, lm.numel()).view(lm.shape) * lm
        loss = (lp * w).sum() + (0.1 * (ent * lm).sum() if entropy_grad else 0.0)
        if loss.requires_grad:
            loss.backward()
        grads = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten()
                           for p in model.parameters() if p.requires_grad])
        out[which] = (lp.detach() * lm, ent.detach() * lm, grads, sizes)
    (lp0, e0, g0, _), (lp1, e1, g1, sizes) = out["plain"], out["shared"]
    assert sizes == sizes_expected
    assert bool(static_calls) == (static and not entropy_grad and static_forward_supported(model))
    assert torch.allclose(lp1, lp0, atol=1e-5, rtol=0)
    assert torch.allclose(e1, e0, atol=1e-5, rtol=0)
    assert bool(torch.isfinite(g1).all())
    scale = float(g0.abs().max())
    assert float((g1 - g0).abs().max()) <= 1e-4 * max(scale, 1e-12)
    model.zero_grad(set_to_none=True)
    return scale


@pytest.mark.parametrize("path", ["entropy_grad", "fused_head", "fused_head_static"])
@pytest.mark.parametrize("case", list(_prefix_cases()))
def test_prefix_shared_logprobs_equal_the_plain_forward(tiny_model_dir, case, path):
    from agentrl.learner.prefix_share import decoder_and_head, prefix_share_supported
    from agentrl.models.static_forward import static_forward_supported

    model, _ = load_model(tiny_model_dir)
    model.train()
    assert prefix_share_supported(model) and static_forward_supported(model)
    assert decoder_and_head(model) is not None and model.training  # the check keeps the mode
    rows, sizes = _prefix_cases()[case]
    scale = _compare_prefix_share(model, rows, sizes, entropy_grad=path == "entropy_grad",
                                  static=path == "fused_head_static")
    assert scale > 0 or case == "all_rows_masked"


def test_prefix_shared_logprobs_with_lora(tiny_model_dir):
    pytest.importorskip("peft", reason="LoRA needs the lora extra (peft)")
    from agentrl.learner.lora import wrap_lora
    from agentrl.learner.prefix_share import decoder_and_head, prefix_share_supported

    base, _ = load_model(tiny_model_dir)
    model = wrap_lora(base, r=4, alpha=8, target_modules="all-linear", base_path=tiny_model_dir)
    with torch.no_grad():  # B starts at 0 (the adapters' gradients would be 0 for A): perturb
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(n))) * 0.1)
    model.train()
    assert prefix_share_supported(model)
    assert decoder_and_head(model) is not None  # "all-linear" LoRA leaves lm_head a plain Linear
    assert "LoRA" in Learner(model, lr=1e-3, compile=True).compile_note()  # no static forward
    cases = _prefix_cases()
    for case in ("2_groups_x_3_rows", "multi_turn"):
        for entropy_grad in (True, False):
            assert _compare_prefix_share(model, *cases[case], entropy_grad=entropy_grad) > 0


def test_prefix_share_falls_back_for_models_without_a_cache():
    from agentrl.learner.prefix_share import prefix_share_supported, shared_prefix_groups

    assert not prefix_share_supported(FixedLogits())
    learner = Learner(FixedLogits(), lr=1e-2)
    assert learner.prefix_share and not learner._share_ok  # update uses token_logprobs
    ids = torch.tensor([[5, 6, 7, 1], [5, 6, 8, 2], [5, 9, 7, 1], [5, 9, 7, 3], [5, 6, 0, 0]])
    assert shared_prefix_groups(ids, torch.tensor([2, 2, 2, 2, 2])) == [0, 0, 1, 1, 0]
    assert shared_prefix_groups(ids, torch.tensor([2, 3, 3, 3, 2])) == [0, 1, 2, 2, 0]


def _group_batch(seed, groups=3, G=3):
    """GRPO batch: `groups` prompts x G two-turn episodes (agent, env reply, agent)."""
    from agentrl.algos.shaping import build_batch

    g = torch.Generator().manual_seed(seed)
    trajs = []
    for k in range(groups):
        prompt = torch.randint(3, 380, (4 + 2 * k,), generator=g).tolist()
        for i in range(G):
            t = Trajectory(group_id=k)
            t.append_context(prompt)
            n = int(torch.randint(2, 9, (1,), generator=g))
            t.append_sampled(torch.randint(3, 380, (n,), generator=g).tolist(), [-3.0] * n)
            t.append_context(torch.randint(3, 380, (3,), generator=g).tolist())
            t.append_sampled(torch.randint(3, 380, (4,), generator=g).tolist(), [-3.0] * 4,
                             reward=float((i + k) % 2))
            trajs.append(t)
    return build_batch(trajs, pad_id=0)


def _two_grpo_updates(model_dir, cfg, **learner_kw):
    """Two GRPO updates of `_group_batch` (micro-batches of 4 rows) from the saved weights:
    (weights after, gradient of the first update, metrics of the last)."""
    algo = get_algorithm("grpo")
    model, _ = load_model(model_dir)
    learner = Learner(model, lr=1e-3, micro_batch_size=4, **learner_kw)
    for step in range(2):
        batch = _group_batch(step)
        batch["advantages"], _ = algo.advantages(batch, cfg)
        m = learner.update(batch, algo, cfg)
        if step == 0:
            grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    return [p.detach().clone() for p in model.parameters()], grads, m


@pytest.mark.parametrize("entropy_coef", [0.01, 0.0], ids=["entropy_bonus", "fused_head"])
def test_update_gives_the_same_weights_with_prefix_share_on_and_off(tiny_model_dir, entropy_coef):
    """Two GRPO updates (micro-batches of 4 rows split the groups of 3) from the same weights.

    The gradients agree to float32 rounding; AdamW divides each gradient by its own magnitude,
    so on the few weights whose gradient nearly cancels (|g| ~ 1e-9 against eps = 1e-8) rounding
    moves the step by up to ~0.2% of lr: the weights agree to 1% of one step (lr = 1e-3)."""
    cfg = algo_config(name="grpo", entropy_coef=entropy_coef)
    weights, grads, metrics = zip(*(_two_grpo_updates(tiny_model_dir, cfg, prefix_share=share)
                                    for share in (False, True)))
    assert float((grads[1] - grads[0]).abs().max()) <= 1e-4 * float(grads[0].abs().max())
    for a, b in zip(*weights):
        assert torch.allclose(a, b, atol=1e-5, rtol=0)
    for k in ("loss", "entropy", "grad_norm"):
        assert metrics[0][k] == pytest.approx(metrics[1][k], rel=1e-5, abs=1e-7)


def test_fused_adamw_step_equals_the_default_adamw(tiny_model_dir):
    import copy

    model, _ = load_model(tiny_model_dir)
    learner = Learner(model, lr=1e-2, weight_decay=0.1)
    assert learner.fused and learner.optimizer.param_groups[0]["fused"]  # CPU float32: fused
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(list(ref.parameters()), lr=1e-2, weight_decay=0.1, foreach=False)
    g = torch.Generator().manual_seed(0)
    for _ in range(2):
        for p, q in zip(model.parameters(), ref.parameters()):
            q.grad = torch.randn(p.shape, generator=g)
            p.grad = q.grad.clone()
        learner.optimizer.step()
        opt.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=1e-6, rtol=0)
    from agentrl.learner.optim import make_adamw

    cplx = torch.nn.Parameter(torch.zeros(2, dtype=torch.complex64))
    opt, fused = make_adamw([cplx], lr=1e-3, weight_decay=0.0)
    assert not fused and not opt.param_groups[0]["fused"]  # no fused kernel: the default AdamW


def test_fused_optimizer_checkpoint_resumes_exactly(tiny_model_dir, tiny_tokenizer, tmp_path):
    cfg = algo_config(name="grpo")
    algo = get_algorithm("grpo")
    batches = [_group_batch(s) for s in range(3)]
    for b in batches:
        b["advantages"], _ = algo.advantages(b, cfg)
    model, _ = load_model(tiny_model_dir)
    learner = Learner(model, lr=1e-2, micro_batch_size=4)
    learner.update(dict(batches[0]), algo, cfg)
    ck = learner.save(tmp_path / "step_1", tiny_tokenizer, {"step": 1, "policy_version": 1})
    for b in batches[1:]:
        learner.update(dict(b), algo, cfg)
    model2, _ = load_model(ck)
    learner2 = Learner(model2, lr=1e-2, micro_batch_size=4)
    assert learner2.load(ck)["step"] == 1 and learner2.optimizer.param_groups[0]["fused"]
    for b in batches[1:]:
        learner2.update(dict(b), algo, cfg)
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)
    # a checkpoint written with the default (unfused) AdamW resumes on the fused kernel
    old, _ = load_model(tiny_model_dir)
    learner3 = Learner(old, lr=1e-2, micro_batch_size=4)
    learner3.optimizer = torch.optim.AdamW(learner3._params(), lr=1e-2)
    learner3.scheduler = torch.optim.lr_scheduler.LambdaLR(learner3.optimizer, lambda _: 1.0)
    learner3.update(dict(batches[0]), algo, cfg)
    ck3 = learner3.save(tmp_path / "unfused", tiny_tokenizer, {"step": 1, "policy_version": 1})
    learner4 = Learner(load_model(ck3)[0], lr=1e-2, micro_batch_size=4)
    learner4.load(ck3)
    assert learner4.optimizer.param_groups[0]["fused"]
    assert math.isfinite(learner4.update(dict(batches[1]), algo, cfg)["loss"])


def test_prefix_share_with_activation_checkpointing_runs_one_forward(tiny_model_dir, monkeypatch):
    """Activation checkpointing makes transformers drop the cache in training: no sharing (one
    forward); and if the cache comes back unfilled anyway, the single forward is used."""
    import agentrl.learner.prefix_share as ps

    model, _ = load_model(tiny_model_dir)
    model.gradient_checkpointing_enable()
    model.train()
    rows, _ = _prefix_cases()["2_groups_x_3_rows"]
    _compare_prefix_share(model, rows, [6])
    monkeypatch.setattr(ps, "_checkpointing", lambda m: False)  # the check after the prefix
    _compare_prefix_share(model, rows, [2, 6])  # prefix forward, unfilled cache, then one forward


def _shared_case():
    rows, _ = _prefix_cases()["2_groups_x_3_rows"]
    return _rows(rows)


def test_compiled_static_forward_equals_eager(tiny_model_dir, monkeypatch):
    """`train.compile` path: dynamo traces the static forward (backend "eager" here, so the test
    stays fast; the inductor build is the slow test below) and gives the eager values."""
    from agentrl.learner.prefix_share import prefix_shared_logprobs
    from agentrl.models import static_forward

    monkeypatch.setattr(static_forward, "COMPILE_BACKEND", "eager")
    monkeypatch.setattr(static_forward, "_COMPILED", {})
    model, _ = load_model(tiny_model_dir)
    model.train()
    ids, am, lm = _shared_case()
    ref, _ = prefix_shared_logprobs(model, ids, am, lm, temperature=0.7, with_entropy=True)
    lp, _ = prefix_shared_logprobs(model, ids, am, lm, temperature=0.7, with_entropy=True, compiled=True)
    assert "eager" in static_forward._COMPILED and "failed" not in static_forward._COMPILED
    assert torch.allclose(lp, ref, atol=1e-6, rtol=0)
    learner = Learner(model, lr=1e-3, compile=True)
    assert learner.compile


def test_compiled_static_forward_keeps_its_graphs_across_shapes(tiny_model_dir, monkeypatch):
    """Rows, lengths and past lengths are marked dynamic: another batch shape (other groups,
    prompt and completion lengths) reuses the graphs of the first (one without and one with
    `past`) instead of compiling again."""
    from torch._dynamo.utils import counters

    from agentrl.learner.prefix_share import prefix_shared_logprobs
    from agentrl.models import static_forward

    monkeypatch.setattr(static_forward, "COMPILE_BACKEND", "eager")
    monkeypatch.setattr(static_forward, "_COMPILED", {})
    torch._dynamo.reset()
    counters.clear()
    model, _ = load_model(tiny_model_dir)
    model.train()
    g = torch.Generator().manual_seed(1)
    for plen, comps in ((5, (6, 9, 3)), (11, (4, 7, 2, 12)), (3, (8, 5))):
        prompt = torch.randint(3, 380, (plen,), generator=g).tolist()
        rows = [(prompt + torch.randint(3, 380, (c,), generator=g).tolist(), [0] * plen + [1] * c)
                for c in comps]
        ids, am, lm = _rows(rows)
        ref, _ = prefix_shared_logprobs(model, ids, am, lm)
        lp, _ = prefix_shared_logprobs(model, ids, am, lm, compiled=True)
        assert torch.allclose(lp, ref, atol=1e-6, rtol=0)
        assert counters["stats"]["unique_graphs"] == 2
    torch._dynamo.reset()


def test_compile_failure_falls_back_to_eager_with_a_warning(tiny_model_dir, monkeypatch):
    from agentrl.learner.prefix_share import prefix_shared_logprobs
    from agentrl.models import static_forward

    def broken(fn, **kw):  # what a machine without a C++ compiler gives at the first call
        def call(*a, **k):
            raise RuntimeError("InductorError: no working C++ compiler found")
        return call

    monkeypatch.setattr(static_forward, "_COMPILED", {})
    monkeypatch.setattr(torch, "compile", broken)
    model, _ = load_model(tiny_model_dir)
    model.train()
    ids, am, lm = _shared_case()
    ref, _ = prefix_shared_logprobs(model, ids, am, lm)
    with pytest.warns(RuntimeWarning, match="compile of the learner forward failed"):
        lp, _ = prefix_shared_logprobs(model, ids, am, lm, compiled=True)
    assert torch.equal(lp, ref) and "C++ compiler" in static_forward._COMPILED["failed"]
    lp2, _ = prefix_shared_logprobs(model, ids, am, lm, compiled=True)  # eager from now on
    assert torch.equal(lp2, ref)


@pytest.mark.slow
def test_inductor_compiled_update_equals_eager(tiny_model_dir, monkeypatch):
    """A real inductor build (tens of seconds): two GRPO updates with `compile=True` give the
    eager weights to float32 rounding."""
    from agentrl.models import static_forward

    monkeypatch.setattr(static_forward, "_COMPILED", {})
    cfg = algo_config(name="grpo")
    weights = [_two_grpo_updates(tiny_model_dir, cfg, compile=c)[0] for c in (False, True)]
    assert "failed" not in static_forward._COMPILED and "inductor" in static_forward._COMPILED
    for a, b in zip(*weights):
        assert torch.allclose(a, b, atol=1e-5, rtol=0)


# -- rows with all-zero advantages (Learner(skip_zero_advantage=True)) ---------------------------
def _equal_reward_batch(seed, rewards):
    """GRPO batch of groups of 3 one-turn rows; rewards[k] are group k's three rewards."""
    from agentrl.algos.shaping import build_batch

    g = torch.Generator().manual_seed(seed)
    trajs = []
    for k, group in enumerate(rewards):
        prompt = torch.randint(3, 380, (5 + k,), generator=g).tolist()
        for r in group:
            t = Trajectory(group_id=k)
            t.append_context(prompt)
            n = int(torch.randint(2, 9, (1,), generator=g))
            t.append_sampled(torch.randint(3, 380, (n,), generator=g).tolist(), [-3.0] * n, reward=r)
            trajs.append(t)
    return build_batch(trajs, pad_id=0)


@pytest.mark.parametrize("name", ["grpo", "gspo", "rloo"])
def test_skipping_zero_advantage_rows_gives_the_same_update(tiny_model_dir, monkeypatch, name):
    """Groups 0 and 2 have equal rewards (advantage 0): with the skip their rows are not
    forwarded, yet the loss, gradient and weights equal the full update's."""
    from agentrl.learner import prefix_share

    cfg = algo_config(name=name)
    algo = get_algorithm(name)
    batch0 = _equal_reward_batch(0, [(1.0, 1.0, 1.0), (0.0, 1.0, 0.0), (0.0, 0.0, 0.0), (1.0, 0.0, 0.0)])
    out, rows_seen = [], []
    forward = prefix_share.prefix_shared_logprobs
    monkeypatch.setattr("agentrl.learner.forward.prefix_shared_logprobs",
                        lambda m, ids, *a, **k: rows_seen.append(ids.shape[0]) or forward(m, ids, *a, **k))
    for skip in (False, True):
        model, _ = load_model(tiny_model_dir)
        learner = Learner(model, lr=1e-3, weight_decay=0.1, micro_batch_size=4, skip_zero_advantage=skip)
        batch = dict(batch0)
        batch["advantages"], _ = algo.advantages(batch, cfg)
        rows_seen.clear()
        m = learner.update(batch, algo, cfg)
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        out.append((m, grads, [p.detach().clone() for p in model.parameters()], sum(rows_seen)))
    (m0, g0, w0, n0), (m1, g1, w1, n1) = out
    assert (n0, n1) == (12, 6)  # the 6 rows of the equal-reward groups are not forwarded
    assert m1["skipped_rows_frac"] == pytest.approx(0.5) and "skipped_rows_frac" not in m0
    assert m1["loss"] == pytest.approx(m0["loss"], rel=1e-5, abs=1e-8)
    assert float((g1 - g0).abs().max()) <= 1e-5 * float(g0.abs().max())
    for a, b in zip(w0, w1):  # 1% of one AdamW step (see the prefix-share update test)
        assert torch.allclose(a, b, atol=1e-5, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_update_on_cuda_equals_cpu(tiny_model_dir):
    """A GRPO update with the batch and model on the GPU (skip of zero-advantage rows, prefix
    sharing, fused head): the gradient of the CPU update to float32 rounding. (The skip's row
    mask once lived on the batch's device and could not index the CPU row indices.)"""
    cfg = algo_config(name="grpo")
    algo = get_algorithm("grpo")
    batch0 = _equal_reward_batch(0, [(1.0, 1.0, 1.0), (0.0, 1.0, 0.0)])
    batch0["advantages"], _ = algo.advantages(batch0, cfg)
    grads = []
    for dev in ("cpu", "cuda"):
        model, _ = load_model(tiny_model_dir)
        model.to(dev)
        batch = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in batch0.items()}
        m = Learner(model, lr=1e-3, micro_batch_size=4).update(batch, algo, cfg)
        assert m["skipped_rows_frac"] == pytest.approx(0.5)
        grads.append(torch.cat([p.grad.flatten().cpu() for p in model.parameters()]))
    assert float((grads[1] - grads[0]).abs().max()) <= 1e-4 * float(grads[0].abs().max())


def test_all_rows_idle_still_steps_the_optimizer_and_bonus_terms_disable_the_skip(tiny_model_dir):
    algo = get_algorithm("grpo")
    batch0 = _equal_reward_batch(1, [(1.0, 1.0, 1.0), (0.0, 0.0, 0.0)])
    weights, metrics = [], []
    for skip in (False, True):
        model, _ = load_model(tiny_model_dir)
        learner = Learner(model, lr=1e-3, weight_decay=0.1, skip_zero_advantage=skip)
        batch = dict(batch0)
        cfg = algo_config(name="grpo")
        batch["advantages"], _ = algo.advantages(batch, cfg)
        assert not bool(batch["advantages"].any())
        metrics.append(learner.update(batch, algo, cfg))
        weights.append([p.detach().clone() for p in model.parameters()])
    assert metrics[1]["skipped_rows_frac"] == pytest.approx(5 / 6) and metrics[1]["loss"] == 0.0
    assert set(metrics[1]) == set(metrics[0]) | {"skipped_rows_frac"}  # one row gave the metrics
    assert metrics[1]["grad_norm"] == 0.0 == metrics[0]["grad_norm"]
    for a, b in zip(*weights):  # weight decay moved both the same way
        assert torch.allclose(a, b, atol=1e-7, rtol=0)
    assert not torch.equal(weights[1][0], load_model(tiny_model_dir)[0].model.embed_tokens.weight)
    model, _ = load_model(tiny_model_dir)
    learner = Learner(model, lr=1e-3)
    for cfg in (algo_config(name="grpo", entropy_coef=0.01), algo_config(name="grpo", kl_coef=0.1)):
        batch = dict(batch0)
        batch["advantages"], _ = algo.advantages(batch, cfg)
        if cfg.kl_coef:
            batch["ref_logprobs"] = torch.zeros_like(batch["loss_mask"], dtype=torch.float32)
        assert "skipped_rows_frac" not in learner.update(batch, algo, cfg)


def test_compile_note_says_what_compile_will_do(tiny_model_dir):
    model, _ = load_model(tiny_model_dir)
    assert Learner(model, lr=1e-3).compile_note() == ""
    assert "compiled at the first update" in Learner(model, lr=1e-3, compile=True).compile_note()
    note = Learner(model, lr=1e-3, compile=True, value_head=True).compile_note()
    assert note.startswith("train.compile has no effect") and "value head" in note
    assert "no effect" in Learner(model, lr=1e-3, compile=True, prefix_share=False).compile_note()
    bf16, _ = load_model(tiny_model_dir)
    note = Learner(bf16.to(torch.bfloat16), lr=1e-3, compile=True).compile_note()
    assert "no effect" in note and "float32" in note


@pytest.mark.parametrize("prefix_share", [True, False])
def test_a_micro_batch_of_only_empty_episodes_trains(tiny_model_dir, prefix_share):
    """A group whose episodes sampled nothing (agent runs that never called the gateway, failed
    resets) beside a group of equal rewards: every row is idle (advantage 0), the forward takes
    the batch's first row for its metrics, an empty one (a width-0 slice crashed there). The
    update runs and gives the weights of the same update without the empty rows."""
    from agentrl.algos.shaping import build_batch

    def trajs(with_empty):
        out = [Trajectory(group_id=0), Trajectory(group_id=0)] if with_empty else []
        g = torch.Generator().manual_seed(0)
        for i in range(2):
            t = Trajectory(group_id=1)
            t.append_context(torch.randint(3, 50, (4,), generator=g).tolist())
            t.append_sampled(torch.randint(3, 50, (5 + i,), generator=g).tolist(), [-3.0] * (5 + i),
                             reward=1.0)
            out.append(t)
        return out

    cfg, algo, weights = algo_config(name="grpo"), get_algorithm("grpo"), []
    for with_empty in (True, False):
        model, _ = load_model(tiny_model_dir)
        learner = Learner(model, lr=1e-2, micro_batch_size=2, prefix_share=prefix_share)
        batch = build_batch(trajs(with_empty), pad_id=0)
        batch["advantages"], _ = algo.advantages(batch, cfg)
        m = learner.update(batch, algo, cfg)
        assert math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"])
        weights.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*weights))
