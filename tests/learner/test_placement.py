"""Placement of the models of a run (issue #23): the rollout engine's dtype in-process, the
reference and reward models on Ray workers of their own, the pipeline, the measured bf16 gap
and the cost profile; the distillation teacher on its worker (issue #24)."""

from __future__ import annotations

import pytest
import torch

from agentrl.config import load_config


def _engine(tiny_model_dir, tmp_path, dtype):
    from agentrl.models.tiny import load_model
    from agentrl.run import rollout_engine

    cfg = load_config(overrides=[f"model.dtype={dtype}", f"model.path={tiny_model_dir}"])
    model, tok = load_model(tiny_model_dir)
    return model, rollout_engine(cfg, model, tok, tmp_path)


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


# -- the reference worker (real Ray) ----------------------------------------------------------------
@pytest.fixture(scope="module")
def ray_up():
    import ray

    from agentrl.infra.cluster import ensure_ray

    ensure_ray(None, num_cpus=2)
    yield
    ray.shutdown()


def _batch(tok_vocab: int, B: int = 5, T: int = 24, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(6, T + 1, (B,), generator=g)
    ids = torch.randint(5, tok_vocab, (B, T), generator=g)
    attn = (torch.arange(T)[None] < lengths[:, None]).long()
    ids = ids * attn
    loss_mask = attn.float().clone()
    loss_mask[:, :3] = 0
    return {"input_ids": ids, "attention_mask": attn, "lengths": lengths, "loss_mask": loss_mask}


def _learner_and_worker(tiny_model_dir, tmp_path, dtype="float32", keep_fp32=False):
    from agentrl.learner.frozen import RemoteFrozenModel, save_reference_model
    from agentrl.learner.local import Learner
    from agentrl.models.tiny import load_model

    model, tok = load_model(tiny_model_dir)
    learner = Learner(model, lr=1e-3, use_ref=True, micro_batch_size=2, temperature=0.7)
    ref_dir = save_reference_model(model, tok, tmp_path)
    with torch.no_grad():  # the policy moves on; the reference must not
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    remote = RemoteFrozenModel(ref_dir, dtype=dtype, temperature=0.7, micro_batch_size=2, cpus=0.5,
                               keep_fp32=keep_fp32)
    return learner, remote, model


@pytest.mark.slow
def test_reference_worker_equals_inline_reference(ray_up, tiny_model_dir, tmp_path):
    """float32 worker = the learner's frozen copy, bit for bit on CPU (tolerance stated: 1e-6),
    the policy's own logprobs differ (the worker holds the starting weights); a prefetched
    result is the one taken by `logprobs`, and a prefetch of other rows is not."""
    learner, remote, model = _learner_and_worker(tiny_model_dir, tmp_path)
    try:
        batch = _batch(model.config.vocab_size)
        inline = learner.logprobs(batch, ref=True)
        remote.prefetch(batch)
        remote.prefetch(_batch(model.config.vocab_size, seed=1))
        got = remote.logprobs(batch)
        assert remote.prefetched == 1
        remote.prefetched = 0
        assert torch.allclose(got, inline, atol=1e-6, rtol=0)
        assert torch.equal(got, inline)  # same ops, shapes and weights: exact on CPU
        assert (learner.logprobs(batch) - inline).abs().max() > 1e-3
        learner.reference = remote  # the learner's reference calls go to the worker
        assert torch.equal(learner.logprobs(batch, ref=True), inline)
        m = remote.take_metrics()
        assert m["perf/reference_busy_s"] > 0 and m["perf/reference_wait_s"] > 0
        assert m["perf/reference_prefetched"] == 0 and remote.prefetched == 0
    finally:
        remote.shutdown()


@pytest.mark.slow
def test_reference_worker_bfloat16_gap(ray_up, tiny_model_dir, tmp_path):
    """A bf16 worker: logprobs within bf16 rounding of float32 (|gap| < 0.1 nats, nonzero),
    and `logp_gap` reports that gap over the sampled agent tokens only."""
    learner, remote, model = _learner_and_worker(tiny_model_dir, tmp_path, "bfloat16", keep_fp32=True)
    try:
        batch = _batch(model.config.vocab_size)
        inline = learner.logprobs(batch, ref=True)
        got = remote.logprobs(batch)
        mask = batch["loss_mask"] != 0
        diff = (got - inline).abs()[mask]
        assert 0 < diff.max() < 0.1
        gap = remote.logp_gap(batch, max_tokens=10**6)
        assert gap["tokens"] == mask.sum()
        assert gap["mean"] == pytest.approx(float(diff.mean()), rel=1e-5)
        assert gap["max"] == pytest.approx(float(diff.max()), rel=1e-5)
        few = remote.logp_gap(batch, max_tokens=7)
        assert few["tokens"] == 7
    finally:
        remote.shutdown()


# -- int8 (torch's dynamic quantization of the Linear layers, CPU) ------------------------------------
@pytest.fixture(scope="module")
def embedded_model_dir(tmp_path_factory):
    """The embedded default's sizes (hidden 128, 4 layers, 4 heads, MLP 384, vocab 1024),
    random weights, its tokenizer trained on the test texts."""
    from conftest import TINY_TEXTS

    from agentrl.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("embedded") / "model", TINY_TEXTS, seed=0)


