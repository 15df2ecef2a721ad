"""A start-up warning when the env's opening prompt leaves the first turn less than
`rollout.max_tokens` of `rollout.max_episode_tokens` (web_qa's prompt with a user's tokenizer
took ~920 of 1024 tokens and episodes were truncated after one turn, with nothing said)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from agentrl.config import load_config
from agentrl.infra.runfolder import unlock_run
from agentrl.log.progress import Reporter
from agentrl.models.families import FAMILIES, build_family, build_family_tokenizer
from agentrl.rollout.chat import ChatRenderer
from agentrl.rollout.envs import build_env
from agentrl.run import build
from agentrl.startup_model import first_turn_room_warning


@pytest.fixture(scope="module")
def opening():
    """The web_qa opening prompt's length with the mistral family's tokenizer (tools in the
    system message, as the env sends them), measured independently of the function."""
    tok = build_family_tokenizer(FAMILIES["mistral_v0_3"])
    r = ChatRenderer(tok)
    cfg = load_config(None, ["env.name=web_qa", "seed=3"])
    env = build_env(cfg, "train")
    obs, info = env.reset(seed=3)
    text = tok.apply_chat_template(obs, tools=info.get("tools"), tokenize=False, add_generation_prompt=True)
    n = len(tok.encode(text, add_special_tokens=False))
    assert n == len(r.prompt_ids(obs, tools=info.get("tools")))
    env.close()
    assert n > 300  # the system prompt holds the tool schemas
    return r, n


def _cfg(*over):
    return load_config(None, ["env.name=web_qa", "seed=3", *over])


def test_warning_names_the_numbers_and_the_key(opening):
    r, n = opening
    cfg = _cfg("rollout.max_tokens=96", f"rollout.max_episode_tokens={n + 40}")
    env = build_env(cfg, "train")
    assert first_turn_room_warning(cfg, env, r) == (
        f"[warning] env web_qa: the opening prompt (seed 3) takes {n} of rollout.max_episode_tokens="
        f"{n + 40} tokens, leaving 40 for the first turn, less than rollout.max_tokens=96: episodes are "
        f"truncated after their first turn; raise rollout.max_episode_tokens (to at least {n + 96})")
    full = _cfg("rollout.max_tokens=96", f"rollout.max_episode_tokens={n}")
    assert "leaving no room for a turn: episodes end before they are sampled" in first_turn_room_warning(full, env, r)
    # exactly room for one full turn, or more: nothing to say
    assert first_turn_room_warning(_cfg("rollout.max_tokens=96", f"rollout.max_episode_tokens={n + 96}"), env, r) is None
    assert first_turn_room_warning(_cfg("rollout.max_tokens=96", "rollout.max_episode_tokens=8192"), env, r) is None
    env.close()


def test_train_start_up_prints_it(opening, tmp_path):
    """`agentrl train`'s build says the line (a warning: the run goes on)."""
    _, n = opening
    model = tmp_path / "mistral"
    build_family("mistral_v0_3", model, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    buf = io.StringIO()
    rep = Reporter(Console(file=buf, width=400), enabled=True)
    cfg = _cfg(f"model.path={model}", "sft.steps=0", f"out={tmp_path / 'run'}", "rollout.max_tokens=64",
               f"rollout.max_episode_tokens={n + 10}", "rollout.tasks_per_step=1", "algo.group_size=2",
               "train.steps=1")
    run = build(cfg, reporter=rep)
    try:
        # the run's own env (its tool format resolved from the tokenizer: mistral) and renderer
        env = run.new_env("train")
        obs, info = env.reset(seed=3)
        m = len(run.renderer.prompt_ids(obs, tools=info.get("tools")))
        env.close()
        assert m > n + 10  # the mistral tool format's system prompt is longer than hermes'
        [line] = [x for x in buf.getvalue().splitlines() if x.startswith("[warning] env web_qa")]
        assert line == (f"[warning] env web_qa: the opening prompt (seed 3) takes {m} of rollout.max_episode_tokens="
                        f"{n + 10} tokens, leaving no room for a turn: episodes end before they are sampled; "
                        f"raise rollout.max_episode_tokens (to at least {m + 64})")
    finally:
        run.pool.shutdown()
        unlock_run(run.out)
