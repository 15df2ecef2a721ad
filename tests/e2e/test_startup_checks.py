"""Start-up checks found by a new-user pass: each is refused before anything is written (or
done right), with a one-line message naming the setting."""

from __future__ import annotations

import json
import shutil

import pytest

import agentrl.run as run_mod
import agentrl.startup as startup
import agentrl.train as train_mod
from agentrl.config import ConfigError, load_config
from agentrl.learner.checkpoints import check_out

TOY = ["env.name=toy", "sft.steps=0", "rollout.tasks_per_step=2", "algo.group_size=2",
       "train.eval_tasks=2", "train.eval_samples=1", "train.steps=1", "rollout.max_tokens=8",
       "quiet=true", "log.tensorboard=false"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_model_dir):
    out = tmp_path_factory.mktemp("startup") / "run"
    train_mod.train(load_config(None, TOY + [f"model.path={tiny_model_dir}", f"out={out}"]))
    return out


@pytest.mark.parametrize("override, key", [("algo.name=ppo", "algo.name"),
                                            ("env.name=code_sandbox", "env.name")])
def test_resume_with_another_env_or_algo_is_refused_and_the_run_config_kept(finished_run, tmp_path,
                                                                            override, key):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    before = (out / "config.json").read_text()
    base = json.loads(before)
    cfg = load_config(None, [override, "train.steps=2"], base=base).model_copy(update={"resume": str(out)})
    with pytest.raises(startup.ResumeError, match=f"trained with {key}="):
        train_mod.train(cfg)
    assert (out / "config.json").read_text() == before  # a plain --resume still works after it


def test_warm_start_on_an_env_without_reference_answers_fails_at_start_up(tmp_path):
    assert startup.env_has_reference_answers("code_sandbox")
    assert not startup.env_has_reference_answers("safety")
    cfg = load_config(None, ["env.name=safety", "sft.steps=5", f"out={tmp_path / 'run'}"])
    with pytest.raises(ConfigError, match="sft.steps=5: env safety offers no reference answers"):
        run_mod.set_up(cfg)
    assert not (tmp_path / "run").exists()


def test_options_the_algorithm_ignores_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="^config error: .*turn_advantages"):  # refused by the schema
        run_mod.set_up(load_config(None, ["algo.name=ppo", "algo.turn_advantages=true",
                                            f"out={tmp_path / 'r'}"]))
    assert not (tmp_path / "r").exists()


def test_overwrite_removes_what_plot_sft_and_merge_write(tmp_path):
    out = tmp_path / "run"
    for d in ("plots", "model", "merged", "checkpoints"):
        (out / d).mkdir(parents=True)
    (out / "config.json").write_text("{}")
    assert sorted(check_out(out, overwrite=True)) == ["checkpoints", "config.json", "merged", "model", "plots"]
    assert list(out.iterdir()) == []


def test_bad_yaml_and_values_name_the_file_or_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match="bad.yaml: invalid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="is not a file"):
        load_config(tmp_path)
    with pytest.raises(ConfigError, match="override env.kwargs: invalid value"):
        load_config(None, ["env.kwargs={bad"])
    with pytest.raises(ConfigError, match="seed"):
        load_config(None, ["seed=-5"])


def test_distill_teacher_with_another_tokenizer_is_refused(tiny_model_dir, tiny_tokenizer, tmp_path):
    from agentrl.algos.distill import check_teacher_tokenizer
    from agentrl.models.tiny import build_tiny_model

    check_teacher_tokenizer(tiny_model_dir, tiny_tokenizer)  # the same tokenizer: accepted
    other = build_tiny_model(tmp_path / "other", ["a completely different corpus of words"] * 30,
                             hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                             vocab_size=300, seed=1)
    with pytest.raises(ValueError, match="algo.teacher_path=.*not the policy's"):
        check_teacher_tokenizer(other, tiny_tokenizer)