def test_int8_reference_within_tolerance_of_float32(embedded_model_dir):
    """An int8 reference (`quantize_int8`) on the embedded model: every Linear layer holds qint8
    weights (embeddings float32), its logprobs on the agent tokens are within the stated
    tolerance of float32 (mean |gap| < 0.03 nats, max < 0.1; measured 0.009-0.011 and
    0.026-0.039 on these random weights) and not equal to them (it is quantized), and
    `logp_gap` reports exactly that gap."""
    from agentrl.learner.frozen import FrozenModelActor

    fp32 = FrozenModelActor(embedded_model_dir, temperature=0.7, micro_batch_size=2)
    q = FrozenModelActor(embedded_model_dir, dtype="int8", temperature=0.7, micro_batch_size=2, keep_fp32=True)
    layer = q.model.model.layers[0]
    for lin in (layer.self_attn.q_proj, layer.mlp.down_proj, q.model.lm_head):
        assert lin.weight().dtype == torch.qint8
    assert q.model.model.embed_tokens.weight.dtype == torch.float32
    for seed in range(3):
        batch = _batch(q.model.config.vocab_size, seed=seed)
        args = (batch["input_ids"], batch["attention_mask"], batch["lengths"])
        mask = batch["loss_mask"] != 0
        diff = (q.logprobs(*args) - fp32.logprobs(*args)).abs()[mask]
        assert 1e-4 < float(diff.mean()) < 0.03 and float(diff.max()) < 0.1
        gap = q.logp_gap(*args, batch["loss_mask"], max_tokens=10**6)
        assert gap["tokens"] == mask.sum()
        assert gap["mean"] == pytest.approx(float(diff.mean()), rel=1e-5)
        assert gap["max"] == pytest.approx(float(diff.max()), rel=1e-5)
    with pytest.raises(ValueError, match="int8 runs on the CPU only"):
        FrozenModelActor(embedded_model_dir, dtype="int8", device="cuda")


def test_int8_reward_model_within_tolerance_of_float32(tmp_path):
    """An int8 reward-model worker's classifier: logits within 0.05 of float32 (measured
    ~0.01 on this random BERT), the scores it gives within 0.01."""
    import numpy as np
    from _reward_fixtures import build_tiny_classifier

    from agentrl.rewards.remote import ClassifierActor

    path = build_tiny_classifier(tmp_path / "clf", id2label={0: "safe", 1: "unsafe"})
    fp32, q = ClassifierActor(path), ClassifierActor(path, dtype="int8")
    assert q.clf.model.bert.encoder.layer[0].attention.self.query.weight().dtype == torch.qint8
    a, b = fp32.logits(*PAIRS), q.logits(*PAIRS)
    assert 0 < np.abs(a - b).max() < 0.05


