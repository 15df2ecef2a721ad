"""What a new user does in the first hour (issue #22), end to end through the `agentrl` command:
a 3-step run with its output sent to a file (the per-step lines are in the file while the run
works), `agentrl plot` (the PNGs), TensorBoard files, `agentrl show`, a second run into the same
folder (refused), `agentrl doctor`.

`test_new_user_session` runs it with this checkout on PYTHONPATH (default suite);
`test_clean_venv_install_then_new_user_session` first makes a clean venv (no system site
packages), installs torch and the README's `pip install -e .` into it, and runs the same session
with the venv's `agentrl` script (slow: the install takes minutes).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN = ["--env", "toy", "--algo", "grpo", "--steps", "3", "--out", "runs/first", "rollout.tasks_per_step=2",
       "algo.group_size=2", "train.eval_tasks=2", "train.eval_samples=1", "rollout.max_tokens=24"]
SMALL_MODEL = ["model.hidden_size=32", "model.num_layers=1", "model.intermediate_size=64", "sft.steps=5"]


def new_user_session(agentrl: list[str], env: dict[str, str], cwd: Path, extra: list[str],
                     run: Callable[..., Any] | None = None) -> None:
    """The session of the module doc with the command `agentrl` (a launcher list) in `cwd`;
    the commands after the first run go through `run(*args)` (default: `agentrl` in a fresh
    process) returning `(returncode, stdout)`."""
    log = cwd / "train.log"
    with log.open("w") as f:  # output to a file, as with nohup or Slurm
        proc = subprocess.Popen([*agentrl, "train", *RUN, *extra], cwd=cwd, env=env, stdout=f,
                                stderr=subprocess.STDOUT)
        seen_while_running = None
        t0 = time.monotonic()
        while proc.poll() is None and time.monotonic() - t0 < 900:
            if seen_while_running is None and "[train] 1/3 RL steps" in log.read_text():
                seen_while_running = proc.poll() is None
            time.sleep(0.02)
        proc.wait(timeout=60)
    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    assert seen_while_running, "the first RL step's line was not in the log file while the run worked"
    steps = [ln for ln in text.splitlines() if ln.startswith("[train] ")]
    assert [s.split()[1] for s in steps] == ["1/3", "2/3", "3/3"] and all("ETA" in s for s in steps)
    assert "[eval before]" in text and "[eval after]" in text
    out = cwd / "runs" / "first"
    assert any(p.name.startswith("events.out.tfevents") for p in (out / "tb").iterdir())

    def fresh(*args: str) -> tuple[int, str]:
        r = subprocess.run([*agentrl, *args], cwd=cwd, env=env, capture_output=True, text=True,
                           timeout=600)
        return r.returncode, r.stdout + r.stderr

    run = run or fresh
    rc, text = run("plot", "runs/first")
    assert rc == 0, text
    pngs = {p.name for p in (out / "plots").iterdir()}
    assert {"dashboard.png", "reward.png", "eval_pass1.png", "time_share.png"} <= pngs
    assert (out / "plots" / "dashboard.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rc, text = run("show", "runs/first")  # the latest saved step: the last one
    assert rc == 0, text
    assert text.startswith("step 3 ") and "trained" in text and "group returns" in text
    rc, text = run("train", *RUN, *extra)  # the same folder again: refused, the first run intact
    assert rc == 2 and "--overwrite" in text and "--resume" in text, text
    assert (out / "summary.json").exists()
    rc, text = run("doctor")
    assert rc in (0, 1) and "sandbox" in text and "torch" in text, text


def test_new_user_session(tmp_path, tiny_model_dir, monkeypatch):
    """The run in a fresh process with its output to a file; the other commands in this process
    (CliRunner), to keep it short."""
    from typer.testing import CliRunner

    from agentrl.cli import app

    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "COLUMNS": "120"}
    launcher = [sys.executable, "-c", "from agentrl.cli import main; main()"]
    monkeypatch.chdir(tmp_path)

    def here(*args: str) -> tuple[int, str]:
        r = CliRunner().invoke(app, list(args), env={"COLUMNS": "120"})
        return r.exit_code, r.output

    new_user_session(launcher, env, tmp_path, [f"--model={tiny_model_dir}", "sft.steps=5"], here)


@pytest.mark.slow
def test_clean_venv_install_then_new_user_session(tmp_path):
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env |= {"OMP_NUM_THREADS": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "COLUMNS": "120"}
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env, timeout=300)
    py = str(venv / "bin" / "python")
    out = subprocess.run([py, "-c", "import sys; print(sys.prefix != sys.base_prefix); import torch"],
                         env=env, capture_output=True, text=True)
    assert out.stdout.startswith("True") and "No module named 'torch'" in out.stderr  # clean
    for args in (["torch==2.13.0"], ["-e", str(ROOT)]):  # the README's install line
        r = subprocess.run([py, "-m", "pip", "install", "-q", *args], env=env, capture_output=True,
                           text=True, timeout=1800)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    work = tmp_path / "work"
    work.mkdir()
    new_user_session([str(venv / "bin" / "agentrl")], env, work, SMALL_MODEL)
