"""Offline stages from files, without an environment: DPO from a preference file
(`agentrl train --algo dpo --dataset prefs.jsonl`) and supervised fine-tuning from a file of
conversations (`agentrl sft --dataset convs.jsonl`).

Preference file (JSONL, one pair per line; `agentrl.algos.dpo.load_preferences`):

    {"prompt": "..." | [{"role": ..., "content": ...}, ...], "chosen": "...", "rejected": "..."}

Conversation file (JSONL, one conversation per line; `load_conversations`):

    {"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": "..."}, ...],
     "tools": [...]}   # optional: OpenAI tool schemas, rendered by the chat template

An assistant message may carry OpenAI `tool_calls` (content a string or null): its target is its
content followed by the calls written in the model's tool format (`rollout.tool_parser`, `auto`:
read from the tokenizer), which the gateway and tool envs parse back.

Every assistant message is a target: its text and the end-of-turn token are trained on (loss
mask 1), the messages before it, rendered with the chat template and the generation prompt, are
the context (mask 0). Both stages write OUT/config.json, OUT/metrics.jsonl (one row per
optimizer step), OUT/model (a Hugging Face directory with the tokenizer: `model.path` of a
later stage, `agentrl eval --model`) and OUT/summary.json. The model is `model.path`, else the
embedded tiny default.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from agentrl.algos.dpo import DPO, load_preferences, preference_batch
from agentrl.config import Config
from agentrl.gateway.protocol import parse_call
from agentrl.gateway.record import template_messages
from agentrl.infra.jsonl import jsonl_rows
from agentrl.learner.checkpoints import check_out
from agentrl.learner.local import Learner
from agentrl.log.metrics import MetricsLog
from agentrl.models.tokens import encode_continuation
from agentrl.rollout.chat import renderer_for
from agentrl.rollout.tool_format import tool_parser_for
from agentrl.run import load_policy
from agentrl.sft import sft_train, stage_device
from agentrl.types import Trajectory
from agentrl_tools.parser import ToolCall, get_parser

ROLES = ("system", "user", "assistant", "tool")


def is_preference_file(path: str | Path) -> bool:
    """True when `path` is a JSONL file whose first non-blank line is an object with `chosen`
    or `rejected` (a preference file, not a task file: a record missing one of the two is then
    reported by the loader with its line and the key); False for anything else (a missing
    file, a `.gz`, a task name such as `humaneval`)."""
    p = Path(path)
    if not p.is_file() or p.suffix == ".gz":
        return False
    try:
        with p.open() as f:
            for line in f:
                if line.strip():
                    row = json.loads(line)
                    return isinstance(row, dict) and ("chosen" in row or "rejected" in row)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return False


class Conversation(list):
    """A conversation's messages (a list), with the row's OpenAI tool schemas in `tools`
    (None: the row has none)."""

    tools: list[dict] | None = None


def _message(where: str, i: int, m: Any) -> dict[str, Any]:
    """Message `i` of a row, checked: a known role and a string content (an assistant message
    with `tool_calls` may have a null one; each call needs `function.name` and arguments that
    are an object or its JSON text); `tool_calls` and a tool message's `tool_call_id` kept."""
    calls = m.get("tool_calls") if isinstance(m, dict) and m.get("role") == "assistant" else None
    content = m.get("content") if isinstance(m, dict) else None
    if not (isinstance(m, dict) and m.get("role") in ROLES
            and (isinstance(content, str) or (calls and content is None))):
        raise ValueError(f"{where}: message {i} needs a role in {', '.join(ROLES)} and a string content")
    out = {"role": m["role"], "content": content or ""}
    if calls:
        parsed = [parse_call(c, missing={}) for c in (calls if isinstance(calls, list) else [None])]
        if any(p is None or not isinstance(p[1], dict) for p in parsed):
            raise ValueError(f"{where}: message {i}: each tool call needs function.name and "
                             "function.arguments (an object or its JSON text)")
        out["tool_calls"] = [ToolCall(*p) for p in parsed if p is not None]
    if m["role"] == "tool" and isinstance(m.get("tool_call_id"), str):
        out["tool_call_id"] = m["tool_call_id"]
    return out