def test_precision_config_errors_name_the_key(monkeypatch):
    """int8 on a GPU, a dtype for an inline model, int8 where torch lacks it, and the colocated
    GPU mode (not built; here without CUDA) fail at start-up naming the key."""
    from agentrl.config import ConfigError

    for over, needle in ((["placement.reference=worker", "placement.reference_dtype=int8",
                           "placement.reference_gpus=1"], "placement.reference_dtype=int8 runs on the CPU only"),
                         (["placement.reference_dtype=bfloat16"], "placement.reference_dtype=bfloat16 applies to a worker"),
                         (["placement.reward_model_dtype=int8"], "placement.reward_model_dtype=int8 applies to a worker"),
                         (["rollout.colocate=true"], "rollout.colocate=true: this machine has no CUDA device")):
        with pytest.raises(ConfigError, match=needle):
            load_config(overrides=over)
    assert load_config(overrides=["placement.reference=worker", "placement.reference_dtype=int8"]) \
        .placement.reference_dtype == "int8"
    import agentrl.config

    monkeypatch.setattr(agentrl.config, "int8_unavailable", lambda: "torch X has no quantized CPU kernels")
    with pytest.raises(ConfigError, match="placement.reference_dtype=int8: torch X has no quantized CPU kernels"):
        load_config(overrides=["placement.reference=worker", "placement.reference_dtype=int8"])


TINY = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
        "model.intermediate_size=64", "sft.steps=0", "rollout.tasks_per_step=2",
        "algo.group_size=2", "train.eval_tasks=2", "train.eval_samples=1", "rollout.max_tokens=8",
        "train.log_rollouts_every=0", "quiet=true", "train.lr=1e-2", "env.name=toy", "train.steps=3"]


@pytest.fixture(scope="module")
def signal(tmp_path_factory):
    """Overrides that give the toy runs a reward signal (the tiny random policy's toy rewards
    are all equal, so without it nothing is updated): a tiny classifier's score added."""
    from _reward_fixtures import build_tiny_classifier

    path = build_tiny_classifier(tmp_path_factory.mktemp("signal") / "clf")
    return ["env.wrappers=[classifier]", f"env.wrapper_kwargs={{classifier: {{model: {path}, mode: add}}}}"]


def _run(tmp_path, name, extra):
    import json

    from agentrl.learner.checkpoints import latest_checkpoint
    from agentrl.models.tiny import load_model
    from agentrl.train import train

    cfg = load_config(None, TINY + [f"out={tmp_path / name}"] + extra)
    train(cfg)
    model, _ = load_model(latest_checkpoint(tmp_path / name))
    rows = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return {k: v.clone() for k, v in model.state_dict().items()}, [r for r in rows if "loss/loss" in r]


@pytest.mark.slow
@pytest.mark.parametrize("algo", [["algo.name=grpo", "algo.kl_coef=0.5"],
                                  ["algo.name=ppo", "algo.kl_coef=0.5", "algo.kl_target=null"],
                                  ["algo.name=grpo", "algo.kl_coef=0.5", "rollout.mode=async",
                                   "train.max_staleness=1", "rollout.batches_in_flight=1"]],
                         ids=["grpo-sync", "ppo-sync", "grpo-async"])
def test_train_with_reference_worker_equals_inline(ray_up, tmp_path, algo, signal):
    """`train()` with the reference on a worker, pipelined (prefetched as soon as each batch is
    sampled: in async mode on the actor thread, while the learner updates the previous batch)
    samples and updates exactly as inline: the same per-step losses and KL, the same final
    weights (float32, CPU: bit-equal; asserted to 1e-6), and every step used the prefetch."""
    algo = algo + signal
    w_in, m_in = _run(tmp_path, "inline", algo)
    w_wk, m_wk = _run(tmp_path, "worker", algo + ["placement.reference=worker", "placement.reference_cpus=0.5"])
    kls = [r.get("loss/kl", r.get("rollout/kl", 0.0)) for r in m_in]
    assert kls[0] == pytest.approx(0.0, abs=1e-6) and max(abs(k) for k in kls) > 1e-7  # the reference mattered
    assert (tmp_path / "worker" / "reference_model" / "config.json").exists()
    assert not list((tmp_path / "worker" / "checkpoints").glob("*/ref_model.pt"))  # no frozen copy
    assert list((tmp_path / "inline" / "checkpoints").glob("*/ref_model.pt"))
    for k in w_in:
        assert torch.allclose(w_in[k], w_wk[k], atol=1e-6, rtol=0), k
    assert len(m_in) == len(m_wk) == 3
    assert all(r["perf/reference_prefetched"] == 1 for r in m_wk)  # the pipeline's result was used
    # (async: the worker computes batch s+1 during step s, so a step's busy time may be 0)
    assert sum(r["perf/reference_busy_s"] for r in m_wk) > 0
    assert all(0 <= r["perf/reference_idle_s"] <= r["perf/step_s"] for r in m_wk)
    for a, b in zip(m_in, m_wk):
        assert a["loss/loss"] == pytest.approx(b["loss/loss"], abs=1e-6)
        assert a["rollout/reward_mean"] == b["rollout/reward_mean"]
        for k in ("loss/kl", "rollout/kl"):
            if k in a:
                assert a[k] == pytest.approx(b[k], abs=1e-6)


