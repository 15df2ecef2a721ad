"""A new user's first hour (issue #22): install, watch a run, look at it, come back."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.metrics_log import MetricsLog

ROOT = Path(__file__).parent.parent


def test_plotting_and_tensorboard_are_core_dependencies():
    text = (ROOT / "pyproject.toml").read_text()
    deps = re.search(r"^dependencies = \[(.*?)^\]", text, flags=re.S | re.M).group(1)
    names = set(re.findall(r'^\s*"([A-Za-z0-9_.-]+)', deps, flags=re.M))
    assert {"matplotlib", "tensorboard", "rich"} <= names


def test_without_matplotlib_plot_says_what_to_install(tmp_path, monkeypatch):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "rollout/reward_mean": 0.5}\n')
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    r = CliRunner().invoke(app, ["plot", str(tmp_path)])
    assert r.exit_code == 2
    assert "pip install 'matplotlib>=3.8'" in r.output


def test_without_tensorboard_the_log_warns_and_writes_no_tb(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    log = MetricsLog(tmp_path, tensorboard=True)
    log.log(1, {"x": 1.0})
    log.close()
    assert log.tb is None and "pip install 'tensorboard" in log.note
    assert not (tmp_path / "tb").exists()
    (tmp_path / "b").mkdir()
    assert MetricsLog(tmp_path / "b", tensorboard=False).note is None
