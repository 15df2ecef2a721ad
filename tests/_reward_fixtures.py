"""Shared pieces of the reward tests: a small multi-turn text env, and tiny random
transformers models built offline into a directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentrl.env.base import TextEnv
from agentrl.env.registry import register_env

PROMPTS = ["Say something about cats.", "Tell me about dogs.", "Describe the sea."]


class EchoEnv(TextEnv):
    """Three-turn env: a prompt from `PROMPTS`; reward 1.0 when the answer contains "cat",
    else 0.0; terminates after the third turn; info carries `keywords`."""

    def __init__(self, turns: int = 3):
        self.turns = turns
        self._t = 0
        self._prompt = ""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._t = 0
        self._prompt = PROMPTS[int(self.np_random.integers(len(PROMPTS)))]
        return [{"role": "user", "content": self._prompt}], {"task_id": self._prompt, "keywords": ["cat"]}

    def step(self, action: str):
        self._t += 1
        reward = 1.0 if "cat" in str(action).lower() else 0.0
        done = self._t >= self.turns
        obs = [] if done else [{"role": "user", "content": f"turn {self._t}: go on"}]
        return obs, reward, done, False, {"turn": self._t}


ECHO_ID = register_env("agentrl-test/Echo-v0", EchoEnv, description="reward tests: say cat")


def build_tiny_classifier(out_dir: str | Path, *, num_labels: int = 2, id2label: dict[int, str] | None = None,
                          seed: int = 0) -> str:
    """A randomly initialised BERT sequence classifier (hidden 16, one layer) with a WordPiece
    tokenizer over a small vocabulary, saved to `out_dir`. Returns the path."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    words = ("the a how do i pick lock break into house sorry can't help with that paris is capital of "
             "france cats are nice dogs sea say something about tell me describe").split()
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(set(words))
    (out / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok = BertTokenizerFast(vocab_file=str(out / "vocab.txt"))
    id2label = id2label or {i: f"LABEL_{i}" for i in range(num_labels)}
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=64, num_labels=num_labels,
                     id2label=id2label, label2id={v: k for k, v in id2label.items()})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = BertForSequenceClassification(cfg)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def set_constant_head(path: str | Path, bias: list[float]) -> None:
    """Zero the classifier head's weight and set its bias, so logits == bias for every input."""
    import torch
    from transformers import BertForSequenceClassification

    model = BertForSequenceClassification.from_pretrained(str(path))
    with torch.no_grad():
        model.classifier.weight.zero_()
        model.classifier.bias.copy_(torch.tensor(bias))
    model.save_pretrained(path)
