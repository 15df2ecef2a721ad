"""Env- and policy-dependent defaults (`agentrl.run`): an image env gets the embedded
VLM and its warm-start learning rate; what the user set is kept; the text main job is unchanged."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from agentrl.config import Config, ConfigError, load_config
from agentrl.run import VISION_DEFAULTS, build, env_observes_images, resolve_run_defaults
from agentrl.startup_model import check_chat_template


def _resolved(*overrides: str) -> Config:
    return resolve_run_defaults(load_config(None, list(overrides)))


def test_the_text_main_job_resolves_to_the_global_defaults():
    assert not env_observes_images("code_sandbox")
    assert _resolved().model_dump() == Config().model_dump()  # grpo: the shared defaults
    cfg = _resolved("env.name=code_sandbox")
    assert (cfg.model.vision, cfg.sft.lr) == (False, 2e-3)


def test_an_image_env_gets_the_vlm_and_its_sft_lr_unless_set():
    assert env_observes_images("visual_count") and env_observes_images("agentrl/VisualCount-v0")
    cfg = _resolved("env.name=visual_count")
    assert (cfg.model.vision, cfg.sft.lr, cfg.model.init_std) == (True, 5e-4, 0.1)
    assert (cfg.sft.steps, cfg.sft.stop_pass_rate, cfg.sft.stop_pass_at_k, cfg.train.lr) == (300, None, None, 3e-5)
    # everything else is the global default
    rest = cfg.model_dump()
    want = Config().model_dump()
    rest["env"]["name"] = want["env"]["name"]
    rest["model"]["vision"] = want["model"]["vision"]
    for section, values in VISION_DEFAULTS.items():
        for key in values:
            assert rest[section][key] == values[key] != want[section][key], (section, key)
            rest[section][key] = want[section][key]
    assert rest == want
    assert _resolved("env.name=visual_count", "model.init_std=0.02").model.init_std == 0.02  # set: kept
    assert _resolved("env.name=visual_count", "sft.lr=1e-3").sft.lr == 1e-3  # set: kept
    assert _resolved("env.name=visual_count", "sft.lr=2e-3").sft.lr == 2e-3  # even the global value
    kept = _resolved("env.name=visual_count", "sft.stop_pass_rate=0.3", "train.lr=1e-4", "sft.steps=50")
    assert (kept.sft.stop_pass_rate, kept.sft.stop_pass_at_k, kept.train.lr, kept.sft.steps) == (0.3, None, 1e-4, 50)
    off = _resolved("env.name=visual_count", "model.vision=false")
    assert (off.model.vision, off.sft.lr) == (False, 2e-3)
    given = _resolved("env.name=visual_count", "model.path=/some/dir")  # a given model: not the embedded VLM
    assert (given.model.vision, given.sft.lr, given.model.init_std) == (False, 2e-3, None)
    text_env_vlm = _resolved("model.vision=true")  # asked for on a text env: the VLM's lr too
    assert (text_env_vlm.model.vision, text_env_vlm.sft.lr) == (True, 5e-4)
    assert _resolved("env.name=code_sandbox").train.lr == 3e-4  # the text job keeps RL's lr


def test_resolving_twice_and_a_saved_config_change_nothing():
    cfg = _resolved("env.name=visual_count")
    assert resolve_run_defaults(cfg).model_dump() == cfg.model_dump()
    saved = load_config(None, base=Config().model_dump() | {"env": {"name": "visual_count"}})
    assert resolve_run_defaults(saved).model.vision is False  # a resumed run's saved keys are all set
    assert resolve_run_defaults(saved).sft.lr == 2e-3


def test_config_command_prints_the_resolved_vision_defaults():
    out = subprocess.run([sys.executable, "-m", "agentrl.cli", "config", "env.name=visual_count"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    d = yaml.safe_load(out)
    assert (d["model"]["vision"], d["sft"]["lr"]) == (True, 5e-4)
    assert (d["sft"]["stop_pass_rate"], d["sft"]["steps"], d["train"]["lr"]) == (None, 300, 3e-5)


def test_eval_of_the_default_model_on_an_image_env_builds_the_vlm(tmp_path):
    """`agentrl eval --env visual_count --model default` builds what a run would: the VLM."""
    from agentrl.eval.cli import eval_command
    from agentrl.models.vlm import is_vlm_dir

    s = eval_command(env="visual_count", model="default", max_tasks=1, samples=1, max_tokens=2,
                     out=str(tmp_path / "e"), console=None,
                     overrides=["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
                                "model.intermediate_size=64", "model.vocab_size=320",
                                "model.vision_width=16", "model.vision_depth=1"])
    assert is_vlm_dir(tmp_path / "e" / "base_vlm") and s["overall"]["episodes"] == 1


def test_partial_rollouts_on_an_image_env_are_refused_at_start_up(tmp_path):
    """`--env visual_count rollout.mode=async rollout.partial=true`: the resolved VLM policy
    cannot interrupt a generation, so start-up refuses it naming the key, before anything is
    built or written (it failed with a traceback after the 300-step warm start before)."""

    cfg = load_config(None, ["env.name=visual_count", "rollout.mode=async", "rollout.partial=true",
                             f"out={tmp_path / 'run'}"])
    with pytest.raises(ConfigError, match=r"rollout\.partial=false") as e:
        build(cfg)
    assert str(e.value).startswith("config error: a vision-language policy trains without")
    assert not (tmp_path / "run").exists()


def test_a_model_path_with_fewer_embedding_rows_than_tokenizer_ids_is_refused_before_out_is_written(tmp_path):
    """config.json and weights agree on 600 rows but the tokenizer has 640 ids: start-up refuses
    in one line (it was `prompt 0 has a token id outside [0, 600)` after OUT was written);
    64 padding rows beyond the tokenizer are accepted. The three surfaces that see it print one
    wording (`overflow_message`; each had its own): `agentrl train` (start-up), `agentrl doctor
    --model` and `agentrl serve` (`load_model`)."""
    from transformers import Qwen3ForCausalLM
    from typer.testing import CliRunner

    from agentrl.cli import app
    from agentrl.models.families import FAMILIES, build_family_tokenizer, family_config
    from agentrl.startup import preflight

    tok = build_family_tokenizer(FAMILIES["qwen3"])
    for name, extra in (("small", -40), ("padded", 64)):
        mcfg = family_config(FAMILIES["qwen3"], tok, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
        mcfg.vocab_size = len(tok) + extra
        Qwen3ForCausalLM(mcfg).save_pretrained(tmp_path / name)
        tok.save_pretrained(tmp_path / name)
    d = tmp_path / "small"
    past = ", ".join(tok.convert_ids_to_tokens([600, 601, 602]))
    want = (f"{d}: the tokenizer's ids go up to 639 but the model has 600 embedding rows: ids 600-639 "
            f"({past}, ...) have none; use the tokenizer saved with these weights, or resize the "
            "embedding to 640 rows (model.resize_token_embeddings(640), then save_pretrained)")
    cfg = load_config(None, ["env.name=toy", f"model.path={d}", "sft.steps=0", f"out={tmp_path / 'run'}"])
    with pytest.raises(ConfigError) as e:
        build(cfg)
    assert str(e.value) == f"config error: model.path: {want}"
    assert not (tmp_path / "run").exists()
    preflight(load_config(None, ["env.name=toy", f"model.path={tmp_path / 'padded'}", "sft.steps=0"]))
    # `agentrl serve` / `agentrl eval` load it with load_model: the same refusal (serve started and
    # would crash at the first <tool_call>), the padded model loads
    import torch

    from agentrl.models.tiny import load_model

    with pytest.raises(ValueError) as e:
        load_model(d)
    assert str(e.value) == want
    padded, _ = load_model(tmp_path / "padded")
    padded(torch.tensor([[len(tok) - 1]]))  # the tokenizer's last id has a row
    runner = CliRunner()
    for args, line in ((["serve", "--model", str(d), "--port", "0"], f"serve: {want}"),
                       (["doctor", "--model", str(d)], "vocabulary: tokenizer 640, config 600, embedding 600: "
                                                        f"MISMATCH: {want}")):  # (train: build above)
        res = runner.invoke(app, args, env={"COLUMNS": "80"})
        assert res.exit_code in (1, 2) and line in res.output.splitlines(), (args, res.output)


def test_a_truncated_model_path_weights_file_is_a_config_error_before_out_is_written(tmp_path):
    """`model.path` whose model.safetensors was cut short (an interrupted copy): start-up names
    the file (it was a SafetensorError traceback after OUT/config.json was written), and
    `load_model` (train, eval, `agentrl serve`) raises the same one-line ValueError."""
    from agentrl.models.families import build_family
    from agentrl.models.tiny import load_model

    d = tmp_path / "qwen3"
    build_family("qwen3", d, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    w = d / "model.safetensors"
    w.write_bytes(w.read_bytes()[:50])
    cfg = load_config(None, ["env.name=toy", f"model.path={d}", "sft.steps=0", f"out={tmp_path / 'run'}"])
    with pytest.raises(ConfigError, match=f"^config error: model.path: {re.escape(str(w))} is not a readable safetensors file"):
        build(cfg)
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match=f"^{re.escape(str(w))} is not a readable safetensors file"):
        load_model(d)


def test_weights_that_do_not_fit_config_vocab_size_are_a_config_error_before_out_is_written(tmp_path):
    """config.json's vocab_size 8 below the embedding's rows (an embedding resized without
    saving config.json): start-up names both sizes (it was a transformers "size mismatch"
    traceback after OUT/config.json was written), and `load_model` raises the same line."""
    import json

    from agentrl.models.families import build_family
    from agentrl.models.tiny import load_model

    d = tmp_path / "qwen3"
    build_family("qwen3", d, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    c = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**c, "vocab_size": c["vocab_size"] - 8}))
    want = (f"{d / 'config.json'} says vocab_size {c['vocab_size'] - 8} but the weights' embedding has "
            f"{c['vocab_size']} rows")
    cfg = load_config(None, ["env.name=toy", f"model.path={d}", "sft.steps=0", f"out={tmp_path / 'run'}"])
    with pytest.raises(ConfigError, match=f"^config error: model.path: {re.escape(want)}"):
        build(cfg)
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match=f"^{re.escape(want)}"):
        load_model(d)


def test_no_weights_or_an_unreadable_tokenizer_under_model_path_is_one_line_before_out(tmp_path):
    """model.path without its weights file (an interrupted copy), or with a truncated
    tokenizer.json: a one-line config error before OUT is written (both were tracebacks after
    OUT/config.json); doctor says MISSING for the first, exit 1 (it said ok, exit 0)."""
    import shutil

    from typer.testing import CliRunner

    from agentrl.cli import app
    from agentrl.models.families import build_family

    good = tmp_path / "qwen3"
    build_family("qwen3", good, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    nowt, badtok = tmp_path / "noweights", tmp_path / "badtok"
    shutil.copytree(good, nowt)
    (nowt / "model.safetensors").unlink()
    shutil.copytree(good, badtok)
    t = badtok / "tokenizer.json"
    t.write_text(t.read_text()[: len(t.read_text()) // 2])
    for d, want in ((nowt, f"{nowt} holds no weights (no *.safetensors or pytorch_model*.bin file)"),
                    (badtok, f"{badtok}: the tokenizer does not load (")):
        out = tmp_path / f"run_{d.name}"
        cfg = load_config(None, ["env.name=toy", f"model.path={d}", "sft.steps=0", f"out={out}"])
        with pytest.raises(ConfigError, match=f"^config error: model.path: {re.escape(want)}"):
            build(cfg)
        assert not out.exists()
    res = CliRunner().invoke(app, ["doctor", "--model", str(nowt)])
    assert res.exit_code == 1, res.output
    assert res.output.splitlines()[-1].startswith(f"vocabulary: tokenizer 640, config 640: MISSING: {nowt} holds no weights")


def test_a_model_path_without_a_usable_chat_template_is_one_line_before_out(tmp_path):
    """model.path whose tokenizer has no chat template (a base model folder): `agentrl train`
    said a transformers traceback after OUT/config.json was written, and a rerun said OUT
    "already holds an earlier run"; now a one-line config error, exit 2, nothing written, the
    same on the rerun; `agentrl eval --model` the same (nothing in --out). A template the
    renderer cannot use (no end of turn after an assistant message) likewise."""
    import shutil

    from typer.testing import CliRunner

    from agentrl.cli import app
    from agentrl.models.families import build_family

    good = tmp_path / "mistral"
    build_family("mistral_v0_3", good, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    bare, noeot = tmp_path / "bare", tmp_path / "noeot"
    shutil.copytree(good, bare)
    (bare / "chat_template.jinja").unlink()
    shutil.copytree(good, noeot)
    (noeot / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    want = {bare: (f"config error: model.path: {bare}: the tokenizer has no chat template (agentrl renders "
                   "episodes with it): add the model's template as the `chat_template` key of "
                   f"{bare / 'tokenizer_config.json'} or as a chat_template.jinja file beside it (docs/models.md)"),
            noeot: (f"config error: model.path: {noeot}: its chat template cannot be used (ValueError: chat "
                    "template: cannot locate the assistant's end-of-turn token (no control token follows an "
                    f"assistant message)); agentrl doctor --model {noeot}")}
    runner = CliRunner()
    for d, line in want.items():
        out = tmp_path / f"run_{d.name}"
        for _ in range(2):  # the rerun says the same: nothing was left behind
            res = runner.invoke(app, ["train", "--env", "code_sandbox", f"model.path={d}", f"out={out}",
                                      "sft.steps=0"], terminal_width=400)
            assert res.exit_code == 2, res.output
            assert res.output.strip() == line
            assert not out.exists()
        ev = tmp_path / f"eval_{d.name}"
        res = runner.invoke(app, ["eval", "--env", "code_sandbox", "--model", str(d), "--out", str(ev)],
                            terminal_width=400)
        assert res.exit_code == 2, res.output
        assert res.output.strip() == line.replace("config error: model.path:", "config error: --model:")
        assert not ev.exists()
    cfg = load_config(None, ["env.name=toy", f"model.path={good}", "sft.steps=0", f"out={tmp_path / 'ok'}"])
    check_chat_template(cfg, good)  # the family's own template is accepted