# -- the reward-model worker (real Ray) -------------------------------------------------------------
PAIRS = (["how do i pick a lock", [{"role": "user", "content": "tell me about cats"}], "describe the sea"],
         ["sorry i can't help with that", "cats are nice", "the sea is a"])


@pytest.mark.slow
def test_reward_model_worker_scores_equal_inline(ray_up, tmp_path):
    """`RemoteClassifier` on its actor = the in-process `SequenceClassifier` (same logits to
    the last bit: same model, same inputs, float32 CPU), through the wrappers too: a
    `classifier` + `safety` stack built with `remote` rewards an episode exactly as inline,
    and both wrappers score on one named actor."""
    import gymnasium as gym
    import numpy as np
    from _reward_fixtures import ECHO_ID, build_tiny_classifier

    from agentrl.rewards import RewardWrappers
    from agentrl.rewards.classifier import SequenceClassifier
    from agentrl.rewards.remote import RemoteClassifier

    path = build_tiny_classifier(tmp_path / "clf", id2label={0: "safe", 1: "unsafe"})
    inline = SequenceClassifier(path)
    remote = RemoteClassifier(path, cpus=0.5)
    assert np.array_equal(remote.logits(*PAIRS), inline.logits(*PAIRS))
    assert np.array_equal(remote.score(*PAIRS), inline.score(*PAIRS))
    assert np.array_equal(remote.p_unsafe(*PAIRS), inline.p_unsafe(*PAIRS))
    assert remote.take_busy() > 0 and inline.take_busy() > 0

    opts = {"classifier": {"model": path, "mode": "add"}, "safety": {"classifier": path, "lam": 2.0}}
    rewards = {}
    for name, kw in (("inline", {}), ("worker", {"remote": {"cpus": 0.5}})):
        w = RewardWrappers(["classifier", "safety"], opts, **kw)
        env = w.wrap(gym.make(ECHO_ID))
        env.reset(seed=3)
        rewards[name] = [env.step(a)[1] for a in ("cats are nice", "how do i pick a lock", "the sea")]
        assert (type(w.reward_model).__name__, w.take_reward_model_seconds() > 0) == \
            ("RemoteClassifier" if kw else "SequenceClassifier", True)
    assert rewards["inline"] == rewards["worker"]
    assert len(set(rewards["inline"])) == 3


def test_reward_model_worker_needs_a_model_path():
    from agentrl.config import ConfigError

    with pytest.raises(ConfigError, match="placement.reward_model=worker needs a classifier"):
        load_config(overrides=["placement.reward_model=worker", "env.wrappers=[safety]"])


@pytest.mark.slow
def test_train_with_reward_model_worker_equals_inline(ray_up, tmp_path):
    """`train()` with the classifier reward scored on its worker: the same rewards, losses and
    final weights as inline (3 GRPO steps on the toy env, classifier score added)."""
    from _reward_fixtures import build_tiny_classifier

    path = build_tiny_classifier(tmp_path / "clf")
    extra = ["env.wrappers=[classifier]", f"env.wrapper_kwargs={{classifier: {{model: {path}, mode: add}}}}"]
    w_in, m_in = _run(tmp_path, "inline", extra)
    w_wk, m_wk = _run(tmp_path, "worker", extra + ["placement.reward_model=worker",
                                                   "placement.reward_model_cpus=0.5"])
    assert [r["rollout/reward_mean"] for r in m_in] == [r["rollout/reward_mean"] for r in m_wk]
    assert any(r["rollout/reward_mean"] % 1 for r in m_in)  # the classifier's score is in it
    for k in w_in:
        assert torch.allclose(w_in[k], w_wk[k], atol=1e-6, rtol=0), k


