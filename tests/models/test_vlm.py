"""The embedded tiny vision-language model (issue 26): built from a config with our offline
tokenizer and a PIL image processor, saved, reloaded with the Auto classes, and run on an
image."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from agentrl.models.vlm import (
    IMAGE_PAD,
    VISION_END,
    VISION_START,
    build_tiny_vlm,
    encode_images,
    expand_image_pads,
    image_token_counts,
    is_vlm_dir,
    load_vlm,
)

TEXTS = ["how many red squares are there?", "which cell holds the circle?", "row 1 column 2",
         "wrong, look again"] * 5


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    return build_tiny_vlm(tmp_path_factory.mktemp("vlm") / "m", TEXTS, hidden_size=64, num_layers=2,
                          num_heads=4, intermediate_size=128, vocab_size=400, seed=0)


def _ids_and_pixels(tok, ip, images, text="how many?"):
    parts = [{"type": "image", "image": im} for im in images] + [{"type": "text", "text": text}]
    ids = tok.apply_chat_template([{"role": "user", "content": parts}], tokenize=False,
                                  add_generation_prompt=True)
    ids = tok.encode(ids, add_special_tokens=False)
    px = encode_images(ip, images)
    pad = tok.convert_tokens_to_ids(IMAGE_PAD)
    return expand_image_pads(ids, pad, image_token_counts(px["image_grid_thw"])), px, pad


def test_build_save_reload_forward_with_an_image(vlm_dir):
    from transformers import Qwen2VLForConditionalGeneration

    files = {p.name for p in __import__("pathlib").Path(vlm_dir).iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "preprocessor_config.json",
            "chat_template.jinja"} <= files
    assert is_vlm_dir(vlm_dir)
    cfg = json.loads((__import__("pathlib").Path(vlm_dir) / "config.json").read_text())
    assert cfg["model_type"] == "qwen2_vl" and cfg["vision_config"]["depth"] == 2
    model, tok, ip = load_vlm(vlm_dir)
    assert isinstance(model, Qwen2VLForConditionalGeneration)
    assert sum(p.numel() for p in model.parameters()) < 1_000_000
    # the template renders an image part as start, one pad, end (the pad widened later)
    text = tok.apply_chat_template([{"role": "user", "content": [
        {"type": "image", "image": np.zeros((56, 56, 3), np.uint8)}, {"type": "text", "text": "hi"}]}],
        tokenize=False, add_generation_prompt=True)
    assert text == f"<|im_start|>user\n{VISION_START}{IMAGE_PAD}{VISION_END}hi<|im_end|>\n<|im_start|>assistant\n"
    for t in (VISION_START, IMAGE_PAD, VISION_END):  # each a single special id
        assert len(tok.encode(t, add_special_tokens=False)) == 1
    img = np.random.default_rng(0).integers(0, 256, (56, 84, 3), dtype=np.uint8)
    ids, px, pad = _ids_and_pixels(tok, ip, [img])
    # 56x84 -> a 4x6 grid of 14-px patches -> 24 / 2**2 = 6 image tokens
    assert px["image_grid_thw"].tolist() == [[1, 4, 6]] and px["pixel_values"].shape == (24, 3 * 2 * 14 * 14)
    assert ids.count(pad) == 6
    input_ids = torch.tensor([ids])
    mm = (input_ids == pad).long()
    with torch.no_grad():
        out = model(input_ids=input_ids, pixel_values=px["pixel_values"],
                    image_grid_thw=px["image_grid_thw"], mm_token_type_ids=mm)
        other = model(input_ids=input_ids, pixel_values=encode_images(ip, [255 - img])["pixel_values"],
                      image_grid_thw=px["image_grid_thw"], mm_token_type_ids=mm)
    assert out.logits.shape == (1, len(ids), len(tok)) and torch.isfinite(out.logits).all()
    # the image is seen: different pixels change the logits after the image, not before it
    first = ids.index(pad)
    assert torch.equal(out.logits[0, :first], other.logits[0, :first])
    assert (out.logits[0, -1] - other.logits[0, -1]).abs().max() > 1e-4


def test_same_seed_same_weights_and_auto_classes(vlm_dir, tmp_path):
    from transformers import AutoImageProcessor, AutoModelForImageTextToText

    again = build_tiny_vlm(tmp_path / "m", TEXTS, hidden_size=64, num_layers=2, num_heads=4,
                           intermediate_size=128, vocab_size=400, seed=0)
    a = AutoModelForImageTextToText.from_pretrained(vlm_dir).state_dict()
    b = AutoModelForImageTextToText.from_pretrained(again).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert type(AutoImageProcessor.from_pretrained(vlm_dir)).__name__.startswith("Qwen2VLImageProcessor")


def test_expand_image_pads_and_errors(tmp_path):
    assert expand_image_pads([5, 9, 7, 9], 9, [2, 3]) == [5, 9, 9, 7, 9, 9, 9]
    with pytest.raises(ValueError, match="2 image placeholders .* for 1 images"):
        expand_image_pads([9, 9], 9, [4])
    assert image_token_counts(torch.tensor([[1, 4, 6], [1, 8, 8]])) == [6, 16]
    with pytest.raises(ValueError, match="head dimension 6"):
        build_tiny_vlm(tmp_path / "x", TEXTS, hidden_size=24, num_heads=4, vocab_size=300)
    with pytest.raises(ValueError, match="not a vision-language model"):
        load_vlm(tmp_path)


def test_model_vision_builds_the_vlm_and_refuses_what_cannot_run_with_images(tmp_path, monkeypatch):
    import agentrl.run as run
    import agentrl.startup as startup
    from agentrl.config import load_config

    monkeypatch.setattr(run, "TOKENIZER_TASKS", 20)  # the toy env's texts; keeps the test fast
    small = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
             "model.intermediate_size=64", "model.vocab_size=300"]
    cfg = load_config(None, ["env.name=toy", "model.vision=true", "sft.steps=0", *small])
    path = run.default_model_dir(cfg, tmp_path)
    assert path == str(tmp_path / "base_vlm") and is_vlm_dir(path)
    model, tok, where = run.load_policy(cfg, tmp_path, None)
    assert where == path and model.config.text_config.hidden_size == 32
    v = model.config.vision_config
    assert (v.depth, v.embed_dim, v.num_heads) == (2, 32, 2)  # model.vision_* defaults
    assert type(tok.image_processor).__name__.startswith("Qwen2VLImageProcessor")
    text = "Say the word apple."  # the toy env's prompt: the tokenizer learnt merges from it
    assert len(tok.encode(text, add_special_tokens=False)) < len(text) // 2
    for bad, key in [("placement.reference=worker", "placement.reference"), ("model.lora_r=4", "lora_r=0"),
                     ("algo.name=ppo", "without a value head"), ("train.learner_workers=2", "learner_workers=0")]:
        with pytest.raises(ValueError, match=key):
            run.load_policy(load_config(None, ["env.name=toy", "model.vision=true", "sft.steps=0", bad]),
                            tmp_path, None)
    with pytest.raises(ValueError, match="model.lora_r=0"):  # a VLM model.path is vision too
        run.load_policy(load_config(None, ["env.name=toy", f"model.path={path}", "model.lora_r=4"]),
                        tmp_path, None)
    # Ray rollout workers and vLLM run a vision policy (tests/e2e/test_vision_workers.py,
    # tests/e2e/test_vllm_vision.py): not refused
    startup.check_vision_training(load_config(None, ["env.name=toy", "model.vision=true", "rollout.num_workers=2",
                                                 "rollout.engine=vllm"]))
    assert not is_vlm_dir(tmp_path)


def test_train_and_eval_visual_count_on_the_embedded_vlm_subprocess(tmp_path):
    """`agentrl train --env visual_count model.vision=true` runs a 2-step SFT warm start on
    image examples and 2 GRPO steps as a subprocess (sampler and learner logprobs agree:
    `loss/logp_mismatch` < 1e-4), its SFT model and checkpoint are VLM directories that the Auto
    classes load, and `agentrl eval` runs on it."""
    import math
    import os
    import subprocess
    import sys
    from pathlib import Path

    from transformers import AutoImageProcessor, AutoModelForImageTextToText

    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    cli = [sys.executable, "-m", "agentrl.cli"]
    train = [*cli, "train", "--env", "visual_count", "--algo", "grpo", "--steps", "2", "--out", str(out),
             "model.vision=true", "sft.steps=2", "sft.batch_size=4", "rollout.tasks_per_step=2",
             "algo.group_size=2",
             "train.eval_tasks=2", "train.eval_samples=1", "model.hidden_size=32", "model.num_layers=1",
             "model.num_heads=2", "model.intermediate_size=64", "model.vocab_size=300",
             "rollout.max_tokens=6"]
    r = subprocess.run(train, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    gaps = [row["loss/logp_mismatch"] for row in rows if "loss/logp_mismatch" in row]
    assert len(gaps) == 2 and max(gaps) < 1e-4
    sft = [json.loads(line) for line in (out / "sft_metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in sft] == [0, 1] and all(math.isfinite(row["sft/loss"]) for row in sft)
    assert is_vlm_dir(out / "sft_model")
    ck = out / "checkpoints" / "step_2"
    assert is_vlm_dir(ck)
    assert type(AutoModelForImageTextToText.from_pretrained(ck)).__name__ == "Qwen2VLForConditionalGeneration"
    assert AutoImageProcessor.from_pretrained(ck).merge_size == 2
    r = subprocess.run([*cli, "eval", "--model", str(out), "--out", str(tmp_path / "ev")], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    summary = json.loads((tmp_path / "ev" / "summary.json").read_text())
    assert summary["overall"]["episodes"] >= 1 and summary["overall"]["env_errors"] == 0
    rows = [json.loads(x) for x in (tmp_path / "ev" / "results.jsonl").read_text().splitlines()]
    # the board is written as its size, not as a PIL repr with a memory address
    assert rows[0]["messages"][0]["content"][0] == {"type": "image", "image": "<image 84x84>"}


def test_model_vision_tower_size_keys(tmp_path, monkeypatch):
    """`model.vision_width` / `vision_depth` / `vision_heads` size the embedded VLM's vision
    tower; a head dimension that the tower's 2-D rotary cannot split fails at start-up."""
    import agentrl.run as run
    from agentrl.config import ConfigError, load_config

    monkeypatch.setattr(run, "TOKENIZER_TASKS", 20)
    small = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
             "model.intermediate_size=64", "model.vocab_size=300"]
    cfg = load_config(None, ["env.name=toy", "model.vision=true", "sft.steps=0", *small,
                             "model.vision_width=48", "model.vision_depth=3", "model.vision_heads=4"])
    model, _, _ = run.load_policy(cfg, tmp_path, None)
    v = model.config.vision_config
    assert (v.depth, v.embed_dim, v.num_heads, v.hidden_size) == (3, 48, 4, 32)
    assert len(model.model.visual.blocks) == 3
    for bad in (["model.vision_width=48", "model.vision_heads=5"], ["model.vision_width=24", "model.vision_heads=4"]):
        with pytest.raises((ConfigError, ValueError), match="vision_heads"):
            load_config(None, ["env.name=toy", "model.vision=true", *bad])


