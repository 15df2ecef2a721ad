"""Where the rollout side runs (issue 39, faults 4, 5, 7, 10, 11), on the CPU with real parts:
`rollout.device` reaching the hf engine's model (in this process, from a directory, in a rollout
worker), the reward model's device, meta-device models and CUDA asked for without CUDA refused
clearly; vLLM's memory share beside a learner on one GPU (hand-computed figures), its defaults
per platform, the tested version range and the weight-push buckets (the push itself runs in the
vLLM stage, tests/e2e/test_vllm_multiproc.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from agentrl.config import Config, load_config
from agentrl.infra.devices import GiB, check_engine_share, engine_share, learner_bytes_per_param
from agentrl.models.tiny import load_model
from agentrl.rollout.engines.hf import HFEngine
from agentrl.rollout.engines.make import (
    engine_memory_config,
    make_engine,
    rollout_device,
    shares_learner_gpu,
    vllm_dtype,
    vllm_engine_kwargs,
)
from agentrl.rollout.engines.vllm import VLLM_TESTED, _group_key, check_vllm_version, weight_buckets

NO_CUDA = not torch.cuda.is_available()
ROOT = Path(__file__).resolve().parents[2]


def cfg(*overrides: str) -> Config:
    return load_config(None, list(overrides))


def devices(engine) -> set[str]:
    return {str(p.device) for p in engine.model.parameters()}


# -- fault 7: rollout.device -------------------------------------------------------------------
def test_rollout_device_rules():
    assert rollout_device(cfg("rollout.device=cpu")) == torch.device("cpu")
    assert rollout_device(cfg("train.device=cpu")) == torch.device("cpu")  # auto follows the learner
    assert rollout_device(cfg(), worker_gpus=0.0) == torch.device("cpu")  # a worker without a GPU
    want = "cpu" if NO_CUDA else "cuda"
    assert rollout_device(cfg()).type == want
    assert rollout_device(cfg(), worker_gpus=1.0).type == want


@pytest.mark.skipif(not NO_CUDA, reason="checks the refusal where CUDA is absent")
def test_rollout_device_cuda_without_cuda_is_refused(tiny_model_dir):
    with pytest.raises(ValueError, match=r"rollout.device=cuda: no CUDA device"):
        rollout_device(cfg("rollout.device=cuda"))
    with pytest.raises(ValueError, match=r"rollout.device=cuda: no CUDA device"):
        make_engine(cfg("rollout.device=cuda"), tiny_model_dir)


def test_rollout_device_cuda_refused_for_workers_without_gpus():
    with pytest.raises(ValueError, match=r"rollout.device=cuda .* rollout.worker_gpus > 0"):
        cfg("rollout.device=cuda", "rollout.num_workers=2")


def test_device_named_cpu_reaches_the_engine_model(tiny_model_dir):
    c = cfg("rollout.device=cpu")
    model, tok = load_model(tiny_model_dir)
    live, _ = make_engine(c, model, tok)
    from_dir, _ = make_engine(c, tiny_model_dir)
    assert live.device == from_dir.device == torch.device("cpu")
    assert devices(live) == devices(from_dir) == {"cpu"}
    # an explicit device (a Ray worker's) wins over the config's rule
    assert make_engine(cfg(), tiny_model_dir, device="cpu")[0].device == torch.device("cpu")


def test_rollout_worker_puts_its_engine_on_its_device(tiny_model_dir):
    from agentrl.rollout.workers import RolloutWorker

    w = RolloutWorker(cfg("rollout.device=cpu"), tiny_model_dir, gpus=0.0, env_factory=lambda split: None)
    assert w.engine.device == torch.device("cpu") and devices(w.engine) == {"cpu"}


def test_a_model_on_the_meta_device_is_refused(tiny_model_dir):
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_model_dir))
    with pytest.raises(ValueError, match=r"meta device .*load its weights"):
        HFEngine(meta, device="cpu")
    with pytest.raises(ValueError, match=r"meta device"):
        make_engine(cfg("rollout.device=cpu"), meta, None)


def test_reward_model_device(tmp_path):
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    from _reward_fixtures import build_tiny_classifier

    from agentrl.rewards.classifier import SequenceClassifier
    from agentrl.rewards.remote import ClassifierActor, actor_device

    assert actor_device(0.0) == "cpu" and actor_device(0.5) == "cuda" and actor_device(1) == "cuda"
    path = build_tiny_classifier(tmp_path / "cls")
    clf = SequenceClassifier(path, device="cpu")
    assert clf.device == torch.device("cpu") and {p.device.type for p in clf.model.parameters()} == {"cpu"}
    actor = ClassifierActor(path, device="cpu")  # the class Ray runs, here in this process
    assert actor.logits(["a prompt"], ["a response"]).shape == (1, 2)
    if NO_CUDA:
        with pytest.raises(ValueError, match="reward model device=cuda: no CUDA device"):
            ClassifierActor(path, device="cuda")


# -- fault 4: vLLM's share of a GPU shared with the learner ------------------------------------
def test_engine_share_hand_computed():
    """80 GiB GPU, 1.5e9 parameters, reference in the learner: learner 1.5e9 * 20 B = 27.94 GiB,
    margin 8 GiB, share floor(100 * (80 - 27.94 - 8) / 80) / 100 = 0.55; vLLM bf16 weights
    2.79 GiB, KV cache 0.55 * 80 - 2.79 = 41.2 GiB."""
    s = engine_share(80 * GiB, 1_500_000_000, engine_dtype_bytes=2,
                     learner_bytes_per_param=learner_bytes_per_param(reference=True, lora=False))
    assert s.learner_bytes == 30_000_000_000 and s.margin_bytes == 8 * GiB
    assert s.share == 0.55 and s.fits
    assert s.kv_bytes == int(0.55 * 80 * GiB) - 3_000_000_000
    assert "vLLM share 0.55" in s.describe() and "learner 27.9 GiB" in s.describe()
    # without a reference: 16 B/param -> floor(100 * (80 - 22.35 - 8) / 80) / 100 = 0.62
    assert engine_share(80 * GiB, 1_500_000_000, engine_dtype_bytes=2, learner_bytes_per_param=16).share == 0.62
    assert learner_bytes_per_param(reference=True, lora=True) == 4


def test_engine_share_refuses_what_cannot_fit():
    # 7e9 params on 80 GiB: learner 7e9 * 20 B = 130 GiB > the GPU
    s = engine_share(80 * GiB, 7_000_000_000, engine_dtype_bytes=2, learner_bytes_per_param=20)
    assert s.share == 0.0 and not s.fits
    with pytest.raises(ValueError, match=r"do not fit on one GPU: GPU 80.0 GiB: learner 130.4 GiB"):
        check_engine_share(s)
    # a share set by hand that leaves the learner too little: 0.9 of 80 GiB + 22 GiB > 80 GiB
    s = engine_share(80 * GiB, 1_500_000_000, engine_dtype_bytes=2, learner_bytes_per_param=16, share=0.9)
    assert not s.fits
    # a share that fits beside the learner but leaves too little KV cache: 2e9 * 4 B of float32
    # weights in a 0.1 * 80 GiB = 8.59e9 B share leaves 0.59e9 B < 1 GiB
    s = engine_share(80 * GiB, 2_000_000_000, engine_dtype_bytes=4, learner_bytes_per_param=4, share=0.1)
    assert s.kv_bytes == int(0.1 * 80 * GiB) - 8_000_000_000 and s.kv_bytes < GiB and not s.fits
    with pytest.raises(ValueError, match=r"share"):
        engine_share(80 * GiB, 10, engine_dtype_bytes=2, learner_bytes_per_param=16, share=1.5)


def test_engine_memory_config_on_a_shared_gpu():
    said: list[str] = []
    base = cfg("rollout.engine=vllm")
    assert shares_learner_gpu(base, cuda=True) and not shares_learner_gpu(base, cuda=False)
    assert not shares_learner_gpu(cfg("rollout.engine=vllm", "train.device=cpu"), cuda=True)
    assert not shares_learner_gpu(cfg("rollout.engine=vllm", "rollout.num_workers=1"), cuda=True)
    assert shares_learner_gpu(cfg("rollout.engine=vllm", "rollout.num_workers=1", "rollout.worker_gpus=1"),
                              cuda=True)
    got = engine_memory_config(base, 1_500_000_000, reference=True, say=said.append, cuda=True,
                               gpu_bytes=80 * GiB)
    assert got.rollout.gpu_memory_utilization == 0.55 and base.rollout.gpu_memory_utilization is None
    assert said and said[0].startswith("[memory] vLLM shares the learner's GPU: GPU 80.0 GiB")
    assert vllm_engine_kwargs(got, cuda=True)["gpu_memory_utilization"] == 0.55
    assert "gpu_memory_utilization" not in vllm_engine_kwargs(got, cuda=False)
    # set by hand: kept (and checked)
    hand = cfg("rollout.engine=vllm", "rollout.gpu_memory_utilization=0.3")
    assert engine_memory_config(hand, 1_500_000_000, reference=True, say=said.append, cuda=True,
                                gpu_bytes=80 * GiB).rollout.gpu_memory_utilization == 0.3
    with pytest.raises(ValueError, match="do not fit on one GPU"):
        engine_memory_config(base, 7_000_000_000, reference=True, say=said.append, cuda=True,
                             gpu_bytes=80 * GiB)
    # not shared (CPU, or learner on CPU): the config unchanged, nothing said
    n = len(said)
    assert engine_memory_config(base, 7_000_000_000, reference=True, say=said.append, cuda=False) is base
    assert len(said) == n
    with pytest.raises(ValueError, match="both set"):
        cfg("rollout.gpu_memory_utilization=0.5", "rollout.vllm_kwargs={gpu_memory_utilization: 0.4}")


# -- fault 10: vLLM defaults per platform --------------------------------------------------------
def test_vllm_dtype_defaults_per_platform():
    assert vllm_dtype(cfg(), cuda=True) == "bfloat16" and vllm_dtype(cfg(), cuda=False) == "float32"
    assert vllm_dtype(cfg("model.dtype=float32"), cuda=True) == "float32"  # set: kept
    assert vllm_dtype(cfg("model.dtype=bfloat16"), cuda=False) == "bfloat16"
    kw = vllm_engine_kwargs(cfg("rollout.weight_bucket_mb=3", "rollout.vllm_kwargs={enforce_eager: true}"),
                            cuda=True)
    assert kw["bucket_bytes"] == 3 << 20 and kw["enforce_eager"] is True and kw["dtype"] == "bfloat16"


# -- fault 11: the tested vLLM range ----------------------------------------------------------------
def test_vllm_version_range_and_pyproject_pin():
    for ok in ("0.32.0", "0.32.3", "0.32.0+cpu", "0.32.1rc1"):
        check_vllm_version(ok)
    for bad in ("0.31.2", "0.33.0", "1.0.0", "0.4.0"):
        with pytest.raises(RuntimeError, match=rf"vLLM {re.escape(bad)} is installed; .*vllm>=0.32.0,<0.33"):
            check_vllm_version(bad)
    pin = re.search(r'^vllm = \["vllm([^"]*)"\]', (ROOT / "pyproject.toml").read_text(), re.M)
    assert pin and pin.group(1) == f">={VLLM_TESTED[0]},<{VLLM_TESTED[1]}"


# -- fault 5: weight-push buckets ---------------------------------------------------------------------
def test_weight_buckets_keep_layers_whole_and_bound_the_size(tiny_model_dir):
    model, _ = load_model(tiny_model_dir)
    sd = model.state_dict()
    layer = sum(v.numel() for k, v in sd.items() if k.startswith("model.layers.0.")) * 2  # bf16 bytes
    buckets = weight_buckets(sd, torch.bfloat16, layer + 1)
    assert [k for b in buckets for k in b] == list(sd)  # every key once, in order
    assert len(buckets) >= 3  # embeddings, then a layer or two per bucket
    for b in buckets:
        assert all(t.dtype == torch.bfloat16 and t.device.type == "cpu" for t in b.values())
        groups = {_group_key(k) for k in b}
        size = sum(t.numel() * 2 for t in b.values())
        assert size <= layer + 1 or len(groups) == 1  # bounded, or one group alone
        for g in groups:  # a group is never split across buckets
            assert {k for k in sd if _group_key(k) == g} <= set(b)
    assert _group_key("model.layers.12.self_attn.q_proj.weight") == "model.layers.12"
    assert _group_key("model.embed_tokens.weight") == "model.embed_tokens"
    assert _group_key("lm_head.weight") == "lm_head"
    one = weight_buckets(sd, torch.float32, 1 << 40)
    assert len(one) == 1 and all(torch.equal(one[0][k], v) for k, v in sd.items())
    with pytest.raises(ValueError, match="positive"):
        weight_buckets(sd, torch.float32, 0)
