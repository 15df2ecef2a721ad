"""Config: defaults <- YAML <- key=value; errors name the key and the allowed values."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agentrl.cli import config_reference
from agentrl.config import ConfigError, load_config


def test_overrides_and_yaml(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("train:\n  lr: 0.5\nalgo:\n  group_size: 3\n")
    cfg = load_config(y, ["train.lr=1e-4", "algo.tis_cap=null", "env.kwargs.reward=fraction"])
    assert cfg.train.lr == 1e-4 and cfg.algo.group_size == 3 and cfg.algo.tis_cap is None
    assert cfg.env.kwargs == {"reward": "fraction"}


@pytest.mark.parametrize("override, needle", [
    ("train.lrr=1", "train.lrr: unknown key; allowed here: steps, lr"),
    ("rollout.engine=foo", "rollout.engine: Input should be 'hf' or 'vllm'"),
    ("algo.name=foo", "allowed: grpo, dr_grpo, gspo, rloo, reinforce_pp, ppo, dpo"),
    ("algo.group_size=zero", "algo.group_size"),
    ("algo.group_size=0", "algo.group_size: Input should be greater than or equal to 1"),
    ("nosection.x=1", "nosection: unknown key"),
    ("train.lr", "must be key=value"),
    ("train.lr=inf", "train.lr: Input should be a finite number"),
    ("sft.lr=.nan", "sft.lr: Input should be a finite number"),
    ("rollout.temperature=inf", "rollout.temperature: Input should be a finite number"),
    ("model.init_std=inf", "model.init_std: Input should be a finite number"),
    ("model.init_std=1e6", "model.init_std: Input should be less than or equal to 1"),
])
def test_errors_name_the_key(override, needle):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert needle in str(e.value)


def test_missing_yaml_file():
    with pytest.raises(ConfigError, match="not found"):
        load_config("/nonexistent.yaml")


def test_shipped_configs_are_valid():
    from pathlib import Path

    files = sorted(Path(__file__).parent.parent.joinpath("configs").glob("*.yaml"))
    assert files, "configs/ must ship at least one YAML file"
    for f in files:
        load_config(f)


def test_reference_documents_every_field():
    ref = config_reference()
    for key in ("train.lr", "algo.clip_high", "rollout.temperature", "model.path", "env.name"):
        assert f"`{key}`" in ref
    assert "| `train.lr` | `0.0002` |" in ref or "`train.lr`" in ref


def test_cli_rejects_bad_config_fast():
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "train", "train.bogus=1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "train.bogus: unknown key" in r.stdout + r.stderr


def test_docs_config_md_is_the_generated_reference():
    """docs/config.md is `agentrl config --reference`: regenerate it after changing a field
    (`agentrl config --reference > docs/config.md`)."""
    from pathlib import Path

    doc = Path(__file__).resolve().parent.parent / "docs" / "config.md"
    assert doc.read_text().strip() == config_reference().strip(), \
        "docs/config.md is stale: run `agentrl config --reference > docs/config.md`"


@pytest.mark.parametrize("spelling", ["None", "null", "~", ""])
def test_an_override_of_none_or_null_unsets_an_optional_key(spelling):
    cfg = load_config(None, ["algo.name=grpo", f"algo.tis_cap={spelling}", "algo.dual_clip=3"])
    assert cfg.algo.tis_cap is None and cfg.algo.dual_clip == 3.0
    assert load_config(None, [f"algo.dual_clip={spelling}"]).algo.dual_clip is None


def test_config_command_prints_the_algorithms_own_defaults_as_a_run_resolves_them():
    import yaml

    def show(*overrides):
        out = subprocess.run([sys.executable, "-m", "agentrl.cli", "config", *overrides],
                             capture_output=True, text=True, check=True).stdout
        return yaml.safe_load(out)["algo"]

    gspo = show("algo.name=gspo")
    assert (gspo["clip_low"], gspo["clip_high"]) == (3e-4, 4e-4)  # GSPO's sequence-level clips
    ppo = show("algo.name=ppo", "algo.minibatches=1")
    assert (ppo["update_epochs"], ppo["minibatches"]) == (2, 1)  # what was set is kept


def test_an_option_and_an_override_that_disagree_are_refused():
    """`--steps 3 train.steps=5`: the option silently won; now neither does."""
    names = {"train.steps": "--steps", "quiet": "--quiet"}
    with pytest.raises(ConfigError, match=r"^config error: train\.steps is set twice, to different values: "
                                          r"by --steps 3 and by the override train\.steps=5; give one of them$"):
        load_config(None, ["train.steps=5"], flag_names=names, **{"train.steps": 3})
    with pytest.raises(ConfigError, match=r"by --quiet and by the override quiet=false"):
        load_config(None, ["quiet=false"], flag_names=names, quiet=True)
    with pytest.raises(ConfigError, match=r"by the option for seed 1 and by the override seed=2"):
        load_config(None, ["seed=2"], seed=1)
    # the same value twice, an option not given, or a list written both ways: accepted
    assert load_config(None, ["train.steps=3"], flag_names=names, **{"train.steps": 3}).train.steps == 3
    assert load_config(None, ["train.steps=5"], **{"train.steps": None}).train.steps == 5
    assert load_config(None, ["env.wrappers=[safety]"], **{"env.wrappers": ["safety"]}).env.wrappers == ["safety"]
    # a resumed run's saved config and a YAML file are below the options, not in conflict
    assert load_config(None, None, base={"train": {"steps": 9}}, **{"train.steps": 3}).train.steps == 3


def test_cli_option_and_override_that_disagree_exit_2_naming_both(tmp_path):
    from typer.testing import CliRunner

    from agentrl.cli import app

    out = tmp_path / "run"
    for args in (["train", "--steps", "3", "train.steps=5", "--out", str(out)],
                 ["eval", "--model", "reference", "--seed", "1", "seed=2", "--out", str(out)]):
        r = CliRunner().invoke(app, args)
        flat = " ".join(r.output.split())
        assert r.exit_code == 2 and "is set twice, to different values" in flat, r.output
        assert ("--steps 3" in flat and "train.steps=5" in flat) or ("--seed 1" in flat and "seed=2" in flat)
    assert not out.exists()


def test_a_saved_config_json_of_before_the_algo_split_loads(tmp_path):
    """A run's config.json written before the per-algorithm configs holds every algorithm's
    `algo` keys; read as a file (`agentrl eval --model RUN`, `-c RUN/config.json`) it loads, the
    keys its algorithm lacks dropped, as `--resume` does. A YAML file is not a saved config: an
    inapplicable key there is still refused."""
    import json

    flat = {"name": "grpo", "group_size": 4, "clip_high": 0.3, "vf_coef": 0.5, "beta": 0.1,
            "distill_kl": "sampled", "lam": 0.95, "kl_target": 6.0, "turn_credit": "episode"}
    (tmp_path / "config.json").write_text(json.dumps({"algo": flat, "train": {"steps": 7}}))
    cfg = load_config(tmp_path / "config.json")
    assert (cfg.algo.name, cfg.algo.group_size, cfg.algo.clip_high, cfg.train.steps) == ("grpo", 4, 0.3, 7)
    assert not hasattr(cfg.algo, "vf_coef")
    ppo = load_config(tmp_path / "config.json", ["algo.name=ppo"])  # the override's algorithm decides
    assert (ppo.algo.name, ppo.algo.vf_coef) == ("ppo", 0.5)
    (tmp_path / "c.yaml").write_text("algo:\n  name: grpo\n  vf_coef: 0.5\n")
    with pytest.raises(ConfigError, match="algo.vf_coef"):
        load_config(tmp_path / "c.yaml")


def _alias_bomb() -> str:
    """A "billion laughs": 9 levels, each a list of 10 aliases of the level below."""
    lines = ["a0: &a0 [" + ", ".join(['"lol"'] * 10) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    return "\n".join(lines) + "\n"


def test_a_yaml_alias_bomb_is_refused_fast_in_a_file_and_an_override(tmp_path):
    """Issue 42 item 10. Level i stands for (10^(i+2) - 1) / 9 nodes (11, 111, ...); the
    mapping 1 + 9 keys + their sum: 1,234,567,909 nodes from under 600 bytes."""
    import time

    bomb = _alias_bomb()
    assert len(bomb) < 600
    f = tmp_path / "bomb.yaml"
    f.write_text(bomb)
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=f"{f}: the YAML expands to 1,234,567,909 nodes"):
        load_config(f)
    flow = "{" + ", ".join(bomb.strip().splitlines()) + "}"
    with pytest.raises(ConfigError, match="override env.kwargs: the YAML expands to 1,234,567,909 nodes"):
        load_config(None, [f"env.kwargs={flow}"])
    assert time.perf_counter() - t0 < 1.0
    from typer.testing import CliRunner

    from agentrl.cli import app

    r = CliRunner().invoke(app, ["train", "-c", str(f)])
    assert r.exit_code == 2 and "alias bomb" in r.output, r.output
    (tmp_path / "ok.yaml").write_text("env: {kwargs: {a: &x [1, 2], b: *x}}\n")  # aliases within the cap load
    assert load_config(tmp_path / "ok.yaml").env.kwargs == {"a": [1, 2], "b": [1, 2]}


def test_a_validators_message_comes_without_pydantics_prefix():
    """A section validator's refusal reads as its own sentence: no pydantic `Value error, ` and
    no `rollout: ` section before a message that names its keys itself."""
    with pytest.raises(ConfigError) as e:
        load_config(None, ["rollout.partial=true", "rollout.engine=vllm", "rollout.num_workers=2"])
    assert str(e.value).startswith("config error: rollout.partial=true needs rollout.mode=async")
    assert "Value error" not in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algo.group_size=4", "rollout.branch=3", "env.max_turns=3"])
    assert str(e.value).startswith("config error: rollout.branch=3 must divide algo.group_size")


def test_turn_advantages_with_template_history_is_refused():
    """Under rollout.history=template each turn is a sample with the episode's return: the per-turn
    groups would be the episode groups and algo.turn_advantages would silently do nothing."""
    with pytest.raises(ConfigError, match="algo.turn_advantages=true has no effect with rollout.history=template"):
        load_config(None, ["env.max_turns=3", "algo.turn_advantages=true", "rollout.history=template"])
    cfg = load_config(None, ["env.max_turns=3", "algo.turn_advantages=true"])  # exact history: kept
    assert cfg.algo.turn_advantages and cfg.rollout.history == "exact"
    assert load_config(None, ["env.max_turns=3", "rollout.history=template"]).rollout.history == "template"
