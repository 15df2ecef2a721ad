"""Run folders and checkpoints survive mistakes and accidents (issue 21, items 7-10): a new run
never writes into an earlier one, Ctrl-C / SIGTERM save the last step, `--resume` refuses a
folder without a checkpoint, skips checkpoints that fail their manifest (flipped byte, truncated
file) naming them, and a finished run resumed does nothing. Real runs (toy env), real files,
real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import agentrl.startup as startup
import agentrl.train as train_mod
from agentrl.cli import app
from agentrl.config import load_config
from agentrl.learner.checkpoints import check_out, intact, latest_checkpoint, prune
from agentrl.log.summary import read_metrics

ARGS = ["env.name=toy", "sft.steps=0", "rollout.tasks_per_step=2", "algo.group_size=2",
        "train.eval_tasks=2", "train.eval_samples=1", "rollout.max_tokens=16",
        "env.kwargs={words: [x, the, def, return]}", "algo.entropy_coef=0.01", "quiet=true"]


def _cfg(tiny_model_dir, out, *extra):
    return load_config(None, ARGS + [f"model.path={tiny_model_dir}", f"out={out}", *extra])


@pytest.fixture(scope="module")
def run4(tmp_path_factory, tiny_model_dir) -> Path:
    """4 steps, a checkpoint after every step, all kept."""
    out = tmp_path_factory.mktemp("runs") / "R"
    train_mod.train(_cfg(tiny_model_dir, out, "train.steps=4", "train.save_every=1", "train.keep_checkpoints=0"))
    return out


def test_check_out_refuses_non_empty_folders_files_and_foreign_files(tmp_path):
    assert check_out(tmp_path / "new", overwrite=False) == []
    f = tmp_path / "a_file"
    f.write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        check_out(f, overwrite=True)
    d = tmp_path / "d"
    d.mkdir()
    (d / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="already holds files"):
        check_out(d, overwrite=False)
    with pytest.raises(ValueError, match="did not write"):
        check_out(d, overwrite=True)
    assert (d / "notes.txt").read_text() == "mine"


def _cli(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, list(args))
    return r.exit_code, " ".join(r.output.split())  # rich wraps long lines


def test_cli_bad_out_and_resume_folders_are_one_line_errors(tmp_path, run4):
    code, text = _cli("train", "--env", "toy", "--out", str(run4 / "metrics.jsonl"), "-q")
    assert code == 2 and "is a file" in text
    code, text = _cli("train", "--env", "toy", "--out", str(run4), "-q")
    assert code == 2 and "--resume" in text and "--overwrite" in text
    code, text = _cli("train", "--resume", str(tmp_path), "-q")
    assert code == 2 and "not a run directory" in text
    code, text = _cli("train", "--env", "toy", "--out", "/proc/agentrl_run", "-q")
    assert code == 2 and "out:" in text and "Traceback" not in text


def test_resume_without_a_checkpoint_is_an_error(tmp_path, tiny_model_dir):
    out = tmp_path / "N"
    out.mkdir()
    (out / "config.json").write_text(_cfg(tiny_model_dir, out).model_dump_json())
    with pytest.raises(startup.ResumeError, match="no intact checkpoint"):
        train_mod.train(_cfg(tiny_model_dir, out, f"resume={out}"))


def test_manifest_catches_a_flipped_byte_and_a_truncated_file(run4, tmp_path):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(run4, out)
    ck4, ck3 = out / "checkpoints/step_4", out / "checkpoints/step_3"
    assert intact(ck4) is None and latest_checkpoint(out) == ck4
    w = ck4 / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-100] ^= 0xFF  # inside the tensor data: safetensors itself would load it silently
    w.write_bytes(bytes(data))
    assert "SHA-256" in intact(ck4)
    skipped = []
    assert latest_checkpoint(out, on_skip=lambda p, why: skipped.append((p, why))) == ck3
    assert skipped[0][0] == ck4
    t = ck3 / "trainer_state.pt"
    t.write_bytes(t.read_bytes()[:50])
    assert "bytes" in intact(ck3)
    assert latest_checkpoint(out) == out / "checkpoints/step_2"


def test_resume_falls_back_past_a_corrupt_checkpoint_and_names_it(run4, tmp_path, tiny_model_dir):
    import io
    import shutil

    from rich.console import Console

    out = tmp_path / "fallback"
    shutil.copytree(run4, out)
    (out / "checkpoints/step_4/model.safetensors").write_bytes(b"\0" * 64)
    (out / "summary.json").unlink()
    buf = io.StringIO()
    train_mod.train(_cfg(tiny_model_dir, out, "train.steps=4", f"resume={out}"),
                    console=Console(file=buf, width=300, color_system=None))
    text = buf.getvalue()
    assert f"skipping {out / 'checkpoints/step_4'}" in text
    assert f"from {out / 'checkpoints/step_3'} at step 3" in text
    assert intact(out / "checkpoints/step_4") is None  # step 4 was run again and saved whole


def test_resuming_a_finished_run_does_nothing(run4, tmp_path, tiny_model_dir):
    import shutil

    out = tmp_path / "done"
    shutil.copytree(run4, out)
    before = (out / "metrics.jsonl").read_text()
    s = train_mod.train(_cfg(tiny_model_dir, out, "train.steps=4", f"resume={out}"))
    assert s == json.loads((out / "summary.json").read_text())
    assert (out / "metrics.jsonl").read_text() == before  # no second eval/* row


def test_prune_keeps_the_newest(run4, tmp_path):
    import shutil

    out = tmp_path / "pr"
    shutil.copytree(run4, out)
    gone = prune(out, 2)
    assert [p.name for p in gone] == ["step_1", "step_2"]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_3", "step_4"]


def test_sigterm_saves_the_last_step_and_the_run_resumes(tmp_path, tiny_model_dir):
    """save_every=0: SIGTERM after step 2 starts -> a checkpoint of the last completed step,
    exit 143 (128 + SIGTERM; Ctrl-C's is 130) and a message; --resume finishes the run."""
    out = tmp_path / "S"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "agentrl.cli", "train", *ARGS, "train.steps=40", "train.save_every=0",
           "rollout.max_tokens=64", f"model.path={tiny_model_dir}", f"out={out}"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while not any("rollout/reward_mean" in r for r in (read_metrics(out) if (out / "metrics.jsonl").exists() else [])):
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    text, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, text[-3000:]
    text = text.replace("\n", "")  # rich wraps long lines
    assert "[stopped] SIGTERM after step" in text and f"--resume {out}" in text
    ck = latest_checkpoint(out)
    assert ck is not None and intact(ck) is None
    done = json.loads((ck / "agentrl_state.json").read_text())["step"]
    rows = [r["step"] for r in read_metrics(out) if "rollout/reward_mean" in r]
    assert rows[-1] == done  # the checkpoint is the last completed step
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "train", "--resume", str(out), "-q",
                        "train.steps=" + str(done + 2)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert [r_["step"] for r_ in read_metrics(out) if "rollout/reward_mean" in r_] == list(range(1, done + 3))


def test_resuming_an_in_process_checkpoint_with_ranks_fails_before_ray_starts(run4, tmp_path, tiny_model_dir):
    import shutil

    out = tmp_path / "inproc"
    shutil.copytree(run4, out)
    with pytest.raises(startup.ResumeError, match="in-process learner"):
        startup.resume_checkpoint(_cfg(tiny_model_dir, out, f"resume={out}", "train.learner_workers=2"),
                                    out, print)


def test_eval_of_a_run_with_one_sample_uses_the_runs_temperature(run4, tmp_path):
    """`agentrl eval --model RUN` reproduces the run's figure: with train.eval_samples=1 it
    samples at the run's T (not greedy, the default for a bare model with one sample)."""
    from agentrl.eval.cli import eval_command

    s = eval_command(model=str(run4), out=str(tmp_path / "ev"))
    assert s["meta"]["temperature"] == 1.0
    run = json.loads((run4 / "summary.json").read_text())
    assert s["overall"]["pass@1"] == pytest.approx(run["eval_after"]["pass@1"])


def test_stop_request_exit_codes_sigint_130_sigterm_143():
    """The exit status of a stopped run is 128 + the signal: Ctrl-C 130, SIGTERM 143 (the first
    signal asks for a stop after the step, a second one raises at once with its own code)."""
    from agentrl.infra.signals import RunInterrupted, SecondSignal, StopRequest, signal_exit_code

    before = signal.getsignal(signal.SIGTERM)
    assert (signal_exit_code("SIGINT"), signal_exit_code("SIGTERM"), signal_exit_code(None)) == (130, 143, 130)
    assert RunInterrupted("stopped", "SIGTERM").exit_code == 143 and RunInterrupted("stopped").exit_code == 130
    for first, second, code in ((signal.SIGTERM, signal.SIGTERM, 143), (signal.SIGINT, signal.SIGINT, 130),
                                (signal.SIGINT, signal.SIGTERM, 143)):
        stop = StopRequest()
        stop.install()
        try:
            os.kill(os.getpid(), first)
            time.sleep(0.05)  # handlers run between bytecodes of the main thread
            assert stop.signal == signal.Signals(first).name
            with pytest.raises(SecondSignal) as e:
                os.kill(os.getpid(), second)
                time.sleep(0.05)
            assert e.value.exit_code == code
        finally:
            stop.uninstall()
    assert signal.getsignal(signal.SIGTERM) is before  # restored