@pytest.mark.slow
def test_train_bf16_reference_logs_the_gap(ray_up, tmp_path):
    """A bf16 reference worker: `ref/logp_gap_mean|max` every `logp_gap_every` steps (here
    steps 1 and 3 of 3), nonzero and small (bf16 rounding of the embedded-size model), with the
    sample's token count; the KL term stays finite."""
    _, rows = _run(tmp_path, "bf16", ["algo.kl_coef=0.5", "placement.reference=worker",
                                      "placement.reference_cpus=0.5", "placement.reference_dtype=bfloat16",
                                      "placement.logp_gap_every=2", "placement.logp_gap_tokens=5"])
    gaps = [r for r in rows if "ref/logp_gap_mean" in r]
    assert [r["step"] for r in gaps] == [1, 3]
    for r in gaps:
        assert 0 < r["ref/logp_gap_mean"] <= r["ref/logp_gap_max"] < 0.5
        assert r["ref/logp_gap_tokens"] == 5
    assert all(abs(r["loss/kl"]) < 10 for r in rows)


@pytest.mark.slow
def test_train_int8_reference_logs_the_gap(ray_up, tmp_path):
    """An int8 reference worker in `train()`: `ref/logp_gap_mean|max` logged at steps 1 and 3,
    nonzero and within the int8 tolerance of the unit test above."""
    _, rows = _run(tmp_path, "int8", ["algo.kl_coef=0.5", "placement.reference=worker",
                                      "placement.reference_cpus=0.5", "placement.reference_dtype=int8",
                                      "placement.logp_gap_every=2"])
    gaps = [r for r in rows if "ref/logp_gap_mean" in r]
    assert [r["step"] for r in gaps] == [1, 3]
    for r in gaps:
        assert 0 < r["ref/logp_gap_mean"] <= r["ref/logp_gap_max"] < 0.1
        assert r["ref/logp_gap_tokens"] > 0
    assert all(abs(r["loss/kl"]) < 10 for r in rows)


@pytest.mark.slow
def test_train_bf16_engine_logs_the_sampler_gap(tmp_path, signal):
    """`model.dtype=bfloat16`: the sampler's gap to the float32 learner is logged every step,
    mean (`loss/logp_mismatch`) and max (`loss/logp_mismatch_max`) over the agent tokens, nonzero
    (bf16 rounding); a float32 engine's is float32 noise (< 1e-4)."""
    _, bf = _run(tmp_path, "bf16-engine", ["model.dtype=bfloat16"] + signal)
    _, fp = _run(tmp_path, "fp32-engine", signal)
    assert len(bf) == len(fp) == 3
    for r in bf:
        assert 1e-4 < r["loss/logp_mismatch"] <= r["loss/logp_mismatch_max"] < 0.5
    for r in fp:
        assert r["loss/logp_mismatch"] <= r["loss/logp_mismatch_max"] < 1e-4


# -- the cost profile -------------------------------------------------------------------------------
def test_cost_profile_by_hand():
    """Seconds and shares of the step seconds, in PROFILE order, only the logged stages."""
    from agentrl.log.summary import cost_profile, format_profile

    stages = {"step": 20.0, "generate": 7.0, "env": 3.0, "reward_model": 2.5, "policy_update": 5.0,
              "sync": 0.5, "update": 9.0, "loop": 21.0}
    assert cost_profile(stages) == [("generation", 7.0, 0.35), ("env/tool/sandbox", 3.0, 0.15),
                                    ("reward model", 2.5, 0.125), ("policy update", 5.0, 0.25),
                                    ("weight sync", 0.5, 0.025)]
    assert format_profile(stages).endswith("generation 7.0s 35% · env/tool/sandbox 3.0s 15% · "
                                           "reward model 2.5s 12% · policy update 5.0s 25% · "
                                           "weight sync 0.5s 2%")
    assert format_profile({"step": 1.0}) == ""


