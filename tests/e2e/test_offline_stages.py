"""Offline stages from files (issue #24): `agentrl train --algo dpo --dataset prefs.jsonl`
(offline DPO from a preference file) and `agentrl sft --dataset convs.jsonl` (supervised
fine-tuning on the assistant messages of a file of conversations): formats, errors naming the
line, what is trained on, and the CLI as a user runs it."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from agentrl.config import load_config
from agentrl.offline import (
    conversation_examples,
    dpo_from_file,
    is_preference_file,
    load_conversations,
    sft_from_file,
)

PAIRS = [{"prompt": "Write add_seven", "chosen": "def add_seven(x):\n    return x + 7",
          "rejected": "cats"},
         {"prompt": [{"role": "user", "content": "The capital of France"}], "chosen": "Paris",
          "rejected": "search"}]
CONVS = [{"messages": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "hi"},
                       {"role": "user", "content": "Again"}, {"role": "assistant", "content": "hi hi"}]},
         {"messages": [{"role": "system", "content": "Be brief."},
                       {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_preference_file_is_told_apart_from_a_task_file(tmp_path):
    assert is_preference_file(_jsonl(tmp_path / "p.jsonl", PAIRS))
    assert not is_preference_file(_jsonl(tmp_path / "t.jsonl", [{"task_id": "x", "prompt": "p"}]))
    assert not is_preference_file(tmp_path / "missing.jsonl") and not is_preference_file("humaneval")
    assert is_preference_file(_jsonl(tmp_path / "half.jsonl", [{"prompt": "p", "chosen": "c"}]))
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    assert not is_preference_file(tmp_path / "bad.jsonl")


def test_conversations_format_and_errors(tmp_path, tiny_tokenizer):
    from agentrl.rollout.chat import ChatRenderer

    convs = load_conversations(_jsonl(tmp_path / "c.jsonl", CONVS))
    assert len(convs) == 2 and convs[1][0]["role"] == "system"
    renderer = ChatRenderer(tiny_tokenizer)
    ex = conversation_examples(convs, renderer)
    assert len(ex) == 3  # one example per assistant message
    # the second example: context = the first three messages (answer "hi" included, mask 0),
    # target = "hi hi" + end-of-turn (mask 1)
    ctx = renderer.prompt_ids(convs[0][:3])
    target = tiny_tokenizer.encode("hi hi", add_special_tokens=False) + [renderer.end_of_turn_id]
    assert ex[1].token_ids == ctx + target
    assert ex[1].loss_mask == [0] * len(ctx) + [1] * len(target)
    for rows, msg in (([{"messages": [{"role": "user", "content": "x"}]}], ":1: no assistant"),
                      ([CONVS[0], {"messages": [{"role": "bot", "content": "x"}]}], ":2: message 0"),
                      ([{"messages": []}], ":1: expected")):
        with pytest.raises(ValueError, match=msg):
            load_conversations(_jsonl(tmp_path / "e.jsonl", rows))
    (tmp_path / "j.jsonl").write_text("\n{oops\n")
    with pytest.raises(ValueError, match=r"j.jsonl:2: invalid JSON"):
        load_conversations(tmp_path / "j.jsonl")
    with pytest.raises(FileNotFoundError):
        load_conversations(tmp_path / "none.jsonl")


def _cfg(tiny_model_dir, out, *extra):
    return load_config(None, [f"model.path={tiny_model_dir}", f"out={out}", "log.tensorboard=false",
                              "train.torch_threads=1", *extra])


def test_offline_dpo_from_a_file_learns_the_preferences(tiny_model_dir, tmp_path):
    prefs = _jsonl(tmp_path / "prefs.jsonl", PAIRS)
    cfg = _cfg(tiny_model_dir, tmp_path / "run", "algo.name=dpo", "train.steps=8", "train.lr=3e-3",
               "rollout.tasks_per_step=2", "algo.beta=0.5")
    s = dpo_from_file(cfg, prefs, say=lambda m: None)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert [r["step"] for r in rows] == list(range(1, 9))
    assert rows[0]["loss/dpo_loss"] == pytest.approx(0.693147, abs=1e-4)  # policy == reference
    assert rows[-1]["loss/dpo_loss"] < rows[0]["loss/dpo_loss"] - 0.05
    assert s["pairs"] == 2 and s["reward_accuracy"] == 1.0
    from agentrl.models.tiny import load_model

    model, _ = load_model(s["model"])  # OUT/model is a Hugging Face directory
    base, _ = load_model(tiny_model_dir)
    assert any(not torch.equal(a, b) for a, b in zip(model.parameters(), base.parameters()))


def test_sft_from_a_file_lowers_the_loss(tiny_model_dir, tmp_path):
    convs = _jsonl(tmp_path / "convs.jsonl", CONVS)
    cfg = _cfg(tiny_model_dir, tmp_path / "run", "sft.steps=10", "sft.batch_size=3", "sft.lr=3e-3")
    s = sft_from_file(cfg, convs, say=lambda m: None)
    assert s["examples"] == 3 and s["steps"] == 10
    assert s["last_loss"] < s["first_loss"] - 0.5
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert len(rows) == 10 and "sft/loss" in rows[0]


def _cli(*args, cwd):
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    return subprocess.run([sys.executable, "-m", "agentrl.cli", *args], capture_output=True,
                          text=True, timeout=300, env=env, cwd=cwd)


@pytest.mark.slow
def test_cli_offline_dpo_and_sft(tiny_model_dir, tmp_path):
    prefs = _jsonl(tmp_path / "prefs.jsonl", PAIRS)
    p = _cli("train", "--algo", "dpo", "--dataset", str(prefs), "--model", tiny_model_dir,
             "--steps", "2", "--out", str(tmp_path / "dpo"), "--quiet", "rollout.tasks_per_step=2",
             "log.tensorboard=false", cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert json.loads((tmp_path / "dpo" / "summary.json").read_text())["stage"] == "dpo"
    convs = _jsonl(tmp_path / "convs.jsonl", CONVS)
    p = _cli("sft", "--dataset", str(convs), "--model", tiny_model_dir, "--steps", "2",
             "--out", str(tmp_path / "sft"), "log.tensorboard=false", cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert (tmp_path / "sft" / "model" / "config.json").exists()


def test_cli_offline_dpo_bad_line_is_a_clear_error(tiny_model_dir, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "x", "chosen": "y", "rejected": 3}) + "\n")
    p = _cli("train", "--algo", "dpo", "--dataset", str(bad), "--model", tiny_model_dir,
             "--out", str(tmp_path / "bad"), cwd=tmp_path)
    assert p.returncode == 2 and "bad.jsonl:1: rejected: must be" in " ".join(p.stdout.split())


@pytest.mark.parametrize("rows, where", [
    ([{"prompt": "x", "chosen": "y"}], "prefs.jsonl:1: missing field(s) rejected"),
    ([{"prompt": "x", "chosen": "y", "rejected": "z"}, {"prompt": "x", "rejected": "z"}],
     "prefs.jsonl:2: missing field(s) chosen"),
])
def test_cli_offline_dpo_record_missing_a_key_names_file_line_and_key(tiny_model_dir, tmp_path, rows, where):
    """A first record without `rejected` was taken for a task file (a code_sandbox format error)."""
    from typer.testing import CliRunner

    from agentrl.cli import app

    prefs = _jsonl(tmp_path / "prefs.jsonl", rows)
    out = tmp_path / "dpo"
    r = CliRunner().invoke(app, ["train", "--algo", "dpo", "--dataset", str(prefs), "--model", tiny_model_dir,
                                 "--out", str(out)])
    assert r.exit_code == 2 and where in " ".join(r.output.split()) and "Traceback" not in r.output, r.output
    assert not out.exists()


def test_offline_dpo_refuses_options_it_would_ignore(tiny_model_dir, tmp_path):
    """Per-turn credit, clipping, TIS and overlong shaping act on sampled turns; a preference
    file has none: each is refused before OUT is written (issue #24: no option silently
    ignored)."""
    prefs = _jsonl(tmp_path / "prefs.jsonl", PAIRS)
    cfg = _cfg(tiny_model_dir, tmp_path / "run", "algo.name=dpo", "algo.overlong_buffer=4")
    with pytest.raises(ValueError, match=r"config error: algo.overlong_buffer=4: offline DPO"):
        dpo_from_file(cfg, prefs, say=lambda m: None)
    assert not (tmp_path / "run").exists()
    for opt, shown in (("algo.turn_advantages=true", "True"), ("algo.tis_cap=2", "2"),
                       ("algo.turn_credit=gigpo", "'gigpo'")):  # not keys of DPO's config at all
        key = opt.split("=")[0]
        with pytest.raises(ValueError, match=rf"config error: {key}={shown} is not supported by algo.name=dpo"):
            _cfg(tiny_model_dir, tmp_path / "run", "algo.name=dpo", opt)
        assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("stage", ["sft", "dpo"])
def test_offline_stage_in_a_used_out_offers_overwrite_not_resume(tmp_path, stage):
    """`agentrl sft` and offline DPO have no --resume: the refusal of a used --out must not offer it."""
    from typer.testing import CliRunner

    from agentrl.cli import app

    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    data = (_jsonl(tmp_path / "convs.jsonl", [{"messages": [{"role": "user", "content": "a"},
                                                           {"role": "assistant", "content": "b"}]}])
            if stage == "sft" else _jsonl(tmp_path / "prefs.jsonl", PAIRS))
    args = (["sft", "--dataset", str(data)] if stage == "sft"
            else ["train", "--algo", "dpo", "--dataset", str(data)])
    r = CliRunner().invoke(app, [*args, "--out", str(out)])
    flat = " ".join(r.output.split())
    assert r.exit_code == 2 and "already holds files (notes.txt)" in flat, r.output
    assert "--overwrite" in flat and "--resume" not in flat
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_cli_offline_dpo_refuses_resume(tmp_path):
    """A preference file with --resume was run as an env dataset (a task-format error later);
    offline DPO keeps no resumable state, so it is refused at start-up, naming --resume."""
    prefs = _jsonl(tmp_path / "prefs.jsonl", PAIRS)
    run = tmp_path / "run"
    run.mkdir()
    saved = json.dumps(load_config().model_dump(mode="json"))  # an earlier run's config
    (run / "config.json").write_text(saved)
    p = _cli("train", "--algo", "dpo", "--dataset", str(prefs), "--resume", str(run), cwd=tmp_path)
    said = " ".join(p.stdout.split())
    assert p.returncode == 2 and "--resume: offline DPO from a preference file" in said, said
    assert sorted(x.name for x in run.iterdir()) == ["config.json"]
    assert (run / "config.json").read_text() == saved


def test_cli_resuming_an_offline_dpo_run_is_refused(tmp_path):
    """`--resume RUN` alone on an offline-DPO run (its config.json names algo dpo and the
    preference file as env.dataset) read the preference file as a code task file; refused now."""
    prefs = _jsonl(tmp_path / "prefs.jsonl", PAIRS)
    run = tmp_path / "run"
    run.mkdir()
    saved = json.dumps(load_config(None, ["algo.name=dpo", f"env.dataset={prefs}"]).model_dump(mode="json"))
    (run / "config.json").write_text(saved)
    p = _cli("train", "--resume", str(run), cwd=tmp_path)
    said = " ".join(p.stdout.split())
    assert p.returncode == 2 and "--resume: offline DPO from a preference file" in said, said
    assert (run / "config.json").read_text() == saved


@pytest.mark.parametrize("stage", ["dpo", "sft"])
def test_offline_stages_honour_train_device_and_precision(tiny_model_dir, tmp_path, stage):
    """`train.device=cpu` named and `train.precision=bf16` (issue 39, fault 6): the stage runs
    under bf16 autocast (its losses are not fp32's bit for bit) and stays within bf16 rounding
    of the fp32 run (2e-2 nats per step over 4 steps on the tiny model; measured: 2.8e-4 DPO, 3.9e-4 SFT);
    the weights it saves are float32."""
    losses = {}
    for prec in ("fp32", "bf16"):
        out = tmp_path / prec
        if stage == "dpo":
            cfg = _cfg(tiny_model_dir, out, "algo.name=dpo", "train.steps=4", "train.lr=3e-3",
                       "rollout.tasks_per_step=2", "algo.beta=0.5", "train.device=cpu",
                       f"train.precision={prec}")
            dpo_from_file(cfg, _jsonl(tmp_path / "prefs.jsonl", PAIRS), say=lambda m: None)
            key = "loss/dpo_loss"
        else:
            cfg = _cfg(tiny_model_dir, out, "sft.steps=4", "sft.batch_size=3", "sft.lr=3e-3",
                       "train.device=cpu", f"train.precision={prec}")
            sft_from_file(cfg, _jsonl(tmp_path / "convs.jsonl", CONVS), say=lambda m: None)
            key = "sft/loss"
        losses[prec] = [json.loads(line)[key] for line in (out / "metrics.jsonl").open()]
        from agentrl.models.tiny import load_model

        saved, _ = load_model(out / "model")
        assert all(p.dtype == torch.float32 for p in saved.parameters())
    fp32, bf16 = losses["fp32"], losses["bf16"]
    assert len(fp32) == len(bf16) == 4
    assert fp32 != bf16  # bf16 autocast ran
    assert max(abs(a - b) for a, b in zip(fp32, bf16)) < 2e-2


def test_sft_train_on_a_named_device_returns_the_model_where_it_was(tiny_model_dir, tiny_tokenizer):
    """`sft_train(device=...)`: the model trains there and is back on its own device after; CUDA
    named on a machine without one is refused naming `train.device`."""
    from agentrl.models.tiny import load_model
    from agentrl.rollout.chat import ChatRenderer
    from agentrl.sft import sft_train

    model, _ = load_model(tiny_model_dir)
    examples = conversation_examples(load_conversations_rows(), ChatRenderer(tiny_tokenizer))
    before = [p.detach().clone() for p in model.parameters()]
    losses = sft_train(model, examples, steps=2, lr=1e-3, batch_size=3, pad_id=0, device="cpu",
                       precision="bf16")
    assert len(losses) == 2 and all(map(math.isfinite, losses))
    assert all(p.device.type == "cpu" and p.dtype == torch.float32 for p in model.parameters())
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="train.device=cuda: no CUDA device"):
            sft_train(model, examples, steps=1, lr=1e-3, batch_size=3, pad_id=0, device="cuda")


def load_conversations_rows():
    """CONVS as `load_conversations` returns them (lists of messages)."""
    return [c["messages"] for c in CONVS]
