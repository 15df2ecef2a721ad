"""A run folder handed over by someone else (issue 42, items 1, 2, 5, 6), each attack tried:
a pickle payload in trainer_state.pt / algo_state.pt / DCP metadata never runs, a checkpoint is
intact only with a manifest listing every file (a removed manifest, `{}`, a truncated
model.safetensors under a rewritten manifest, a negative step: skipped, the older one resumed,
saying so), two processes never share a run folder (a real second process holds the lock), and
nothing is written or deleted through a symbolic link. Real runs (toy env), real files."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import agentrl.train as train_mod
from agentrl.config import load_config
from agentrl.infra.runfolder import LOCK_NAME
from agentrl.learner.checkpoints import (
    MANIFEST,
    check_dcp_metadata,
    check_run_state,
    intact,
    latest_checkpoint,
    read_state,
)
from agentrl.log.summary import read_metrics
from agentrl.startup import OutError

ARGS = ["env.name=toy", "sft.steps=0", "rollout.tasks_per_step=2", "algo.group_size=2",
        "train.eval_tasks=2", "train.eval_samples=1", "rollout.max_tokens=16",
        "env.kwargs={words: [x, the, def, return]}", "quiet=true"]


def _cfg(tiny_model_dir, out, *extra):
    return load_config(None, ARGS + [f"model.path={tiny_model_dir}", f"out={out}", *extra])


@pytest.fixture(scope="module")
def run2(tmp_path_factory, tiny_model_dir) -> Path:
    """2 steps, a checkpoint after each."""
    out = tmp_path_factory.mktemp("attack") / "R"
    train_mod.train(_cfg(tiny_model_dir, out, "train.steps=2", "train.save_every=1", "train.keep_checkpoints=0"))
    return out


def _copy(run2: Path, dst: Path) -> Path:
    shutil.copytree(run2, dst, symlinks=True)
    return dst


def _reseal(ck: Path) -> None:
    """What an attacker does after editing a file: a manifest that matches again."""
    files = sorted(p for p in ck.rglob("*") if p.is_file() and p.name != MANIFEST)
    (ck / MANIFEST).write_text(json.dumps({str(p.relative_to(ck)): {
        "sha256": hashlib.sha256(p.read_bytes()).hexdigest(), "bytes": p.stat().st_size} for p in files}))


class _Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _resume(tiny_model_dir, out, capsys_or_buf=None, steps=2):
    import io

    from rich.console import Console

    buf = io.StringIO()
    train_mod.train(_cfg(tiny_model_dir, out, f"train.steps={steps}", f"resume={out}"),
                    console=Console(file=buf, width=400, color_system=None))
    return buf.getvalue()


@pytest.mark.parametrize("name", ["trainer_state.pt", "algo_state.pt"])
def test_a_pickle_payload_in_a_checkpoint_never_runs(run2, tmp_path, tiny_model_dir, name):
    marker = tmp_path / "PWNED"
    payload = tmp_path / "payload.pt"
    torch.save({"optimizer": _Payload(marker)}, payload)
    torch.load(payload, weights_only=False)  # the control: the old loader runs it
    assert marker.exists()
    marker.unlink()
    out = _copy(run2, tmp_path / "R")
    ck2 = out / "checkpoints/step_2"
    shutil.copy(payload, ck2 / name)
    _reseal(ck2)  # the manifest matches: only loading can tell
    with pytest.raises(ValueError, match="not loadable as tensors"):
        read_state(ck2, name)
    assert "cannot be loaded" in intact(ck2)
    (out / "summary.json").unlink()
    text = _resume(tiny_model_dir, out)
    assert not marker.exists()
    assert f"skipping {ck2}" in text and f"from {out / 'checkpoints/step_1'} at step 1" in text


def test_dcp_metadata_allows_its_own_classes_only(tmp_path):
    import pickle

    import torch.distributed.checkpoint as dcp

    dcp.save({"w": torch.randn(3, 4), "b": torch.zeros(2, dtype=torch.bfloat16),
              "opt": {"step": torch.tensor(3.0), "betas": (0.9, 0.99), "n": 5}},
             checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
    check_dcp_metadata(tmp_path / "dcp/.metadata")  # a real one reads
    marker = tmp_path / "PWNED"
    (tmp_path / "evil").write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(pickle.UnpicklingError, match="not allowed"):
        check_dcp_metadata(tmp_path / "evil")
    assert not marker.exists()


def test_a_checkpoint_is_intact_only_with_a_full_manifest(run2, tmp_path):
    out = _copy(run2, tmp_path / "M")
    ck2, ck1 = out / "checkpoints/step_2", out / "checkpoints/step_1"
    assert intact(ck2) is None
    w = ck2 / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-100] ^= 0xFF
    w.write_bytes(bytes(data))
    (ck2 / MANIFEST).unlink()  # a flipped byte with the manifest removed
    assert "no manifest.json" in intact(ck2)
    (ck2 / MANIFEST).write_text("{}")
    assert "lists no files" in intact(ck2)
    _reseal(ck2)
    (ck2 / "extra.bin").write_bytes(b"x")  # a file the manifest does not list
    assert "extra.bin is not in manifest.json" in intact(ck2)
    (ck2 / "extra.bin").unlink()
    w.write_bytes(w.read_bytes()[:1000])  # truncated weights under a matching manifest
    _reseal(ck2)
    assert "cannot be loaded" in intact(ck2)
    skipped = []
    assert latest_checkpoint(out, on_skip=lambda p, why: skipped.append(p)) == ck1 and skipped == [ck2]


def test_eval_of_a_run_names_the_checkpoint_it_skips(run2, tmp_path, capsys):
    from agentrl.eval.cli import resolve_model

    out = _copy(run2, tmp_path / "E")
    ck2 = out / "checkpoints/step_2"
    (ck2 / MANIFEST).unlink()
    assert resolve_model(str(out))[0] == out / "checkpoints/step_1"
    assert f"[eval] skipping {ck2}: no manifest.json" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="not an intact checkpoint"):
        resolve_model(str(ck2))


@pytest.mark.parametrize("bad", [-3, 1.5, "2", True, None])
def test_a_step_that_is_not_a_non_negative_integer_is_refused(bad):
    with pytest.raises(ValueError, match="step must be an integer >= 0"):
        check_run_state({"step": bad, "policy_version": 0}, "agentrl_state.json")


def test_a_negative_step_never_truncates_the_metrics(run2, tmp_path, tiny_model_dir):
    out = _copy(run2, tmp_path / "N")
    ck2 = out / "checkpoints/step_2"
    st = json.loads((ck2 / "agentrl_state.json").read_text())
    (ck2 / "agentrl_state.json").write_text(json.dumps({**st, "step": -3}))
    _reseal(ck2)
    assert "step must be an integer >= 0" in intact(ck2)
    (out / "summary.json").unlink()
    text = _resume(tiny_model_dir, out)
    assert f"skipping {ck2}" in text and "at step 1" in text
    assert [r["step"] for r in read_metrics(out) if "rollout/reward_mean" in r] == [1, 2]


# -- symbolic links --------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["summary.json", "metrics.jsonl"])
def test_resume_never_writes_through_a_link(run2, tmp_path, tiny_model_dir, name):
    out = _copy(run2, tmp_path / "L")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (out / name).unlink()
    (out / name).symlink_to(victim)
    with pytest.raises(OutError, match=f"{name} is a symbolic link"):
        _resume(tiny_model_dir, out, steps=3)
    assert victim.read_text() == "precious"


def test_overwrite_with_a_linked_eval_folder_deletes_nothing(run2, tmp_path, tiny_model_dir):
    out = _copy(run2, tmp_path / "O")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    shutil.rmtree(out / "eval", ignore_errors=True)
    (out / "eval").symlink_to(outside, target_is_directory=True)
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(OutError, match="eval is a symbolic link"):
        train_mod.train(_cfg(tiny_model_dir, out, "train.steps=1", "overwrite=true"))
    assert sorted(p.name for p in out.iterdir()) == before  # checked before anything is removed
    assert (outside / "keep.txt").read_text() == "mine" and (out / "config.json").exists()
    (out / "checkpoints/step_2").rename(tmp_path / "s2")  # a linked checkpoint is not one
    (out / "checkpoints/step_2").symlink_to(tmp_path / "s2", target_is_directory=True)
    assert latest_checkpoint(out) == out / "checkpoints/step_1"


# -- one process per run folder ----------------------------------------------------------------
def test_a_second_process_never_shares_a_run_folder(run2, tmp_path, tiny_model_dir):
    """A real training process holds OUT; a --resume of it and a new --overwrite run into it
    are refused naming its pid (nothing removed); once it is killed (SIGKILL: no clean-up) its
    stale lock file does not block a resume."""
    from typer.testing import CliRunner

    from agentrl.cli import app

    out = tmp_path / "K"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "agentrl.cli", "train", *ARGS, "train.steps=400", "train.save_every=1",
           f"model.path={tiny_model_dir}", f"out={out}"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while latest_checkpoint(out) is None:
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert (out / LOCK_NAME).read_text().strip() == str(proc.pid)
        for args in (["train", "--resume", str(out), "-q"],
                     ["train", "--env", "toy", "--out", str(out), "--overwrite", "-q"]):
            r = CliRunner().invoke(app, args)
            text = " ".join(r.output.split())
            assert r.exit_code == 2 and f"in use by another agentrl process (pid {proc.pid})" in text, text
        assert (out / "config.json").exists() and (out / "checkpoints").is_dir()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    done = json.loads((latest_checkpoint(out) / "agentrl_state.json").read_text())["step"]
    text = _resume(tiny_model_dir, out, steps=done + 1)
    assert f"at step {done}" in text
    assert (out / "summary.json").exists()


# -- isolation on resume ------------------------------------------------------------------------
def test_resume_never_lowers_isolation_from_an_edited_config_json(tmp_path):
    """Issue 42 item 16: config.json edited to env.kwargs.backend: subprocess does not make
    `--resume` run code unisolated: refused naming the key, unless the command line asks
    (an override or its -c file); the check runs before anything is built or written."""
    from typer.testing import CliRunner

    from agentrl.cli import app

    out = tmp_path / "iso"
    out.mkdir()
    saved = json.loads(load_config(None, ["env.name=code_sandbox", "env.kwargs={backend: bwrap}",
                                          f"out={out}"]).model_dump_json())
    saved["env"]["kwargs"]["backend"] = "subprocess"  # the edit
    (out / "config.json").write_text(json.dumps(saved))
    before = sorted(p.name for p in out.iterdir())

    def run(*extra):
        r = CliRunner().invoke(app, ["train", "--resume", str(out), "-q", *extra])
        return r.exit_code, " ".join(r.output.split())

    code, text = run()
    assert code == 2 and "sets env.kwargs.backend=subprocess" in text and "add env.kwargs.backend=subprocess" in text
    assert sorted(p.name for p in out.iterdir()) == before
    (tmp_path / "ask.yaml").write_text("env: {kwargs: {backend: subprocess}}\n")
    for asked in (["env.kwargs.backend=subprocess"], ["-c", str(tmp_path / "ask.yaml")]):
        code, text = run(*asked)  # asked for: past the isolation check (then: no checkpoint here)
        assert code == 2 and "no intact checkpoint" in text and "subprocess" not in text, text
