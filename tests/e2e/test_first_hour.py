"""A new user's first hour (issue #22): install, watch a run, look at it, come back."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.log.metrics import MetricsLog

ROOT = Path(__file__).parents[2]


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

    from agentrl.log import progress as pr

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

    from agentrl.log.progress import Reporter, format_seconds

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


# -- plots (item 3) -------------------------------------------------------------------------
def _metrics(path, rows):
    import json

    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_smoothing_is_the_debiased_ema():
    from agentrl.log.plot import smooth

    # m0 = 0.5 * 1 = 0.5 -> 0.5 / (1 - 0.5) = 1; m1 = 0.25 -> 0.25 / 0.75 = 1/3
    got = smooth([1.0, 0.0], 0.5)
    assert got[0] == 1.0 and abs(got[1] - 1 / 3) < 1e-12
    assert smooth([3.0, 4.0], 0.0) == [3.0, 4.0]


def test_stage_shares_split_rollout_into_generate_and_env():
    from agentrl.log.plot import stage_shares

    rows = [{"step": 0, "eval/seconds": 9.0},  # the before-RL evaluation: no step time
            {"step": 1, "perf/rollout_s": 3.0, "perf/env_s": 1.0, "perf/update_s": 2.0, "perf/sync_s": 0.5},
            {"step": 2, "perf/rollout_s": 1.0, "perf/update_s": 1.0, "perf/sync_s": 0.0, "eval/seconds": 4.0}]
    steps, sec = stage_shares(rows)
    assert steps == [1, 2]
    assert sec == {"generate": [2.0, 1.0], "env": [1.0, 0.0], "update": [2.0, 1.0],
                   "sync": [0.5, 0.0], "eval": [0.0, 4.0]}


def test_plot_panels_skip_duplicates_and_flat_kl_and_start_at_the_before_rl_eval(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from agentrl.log.plot import labels, panels, plot_runs
    from agentrl.log.summary import read_metrics

    same = [{"step": 0, "eval/pass@1": 0.2, "eval/pass@1_se": 0.05}]
    same += [{"step": s, "rollout/reward_mean": s / 10, "rollout/pass_rate": s / 10, "loss/kl": 0.0,
              "loss/approx_kl": 0.0, "perf/rollout_s": 1.0, "perf/update_s": 1.0} for s in range(1, 8)]
    same += [{"step": 7, "eval/pass@1": 0.4, "eval/pass@1_se": 0.05, "eval/seconds": 2.0}]
    a = _metrics(tmp_path / "x" / "run", same)
    b = _metrics(tmp_path / "y" / "run", [{"step": s, "rollout/reward_mean": 0.5, "rollout/pass_rate": 0.25,
                                           "loss/kl": 0.01 * s} for s in range(1, 8)])
    runs = [a, b]
    assert labels(runs) == [str(a), str(b)]  # same folder name: the whole paths
    data = {r: read_metrics(r) for r in runs}
    got = {}
    for stem, _title, draw in panels(runs, data):
        fig, ax = plt.subplots()
        drawn = draw(ax)
        got[stem] = (drawn, [ln.get_label() for ln in ax.get_lines() if not ln.get_label().startswith("_")],
                     ax)
        plt.close(fig)
    # run a: pass rate == reward -> one curve; run b: they differ -> a dashed pass-rate curve
    assert got["reward"][1] == [f"{a} reward", f"{b} reward", f"{b} pass rate"]
    # KL: run a logged zeros only (KL off) -> not drawn; run b's loss/kl is
    assert got["kl"][1] == [f"{b} loss/kl"]
    assert got["sft_loss"][0] is False
    # the held-out curve starts at step 0 (the before-RL evaluation)
    [bars] = got["eval_pass1"][2].containers
    assert list(bars.lines[0].get_xdata()) == [0, 7]
    paths = plot_runs([a], tmp_path / "png")
    assert paths[0].name == "dashboard.png"
    assert {p.name for p in paths} == {"dashboard.png", "reward.png", "eval_pass1.png", "time_share.png"}


# -- summary (item 4) -----------------------------------------------------------------------
def test_summary_panel_counts_eval_once_shows_se_and_no_repeated_reward(tmp_path):
    import io
    import json

    from rich.console import Console

    from agentrl.log.summary import stage_seconds, summary_panel

    rows = [{"step": 0, "eval/pass@1": 0.25, "eval/seconds": 2.0},
            {"step": 1, "perf/rollout_s": 1.0, "perf/update_s": 0.5, "perf/loop_s": 1.5,
             "rollout/reward_mean": 0.1, "rollout/pass_rate": 0.1},
            {"step": 2, "perf/rollout_s": 1.0, "perf/update_s": 0.5, "perf/loop_s": 3.0,
             "rollout/reward_mean": 0.3, "rollout/pass_rate": 0.3},
            {"step": 2, "eval/pass@1": 0.5, "eval/seconds": 3.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    st = stage_seconds(tmp_path / "metrics.jsonl")
    assert st == {"eval": 5.0, "rollout": 2.0, "update": 1.0, "loop": 3.0}  # 2 + 3: each eval once
    before = {"pass@1": 0.25, "pass@1_se": 0.0125, "pass@4": 0.5, "pass@4_se": 0.05, "reward_mean": 0.25}
    after = {"pass@1": 0.5, "pass@1_se": 0.02, "pass@4": 0.75, "pass@4_se": 0.04, "reward_mean": 0.5}
    summary = {"algo": "grpo", "env": "code_sandbox", "steps": 2, "eval_before": before,
               "eval_after": after, "stage_seconds": {"sft": 7.0, **st}}
    buf = io.StringIO()
    Console(file=buf, width=200).print(summary_panel(summary, tmp_path))
    text = buf.getvalue()
    assert "0.250 ± 0.013" in text and "0.500 ± 0.020" in text and "0.750 ± 0.040" in text
    assert "held-out reward" not in text  # = pass@1 at both ends: shown once
    assert "train pass rate" not in text  # = train reward
    assert "sft 7.0s" in text and "eval 5.0s" in text and "eval 10" not in text
    # as train writes summary.json: reward_mean left out, the flag set
    flagged = {**summary, "heldout_reward_is_pass@1": True,
               "eval_before": {k: v for k, v in before.items() if k != "reward_mean"},
               "eval_after": {k: v for k, v in after.items() if k != "reward_mean"}}
    buf = io.StringIO()
    Console(file=buf, width=200).print(summary_panel(flagged, tmp_path))
    assert "held-out reward" not in buf.getvalue()
    after["reward_mean"] = 0.45
    buf = io.StringIO()
    Console(file=buf, width=200).print(summary_panel(summary, tmp_path))
    assert "held-out reward" in buf.getvalue()


# -- custom envs from the CLI (item 5) ------------------------------------------------------
def _readme_env(folder):
    from test_readme import blocks

    [code] = [b for b in blocks("python") if "class GuessParity" in b]
    (folder / "my_envs.py").write_text(code)


def _fresh(code: str, cwd, extra_path: str = ""):
    """Run `code` in a fresh Python process in `cwd` (as the `agentrl` script runs: the current
    folder on sys.path)."""
    import os
    import subprocess

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(cwd), extra_path, str(ROOT)) if p)}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_a_registered_custom_env_resolves_the_same_way_in_a_fresh_process(tmp_path):
    _readme_env(tmp_path)
    code = """
