"""The data contract between rollout and learner: `Turn`, `Trajectory`, and batch collation.
This module imports nothing of agentrl.

A trajectory is one episode as the policy saw it: the exact token ids fed to and produced by
the engine (contract 1 of docs/design.md), a `loss_mask` that is 1 only on sampled tokens
(contract 2), the sampler's logprobs (contract 3), and per-turn rewards placed on each turn's
last sampled token (contract 4).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Message = dict[str, Any]

def is_image(x: Any) -> bool:
    """Whether `x` is an image an observation may carry: a PIL image, or a numpy array of
    shape `(H, W, 3)` (H, W >= 1), dtype uint8 (RGB, 0-255)."""
    if isinstance(x, np.ndarray):
        return x.dtype == np.uint8 and x.ndim == 3 and x.shape[2] == 3 and x.shape[0] > 0 and x.shape[1] > 0
    try:
        from PIL import Image
    except ImportError:  # pillow missing: nothing can be a PIL image
        return False
    return isinstance(x, Image.Image)

def image_size(x: Any) -> tuple[int, int]:
    """`(width, height)` of image `x` (a PIL image or an `(H, W, 3)` array)."""
    if isinstance(x, np.ndarray):
        return int(x.shape[1]), int(x.shape[0])
    w, h = x.size
    return int(w), int(h)


@dataclass
class Turn:
    """One agent turn inside a trajectory.

    `start`/`end` index `Trajectory.token_ids` (end exclusive): the span the sampler produced,
    its end-of-turn token included. `reward` is the env's reward for this turn.
    """

    start: int
    end: int
    reward: float = 0.0
    text: str = ""
    finish_reason: str = "stop"  # "stop" | "length"
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Trajectory:
    """One episode. All per-token lists have the same length (tokens).

    Attributes:
        token_ids: every token id of the episode, prompt and observations included, in order.
        loss_mask: 1 on agent-sampled tokens (end-of-turn included), 0 elsewhere.
        sampler_logprobs: log pi_old(token) as reported by the engine; 0 where loss_mask is 0.
        turns: the agent turns, in order.
        messages: the transcript as chat messages (for inspection; never re-tokenized).
        terminated / truncated: as in Gymnasium (task ended vs a limit was hit).
        group_id: GRPO group (episodes of the same task share it).
        task_id: id of the task the episode ran.
        policy_version: version of the weights that sampled it.
        info: env infos and flags (`error`, `verdict`, `reward_components`, ...).
        timings: seconds per stage (`generate`, `env`).
        bootstrap_value: V(s_T) for a truncated episode when the learner supplies it (PPO).
        vision: None for a text episode; with images (`append_images`): `pixel_values`
            (float32 tensor, patches of every image in order x patch features), `image_grid_thw`
            (int64 tensor, images x 3), `image_spans` (`[start, end)` token positions of each
            image's placeholder ids, all context: loss_mask 0) and `images` (the images, `(H, W,
            3)` uint8 RGB arrays, when the renderer gave them: an engine with its own image
            processor, vLLM, takes these).
    """

    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    sampler_logprobs: list[float] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    terminated: bool = False
    truncated: bool = False
    group_id: int = 0
    task_id: str = ""
    policy_version: int = 0
    info: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    vision: dict[str, Any] | None = None

    # -- building -------------------------------------------------------------------------
    def append_context(self, ids: list[int]) -> None:
        """Append tokens the policy did not sample (prompt, observation, template glue)."""
        self.token_ids.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        self.sampler_logprobs.extend([0.0] * len(ids))

    def append_sampled(self, ids: list[int], logprobs: list[float], **turn_kw: Any) -> Turn:
        """Append one sampled turn (tokens + sampler logprobs) and return its `Turn`.

        Raises:
            ValueError: if `ids` and `logprobs` differ in length.
        """
        if len(ids) != len(logprobs):
            raise ValueError(f"{len(ids)} sampled ids but {len(logprobs)} logprobs")
        turn = Turn(start=len(self.token_ids), end=len(self.token_ids) + len(ids), **turn_kw)
        self.token_ids.extend(ids)
        self.loss_mask.extend([1] * len(ids))
        self.sampler_logprobs.extend(logprobs)
        self.turns.append(turn)
        return turn

    def append_images(self, start: int, ids: list[int], pixels: dict[str, Any], image_token_id: int) -> None:
        """Record the images of context `ids` just appended at position `start`: their pixel
        inputs (`agentrl.models.vlm.encode_images`, plus `images` when given) and the spans of their
        placeholder runs.

        Raises:
            ValueError: the runs of `image_token_id` in `ids` are not one per image, or
                `ids` is not what `token_ids` holds at `start`.
        """
        import torch

        if self.token_ids[start:start + len(ids)] != list(ids):
            raise ValueError("append_images: ids are not the context appended at start")
        grid = pixels["image_grid_thw"]
        if len(grid) == 0:
            return
        spans, k = [], 0
        while k < len(ids):
            if ids[k] == image_token_id:
                j = k
                while j < len(ids) and ids[j] == image_token_id:
                    j += 1
                spans.append([start + k, start + j])
                k = j
            else:
                k += 1
        if len(spans) != len(grid):
            raise ValueError(f"{len(spans)} placeholder runs for {len(grid)} images")
        v = self.vision or {"pixel_values": None, "image_grid_thw": None, "image_spans": [], "images": []}
        v["images"] = list(v.get("images", [])) + list(pixels.get("images", []))
        pv = pixels["pixel_values"]
        v["pixel_values"] = pv if v["pixel_values"] is None else torch.cat([v["pixel_values"], pv])
        v["image_grid_thw"] = grid if v["image_grid_thw"] is None else torch.cat([v["image_grid_thw"], grid])
        v["image_spans"] = v["image_spans"] + spans
        self.vision = v

    # -- reading --------------------------------------------------------------------------
    @property
    def episode_return(self) -> float:
        """Sum of the per-turn rewards (NaN if any turn's reward is NaN)."""
        return float(sum(t.reward for t in self.turns))

    @property
    def num_sampled(self) -> int:
        """Number of tokens the policy sampled (== sum of loss_mask)."""
        return int(sum(self.loss_mask))

    def token_rewards(self) -> list[float]:
        """Per-token rewards: each turn's reward on that turn's last sampled token, else 0.

        A turn with no sampled token (empty completion) cannot carry a reward; its reward is
        recorded in `info["dropped_reward"]` instead (case A9).
        """
        out = [0.0] * len(self.token_ids)
        dropped = 0.0
        for t in self.turns:
            if t.end > t.start:
                out[t.end - 1] += t.reward
            else:
                dropped += t.reward
        if dropped:
            self.info["dropped_reward"] = dropped
        return out

    def validate(self) -> None:
        """Check the per-token lists agree and that an episode with turns trains on something.

        Raises:
            ValueError: lengths differ, or there are agent turns but `loss_mask` sums to 0
                (case M3: such a trajectory is never silently trained).
        """
        n = len(self.token_ids)
        if len(self.loss_mask) != n or len(self.sampler_logprobs) != n:
            raise ValueError(
                f"token_ids ({n}), loss_mask ({len(self.loss_mask)}) and sampler_logprobs "
                f"({len(self.sampler_logprobs)}) must have the same length"
            )
        if self.turns and any(t.end > t.start for t in self.turns) and self.num_sampled == 0:
            raise ValueError("trajectory has agent turns but loss_mask sums to 0")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (for rollouts/*.jsonl and eval results). Without images it
        has no `vision` key; with them, `vision` keeps `image_grid_thw` and `image_spans` (not
        the pixels) and the messages' images become `{"type": "image", "image": "<image
        HxW>"}` placeholders."""
        vision, messages = self.vision, self.messages
        if vision is None:
            d = dataclasses.asdict(self)
            d.pop("vision")
            return d
        d = dataclasses.asdict(dataclasses.replace(self, vision=None, messages=[]))
        d["messages"] = [json_message(m) for m in messages]
        d["vision"] = {"image_grid_thw": vision["image_grid_thw"].tolist(),
                       "image_spans": [list(s) for s in vision["image_spans"]]}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        d = dict(d)
        d["turns"] = [Turn(**t) for t in d.get("turns", [])]
        return cls(**d)


def json_message(m: dict[str, Any]) -> dict[str, Any]:
    """A JSON-ready copy of chat message `m`: each image part's image (a PIL image or an (H, W, 3)
    array) replaced by the text `<image HxW>` (H, W in pixels); other parts and str content as
    they are. Used by `Trajectory.to_dict` and the eval harness's `results.jsonl` rows."""
    if not isinstance(m.get("content"), list):
        return dict(m)
    parts = []
    for p in m["content"]:
        if isinstance(p, dict) and p.get("type") == "image":
            w, h = image_size(p.get("image"))
            parts.append({"type": "image", "image": f"<image {h}x{w}>"})
        else:
            parts.append(dict(p))
    return {**m, "content": parts}


def collate(trajs: list[Trajectory], pad_id: int, *, pad_to: int | None = None) -> dict[str, Any]:
    """Right-pad trajectories into `(B, T)` tensors for the learner.

    Args:
        trajs: B trajectories.
        pad_id: token id used for padding (its mask is 0, so its value never matters).
        pad_to: minimum T (tokens); T is max(len) otherwise.

    Returns:
        dict with `input_ids` (B,T) long, `attention_mask` (B,T) long, `loss_mask` (B,T) float,
        `sampler_logprobs` (B,T) float, `token_rewards` (B,T) float, `lengths` (B,) long;
        plus `vision` (a list of B `Trajectory.vision`, None for a row without images) when
        any trajectory has images. Padding has attention 0 and loss_mask 0, so it never adds
        to a loss or a return.
    """
    import torch

    T = max([len(t.token_ids) for t in trajs] + [pad_to or 1])
    B = len(trajs)
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)
    attention = torch.zeros((B, T), dtype=torch.long)
    loss_mask = torch.zeros((B, T), dtype=torch.float32)
    slp = torch.zeros((B, T), dtype=torch.float32)
    rew = torch.zeros((B, T), dtype=torch.float32)
    for i, t in enumerate(trajs):
        n = len(t.token_ids)
        input_ids[i, :n] = torch.tensor(t.token_ids, dtype=torch.long)
        attention[i, :n] = 1
        loss_mask[i, :n] = torch.tensor(t.loss_mask, dtype=torch.float32)
        slp[i, :n] = torch.tensor(t.sampler_logprobs, dtype=torch.float32)
        rew[i, :n] = torch.tensor(t.token_rewards(), dtype=torch.float32)
    lengths = torch.tensor([len(t.token_ids) for t in trajs], dtype=torch.long)
    out: dict[str, Any] = {
        "input_ids": input_ids,
        "attention_mask": attention,
        "loss_mask": loss_mask,
        "sampler_logprobs": slp,
        "token_rewards": rew,
        "lengths": lengths,
    }
    if any(t.vision is not None for t in trajs):  # a text batch has no "vision" key
        out["vision"] = [t.vision for t in trajs]
    return out
