"""Resume (case G3, extended to SIGKILL mid-step): a run interrupted after a checkpoint and
resumed with `--resume OUT` ends with exactly the weights of an uninterrupted run on CPU.

Tasks are drawn from `default_rng([seed, step])` and sampling is seeded by the step, so the
step number is the data cursor; the checkpoint restores weights, optimizer, scheduler, RNG
states, policy version and the KL reference. The toy env's targets include words the random
tiny model sometimes says, and an entropy bonus, so every step moves the weights.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from rich.console import Console
from safetensors.torch import load_file

import agentrl.rollout.stages as stages_mod
import agentrl.train as train_mod
from agentrl.config import load_config
from agentrl.learner.checkpoints import latest_checkpoint
from agentrl.log.summary import read_metrics

ARGS = ["env.name=toy", "sft.steps=0", "rollout.tasks_per_step=2", "algo.group_size=2",
        "train.eval_tasks=2", "train.eval_samples=1", "train.steps=6", "train.log_rollouts_every=1",
        "rollout.max_tokens=24", "env.kwargs={words: [x, the, def, return]}",
        "algo.kl_coef=0.05", "algo.entropy_coef=0.01", "train.eval_every=2", "train.keep_checkpoints=0", "quiet=true"]


def _weights(ck: Path) -> dict[str, torch.Tensor]:
    return load_file(str(ck / "model.safetensors"))


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _step_rows(out: Path) -> list[int]:
    return [r["step"] for r in read_metrics(out) if "rollout/reward_mean" in r]


def _rollout_ids(out: Path, step: int) -> list[list[int]]:
    lines = (out / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()
    return [json.loads(line)["token_ids"] for line in lines]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_model_dir) -> Path:
    """6 steps without interruption (a checkpoint after every step)."""
    out = tmp_path_factory.mktemp("resume") / "A"
    cfg = load_config(None, ARGS + ["train.save_every=1", f"model.path={tiny_model_dir}", f"out={out}"])
    train_mod.train(cfg)
    return out


class Crash(RuntimeError):
    """A fault injected into the loop (a crash after the step-3 checkpoint)."""


def test_g3_resume_from_step_3_equals_the_uninterrupted_run(uninterrupted, tiny_model_dir, tmp_path,
                                                            monkeypatch):
    A, B = uninterrupted, tmp_path / "B"
    assert _max_diff(_weights(A / "checkpoints/step_6"), _weights(A / "checkpoints/step_3")) > 1e-4

    # the run crashes while collecting step 4, after its step-3 checkpoint
    real_collect = stages_mod.collect

    def crashing_collect(*args, **kw):
        if kw["group_base"] == 3 * 2:  # step index 3 (the 4th step), tasks_per_step = 2
            raise Crash("injected")
        return real_collect(*args, **kw)

    monkeypatch.setattr(stages_mod, "collect", crashing_collect)
    cfg = load_config(None, ARGS + ["train.save_every=3", f"model.path={tiny_model_dir}", f"out={B}"])
    with pytest.raises(Crash):
        train_mod.train(cfg)
    monkeypatch.undo()
    assert latest_checkpoint(B) == B / "checkpoints/step_3"
    st = torch.load(B / "checkpoints/step_3/trainer_state.pt", weights_only=False)
    assert st["optimizer_steps"] == 3  # one optimizer step per training step here
    assert {int(s["step"]) for s in st["optimizer"]["state"].values()} == {3}
    assert st["scheduler"]["last_epoch"] == 3
    assert json.loads((B / "checkpoints/step_3/agentrl_state.json").read_text()) == \
        {"step": 3, "policy_version": 3}

    buf = io.StringIO()
    resumed = cfg.model_copy(update={"resume": str(B)})
    train_mod.train(resumed, console=Console(file=buf, width=300, color_system=None))
    assert f"[resume] from {B / 'checkpoints/step_3'} at step 3 (policy version 3)" in buf.getvalue()

    # steps 4-6 ran once each, on the same batches, to the same weights
    assert _step_rows(B) == [1, 2, 3, 4, 5, 6]
    for s in (4, 5, 6):
        assert _rollout_ids(B, s) == _rollout_ids(A, s)
    assert _max_diff(_weights(B / "checkpoints/step_6"), _weights(A / "checkpoints/step_6")) <= 1e-6
    ref_a = torch.load(A / "checkpoints/step_6/ref_model.pt")
    ref_b = torch.load(B / "checkpoints/step_6/ref_model.pt")
    assert _max_diff(ref_a, ref_b) == 0.0  # the KL reference was restored, not re-copied
    sa = torch.load(A / "checkpoints/step_6/trainer_state.pt", weights_only=False)
    sb = torch.load(B / "checkpoints/step_6/trainer_state.pt", weights_only=False)
    assert sb["optimizer_steps"] == sa["optimizer_steps"] == 6
    lrs = [g["lr"] for g in sb["optimizer"]["param_groups"]]
    assert lrs == [g["lr"] for g in sa["optimizer"]["param_groups"]] == [cfg.train.lr]
    ma = {r["step"]: r for r in read_metrics(A) if "rollout/reward_mean" in r}
    mb = {r["step"]: r for r in read_metrics(B) if "rollout/reward_mean" in r}
    for s in (4, 5, 6):
        assert mb[s]["loss/loss"] == ma[s]["loss/loss"] and mb[s]["loss/kl"] == ma[s]["loss/kl"]


def test_a_new_run_into_an_earlier_runs_folder_refuses_and_overwrite_starts_clean(uninterrupted, tmp_path,
                                                                                   tiny_model_dir):
    from agentrl.startup import OutError

    out = tmp_path / "C"
    shutil.copytree(uninterrupted, out)
    rows = (out / "metrics.jsonl").read_text()
    cfg = load_config(None, ARGS + ["train.steps=1", "train.eval_every=0", f"model.path={tiny_model_dir}",
                                    f"out={out}"])
    with pytest.raises(OutError, match="--resume .*--overwrite"):
        train_mod.train(cfg)
    assert (out / "metrics.jsonl").read_text() == rows  # nothing of the earlier run was touched
    assert (out / "checkpoints/step_6").is_dir()
    train_mod.train(cfg.model_copy(update={"overwrite": True}))
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_1"]
    assert _step_rows(out) == [1]  # the earlier run's rows are gone, not mixed in
    assert sorted(p.name for p in (out / "rollouts").iterdir()) == ["step_1.jsonl"]


@pytest.mark.slow
def test_sigkill_mid_step_then_resume_equals_the_uninterrupted_run(uninterrupted, tiny_model_dir,
                                                                   tmp_path):
    out = tmp_path / "K"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "agentrl.cli", "train", *ARGS, "train.save_every=1",
           f"model.path={tiny_model_dir}", f"out={out}"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    marker = out / "checkpoints/step_2/agentrl_state.json"
    deadline = time.monotonic() + 400
    while not marker.exists():
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        assert time.monotonic() < deadline, "no step-2 checkpoint in time"
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)  # kill -9 while step 3 runs
    proc.wait(timeout=60)
    proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "checkpoints/step_3").exists(), "the kill came after step 3 finished"
    assert latest_checkpoint(out) == out / "checkpoints/step_2"
    # a save of step 3 cut short by the kill leaves a partial step_3.tmp: it is never loaded
    partial = out / "checkpoints/step_3.tmp"
    partial.mkdir(exist_ok=True)
    (partial / "model.safetensors").write_bytes(b"\0" * 100)

    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "train", "--resume", str(out), "-q"],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"[resume] from {out / 'checkpoints/step_2'} at step 2" in r.stdout
    assert _step_rows(out) == [1, 2, 3, 4, 5, 6]
    diff = _max_diff(_weights(out / "checkpoints/step_6"), _weights(uninterrupted / "checkpoints/step_6"))
    assert diff <= 1e-6, diff


# -- the reward wrappers' state (curiosity memory, the safety Lagrange multiplier) ---------------
WRAPPED = ["env.name=safety", "sft.steps=0", "rollout.tasks_per_step=2", "algo.group_size=2",
           "train.eval_tasks=2", "train.eval_samples=1", "train.steps=2", "train.log_rollouts_every=1",
           "rollout.max_tokens=12", "train.eval_every=0", "train.keep_checkpoints=0", "train.save_every=1",
           "algo.entropy_coef=0.01", "quiet=true", "rollout.env_threads=1", "env.wrappers=[safety, curiosity]",
           "env.wrapper_kwargs={safety: {method: lagrangian, lr: 0.5, budget: 0.0, update_every: 3}, "
           "curiosity: {method: both, coef: 1.0, decay: 0.9, embed_dim: 64, rnd_hidden: 16, rnd_out: 8}}"]


def _rewards(out: Path, step: int) -> list[tuple[float, float, float]]:
    """(reward, intrinsic bonus, lambda) of each turn of step `step`'s rollouts."""
    rows = [json.loads(line) for line in (out / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()]
    return [(t["reward"], t["info"]["reward_components"]["intrinsic"], t["info"]["lagrange_multiplier"])
            for r in rows for t in r["turns"]]


def test_reward_wrapper_state_is_checkpointed_and_resumed(tiny_model_dir, tmp_path, monkeypatch):
    """A run crashed in step 2 and resumed from its step-1 checkpoint gives step 2 the rewards
    and the weights of an uninterrupted run. One env thread: with several, episodes of a batch
    reach the shared memory / multiplier in thread order, which no run reproduces (docs)."""
    from agentrl.learner.checkpoints import REWARD_STATE, unpack_state

    A, B = tmp_path / "A", tmp_path / "B"
    train_mod.train(load_config(None, WRAPPED + [f"model.path={tiny_model_dir}", f"out={A}"]))
    st = unpack_state(A / "checkpoints/step_1" / REWARD_STATE)
    assert st["driver"]["curiosity"]["t"] > 0 and st["driver"]["safety"]["updates"] > 0
    assert REWARD_STATE in json.loads((A / "checkpoints/step_1/manifest.json").read_text())

    real_collect = stages_mod.collect

    def crashing_collect(*args, **kw):
        if kw["group_base"] == 1 * 2:  # step index 1 (the 2nd step), tasks_per_step = 2
            raise Crash("injected")
        return real_collect(*args, **kw)

    monkeypatch.setattr(stages_mod, "collect", crashing_collect)
    cfg = load_config(None, WRAPPED + [f"model.path={tiny_model_dir}", f"out={B}"])
    with pytest.raises(Crash):
        train_mod.train(cfg)
    monkeypatch.undo()
    buf = io.StringIO()
    train_mod.train(cfg.model_copy(update={"resume": str(B)}), console=Console(file=buf, width=300))
    assert "[resume] from" in buf.getvalue() and "initial state" not in buf.getvalue()
    # step 2 has the same rewards (the bonus decayed by the restored t, the restored lambda)
    assert _rewards(B, 2) == _rewards(A, 2)
    assert all(lam != 1.0 for *_, lam in _rewards(B, 2))
    assert _max_diff(_weights(B / "checkpoints/step_2"), _weights(A / "checkpoints/step_2")) <= 1e-6
    sa, sb = (unpack_state(o / "checkpoints/step_2" / REWARD_STATE)["driver"] for o in (A, B))
    assert sa["curiosity"]["t"] == sb["curiosity"]["t"] and sa["safety"] == sb["safety"]
    assert np.array_equal(sa["curiosity"]["count"]["global_counts"], sb["curiosity"]["count"]["global_counts"])
    assert all(np.array_equal(sa["curiosity"]["rnd"]["predictor"][k], sb["curiosity"]["rnd"]["predictor"][k])
               for k in sa["curiosity"]["rnd"]["predictor"])


# -- async: the pipeline is drained at each checkpoint, as a resume from it would start ----------
def _versions(out: Path, step: int) -> list[int]:
    lines = (out / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()
    return [json.loads(line)["policy_version"] for line in lines]


@pytest.mark.parametrize("opts", [
    ["train.max_staleness=1"],
    ["train.max_staleness=2", "rollout.sync_every=2"],
])
def test_async_resume_equals_the_uninterrupted_run(opts, tiny_model_dir, tmp_path, monkeypatch):
    """rollout.mode=async: a run crashed in step 5 and resumed from its step-3 checkpoint
    samples steps 4-6 with the policy versions, tokens and rewards of the uninterrupted run and
    ends with its weights. Before the drain at checkpoints, the resumed actor sampled step 4
    with version 3 where the uninterrupted one had used version 2 (measured: other tokens in
    steps 4 and 6, final weights 0.036 apart at lr 0.01)."""
    args = ARGS + ["rollout.mode=async", "train.lr=0.01", "train.save_every=3", "train.eval_every=0",
                   f"model.path={tiny_model_dir}"] + opts
    A, B = tmp_path / "A", tmp_path / "B"
    train_mod.train(load_config(None, args + [f"out={A}"]))

    real_collect = stages_mod.collect

    def crashing_collect(*a, **kw):
        if kw["group_base"] == 4 * 2:  # step index 4 (the 5th step), sampled by the actor thread
            raise Crash("injected")
        return real_collect(*a, **kw)

    monkeypatch.setattr(stages_mod, "collect", crashing_collect)
    cfg = load_config(None, args + [f"out={B}"])
    with pytest.raises(RuntimeError, match="rollout actor failed"):
        train_mod.train(cfg)
    monkeypatch.undo()
    assert latest_checkpoint(B) == B / "checkpoints/step_3"
    shutil.rmtree(B / "rollouts")  # what steps 4-6 sample now is compared below
    train_mod.train(cfg.model_copy(update={"resume": str(B)}))
    for s in (4, 5, 6):
        assert _versions(B, s) == _versions(A, s)
        assert _rollout_ids(B, s) == _rollout_ids(A, s)
    assert _versions(A, 4) == [3] * 4  # the drained pipeline restarts from the checkpoint's weights
    assert _max_diff(_weights(B / "checkpoints/step_6"), _weights(A / "checkpoints/step_6")) == 0.0


def _token_versions(out: Path, step: int) -> list[list[int]]:
    lines = (out / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()
    return [[v for v, m in zip(d["token_versions"], d["loss_mask"]) if m] for d in map(json.loads, lines)]


def test_partial_resume_after_a_kill_inside_an_interrupted_generation(tiny_model_dir, tmp_path, monkeypatch):
    """rollout.partial=true, one batch in flight, K=1: a run killed inside step 5's generation,
    just after the learner's push was applied there (an interrupted generation), resumes from
    its step-3 checkpoint and regenerates steps 4-6 with the uninterrupted run's tokens, per-token
    versions and final weights. Where a push lands depends on timing; here every batch but the
    first of a source waits at its first token boundary for the learner's push (a fault that
    fixes the timing: the switch is at position 1 in both runs), as it would land with a slow
    generation."""
    import threading

    args = ARGS + ["rollout.mode=async", "rollout.partial=true", "train.max_staleness=1",
                   "rollout.batches_in_flight=1", "train.lr=0.01", "train.save_every=3", "train.eval_every=0",
                   f"model.path={tiny_model_dir}"]
    local = threading.local()
    real_collect, real_poll = stages_mod.collect, stages_mod.poll_weights
    kill = {"on": False}

    def marking_collect(*a, **kw):
        local.batch, local.waited = kw["group_base"] // 2, False
        return real_collect(*a, **kw)

    def timed_poll(lp, src):
        b = getattr(local, "batch", None)
        if b is None or b == lp.source_start or local.waited:
            return real_poll(lp, src)
        local.waited = True
        deadline = time.monotonic() + 60
        while src._pending is None and time.monotonic() < deadline:
            time.sleep(0.005)
        applied = real_poll(lp, src)
        if kill["on"] and b == 4 and applied:
            raise Crash("killed inside an interrupted generation")
        return applied

    monkeypatch.setattr(stages_mod, "collect", marking_collect)
    monkeypatch.setattr(stages_mod, "poll_weights", timed_poll)
    A, B = tmp_path / "A", tmp_path / "B"
    train_mod.train(load_config(None, args + [f"out={A}"]))
    kill["on"] = True
    cfg = load_config(None, args + [f"out={B}"])
    with pytest.raises(RuntimeError, match="rollout actor failed") as e:
        train_mod.train(cfg)
    assert isinstance(e.value.__cause__, Crash)
    assert latest_checkpoint(B) == B / "checkpoints/step_3"
    kill["on"] = False
    shutil.rmtree(B / "rollouts")
    train_mod.train(cfg.model_copy(update={"resume": str(B)}))
    for s in (4, 5, 6):
        assert _token_versions(B, s) == _token_versions(A, s)
        assert _rollout_ids(B, s) == _rollout_ids(A, s)
    # step 4 (batch 3) starts the drained source: version 3 only; steps 5 and 6 switch after token 0
    assert all(set(v) == {3} for v in _token_versions(A, 4))
    assert all(v[0] == s - 2 and set(v[1:]) <= {s - 1} for s in (5, 6) for v in _token_versions(A, s))
    assert sum(len(v) > 1 for v in _token_versions(A, 5)) >= 2  # interrupted rows did resume
    assert _max_diff(_weights(B / "checkpoints/step_6"), _weights(A / "checkpoints/step_6")) == 0.0


def test_a_resume_at_another_temperature_labels_each_evaluation_with_its_own(tiny_model_dir, tmp_path):
    """A run evaluated before RL at T=1.0, resumed with rollout.temperature=0.7: eval_before.json
    records T=1.0, and the closing line names both temperatures (it said T=0.7 for both); a run
    whose files recorded no T labels the before figure `T=? (not recorded)`."""
    from typer.testing import CliRunner

    from agentrl.cli import app

    out = tmp_path / "run"
    tiny = ["env.name=toy", "sft.steps=0", "rollout.tasks_per_step=1", "algo.group_size=2", "train.eval_tasks=1",
            "train.eval_samples=1", "rollout.max_tokens=8", "quiet=true", f"model.path={tiny_model_dir}"]
    res = CliRunner().invoke(app, ["train", *tiny, "train.steps=1", "train.save_every=1", f"out={out}"])
    assert res.exit_code == 0, res.output
    assert json.loads((out / "eval_before.json").read_text())["temperature"] == 1.0
    assert "[eval] held-out (T=1.0, 1 tasks x 1" in res.output
    res = CliRunner().invoke(app, ["train", "--resume", str(out), "train.steps=2", "rollout.temperature=0.7"])
    assert res.exit_code == 0, res.output
    assert "[eval] held-out (before RL at T=1.0, after RL at T=0.7, 1 tasks x 1" in res.output, res.output
    assert "temperature" not in json.loads((out / "summary.json").read_text())["eval_before"]
    # a run whose eval_before.json was written before it recorded T: OUT/eval/before/summary.json's
    old = json.loads((out / "eval_before.json").read_text())
    del old["temperature"]
    (out / "eval_before.json").write_text(json.dumps(old))
    res = CliRunner().invoke(app, ["train", "--resume", str(out), "train.steps=3", "rollout.temperature=0.5"])
    assert res.exit_code == 0, res.output
    assert "[eval] held-out (before RL at T=1.0, after RL at T=0.5, 1 tasks x 1" in res.output, res.output
    # ... and one from before either file recorded it: the before figure's T is unknown, not
    # claimed to be this run's (both figures were labelled T=0.5)
    meta = out / "eval" / "before" / "summary.json"
    s = json.loads(meta.read_text())
    assert s["meta"].pop("temperature") == 1.0
    meta.write_text(json.dumps(s))
    res = CliRunner().invoke(app, ["train", "--resume", str(out), "train.steps=4", "rollout.temperature=0.5"])
    assert res.exit_code == 0, res.output
    assert "[eval] held-out (before RL at T=? (not recorded), after RL at T=0.5, 1 tasks x 1" in res.output, \
        res.output