import gymnasium as gym
from agentrl.env.registry import import_env_modules, resolve_env_id
ids = {}
ids["registered id, no import"] = resolve_env_id("my_envs/GuessParity-v0")  # namespace imported
import_env_modules(["my_envs"])
ids["short"] = resolve_env_id("parity")
ids["module:Class"] = resolve_env_id("my_envs:GuessParity")  # the id it registered, no second one
ids["module:name"] = resolve_env_id("my_envs:parity")
print(sorted(set(ids.values())), sorted(i for i in gym.registry if "GuessParity" in i))
"""
    r = _fresh(code, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["['my_envs/GuessParity-v0']", "['my_envs/GuessParity-v0']"]
    r = _fresh("from agentrl.env.registry import resolve_env_id; resolve_env_id('parity')", tmp_path)
    assert r.returncode != 0 and "--import MODULE" in r.stderr  # the error says what to do


def test_an_unregistered_class_gets_one_custom_id(tmp_path):
    (tmp_path / "loose.py").write_text("from agentrl import TextEnv\n\nclass Loose(TextEnv):\n    'x'\n")
    r = _fresh("from agentrl.env.registry import resolve_env_id as r; print(r('loose:Loose'), r('loose:Loose'))", tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["custom/Loose-v0", "custom/Loose-v0"]


def test_an_installed_package_registers_through_the_entry_point_group(tmp_path):
    site = tmp_path / "site"
    (site / "plug_envs-0.1.dist-info").mkdir(parents=True)
    (site / "plug_envs-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: plug-envs\nVersion: 0.1\n")
    (site / "plug_envs-0.1.dist-info" / "entry_points.txt").write_text("[agentrl.envs]\nplug = plug_envs:register\n")
    (site / "plug_envs.py").write_text(
        "from agentrl import register_env\n\n"
        "def register():\n"
        "    register_env('plug/Toy-v0', 'agentrl_envs.toy:ToyEnv', short_name='plugtoy', description='plugged')\n")
    r = _fresh("from agentrl.env.registry import resolve_env_id; print(resolve_env_id('plugtoy'))", tmp_path, str(site))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "plug/Toy-v0"
    r = _fresh("from agentrl.cli import main; import sys; sys.argv = ['agentrl', 'envs']; main()", tmp_path, str(site))
    assert r.returncode == 0, r.stderr
    assert "plugtoy" in r.stdout and "plugged" in r.stdout


def test_envs_and_eval_take_import(tmp_path):
    _readme_env(tmp_path)
    r = _fresh("from agentrl.cli import main; import sys; sys.argv = ['agentrl', 'envs', '--import', 'my_envs']; main()",
               tmp_path)
    assert r.returncode == 0, r.stderr
    assert "parity" in r.stdout and "my_envs/GuessParity-v0" in r.stdout
    r = _fresh("from agentrl.cli import main; import sys; sys.argv = ['agentrl', 'envs', '--import', 'nope_mod']; main()",
               tmp_path)
    assert r.returncode == 2 and "nope_mod" in r.stdout


# -- agentrl show: advantage and trained (item 6) -------------------------------------------
def _episodes(tiny_tokenizer, returns, groups):
    from agentrl.types import Trajectory

    out = []
    for r, g in zip(returns, groups):
        t = Trajectory(task_id=f"t{g}", group_id=g)
        t.append_context(tiny_tokenizer.encode("Write a Python function", add_special_tokens=False))
        t.append_sampled(tiny_tokenizer.encode("def add_seven(x):", add_special_tokens=False), [0.0] * 5,
                         reward=r)
        t.terminated = True
        out.append(t)
    return out


def test_mark_trained_records_the_grpo_advantage_and_zero_variance_groups(tiny_tokenizer):
    from agentrl.algos import get_algorithm
    from agentrl.algos.shaping import build_batch
    from agentrl.config import load_config
    from agentrl.log.steps import mark_trained

    trajs = _episodes(tiny_tokenizer, [1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1])
    batch = build_batch(trajs, 0)
    cfg = load_config(None, ["algo.name=grpo", "algo.group_size=2"])
    batch["advantages"], _ = get_algorithm("grpo").advantages(batch, cfg.algo)
    mark_trained(trajs, batch)
    a = [t.info["advantage"] for t in trajs]
    assert [t.info["trained"] for t in trajs] == [True, True, False, False]
    assert a[0] > 0 and abs(a[0] + a[1]) < 1e-6 and a[2] == a[3] == 0.0  # (r - mean) / std: +-, 0
    mask = batch["loss_mask"][0] > 0
    assert abs(a[0] - float(batch["advantages"][0][mask].mean())) < 1e-6


def test_show_says_whether_an_episode_was_trained(tmp_path, tiny_model_dir, tiny_tokenizer):
    import io
    import json

    from rich.console import Console

    from agentrl.log.show import show_episode

    trajs = _episodes(tiny_tokenizer, [1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1])
    for t, (adv, tr) in zip(trajs, [(0.7071, True), (-0.7071, True), (0.0, False), (0.0, False)]):
        t.info.update(advantage=adv, trained=tr)
    (tmp_path / "rollouts").mkdir()
    (tmp_path / "rollouts" / "step_3.jsonl").write_text("".join(json.dumps(t.to_dict()) + "\n" for t in trajs))
    (tmp_path / "config.json").write_text(json.dumps({"model": {"path": tiny_model_dir}}))

    def shown(i):
        buf = io.StringIO()
        show_episode(tmp_path, None, i, Console(file=buf, width=300, color_system=None))
        return buf.getvalue()

    assert "trained: advantage +0.707 · group returns [1, 0]" in shown(0)
    text = shown(2)
    assert "NOT trained: advantage 0 (its group's rewards were all equal" in text
    assert "group returns [1, 1]" in text


# -- help, eval table, .gitignore, README merge (item 7) ------------------------------------
def test_train_help_shows_the_defaults():
    from agentrl.config import Config

    d = Config()
    r = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0
    for want in (d.env.name, d.algo.name, str(d.train.steps), d.out):
        assert f"[default: ({want})]" in r.output, want


def test_eval_per_task_table_is_readable_at_80_columns_in_a_file():
    import io

    from rich.console import Console

    from agentrl.eval.report import print_summary

    tasks = [{"task_id": f"HumanEval/{i}", "n": 4, "c": i, "pass@1": i / 4, "pass@4": float(i > 0),
              "reward_mean": i / 4, "turns_mean": 1.0, "tokens_mean": 96.25, "verdicts": {"pass": i, "fail": 4 - i},
              "errors": 0} for i in range(3)]
    summary = {"k": [1, 4], "overall": {"pass@1": 0.25}, "tasks": tasks}
    buf = io.StringIO()
    print_summary(summary, Console(file=buf, width=80))  # not a terminal: 80 columns
    text = buf.getvalue()
    assert "…" not in text
    row = next(line for line in text.splitlines() if "HumanEval/2" in line)
    assert row.split()[:9] == ["HumanEval/2", "4", "2", "0.5", "1", "0.5", "1", "96.2", "pass:"]


def test_gitignore_and_readme_merge_example():
    assert "eval_runs/" in (ROOT / ".gitignore").read_text().split()
    readme = (ROOT / "README.md").read_text()
    [(run, step)] = re.findall(r"agentrl merge runs/(\w+)/checkpoints/step_(\d+)", readme)
    [train] = [ln for ln in readme.splitlines() if f"--out runs/{run}" in ln and "agentrl train" in ln]
    assert f"--steps {step}" in train and "model.lora_r=" in train  # the run it names has that step
    for shot in ("docs/dashboard.png", "docs/terminal.txt"):  # the screenshots it shows exist
        assert shot in readme and (ROOT / shot).stat().st_size > 500, shot


# -- agentrl doctor (item 8) ----------------------------------------------------------------
def test_doctor_reports_each_part_with_a_fix_for_missing_ones():
    from agentrl.sandbox.doctor import Check, check_module, render

    r = CliRunner().invoke(app, ["doctor"], env={"COLUMNS": "200"})
    text = r.output
    for part in ("python", "torch", "devices", "sandbox", "backend bwrap", "backend subprocess", "ray",
                 "vllm", "matplotlib", "tensorboard"):
        assert re.search(rf"^(ok  |WARN|FAIL)  +{re.escape(part)} ", text, flags=re.M), part
    assert "NOT isolated" in text  # the subprocess backend is named as unisolated
    assert r.exit_code == (1 if re.search(r"^FAIL", text, flags=re.M) else 0)
    miss = check_module("thing", "no_such_module_xyz", "no-such-dist", "pip install thing", required=False,
                        use="x")
    assert (miss.status, miss.fix) == ("warn", "pip install thing")
    lines = render([Check("a", "ok", "fine"), Check("bb", "fail", "gone", "do this")])
    assert lines == ["ok    a   fine", "FAIL  bb  gone", "          fix: do this", "1 failing, 0 warnings"]
