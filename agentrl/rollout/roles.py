"""Role fallbacks: how messages a chat template refuses are rewritten before they are rendered
(docs/models.md, "How the renderer reads a template").

A template may refuse a role (Gemma-3 and Mistral v0.3 refuse `tool`; Gemma-2 and Llama-2-style
templates refuse `system`: `raise_exception('System role not supported')`), drop it (Phi-3
drops `tool`), or refuse two user messages in a row (Mistral v0.3, Gemma-2, Gemma-3 check that
roles alternate). `role_fallbacks` lists, in the one order every path tries them, the rewrites
of a message list: as it is; other roles as `user`; runs of users merged (`merge_user_runs`);
system messages folded into the next user message (`fold_system`); both. The renderer's opening
prompts, `rollout.history=template` prompts, observation deltas and history check, and the
drift check (`agentrl.rollout.drift`), all render the first one the template accepts
(`first_accepted`), so they render the same messages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

Message = dict[str, Any]
T = TypeVar("T")

TEMPLATE_ROLES = ("system", "user", "assistant")
"""Roles every template renders (but see `fold_system`); a message of another role (`tool`)
that a template refuses or drops is rendered as a `user` message."""

OBSERVATION_ROLES = ("system", "user")
"""Roles an observation (the messages after a sampled turn) keeps in its first fallback; any
other (`tool`, an env's `assistant`) renders as `user`."""

USER_JOIN = "\n\n"
"""What joins the texts of consecutive `user` messages that a template refuses in a row (Mistral's
and Gemma-3's alternation checks): `merge_user_runs`."""

SYSTEM_JOIN = "\n\n"
"""What joins a system message's text to the user message it is folded into where a template
refuses the system role (Gemma-2's, Llama-2-style templates): `fold_system`. The system text, a
blank line, the user text: what Gemma-3's own template does with a system message."""


def _parts(content: Any) -> list[Any]:
    return list(content) if isinstance(content, (list, tuple)) else [{"type": "text", "text": str(content or "")}]


def _join(a: Any, b: Any, sep: str) -> Any:
    """Two messages' contents as one: strings joined by `sep`; else the content parts in order,
    a text part `sep` between them."""
    if isinstance(a, str) and isinstance(b, str):
        return a + sep + b
    return [*_parts(a), {"type": "text", "text": sep}, *_parts(b)]


def merge_user_runs(messages: list[Message]) -> list[Message]:
    """`messages` with each run of consecutive `user` messages merged into one `user` message
    whose text is theirs joined by `USER_JOIN` (content-part lists: the parts in order, a text
    part `USER_JOIN` between messages); other keys of merged messages (a tool result's `name`)
    are dropped. For templates that refuse two user turns in a row, where several observations
    fall back to `user` (two tool results of one turn on Mistral v0.3) or an env sends several."""
    out: list[Message] = []
    for m in messages:
        prev = out[-1] if out else None
        if prev is None or m.get("role") != "user" or prev.get("role") != "user":
            out.append(m)
            continue
        out[-1] = {"role": "user", "content": _join(prev.get("content"), m.get("content"), USER_JOIN)}
    return out


def fold_system(messages: list[Message]) -> list[Message]:
    """`messages` with each `system` message folded into the `user` message that follows it:
    one `user` message whose text is the system text, `SYSTEM_JOIN`, then the user text (several
    system messages in a row: each in order). A system message that no user message follows
    (before another role, or at the end) becomes a `user` message. Other keys of folded messages
    are dropped. For templates that refuse the system role (Gemma-2: `System role not
    supported`)."""
    out: list[Message] = []
    pending: list[Any] = []  # the contents of system messages waiting for a user message
    for m in [*messages, None]:
        role = None if m is None else m.get("role")
        if role == "system":
            pending.append(m.get("content"))  # type: ignore[union-attr]
            continue
        if pending and role == "user":
            content = m.get("content")  # type: ignore[union-attr]
            for p in reversed(pending):
                content = _join(p, content, SYSTEM_JOIN)
            m = {"role": "user", "content": content}
        else:
            out += [{"role": "user", "content": p} for p in pending]
        pending = []
        if m is not None:
            out.append(m)
    return out


def role_fallbacks(messages: list[Message], keep: tuple[str, ...] = TEMPLATE_ROLES) -> list[list[Message]]:
    """The message lists to render, in order, until the template accepts one: `messages`; with
    roles not in `keep` as `user`; that with runs of users merged (`merge_user_runs`); with
    system messages folded (`fold_system`); folded and merged. Each distinct list once."""
    messages = list(messages)
    as_user = [{**m, "role": "user"} if m.get("role") not in keep else m for m in messages]
    folded = fold_system(as_user)
    out: list[list[Message]] = []
    for c in (messages, as_user, merge_user_runs(as_user), folded, merge_user_runs(folded)):
        if c not in out:
            out.append(c)
    return out


def first_accepted(candidates: Iterable[list[Message]], render: Callable[[list[Message]], T],
                   fatal: type[BaseException]) -> tuple[T, list[Message]]:
    """`render(c)` and `c` for the first of `candidates` that `render` does not raise on (a
    template that refuses a role, or a run of users, raises); an exception of class `fatal` is
    raised at once.

    Raises:
        Exception: the first candidate's error when every candidate is refused.
    """
    first: Exception | None = None
    for c in candidates:
        try:
            return render(c), c
        except fatal:
            raise
        except Exception as e:  # noqa: BLE001 - jinja errors, raise_exception in templates
            first = first or e
    assert first is not None, "no candidates"
    raise first
