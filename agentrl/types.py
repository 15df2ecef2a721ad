"""The data contract between rollout and learner: `Turn`, `Trajectory`, the collated `Batch`,
and the Protocols the loop holds its parts by (`Collector`, `Learner`). This module imports
nothing of agentrl. The engine's contract, `Engine`, lives beside its `SamplingParams` and
`Completion` in `agentrl.rollout.engines.base`.

A trajectory is one episode as the policy saw it: the exact token ids fed to and produced by
the engine (contract 1 of docs/design.md), a `loss_mask` that is 1 only on sampled tokens
(contract 2), the sampler's logprobs (contract 3), and per-turn rewards placed on each turn's
last sampled token (contract 4).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

import numpy as np

if TYPE_CHECKING:
    import torch

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
        turn_prompts: with `rollout.history=template`, the prompt ids each turn was sampled from
            (the chat template's rendering of the messages before it); empty with `exact`,
            where every turn was sampled from `token_ids` up to its start.
        token_versions: per token, the policy version that sampled it (-1 on context tokens);
            kept by `append_context` / `append_sampled` while it has one entry per token, and
            empty for a trajectory built another way (every sampled token then counts as
            `policy_version`). With partial rollouts (`rollout.partial`) a turn's tokens may
            come from several versions, non-decreasing along the episode.
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
    turn_prompts: list[list[int]] = field(default_factory=list)
    token_versions: list[int] = field(default_factory=list)

    # -- building -------------------------------------------------------------------------
    def append_context(self, ids: list[int]) -> None:
        """Append tokens the policy did not sample (prompt, observation, template glue)."""
        if len(self.token_versions) == len(self.token_ids):
            self.token_versions.extend([-1] * len(ids))
        self.token_ids.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        self.sampler_logprobs.extend([0.0] * len(ids))

    def append_sampled(self, ids: list[int], logprobs: list[float], versions: list[int] | None = None,
                       **turn_kw: Any) -> Turn:
        """Append one sampled turn (tokens + sampler logprobs, and the policy version of each
        token: None means `policy_version` for all) and return its `Turn`.

        Raises:
            ValueError: if `ids` and `logprobs` (or `versions`) differ in length.
        """
        if len(ids) != len(logprobs):
            raise ValueError(f"{len(ids)} sampled ids but {len(logprobs)} logprobs")
        if versions is not None and len(versions) != len(ids):
            raise ValueError(f"{len(ids)} sampled ids but {len(versions)} versions")
        if len(self.token_versions) == len(self.token_ids):
            self.token_versions.extend([self.policy_version] * len(ids) if versions is None else versions)
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

    def sampled_versions(self) -> list[int]:
        """The policy version of each sampled token (`loss_mask` 1), in order: from
        `token_versions`, or `policy_version` for each when it is not kept."""
        if self.token_versions and len(self.token_versions) == len(self.token_ids):
            return [v for v, m in zip(self.token_versions, self.loss_mask) if m]
        return [self.policy_version] * self.num_sampled

    @property
    def oldest_version(self) -> int:
        """The oldest policy version that sampled a token of the episode (`policy_version`
        when it sampled none): what `train.max_staleness` bounds."""
        return min(self.sampled_versions(), default=self.policy_version)

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
        if self.token_versions and len(self.token_versions) != n:
            raise ValueError(f"token_ids ({n}) and token_versions ({len(self.token_versions)}) must "
                             "have the same length (or token_versions be empty)")
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


def episode_errors(tr: Trajectory) -> list[str]:
    """The error messages recorded on episode `tr`, each once: every step's `info["error"]`
    (kept in `tr.info["errors"]`: an env's exception or time-out, a tool call's error, an env's
    reason for a failed attempt such as code_sandbox's failing assertion), then the episode's
    own `tr.info["error"]` when it is not one of them (a failed reset, a bad observation, the
    user's agent failing: it raised, returned no reward, was refused, timed out). An episode
    ended in an error of the env, a tool or the agent (contract 7) has at least one; `env/errors`
    (training) and `errors` (evaluation) count the episodes that have any."""
    errors = [str(e) for e in tr.info.get("errors") or [] if e is not None]
    own = tr.info.get("error")
    if own is not None and str(own) not in errors:
        errors.append(str(own))
    return errors


class Batch(TypedDict, total=False):
    """The collated batch of B trajectories, right-padded to T tokens, that goes from `collate`
    to the algorithms and the learner: a plain dict at runtime, its keys named here once.

    Row b is trajectory b; column t its t-th token. Every (B, T) tensor is 0 on padding
    (`attention_mask` 0) and, unless said otherwise, off the agent's tokens (`loss_mask` 0).
    Logprobs are natural logs of `softmax(logits / temperature)` at the sampled token. Keys are
    added by stage: `collate`, then the loop's batch building, the algorithm's `prepare` and
    `advantages`, then the learner's `update` (per micro-batch for `max_len`).
    """

    # -- collate (agentrl.types) ----------------------------------------------------------------
    #: (B, T) int64: token ids, `pad_id` on padding.
    input_ids: torch.Tensor
    #: (B, T) int64: 1 on the trajectory's tokens, 0 on padding.
    attention_mask: torch.Tensor
    #: (B, T) float32: 1 on agent-sampled tokens (contract 2), else 0.
    loss_mask: torch.Tensor
    #: (B, T) float32: the engine's logprob of each sampled token (contract 3), 0 elsewhere.
    #: Distillation's teacher rows get the student's `old_logprobs` here.
    sampler_logprobs: torch.Tensor
    #: (B, T) float32: each turn's reward on its last sampled token (contract 4), else 0;
    #: reward shaping (`agentrl.algos.shaping`: overlong penalty) rewrites it.
    token_rewards: torch.Tensor
    #: (B,) int64: tokens of each trajectory (T = the largest, or `pad_to`).
    lengths: torch.Tensor
    #: B entries, `Trajectory.vision` of each row (None: a row without images); only present
    #: when some trajectory has images.
    vision: list[dict[str, Any] | None]

    # -- the loop's batch building (train.build_batch; dpo.pair_batch, dpo.preference_batch) ----
    #: (B,) float32: episode returns (NaN: a failed reward or no sampled token); shaping adds
    #: its penalties. DPO: 1.0 for chosen, 0.0 for rejected rows.
    scores: torch.Tensor
    #: (B,) int64: the advantage group of each row (GRPO groups, role-aware; DPO: the pair).
    group_ids: torch.Tensor
    #: (B,) bool: the episode hit a limit (Gymnasium's truncated), for PPO's bootstrap.
    truncated: torch.Tensor
    #: (B, T) float32: `loss_mask` before overlong filtering zeroed rows with a cut turn
    #: (`shaping.mask_length_truncated`; absent otherwise): the turns the turn-level advantages
    #: count in their groups' statistics (`turns.turn_mask`).
    sampled_mask: torch.Tensor
    #: (B,) bool: rows the teacher engine sampled (distill's GKD mixture); absent otherwise.
    teacher_rows: torch.Tensor
    #: int: consecutive rows that share every minibatch and micro-batch (DPO pairs: 2);
    #: absent means 1.
    unit_size: int

    # -- the algorithm's prepare / advantages (agentrl.algos) ------------------------------------
    #: (B, T) float32: the learner's logprobs under the weights that sampled (PPO ratio's
    #: denominator); set by `prepare` or at the start of `Learner.update`.
    old_logprobs: torch.Tensor
    #: (B, T) float32: the reference model's logprobs, for a KL.
    ref_logprobs: torch.Tensor
    #: (B, T) float32: token-level advantages (0 off the mask), from `algo.advantages`; a (B,)
    #: tensor of per-row advantages is also accepted by the learner's idle-row test.
    advantages: torch.Tensor
    #: (B, T) float32: PPO's value targets R = A + V_old (before whitening).
    returns: torch.Tensor
    #: (B, T) float32: PPO's V(s_t) under the sampling weights (0 at t = 0).
    old_values: torch.Tensor
    #: (B,) float32: PPO's V after the last agent token for truncated rows, 0 otherwise.
    bootstrap_values: torch.Tensor
    #: float: PPO's KL-in-reward coefficient for this batch (adaptive controller's beta).
    kl_coef: float
    #: (B, T) float32: distillation teacher's logprobs of the sampled tokens.
    teacher_logprobs: torch.Tensor
    #: (B, T) float32: the teacher engine's sampler logprobs on teacher rows (GKD mixture).
    teacher_sampler_logprobs: torch.Tensor
    #: (B, T, V) float32: the teacher's whole next-token distribution (`distill_kl=full`).
    teacher_vocab_logprobs: torch.Tensor
    #: (B, T, k) float32: the teacher's k largest logprobs (`distill_kl=topk`).
    teacher_topk_logprobs: torch.Tensor
    #: (B, T, k) int64: the token ids of `teacher_topk_logprobs`.
    teacher_topk_ids: torch.Tensor

    # -- the learner's update (agentrl.learner.local) ---------------------------------------------
    #: (B, T) float32: truncated importance-sampling weights (with `algo.tis_cap`).
    tis_weights: torch.Tensor
    #: int: per micro-batch, Dr. GRPO's L_max (`algo.norm_len`, else the padded width T).
    max_len: int


def collate(trajs: list[Trajectory], pad_id: int, *, pad_to: int | None = None) -> Batch:
    """Right-pad trajectories into `(B, T)` tensors for the learner.

    Args:
        trajs: B trajectories.
        pad_id: token id used for padding (its mask is 0, so its value never matters).
        pad_to: minimum T (tokens); T is max(len) otherwise.

    Returns:
        a `Batch` with `input_ids`, `attention_mask`, `loss_mask`, `sampler_logprobs`,
        `token_rewards` (B, T) and `lengths` (B,); plus `vision` when any trajectory has
        images. Padding has attention 0 and loss_mask 0, so it never adds to a loss or a return.
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
    out: Batch = {
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


# -- the Protocols the loop holds its parts by ------------------------------------------------------
class Collector(Protocol):
    """Where the loop gets a step's trajectories: synchronously (`SyncSource`: sampled when
    asked) or from actor threads with bounded staleness (`AsyncSource`), both in
    `agentrl.rollout.source`."""

    def next_batch(self, step: int) -> tuple[list[Trajectory], dict[str, float]]:
        """Batch `step`'s trajectories (group-major) and the source's metrics (waits, staleness);
        each batch index is returned exactly once, in order."""
        ...

    def push_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Hand the policy's new weights (`Learner.state_dict_for_engines`) to the engines as
        policy `version` (now, or when the actors next take them)."""
        ...

    def close(self) -> None:
        """Stop sampling and free the source's threads."""
        ...


class Learner(Protocol):
    """What the loop and the algorithms may call on a learner: the in-process
    `agentrl.learner.local.Learner` and the group of FSDP2 ranks
    `agentrl.learner.group.LearnerGroup` both satisfy it (tests/test_types.py has mypy check it).

    The batch arguments are `dict[str, Any]` (a `Batch` at runtime) until agentrl/learner is
    annotated with `Batch`.

    Attributes:
        algo_state: the algorithm's state across steps (e.g. PPO's `kl_coef`), checkpointed.
        optimizer_steps: optimizer steps taken so far.
        nonfinite_streak: optimizer steps skipped in a row for a non-finite gradient norm.
        temperature: the sampling temperature the logprobs are computed at.
        micro_batch_size: rows per forward.
        reference: the reference worker (`placement.reference=worker`), set by the loop, or None.
        teacher: distillation's teacher (`agentrl.learner.frozen.make_teacher`: its worker, or
            inline), set by the run's builder when the algorithm `needs_teacher`, else None.
        ref_seconds: seconds spent computing reference logprobs so far.
    """

    algo_state: dict[str, Any]
    optimizer_steps: int
    nonfinite_streak: int
    temperature: float
    micro_batch_size: int
    reference: Any
    teacher: Any
    ref_seconds: float

    @property
    def lr(self) -> float:
        """The learning rate of the next optimizer step."""
        ...

    def update(self, batch: dict[str, Any], algo: Any, cfg: Any, *, epochs: int = 1,
               minibatches: int = 1, seed: int = 0, on_policy_shortcut: bool = True
               ) -> dict[str, float]:
        """`epochs` x `minibatches` optimizer steps of `algo.loss` on the batch; the metrics
        averaged over optimizer steps ({} for a batch without agent tokens)."""
        ...

    def logprobs(self, batch: dict[str, Any], *, ref: bool = False) -> torch.Tensor:
        """(B, T) float32 logprobs of the policy (or the reference, `ref=True`), no gradient."""
        ...

    def logprobs_and_values(self, batch: dict[str, Any]
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """logp (B, T), values (B, T) and the bootstrap values (B,) in one forward (PPO)."""
        ...

    def state_dict_for_engines(self) -> dict[str, torch.Tensor]:
        """The policy's full weights under the plain model's names (LoRA merged), on CPU."""
        ...

    def compile_note(self) -> str:
        """One line on what `train.compile` does for this learner ("" when off)."""
        ...

    def fast_path_notes(self) -> list[str]:
        """One line per fast path of the training forward these settings turn off."""
        ...

    def save(self, path: str | Path, tokenizer: Any, extra: dict[str, Any],
             files: dict[str, bytes] | None = None) -> Path:
        """Write a checkpoint atomically at `path`; returns it."""
        ...

    def load(self, path: str | Path) -> dict[str, Any]:
        """Restore a checkpoint written by `save`; returns its `extra`."""
        ...
