"""The README's custom-env example runs exactly as written."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).parent.parent / "README.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), flags=re.S)


def test_custom_env_example_trains(tmp_path):
    [code] = [b for b in blocks("python") if "class GuessParity" in b]
    [cmd] = [b.strip() for b in blocks("bash") if "--import my_envs --env parity" in b]
    (tmp_path / "my_envs.py").write_text(code)
    # as a user runs it: the installed `agentrl` script, from the folder holding my_envs.py,
    # with only this checkout on PYTHONPATH (the script, installed from another checkout maybe,
    # runs this one's code) and not the current folder (the script puts it on sys.path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
        "OMP_NUM_THREADS": "1", "PYTHONPATH": str(README.parent)}
    args = cmd.split()
    assert args[0] == "agentrl"
    script = Path(sys.executable).parent / "agentrl"
    launcher = [str(script)] if script.exists() else [sys.executable, "-c",
                                                      "from agentrl.cli import main; main()"]
    r = subprocess.run([*launcher, *args[1:]], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = tmp_path / "runs" / "parity"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "rollout/reward_mean" in r] == [1, 2, 3]
    assert (out / "checkpoints" / "step_3" / "config.json").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert 0.0 <= summary["eval_after"]["pass@1"] <= 1.0
    assert json.loads((out / "config.json").read_text())["env"]["imports"] == ["my_envs"]
    # a fresh process evaluates the run on the same registered id (the run's config imports my_envs)
    r = subprocess.run([*launcher, "eval", "--model", "runs/parity", "--max-tasks", "2", "--samples", "1",
                        "--out", "ev"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert json.loads((tmp_path / "ev" / "summary.json").read_text())["meta"]["env"] == "parity"


def test_custom_env_registers_and_passes_checker(tmp_path, monkeypatch):
    from gymnasium.utils.env_checker import check_env

    import agentrl

    [code] = [b for b in blocks("python") if "class GuessParity" in b]
    (tmp_path / "my_envs.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    import my_envs  # noqa: F401  (registers "parity")

    env = agentrl.make_env("parity")
    check_env(env.unwrapped)
    obs, info = env.reset(seed=3)
    assert obs[0]["role"] == "user" and "even or odd" in obs[0]["content"]
    sys.modules.pop("my_envs", None)


@pytest.mark.parametrize("cmd", ["agentrl envs", "agentrl config --reference"])
def test_cli_commands_run(cmd):
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", *cmd.split()[1:]],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "code_sandbox" in r.stdout or "train.lr" in r.stdout
