"""The reference policy: an env's own reference answers, fed through the harness as a scripted
policy (`ScriptedEngine`), so the answers travel exactly the path a model's answers take
(rendering, the agent loop, answer extraction, the sandbox, the tests).

How a prompt finds its answer: before the run, one env is reset with each task's reset kwargs;
the opening messages are rendered to prompt ids exactly as `run_episodes` renders them
(`renderer.prompt_ids(obs, tools=info.get("tools"))`), and `env.unwrapped.reference_answer()`
is stored under those ids. During the run the policy looks the prompt up: an exact match for
the first turn; on a later turn (the reference failed and the env gave feedback) the longest
stored prompt that is a prefix of the context, so the reference is answered again. Two tasks
whose opening prompts render to the same ids share the first one's answer.

With `HumanEval.jsonl.gz` through the code_sandbox env this must score pass@1 = 1.0: an end to
end check that the harness, the env and the sandbox agree with the benchmark's own tests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from agentrl.models.tiny import build_tokenizer
from agentrl.models.tokens import encode_continuation
from agentrl.rollout.chat import ChatRenderer, renderer_for
from agentrl.rollout.engines.scripted import ScriptedEngine


def has_reference(env: Any) -> bool:
    """Whether the env offers `reference_answer()` (on the env or its unwrapped core)."""
    return callable(getattr(env, "reference_answer", None)) or callable(
        getattr(getattr(env, "unwrapped", None), "reference_answer", None))


def _reference(env: Any) -> str:
    get = getattr(env, "reference_answer", None)
    if not callable(get):
        get = getattr(env.unwrapped, "reference_answer", None)
    if not callable(get):
        raise ValueError(f"model 'reference': env {type(env.unwrapped).__name__} has no "
                         "reference_answer(); the reference policy needs one")
    answer = get()
    if not isinstance(answer, str) or not answer:
        raise ValueError(f"model 'reference': env {type(env.unwrapped).__name__} returned no "
                         f"reference answer ({answer!r}) for the current task")
    return answer


def reference_table(make_env: Callable[[], Any], renderer: ChatRenderer,
                    tasks: Sequence[dict[str, Any]]) -> dict[tuple[int, ...], str]:
    """Map each task's rendered opening prompt (token ids, as a tuple) to the env's reference
    answer for it.

    Raises:
        ValueError: the env has no `reference_answer()` or gives an empty one; a reset raised
            (naming the task).
    """
    env = make_env()
    table: dict[tuple[int, ...], str] = {}
    for i, kw in enumerate(tasks):
        try:
            obs, info = env.reset(**kw)
        except Exception as e:  # noqa: BLE001 - reported with the task that failed
            raise ValueError(f"model 'reference': reset of task {i} ({kw}) failed: {e}") from e
        key = tuple(renderer.prompt_ids(obs, tools=(info or {}).get("tools")))
        table.setdefault(key, _reference(env))
    close = getattr(env, "close", None)
    if callable(close):
        close()
    return table


def lookup_policy(table: dict[tuple[int, ...], str]) -> Callable[[list[int]], str]:
    """The policy `prompt ids -> answer` over `reference_table`'s table: exact match, else the
    longest stored prompt that is a prefix of the ids.

    Raises (when called):
        LookupError: no stored prompt matches (the harness rendered a prompt the table was not
            built from: a bug, never silently an empty answer).
    """
    by_len = sorted(table, key=len, reverse=True)

    def policy(prompt: list[int]) -> str:
        key = tuple(prompt)
        if key in table:
            return table[key]
        for k in by_len:
            if len(k) <= len(key) and key[:len(k)] == k:
                return table[k]
        raise LookupError(f"reference policy: no task's prompt matches this context ({len(prompt)} ids)")

    return policy


def reference_engine(make_env: Callable[[], Any], renderer: ChatRenderer,
                     tasks: Sequence[dict[str, Any]]) -> ScriptedEngine:
    """A `ScriptedEngine` answering every task of `tasks` with the env's reference answer (see
    the module doc). Its tokenizer is `renderer.tokenizer`.

    Raises:
        ValueError: see `reference_table`.
    """
    return ScriptedEngine(renderer.tokenizer, lookup_policy(reference_table(make_env, renderer, tasks)))


def reference_texts(make_env: Callable[[], Any], tasks: Iterable[dict[str, Any]]) -> list[str]:
    """Opening-message texts and reference answers of `tasks`: the corpus the reference run's
    tokenizer is trained on (`agentrl.models.tiny.build_tokenizer`), so token counts are those of a
    tokenizer fitted to the tasks, like the embedded default model's."""
    env = make_env()
    texts: list[str] = []
    for kw in tasks:
        obs, _ = env.reset(**kw)
        texts.extend(str(m.get("content") or "") for m in obs)
        if has_reference(env):
            texts.append(_reference(env))
    return texts


def reference_setup(make_env: Callable[[], Any], tasks: Sequence[dict[str, Any]], *,
                    tokenizer_dir: str | None = None, vocab_size: int = 1024
                    ) -> tuple[ScriptedEngine, ChatRenderer, int, int]:
    """Everything `agentrl eval --model reference` needs: the engine, its renderer, and the
    token caps that keep every reference answer whole.

    Args:
        make_env: makes one env of the evaluated kind.
        tasks: reset kwargs of the tasks.
        tokenizer_dir: a model directory whose tokenizer to use; None: train the embedded
            byte-level BPE tokenizer (`agentrl.models.tiny.build_tokenizer`) offline on the tasks'
            texts (`reference_texts`).
        vocab_size: vocabulary of that trained tokenizer.

    Returns:
        `(engine, renderer, answer_cap, episode_cap)`: `answer_cap` is the longest answer in
        tokens + 1 (its end-of-turn), `episode_cap` the longest prompt + `answer_cap` + 1.

    Raises:
        ValueError: see `reference_table`.
    """
    if tokenizer_dir:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    else:
        tokenizer = build_tokenizer(reference_texts(make_env, tasks), vocab_size=vocab_size)
    renderer = renderer_for(tokenizer)
    table = reference_table(make_env, renderer, tasks)
    answer_cap = max(len(encode_continuation(tokenizer, a)) for a in table.values()) + 1
    episode_cap = max(len(p) for p in table) + answer_cap + 1
    return ScriptedEngine(tokenizer, lookup_policy(table)), renderer, answer_cap, episode_cap
