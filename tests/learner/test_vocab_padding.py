"""Models compared by tokenizer, not by embedding rows (TRL #3028 / PR #6252): a teacher or policy
whose embedding matrix has padding rows beyond its tokenizer (Qwen2.5-7B's 152,064 rows for
0.5B's 151,936, the same tokenizer) trains, its padding rows sliced off wherever two models'
distributions meet (distillation's KL over the vocabulary); a reference copied from a padded
policy trains with GRPO and PPO; a teacher with another tokenizer is refused at start-up with
both sizes named. Real tiny models (`resize_token_embeddings` adds the padding rows)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "algos"))
from test_algorithm_options import _trajs  # noqa: E402 - the same four two-group trajectories

from agentrl.algos import get_algorithm  # noqa: E402
from agentrl.algos.distill import common_vocab  # noqa: E402
from agentrl.algos.shaping import build_batch  # noqa: E402
from agentrl.config import ConfigError, load_config  # noqa: E402
from agentrl.learner.frozen import frozen_vocab_logprobs, inline_teacher  # noqa: E402
from agentrl.learner.local import Learner  # noqa: E402
from agentrl.models.tiny import build_tiny_model, load_model  # noqa: E402
from agentrl.startup_model import check_tokenizer  # noqa: E402

distill = get_algorithm("distill")
PAD = 64


def padded_copy(src: str, dst: Path, rows: int = PAD) -> str:
    """`src` with `rows` padding rows added to its embedding matrix (and lm_head), the
    tokenizer unchanged."""
    model, tok = load_model(src)
    model.resize_token_embeddings(len(tok) + rows)  # new rows: the old rows' mean and covariance
    model.save_pretrained(dst)
    tok.save_pretrained(dst)
    return str(dst)


def test_common_vocab_by_hand():
    z = torch.tensor([[[1.0, 2.0, 3.0]]], requires_grad=True)
    got = common_vocab(torch.log_softmax(z, -1), 2)  # row 2 is padding: sliced off, renormalised
    assert torch.allclose(got, torch.log_softmax(z[..., :2], -1), atol=1e-6)
    assert got.exp().sum().item() == pytest.approx(1.0, abs=1e-6)
    assert torch.allclose(got[0, 0], torch.tensor([math.log(1 / (1 + math.e)), math.log(math.e / (1 + math.e))]))
    got.sum().backward()
    assert abs(z.grad[0, 0, 2].item()) < 1e-6  # no gradient into the padding row (0 up to rounding)
    lp = torch.zeros(1, 1, 3)
    assert common_vocab(lp, 3) is lp
    with pytest.raises(ValueError, match="covers 4 token ids, the student's logits only 3"):
        common_vocab(lp, 4)


def _distill(learner, teacher_path, mode, steps=2):
    cfg = load_config(None, ["algo.name=distill", f"algo.teacher_path={teacher_path}",
                             f"algo.distill_kl={mode}", "algo.distill_topk=8"]).algo
    learner.teacher = inline_teacher(cfg.teacher_path, learner)
    kls, shapes = [], []
    for _ in range(steps):
        b, _ = distill.prepare(build_batch(_trajs(), pad_id=0), learner, cfg)
        shapes.append(b["teacher_vocab_logprobs" if mode != "topk" else "teacher_topk_ids"].shape)
        b["advantages"], _ = distill.advantages(b, cfg)
        kls.append(learner.update(b, distill, cfg)["distill_kl"])
    return kls, shapes


@pytest.mark.parametrize("mode", ["full", "forward", "topk"])
def test_padded_teacher_distills(tiny_model_dir, tmp_path, mode):
    from conftest import TINY_TEXTS

    student, tok = load_model(tiny_model_dir)
    V = len(tok)
    assert student.get_input_embeddings().weight.shape[0] == V
    same = padded_copy(tiny_model_dir, tmp_path / "same")
    # the failure this fixes: the padded teacher's distribution is 64 ids wider than the student's
    b = build_batch(_trajs(), pad_id=0)
    raw = frozen_vocab_logprobs(load_model(same)[0], b["input_ids"], b["attention_mask"], b["lengths"])
    assert raw["vocab_logprobs"].shape[-1] == V + PAD
    # the student's own weights behind 64 padding rows: sliced off, the KL is exactly 0
    kls, shapes = _distill(Learner(student, lr=1e-2, micro_batch_size=2), same, mode, steps=1)
    assert kls[0] == pytest.approx(0.0, abs=1e-6)
    assert shapes[0][-1] == (V if mode != "topk" else 8)
    # another teacher (other weights), padded: two updates, a finite KL that falls, weights move
    other = build_tiny_model(tmp_path / "other", TINY_TEXTS, hidden_size=32, num_layers=2, num_heads=2,
                             intermediate_size=64, vocab_size=400, seed=1)
    student = load_model(tiny_model_dir)[0]
    before = [p.detach().clone() for p in student.parameters()]
    kls, shapes = _distill(Learner(student, lr=1e-2, micro_batch_size=2),
                           padded_copy(other, tmp_path / "other_padded"), mode)
    assert all(math.isfinite(k) for k in kls) and kls[0] > 1e-5 and kls[1] < kls[0], kls
    assert not all(torch.equal(a, p) for a, p in zip(before, student.parameters(), strict=True))


def test_padded_student_distills_from_an_unpadded_teacher(tiny_model_dir, tmp_path):
    student, _ = load_model(padded_copy(tiny_model_dir, tmp_path / "student"))
    kls, _ = _distill(Learner(student, lr=1e-2, micro_batch_size=2), tiny_model_dir, "full", steps=1)
    assert kls[0] == pytest.approx(0.0, abs=1e-6)  # the student's padding rows sliced off


def test_another_tokenizer_is_refused_at_start_up_with_both_sizes(tiny_model_dir, tmp_path):
    other = build_tiny_model(tmp_path / "other_tok", ["completely different text " * 5, "zebra quartz"] * 20,
                             hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                             vocab_size=300, seed=0)
    _, tok = load_model(tiny_model_dir)
    _, theirs = load_model(other)
    assert len(theirs) != len(tok)
    cfg = load_config(None, ["algo.name=distill", f"algo.teacher_path={other}", "algo.distill_kl=full"])
    with pytest.raises(ConfigError) as e:
        check_tokenizer(cfg, distill, tok)
    assert f"the teacher's has {len(theirs)} tokens, the policy's {len(tok)}" in str(e.value)
    # a padded teacher of the policy's own tokenizer passes the same check
    cfg = load_config(None, ["algo.name=distill", f"algo.teacher_path={padded_copy(tiny_model_dir, tmp_path / 'p')}"])
    check_tokenizer(cfg, distill, tok)


TINY_RUN = ["env.name=toy", "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
            "model.intermediate_size=64", "model.vocab_size=300", "sft.steps=0",
            "rollout.tasks_per_step=4", "algo.group_size=2", "rollout.max_tokens=4", "train.eval_tasks=1",
            "train.eval_samples=1", "train.steps=2", "train.lr=1e-2", "train.log_rollouts_every=0",
            "quiet=true", "seed=0", "algo.kl_coef=0.1"]


@pytest.mark.parametrize("algo, kl_key", [("grpo", "loss/kl"), ("ppo", "rollout/kl")])
def test_padded_policy_and_reference_train(tmp_path_factory, tmp_path, algo, kl_key):
    """The policy (so its frozen reference copy) has 64 padding rows: 2 steps with the KL to
    the reference train and log a finite KL."""
    from agentrl.run import default_model_dir
    from agentrl.train import train

    base = default_model_dir(load_config(None, TINY_RUN), tmp_path_factory.mktemp("vocab_base"))
    padded = padded_copy(base, tmp_path / "padded")
    train(load_config(None, TINY_RUN + [f"algo.name={algo}", f"model.path={padded}", f"out={tmp_path / 'run'}"]))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    kl = [r[kl_key] for r in rows if kl_key in r]
    assert len(kl) == 2 and all(math.isfinite(k) and k >= -1e-6 for k in kl), kl
