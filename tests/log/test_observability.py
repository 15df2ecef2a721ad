"""Observability: metrics.jsonl, TensorBoard and W&B logging, the end-of-run summary, `agentrl
plot` and `agentrl show` (the loss mask made visible)."""

from __future__ import annotations

import importlib.util
import io
import json
import math
import os
import re
import time

import pytest
from rich.console import Console
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.config import ConfigError, load_config
from agentrl.log.metrics import MetricsLog
from agentrl.log.show import CLOSE, OPEN, load_episode, render_episode, show_episode
from agentrl.log.summary import read_metrics, stage_seconds
from agentrl.train import train
from agentrl.types import Trajectory

TINY = ["env.name=toy", "sft.steps=0", "rollout.tasks_per_step=2", "algo.group_size=2",
        "train.eval_tasks=2", "train.eval_samples=1", "rollout.max_tokens=24",
        "env.kwargs={words: [x, the, def, return]}", "algo.kl_coef=0.05", "algo.entropy_coef=0.01"]


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_model_dir):
    """One 3-step toy run (rollouts saved every step, eval after step 2); returns (OUT, output)."""
    out = tmp_path_factory.mktemp("obs") / "run"
    cfg = load_config(None, TINY + ["train.steps=3", "train.log_rollouts_every=1", "train.eval_every=2",
                                    f"model.path={tiny_model_dir}", f"out={out}", "quiet=true"])
    buf = io.StringIO()
    train(cfg, console=Console(file=buf, width=300, color_system=None))
    return out, buf.getvalue()


