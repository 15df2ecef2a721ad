"""Reward models and safety classifiers: a transformers sequence-classification model from a
local path (`SequenceClassifier`) or the built-in lexicon baseline, as reward wrappers.

- `ClassifierReward`: the classifier's score is the reward (RLHF reward model).
- `SafetyReward`: the classifier's unsafe probability is a cost c, and the reward gets
  `-lam * c`, either with a fixed `lam` (`method="penalty"`) or with a Lagrange multiplier
  updated toward a cost budget (`method="lagrangian"`, constrained RL: PPO-Lagrangian of Ray et
  al. 2019, "Benchmarking Safe Exploration in Deep RL"; RCPO, Tessler et al. 2019):
  every `update_every` costs, `lam <- max(0, lam + lr * (mean(costs) - budget))`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from agentrl.rewards.base import Message, ScoringWrapper, check_choice
from agentrl.rewards.judge import render_conversation
from agentrl.rewards.lexicon import LexiconSafetyClassifier

Prompt = str | Sequence[Message]

_UNSAFE_NAMES = ("unsafe", "toxic", "harm", "offensive", "hate", "nsfw", "violat", "jailbreak", "injection")


class Classifier(Protocol):
    """What the wrappers need from a classifier (both `SequenceClassifier` and the lexicon)."""

    def score(self, prompts: Sequence[Prompt], responses: Sequence[str]) -> np.ndarray: ...

    def p_unsafe(self, prompts: Sequence[Prompt], responses: Sequence[str]) -> np.ndarray: ...


class SequenceClassifier:
    """A local `AutoModelForSequenceClassification` scoring (prompt, response) pairs.

    Args:
        path: local model directory (config, weights, tokenizer).
        label: reward-model label: an index or a name of `config.id2label` (case-insensitive);
            None = the last label. Ignored for a single-output (regression) model.
        unsafe_label: safety label (index or name); None = the first label whose name contains
            unsafe/toxic/harm/offensive/hate/nsfw/violat/jailbreak/injection, else index 1.
        input_format: "pair" (tokenizer text pair: conversation text, response), "chat" (the
            tokenizer's chat template over the conversation plus an assistant message), or
            "auto" (chat when the tokenizer has a template).
        max_length: tokens per pair (longer inputs are truncated; chat from the left).
        batch_size: pairs per forward pass.
        device: torch device of the model and its inputs (default CPU).

    Raises:
        FileNotFoundError: `path` is not a directory.
        ValueError: unknown label name, label index out of range, bad input_format.
    """

    def __init__(self, path: str | Path, *, label: int | str | None = None, unsafe_label: int | str | None = None,
                 input_format: str = "auto", max_length: int = 512, batch_size: int = 8,
                 device: Any = "cpu"):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if not Path(path).is_dir():
            raise FileNotFoundError(f"classifier model directory not found: {path}")
        check_choice("classifier.input_format", input_format, ("auto", "pair", "chat"))
        self.tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.model = AutoModelForSequenceClassification.from_pretrained(
            str(path), local_files_only=True, dtype=torch.float32).to(device).eval()
        self.device = torch.device(device)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token or self.tokenizer.unk_token
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.num_labels = int(self.model.config.num_labels)
        self.input_format = ("chat" if getattr(self.tokenizer, "chat_template", None) else "pair") \
            if input_format == "auto" else input_format
        if self.input_format == "chat":
            self.tokenizer.truncation_side = "left"
        self.max_length, self.batch_size = int(max_length), int(batch_size)
        names = {int(i): str(n) for i, n in (self.model.config.id2label or {}).items()}
        self.label = self._resolve(label, names, default=self.num_labels - 1)
        default_unsafe = next((i for i, n in sorted(names.items())
                               if any(u in n.lower() for u in _UNSAFE_NAMES)), min(1, self.num_labels - 1))
        self.unsafe_label = self._resolve(unsafe_label, names, default=default_unsafe)
        self._lock = threading.Lock()
        self.busy_s = 0.0
        """Seconds spent in forwards (`take_busy`)."""

    def _resolve(self, label: int | str | None, names: dict[int, str], default: int) -> int:
        if label is None:
            return default
        if isinstance(label, str) and not label.lstrip("-").isdigit():
            for i, n in names.items():
                if n.lower() == label.lower():
                    return i
            raise ValueError(f"classifier: no label named {label!r}; labels: {sorted(names.values())}")
        idx = int(label)
        if not 0 <= idx < self.num_labels:
            raise ValueError(f"classifier: label index {idx} out of range [0, {self.num_labels})")
        return idx

    def _encode(self, prompts: Sequence[Prompt], responses: Sequence[str]) -> Any:
        if self.input_format == "chat":
            texts = []
            for p, r in zip(prompts, responses, strict=True):
                msgs = [{"role": "user", "content": p}] if isinstance(p, str) else [dict(m) for m in p]
                texts.append(self.tokenizer.apply_chat_template(
                    msgs + [{"role": "assistant", "content": r}], tokenize=False))
            return self.tokenizer(texts, add_special_tokens=False, padding=True, truncation=True,
                                  max_length=self.max_length, return_tensors="pt")
        firsts = [p if isinstance(p, str) else render_conversation(p) for p in prompts]
        return self.tokenizer(firsts, list(responses), padding=True, truncation=True,
                              max_length=self.max_length, return_tensors="pt")

    def logits(self, prompts: Sequence[Prompt], responses: Sequence[str]) -> np.ndarray:
        """Raw logits, shape (B, num_labels), float64.

        Raises:
            ValueError: if the two sequences differ in length.
        """
        import torch

        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts for {len(responses)} responses")
        out = []
        with self._lock, torch.no_grad():
            t0 = time.perf_counter()
            for i in range(0, len(prompts), self.batch_size):
                enc = self._encode(prompts[i:i + self.batch_size], responses[i:i + self.batch_size])
                out.append(self.model(**enc.to(self.device)).logits.float().cpu().numpy())
            self.busy_s += time.perf_counter() - t0
        return np.concatenate(out).astype(np.float64) if out else np.zeros((0, self.num_labels))

    def score(self, prompts: Sequence[Prompt], responses: Sequence[str]) -> np.ndarray:
        """Reward-model score, shape (B,): the single output of a regression head, else the
        logit of `label`."""
        return score_from_logits(self.logits(prompts, responses), self.num_labels, self.label)

    def p_unsafe(self, prompts: Sequence[Prompt], responses: Sequence[str]) -> np.ndarray:
        """Unsafe probability, shape (B,): sigmoid of a single output, else the softmax
        probability of `unsafe_label`."""
        return p_unsafe_from_logits(self.logits(prompts, responses), self.num_labels, self.unsafe_label)

    def take_busy(self) -> float:
        """Seconds spent in forwards since the last call (then reset to 0)."""
        with self._lock:
            b, self.busy_s = self.busy_s, 0.0
        return b


def score_from_logits(lg: np.ndarray, num_labels: int, label: int) -> np.ndarray:
    """Reward-model score (B,) from logits (B, num_labels): the single output of a regression
    head, else the logit of `label`."""
    return lg[:, 0] if num_labels == 1 else lg[:, label]


def p_unsafe_from_logits(lg: np.ndarray, num_labels: int, unsafe_label: int) -> np.ndarray:
    """Unsafe probability (B,) from logits (B, num_labels): sigmoid of a single output, else the
    softmax probability of `unsafe_label`."""
    if num_labels == 1:
        return 1.0 / (1.0 + np.exp(-lg[:, 0]))
    z = lg - lg.max(axis=1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    return p[:, unsafe_label]


def load_classifier(model: str | Path | Classifier | None, *, shared: bool = False, **kwargs: Any) -> Classifier:
    """A classifier from a path (`SequenceClassifier(path, **kwargs)`), an object with the
    interface (returned as is), or None (the built-in `LexiconSafetyClassifier`).

    Args:
        shared: for a path, return the process-wide instance loaded with the same path and
            options (one copy of the weights for every env copy in the process).

    Raises:
        ValueError: kwargs given with None or an object (they would be ignored).
    """
    if model is None or not isinstance(model, (str, Path)):
        if kwargs:
            raise ValueError(f"classifier options {sorted(kwargs)} need a model path")
        return LexiconSafetyClassifier() if model is None else model
    if not shared:
        return SequenceClassifier(model, **kwargs)
    key = json.dumps([str(Path(model).resolve()), kwargs], sort_keys=True, default=str)
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = SequenceClassifier(model, **kwargs)
        return _SHARED[key]


_SHARED: dict[str, SequenceClassifier] = {}
_SHARED_LOCK = threading.Lock()


def _prompt_of(conversation: list[Message]) -> Prompt:
    return [m for m in conversation if m.get("role") != "system"] or conversation


class ClassifierReward(ScoringWrapper):
    """Reward from a reward model: the classifier's `score(conversation, answer)`.

    Component `classifier` in `info["reward_components"]`; `info["classifier_score"]` holds the
    raw score. See `ScoringWrapper` for `mode`, `weight`, `when`.

    Args:
        env: env to wrap.
        model: local model path, a classifier object, or None (the lexicon baseline's safe logit).
        mode, weight, when: see `ScoringWrapper` (defaults: replace, 1.0, end).
        **classifier_kwargs: for `SequenceClassifier` (label, input_format, max_length, ...).
    """

    def __init__(self, env: gym.Env, model: str | Path | Classifier | None = None, *, mode: str = "replace",
                 weight: float = 1.0, when: str = "end", **classifier_kwargs: Any):
        record = {"model": model if isinstance(model, (str, type(None))) else None, "mode": mode,
                  "weight": weight, "when": when, **classifier_kwargs}
        self.classifier = load_classifier(model, **classifier_kwargs)
        super().__init__(env, name="classifier", scorer=self._score, mode=mode, weight=weight, when=when,
                         record=record)

    def _score(self, conversation: list[Message], answer: str) -> tuple[float, dict[str, Any], str | None]:
        s = float(self.classifier.score([_prompt_of(conversation)], [answer])[0])
        return s, {"classifier_score": s}, None


class LagrangeMultiplier:
    """A Lagrange multiplier for a cost constraint E[c] <= budget (thread-safe, shareable).

    Costs are buffered; each time `update_every` have arrived,
    `lam <- max(0, lam + lr * (mean(buffer) - budget))` (projected gradient ascent on the dual,
    Ray et al. 2019) and the buffer empties.

    Raises:
        ValueError: negative lam/lr/budget or update_every < 1.
    """

    def __init__(self, lam: float = 1.0, lr: float = 0.05, budget: float = 0.05, update_every: int = 16):
        if lam < 0 or lr < 0 or budget < 0 or update_every < 1:
            raise ValueError("lagrangian: lam >= 0, lr >= 0, budget >= 0, update_every >= 1 required")
        self.initial, self.lr, self.budget, self.update_every = float(lam), float(lr), float(budget), int(update_every)
        self.value = float(lam)
        self.updates = 0
        self._buffer: list[float] = []
        self._lock = threading.Lock()

    def observe(self, cost: float) -> float:
        """Add one cost; returns the multiplier after any update this caused."""
        with self._lock:
            self._buffer.append(float(cost))
            if len(self._buffer) >= self.update_every:
                mean = sum(self._buffer) / len(self._buffer)
                self.value = max(0.0, self.value + self.lr * (mean - self.budget))
                self.updates += 1
                self._buffer.clear()
            return self.value

    def reset(self) -> None:
        """Back to the initial value with an empty buffer."""
        with self._lock:
            self.value, self.updates = self.initial, 0
            self._buffer.clear()

    def state_dict(self) -> dict[str, Any]:
        """`value`, `updates` and the costs buffered since the last update (JSON scalars)."""
        with self._lock:
            return {"value": self.value, "updates": self.updates, "buffer": list(self._buffer)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`'s multiplier, update count and buffer."""
        with self._lock:
            self.value, self.updates = float(state["value"]), int(state["updates"])
            self._buffer[:] = [float(c) for c in state["buffer"]]


class SafetyReward(ScoringWrapper):
    """Safety penalty: reward = env reward - lam * cost, cost from the classifier's p_unsafe.

    Args:
        env: env to wrap.
        classifier: local model path, a classifier object, or None (the lexicon baseline).
        method: "penalty" (fixed `lam`) or "lagrangian" (`lam` updated toward `budget`).
        lam: penalty weight (penalty) or the multiplier's initial value (lagrangian).
        lr, budget, update_every: multiplier update (lagrangian; see `LagrangeMultiplier`).
        cost: "prob" (c = p_unsafe) or "binary" (c = 1 if p_unsafe >= threshold else 0).
        threshold: for `cost="binary"`.
        when: "step" (every answer, default) or "end".
        multiplier: a shared `LagrangeMultiplier` (several envs, one constraint); default: own.
        reset_state_on_seed: a seeded `reset(seed=...)` restores the wrapper's own multiplier
            (same seed and actions -> same rewards, as Gymnasium's checker demands). Never
            applies to a shared `multiplier`.
        **classifier_kwargs: for `SequenceClassifier` (unsafe_label, input_format, ...).

    Info: `p_unsafe`, `cost`, `lagrange_multiplier` (the value used for this step), and
    component `safety` = -lam * cost.

    Raises:
        ValueError: unknown method/cost, bad multiplier settings.
    """

    def __init__(self, env: gym.Env, classifier: str | Path | Classifier | None = None, *,
                 method: str = "penalty", lam: float = 1.0, lr: float = 0.05, budget: float = 0.05,
                 update_every: int = 16, cost: str = "prob", threshold: float = 0.5, when: str = "step",
                 multiplier: LagrangeMultiplier | None = None, reset_state_on_seed: bool = True,
                 **classifier_kwargs: Any):
        self.method = check_choice("safety.method", method, ("penalty", "lagrangian"))
        self.cost_kind = check_choice("safety.cost", cost, ("prob", "binary"))
        self.threshold = float(threshold)
        self.lam = float(lam)
        self._own_multiplier = multiplier is None
        self.multiplier = multiplier or LagrangeMultiplier(lam, lr, budget, update_every)
        self.reset_state_on_seed = bool(reset_state_on_seed)
        self.classifier = load_classifier(classifier, **classifier_kwargs)
        record = {"classifier": classifier if isinstance(classifier, (str, type(None))) else None,
                  "method": method, "lam": lam, "lr": lr, "budget": budget, "update_every": update_every,
                  "cost": cost, "threshold": threshold, "when": when,
                  "reset_state_on_seed": reset_state_on_seed, **classifier_kwargs}
        super().__init__(env, name="safety", scorer=self._score, mode="add", weight=1.0, when=when, record=record)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if seed is not None and self.reset_state_on_seed and self._own_multiplier:
            self.multiplier.reset()
        return super().reset(seed=seed, options=options)

    def _score(self, conversation: list[Message], answer: str) -> tuple[float, dict[str, Any], str | None]:
        p = float(self.classifier.p_unsafe([_prompt_of(conversation)], [answer])[0])
        c = p if self.cost_kind == "prob" else float(p >= self.threshold)
        lam = self.lam if self.method == "penalty" else self.multiplier.value
        if self.method == "lagrangian":
            self.multiplier.observe(c)
        return -lam * c, {"p_unsafe": p, "cost": c, "lagrange_multiplier": lam}, None
