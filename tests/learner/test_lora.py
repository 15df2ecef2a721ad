"""LoRA (PEFT): only adapter parameters train; the reference is the base with adapters disabled
(no copy); the engine gets merged weights; checkpoints hold loadable adapters that merge into a
plain model; a LoRA run resumes exactly."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("peft", reason="LoRA needs the lora extra (peft)")

from agentrl.config import load_config  # noqa: E402
from agentrl.learner.local import Learner  # noqa: E402
from agentrl.learner.lora import (
    is_peft,
    load_checkpoint,
    merge_checkpoint,
    merged_state_dict,
    plain_copy,
    wrap_lora,
)
from agentrl.models.tiny import load_model  # noqa: E402
from agentrl.train import train  # noqa: E402

ARGS = ["env.name=toy", "sft.steps=0", "rollout.tasks_per_step=2", "algo.group_size=2",
        "train.eval_tasks=2", "train.eval_samples=1", "rollout.max_tokens=24",
        "env.kwargs={words: [x, the, def, return]}", "algo.kl_coef=0.05", "algo.entropy_coef=0.01",
        "model.lora_r=4", "model.lora_alpha=8", "train.lr=1e-2", "train.log_rollouts_every=0",
        "quiet=true"]
IDS = torch.tensor([[5, 17, 42, 99, 7, 3], [11, 12, 13, 14, 15, 16]])


def _perturbed_lora(path: str):
    model, _ = load_model(path)
    wrapped = wrap_lora(model, r=4, alpha=8, target_modules="all-linear", base_path=path, seed=0)
    with torch.no_grad():  # B starts at 0 (adapters are a no-op): give them a value
        for n, p in wrapped.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(n))) * 0.1)
    return wrapped


def test_only_adapters_train_and_the_reference_is_the_base_without_a_copy(tiny_model_dir):
    base, _ = load_model(tiny_model_dir)
    model = _perturbed_lora(tiny_model_dir)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    learner = Learner(model, lr=1e-3, use_ref=True)
    assert learner.ref_model is None and learner.lora  # no second copy of the model
    opt_params = {id(p) for g in learner.optimizer.param_groups for p in g["params"]}
    assert opt_params == {id(p) for p in model.parameters() if p.requires_grad}
    batch = {"input_ids": IDS, "attention_mask": torch.ones_like(IDS),
             "loss_mask": torch.ones(IDS.shape), "lengths": torch.tensor([6, 6])}
    pol_before = learner.logprobs(batch)
    ref = learner.logprobs(batch, ref=True)
    pol = learner.logprobs(batch)
    from agentrl.learner.forward import token_logprobs

    with torch.no_grad():
        want, _ = token_logprobs(base, IDS, torch.ones_like(IDS))
    assert torch.allclose(ref, want, atol=1e-6)  # the reference is the untouched base
    assert (pol - ref).abs().max() > 1e-3  # the adapters change the policy
    assert torch.equal(pol, pol_before)  # adapters are enabled again after the reference pass


def test_engine_weights_are_the_merged_policy_and_merging_leaves_the_base_bit_exact(tiny_model_dir):
    model = _perturbed_lora(tiny_model_dir)
    base_before = {k: v.clone() for k, v in model.get_base_model().state_dict().items() if "lora_" not in k}
    sd = merged_state_dict(model)
    base_after = {k: v for k, v in model.get_base_model().state_dict().items() if "lora_" not in k}
    assert all(torch.equal(base_before[k], base_after[k]) for k in base_before)
    plain, _ = load_model(tiny_model_dir)
    assert set(sd) <= set(plain.state_dict()) and not any("lora" in k for k in sd)
    plain.load_state_dict(sd, strict=False)
    engine_model = plain_copy(model)
    assert not is_peft(engine_model)
    with torch.no_grad():
        want = model(input_ids=IDS).logits
        assert torch.allclose(plain(input_ids=IDS).logits, want, atol=1e-5)
        assert torch.allclose(engine_model(input_ids=IDS).logits, want, atol=1e-5)


def test_lora_run_trains_adapters_saves_loadable_adapters_and_merges(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "L"
    cfg = load_config(None, ARGS + ["train.steps=2", "train.save_every=1", f"model.path={tiny_model_dir}",
                                    f"out={out}"])
    train(cfg)
    ck = out / "checkpoints" / "step_2"
    assert (ck / "adapter_config.json").exists() and (ck / "adapter_model.safetensors").exists()
    assert not (ck / "model.safetensors").exists() and not (ck / "ref_model.pt").exists()
    saved = load_file(str(ck / "adapter_model.safetensors"))
    assert saved and all("lora_A" in k or "lora_B" in k for k in saved)
    assert max(float(v.abs().max()) for k, v in saved.items() if "lora_B" in k) > 0  # trained (init 0)

    model, _ = load_checkpoint(ck)
    assert is_peft(model)
    base = load_file(str(Path(tiny_model_dir) / "model.safetensors"))
    frozen = {k.replace("base_model.model.", "").replace(".base_layer", ""): v
              for k, v in model.state_dict().items() if "lora_" not in k}
    assert all(torch.equal(frozen[k], base[k]) for k in base)  # the base never moved

    merged_dir = merge_checkpoint(ck, tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(str(merged_dir))
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=IDS).logits, model(input_ids=IDS).logits, atol=1e-5)
    with pytest.raises(ValueError, match="not a LoRA checkpoint"):
        merge_checkpoint(merged_dir, tmp_path / "again")

    # resume from step 1 in a copy of the run: the same adapters at step 2
    R = tmp_path / "R"
    R.mkdir()
    for name in ("config.json", "eval_before.json"):
        shutil.copy(out / name, R / name)
    shutil.copytree(out / "checkpoints" / "step_1", R / "checkpoints" / "step_1")
    train(cfg.model_copy(update={"resume": str(R), "out": str(R)}))
    again = load_file(str(R / "checkpoints" / "step_2" / "adapter_model.safetensors"))
    assert max(float((again[k] - saved[k]).abs().max()) for k in saved) <= 1e-6


def test_adapters_find_their_base_in_a_moved_run_directory(tiny_model_dir, tmp_path):
    run = tmp_path / "moved_run"
    shutil.copytree(tiny_model_dir, run / "base_model")
    model = _perturbed_lora(tiny_model_dir)
    model.peft_config["default"].base_model_name_or_path = str(tmp_path / "gone" / "base_model")
    model.save_pretrained(run / "checkpoints" / "step_1")
    loaded, _ = load_checkpoint(run / "checkpoints" / "step_1")
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=IDS).logits, model(input_ids=IDS).logits, atol=1e-6)
    shutil.rmtree(run / "base_model")
    with pytest.raises(FileNotFoundError, match="gone/base_model"):
        load_checkpoint(run / "checkpoints" / "step_1")