# -- metrics, TensorBoard, W&B --------------------------------------------------------------
def test_tensorboard_files_contain_the_logged_scalars(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, _ = run
    rows = [r for r in read_metrics(out) if "rollout/reward_mean" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    acc = EventAccumulator(str(out / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for key in ("rollout/reward_mean", "rollout/pass_rate", "loss/kl", "loss/entropy",
                "rollout/response_len", "perf/rollout_s", "perf/update_s", "eval/pass@1"):
        assert key in tags, key
    for key in ("rollout/reward_mean", "loss/entropy", "rollout/response_len"):
        got = {e.step: e.value for e in acc.Scalars(key)}
        want = {r["step"]: r[key] for r in rows}
        assert got.keys() == want.keys()
        for s in want:  # TensorBoard stores float32
            assert math.isclose(got[s], want[s], rel_tol=1e-6, abs_tol=1e-7), (key, s)
    # eval/pass@1: before RL (step 0), after step 2 (eval_every) and the final one at step 3
    assert sorted(e.step for e in acc.Scalars("eval/pass@1")) == [0, 2, 3]


def test_summary_screen_at_the_end(run):
    out, text = run
    assert "held-out pass@1" in text and "train reward" in text
    assert "time per stage: rollout" in text and "update" in text
    summary = json.loads((out / "summary.json").read_text())
    assert f"checkpoint: {summary['checkpoint']}" in text
    assert summary["checkpoint"].endswith("step_3")
    assert set(summary["stage_seconds"]) >= {"rollout", "update", "sync", "eval"}
    assert "sft_s" not in summary  # the warm start's time is sft_seconds, once
    evals = [r["eval/seconds"] for r in read_metrics(out) if "eval/seconds" in r]
    assert len(evals) == 3  # before (step 0), after step 2, final
    assert summary["stage_seconds"]["eval"] == sum(evals)


def test_run_summary_is_strict_json_with_null_for_undefined_figures(tmp_path):
    """An undefined figure (the repair rate with no failed first attempt: NaN) is null in
    OUT/summary.json, which strict JSON readers (`allow_nan` off, jq, JavaScript) accept."""
    from types import SimpleNamespace

    from agentrl.log.steps import report

    said: list[str] = []
    lp = SimpleNamespace(cfg=load_config(None, ["quiet=true"]), out=tmp_path, say=said.append)
    nan = float("nan")
    before = {"pass@1": 0.25, "pass@1_se": 0.05, "repair_rate": nan, "repair_rate_se": None}
    after = {"pass@1": 0.5, "pass@1_se": 0.05, "repair_rate": 0.4, "repair_rate_se": float("inf")}
    report(lp, before, after, tmp_path / "final", {}, None, n_tasks=4)

    def refuse(name: str) -> None:
        raise ValueError(f"not strict JSON: {name}")

    summary = json.loads((tmp_path / "summary.json").read_text(), parse_constant=refuse)
    assert summary["eval_before"]["repair_rate"] is None and summary["eval_after"]["repair_rate_se"] is None
    assert summary["eval_after"]["repair_rate"] == 0.4 and summary["pass@1_ratio"] == 2.0
    assert any("before RL 0.250 -> after RL 0.500" in line for line in said)


def test_stage_seconds_sums_perf_keys(tmp_path):
    rows = [{"step": 1, "perf/rollout_s": 1.5, "perf/update_s": 0.5, "rollout/reward_mean": 0.0},
            {"step": 2, "perf/rollout_s": 2.0, "perf/update_s": 0.25, "eval/seconds": 3.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 3, "perf/ro')
    # 1.5 + 2.0 = 3.5; 0.5 + 0.25 = 0.75; eval 3.0; the torn last line is skipped
    assert stage_seconds(tmp_path / "metrics.jsonl") == {"rollout": 3.5, "update": 0.75, "eval": 3.0}
    assert stage_seconds(tmp_path / "missing.jsonl") == {}
    # perf/loop_s is a running total (wall seconds since the loop began): the last one, not a sum
    rows = [{"step": 1, "perf/loop_s": 1.75, "perf/step_s": 1.75}, {"step": 2, "perf/loop_s": 3.30, "perf/step_s": 1.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert stage_seconds(tmp_path / "metrics.jsonl") == {"loop": 3.30, "step": 3.25}


def test_metrics_log_on_resume_keeps_steps_up_to_the_checkpoint(tmp_path):
    lines = [json.dumps({"step": s, "rollout/reward_mean": s / 10}) for s in (1, 2, 3, 4, 5)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 6, "rollo')  # torn by a kill
    log = MetricsLog(tmp_path, tensorboard=False, start_step=3)
    log.log(4, {"rollout/reward_mean": 0.9, "loss/kl": float("nan")})
    log.close()
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[-1] == {"step": 4, "rollout/reward_mean": 0.9, "loss/kl": None}  # NaN -> null
    MetricsLog(tmp_path, tensorboard=False).close()  # a fresh run (start 0) starts a new file
    assert read_metrics(tmp_path) == []


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb not installed: the optional `wandb` extra (.ci/run installs it, so CI runs this)")
def test_wandb_offline_logs_without_network(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    log = MetricsLog(tmp_path, tensorboard=False, wandb_project="agentrl", run_config={"seed": 0})
    for s in (1, 2):
        log.log(s, {"rollout/reward_mean": 0.25 * s, "perf/rollout_s": 1.0})
    log.close()
    run_id = (tmp_path / "wandb_id.txt").read_text().strip()
    [run_file] = list((tmp_path / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    deadline = time.monotonic() + 60  # wandb-core may still be writing when finish() returns
    while b"rollout/reward_mean" not in run_file.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert b"rollout/reward_mean" in run_file.read_bytes()
    # a resumed run continues the same W&B run id; a fresh one gets a new id
    MetricsLog(tmp_path, tensorboard=False, start_step=2, wandb_project="agentrl").close()
    assert (tmp_path / "wandb_id.txt").read_text().strip() == run_id
    MetricsLog(tmp_path, tensorboard=False, wandb_project="agentrl").close()
    assert (tmp_path / "wandb_id.txt").read_text().strip() != run_id


def test_wandb_missing_fails_at_start_up_with_a_clear_message(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "wandb" else real(n, *a))
    with pytest.raises(ConfigError, match=r"log\.wandb: .*pip install 'agentrl\[wandb\]'"):
        load_config(None, ["log.wandb=true"])
    r = CliRunner().invoke(app, ["train", "--env", "toy", "log.wandb=true"])
    assert r.exit_code == 2 and "agentrl[wandb]" in r.output
    assert load_config(None, ["log.wandb=false"]).log.wandb is False


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb not installed: the optional `wandb` extra (.ci/run installs it, so CI runs this)")
def test_wandb_without_an_api_key_fails_at_start_up_naming_the_key(tmp_path, monkeypatch):
    """No API key and W&B online: exit 2 naming WANDB_API_KEY and WANDB_MODE=offline before OUT
    is written (was a wandb UsageError traceback after the model was built). Nothing reaches the
    network: the check is `wandb.login(verify=False, prompt=False)`, HOME is an empty folder."""
    from agentrl.log.metrics import check_wandb_login

    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DISABLED", "NETRC", "WANDB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "home" / "wandb"))
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["train", "--env", "toy", "--steps", "1", "--out", str(out), "sft.steps=0",
                                 "log.wandb=true"])
    flat = " ".join(r.output.split())
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert "config error: log.wandb: no W&B API key is configured" in flat
    assert "WANDB_API_KEY" in flat and "WANDB_MODE=offline" in flat
    assert not out.exists()
    monkeypatch.setenv("WANDB_MODE", "offline")  # no key needed
    check_wandb_login()
    monkeypatch.setenv("WANDB_MODE", "online")
    with pytest.raises(ConfigError, match="no W&B API key"):
        check_wandb_login()



@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb not installed: the optional `wandb` extra (.ci/run installs it, so CI runs this)")
def test_wandb_with_an_invalid_mode_is_a_config_error(tmp_path):
    """WANDB_MODE=bogus: W&B's settings validation raised a pydantic traceback from the start-up
    check; now a ConfigError naming WANDB_MODE. A subprocess: wandb caches its settings per process."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HOME=str(tmp_path), WANDB_MODE="bogus", WANDB_CONFIG_DIR=str(tmp_path / "wandb"))
    code = ("from agentrl.config import ConfigError\nfrom agentrl.log.metrics import check_wandb_login\n"
            "try:\n    check_wandb_login()\nexcept ConfigError as e:\n    print('CONFIG', e)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    said = " ".join(p.stdout.split())
    assert p.returncode == 0 and "CONFIG config error: log.wandb: W&B refused its settings" in said, p.stdout + p.stderr
    assert "check WANDB_MODE" in said


# -- plot -----------------------------------------------------------------------------------
def test_plot_writes_pngs_with_runs_overlaid(run, tmp_path):
    out, _ = run
    r = CliRunner().invoke(app, ["plot", str(out), str(out), "--out", str(tmp_path / "png")])
    assert r.exit_code == 0, r.output
    names = sorted(p.name for p in (tmp_path / "png").iterdir())
    assert names == sorted(["dashboard.png", "reward.png", "kl.png", "entropy.png",
                            "response_length.png", "eval_pass1.png", "time_share.png"])
    assert r.output.splitlines()[0].endswith("dashboard.png")
    for p in (tmp_path / "png").iterdir():
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, p


def test_plot_rejects_a_directory_without_metrics(tmp_path):
    r = CliRunner().invoke(app, ["plot", str(tmp_path)])
    assert r.exit_code == 2 and "metrics.jsonl" in r.output


# -- show -----------------------------------------------------------------------------------
def test_render_marks_exactly_the_loss_mask(tiny_tokenizer):
    tok = tiny_tokenizer
    a, b, c = (tok.encode(s, add_special_tokens=False) for s in ("def add", "_seven(x)", " return"))
    tr = Trajectory()
    tr.append_context(a)
    tr.append_sampled(b, [0.0] * len(b), reward=1.0, info={"verdict": "pass"})
    tr.append_context(c)
    text = str(render_episode(tr, tok, marks=True))
    # context "def add", trained "_seven(x)", context " return"; the note follows the turn
    assert text.startswith(f"def add{OPEN}_seven(x){CLOSE}\n")
    assert "↳ turn 1: reward 1 · verdict pass · finish stop" in text
    assert f"{len(b)} trained tokens" in text
    assert text.rstrip().endswith("return")
    # without marks the characters are the same minus the brackets
    assert OPEN not in str(render_episode(tr, tok, marks=False))
    # a control character sampled by the policy is shown escaped, never sent to the terminal
    tr2 = Trajectory()
    tr2.append_sampled(tok.encode("\x1b[2J", add_special_tokens=False), [0.0] * len(tok.encode("\x1b[2J", add_special_tokens=False)))
    assert "\x1b" not in str(render_episode(tr2, tok, marks=True))


def test_show_plain_wraps_trained_spans(run, tiny_tokenizer):
    out, _ = run
    r = CliRunner().invoke(app, ["show", str(out), "--step", "2", "--index", "1", "--plain"])
    assert r.exit_code == 0, r.output
    tr = load_episode(out, 2, 1)
    assert "roles: user → assistant" in r.output and f"step 2 · episode 1 · task {tr.task_id}" in r.output
    head, body = r.output.split("─" * 20, 1)
    assert f"sampled tokens (loss_mask=1) {OPEN}like this{CLOSE}" in head  # the legend
    body = body.lstrip("─\n")
    spans = re.findall(f"{OPEN}(.*?){CLOSE}", body, flags=re.S)
    assert len(spans) == len(tr.turns) >= 1
    for span, turn in zip(spans, tr.turns):  # the bracketed text is exactly the sampled tokens
        ids = tr.token_ids[turn.start:turn.end]
        assert all(tr.loss_mask[turn.start:turn.end])
        want = tiny_tokenizer.decode(ids, skip_special_tokens=False)
        assert span == "".join(ch if ch in "\n\t" or ch.isprintable() else f"\\x{ord(ch):02x}" for ch in want)
    prompt = body.split(OPEN)[0]
    assert "Say the word" in prompt and "<|im_start|>user" in prompt  # context: not trained
    assert f"reward {tr.turns[0].reward:.3g}" in r.output


def test_show_in_colour_highlights_without_brackets(run):
    out, _ = run
    seen = set()
    for step in (1, 2, 3):
        n = len((out / "rollouts" / f"step_{step}.jsonl").read_text().splitlines())
        for i in range(n):
            buf = io.StringIO()
            tr = show_episode(out, step, i, Console(file=buf, force_terminal=True, color_system="truecolor",
                                                    width=200))
            text = buf.getvalue()
            assert OPEN not in text
            assert "\x1b[2m" in text  # dim: the context
            assert tr.num_sampled > 0
            if tr.info["trained"]:  # bold black on bright green: the trained tokens
                assert "\x1b[1;30;102m" in text and "\x1b[30;43m" not in text
            else:  # advantage 0: black on yellow
                assert "\x1b[30;43m" in text and "\x1b[1;30;102m" not in text
            seen.add(tr.info["trained"])
    assert seen == {True, False}


def test_show_errors_name_what_exists(run):
    out, _ = run
    r = CliRunner().invoke(app, ["show", str(out), "--step", "9"])
    assert r.exit_code == 2 and "saved steps: 1, 2, 3" in r.output
    r = CliRunner().invoke(app, ["show", str(out), "--step", "1", "--index", "99"])
    assert r.exit_code == 2 and "has 4 episodes" in r.output


def test_show_names_the_versions_of_a_partial_rollouts_tokens(run, tmp_path):
    """With `rollout.partial` a push lands inside a turn and the header's `policy vN` is only
    the oldest version: `show` lists the versions that sampled the tokens and where the switch
    is (it printed the header alone)."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(run[0], out)
    path = out / "rollouts" / "step_2.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    tr = Trajectory.from_dict(rows[1])
    first = tr.turns[0]
    assert first.end - first.start >= 3
    cut = first.start + 2  # the turn's first 2 sampled tokens by v1, the rest by v2
    tr.token_versions = [-1 if not m else 1 if i < cut else 2 for i, m in enumerate(tr.loss_mask)]
    tr.policy_version = 1
    rows[1] = tr.to_dict()
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = CliRunner().invoke(app, ["show", str(out), "--step", "2", "--index", "1", "--plain"])
    assert r.exit_code == 0, r.output
    n = tr.num_sampled
    assert (f"sampled tokens per policy version: v1 2, v2 {n - 2}; switches at turn 1 token 2 (v1 -> v2)"
            in " ".join(r.output.split()))
    assert "policy v1" in r.output
    other = CliRunner().invoke(app, ["show", str(out), "--step", "2", "--index", "0", "--plain"])
    assert other.exit_code == 0 and "per policy version" not in other.output  # one version: no line
