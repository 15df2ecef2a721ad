"""The start-up checks of the user's model directory and its tokenizer: the tokenizer loads and
fits the weights, its chat template renders episodes, the env's opening prompt leaves the first
turn room, the algorithm accepts the tokenizer. `agentrl.startup.preflight`, `agentrl.run.build`
and `agentrl eval` call them; each fails with a message naming the key to change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentrl.config import Config, ConfigError
from agentrl.models.tiny import tokenizer_overflow
from agentrl.rollout.agent_loop import call_with_timeout
from agentrl.rollout.chat import renderer_for
from agentrl.rollout.engines.make import load_processor


def check_tokenizer_fits(path: str) -> None:
    """Every id of model directory `path`'s tokenizer has an embedding row (config.json's
    `vocab_size` and the weights' rows, `weight_rows`; rows beyond the tokenizer are padding,
    accepted; the message is `agentrl.models.tiny.overflow_message`'s).

    Raises:
        ConfigError: a tokenizer that does not load (a truncated tokenizer.json: it was a
            traceback after OUT was written), or fewer rows than tokenizer ids (the run would
            fail on its first prompt with such an id, after OUT was written).
    """
    from transformers import AutoTokenizer  # deferred: heavy

    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - any loader failure: one line, before OUT
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise ConfigError(f"config error: model.path: {path}: the tokenizer does not load "
                          f"({type(e).__name__}: {first}); agentrl doctor --model {path}") from None
    problem = tokenizer_overflow(path, tok)  # the wording of doctor and load_model too
    if problem:
        raise ConfigError(f"config error: model.path: {problem}")


def check_chat_template(cfg: Config, path: str | Path, key: str = "model.path") -> None:
    """The policy's renderer builds from model directory `path`'s tokenizer (its image
    processor too, for a vision-language model), as `agentrl.run.policy_renderer` builds it
    once the run has started: a tokenizer without a chat template, or a template the renderer
    cannot use (no end of turn after an assistant message; a `rollout.chat_template_kwargs` it
    refuses), fails here, before OUT is written (it was a traceback from transformers after
    OUT/config.json was written). `key` names the setting in the message (`--model` for
    `agentrl eval`).

    Raises:
        ConfigError: naming `key`, the missing chat template (where to add one) or the
            renderer's error, and `agentrl doctor --model`.
    """
    try:
        tok = load_processor(path)
    except Exception as e:  # noqa: BLE001 - any loader failure: one line, before OUT
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise ConfigError(f"config error: {key}: {path}: the tokenizer does not load "
                          f"({type(e).__name__}: {first}); agentrl doctor --model {path}") from None
    if not getattr(tok, "chat_template", None):
        raise ConfigError(f"config error: {key}: {path}: the tokenizer has no chat template (agentrl "
                          "renders episodes with it): add the model's template as the `chat_template` "
                          f"key of {Path(path) / 'tokenizer_config.json'} or as a chat_template.jinja file "
                          "beside it (docs/models.md)")
    try:
        renderer_for(tok, cfg.rollout.history, cfg.rollout.chat_template_kwargs)
    except Exception as e:  # noqa: BLE001 - jinja errors, raise_exception, no end of turn
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise ConfigError(f"config error: {key}: {path}: its chat template cannot be used "
                          f"({type(e).__name__}: {first}); agentrl doctor --model {path}") from None


def first_turn_room_warning(cfg: Config, env: Any, renderer: Any) -> str | None:
    """A `[warning]` line when the env's opening prompt (reset with seed `cfg.seed`, rendered
    by the policy's `renderer` with the tools the reset names, as the agent loop renders it)
    leaves the first turn less than `rollout.max_tokens` of `rollout.max_episode_tokens`: such
    episodes are cut short (truncated after one turn, or never sampled) with nothing else said.
    None when there is room, or when the reset or the rendering fails (met again, and recorded,
    in the rollouts: contract 7). The env is reset once and not closed."""
    try:
        obs, info = call_with_timeout(lambda: env.reset(seed=cfg.seed), cfg.env.reset_timeout_s)
        n = len(renderer.prompt_ids(obs, tools=(info or {}).get("tools")))
    except Exception:  # noqa: BLE001 - the env's or the template's failure: the rollouts record it
        return None
    cap, turn = cfg.rollout.max_episode_tokens, cfg.rollout.max_tokens
    left = cap - n
    if left >= turn:
        return None
    what = (f"leaving {left} for the first turn, less than rollout.max_tokens={turn}: episodes are "
            "truncated after their first turn" if left > 0 else
            "leaving no room for a turn: episodes end before they are sampled")
    return (f"[warning] env {cfg.env.name}: the opening prompt (seed {cfg.seed}) takes {n} of "
            f"rollout.max_episode_tokens={cap} tokens, {what}; raise rollout.max_episode_tokens "
            f"(to at least {n + turn})")


def check_tokenizer(cfg: Config, algo: Any, tok: Any) -> None:
    """The algorithm's check of the policy's tokenizer `tok` (`Algorithm.check_tokenizer`: e.g.
    distillation's teacher must share it, log-probabilities being compared by id).

    Raises:
        ConfigError: naming the key (e.g. `algo.teacher_path`).
    """
    try:
        algo.check_tokenizer(cfg.algo, tok)
    except ValueError as e:
        raise ConfigError(f"config error: {e}") from None