def test_offline_dpo_builds_the_embedded_model_without_reading_the_preference_file(tmp_path):
    from agentrl.offline import dpo_from_file

    prefs = tmp_path / "prefs.jsonl"
    prefs.write_text(json.dumps({"prompt": "Say yes.", "chosen": "yes", "rejected": "no"}) + "\n")
    cfg = load_config(None, ["env.name=toy", "algo.name=dpo", "train.steps=1", f"out={tmp_path / 'run'}",
                             "env.dataset=" + str(prefs), "model.hidden_size=16", "model.num_layers=1",
                             "model.num_heads=2", "model.intermediate_size=32", "model.vocab_size=300",
                             "log.tensorboard=false", "train.torch_threads=1"])
    s = dpo_from_file(cfg, prefs, say=lambda m: None)
    assert s["pairs"] == 1 and (tmp_path / "run" / "model" / "config.json").exists()


def test_ctrl_c_before_the_rl_loop_says_nothing_was_saved(tiny_model_dir, tmp_path):
    """SIGINT during the warm start (no step saved yet): exit 130 and a line that says so."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    args = [a for a in TOY if not a.startswith("sft.steps")] + ["sft.steps=100000", "sft.min_steps=100000"]
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "train", *args,
                             f"model.path={tiny_model_dir}", f"out={out}"],
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not (out / "sft_metrics.jsonl").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-2000:]
        time.sleep(0.05)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    text, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, text[-2000:]
    assert "stopped: no step was saved: start again with --overwrite" in text, text[-2000:]


def test_sft_dataset_that_is_a_directory_says_so(tmp_path):
    from agentrl.offline import load_conversations

    with pytest.raises(FileNotFoundError, match="is a directory, not a JSONL file"):
        load_conversations(tmp_path)


@pytest.mark.parametrize("kwarg, message", [
    ("env.kwargs.nonsense=3", r"env\.kwargs: code_sandbox cannot be made .*'nonsense': 3.*"
                              r"TypeError: .*unexpected keyword argument 'nonsense'"),
    ("env.kwargs.max_turns=abc", r"env\.kwargs: code_sandbox .*'max_turns': 'abc'.*ValueError"),
])
def test_env_kwargs_the_env_refuses_are_config_errors_naming_the_key(tmp_path, kwarg, message):
    from agentrl.rollout.envs import build_env

    cfg = load_config(None, ["env.name=code_sandbox", kwarg, f"out={tmp_path / 'run'}"])
    with pytest.raises(ConfigError, match=message):
        build_env(cfg, "train")


@pytest.mark.parametrize("override, message", [
    ("env.kwargs.bogus=1", r"env\.kwargs: toy cannot be made .*'bogus'"),
    ("env.wrappers=[judgee]", r"env\.wrappers / env\.wrapper_kwargs: .*unknown wrapper 'judgee'"),
    ("model.path={missing}", r"model\.path: model directory not found: .*nope"),
    ("model.path={empty}", r"model\.path: .*holds no config\.json"),
])
def test_a_failing_start_under_overwrite_deletes_nothing(finished_run, tmp_path, override, message):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    (tmp_path / "empty").mkdir()
    override = override.format(missing=tmp_path / "nope", empty=tmp_path / "empty")
    cfg = load_config(None, TOY + [override, f"out={out}", "overwrite=true"])
    with pytest.raises(ConfigError, match=message):
        run_mod.set_up(cfg)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == before
    # and a new run that fails the same way leaves no config.json to block the corrected rerun
    fresh = tmp_path / "fresh"
    with pytest.raises(ConfigError, match=message):
        run_mod.set_up(load_config(None, TOY + [override, f"out={fresh}"]))
    assert not fresh.exists()


def test_resume_records_the_runs_own_folder_not_a_stray_out(finished_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    cfg = load_config(None, TOY + [f"out={tmp_path / 'other'}", "overwrite=true"],
                      base=json.loads((out / "config.json").read_text()))
    cfg = cfg.model_copy(update={"resume": str(out)})
    cfg, _, got = run_mod.set_up(cfg)
    saved = json.loads((out / "config.json").read_text())
    assert got == out and saved["out"] == str(out) and saved["overwrite"] is False
    assert not (tmp_path / "other").exists()


class _FlakyResetEnv:
    """Resets raise on one seed in 50; the others give a one-message task."""

    def __new__(cls, bad_obs: bool = False):
        from agentrl.env.base import TextEnv

        class Env(TextEnv):
            def reset(self, *, seed=None, options=None):
                super().reset(seed=seed)
                if bad_obs:
                    return "a string, not messages", {}
                if seed is not None and seed % 50 == 7:
                    raise RuntimeError("flaky reset")
                return [{"role": "user", "content": f"say {seed % 10}"}], {"task_id": str(seed)}

            def step(self, action):
                return [], 0.0, True, False, {}

        return Env()


def test_embedded_model_survives_resets_that_raise_and_names_a_malformed_observation(tmp_path):
    from agentrl.env.registry import register_env
    from agentrl.run import default_model_dir

    register_env("agentrl-test/FlakyReset-v0", _FlakyResetEnv, short_name="test_flaky_reset")
    cfg = load_config(None, ["env.name=test_flaky_reset", "sft.steps=0"])
    path = default_model_dir(cfg, tmp_path / "a")
    assert (tmp_path / "a" / "base_model" / "config.json").is_file() and path.endswith("base_model")
    register_env("agentrl-test/BadObs-v0", _FlakyResetEnv, short_name="test_bad_obs",
                 kwargs={"bad_obs": True})
    cfg = load_config(None, ["env.name=test_bad_obs", "sft.steps=0"])
    with pytest.raises(ConfigError, match=r"env test_bad_obs: reset\(seed=500000\) returned str "
                                          r"'a string, not messages', not a list of chat messages"):
        default_model_dir(cfg, tmp_path / "b")


@pytest.mark.parametrize("model_path", [None, "tiny"])
def test_text_policy_on_an_image_env_is_a_start_up_config_error(tmp_path, tiny_model_dir, model_path):
    """The embedded text default (model.vision=false given: unset, an image env gets the
    embedded VLM, agentrl.run), or a text-only model.path, on visual_count: exit 2
    naming the env and model.vision=true, before OUT is written (was an ImageObservationError
    traceback from the first rollout)."""
    from typer.testing import CliRunner

    from agentrl.cli import app

    out = tmp_path / "run"
    extra = [f"model.path={tiny_model_dir}"] if model_path else ["model.vision=false"]
    r = CliRunner().invoke(app, ["train", "--env", "visual_count", "--steps", "1", "--out", str(out),
                                 "sft.steps=0", *extra])
    flat = " ".join(r.output.split())
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert "model.vision: env visual_count sends image observations" in flat
    assert "set model.vision=true" in flat and ("text-only" in flat if model_path else "embedded default" in flat)
    assert not out.exists()


def test_resume_with_fewer_steps_than_done_is_refused_and_the_run_config_kept(tiny_model_dir, tmp_path):
    """A run at step 2 resumed with train.steps=1 said 'nothing to do' but rewrote config.json's
    train.steps to 1 (a later plain --resume then believed the run had 1 step): refused now,
    naming the run's step, and config.json is the run's."""
    out = tmp_path / "run"
    train_mod.train(load_config(None, TOY + ["train.steps=2", f"model.path={tiny_model_dir}", f"out={out}"]))
    before = (out / "config.json").read_text()
    cfg = load_config(None, ["train.steps=1"], base=json.loads(before)).model_copy(update={"resume": str(out)})
    with pytest.raises(startup.ResumeError, match=r"the run is at step 2, past train.steps=1; give --steps 2"):
        train_mod.train(cfg)
    assert (out / "config.json").read_text() == before
    assert json.loads(before)["train"]["steps"] == 2


def test_model_vision_with_a_text_model_path_is_refused_at_start_up(tiny_model_dir, tmp_path):
    """model.vision=true beside model.path=<a text-only model> crashed at the first warm-start
    rollout with ImageObservationError (the image check trusted model.vision); now refused at
    start-up naming both keys, nothing written."""
    from typer.testing import CliRunner

    from agentrl.cli import app

    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["train", "--env", "visual_count", "--steps", "1", "--out", str(out),
                                 f"model.path={tiny_model_dir}", "model.vision=true", "sft.steps=2"])
    flat = " ".join(r.output.split())
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert f"model.vision=true with model.path={tiny_model_dir}, a text-only model" in flat, flat
    assert not out.exists()


def test_resume_refuses_a_hand_edited_config_json(finished_run, tmp_path):
    """A new user edited OUT/config.json (group size and learning rate) and resumed: the group
    size took effect, the learning rate did not (the optimizer's state holds it), and nothing
    said so. Now the resumed run keeps its checkpoint's settings (`run_config.json`, sealed in
    the manifest): an edit of config.json is refused in one line naming each key with both
    values, unless the command line gives that key; the run folder is left as it was."""
    from typer.testing import CliRunner

    from agentrl.cli import app

    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    ck = json.loads((out / "checkpoints" / "step_1" / "run_config.json").read_text())
    assert ck == json.loads((out / "config.json").read_text())
    original = (out / "config.json").read_text()
    edited = json.loads(original)
    edited["algo"]["group_size"], edited["train"]["lr"] = 4, 0.001
    (out / "config.json").write_text(json.dumps(edited, indent=1))

    def resume(*args):
        r = CliRunner().invoke(app, ["train", "--resume", str(out), *args])
        return r.exit_code, " ".join(r.output.split())

    code, text = resume()
    assert code == 2 and "config.json was edited after step_1 was saved: algo.group_size=4 (checkpoint: 2), " \
        f"train.lr=0.001 (checkpoint: {ck['train']['lr']})" in text, text
    assert "undo the edit" in text and "Traceback" not in text
    code, text = resume("algo.group_size=4")  # given on the command line: only the lr is refused
    assert code == 2 and "train.lr=0.001" in text and "group_size" not in text, text
    code, text = resume("algo.group_size=4", "train.lr=0.001")  # the optimizer's state holds the lr
    assert code == 2 and f"a resumed run keeps its checkpoint's train.lr={ck['train']['lr']}" in text, text
    assert json.loads((out / "config.json").read_text()) == edited  # nothing written
    (out / "config.json").write_text(original)
    code, text = resume()  # as the run wrote it: resumes (the run had finished: nothing to do)
    assert code == 0 and "nothing to do" in text, text


def _task(i: int) -> dict:
    if i == 0:  # `return True` passes it: left out of training by the trivial-task guard
        return {"task_id": "custom/t0", "prompt": "Write always(x) returning True.", "entry_point": "always",
                "tests": ["assert always(1) == True", "assert always(5) == True"],
                "solution": "def always(x):\n    return True\n"}
    return {"task_id": f"custom/t{i}", "prompt": f"Write f{i}(x) returning 2 * x + {i}.", "entry_point": f"f{i}",
            "tests": [f"assert f{i}(1) == {2 + i}", f"assert f{i}(3) == {6 + i}"],
            "solution": f"def f{i}(x):\n    return 2 * x + {i}\n"}


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap missing")
def test_start_up_and_eval_lines_count_the_tasks_there_are(tmp_path, tiny_model_dir, monkeypatch):
    """A run on an 8-task file (held out at 0.4: custom/t1, t2, t6) with the default
    `train.eval_tasks` (256): the `[eval]` lines count the 3 held-out tasks evaluated (they
    said 256), and the `[run]` line counts what the trivial-task guard dropped."""
    import io

    from rich.console import Console

    monkeypatch.setenv("AGENTRL_CACHE_DIR", str(tmp_path / "cache"))
    data = tmp_path / "eight.jsonl"
    data.write_text("\n".join(json.dumps(_task(i)) for i in range(8)) + "\n")
    cfg = load_config(None, ["env.name=code_sandbox", f"env.dataset={data}", "env.kwargs.heldout_fraction=0.4",
                             "sft.steps=0", "rollout.tasks_per_step=2", "algo.group_size=2", "train.steps=1",
                             "train.eval_samples=1", "rollout.max_tokens=8", "log.tensorboard=false",
                             f"model.path={tiny_model_dir}", f"out={tmp_path / 'run'}"])
    assert cfg.train.eval_tasks == 256
    buf = io.StringIO()
    train_mod.train(cfg, console=Console(file=buf, width=400, color_system=None))
    text = buf.getvalue()
    run_line = next(ln for ln in text.splitlines() if ln.startswith("[run] "))
    assert run_line.endswith("; trivial: 1 of 5 train tasks dropped, 0 of 3 heldout tasks flagged"), run_line
    assert "[eval] held-out: 3 tasks x 1 samples" in text, text
    assert "[eval] held-out (T=1.0, 3 tasks x 1, ± standard error)" in text, text
    assert "256 tasks" not in text


def test_a_run_folder_as_model_path_or_doctor_model_uses_its_newest_checkpoint(finished_run, tmp_path):
    """`model.path=OUT` / `agentrl doctor --model OUT` on a training run's folder take its newest
    intact checkpoint, as `agentrl serve` / `eval` do, and say which (doctor said "no tokenizer";
    train refused it as a folder without weights); a run folder that cannot be used is one line
    before the new OUT is written: no intact checkpoint, or the new run's --overwrite would
    remove it."""
    from typer.testing import CliRunner

    from agentrl.cli import app

    ck = finished_run / "checkpoints" / "step_1"
    runner = CliRunner()
    res = runner.invoke(app, ["doctor", "--model", str(finished_run)], env={"COLUMNS": "80"})
    lines = res.output.splitlines()
    assert res.exit_code == 0, res.output
    assert lines[0] == f"{finished_run} is a training run's folder: its newest checkpoint {ck}", res.output
    assert lines[1].startswith(f"model: {ck} (") and lines[-1].endswith(": ok"), res.output
    from agentrl.gateway.serve import start

    served = start(finished_run, port=0)  # `agentrl serve` names the checkpoint it serves
    served.close()
    assert served.model_dir == str(ck)
    new = tmp_path / "new"
    res = runner.invoke(app, ["train", *TOY, f"model.path={finished_run}", f"out={new}"], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    assert f"model.path {finished_run} is a run folder: its newest checkpoint {ck}" in " ".join(res.output.split())
    assert json.loads((new / "config.json").read_text())["model"]["path"] == str(ck)  # recorded: which one
    # one without an intact checkpoint (its manifest fails): one line, nothing written
    broken = tmp_path / "broken"
    shutil.copytree(finished_run, broken)
    (broken / "checkpoints" / "step_1" / "manifest.json").write_text("{}")
    for args in (["train", *TOY, f"model.path={broken}", f"out={tmp_path / 'b'}"], ["doctor", "--model", str(broken)]):
        res = runner.invoke(app, args, env={"COLUMNS": "80"})
        assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
        assert f"{broken} is a training run's folder with no intact checkpoint" in res.output, res.output
    assert not (tmp_path / "b").exists()
    # the run folder given as both model.path and an --overwrite'n --out: refused, the run kept
    before = sorted(p.relative_to(new).as_posix() for p in new.rglob("*"))
    res = runner.invoke(app, ["train", *TOY, f"model.path={new}", f"out={new}", "--overwrite"], env={"COLUMNS": "80"})
    assert res.exit_code == 2 and res.output.startswith("config error: model.path: ") and \
        "inside --out" in res.output, res.output
    assert sorted(p.relative_to(new).as_posix() for p in new.rglob("*")) == before


def test_an_offline_stage_s_folder_as_model_names_its_model(tmp_path):
    """`agentrl sft --out OUT` (and offline DPO) write the model to OUT/model, without
    checkpoints: `model.path=OUT` / `doctor --model OUT` / `eval` / `serve` said "holds no
    weights (an interrupted copy?)", "no tokenizer" and "neither a Hugging Face model directory
    nor a training output dir"; now one line naming OUT/model, nothing written."""
    from typer.testing import CliRunner

    from agentrl.cli import app
    from agentrl.eval.cli import resolve_model

    out = tmp_path / "sft_out"  # what `agentrl sft` leaves (offline.py's `_finish`)
    (out / "model").mkdir(parents=True)
    (out / "config.json").write_text(json.dumps({"model": {"path": None}}))
    (out / "summary.json").write_text(json.dumps({"stage": "sft"}))
    (out / "model" / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    line = (f"{out} is the output folder of an offline stage (agentrl sft or offline DPO), not a model: "
            f"its model is {out / 'model'}; give that")
    runner = CliRunner()
    res = runner.invoke(app, ["doctor", "--model", str(out)], env={"COLUMNS": "200"})
    assert (res.exit_code, res.output.strip()) == (2, f"--model {line}"), res.output
    res = runner.invoke(app, ["train", *TOY, f"model.path={out}", f"out={tmp_path / 'new'}"], env={"COLUMNS": "200"})
    assert (res.exit_code, res.output.strip()) == (2, f"config error: model.path: {line}"), res.output
    assert not (tmp_path / "new").exists()
    with pytest.raises(FileNotFoundError) as e:  # `agentrl eval` / `agentrl serve`
        resolve_model(str(out))
    assert str(e.value) == f"model: {line}"


def test_more_worker_cpus_than_the_local_cluster_has_is_refused_before_out_is_written(tmp_path):
    """3 rollout workers at 1 CPU on a 2-CPU machine hung at start-up without a word (Ray waits
    for CPUs no node has); now one line names the keys before OUT is written."""
    cpus = startup.local_cluster_cpus()
    n = int(cpus) + 1
    out = tmp_path / "r"
    cfg = load_config(None, TOY + [f"rollout.num_workers={n}", f"out={out}"])
    with pytest.raises(ConfigError, match=rf"^config error: rollout.num_workers={n} x rollout.worker_cpus=1 "
                                          rf"reserve {n} CPUs but the local Ray cluster has {cpus:g} "):
        run_mod.set_up(cfg)
    assert not out.exists()
    learners = load_config(None, TOY + ["rollout.num_workers=1", f"train.learner_workers={n}",
                                        f"out={out}"])
    with pytest.raises(ConfigError, match=rf"rollout.num_workers=1 x .* \+ train.learner_workers={n} x "
                                          rf"train.learner_cpus=1 reserve {n + 1} CPUs"):
        startup.check_local_cluster_fits(learners)
    fits = load_config(None, TOY + [f"rollout.num_workers={n}", f"rollout.worker_cpus={cpus / n}"])
    startup.check_local_cluster_fits(fits)  # fractions fit
    joined = load_config(None, TOY + [f"rollout.num_workers={n}", "rollout.ray_address=auto"])
    startup.check_local_cluster_fits(joined)  # a joined cluster may grow: not checked


def test_gpus_no_node_has_and_placement_workers_are_refused_before_out_is_written(tmp_path):
    """A rollout worker reserving a GPU on a machine without one (or more GPUs than the local
    cluster has), and the reference / teacher / reward-model workers' reservations, count like
    the rollout workers' CPUs: one line naming every key that reserves some."""
    from agentrl.config import Config

    out = tmp_path / "r"
    gpus = startup.local_cluster_gpus()
    n = int(gpus) + 1
    cfg = load_config(None, TOY + ["rollout.num_workers=1", f"rollout.worker_gpus={n}", f"out={out}"])
    with pytest.raises(ConfigError, match=rf"^config error: rollout.num_workers=1 x rollout.worker_gpus={n} "
                                          rf"reserve {n} GPUs but the local Ray cluster has {gpus:g} "
                                          r"\(Ray would wait for them forever\): set them to 0"):
        run_mod.set_up(cfg)
    assert not out.exists()
    # the reference worker counts when the algorithm needs a reference (grpo with a KL term)
    ref = Config.model_validate({"algo": {"name": "grpo", "kl_coef": 0.1}, "rollout": {"num_workers": 1},
                                 "placement": {"reference": "worker", "reference_cpus": 1.5}})
    with pytest.raises(ConfigError, match=r"rollout.num_workers=1 x rollout.worker_cpus=1 \+ "
                                          r"placement.reference_cpus=1.5 reserve 2.5 CPUs but the local "
                                          r"Ray cluster has 2 "):
        startup.check_local_cluster_fits(ref, cpus=2.0, gpus=0.0)
    no_kl = ref.model_copy(update={"algo": ref.algo.model_copy(update={"kl_coef": 0.0})})
    startup.check_local_cluster_fits(no_kl, cpus=2.0, gpus=0.0)  # no reference: no worker
    with pytest.raises(ConfigError, match=r"placement.reference_gpus=0.5 reserve 0.5 GPUs but the local Ray "
                                          r"cluster has 0 "):
        startup.check_local_cluster_fits(
            ref.model_copy(update={"placement": ref.placement.model_copy(update={"reference_gpus": 0.5})}),
            cpus=4.0, gpus=0.0)
    startup.check_local_cluster_fits(ref, cpus=4.0, gpus=0.0)  # fits
    fits = load_config(None, TOY + ["rollout.num_workers=2", "rollout.worker_cpus=0.5", "rollout.worker_gpus=0.5"])
    startup.check_local_cluster_fits(fits, cpus=2.0, gpus=1.0)  # fractions of one GPU fit
    joined = load_config(None, TOY + ["rollout.num_workers=1", "rollout.worker_gpus=1", "rollout.ray_address=auto"])
    startup.check_local_cluster_fits(joined, cpus=2.0, gpus=0.0)  # a joined cluster may grow: not checked


RAY_CPUS = """
import sys, ray
from agentrl.config import ConfigError, load_config
from agentrl.startup import check_local_cluster_fits
ray.init(address="local", num_cpus=1, num_gpus=0, include_dashboard=False, log_to_driver=False)
check_local_cluster_fits(load_config(None, ["rollout.num_workers=1"]))
try:
    check_local_cluster_fits(load_config(None, ["rollout.num_workers=2"]))
except ConfigError as e:
    print(e)
try:
    check_local_cluster_fits(load_config(None, ["rollout.num_workers=1", "rollout.worker_cpus=0.5",
                                                "rollout.worker_gpus=1"]))
except ConfigError as e:
    print(e)
"""


@pytest.mark.slow
def test_the_cluster_check_reads_a_running_local_clusters_cpus(tmp_path):
    """With Ray already up in the process (a test's `ray.init(num_cpus=1)`), its CPUs and GPUs
    count, not the machine's."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", RAY_CPUS], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "rollout.num_workers=2 x rollout.worker_cpus=1 reserve 2 CPUs but the local Ray cluster has 1 " \
        in done.stdout
    assert "rollout.num_workers=1 x rollout.worker_gpus=1 reserve 1 GPUs but the local Ray cluster has 0 " \
        in done.stdout  # ray.init(num_gpus=0)
