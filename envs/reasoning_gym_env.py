"""`--env reasoning_gym:NAME`: any reasoning-gym dataset (the `reasoning-gym` package, extra
`reasoning`) as a one-turn env: its generator makes the tasks, its own `score_answer` is the
reward.

The agent gets the dataset's question under reasoning-gym's default system prompt (answer inside
`<answer>...</answer>`); the answer is what the last such tag holds (`reasoning_gym.utils.
extract_answer`), scored by the dataset's `score_answer(answer, entry)` (in [0, 1]; no tag: 0).

Splits, with disjoint seeds: reasoning-gym generates item `i` of a dataset made with `seed` from
`Random(seed + i)` (its generators' rule), so the training dataset is made with `seed` and
`size` items (per-item seeds `seed .. seed+size-1`) and the held-out one with `seed + size` and
`heldout_size` items (seeds from `seed+size` on): no generator seed is shared. Small task spaces
still repeat a question under two seeds, so a training draw whose question text is a held-out
question is skipped (the next index is taken): held-out tasks are never trained on.
"""

from __future__ import annotations

import difflib
from typing import Any

from agentrl.env.base import TextEnv


def _reasoning_gym() -> Any:
    """The `reasoning_gym` module (imported on first use: it takes seconds).

    Raises:
        ValueError: the package is not installed, naming the extra.
    """
    try:
        import reasoning_gym
    except ImportError as e:
        raise ValueError(f"env reasoning_gym: the reasoning-gym package is not installed ({e}); "
                         "pip install 'agentrl[reasoning]'") from None
    return reasoning_gym


class ReasoningGymEnv(TextEnv):
    """One reasoning-gym dataset as an env (module docstring).

    Args:
        task: the dataset name (`reasoning_gym.factory.DATASETS`), from `--env reasoning_gym:NAME`.
        split: `train` or `heldout` (`test`, `eval` are aliases).
        seed: the data seed (training items use seeds `seed + i`, held-out ones `seed + size + j`).
        size: training items (drawn at random each reset).
        heldout_size: held-out items (evaluation lists them all).
        config: keyword arguments of the dataset's config (e.g. `{"max_terms": 3}`).
        system_prompt: the system message (default: reasoning-gym's `default` prompt).

    Reset info: `task_id` (`NAME/train/i` or `NAME/heldout/j`), `question`. Final step info:
    `answer` (the extracted answer or None), `gold`, `score`.

    Raises:
        ValueError: the package is missing, an unknown dataset (naming some known ones), a
            config the dataset refuses, an unknown split, sizes < 1, or a training set whose
            questions are all held-out questions.
    """

    def __init__(self, task: str = "", split: str = "train", seed: int = 0, size: int = 10000,
                 heldout_size: int = 200, config: dict[str, Any] | None = None,
                 system_prompt: str | None = None):
        rg = _reasoning_gym()
        from reasoning_gym.factory import DATASETS
        from reasoning_gym.utils import SYSTEM_PROMPTS

        if task not in DATASETS:
            close = difflib.get_close_matches(task, sorted(DATASETS), n=5)
            raise ValueError(f"env reasoning_gym:{task}: no such reasoning-gym dataset; "
                             f"{'similar: ' + ', '.join(close) if close else f'{len(DATASETS)} exist, e.g. basic_arithmetic, chain_sum, leg_counting'}")
        split = {"test": "heldout", "eval": "heldout", "held_out": "heldout"}.get(split, split)
        if split not in ("train", "heldout"):
            raise ValueError(f"env reasoning_gym:{task}: unknown split {split!r} (train or heldout)")
        if size < 1 or heldout_size < 1:
            raise ValueError(f"env reasoning_gym:{task}: size and heldout_size must be >= 1")
        try:
            self.train_ds = rg.create_dataset(task, **(config or {}), seed=seed, size=size)
            self.heldout_ds = rg.create_dataset(task, **(config or {}), seed=seed + size, size=heldout_size)
        except (TypeError, ValueError, AssertionError) as e:
            raise ValueError(f"env reasoning_gym:{task}: config {config!r} refused: {type(e).__name__}: {e}") from None
        self.name, self.split, self.size, self.heldout_size = task, split, size, heldout_size
        self.heldout_questions = {self.heldout_ds[j]["question"] for j in range(heldout_size)}
        self.system_prompt = SYSTEM_PROMPTS["default"] if system_prompt is None else system_prompt
        self.entry: dict[str, Any] | None = None
        self.task_id = ""

    def train_entry(self, k: int) -> tuple[int, dict[str, Any]]:
        """`(index, item)` of the first training item from index `k` on (wrapping around) whose
        question is not a held-out question.

        Raises:
            ValueError: every training question is a held-out question.
        """
        for step in range(self.size):
            i = (k + step) % self.size
            entry = self.train_ds[i]
            if entry["question"] not in self.heldout_questions:
                return i, entry
        raise ValueError(f"env reasoning_gym:{self.name}: every training question is also a held-out "
                         "question; give a larger task space (config) or another seed")

    def eval_tasks(self) -> list[dict[str, Any]]:
        """Reset kwargs of this split's items in order (held-out: all `heldout_size`; train: the
        first 1000 indices)."""
        n = self.heldout_size if self.split == "heldout" else min(self.size, 1000)
        return [{"options": {"task_index": i}} for i in range(n)]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        options = options or {}
        if self.split == "heldout":
            j = int(options.get("task_index", self.np_random.integers(self.heldout_size))) % self.heldout_size
            self.entry, self.task_id = self.heldout_ds[j], f"{self.name}/heldout/{j}"
        else:
            k = int(options.get("task_index", self.np_random.integers(self.size)))
            i, self.entry = self.train_entry(k % self.size)
            self.task_id = f"{self.name}/train/{i}"
        messages = [{"role": "system", "content": self.system_prompt},
                    {"role": "user", "content": self.entry["question"]}]
        return messages, {"task_id": self.task_id, "question": self.entry["question"]}

    def reference_answer(self) -> str | None:
        """`<answer>gold</answer>` for the current item (the warm start's target)."""
        return None if self.entry is None else f"<answer>{self.entry['answer']}</answer>"

    def step(self, action: str):
        if self.entry is None:
            raise RuntimeError("reasoning_gym: call reset() before step()")
        from reasoning_gym.utils import extract_answer

        answer = extract_answer(action)
        ds = self.heldout_ds if self.split == "heldout" else self.train_ds
        info: dict[str, Any] = {"answer": answer, "gold": self.entry["answer"], "task_id": self.task_id}
        try:
            score = float(ds.score_answer(answer, self.entry))
        except Exception as e:  # noqa: BLE001 - a scorer that fails on odd text is a recorded step
            score, info["error"] = 0.0, f"score_answer failed: {type(e).__name__}: {e}"
        info["score"] = score
        return [], score, True, False, info
