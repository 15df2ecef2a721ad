"""Batched image sampling and the learner's batched forward with pixels, on the real embedded
tiny VLM: `VisionHFEngine` generates all rows of a call together (left-padded prompts, pixels
concatenated, each row's own M-RoPE positions) and `token_logprobs(vision=...)` runs one forward
per micro-batch; both must give what one row alone gives."""

from __future__ import annotations

import pytest
import torch

from agentrl.rollout.agent_loop import EpisodeSpec, run_episodes
from agentrl.rollout.engines.base import SamplingParams

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    from agentrl.models.vlm import build_tiny_vlm, load_vlm

    d = build_tiny_vlm(tmp_path_factory.mktemp("vlm") / "m", ["How many red squares are in the image?",
                       "Wrong, look again.", "Which cell holds the circle? 1,2"] * 5,
                       hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, vocab_size=320,
                       init_std=0.1)
    return load_vlm(d)


def _engine(vlm, **kw):
    from agentrl.rollout.chat import VisionChatRenderer
    from agentrl.rollout.engines.hf_vision import VisionHFEngine

    model, tok, ip = vlm
    r = VisionChatRenderer(tok, ip)
    return VisionHFEngine(model, image_token_id=r.image_token_id, banned_ids=r.vision_token_ids, **kw), r


def _first_images(vis, k):
    """The first `k` images of a trajectory's `vision`."""
    n = int(vis["image_grid_thw"][:k].prod(-1).sum())
    return {"pixel_values": vis["pixel_values"][:n], "image_grid_thw": vis["image_grid_thw"][:k]}


@pytest.fixture(scope="module")
def episodes(vlm):
    """Two-turn `visual_count` episodes (both questions; the feedback repeats the image)."""
    from agentrl_envs.visual_count import VisualCountEnv

    eng, r = _engine(vlm)
    envs = [VisualCountEnv(questions=["count", "where"], max_turns=2, feedback_image=True) for _ in range(4)]
    p = SamplingParams(temperature=1.0, max_tokens=4, stop_token_ids=r.stop_ids)
    return run_episodes(eng, r, envs, [EpisodeSpec({"options": {"task": k}}) for k in range(4)], p, seed=3)


@pytest.fixture(scope="module")
def prompts(vlm, episodes):
    """Prompts of different lengths: one-turn (one image) and two-turn (two images) prompts of
    different questions, plus a text-only one (no images in the same batch)."""
    _, tok, _ = vlm
    ids, vis = [], []
    for tr in episodes:
        for k, turn in enumerate(tr.turns[:2]):
            ids.append(tr.token_ids[:turn.start])
            vis.append(_first_images(tr.vision, k + 1))
    text = tok.apply_chat_template([{"role": "user", "content": "Wrong, look again."}],
                                   add_generation_prompt=True, tokenize=True)
    text = text["input_ids"] if isinstance(text, dict) or hasattr(text, "keys") else text
    ids.append(list(text))
    vis.append(None)
    assert len({len(p) for p in ids}) >= 3 and sum(v is not None and len(v["image_grid_thw"]) == 2 for v in vis) >= 2
    return ids, vis


