"""`visual_count`: look at a procedurally drawn image and answer a question about it.

The image is a `grid` x `grid` board of `cell`-pixel cells on a white background; a few cells
hold a coloured shape (square, circle or triangle; red, green, blue or yellow), drawn with
numpy only, so every pixel is the same on every machine. The question is one of:
- `count`: "How many red squares are in the image?" — the answer is a number (0 allowed);
- `where`: "Which cell holds the circle?" (the board has exactly one circle) — the answer is
  `row,column`, 1-based, row 1 at the top;
- `colour` (not drawn by default; `questions=["colour"]`): "What colour is the circle?" (exactly
  one circle) — the answer is a colour name. It needs what is in the image but not where:
  the easiest of the three for a tiny model.

The observation is one user message whose content is `[image part, text part]` (the image a PIL
image, or with `image_format="array"` an `(H, W, 3)` uint8 array). Reward 1.0 for the right
answer, else 0.0. On a wrong answer with attempts left (`max_turns` > 1) the env replies
"Wrong, look again." (with the image again when `feedback_image`) and the agent retries. A right
answer is `terminated`; with `max_turns=1` the single attempt always `terminates`; the last of
`max_turns` > 1 wrong attempts is `truncated` (as `code_sandbox`).

Tasks: task `k` (an int, `options={"task": k}`) is drawn from `numpy.random.default_rng(k)`.
Splits by task seed: `k` is held out when `split_fraction("visual_count/k") < HELDOUT_FRACTION`
(SHA-256, the same rule as code_sandbox's), so train and held-out tasks never overlap; `reset`
draws task seeds of its split with `self.np_random`. Nothing the agent writes makes `step`
raise: an answer that does not parse is a wrong answer, with the reason in `info["error"]`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentrl.env.base import TextEnv
from agentrl_envs.code_datasets import normalize_split, split_fraction

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30), "green": (30, 160, 50), "blue": (30, 60, 220), "yellow": (230, 200, 20)}
"""Colour names and their RGB values (0-255)."""
SHAPES = ("square", "circle", "triangle")
QUESTIONS = ("count", "where")
"""The question kinds drawn by default."""
KINDS = ("count", "where", "colour")
"""Every question kind (`questions=` may pick any of them)."""
HELDOUT_FRACTION = 0.2
"""Share of task seeds held out for evaluation."""
FEEDBACK = "Wrong, look again."
TASK_SEEDS = 2**31
"""Task seeds are drawn from [0, TASK_SEEDS)."""


@dataclass(frozen=True)
class Item:
    """One shape on the board: its cell (0-based row, column), colour name and shape name."""

    row: int
    col: int
    colour: str
    shape: str


@dataclass(frozen=True)
class Task:
    """A board and its question. `answer` is the canonical answer text ("3", "2,1")."""

    seed: int
    items: tuple[Item, ...]
    kind: str
    question: str
    answer: str


def make_task(seed: int, *, grid: int = 3, max_items: int = 5,
              questions: tuple[str, ...] | list[str] = QUESTIONS) -> Task:
    """The task of task seed `seed`: 2..`max_items` shapes in distinct cells of a `grid` x
    `grid` board, and a question of a kind in `questions` (drawn from the same generator).

    `count` asks for a (colour, shape) pair that is on the board 3 times in 4, else a random
    pair (answer 0 possible). `where` and `colour` redraw the shapes so that exactly one is a
    circle.

    Raises:
        ValueError: `grid` < 2, `max_items` not in [2, grid**2], or an unknown question kind.
    """
    if grid < 2:
        raise ValueError(f"grid must be >= 2, got {grid}")
    if not 2 <= max_items <= grid * grid:
        raise ValueError(f"max_items must be in [2, {grid * grid}], got {max_items}")
    bad = [q for q in questions if q not in KINDS]
    if bad or not questions:
        raise ValueError(f"questions: unknown kinds {bad} (allowed: {', '.join(KINDS)})")
    rng = np.random.default_rng(seed)
    kind = str(questions[int(rng.integers(len(questions)))])
    n = int(rng.integers(2, max_items + 1))
    cells = rng.choice(grid * grid, size=n, replace=False)
    colours = list(COLOURS)
    shapes = [str(SHAPES[int(rng.integers(len(SHAPES)))]) for _ in range(n)]
    if kind in ("where", "colour"):  # exactly one circle
        circle = int(rng.integers(n))
        others = [s for s in SHAPES if s != "circle"]
        shapes = ["circle" if i == circle else str(others[int(rng.integers(len(others)))]) for i in range(n)]
    items = tuple(Item(int(c) // grid, int(c) % grid, colours[int(rng.integers(len(colours)))], s)
                  for c, s in zip(cells, shapes))
    if kind == "count":
        if rng.random() < 0.75:
            pick = items[int(rng.integers(n))]
            colour, shape = pick.colour, pick.shape
        else:
            colour, shape = colours[int(rng.integers(len(colours)))], str(SHAPES[int(rng.integers(len(SHAPES)))])
        count = sum(1 for it in items if it.colour == colour and it.shape == shape)
        question = f"How many {colour} {shape}s are in the image? Answer with a number."
        return Task(seed, items, kind, question, str(count))
    circle_item = next(it for it in items if it.shape == "circle")
    if kind == "colour":
        return Task(seed, items, kind, "What colour is the circle? Answer with a colour name.",
                    circle_item.colour)
    question = ("Which cell holds the circle? Answer as row,column (1-based, row 1 at the top, "
                "column 1 at the left).")
    return Task(seed, items, kind, question, f"{circle_item.row + 1},{circle_item.col + 1}")


def draw(items: tuple[Item, ...] | list[Item], *, grid: int = 3, cell: int = 28) -> np.ndarray:
    """The board image: `(grid * cell, grid * cell, 3)` uint8, white, with thin grey grid lines
    and each item's shape filled in its colour inside its cell (a margin of `cell // 6` px).

    Shapes: square = the inner box; circle = pixels within the inner box's half-width of the
    cell centre; triangle = apex at the top middle, base along the inner box's bottom.

    Raises:
        ValueError: `cell` < 8, or an item outside the grid.
    """
    if cell < 8:
        raise ValueError(f"cell must be >= 8 pixels, got {cell}")
    size = grid * cell
    img = np.full((size, size, 3), 255, np.uint8)
    img[::cell, :] = 200
    img[:, ::cell] = 200
    m = cell // 6
    yy, xx = np.mgrid[0:cell, 0:cell]
    inner = (yy >= m) & (yy < cell - m) & (xx >= m) & (xx < cell - m)
    c = (cell - 1) / 2
    half = (cell - 2 * m) / 2
    masks = {
        "square": inner,
        "circle": (yy - c) ** 2 + (xx - c) ** 2 <= half**2,
        "triangle": inner & (np.abs(xx - c) <= (yy - m + 1) / 2),
    }
    for it in items:
        if not (0 <= it.row < grid and 0 <= it.col < grid):
            raise ValueError(f"item {it} is outside the {grid}x{grid} grid")
        block = img[it.row * cell:(it.row + 1) * cell, it.col * cell:(it.col + 1) * cell]
        block[masks[it.shape]] = COLOURS[it.colour]
    return img


_WHERE = re.compile(r"(\d+)(?:\s*,\s*|\s+)(?:col(?:umn)?\s*)?(\d+)", re.I)
_NUMBER = re.compile(r"-?\d+")
_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve".split())}


def parse_answer(kind: str, text: str) -> str | None:
    """The canonical answer in `text`, or None when there is none: for `count`, the first
    integer (digits, or a number word zero..twelve) as a str; for `where`, the first
    `r,c` / `r c` / `row r column c` pair as `"r,c"`; for `colour`, the first colour name of
    `COLOURS` (as a word, any case)."""
    if kind == "count":
        m = _NUMBER.search(text)
        words = [_WORDS[w] for w in re.findall(r"[a-z]+", text.lower()) if w in _WORDS]
        if m:
            return str(int(m.group()))
        return str(words[0]) if words else None
    if kind == "colour":
        names = [w for w in re.findall(r"[a-z]+", text.lower()) if w in COLOURS]
        return names[0] if names else None
    m = _WHERE.search(text)
    return f"{int(m.group(1))},{int(m.group(2))}" if m else None


class VisualCountEnv(TextEnv):
    """Answer a question about a drawn board of coloured shapes (see the module docstring).

    Args:
        split: `all` (default), `train` or `heldout` (`test`, `eval` are aliases): which task
            seeds `reset` draws.
        grid, cell: board size in cells, cell size in pixels (28 = one Qwen2-VL merged patch).
        max_items: most shapes on a board (at least 2).
        questions: the question kinds drawn (`count`, `where`, `colour`; default the first two).
        max_turns: attempts per task (the env's own; `env.max_turns` sets it).
        feedback_image: send the image again with the "wrong, look again" feedback.
        image_format: `pil` (a PIL RGB image) or `array` (an `(H, W, 3)` uint8 numpy array).
        eval_size: how many tasks `eval_tasks()` lists.

    Raises:
        ValueError: a bad split, size, question kind, image format or `max_turns` < 1.
    """

    observes_images = True
    """Its observations carry images: a run without `model.path` gets `model.vision=true`
    (`agentrl.run`)."""

    def __init__(self, split: str = "all", *, grid: int = 3, cell: int = 28, max_items: int = 5,
                 questions: tuple[str, ...] | list[str] = QUESTIONS, max_turns: int = 1,
                 feedback_image: bool = False, image_format: str = "pil", eval_size: int = 64):
        self.split = normalize_split(split)
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if image_format not in ("pil", "array"):
            raise ValueError(f"image_format must be 'pil' or 'array', got {image_format!r}")
        if cell < 8:
            raise ValueError(f"cell must be >= 8 pixels, got {cell}")
        make_task(0, grid=grid, max_items=max_items, questions=questions)  # validates the rest
        self.grid, self.cell, self.max_items = grid, cell, max_items
        self.questions = tuple(questions)
        self.max_turns = max_turns
        self.feedback_image = feedback_image
        self.image_format = image_format
        self.eval_size = eval_size
        self.task: Task | None = None
        self.attempts = 0

    def in_split(self, seed: int) -> bool:
        """Whether task seed `seed` belongs to this env's split."""
        if self.split == "all":
            return True
        held = split_fraction(f"visual_count/{seed}") < HELDOUT_FRACTION
        return held == (self.split == "heldout")

    def eval_tasks(self) -> list[dict[str, Any]]:
        """Reset kwargs of the first `eval_size` task seeds (0, 1, 2, ...) of this split."""
        out: list[dict[str, Any]] = []
        k = 0
        while len(out) < self.eval_size:
            if self.in_split(k):
                out.append({"options": {"task": k}})
            k += 1
        return out

    def image(self) -> Any:
        """The current task's board, as `image_format` says."""
        assert self.task is not None
        arr = draw(self.task.items, grid=self.grid, cell=self.cell)
        if self.image_format == "array":
            return arr
        from PIL import Image

        return Image.fromarray(arr)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        options = options or {}
        if options.get("task") is not None:
            k = options["task"]
            if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= int(k) < TASK_SEEDS:
                raise ValueError(f"options['task'] must be a task seed in [0, {TASK_SEEDS}), got {k!r}")
            k = int(k)
            if not self.in_split(k):
                raise ValueError(f"task {k} is not in split {self.split!r}")
        else:
            k = int(self.np_random.integers(TASK_SEEDS))
            while not self.in_split(k):
                k = int(self.np_random.integers(TASK_SEEDS))
        self.task = make_task(k, grid=self.grid, max_items=self.max_items, questions=self.questions)
        self.attempts = 0
        obs = [{"role": "user", "content": [{"type": "image", "image": self.image()},
                                            {"type": "text", "text": self.task.question}]}]
        return obs, {"task_id": f"visual_count/{k}", "question_kind": self.task.kind}

    def reference_answer(self) -> str | None:
        """The canonical answer of the current task (for a supervised warm start)."""
        return None if self.task is None else self.task.answer

    def corpus_texts(self) -> list[str]:
        """Texts the env may send besides the opening question (for the tokenizer)."""
        return [FEEDBACK]

    def step(self, action: str):
        if self.task is None:
            raise RuntimeError("VisualCountEnv: call reset() before step()")
        self.attempts += 1
        info: dict[str, Any] = {"task_id": f"visual_count/{self.task.seed}", "answer": self.task.answer}
        if not isinstance(action, str):
            info["error"] = f"action must be a str, got {type(action).__name__}"
            given = None
        else:
            given = parse_answer(self.task.kind, action)
            if given is None:
                want = {"count": "number", "where": "row,column", "colour": "colour name"}[self.task.kind]
                info["error"] = f"no {want} in the answer"
        right = given == self.task.answer
        info["success"] = right
        info["attempts"] = self.attempts
        if right or self.max_turns == 1:
            return [], float(right), True, False, info
        if self.attempts >= self.max_turns:
            return [], 0.0, False, True, info
        parts: list[dict[str, Any]] = [{"type": "text", "text": FEEDBACK}]
        if self.feedback_image:
            parts.append({"type": "image", "image": self.image()})
        return [{"role": "user", "content": parts}], 0.0, False, False, info
