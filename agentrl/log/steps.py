"""What the training loop records of each step and of the run: the rollout metrics
(`rollout/...`, `env/...`), what the update made of each episode (`mark_trained`, shown by
`agentrl show`), the workers' profile (`perf/...`), the bf16/fp32 logprob gap of frozen
workers, the metrics row and rollouts of a step (`log_step`), and the summary and closing
lines of the run (`report`, OUT/summary.json)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrl.infra.jsonl import jsonable
from agentrl.log.summary import (
    cost_profile,
    format_profile,
    reward_repeats_pass1,
    stage_seconds,
    summary_panel,
)
from agentrl.types import Trajectory, episode_errors


def format_eval(ev: dict[str, float], samples: int) -> str:
    """`pass@1 0.203 ± 0.021, pass@4 0.412 ± 0.030` from evaluation metrics (± one standard
    error over tasks; `n/a` for an undefined value, NaN or None, e.g. the repair rate of an
    evaluation without a failed first attempt; no ± for an undefined standard error, e.g. the
    repair rate's when one task has a failed first attempt)."""
    shown = [(f"pass@{k}", f"pass@{k}") for k in sorted({1, samples})]
    shown += [(key, label) for key, label in (("first_attempt_pass@1", "first attempt"),
                                              ("repair_rate", "repair rate"),
                                              ("feedback_gain", "feedback gain")) if key in ev]  # multi-turn
    def defined(x: Any) -> bool:  # None (e.g. a repair-rate SE from one task) and NaN are not
        return isinstance(x, (int, float)) and x == x

    parts = []
    for key, label in shown:
        v, se = ev.get(key), ev.get(f"{key}_se")
        parts.append(f"{label} " + (f"{v:.3f}" if defined(v) else "n/a") + (f" ± {se:.3f}" if defined(se) else ""))
    return ", ".join(parts)


def rollout_metrics(trajs: list[Trajectory], success: Callable[[Trajectory], bool],
                    more: Sequence[dict[str, float]] = ()) -> dict[str, float]:
    """The batch's rollout metrics over the episodes trained on (after the staleness filter,
    before dynamic sampling drops groups): `rollout/reward_mean` and `rollout/reward_std` over
    the non-NaN episode returns (NaN when there are none), `rollout/pass_rate` (`success(traj)`:
    did it solve its task, `agentrl.eval.episodes.episode_success`), `env/errors` (the
    episodes with a recorded error, `agentrl.types.episode_errors`: an env's, a tool's or the
    user's agent's), `env/timeouts`, `sandbox/unisolated` and `sandbox/cached` (env steps run without a sandbox /
    answered from the verdict cache), ..., `rollout/template_drift` (the share of episodes checked by
    `agentrl.rollout.drift` whose ids differ from the chat template's rendering; absent when
    none was checked), then the dicts of `more` (e.g. the algorithm's and the reward
    components'), then `group_key_metrics`."""
    m: dict[str, float] = {}
    rets = np.array([t.episode_return for t in trajs], dtype=float)
    valid = rets[~np.isnan(rets)]
    m["rollout/reward_mean"] = float(valid.mean()) if len(valid) else float("nan")
    m["rollout/reward_std"] = float(valid.std()) if len(valid) else float("nan")
    m["rollout/pass_rate"] = float(np.mean([success(t) for t in trajs]))
    m["rollout/response_len"] = float(np.mean([t.num_sampled for t in trajs]))
    m["rollout/turns"] = float(np.mean([len(t.turns) for t in trajs]))
    m["rollout/truncated_frac"] = float(np.mean([t.truncated for t in trajs]))
    m["env/errors"] = float(sum(bool(episode_errors(t)) for t in trajs))  # episodes, as eval's `errors`
    m["env/timeouts"] = float(sum(bool(t.info.get("env_timeout")) for t in trajs))  # resets + steps
    # env steps whose code ran WITHOUT a sandbox (code_sandbox with backend='subprocess')
    m["sandbox/unisolated"] = float(sum(bool((turn.info or {}).get("unisolated"))
                                        for t in trajs for turn in t.turns))
    # env steps answered from the sandbox's verdict cache (code_sandbox's `cache_verdicts`)
    m["sandbox/cached"] = float(sum(bool((turn.info or {}).get("cached")) for t in trajs for turn in t.turns))
    m["rollout/nan_rewards"] = float(np.isnan(rets).sum())
    drift = [t.info["template_drift"] for t in trajs if "template_drift" in t.info]
    if drift:  # share of checked episodes whose ids differ from the template (rollout/drift.py)
        m["rollout/template_drift"] = float(np.mean([bool(d) for d in drift]))
    for extra in more:
        m.update(extra)
    m.update(group_key_metrics(trajs, success))
    return m


def group_key_metrics(trajs: list[Trajectory], success: Callable[[Trajectory], bool]) -> dict[str, float]:
    """Per env group key (`info["group_key"]`, e.g. `propose`, `solve/deduce`):
    `rollout/<key>/episodes`, `.../pass_rate` (`success(traj)`; for `self_propose`'s proposals:
    the valid proposal rate; for its solves: the solve rate) and `.../reward_mean`; and
    `env/<name>`, the largest value of each `info["env_stats"]` entry (e.g. `env/buffer_size`)."""
    m: dict[str, float] = {}
    keys = sorted({str(t.info["group_key"]) for t in trajs if t.info.get("group_key") is not None})
    for k in keys:
        ts = [t for t in trajs if str(t.info.get("group_key")) == k]
        rets = [t.episode_return for t in ts if t.episode_return == t.episode_return]
        m[f"rollout/{k}/episodes"] = float(len(ts))
        m[f"rollout/{k}/pass_rate"] = float(np.mean([success(t) for t in ts]))
        m[f"rollout/{k}/reward_mean"] = float(np.mean(rets)) if rets else float("nan")
    for t in trajs:
        for name, v in (t.info.get("env_stats") or {}).items():
            m[f"env/{name}"] = max(m.get(f"env/{name}", float("-inf")), float(v))
    return m


def mark_trained(trajs: list[Trajectory], batch: dict[str, Any]) -> None:
    """Record in each trajectory's `info` what the update made of it (shown by `agentrl show`):
    `advantage`, the mean advantage over its trained tokens (loss_mask 1; the episode's one
    advantage for GRPO-style algorithms), and `trained`, whether any of its advantages is
    non-zero, i.e. whether it carries policy-gradient signal (an episode of a group whose
    rewards were all equal, or whose reward failed, has advantage 0: the learner leaves it out
    of its forwards when its loss has no KL or entropy term). Nothing is recorded when the
    algorithm's rows are not the trajectories (e.g. DPO's pairs)."""
    adv = batch.get("advantages")
    if not isinstance(adv, torch.Tensor) or adv.shape[0] != len(trajs) or adv.dim() not in (1, 2):
        return
    for i, t in enumerate(trajs):
        if adv.dim() == 1:
            a, nonzero = float(adv[i]), bool(adv[i] != 0)
        else:
            mask = batch["loss_mask"][i] > 0
            vals = adv[i][mask] if mask.any() else adv[i][:0]
            a = float(vals.mean()) if len(vals) else 0.0
            nonzero = bool((vals != 0).any()) if len(vals) else False
        t.info["advantage"], t.info["trained"] = a, nonzero


def log_gap(workers: list[Any], placement: Any, batch: dict[str, Any], step: int,
            m: dict[str, float]) -> None:
    """Every `placement.logp_gap_every` steps, for each bfloat16 frozen worker of `workers`
    (reference, teacher): `ref/logp_gap_mean` and `ref/logp_gap_max` (`teacher/...`),
    |logp_bf16 - logp_fp32| (nats) over the batch's first `placement.logp_gap_tokens` agent
    tokens, and `ref/logp_gap_tokens` (how many)."""
    if not placement.logp_gap_every or step % placement.logp_gap_every:
        return
    for w in workers:
        if w.dtype == "float32":
            continue
        g = w.logp_gap(batch, placement.logp_gap_tokens)
        prefix = "ref" if w.role == "reference" else w.role
        m.update({f"{prefix}/logp_gap_mean": g["mean"], f"{prefix}/logp_gap_max": g["max"],
                  f"{prefix}/logp_gap_tokens": g["tokens"]})


def worker_profile(workers: list[Any], rewards: Any, cfg: Any, m: dict[str, float]) -> None:
    """The workers' share of the step (call after `perf/step_s` is set): `perf/reward_model_s`
    (seconds the reward model computed: in this process's env wrappers `rewards`, or on its
    worker), `perf/reference_busy_s` and `perf/reference_wait_s` (`perf/teacher_...`: the
    reference (teacher) worker of `workers` computed / the loop waited for it), and the idle
    seconds of each worker, `perf/<worker>_idle_s` = step seconds - its busy seconds. Not logged
    for an inline reward model in Ray rollout workers (its time is spent in their processes)."""
    rm_here = cfg.placement.reward_model == "worker" or cfg.rollout.num_workers == 0
    if rewards is not None and hasattr(rewards, "take_reward_model_seconds") and rm_here:
        m["perf/reward_model_s"] = rewards.take_reward_model_seconds()
        if cfg.placement.reward_model == "worker":
            m["perf/reward_model_idle_s"] = max(0.0, m["perf/step_s"] - m["perf/reward_model_s"])
    for w in workers:
        m.update(w.take_metrics())
        m[f"perf/{w.role}_idle_s"] = max(0.0, m["perf/step_s"] - m[f"perf/{w.role}_busy_s"])


def log_step(lp: Any, step: int, m: dict[str, float], trajs: list[Trajectory]) -> str:
    """Write step `step + 1`'s metrics to `lp.log` (`lp`: the run's
    `agentrl.rollout.stages.Loop`), and its rollouts every `train.log_rollouts_every` steps
    and at the last step, so that `agentrl show` has one after any run; returns the progress
    line."""
    lp.log.log(step + 1, m)
    every = lp.cfg.train.log_rollouts_every
    if every and ((step + 1) % every == 0 or step + 1 == lp.cfg.train.steps):
        (lp.out / "rollouts").mkdir(exist_ok=True)
        with (lp.out / "rollouts" / f"step_{step + 1}.jsonl").open("w") as f:
            for t in trajs:
                f.write(json.dumps(t.to_dict()) + "\n")
    r, p = m["rollout/reward_mean"], m["rollout/pass_rate"]
    return (f"reward {r:.3f} " + ("" if r == p else f"pass {p:.2f} ")  # code_sandbox: the same number
            + f"len {m['rollout/response_len']:.0f} {m['perf/step_s']:.1f}s/step")


def before_temperature(out: Path) -> float | None:
    """The sampling temperature of the before-RL evaluation recorded in OUT/eval_before.json
    (a resumed run may evaluate after RL at another `rollout.temperature`); for a file written
    before it was recorded, the one in OUT/eval/before/summary.json (`meta.temperature`,
    `agentrl.eval.harness.run_eval`); None when neither has it (a run from before either
    recorded it: its T is unknown, not this run's)."""
    for f, read in ((out / "eval_before.json", lambda d: d.get("temperature")),
                    (out / "eval" / "before" / "summary.json", lambda d: (d.get("meta") or {}).get("temperature"))):
        try:
            t = read(json.loads(f.read_text()))
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(t, (int, float)):
            return float(t)
    return None


def eval_temperatures(t_before: float | None, t_after: float) -> str:
    """The temperatures of the closing `[eval] held-out (...)` line: `T=1.0` when both
    evaluations sampled at it, else each named; `T=? (not recorded)` for a before-RL evaluation
    whose temperature no file kept (`before_temperature` None)."""
    if t_before == t_after:
        return f"T={t_after}"
    before = "T=? (not recorded)" if t_before is None else f"T={t_before}"
    return f"before RL at {before}, after RL at T={t_after}"


def report(lp: Any, before: dict[str, float], after: dict[str, float], final: Path,
           extra: dict[str, Any], console: Any, n_tasks: int | None = None) -> dict[str, Any]:
    """The run's summary (written to OUT/summary.json as strict JSON: an undefined figure, NaN, is
    null there) and its closing lines (`lp`: the run's
    `agentrl.rollout.stages.Loop`; `n_tasks`: the held-out tasks evaluated, default
    `train.eval_tasks`). The held-out evaluations' `reward_mean` is left out of the
    summary when it equals their pass@1 (`heldout_reward_is_pass@1`; OUT/eval/*/summary.json
    keep every metric); `stage_seconds` holds `sft` (the warm start's `sft_seconds`) and
    `stage_seconds(OUT/metrics.jsonl)`."""
    cfg, out, say = lp.cfg, lp.out, lp.say
    n_tasks = cfg.train.eval_tasks if n_tasks is None else n_tasks
    b, a = before["pass@1"], after["pass@1"]
    same = reward_repeats_pass1(before, after)  # code_sandbox: reward = solved = pass@1
    ev_b, ev_a = ({k: v for k, v in e.items() if not (same and k == "reward_mean")} for e in (before, after))
    summary = {"env": cfg.env.name, "algo": cfg.algo.name, "steps": cfg.train.steps,
               "eval_before": ev_b, "eval_after": ev_a, "heldout_reward_is_pass@1": same,
               "pass@1_ratio": (a / b) if b > 0 else None, "pass@1_gain": a - b,
               "checkpoint": str(final), **extra,
               "stage_seconds": {**({"sft": extra["sft_seconds"]} if extra.get("sft_seconds") else {}),
                                 **stage_seconds(out / "metrics.jsonl")}}
    if cfg.env.max_turns is not None:  # multi-turn: the panel names the attempts
        summary["max_turns"] = cfg.env.max_turns
    summary["cost_profile"] = {label: {"seconds": sec, "share": share}
                               for label, sec, share in cost_profile(summary["stage_seconds"])}
    (out / "summary.json").write_text(json.dumps(jsonable(summary), indent=1, allow_nan=False))  # NaN -> null
    ratio = f"{a / b:.2f}x" if b > 0 else "n/a"
    temps = eval_temperatures(before_temperature(out), cfg.rollout.temperature)
    say(f"[eval] held-out ({temps}, {n_tasks} tasks x "
        f"{cfg.train.eval_samples}, ± standard error): before RL {format_eval(before, cfg.train.eval_samples)}"
        f" -> after RL {format_eval(after, cfg.train.eval_samples)}")
    say(f"[eval] held-out pass@1: before RL {b:.3f} -> after RL {a:.3f} ({ratio}, {a - b:+.3f} absolute); "
        f"`agentrl eval --model {out}` reproduces the after-RL figure ({out / 'eval'})")
    say(f"[done] checkpoint: {final}; metrics: {out / 'metrics.jsonl'}")
    if cfg.quiet or console is None:  # the panel shows it otherwise
        say(f"[profile] {format_profile(summary['stage_seconds'])}")
    if console is not None:
        console.print(summary_panel(summary, out))
    return summary