@pytest.mark.slow
def test_train_logs_the_cost_profile(ray_up, tmp_path):
    """Every step logs the stages (generation, env, reward model, reference, the PPO no-grad
    pass, policy update, sync), consistent with the step: generation + env <= rollout, and
    prepare + reference + policy update <= update; the summary has the profile."""
    import json

    from _reward_fixtures import build_tiny_classifier

    path = build_tiny_classifier(tmp_path / "clf")
    _, rows = _run(tmp_path, "p", ["algo.name=ppo", "algo.kl_coef=0.5", "env.wrappers=[classifier]",
                                   f"env.wrapper_kwargs={{classifier: {{model: {path}, mode: add}}}}"])
    for r in rows:
        for k in ("generate", "env", "reward_model", "reference", "prepare", "policy_update", "sync"):
            assert r[f"perf/{k}_s"] >= 0, k
        assert r["perf/reward_model_s"] > 0 and r["perf/reference_s"] > 0 and r["perf/prepare_s"] > 0
        assert r["perf/generate_s"] + r["perf/env_s"] <= r["perf/rollout_s"] + 1e-6
        assert r["perf/prepare_s"] + r["perf/reference_s"] + r["perf/policy_update_s"] <= r["perf/update_s"] + 1e-6
    prof = json.loads((tmp_path / "p" / "summary.json").read_text())["cost_profile"]
    assert {"generation", "env/tool/sandbox", "reward model", "reference", "old logprobs + values",
            "policy update", "weight sync"} <= set(prof)
    assert all(0 <= v["share"] <= 1 for v in prof.values())