def _weight_stds(model) -> dict[str, float]:
    named = dict(model.named_parameters())
    return {k: float(named[k].detach().std()) for k in named if named[k].dim() >= 2}


def test_model_init_std_sets_the_initialisation_of_both_embedded_models(tmp_path, monkeypatch):
    """`model.init_std` is the `initializer_range` of the embedded VLM's text and vision configs
    (every weight matrix, the patch embedding and the token embedding drawn with that std) and
    of the embedded text model; unset, the VLM gets 0.1 (`VISION_DEFAULTS`) and the text model
    keeps transformers' 0.02."""
    import agentrl.run as run
    from agentrl.config import load_config
    from agentrl.run import resolve_run_defaults

    monkeypatch.setattr(run, "TOKENIZER_TASKS", 20)
    small = ["model.hidden_size=64", "model.num_layers=1", "model.num_heads=2",
             "model.intermediate_size=128", "model.vocab_size=300", "sft.steps=0"]
    for i, (extra, want) in enumerate([(["model.vision=true"], 0.1), (["model.vision=true", "model.init_std=0.03"], 0.03),
                                       ([], 0.02), (["model.init_std=0.05"], 0.05)]):
        cfg = resolve_run_defaults(load_config(None, ["env.name=toy", *small, *extra]))
        assert cfg.model.init_std == (None if want == 0.02 else want)
        model, _, _ = run.load_policy(cfg, tmp_path / str(i), None)
        stds = _weight_stds(model)
        if "model.vision=true" in extra:
            assert model.config.text_config.initializer_range == want
            assert model.config.vision_config.initializer_range == want
            assert any("patch_embed" in k for k in stds) and any("visual.blocks" in k for k in stds)
        assert len(stds) > 5
        # thousands of draws per matrix: each std within 10% of the asked one
        assert all(abs(s / want - 1) < 0.1 for k, s in stds.items() if "norm" not in k), stds
