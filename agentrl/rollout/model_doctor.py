"""`agentrl doctor --model DIR`: what agentrl makes of a model directory's tokenizer and chat
template before a run uses it (docs/models.md).

`inspect_model(DIR)` loads the tokenizer only (and reads `config.json` and the safetensors
headers, never the weights) and reports: the end-of-turn id, the glue after it and the stop ids
(`ChatRenderer`); whether the template rewrites history and how (`rewrites_history`); the
tool-call format `rollout.tool_parser=auto` picks (`detect_tool_parser`); whether a turn
boundary merges (probe episodes through `agentrl.rollout.drift`: the first turn starting with
text, a newline, a blank, two newlines); whether the system role is rendered, folded into the
first user turn, dropped or refused; and the tokenizer's size against the config's
`vocab_size` and the embedding rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentrl.models.tiny import (
    config_vocab_size,
    overflow_message,
    rows_mismatch,
    weight_files,
    weight_rows,
)
from agentrl.models.tokens import continuation_note, encode_continuation
from agentrl.rollout.chat import ChatRenderer, Message
from agentrl.rollout.drift import episode_drift
from agentrl.rollout.roles import SYSTEM_JOIN
from agentrl.rollout.tool_format import detect_tool_parser
from agentrl.types import Trajectory

PROBES = ("Hello.", "\nHello.", " Hello.", "\n\nHello.")
"""First-turn texts of the boundary probe episodes (a model's turn may start with any of them)."""


class DoctorError(ValueError):
    """The directory cannot be inspected (no tokenizer, no chat template): one line to show."""


def load_tokenizer(path: str | Path) -> Any:
    """The tokenizer of model directory `path` (local files only).

    Raises:
        DoctorError: `path` is not a directory, or holds no loadable tokenizer.
    """
    from transformers import AutoTokenizer  # deferred: heavy

    p = Path(path)
    if not p.is_dir():
        raise DoctorError(f"--model {path}: not a directory")
    if not any((p / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")):
        raise DoctorError(f"--model {path}: no tokenizer (no tokenizer.json, tokenizer_config.json, "
                          "tokenizer.model or vocab.json)")
    try:
        return AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds
        raise DoctorError(f"--model {path}: the tokenizer does not load: {type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''}") from None


def _probe(r: ChatRenderer, first: str) -> dict[str, Any] | None:
    """`episode_drift` of a two-turn episode built as the agent loop builds it: a user message,
    the turn `first`, a tool result, the turn "Done."."""
    tok = r.tokenizer
    tr = Trajectory(messages=[{"role": "user", "content": "What is 2 + 3?"}])
    tr.append_context(r.prompt_ids(tr.messages))
    for k, text in enumerate((first, "Done.")):
        sampled = encode_continuation(tok, text) + [r.end_of_turn_id]
        tr.append_sampled(sampled, [0.0] * len(sampled), text=text)
        tr.messages.append({"role": "assistant", "content": text})
        if k == 0:
            obs: list[Message] = [{"role": "tool", "content": "5"}]
            tr.append_context(r.close_turn(sampled) + r.delta_ids(obs))
            tr.messages += obs
    return episode_drift(r, tr)


def boundary_merges(r: ChatRenderer) -> list[str]:
    """One line per probe (`PROBES`) whose episode drifts: the first turn's text and where the
    ids differ from the template's rendering; [] when none does."""
    out = []
    for first in PROBES:
        try:
            d = _probe(r, first)
        except Exception as e:  # noqa: BLE001 - a template that refuses the probe
            out.append(f"turn {first!r}: the probe episode does not render ({type(e).__name__}: {e})"[:200])
            continue
        if d:
            out.append(f"a turn starting {first!r}: {d['where']} (turn {d['turn']}): template "
                       f"{d.get('expected_text', '')!r} vs episode {d.get('got_text', d.get('error', ''))!r}")
    return out


def system_role(r: ChatRenderer) -> str:
    """How the template renders a system message: `rendered`, `folded into the user turn` (the
    system text + a blank line + the user's, Gemma-3; Mistral puts it in the last user turn),
    `dropped`, or `refused (...)`, followed by `; agentrl folds it into the first user turn`
    where the renderer's fallback does so (Gemma-2: `fold_system`)."""
    user = {"role": "user", "content": "U"}
    try:
        text, _ = r.render_text([{"role": "system", "content": "Sys"}, user], True)
    except Exception as e:  # noqa: BLE001 - raise_exception in the template
        why = f"{type(e).__name__}: {str(e)[:120]}"
        try:  # the renderer's fallback (`fold_system`)
            _, used = r.prompt_render([{"role": "system", "content": "Sys"}, user])
        except Exception:  # noqa: BLE001
            return f"refused ({why})"
        if used == [{"role": "user", "content": "Sys" + SYSTEM_JOIN + "U"}]:
            return f"refused ({why}); agentrl folds it into the first user turn"
        return f"refused ({why})"
    if "Sys" not in text:
        return "dropped"
    try:
        folded, _ = r.render_text([{"role": "user", "content": "Sys\n\nU"}], True)
    except Exception:  # noqa: BLE001
        folded = None
    return "folded into the user turn" if folded == text else "rendered"


def vocabulary(tok: Any, path: Path) -> dict[str, Any]:
    """`tokenizer` (len), `config` (config.json's vocab_size, or the text config's), embedding
    and lm_head rows when present, and `verdict`: `ok`, `padded: N rows beyond the tokenizer
    (sliced off the logits)`, `MISMATCH: ...` (ids the model has no row for, or weights whose
    rows differ from config.json's vocab_size: transformers cannot load them), `UNREADABLE: ...`
    (a safetensors file whose header does not parse) or `MISSING: ...` (no config.json: no
    model to load). The last three stop a run; `agentrl doctor` exits 1 on them."""
    out: dict[str, Any] = {"tokenizer": len(tok)}
    if not (path / "config.json").is_file():
        out["verdict"] = (f"MISSING: {path} has no config.json (agentrl train/serve/eval cannot load "
                          "a model from it; only the tokenizer was checked)")
        return out
    size = config_vocab_size(path)
    if size is not None:
        out["config"] = size
    if not weight_files(path):
        out["verdict"] = (f"MISSING: {path} holds no weights (no *.safetensors or pytorch_model*.bin "
                          "file; agentrl train/serve/eval cannot load a model from it)")
        return out
    try:
        rows = weight_rows(path)
    except ValueError as e:
        out["verdict"] = f"UNREADABLE: {e}"
        return out
    out.update(rows)
    problem = rows_mismatch(path, rows, size)
    if problem:
        out["verdict"] = f"MISMATCH: {problem}"
        return out
    sizes = [out[k] for k in ("config", "embedding", "lm_head") if k in out]
    if not sizes:
        out["verdict"] = "no vocab_size or weights to compare with"
    elif min(sizes) < len(tok):  # the wording of train's start-up check and load_model
        out["verdict"] = f"MISMATCH: {overflow_message(path, tok, min(sizes))}"
    elif max(sizes) > len(tok):
        out["verdict"] = f"padded: {max(sizes) - len(tok)} rows beyond the tokenizer (sliced off the logits)"
    else:
        out["verdict"] = "ok"
    return out


#: `vocabulary` verdicts with which a run cannot start (`agentrl doctor` exits 1)
FATAL_VERDICTS = ("MISMATCH", "UNREADABLE", "MISSING")


def inspect_model(path: str | Path, template_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """The template's and vocabulary's properties of model directory `path` (see the module
    docstring), as plain data: `end_of_turn` (id, token), `glue`, `stop`, `rewrites_history`,
    `history_note`, `tool_parser`, `tool_parser_why`, `boundary_merges` (list of lines),
    `system_role`, `vocabulary`, `fragments` ('' or why `encode_continuation` falls back to
    encoding fragments as whole texts, `continuation_note`); `renderer_error` instead of the renderer's properties when
    agentrl cannot use the template.

    Raises:
        DoctorError: no tokenizer, or no chat template.
    """
    p = Path(path)
    tok = load_tokenizer(p)
    if not getattr(tok, "chat_template", None):
        raise DoctorError(f"--model {path}: the tokenizer has no chat template (agentrl renders "
                          "episodes with it): add the model's template as the `chat_template` key of "
                          "tokenizer_config.json or as a chat_template.jinja file beside it (docs/models.md)")
    parser, why = detect_tool_parser(tok)
    out: dict[str, Any] = {"path": str(p), "tokenizer_class": type(tok).__name__,
                           "tool_parser": parser, "tool_parser_why": why, "vocabulary": vocabulary(tok, p),
                           "fragments": continuation_note(tok)}
    try:
        r = ChatRenderer(tok, template_kwargs=template_kwargs)
    except ValueError as e:
        out["renderer_error"] = str(e)
        return out
    name = tok.convert_ids_to_tokens
    out.update(end_of_turn=(r.end_of_turn_id, name(r.end_of_turn_id)), glue=tok.decode(r.glue_ids),
               stop=[(i, name(i)) for i in r.stop_ids], rewrites_history=r.rewrites_history,
               history_note=r.history_note, boundary_merges=boundary_merges(r), system_role=system_role(r))
    return out


def format_report(rep: dict[str, Any]) -> list[str]:
    """The lines `agentrl doctor --model` prints for `inspect_model`'s result."""
    v = rep["vocabulary"]
    sizes = ", ".join(f"{k} {v[k]}" for k in ("tokenizer", "config", "embedding", "lm_head") if k in v)
    lines = [f"model: {rep['path']} ({rep['tokenizer_class']})"]
    if "renderer_error" in rep:
        lines.append(f"chat template: FAIL: {rep['renderer_error']}")
    else:
        eot, stops = rep["end_of_turn"], ", ".join(f"{t} ({i})" for i, t in rep["stop"])
        lines += [f"end of turn: {eot[1]} (id {eot[0]}); glue after it: {rep['glue']!r}; stop ids: {stops}",
                  "rewrites history: " + (rep["history_note"] if rep["rewrites_history"] is None else
                                          f"yes: {rep['history_note']} (rollout.history=exact trains what was "
                                          "sampled; =template renders each turn's prompt)"
                                          if rep["rewrites_history"] else "no"),
                  f"system role: {rep['system_role']}",
                  "turn boundary merges: " + ("no (probed: " + ", ".join(repr(s) for s in PROBES) + ")"
                                              if not rep["boundary_merges"] else "yes")]
        lines += [f"  {m}" for m in rep["boundary_merges"]]
    if rep.get("fragments"):  # said only where a SentencePiece-style tokenizer may add spaces
        lines.append(f"mid-sequence text: {rep['fragments']}")
    lines += [f"tool format (rollout.tool_parser=auto): {rep['tool_parser']} ({rep['tool_parser_why']})",
              f"vocabulary: {sizes}: {v['verdict']}"]
    return lines
