"""The multi-turn code-repair job (configs/code_repair.yaml) on a tiny setting: one RL step, the
repair metrics in metrics.jsonl and summary.json, `agentrl eval RUN` reproducing them exactly,
and the warm start's repair examples tokenized as the agent loop renders an episode."""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.test_train_cli import TINY

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "code_repair.yaml"


def test_one_step_multi_turn_run_and_eval_reproduces_repair_metrics(tmp_path):
    from rich.console import Console

    from agentrl.config import load_config
    from agentrl.eval.cli import eval_command
    from agentrl.train import train

    out = tmp_path / "run"
    tiny = [a for a in TINY if not a.startswith("train.eval_")]
    # repair_fraction 0.05 (the config's 0.5 builds 1000 repairs, about 35 s of sandbox runs)
    cfg = load_config(str(CONFIG), [*tiny, "train.steps=1", "train.eval_tasks=4", "train.eval_samples=3",
                                    "train.eval_batch_size=4", "sft.repair_fraction=0.05", f"out={out}",
                                    "quiet=true", "sft.min_steps=0", "sft.check_every=1",
                                    "sft.check_tasks=2", "sft.check_samples=2", "sft.policy_repair_tasks=4",
                                    "sft.policy_repair_steps=2"])
    assert cfg.env.max_turns == 3
    summary = train(cfg)
    assert summary["max_turns"] == 3
    after = summary["eval_after"]
    # the warm start's stop checks ran first attempts only (sft.check_turns=1, the config's),
    # while the run's episodes get up to 3 attempts (the untrained model fails, so it uses them)
    checks = [json.loads(x) for x in (out / "sft_metrics.jsonl").read_text().splitlines()]
    checks = [r for r in checks if "sft/train_pass@1" in r]
    assert [r["sft/train_turns"] for r in checks] == [1.0, 1.0]
    assert summary["eval_before"]["attempts_mean"] > 1
    for key in ("first_attempt_pass@1", "first_attempt_pass@1_se", "repair_rate", "repair_rate_se",
                "attempts_mean", "independent_pass", "feedback_gain", "independent_repair_rate"):
        assert key in after and key in summary["eval_before"], key
    assert after["attempts_mean"] > 1  # an untrained tiny model fails, so it gets more attempts
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in rows if "rollout/reward_mean" in r)
    assert step["rollout/turns"] > 1 and "rollout/reward_turn_2" in step and "rollout/repair_rate" in step
    s = eval_command(model=str(out), out=str(tmp_path / "ev"),
                     console=Console(file=open(tmp_path / "eval.log", "w")))
    for key in ("pass@1", "first_attempt_pass@1", "repair_rate", "attempts_mean", "independent_pass",
                "feedback_gain", "independent_repair_rate"):
        a, b = s["overall"][key], after[key]
        assert (a == b) or (a is None and b != b), key  # NaN in eval/ is None in the summary


def test_the_config_is_the_multi_turn_job():
    from agentrl.config import load_config

    cfg = load_config(str(CONFIG), [])
    assert (cfg.env.name, cfg.env.max_turns, cfg.algo.name, cfg.sft.repair_fraction) == (
        "code_sandbox", 3, "grpo", 0.5)
    assert (cfg.algo.turn_credit, cfg.sft.check_turns, cfg.env.kwargs.get("turn_penalty", 0.0),
            cfg.train.steps) == ("gigpo", 1, 0.0, 300)
    assert (cfg.sft.policy_repair_tasks, cfg.sft.policy_repair_steps) == (1536, 240)


def test_repair_examples_are_rendered_like_an_episode(tiny_tokenizer):
    """A repair example is the opening prompt, the wrong attempt with its end-of-turn and glue,
    the env's real feedback as an observation delta (all mask 0), then the fix (mask 1); with
    repair_fraction 0 the examples are the single-turn ones, token for token."""
    from agentrl.rollout.chat import ChatRenderer
    from agentrl.sandbox.pool import default_pool
    from agentrl.sft import sft_examples
    from agentrl_envs.code_sandbox import CodeSandboxEnv

    r = ChatRenderer(tiny_tokenizer)
    env = CodeSandboxEnv(max_turns=3, pool=default_pool("auto"))
    plain = sft_examples(env, r, 6, seed=0)
    assert [t.token_ids for t in sft_examples(env, r, 6, seed=0, repair_fraction=0.0)] == \
        [t.token_ids for t in plain]
    repairs = sft_examples(env, r, 6, seed=0, repair_fraction=1.0)
    multi = [t for t in repairs if len(t.messages) == 5]
    assert len(multi) >= 4  # a task whose mutants all pass falls back to a plain example
    for tr, base in zip(repairs, plain):
        if len(tr.messages) != 5:
            continue
        opening, wrong, feedback, fix = tr.messages[:2], tr.messages[2], tr.messages[3], tr.messages[4]
        assert feedback["content"].startswith("Your code failed: ")
        assert fix["content"] == base.turns[0].text  # the fix is the reference answer
        attempt = tiny_tokenizer.encode(wrong["content"], add_special_tokens=False) + [r.end_of_turn_id]
        ans = tiny_tokenizer.encode(fix["content"], add_special_tokens=False) + [r.end_of_turn_id]
        want = (r.prompt_ids(opening) + attempt + list(r.glue_ids) + r.delta_ids([feedback]) + ans)
        assert tr.token_ids == want
        assert tr.loss_mask == [0] * (len(want) - len(ans)) + [1] * len(ans)


