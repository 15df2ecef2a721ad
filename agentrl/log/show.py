"""`agentrl show`: print one saved episode so that a user sees exactly what was trained on.

Episodes come from OUT/rollouts/step_N.jsonl (one `Trajectory.to_dict()` per line, written
every `train.log_rollouts_every` steps). The token ids are decoded span by span with the run's
tokenizer; spans are cut wherever `loss_mask` changes, so the display follows the mask itself,
not the turn boundaries. Trained tokens (loss_mask 1) are highlighted; in plain mode (or on a
console without colour) they are wrapped in ⟦ ⟧ so the distinction survives copy and paste.
After each agent turn a line gives its reward, verdict and finish reason.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentrl.models.tokens import decode_fragment
from agentrl.types import Trajectory

OPEN, CLOSE = "⟦", "⟧"
TRAINED_STYLE = "bold black on bright_green"
IDLE_STYLE = "black on yellow"
"""Sampled tokens (loss_mask 1) of an episode with advantage 0: in the loss, but no reward signal."""
CONTEXT_STYLE = "dim"
NOTE_STYLE = "italic cyan"


def rollout_steps(out_dir: str | Path) -> list[int]:
    """Steps that have a saved rollouts file, ascending."""
    d = Path(out_dir) / "rollouts"
    steps = []
    for p in d.glob("step_*.jsonl") if d.is_dir() else []:
        try:
            steps.append(int(p.stem.split("_", 1)[1]))
        except ValueError:
            continue
    return sorted(steps)


def load_episode(out_dir: str | Path, step: int | None = None, index: int = 0) -> Trajectory:
    """Episode `index` of OUT/rollouts/step_<step>.jsonl (`step` None: the latest saved step).

    Raises:
        FileNotFoundError: no rollouts were saved, or none for `step` (the message lists the
            steps that exist).
        IndexError: `index` outside the file's episodes.
    """
    steps = rollout_steps(out_dir)
    if not steps:
        raise FileNotFoundError(f"no rollouts in {Path(out_dir) / 'rollouts'}: a run saves them every "
                                "train.log_rollouts_every steps (default 5) and at its last step; this run "
                                "stopped before saving any, or ran with train.log_rollouts_every=0. Run "
                                "again with train.log_rollouts_every=1 to save every step")
    step = steps[-1] if step is None else step
    if step not in steps:
        raise FileNotFoundError(f"no rollouts saved for step {step}; saved steps: "
                                f"{', '.join(map(str, steps))}")
    lines = (Path(out_dir) / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()
    if not -len(lines) <= index < len(lines):
        raise IndexError(f"episode {index} out of range: step {step} has {len(lines)} episodes")
    return Trajectory.from_dict(json.loads(lines[index]))


def load_group(out_dir: str | Path, step: int, group_id: int) -> list[Trajectory]:
    """The episodes of group `group_id` in OUT/rollouts/step_<step>.jsonl, in file order."""
    lines = (Path(out_dir) / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()
    eps = [Trajectory.from_dict(json.loads(line)) for line in lines if line.strip()]
    return [t for t in eps if t.group_id == group_id]


def trunk_note(out_dir: str | Path, step: int, index: int) -> str | None:
    """A tree rollout's shared first turn (`rollout.branch`, `info["shared_first_turn"]`): the
    episodes of step `step`'s file (indices, group-major) whose sampled first turn, context
    included, is episode `index`'s, the first of them the one that sampled it; None when it
    shares its first turn with no marked episode (a run without branches)."""
    lines = (Path(out_dir) / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()
    eps = [Trajectory.from_dict(json.loads(line)) for line in lines if line.strip()]
    me = eps[index]

    def first(t: Trajectory) -> list[int] | None:
        return t.token_ids[:t.turns[0].end] if t.turns else None

    if first(me) is None:
        return None
    same = [i for i, t in enumerate(eps) if t.group_id == me.group_id and first(t) == first(me)]
    if len(same) < 2 or not any(eps[i].info.get("shared_first_turn") for i in same):
        return None
    return (f"first turn shared (tree rollout, rollout.branch): episodes {', '.join(map(str, same))} "
            f"hold the same first turn, sampled once by episode {same[0]} and trained in each")


def training_note(traj: Trajectory, group_returns: list[float]) -> str:
    """One line on what the update made of the episode: its advantage and whether it was
    trained (carried policy-gradient signal), with the returns of its group, from the
    `advantage` / `trained` the trainer records in `info` (`agentrl.log.steps.mark_trained`)."""
    rets = ", ".join(f"{r:.3g}" for r in group_returns)
    grp = f"group returns [{rets}]"
    if "trained" not in traj.info:  # a run from before they were recorded, or DPO pairs
        return f"advantage: not recorded in this file · {grp}"
    adv = float(traj.info.get("advantage", 0.0))
    if traj.info["trained"]:
        return f"trained: advantage {adv:+.3f} · {grp}"
    why = ("its group's rewards were all equal" if len({r for r in group_returns if r == r}) <= 1
           else "its advantage is 0")
    return (f"NOT trained: advantage 0 ({why}: no policy-gradient signal; its sampled tokens are "
            f"shown in yellow, not green) · {grp}")


def versions_note(traj: Trajectory) -> str | None:
    """Which policy versions sampled the episode's tokens, when more than one did (partial
    rollouts, `rollout.partial`: a weight push lands inside a turn; the header's `policy vN`
    is only the oldest): `sampled tokens per policy version: v4 37, v5 63; switches at turn 2
    token 12 (v4 -> v5)`, turns counted from 1 and tokens from 0 within the turn's sampled tokens, as
    `Trajectory.token_versions` records them. None when one version sampled every token (or
    the episode kept no per-token versions)."""
    sampled = traj.sampled_versions()
    if len(set(sampled)) < 2:
        return None
    counts = [f"v{v} {sampled.count(v)}" for v in sorted(set(sampled))]
    switches, prev = [], sampled[0]
    for n, turn in enumerate(traj.turns, 1):
        for k, v in enumerate(traj.token_versions[turn.start:turn.end]):
            if v != prev:
                switches.append(f"turn {n} token {k} (v{prev} -> v{v})")
            prev = v
    return f"sampled tokens per policy version: {', '.join(counts)}; switches at {', '.join(switches)}"


def find_tokenizer_dir(out_dir: str | Path, step: int | None = None) -> Path:
    """A directory holding the run's tokenizer: the step's checkpoint, else the latest
    checkpoint, else OUT/sft_model, OUT/base_model, or the config's `model.path`.

    Raises:
        FileNotFoundError: none of these has tokenizer files.
    """
    out = Path(out_dir)
    ck = out / "checkpoints"
    cands = [ck / f"step_{step}"] if step is not None else []
    if ck.is_dir():
        done = [p for p in ck.glob("step_*") if not p.name.endswith(".tmp")]
        cands += sorted(done, key=lambda p: int(p.name.split("_")[1]) if p.name.split("_")[1].isdigit() else -1,
                        reverse=True)
    cands += [out / "sft_model", out / "base_model"]
    cfg = out / "config.json"
    if cfg.exists():
        path = (json.loads(cfg.read_text()).get("model") or {}).get("path")
        if path:
            cands.append(Path(path))
    for c in cands:
        if (c / "tokenizer_config.json").exists() or (c / "tokenizer.json").exists():
            return c
    raise FileNotFoundError(f"no tokenizer found for {out} (looked in checkpoints/, sft_model/, "
                            "base_model/ and model.path)")


def _printable(s: str) -> str:
    """Control characters (a sampled ESC would drive the terminal) shown as `\\xNN` escapes."""
    return "".join(c if c in "\n\t" or c.isprintable() else f"\\x{ord(c):02x}" for c in s)


def render_episode(traj: Trajectory, tokenizer: Any, *, marks: bool, trained: bool = True) -> Any:
    """The episode as a rich `Text`: decoded spans of equal `loss_mask`, trained spans styled
    (`TRAINED_STYLE`, or `IDLE_STYLE` when `trained` is False: the episode had advantage 0) and
    wrapped in ⟦ ⟧ when `marks`, and a note after each agent turn."""
    from rich.text import Text

    ids, mask = traj.token_ids, traj.loss_mask
    n = len(ids)
    notes: dict[int, list[str]] = {}
    for k, t in enumerate(traj.turns, 1):
        info = t.info or {}
        parts = [f"turn {k}: reward {t.reward:.3g}"]
        if "verdict" in info:
            parts.append(f"verdict {info['verdict']}")
        if "success" in info:
            parts.append(f"success {info['success']}")
        if info.get("error"):
            parts.append(f"error {str(info['error'])[:80]}")
        parts.append(f"finish {t.finish_reason}")
        parts.append(f"{sum(mask[t.start:t.end])} trained tokens")
        notes.setdefault(t.end, []).append(" · ".join(parts))
    cuts = sorted({0, n} | {i for i in range(1, n) if mask[i] != mask[i - 1]}
                  | {e for e in notes if 0 < e < n})
    text = Text()
    for a, b in zip(cuts, cuts[1:]):
        piece = _printable(decode_fragment(tokenizer, ids[a:b]) if a else
                           tokenizer.decode(ids[a:b], skip_special_tokens=False))
        if mask[a]:
            text.append(f"{OPEN}{piece}{CLOSE}" if marks else piece,
                        style=TRAINED_STYLE if trained else IDLE_STYLE)
        else:
            text.append(piece, style=CONTEXT_STYLE)
        for note in notes.get(b, []):
            text.append("" if str(text).endswith("\n") else "\n")
            text.append(f"  ↳ {note}\n", style=NOTE_STYLE)
    return text


def show_episode(out_dir: str | Path, step: int | None = None, index: int = 0,
                 console: Any = None, *, plain: bool = False) -> Trajectory:
    """Print episode `index` of the rollouts saved at `step` (None: the latest) of run OUT.

    The header gives the task, group, policy version, return and how the episode ended, then
    whether the update trained on it and its advantage, with its group's returns
    (`training_note`), the versions that sampled its tokens when a partial rollout's push
    landed in it (`versions_note`), the episode's own error when it has one (`info["error"]`: a failed
    reset, an `--agent` run whose agent failed); the roles of the transcript; then the tokens with the loss mask visible
    (see module doc; an untrained episode's sampled tokens in `IDLE_STYLE`).

    Args:
        out_dir: the run's output directory.
        step: training step of OUT/rollouts/step_<step>.jsonl (None: the latest saved).
        index: episode within the file (group-major order, as trained).
        console: a rich Console (default: a new one on stdout).
        plain: no colour; trained spans are wrapped in ⟦ ⟧ (also done automatically when the
            console has no colour, e.g. output to a file or NO_COLOR set).

    Returns:
        the episode shown.

    Raises:
        FileNotFoundError, IndexError: as `load_episode` and `find_tokenizer_dir`.
    """
    from rich.console import Console
    from transformers import AutoTokenizer

    steps = rollout_steps(out_dir)
    step = steps[-1] if step is None and steps else step
    traj = load_episode(out_dir, step, index)
    tok = AutoTokenizer.from_pretrained(str(find_tokenizer_dir(out_dir, step)), local_files_only=True)
    if console is None:
        console = Console(no_color=plain, highlight=False)
    marks = plain or console.no_color or console.color_system is None
    ending = "truncated" if traj.truncated else "terminated" if traj.terminated else "running"
    head = (f"step {step} · episode {index} · task {traj.task_id or '?'} · group {traj.group_id} "
            f"· policy v{traj.policy_version} · return {traj.episode_return:.3g} · {ending}")
    group = [t.episode_return for t in load_group(out_dir, step, traj.group_id)]
    roles = " → ".join(m.get("role", "?") for m in traj.messages)
    legend = (f"sampled tokens (loss_mask=1) {OPEN}like this{CLOSE}" if marks else
              "sampled tokens (loss_mask=1) highlighted, context (loss_mask=0) dim")
    console.print(head, style="bold", markup=False, highlight=False)
    console.print(training_note(traj, group), markup=False, highlight=False)
    versions = versions_note(traj)
    if versions:
        console.print(versions, markup=False, highlight=False)
    shared = trunk_note(out_dir, step, index)
    if shared:
        console.print(shared, markup=False, highlight=False)
    if traj.info.get("error"):  # the episode's own: a failed reset, the user's agent failing
        console.print(f"error: {str(traj.info['error'])[:300]}", markup=False, highlight=False)
    drift = traj.info.get("template_drift")
    if drift:  # agentrl.rollout.drift: where the ids first differ from the template's rendering
        console.print(f"template drift: {drift.get('where')}, turn {drift.get('turn')}, position "
                      f"{drift.get('position')}: template {drift.get('expected_text', '')!r} vs episode "
                      f"{drift.get('got_text', drift.get('error', ''))!r}", markup=False, highlight=False)
    console.print(f"roles: {roles}", markup=False, highlight=False)
    console.print(f"{legend}; {traj.num_sampled} of {len(traj.token_ids)} tokens have loss_mask 1",
                  markup=False, highlight=False)
    console.rule()
    console.print(render_episode(traj, tok, marks=marks, trained=traj.info.get("trained", True) is not False),
                  markup=False, highlight=False,
                  soft_wrap=True)
    return traj