def load_conversations(path: str | Path) -> list[Conversation]:
    """Read conversations from a JSONL file of `{"messages": [...], "tools": [...]}` (`tools`
    optional) or bare message lists.

    Returns:
        one `Conversation` of {"role", "content"} messages per line (`tool_calls` as
        `ToolCall`s and `tool_call_id` kept; `tools` set from the row).

    Raises:
        FileNotFoundError: no such file.
        ValueError: invalid JSON, a message without a known role or a string content, a
            malformed tool call or `tools`, a conversation without an assistant message (each
            names `path:line`), or no conversation at all.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"sft dataset {path} is a directory, not a JSONL file" if path.is_dir()
                                else f"sft dataset not found: {path}")
    out = []
    for where, row in jsonl_rows(path):
        msgs = row.get("messages") if isinstance(row, dict) else row
        if not isinstance(msgs, list) or not msgs:
            raise ValueError(f"{where}: expected {{\"messages\": [...]}} with at least one message")
        conv = Conversation(_message(where, i, m) for i, m in enumerate(msgs))
        if not any(m["role"] == "assistant" for m in conv):
            raise ValueError(f"{where}: no assistant message to train on")
        tools = row.get("tools") if isinstance(row, dict) else None
        if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
            raise ValueError(f"{where}: tools must be a list of OpenAI tool schemas (objects)")
        conv.tools = tools or None
        out.append(conv)
    if not out:
        raise ValueError(f"{path}: no conversations")
    return out


def _target(m: dict[str, Any], parser: Any, where: str) -> str:
    """An assistant message's target text: its content, then its tool calls in the tool format
    of `parser` (one per line), checked to parse back to the same calls."""
    calls = m.get("tool_calls") or []
    if not calls:
        return m["content"]
    text = "\n".join([m["content"].strip(), *(parser.format_call(c) for c in calls)]).lstrip("\n")
    back = [(c.name, c.arguments) for c in parser.parse(text) if isinstance(c, ToolCall)]
    if back != [(c.name, c.arguments) for c in calls]:
        raise ValueError(f"{where}: its tool calls do not parse back from the {parser.name} tool format "
                         "as one text (set rollout.tool_parser to the model's format)")
    return text


def conversation_examples(convs: list[list[dict[str, Any]]], renderer: Any,
                          tool_parser: str = "auto") -> list[Trajectory]:
    """One supervised example per assistant message: context = the messages before it with the
    generation prompt (`renderer.prompt_ids`, with the conversation's `tools`, mask 0), target =
    its text's ids + end-of-turn (mask 1; with tool calls, `_target`: in `tool_parser`'s format,
    `auto` read from the tokenizer). The first message of a conversation may not be the
    assistant's (no context).

    Raises:
        ValueError: tool calls that do not parse back from the tool format.
    """
    tok = renderer.tokenizer
    parser = get_parser(tool_parser_for(tool_parser, tok)[0])
    out = []
    for n, conv in enumerate(convs):
        tools = getattr(conv, "tools", None)
        for i, m in enumerate(conv):
            if m["role"] != "assistant" or i == 0:
                continue
            tr = Trajectory()
            tr.append_context(renderer.prompt_ids(template_messages(conv[:i]), tools))
            text = _target(m, parser, f"conversation {n + 1}, message {i}")
            ids = encode_continuation(tok, text) + [renderer.end_of_turn_id]
            tr.append_sampled(ids, [0.0] * len(ids), text=text)
            out.append(tr)
    return out


def _start(cfg: Config) -> tuple[Path, Any, Any, Any, int]:
    """OUT (checked, config written), model, tokenizer, renderer, pad id."""
    out = Path(cfg.out)
    check_out(out, overwrite=cfg.overwrite, resumable=False)  # sft and offline DPO have no --resume
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(cfg.model_dump_json(indent=1))
    torch.manual_seed(cfg.seed)
    # the embedded model (no model.path) is built from the env's own tasks: never from this
    # stage's file (preferences or conversations are not a task file)
    model, tok, _ = load_policy(cfg.model_copy(update={"env": cfg.env.model_copy(update={"dataset": None})}),
                                out, None)
    renderer = renderer_for(tok)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else renderer.end_of_turn_id
    return out, model, tok, renderer, pad_id


def _finish(out: Path, model: Any, tok: Any, summary: dict[str, Any]) -> dict[str, Any]:
    model.save_pretrained(out / "model")
    tok.save_pretrained(out / "model")
    summary["model"] = str(out / "model")
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def dpo_from_file(cfg: Config, path: str | Path, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Offline DPO: `train.steps` optimizer batches of `rollout.tasks_per_step` pairs (drawn
    without replacement, reshuffled each epoch) from the preference file, each run through
    `Learner.update` with `algo.update_epochs` x `algo.minibatches` steps against the frozen
    starting policy; `algo.beta`, `train.lr`, `train.micro_batch_size` (rounded down to whole
    pairs), `train.grad_clip` as for online DPO.

    Returns:
        the summary (also OUT/summary.json): `stage`, `pairs`, `steps`, the last `dpo_loss`
        and `reward_accuracy`, and `model` (OUT/model).

    Raises:
        FileNotFoundError / ValueError: from `load_preferences` (the line is named).
        ValueError: overlong shaping is switched on (it acts on sampled turns, and a file has
            none; DPO's config has no other option), named before anything is written.
    """
    if cfg.algo.overlong_buffer != 0:  # would act on no sampled turn: refused, not ignored
        raise ValueError(f"config error: algo.overlong_buffer={cfg.algo.overlong_buffer!r}: offline DPO "
                         "from a preference file has no sampled turns for it to act on (set "
                         "algo.overlong_buffer=0)")
    dpo = DPO()
    pairs = load_preferences(path)
    out, model, tok, renderer, pad_id = _start(cfg)
    learner = Learner(model, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay,
                      grad_clip=cfg.train.grad_clip, use_ref=True,
                      micro_batch_size=max(2, cfg.train.micro_batch_size // 2 * 2),
                      device=stage_device(cfg), precision=cfg.train.precision)
    log = MetricsLog(out, tensorboard=cfg.log.tensorboard)
    gen = torch.Generator().manual_seed(cfg.seed)
    order: list[int] = []
    per_step = min(cfg.rollout.tasks_per_step, len(pairs))
    last: dict[str, float] = {}
    say(f"[dpo] {len(pairs)} preference pairs from {path}; {cfg.train.steps} steps of {per_step} pairs")
    for step in range(cfg.train.steps):
        t0 = time.perf_counter()
        if len(order) < per_step:
            order += torch.randperm(len(pairs), generator=gen).tolist()
        idx, order = order[:per_step], order[per_step:]
        batch = preference_batch([pairs[i] for i in idx], renderer, pad_id)
        batch["ref_logprobs"] = learner.logprobs(batch, ref=True)
        batch["advantages"], _ = dpo.advantages(batch, cfg.algo)
        last = learner.update(batch, dpo, cfg.algo, epochs=cfg.algo.update_epochs,
                              minibatches=cfg.algo.minibatches, seed=cfg.seed + step)
        row = {f"loss/{k}": v for k, v in last.items()}
        row["perf/step_s"] = time.perf_counter() - t0
        log.log(step + 1, row)
    log.close()
    model.eval()
    return _finish(out, model, tok, {"stage": "dpo", "dataset": str(path), "pairs": len(pairs),
                                     "steps": cfg.train.steps, "dpo_loss": last.get("dpo_loss"),
                                     "reward_accuracy": last.get("reward_accuracy")})


def sft_from_file(cfg: Config, path: str | Path, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Supervised fine-tuning on the assistant messages of a conversation file: `sft.steps`
    AdamW steps of `sft.batch_size` examples at `sft.lr` (cosine decay to 10%; the warm start's
    `agentrl.sft.sft_train`), token-mean cross-entropy over the target tokens only.

    Returns:
        the summary (also OUT/summary.json): `stage`, `conversations`, `examples`, `steps`,
        `first_loss`, `last_loss` (nats per target token), `model` (OUT/model).

    Raises:
        FileNotFoundError / ValueError: from `load_conversations` (the line is named).
    """
    convs = load_conversations(path)
    out, model, tok, renderer, pad_id = _start(cfg)
    examples = conversation_examples(convs, renderer, cfg.rollout.tool_parser)
    if not examples:
        raise ValueError(f"{path}: no assistant message after a context to train on")
    log = MetricsLog(out, tensorboard=cfg.log.tensorboard)
    say(f"[sft] {len(examples)} assistant messages from {len(convs)} conversations in {path}; "
        f"{cfg.sft.steps} steps")
    losses = sft_train(model, examples, steps=cfg.sft.steps, lr=cfg.sft.lr,
                       batch_size=cfg.sft.batch_size, pad_id=pad_id, seed=cfg.seed,
                       grad_clip=cfg.train.grad_clip, device=stage_device(cfg),
                       precision=cfg.train.precision, log=lambda s, v: log.log(s + 1, {"sft/loss": v}))
    log.close()
    model.eval()
    return _finish(out, model, tok, {"stage": "sft", "dataset": str(path), "conversations": len(convs),
                                     "examples": len(examples), "steps": len(losses),
                                     "first_loss": losses[0] if losses else None,
                                     "last_loss": losses[-1] if losses else None})