def test_batched_sampler_logprobs_equal_teacher_forced(vlm, prompts):
    """Temperature 1, n = 3, a stop set that ends rows at different steps: every returned
    token's sampler logprob equals the teacher-forced one of prompt + completion (ratio 1), no
    vision token is sampled, and a row's output ends at its first stop token."""
    from agentrl.models.vision_logprobs import vision_logprobs

    model, _, _ = vlm
    eng, r = _engine(vlm)
    ids, vis = prompts
    stops = [*r.stop_ids, *range(40, 120)]
    p = SamplingParams(temperature=1.0, max_tokens=8, n=3, seed=0, stop_token_ids=stops)
    outs = eng.generate(ids, p, images=vis)
    assert len(outs) == 3 * len(ids)
    lens = {len(c.token_ids) for c in outs}
    assert len(lens) > 1 and any(c.finish_reason == "stop" for c in outs)
    for k, c in enumerate(outs):
        prompt, v = ids[k // 3], vis[k // 3]
        assert len(c.token_ids) == len(c.logprobs) >= 1
        assert not set(c.token_ids) & set(r.vision_token_ids)
        if c.finish_reason == "stop":
            assert c.token_ids[-1] in stops and not set(c.token_ids[:-1]) & set(stops)
        else:
            assert len(c.token_ids) == 8 and not set(c.token_ids) & set(stops)
        lp = vision_logprobs(model, prompt + c.token_ids, v, image_token_id=r.image_token_id,
                             banned_ids=r.vision_token_ids)[len(prompt):]
        got = torch.tensor(c.logprobs)
        assert (lp - got).abs().max() < 1e-4, (k, (lp - got).abs().max())


def test_batched_equals_one_row_at_a_time(vlm, prompts):
    """Greedy: batched tokens equal each row generated alone (a batch of one). Seeded at
    temperature 1: the batched call equals the unbatched path (`max_batch=1`) of the same call,
    tokens exactly and logprobs to float32 rounding, and a chunked call (`max_batch=4`) too."""
    eng, r = _engine(vlm)
    ids, vis = prompts
    g = SamplingParams(temperature=0.0, max_tokens=6, n=2, stop_token_ids=r.stop_ids)
    batched = eng.generate(ids, g, images=vis)
    for i, (p, v) in enumerate(zip(ids, vis, strict=True)):
        alone = eng.generate([p], g, images=[v])
        assert [c.token_ids for c in alone] == [c.token_ids for c in batched[2 * i:2 * i + 2]]
    s = SamplingParams(temperature=1.0, max_tokens=6, n=2, seed=5, stop_token_ids=[*r.stop_ids, *range(40, 80)])
    want = _engine(vlm, max_batch=1)[0].generate(ids, s, images=vis)
    for mb in (128, 4):
        got = _engine(vlm, max_batch=mb)[0].generate(ids, s, images=vis)
        assert [c.token_ids for c in got] == [c.token_ids for c in want]
        assert [c.finish_reason for c in got] == [c.finish_reason for c in want]
        gap = max(abs(a - b) for x, y in zip(got, want, strict=True) for a, b in zip(x.logprobs, y.logprobs))
        assert gap < 1e-5


def test_stale_rope_deltas_do_not_leak(vlm, prompts):
    """The model's cached `rope_deltas` (left by its own forward or `generate`) do not move the
    engine's positions: explicit positions are passed at prefill and decode."""
    model, _, _ = vlm
    eng, r = _engine(vlm)
    ids, vis = prompts
    g = SamplingParams(temperature=0.0, max_tokens=4, stop_token_ids=r.stop_ids)
    before = eng.generate(ids[-1:], g, images=vis[-1:])  # the text-only prompt
    inner = model.model
    old = inner.rope_deltas
    try:
        inner.rope_deltas = torch.tensor([[-50]])
        after = eng.generate(ids[-1:], g, images=vis[-1:])
    finally:
        inner.rope_deltas = old
    assert after[0].token_ids == before[0].token_ids
    assert max(abs(a - b) for a, b in zip(after[0].logprobs, before[0].logprobs)) < 1e-6


def test_learner_batched_vision_logprobs_equal_per_row(vlm, episodes):
    """`token_logprobs(vision=...)` on right-padded rows of unequal lengths (images and a
    text-only row) equals the per-row forward (`vision_logprobs`) within 1e-5 at every real
    position, through `Learner.logprobs` at micro-batch sizes 1 and 3 too; vision tokens get
    probability 0 (their logprob is the lowest float32 after the log-softmax)."""
    from agentrl.algos.shaping import build_batch
    from agentrl.learner.forward import token_logprobs
    from agentrl.learner.local import Learner
    from agentrl.models.vision_logprobs import vision_logprobs

    model, tok, _ = vlm
    _, r = _engine(vlm)
    batch = build_batch(list(episodes), pad_id=tok.pad_token_id)
    assert len(set(batch["lengths"].tolist())) > 1
    ref = torch.zeros_like(batch["loss_mask"], dtype=torch.float32)
    for i, tr in enumerate(episodes):
        ref[i, :len(tr.token_ids)] = vision_logprobs(model, tr.token_ids, tr.vision, image_token_id=r.image_token_id,
                                                     banned_ids=r.vision_token_ids)
    real = batch["attention_mask"].bool() & torch.isfinite(ref)  # vision tokens: -inf in the reference
    assert (~torch.isfinite(ref)).any()
    with torch.no_grad():
        lp, ent = token_logprobs(model, batch["input_ids"], batch["attention_mask"], vision=batch["vision"],
                                 with_entropy=True)
    assert (lp - ref)[real].abs().max() < 1e-5 and torch.isfinite(ent).all()
    assert (lp[batch["attention_mask"].bool() & ~real] < -1e30).all()
    for mbs in (1, 3):
        got = Learner(model, lr=1e-3, micro_batch_size=mbs).logprobs(batch)
        assert (got - ref)[real].abs().max() < 1e-5, mbs
    # a text-only row among image rows, and a vision token id inside a row: probability 0
    text = episodes[0].token_ids[:5]
    rows = [episodes[1].token_ids, text, episodes[2].token_ids]
    vis = [episodes[1].vision, None, episodes[2].vision]
    width = max(map(len, rows))
    ids = torch.tensor([x + [tok.pad_token_id] * (width - len(x)) for x in rows])
    mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in rows])
    with torch.no_grad():
        lp = token_logprobs(model, ids, mask, vision=vis)[0]
    for i, (x, v) in enumerate(zip(rows, vis, strict=True)):
        want = vision_logprobs(model, x, v, image_token_id=r.image_token_id, banned_ids=r.vision_token_ids)
        fin = torch.isfinite(want)
        assert (lp[i, :len(x)][fin] - want[fin]).abs().max() < 1e-5
        assert (lp[i, :len(x)][~fin] < -1e30).all()
    start = [k for k, t in enumerate(rows[0]) if t in r.vision_token_ids][0]  # <|vision_start|>
    assert lp[0, start] < -1e30


@pytest.mark.slow
def test_benchmark_runs(tmp_path):
    """benchmarks/vision_engine_batching.py end to end at tiny settings: both arms give the same
    completions and the learner's two paths the same logprobs."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "r.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)}
    subprocess.run([sys.executable, str(root / "benchmarks" / "vision_engine_batching.py"), "--prompts", "3",
                    "--n", "2", "--max-tokens", "3", "--repeats", "1", "--json", str(out)],
                   check=True, env=env, capture_output=True, timeout=600)
    res = json.loads(out.read_text())
    assert res["generate"]["same_tokens_rows"] == 6 and res["generate"]["max_logprob_gap"] < 1e-4
    assert res["learner"]["max_logprob_gap"] < 1e-4 and res["generate"]["ratio_wall"] > 0