def test_repair_contexts_are_the_turns_after_a_failed_attempt():
    from agentrl.sft_repairs import repair_contexts
    from agentrl.types import Trajectory

    tr = Trajectory(task_id="t")
    tr.append_context([1, 2])
    for k, (ids, verdict) in enumerate([([3, 4], "fail"), ([5], "syntax_error"), ([6, 7], "pass")]):
        tr.append_sampled(ids, [0.0] * len(ids), text=f"a{k}")
        tr.turns[-1].info["verdict"] = verdict
        if k < 2:
            tr.append_context([90 + k])  # the feedback
    # turn 1 starts after [1, 2, 3, 4, 90], turn 2 after [..., 5, 91]; the passing turn 2 ends it
    assert repair_contexts(tr) == [[1, 2, 3, 4, 90], [1, 2, 3, 4, 90, 5, 91]]
    tr.turns[0].info["verdict"] = "pass"  # (an env that goes on after a pass: no repair there)
    assert repair_contexts(tr) == [[1, 2, 3, 4, 90, 5, 91]]
    # rollout.history=template: each turn was sampled from the template's rendering of the
    # history (here with the system prompt moved and turn 0 re-encoded), not from token_ids
    tr.turns[0].info["verdict"] = "fail"
    tr.turn_prompts = [[1, 2], [2, 1, 33, 90], [2, 1, 33, 90, 5, 91]]
    assert repair_contexts(tr) == [[2, 1, 33, 90], [2, 1, 33, 90, 5, 91]]


def test_policy_repairs_are_the_policy_s_own_failed_contexts_with_the_reference(tmp_path, tiny_model_dir):
    """The second warm-start phase's examples on an untrained tiny model (it fails, so it gets
    feedback): each is the exact ids of one of the policy's episodes up to a turn after failed
    feedback (mask 0), then its task's reference solution and the end of turn (mask 1); a
    one-step run with the phase logs its steps after the first phase's and trains from it."""
    from agentrl.config import load_config
    from agentrl.models.tiny import load_model
    from agentrl.rollout.envs import build_env
    from agentrl.run import policy_renderer
    from agentrl.sft_repairs import policy_repair_examples
    from agentrl.train import train

    tiny = [a for a in TINY if not a.startswith("train.eval_")]
    cfg = load_config(str(CONFIG), [*tiny, "seed=3"])
    model, tok = load_model(tiny_model_dir)
    r = policy_renderer(cfg, tok)
    ex, st = policy_repair_examples(cfg, model, tok, r, tasks=6, seed=11)
    assert st["episodes"] == 6 and st["repair_contexts"] == len(ex) > 6  # up to 2 per failed episode
    env = build_env(cfg, "train")
    refs, opening = {}, {}
    for s in range(11, 17):
        obs, info = env.reset(seed=s)
        refs[str(info["task_id"])] = env.unwrapped.reference_answer()
        opening[str(info["task_id"])] = r.prompt_ids(obs)
    for e in ex:
        ids = tok.encode(refs[e.task_id], add_special_tokens=False) + [r.end_of_turn_id]
        n = len(e.token_ids) - len(ids)
        assert e.turns[0].text == refs[e.task_id] and e.token_ids[n:] == ids
        assert e.loss_mask == [0] * n + [1] * len(ids)
        assert e.token_ids[: len(opening[e.task_id])] == opening[e.task_id]  # the episode's own prompt first
    out = tmp_path / "run"
    cfg = load_config(str(CONFIG), [*tiny, "train.steps=1", "train.eval_tasks=2", "train.eval_samples=3",
                                    "train.eval_batch_size=6", "sft.repair_fraction=0.05", f"out={out}",
                                    "quiet=true", "sft.steps=2", "sft.min_steps=5",
                                    "sft.policy_repair_tasks=4", "sft.policy_repair_steps=3"])
    summary = train(cfg)
    rows = [json.loads(x) for x in (out / "sft_metrics.jsonl").read_text().splitlines()]
    assert [r_["step"] for r_ in rows if r_.get("sft/phase") == 2] == [2, 3, 4]
    assert summary["steps"] == 1 and (out / "sft_model" / "config.json").exists()


def test_a_single_turn_run_ignores_policy_repairs(tmp_path):
    """`sft.policy_repair_tasks` is for multi-turn runs: a single-turn run with `sft.steps=0`
    makes no warm start at all (no sft_metrics.jsonl, no sft_model), as without it."""
    from agentrl.config import load_config
    from agentrl.train import train

    out = tmp_path / "run"
    tiny = [a for a in TINY if not a.startswith("train.eval_")]
    cfg = load_config(None, [*tiny, "env.name=code_sandbox", "train.steps=1", "train.eval_tasks=2",
                             "train.eval_samples=1", f"out={out}", "quiet=true", "sft.steps=0",
                             "sft.policy_repair_tasks=4"])
    train(cfg)
    assert not (out / "sft_metrics.jsonl").exists() and not (out / "sft_model").exists()
