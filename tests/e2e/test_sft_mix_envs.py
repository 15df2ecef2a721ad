"""`sft.mix_envs`: one warm-start stage on the run's env's reference answers mixed with another
env's (here code_sandbox with self_propose), in the shares asked for; the embedded model's
tokenizer sees both envs' texts; a mix env without reference answers is refused at start-up."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from agentrl.config import ConfigError, load_config
from agentrl.rollout.chat import ChatRenderer


def test_mix_envs_parses_and_refuses_a_share_that_is_not_positive():
    assert load_config(None, ["sft.mix_envs={self_propose: 0.5}"]).sft.mix_envs == {"self_propose": 0.5}
    assert load_config(None, []).sft.mix_envs == {}
    for bad in ("0", "-1", ".nan"):
        with pytest.raises(ConfigError, match="mix_envs"):
            load_config(None, [f"sft.mix_envs={{self_propose: {bad}}}"])


def test_examples_mix_both_envs_in_the_shares_asked_for(tiny_tokenizer):
    from agentrl.rollout.envs import build_named_env
    from agentrl.sft import sft_examples, warm_start_examples

    renderer = ChatRenderer(tiny_tokenizer)
    cfg = load_config(None, ["sft.mix_envs={self_propose: 0.5}"])
    examples, counts = warm_start_examples(cfg, renderer, 20, seed=3)
    assert counts == {"code_sandbox": 20, "self_propose": 10}
    assert len(examples) == 30
    code = [t.turns[-1].text for t in examples[:20]]
    sp = [t.turns[-1].text for t in examples[20:]]
    assert all("def " in a and "Input:" not in a and "Output:" not in a for a in code)
    assert all(a.startswith(("```python", "Input:", "Output:")) for a in sp)  # propose/induce, abduce, deduce
    # the self_propose part is exactly that env's own examples (its seeds offset from the run's)
    alone = sft_examples(build_named_env(cfg, "self_propose", "train"), renderer, 10, seed=3 + 1_000_003)
    assert sp == [t.turns[-1].text for t in alone]
    assert [t.token_ids for t in examples[20:]] == [t.token_ids for t in alone]
    # no mix: the run's env alone, as before
    ex0, c0 = warm_start_examples(load_config(None, []), renderer, 20, seed=3)
    assert c0 == {"code_sandbox": 20} and [t.turns[-1].text for t in ex0] == code


def test_embedded_tokenizer_trains_on_the_mix_envs_texts_too(monkeypatch, tmp_path):
    import agentrl.run as run_mod

    seen = {}

    def fake_build(target, texts, **kw):
        seen["texts"] = texts
        return target

    monkeypatch.setattr(run_mod, "TOKENIZER_TASKS", 10)
    monkeypatch.setattr(run_mod, "build_tiny_model", fake_build)
    run_mod.default_model_dir(load_config(None, []), tmp_path / "a")
    plain = list(seen["texts"])
    run_mod.default_model_dir(load_config(None, ["sft.mix_envs={self_propose: 2.0}"]), tmp_path / "b")
    mixed = seen["texts"]
    assert mixed[:len(plain)] == plain  # the run's env's texts first, unchanged
    extra = mixed[len(plain):]
    assert any("Input:" in t for t in extra) and any("```python" in t for t in extra)
    assert not any("Input:" in t for t in plain)


def test_a_mix_env_without_reference_answers_is_refused(tmp_path):
    from agentrl.run import set_up

    with pytest.raises(ConfigError, match="sft.mix_envs: env safety offers no reference answers"):
        set_up(load_config(None, ["sft.mix_envs={safety: 1}"], out=str(tmp_path / "r")))
    with pytest.raises(ConfigError, match="sft.mix_envs: .*unknown environment 'nope'"):
        set_up(load_config(None, ["sft.mix_envs={nope: 1}"], out=str(tmp_path / "r2")))
    # without a warm start the key does nothing, and is not checked
    set_up(load_config(None, ["sft.mix_envs={safety: 1}", "sft.steps=0"], out=str(tmp_path / "r3")))


def test_train_with_a_mixed_warm_start(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    args = ["train", "--env", "code_sandbox", "--algo", "grpo", "--steps", "1", "--out", str(out), "-q",
            f"model.path={tiny_model_dir}", "sft.steps=2", "sft.batch_size=4", "sft.stop_pass_rate=null",
            "sft.stop_pass_at_k=null", "sft.mix_envs={self_propose: 0.25}", "rollout.tasks_per_step=2",
            "algo.group_size=2", "train.eval_tasks=2", "train.eval_samples=1", "rollout.max_tokens=8",
            "train.eval_every=0", "train.save_every=0", "log.tensorboard=false"]
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", *args], capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["sft_steps"] == 2 and s["sft_examples"] == {"code_sandbox": 2000, "self_propose": 500}
    assert (out / "sft_model" / "config.json").exists()
