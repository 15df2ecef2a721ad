"""Does the embedded tiny vision-language model learn to *read* the `visual_count` boards?

A supervised warm start (SFT on reference answers of training tasks) of the embedded tiny VLM
(`agentrl.models.vlm.build_tiny_vlm`), optionally followed by GRPO (`agentrl train` as a subprocess,
starting from the SFT model), each evaluated on held-out tasks three ways:

- `real`: the task's own board;
- `blank`: an empty board (grid lines only) in its place;
- `shuffled`: the board of another held-out task (the next one in the list) in its place.

A model that uses the pixels is right more often on `real` than on `blank` / `shuffled`; an
image-blind one scores the same on all three. Beside them, two image-blind baselines: the most
common held-out answer (a constant), and the best answer per question text (the most common
training answer for that exact question, e.g. "How many red squares ...?"). The held-out
answer-token loss (teacher-forced, nats per token) is reported for each condition too.

    PYTHONPATH=. python benchmarks/visual_count_learning.py --question colour --sft-steps 400 \
        --sft-lr 5e-4 [--grpo-steps 60 --grpo-tasks 16 --grpo-group 8 --grpo-lr 1e-4 \
        --grpo-save-every 20] [--sft-model DIR] [--vision-width 64] [--seed 0] [--out x.json]

With GRPO, `grpo_change` is the paired change over the same held-out tasks (per condition:
mean of right_after - right_before, its standard error, tasks up and down), and `grpo_curve`
the held-out accuracy at every saved checkpoint. `--sft-model DIR` keeps the warm start in DIR
and reuses it on a later call (the warm start's figures come from DIR/sft_info.json).

Evaluation is greedy (temperature 0), one sample per held-out task (`--eval-tasks`, the first N
of visual_count's held-out split). Single seed per call: a figure from one call says what that
run did, not what the method does on average.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from overhead_common import git_commit  # noqa: E402

CONDITIONS = ("real", "blank", "shuffled")


def _env(split: str, questions: list[str], eval_size: int = 64) -> Any:
    from agentrl_envs.visual_count import VisualCountEnv

    return VisualCountEnv(split, questions=questions, eval_size=eval_size)


def build_model(out: Path, questions: list[str], a: argparse.Namespace) -> str:
    """The embedded VLM, its tokenizer trained on 2000 training tasks' texts (as
    `agentrl.run.default_model_dir`)."""
    from agentrl.env.content import content_text
    from agentrl.models.vlm import build_tiny_vlm

    env = _env("train", questions)
    texts = []
    for i in range(2000):
        obs, _ = env.reset(seed=500_000 + i)
        texts += [content_text(m["content"]) for m in obs] + [env.reference_answer()]
    texts += env.corpus_texts()
    return build_tiny_vlm(out, texts, hidden_size=a.hidden_size, num_layers=a.num_layers,
                          vision_width=a.vision_width, vision_depth=a.vision_depth,
                          vision_heads=a.vision_heads, seed=a.seed, init_std=a.init_std)


def heldout_cases(questions: list[str], n: int) -> list[dict[str, Any]]:
    """The first `n` held-out tasks: question, answer, kind, and the three images."""
    from agentrl_envs.visual_count import draw

    env = _env("heldout", questions, eval_size=n)
    cases = []
    for kw in env.eval_tasks():
        obs, _ = env.reset(**kw)
        cases.append({"task": kw["options"]["task"], "kind": env.task.kind, "question": env.task.question,
                      "answer": env.task.answer, "real": obs[0]["content"][0]["image"]})
    blank = draw([], grid=env.grid, cell=env.cell)
    from PIL import Image

    for i, c in enumerate(cases):
        c["blank"] = Image.fromarray(blank)
        c["shuffled"] = cases[(i + 1) % len(cases)]["real"]
    return cases


def blind_baselines(questions: list[str], cases: list[dict[str, Any]], n_train: int = 20000) -> dict[str, Any]:
    """Image-blind accuracies on the held-out cases: the most common held-out answer, and the
    most common training answer of each exact question text (`n_train` training tasks)."""
    from agentrl_envs.visual_count import make_task

    env = _env("train", questions)
    per_q: dict[str, Counter] = {}
    k = 0
    while sum(map(sum, (c.values() for c in per_q.values()))) < n_train:
        if env.in_split(k):
            t = make_task(k, questions=questions)
            per_q.setdefault(t.question, Counter())[t.answer] += 1
        k += 1
    answers = Counter(c["answer"] for c in cases)
    mode, n_mode = answers.most_common(1)[0]
    overall = sum(per_q.values(), Counter()).most_common(1)[0][0]
    by_q = [per_q.get(c["question"], Counter({overall: 1})).most_common(1)[0][0] for c in cases]
    return {"most_common_heldout_answer": mode, "most_common_answer_acc": n_mode / len(cases),
            "best_answer_per_question_acc": sum(b == c["answer"] for b, c in zip(by_q, cases)) / len(cases)}


def evaluate(model: Any, tok: Any, cases: list[dict[str, Any]],
             conditions: tuple[str, ...] = CONDITIONS) -> dict[str, Any]:
    """Greedy accuracy and teacher-forced answer loss (`answer_nll`) of `model` on `cases`, per
    condition (`CONDITIONS`, or the given subset); `right` is the per-task right/wrong string
    ("1"/"0", in the order of `cases`), `by_answer` maps each right answer to [right, tasks]."""
    import torch

    from agentrl.models.vision_logprobs import vision_token_ids
    from agentrl.rollout.chat import VisionChatRenderer
    from agentrl.rollout.engines.base import SamplingParams
    from agentrl.rollout.engines.hf_vision import VisionHFEngine
    from agentrl.types import Trajectory
    from agentrl_envs.visual_count import parse_answer

    model.eval()
    renderer = VisionChatRenderer(tok, tok.image_processor)
    engine = VisionHFEngine(model, image_token_id=renderer.image_token_id, banned_ids=vision_token_ids(model.config))
    params = SamplingParams(temperature=0.0, max_tokens=6, stop_token_ids=renderer.stop_ids, seed=0)
    out: dict[str, Any] = {}
    for cond in conditions:
        right, trs = [], []
        for c in cases:
            msgs = [{"role": "user", "content": [{"type": "image", "image": c[cond]},
                                                 {"type": "text", "text": c["question"]}]}]
            ids, px = renderer.prompt_inputs(msgs)
            tr = Trajectory(task_id=str(c["task"]))
            tr.append_context(ids)
            tr.append_images(0, ids, px, renderer.image_token_id)
            (comp,) = engine.generate([ids], params, images=[tr.vision])
            right.append(parse_answer(c["kind"], renderer.decode_action(comp.token_ids)) == c["answer"])
            target = tok.encode(c["answer"], add_special_tokens=False) + [renderer.end_of_turn_id]
            tr.append_sampled(target, [0.0] * len(target), text=c["answer"])
            trs.append(tr)
        with torch.no_grad():
            nll = float(answer_nll(model, trs))
        n = len(right)
        acc = sum(right) / n
        by_answer: dict[str, list[int]] = {}
        for c, r in zip(cases, right):
            by_answer.setdefault(c["answer"], [0, 0])
            by_answer[c["answer"]][0] += int(r)
            by_answer[c["answer"]][1] += 1
        out[cond] = {"acc": acc, "acc_se": (acc * (1 - acc) / n) ** 0.5, "answer_nll": nll,
                     "right": "".join("1" if r else "0" for r in right),
                     "by_answer": {k: by_answer[k] for k in sorted(by_answer)}}
    return out


def paired_change(before: str, after: str) -> dict[str, Any]:
    """Paired change of accuracy over the same tasks: `before` and `after` are per-task
    right/wrong strings ("1"/"0", same order). Returns the mean difference `diff` =
    mean(after_i - before_i), its standard error `se` = sd(d) / sqrt(n) (sd with n - 1), `z` =
    diff / se, and the counts of tasks that went wrong -> right (`up`) and right -> wrong
    (`down`).

    Raises:
        ValueError: strings of different lengths, or fewer than 2 tasks.
    """
    if len(before) != len(after) or len(before) < 2:
        raise ValueError(f"need two right/wrong strings of one length >= 2, got {len(before)} and {len(after)}")
    d = [int(a) - int(b) for b, a in zip(before, after)]
    n = len(d)
    mean = sum(d) / n
    var = sum((x - mean) ** 2 for x in d) / (n - 1)
    se = (var / n) ** 0.5
    return {"diff": mean, "se": se, "z": mean / se if se > 0 else None,
            "up": d.count(1), "down": d.count(-1), "n": n}


def check_batched(model: Any, tok: Any, questions: list[str]) -> float:
    """Largest gap between `answer_nll` and the library's per-row loss
    (`agentrl.learner.forward.token_logprobs` with `vision=`) on 8 training examples."""
    import torch

    from agentrl.learner.forward import token_logprobs
    from agentrl.rollout.chat import VisionChatRenderer
    from agentrl.sft import sft_examples
    from agentrl.types import collate

    renderer = VisionChatRenderer(tok, tok.image_processor)
    exs = sft_examples(_env("train", questions), renderer, 8, seed=123)
    gaps = []
    with torch.no_grad():
        for ex in exs:
            b = collate([ex], tok.pad_token_id)
            logp, _ = token_logprobs(model, b["input_ids"], b["attention_mask"], vision=b["vision"])
            ref = -(logp * b["loss_mask"]).sum() / b["loss_mask"].sum()
            gaps.append(abs(float(ref) - float(answer_nll(model, [ex]))))
        b = collate(exs, tok.pad_token_id)
        logp, _ = token_logprobs(model, b["input_ids"], b["attention_mask"], vision=b["vision"])
        ref = -(logp * b["loss_mask"]).sum() / b["loss_mask"].sum()
        gaps.append(abs(float(ref) - float(answer_nll(model, exs))))
    return max(gaps)


def answer_nll(model: Any, examples: list[Any]) -> Any:
    """Mean teacher-forced NLL (nats per answer token, end-of-turn included) of `examples`
    (`Trajectory`s with one image each), in one forward per group of equal-length rows: the
    same loss as `agentrl.sft.sft_train`'s per-row forward (`token_logprobs(vision=...)`;
    `--check-batched` compares them), batched because on 2 CPU cores it is several times
    faster."""
    import torch

    from agentrl.models.vision_logprobs import vision_token_ids

    banned = torch.tensor(vision_token_ids(model.config))
    image_id = int(model.config.image_token_id)
    groups: dict[int, list[Any]] = {}
    for ex in examples:
        groups.setdefault(len(ex.token_ids), []).append(ex)
    total, count = 0.0, 0
    for rows in groups.values():
        ids = torch.tensor([r.token_ids for r in rows])
        mask = torch.tensor([r.loss_mask for r in rows], dtype=torch.float32)
        logits = model(input_ids=ids, pixel_values=torch.cat([r.vision["pixel_values"] for r in rows]),
                       image_grid_thw=torch.cat([r.vision["image_grid_thw"] for r in rows]),
                       mm_token_type_ids=(ids == image_id).long()).logits.float()
        logits = logits.index_fill(-1, banned, torch.finfo(torch.float32).min)
        logp = logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        total = total - (logp * mask[:, 1:]).sum()
        count += int(mask[:, 1:].sum())
    return total / max(count, 1)


def sft(model: Any, tok: Any, questions: list[str], a: argparse.Namespace) -> dict[str, Any]:
    """`agentrl.sft.sft_train`'s recipe (AdamW, no weight decay, cosine decay to 10% of the
    learning rate, gradient clip 1, batches drawn without replacement) on `agentrl.sft.sft_examples`
    of training tasks, with the batched loss `answer_nll`."""
    import torch

    from agentrl.rollout.chat import VisionChatRenderer
    from agentrl.sft import sft_examples

    renderer = VisionChatRenderer(tok, tok.image_processor)
    examples = sft_examples(_env("train", questions), renderer, a.sft_examples, seed=a.seed * 7919 + 1)
    t0 = time.perf_counter()
    opt = torch.optim.AdamW(model.parameters(), lr=a.sft_lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / max(a.sft_steps, 1))))
    gen = torch.Generator().manual_seed(a.seed)
    order: list[int] = []
    losses = []
    model.train()
    for _ in range(a.sft_steps):
        if len(order) < a.batch_size:
            order += torch.randperm(len(examples), generator=gen).tolist()
        idx, order = order[:a.batch_size], order[a.batch_size:]
        loss = answer_nll(model, [examples[i] for i in idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
    model.eval()
    return {"sft_steps": len(losses), "sft_seconds": round(time.perf_counter() - t0, 1),
            "sft_loss_first": losses[0],
            "sft_loss_every_50": [round(x, 4) for x in losses[::50]], "sft_loss_last_10_mean": sum(losses[-10:]) / len(losses[-10:])}


def grpo(sft_dir: Path, run: Path, questions: list[str], a: argparse.Namespace) -> Path:
    """`agentrl train --algo grpo` from the SFT model; returns its last checkpoint (and, with
    `--grpo-eval-every`, keeps every such checkpoint)."""
    qs = "[" + ", ".join(questions) + "]"
    cmd = [sys.executable, "-m", "agentrl.cli", "train", "--env", "visual_count", "--algo", "grpo",
           "--steps", str(a.grpo_steps), "--out", str(run), f"model.path={sft_dir}", f"seed={a.seed}",
           "sft.steps=0", f"rollout.tasks_per_step={a.grpo_tasks}", f"algo.group_size={a.grpo_group}",
           f"train.lr={a.grpo_lr}", "train.eval_tasks=8", "train.eval_samples=1", "rollout.max_tokens=6",
           f"train.save_every={a.grpo_save_every or a.grpo_steps}", "train.keep_checkpoints=0",
           f"algo.kl_coef={a.grpo_kl}", f"env.kwargs={{questions: {qs}}}"]
    r = subprocess.run(cmd, env={**os.environ}, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(r.stdout[-3000:] + r.stderr[-3000:])
    return run / "checkpoints" / f"step_{a.grpo_steps}"


def grpo_metrics(path: Path) -> list[dict[str, Any]]:
    """Per-step training figures of the GRPO run's `metrics.jsonl`: its step, and every
    `rollout/reward_mean`, `eval/pass@1*`, `loss/kl`, `loss/entropy` and `loss/logp_mismatch`
    value logged at that step."""
    rows = []
    for line in path.read_text().splitlines():
        d = json.loads(line)
        keep = {k: v for k, v in d.items() if isinstance(v, (int, float)) and
                (k.startswith("eval/pass@1") or k in ("step", "rollout/reward_mean", "loss/logp_mismatch", "loss/kl", "loss/entropy"))}
        if len(keep) > 1:
            rows.append(keep)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--question", default="colour", choices=["count", "where", "colour", "both"],
                    help="question kind (both: count and where, the env's default mix)")
    ap.add_argument("--sft-steps", type=int, default=400)
    ap.add_argument("--sft-lr", type=float, default=5e-4,
                    help="SFT learning rate (at sft.lr's default 2e-3 the colour run measured stayed image-blind)")
    ap.add_argument("--sft-examples", type=int, default=4000, help="distinct training tasks for SFT")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--hidden-size", type=int, default=128)
    ap.add_argument("--num-layers", type=int, default=4)
    ap.add_argument("--vision-width", type=int, default=32)
    ap.add_argument("--vision-depth", type=int, default=2)
    ap.add_argument("--vision-heads", type=int, default=2)
    ap.add_argument("--init-std", type=float, default=None,
                    help="initialisation std of the VLM (model.init_std; default: the configs' 0.02)")
    ap.add_argument("--grpo-steps", type=int, default=0, help="GRPO steps after SFT (0: none)")
    ap.add_argument("--grpo-tasks", type=int, default=8)
    ap.add_argument("--grpo-group", type=int, default=4)
    ap.add_argument("--grpo-lr", type=float, default=1e-4)
    ap.add_argument("--grpo-kl", type=float, default=0.0, help="algo.kl_coef of the GRPO run")
    ap.add_argument("--grpo-save-every", type=int, default=0,
                    help="also evaluate the GRPO checkpoint every N steps (0: the last only)")
    ap.add_argument("--sft-model", default=None,
                    help="directory of the SFT model: loaded (build and SFT skipped) when it exists, "
                         "else written after SFT (to reuse one warm start for several GRPO runs)")
    ap.add_argument("--eval-tasks", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    from agentrl.models.vlm import load_vlm

    questions = ["count", "where"] if a.question == "both" else [a.question]
    t0 = time.perf_counter()
    res: dict[str, Any] = {"args": vars(a), "cmd": " ".join(sys.argv[1:]), "commit": git_commit()}
    cases = heldout_cases(questions, a.eval_tasks)
    res["blind_baselines"] = blind_baselines(questions, cases)
    with tempfile.TemporaryDirectory() as tmp:
        sft_dir = Path(a.sft_model) if a.sft_model else Path(tmp) / "sft"
        if a.sft_model and (sft_dir / "config.json").exists():  # a warm start made before
            model, tok, improc = load_vlm(sft_dir)
            tok.image_processor = improc
            saved = json.loads((sft_dir / "sft_info.json").read_text())
            res.update(saved)
            res["sft_loaded_from"] = str(sft_dir)
        else:
            base = build_model(Path(tmp) / "base", questions, a)
            model, tok, improc = load_vlm(base)
            tok.image_processor = improc
            res["params"] = sum(p.numel() for p in model.parameters())
            res["params_vision"] = sum(p.numel() for p in model.model.visual.parameters())
            res["batched_loss_max_gap"] = check_batched(model, tok, questions)
            res["untrained"] = evaluate(model, tok, cases)
            res.update(sft(model, tok, questions, a))
            res["after_sft"] = evaluate(model, tok, cases)
            model.save_pretrained(sft_dir)
            tok.save_pretrained(sft_dir)
            improc.save_pretrained(sft_dir)
            keep = ("params", "params_vision", "batched_loss_max_gap", "untrained", "sft_steps", "sft_seconds",
                    "sft_loss_first", "sft_loss_every_50", "sft_loss_last_10_mean", "after_sft")
            (sft_dir / "sft_info.json").write_text(json.dumps({"sft_args": vars(a), **{k: res[k] for k in keep}}))
        print(json.dumps({k: res[k] for k in ("blind_baselines", "after_sft")}, indent=1), flush=True)
        if a.grpo_steps:
            t1 = time.perf_counter()
            run = Path(tmp) / "run"
            ck = grpo(sft_dir, run, questions, a)
            res["grpo_seconds"] = round(time.perf_counter() - t1, 1)
            res["grpo_metrics"] = grpo_metrics(run / "metrics.jsonl")
            steps = sorted({int(p.name.split("_")[1]) for p in (run / "checkpoints").glob("step_*")})
            res["grpo_curve"] = {}
            for st in steps:
                m2, tok2, improc2 = load_vlm(run / "checkpoints" / f"step_{st}")
                tok2.image_processor = improc2
                ev = evaluate(m2, tok2, cases) if st == a.grpo_steps else evaluate(m2, tok2, cases, ("real",))
                res["grpo_curve"][str(st)] = {c: {k: v for k, v in e.items() if k != "right"} for c, e in ev.items()}
                if st == a.grpo_steps:
                    res["after_grpo"] = ev
            assert (run / "checkpoints" / f"step_{a.grpo_steps}") == ck
            res["grpo_change"] = {c: paired_change(res["after_sft"][c]["right"], res["after_grpo"][c]["right"])
                                  for c in CONDITIONS}
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    res["load_avg_1m_at_end"] = os.getloadavg()[0]
    name = a.out or str(ROOT / "benchmarks" / "results" / f"visual_count_learning_{a.question}_w{a.vision_width}"
                        f"_s{a.sft_steps}_seed{a.seed}.json")
    Path(name).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