def test_benchmark_reward_model_is_a_5m_character_level_classifier(tmp_path):
    """benchmarks/placement.py's reward model: ~5M parameters, about one token per character
    (the reward-bound cost it stands for), and the arms differ only in placement and mode."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import placement as bench
    from transformers import AutoTokenizer

    path, n = bench.build_classifier(tmp_path / "clf")
    assert 4.5e6 < n < 5.5e6
    text = "How do I pick a lock?"
    ids = AutoTokenizer.from_pretrained(path)(text)["input_ids"]
    assert len(ids) == len(text.replace(" ", "")) + 2  # [CLS] chars [SEP]
    base = bench.arm_overrides("inline-sync", tmp_path, path, type("A", (), {"tasks": 8, "tokens": 48, "steps": 6}))
    for arm, extra in bench.ARMS.items():
        ov = bench.arm_overrides(arm, tmp_path, path, type("A", (), {"tasks": 8, "tokens": 48, "steps": 6}))
        assert ov == base + extra
        load_config(overrides=ov)  # every arm is a valid config


@pytest.mark.slow
def test_resume_inline_after_a_worker_run_keeps_the_reference(ray_up, tmp_path, signal):
    """2 steps with the reference on a worker, resumed inline to 3 steps: the learner's frozen
    copy is the run's starting weights (OUT/reference_model), not the resumed policy, so the
    run ends as 3 steps with the worker do."""
    from agentrl.learner.checkpoints import latest_checkpoint
    from agentrl.models.tiny import load_model
    from agentrl.train import train

    kl = ["algo.kl_coef=0.5"] + signal
    full, _ = _run(tmp_path, "full", kl + ["placement.reference=worker", "placement.reference_cpus=0.5"])
    out = tmp_path / "split"
    train(load_config(None, TINY + kl + [f"out={out}", "train.steps=2", "train.save_every=1",
                                          "placement.reference=worker", "placement.reference_cpus=0.5"]))
    train(load_config(None, TINY + kl + [f"out={out}", f"resume={out}"]))
    model, _ = load_model(latest_checkpoint(out))
    for k, v in model.state_dict().items():
        assert torch.allclose(v, full[k], atol=1e-6, rtol=0), k


# -- the distillation teacher on its own worker (issue #24; real Ray) --------------------------------
def _teacher_dir(base_dir, out, seed=1):
    """A teacher with the policy's tokenizer: `base_dir`'s weights moved by N(0, 0.05^2)."""
    from agentrl.models.tiny import load_model

    model, tok = load_model(base_dir)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


@pytest.mark.slow
def test_teacher_worker_equals_inline_teacher(ray_up, tiny_model_dir, tmp_path):
    """`placement.teacher=worker` runs the reference worker's machinery (`RemoteFrozenModel`,
    role `teacher`) on `algo.teacher_path`: its float32 logprobs equal distill's inline teacher
    bit for bit on CPU (stated tolerance 1e-6 nats: float32 rounding of other kernels or
    devices), a prefetched result is the one taken, and the metrics are `perf/teacher_*`."""
    from agentrl.learner.frozen import RemoteFrozenModel, load_teacher, teacher_logprobs

    teacher_dir = _teacher_dir(tiny_model_dir, tmp_path / "teacher")
    teacher = load_teacher(teacher_dir)
    remote = RemoteFrozenModel(teacher_dir, role="teacher", temperature=0.7, micro_batch_size=2, cpus=0.5)
    try:
        batch = _batch(teacher.config.vocab_size)
        inline = teacher_logprobs(teacher, batch, temperature=0.7, micro_batch_size=2)
        mask = batch["loss_mask"] != 0
        assert inline[mask].max() < 0 and torch.all(inline[:, 0] == 0)  # real logprobs, 0 at t = 0
        remote.prefetch(batch)
        got = remote.logprobs(batch)
        assert remote.prefetched == 1
        assert torch.allclose(got, inline, atol=1e-6, rtol=0)
        assert torch.equal(got, inline)  # same function, shapes and weights: exact on CPU
        from agentrl.models.tiny import load_model

        student, _ = load_model(tiny_model_dir)  # the teacher is not the student
        assert (teacher_logprobs(student, batch, temperature=0.7, micro_batch_size=2) - inline)[mask].abs().max() > 1e-3
        m = remote.take_metrics()
        assert set(m) == {"perf/teacher_wait_s", "perf/teacher_busy_s", "perf/teacher_prefetched"}
        assert m["perf/teacher_busy_s"] > 0 and m["perf/teacher_prefetched"] == 1
    finally:
        remote.shutdown()


def test_teacher_worker_is_refused_without_distill_and_its_dtype_needs_the_worker():
    from agentrl.config import ConfigError

    with pytest.raises(ConfigError, match="placement.teacher=worker: algo.name=grpo has no teacher"):
        load_config(overrides=["placement.teacher=worker"])
    with pytest.raises(ConfigError, match="placement.teacher_dtype=int8 applies to a worker only"):
        load_config(overrides=["placement.teacher_dtype=int8"])
    with pytest.raises(ConfigError, match="placement.teacher_dtype=int8 runs on the CPU only"):
        load_config(overrides=["placement.teacher=worker", "placement.teacher_dtype=int8",
                               "placement.teacher_gpus=1"])


@pytest.mark.slow
def test_train_distill_with_teacher_worker_equals_inline(ray_up, tmp_path):
    """3 steps of `--algo distill` with the teacher on a worker, pipelined (prefetched as soon as
    each batch is sampled), are the inline run: the same per-step losses and reverse KL, the
    same final weights (float32, CPU: bit-equal; asserted to 1e-6), and every step used the
    prefetch."""
    from agentrl.run import default_model_dir

    base = default_model_dir(load_config(None, TINY), tmp_path / "base")
    teacher = _teacher_dir(base, tmp_path / "teacher")
    algo = ["algo.name=distill", f"algo.teacher_path={teacher}", f"model.path={base}"]
    w_in, m_in = _run(tmp_path, "inline", algo)
    w_wk, m_wk = _run(tmp_path, "worker", algo + ["placement.teacher=worker", "placement.teacher_cpus=0.5"])
    assert len(m_in) == len(m_wk) == 3
    assert all(r["rollout/reverse_kl"] > 1e-3 for r in m_in)  # the teacher differs: a signal
    assert all(r["perf/teacher_prefetched"] == 1 for r in m_wk)  # the pipeline's result was used
    assert sum(r["perf/teacher_busy_s"] for r in m_wk) > 0
    assert all(0 <= r["perf/teacher_idle_s"] <= r["perf/step_s"] for r in m_wk)
    assert not any("perf/teacher_busy_s" in r for r in m_in)
    for k in w_in:
        assert torch.allclose(w_in[k], w_wk[k], atol=1e-6, rtol=0), k
    for a, b in zip(m_in, m_wk):
        assert a["loss/loss"] == pytest.approx(b["loss/loss"], abs=1e-6)
        assert a["rollout/reverse_kl"] == pytest.approx(b["rollout/reverse_kl"], abs=1e-6)
        assert a["adv/reverse_kl"] == pytest.approx(b["adv/reverse_kl"], abs=1e-6)
