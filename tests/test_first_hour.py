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


# -- progress (item 2) ----------------------------------------------------------------------
def test_progress_without_a_terminal_prints_plain_lines_with_eta(monkeypatch):
    import io

    from rich.console import Console

    from agentrl import progress as pr

    clock = iter([0.0, 2.0, 4.0, 30.0, 40.0, 40.0, 41.0])
    monkeypatch.setattr(pr.time, "perf_counter", lambda: next(clock))
    buf = io.StringIO()
    rep = pr.Reporter(Console(file=buf, width=200))
    assert not rep.terminal
    with rep.stage("sft", 10, unit="steps", every_s=10.0) as st:  # t0 = 0
        st.advance(1, "loss 2.000")   # t=2: the first advance always prints
        st.advance(1)                 # t=4: < 10 s since the last line: silent
        st.advance(3, "loss 1.000")   # t=30: printed
        st.advance(5)                 # t=40: the last one always prints
    lines = buf.getvalue().splitlines()
    # ETA = elapsed / done x left: 2 s / 1 x 9 = 18 s; 30 s / 5 x 5 = 30 s
    assert lines == ["[sft] 1/10 steps (10%) · 0:00:02 elapsed · ETA 0:00:18 · loss 2.000",
                     "[sft] 5/10 steps (50%) · 0:00:30 elapsed · ETA 0:00:30 · loss 1.000",
                     "[sft] 10/10 steps (100%) · 0:00:40 elapsed · ETA 0:00:00"]
    with rep.stage("model", None, unit="training the tokenizer"):  # t0 = 40
        pass                                                         # t = 41
    assert buf.getvalue().splitlines()[-2:] == ["[model] training the tokenizer ...",
                                                "[model] training the tokenizer: done in 1.0 s"]


def test_progress_on_a_terminal_is_a_bar_with_eta_and_quiet_prints_nothing():
    import io

    from rich.console import Console

    from agentrl.progress import Reporter, format_seconds

    buf = io.StringIO()
    rep = Reporter(Console(file=buf, width=120, force_terminal=True))
    with rep.stage("train", 4, completed=1) as st:
        st.advance(1, "reward 0.5")
        rep.progress.refresh()
    assert rep.progress is None  # the last stage closed stops the live display
    assert "ETA" in buf.getvalue() and "2/4" in buf.getvalue() and "reward 0.5" in buf.getvalue()
    quiet = io.StringIO()
    with Reporter(Console(file=quiet), enabled=False).stage("x", 3) as st:
        st.advance(3)
    assert quiet.getvalue() == ""
    assert format_seconds(3725) == "1:02:05" and format_seconds(float("nan")) == "-:--:--"
