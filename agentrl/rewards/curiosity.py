"""Intrinsic curiosity: an exploration bonus for novel agent responses.

Two novelty measures, each in [0, ~1] for a response:

- count-based (`"count"`): the response's word n-grams (lower-case `\\w+` words, n=2 by default;
  a response with fewer than n words is one gram of all its words) are hashed (BLAKE2b, stable
  across processes) into a table of `table_size` buckets; B = the set of distinct buckets of the
  response. Counts N[b] are "responses that contained bucket b", incremented for B *before* the
  novelty is read, so a first occurrence has N = 1. With an episodic table (cleared at each
  reset) and a global table (kept across episodes):
      novelty = w_epi * mean_{b in B} N_epi[b]^-1/2 + (1 - w_epi) * mean_{b in B} N_glob[b]^-1/2
  (count-based exploration bonus beta / sqrt(N): Strehl & Littman 2008; hashed counts: Tang et
  al. 2017, "#Exploration"; episodic + global novelty: Badia et al. 2020, "Never Give Up").
  A response with no words has novelty 0.
- random network distillation (`"rnd"`, Burda et al. 2019): x = a hashing embedding of the
  response (signed feature hashing of word unigrams and bigrams into `embed_dim` dims, L2
  normalised; or mean-pooled hidden states of a local transformers model); a fixed random
  network f and a trained predictor g (MLPs embed_dim -> hidden -> out); error e = mean((g(x) -
  f(x))^2) before the predictor's update on x; novelty = min(clip, e / m) where m is the
  bias-corrected exponential moving average of errors including this one (so the first is 1).

Bonus at the t-th scored response (t = 0, 1, ... counted over the memory's lifetime):
    bonus = coef * decay**t * novelty          (novelty: count, rnd, or their mean for "both")
The wrapper returns extrinsic + bonus and writes `info["reward_components"]["extrinsic"]` (the
inner env's reward) and `["intrinsic"]` (the bonus): the framework logs `reward/intrinsic` and
uses `extrinsic` for pass rates and evaluation, so the bonus never leaks into them.
"""

from __future__ import annotations

import hashlib
import math
import re
import threading
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from agentrl.rewards.base import check_choice

_WORD = re.compile(r"\w+")


def _h(s: str) -> int:
    return int.from_bytes(hashlib.blake2b(s.encode("utf-8"), digest_size=8).digest(), "little")


def ngram_buckets(text: str, n: int = 2, table_size: int = 1 << 16) -> np.ndarray:
    """Sorted distinct bucket ids of the word n-grams of `text` (see the module docstring).

    Returns:
        int64 array, shape (k,), k = 0 for a text with no words.

    Raises:
        ValueError: if n < 1 or table_size < 1.
    """
    if n < 1 or table_size < 1:
        raise ValueError(f"ngram_buckets: n >= 1 and table_size >= 1 required, got {n}, {table_size}")
    w = _WORD.findall(text.lower())
    if not w:
        return np.zeros(0, dtype=np.int64)
    grams = [" ".join(w)] if len(w) < n else [" ".join(w[i:i + n]) for i in range(len(w) - n + 1)]
    return np.unique(np.array([_h(g) % table_size for g in set(grams)], dtype=np.int64))


def hashing_embedding(text: str, dim: int = 256) -> np.ndarray:
    """Signed feature-hashing embedding of word unigrams and bigrams, L2-normalised.

    Each feature adds +-1 (the sign from a second hash) at `hash % dim`. Zero vector for a text
    with no words.

    Returns:
        float32 array, shape (dim,).
    """
    v = np.zeros(dim, dtype=np.float32)
    w = _WORD.findall(text.lower())
    for feat in w + [f"{a} {b}" for a, b in zip(w, w[1:], strict=False)]:
        h = _h(feat)
        v[h % dim] += 1.0 if (h >> 63) & 1 else -1.0
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 else v


class HFEmbedding:
    """Mean-pooled last hidden states of a local transformers model (`AutoModel`), L2-normalised.

    Raises:
        FileNotFoundError: `path` is not a directory.
    """

    def __init__(self, path: str | Path, max_length: int = 256):
        import torch
        from transformers import AutoModel, AutoTokenizer

        if not Path(path).is_dir():
            raise FileNotFoundError(f"embedding model directory not found: {path}")
        self.tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.model = AutoModel.from_pretrained(str(path), local_files_only=True, dtype=torch.float32).eval()
        self.max_length = max_length
        self.dim = int(self.model.config.hidden_size)

    def __call__(self, text: str) -> np.ndarray:
        import torch

        with torch.no_grad():
            enc = self.tokenizer(text or " ", return_tensors="pt", truncation=True, max_length=self.max_length)
            h = self.model(**enc).last_hidden_state[0]  # (T, H)
            m = enc["attention_mask"][0].unsqueeze(-1).float()
            v = ((h * m).sum(0) / m.sum().clamp(min=1)).numpy().astype(np.float32)
        n = float(np.linalg.norm(v))
        return v / n if n > 0 else v


class CountNovelty:
    """Global hashed n-gram counts (shareable across envs; thread-safe). Episodic counts live in
    each wrapper. See the module docstring for the formula."""

    def __init__(self, n: int = 2, table_size: int = 1 << 16, episodic_weight: float = 0.5):
        if not 0.0 <= episodic_weight <= 1.0:
            raise ValueError(f"episodic_weight must be in [0, 1], got {episodic_weight}")
        self.n, self.table_size, self.episodic_weight = int(n), int(table_size), float(episodic_weight)
        self.global_counts = np.zeros(self.table_size, dtype=np.int64)
        self._lock = threading.Lock()

    def new_episode(self) -> np.ndarray:
        """A fresh episodic count table."""
        return np.zeros(self.table_size, dtype=np.int64)

    def novelty(self, text: str, episodic: np.ndarray) -> float:
        """Count the response into `episodic` and the global table, then return its novelty."""
        b = ngram_buckets(text, self.n, self.table_size)
        if b.size == 0:
            return 0.0
        with self._lock:
            self.global_counts[b] += 1
            g = self.global_counts[b].astype(np.float64)
        episodic[b] += 1
        e = episodic[b].astype(np.float64)
        w = self.episodic_weight
        return float(w * np.mean(e ** -0.5) + (1 - w) * np.mean(g ** -0.5))

    def reset(self) -> None:
        with self._lock:
            self.global_counts[:] = 0

    def state_dict(self) -> dict[str, Any]:
        """The global table (a copy): `{"global_counts": int64 (table_size,)}`."""
        with self._lock:
            return {"global_counts": self.global_counts.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`'s table.

        Raises:
            ValueError: its size is not `table_size`.
        """
        counts = np.asarray(state["global_counts"], dtype=np.int64)
        if counts.shape != (self.table_size,):
            raise ValueError(f"curiosity: saved count table has shape {counts.shape}, this memory's "
                             f"table_size is {self.table_size}")
        with self._lock:
            self.global_counts[:] = counts


class RNDNovelty:
    """Random network distillation over a text embedding (thread-safe, shareable).

    Args:
        embed: "hash" (hashing embedding, `embed_dim` dims) or a local model path (`HFEmbedding`).
        embed_dim, hidden, out_dim: MLP sizes (embed_dim is the model's hidden size for a path).
        lr: Adam learning rate of the predictor.
        ema: momentum of the error average used for normalisation.
        clip: largest normalised novelty.
        seed: initialisation of both networks (the global torch RNG is left as it was).
    """

    def __init__(self, embed: str = "hash", *, embed_dim: int = 256, hidden: int = 64, out_dim: int = 32,
                 lr: float = 1e-3, ema: float = 0.99, clip: float = 5.0, seed: int = 0):
        import torch

        self._embed_model = None if embed == "hash" else HFEmbedding(embed)
        self.embed_dim = embed_dim if self._embed_model is None else self._embed_model.dim
        self.hidden, self.out_dim, self.lr, self.ema, self.clip, self.seed = hidden, out_dim, lr, ema, clip, seed
        self._lock = threading.Lock()
        self._torch = torch
        self.reset()

    def _mlp(self) -> Any:
        nn = self._torch.nn
        return nn.Sequential(nn.Linear(self.embed_dim, self.hidden), nn.ReLU(), nn.Linear(self.hidden, self.out_dim))

    def reset(self) -> None:
        """Re-initialise both networks from `seed` and forget the error average."""
        torch = self._torch
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            self.target = self._mlp().requires_grad_(False)
            self.predictor = self._mlp()
        self.opt = torch.optim.Adam(self.predictor.parameters(), lr=self.lr)
        self._m, self._k = 0.0, 0

    def state_dict(self) -> dict[str, Any]:
        """Both networks, the predictor's Adam state and the error average, as numpy arrays
        and JSON scalars (copies)."""
        with self._lock:
            opt = self.opt.state_dict()
            return {
                "target": {k: v.detach().numpy().copy() for k, v in self.target.state_dict().items()},
                "predictor": {k: v.detach().numpy().copy() for k, v in self.predictor.state_dict().items()},
                "opt_state": {str(i): {n: (v.detach().numpy().copy() if self._torch.is_tensor(v) else v)
                                       for n, v in st.items()} for i, st in opt["state"].items()},
                "opt_groups": opt["param_groups"], "m": self._m, "k": self._k}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`'s networks, optimizer state and error average.

        Raises:
            ValueError: the saved networks have other shapes (other embed_dim/hidden/out_dim).
        """
        torch = self._torch

        def tensors(d: dict[str, Any]) -> dict[str, Any]:
            return {k: torch.from_numpy(np.array(v)) for k, v in d.items()}

        with self._lock:
            try:
                self.target.load_state_dict(tensors(state["target"]))
                self.predictor.load_state_dict(tensors(state["predictor"]))
            except RuntimeError as e:
                raise ValueError(f"curiosity: saved RND networks do not fit this memory: {e}") from None
            self.opt.load_state_dict({
                "state": {int(i): {n: (torch.from_numpy(np.array(v)) if isinstance(v, np.ndarray) else v)
                                   for n, v in st.items()} for i, st in state["opt_state"].items()},
                "param_groups": [dict(g, betas=tuple(g["betas"])) if "betas" in g else g
                                 for g in state["opt_groups"]]})
            self._m, self._k = float(state["m"]), int(state["k"])

    def embed(self, text: str) -> np.ndarray:
        """The response embedding, shape (embed_dim,)."""
        return self._embed_model(text) if self._embed_model is not None else hashing_embedding(text, self.embed_dim)

    def error(self, text: str) -> float:
        """Prediction error of `text` without training (for inspection)."""
        torch = self._torch
        x = torch.from_numpy(self.embed(text)).unsqueeze(0)
        with self._lock, torch.no_grad():
            return float(((self.predictor(x) - self.target(x)) ** 2).mean())

    def novelty(self, text: str) -> float:
        """Error of `text` before one predictor step on it, normalised by the error EMA."""
        torch = self._torch
        x = torch.from_numpy(self.embed(text)).unsqueeze(0)
        with self._lock:
            loss = ((self.predictor(x) - self.target(x)) ** 2).mean()
            e = float(loss.detach())
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            self._k += 1
            self._m = self.ema * self._m + (1 - self.ema) * e
            m_hat = self._m / (1 - self.ema ** self._k)
        return float(min(self.clip, e / m_hat)) if m_hat > 0 else 0.0


class CuriosityMemory:
    """What curiosity remembers across episodes: count tables, the RND networks, and the step
    counter t of the decay schedule. Share one between env instances so that "novel" means novel
    for the whole run, not for one env copy.

    Args:
        method: "count", "rnd" or "both".
        coef: bonus scale.
        decay: per-response decay of the coefficient (coef * decay**t).
        n, table_size, episodic_weight: count-based settings (`CountNovelty`).
        embed, embed_dim, rnd_hidden, rnd_out, rnd_lr, rnd_ema, rnd_clip, seed: RND settings.

    Raises:
        ValueError: unknown method, coef < 0, decay outside (0, 1].
    """

    def __init__(self, method: str = "count", *, coef: float = 0.1, decay: float = 0.999, n: int = 2,
                 table_size: int = 1 << 16, episodic_weight: float = 0.5, embed: str = "hash",
                 embed_dim: int = 256, rnd_hidden: int = 64, rnd_out: int = 32, rnd_lr: float = 1e-3,
                 rnd_ema: float = 0.99, rnd_clip: float = 5.0, seed: int = 0):
        self.method = check_choice("curiosity.method", method, ("count", "rnd", "both"))
        if coef < 0 or not 0 < decay <= 1:
            raise ValueError(f"curiosity: coef >= 0 and 0 < decay <= 1 required, got {coef}, {decay}")
        self.coef, self.decay = float(coef), float(decay)
        self.count = CountNovelty(n, table_size, episodic_weight) if method in ("count", "both") else None
        self.rnd = RNDNovelty(embed, embed_dim=embed_dim, hidden=rnd_hidden, out_dim=rnd_out, lr=rnd_lr,
                              ema=rnd_ema, clip=rnd_clip, seed=seed) if method in ("rnd", "both") else None
        self.t = 0
        self._lock = threading.Lock()

    def bonus(self, text: str, episodic: np.ndarray | None) -> tuple[float, dict[str, float]]:
        """Bonus for one response and its parts (`novelty_count`, `novelty_rnd`, `coef_t`)."""
        with self._lock:
            t = self.t
            self.t += 1
        parts: dict[str, float] = {}
        if self.count is not None:
            parts["novelty_count"] = self.count.novelty(text, episodic if episodic is not None else
                                                        self.count.new_episode())
        if self.rnd is not None:
            parts["novelty_rnd"] = self.rnd.novelty(text)
        novelty = sum(parts.values()) / len(parts)
        parts["coef_t"] = self.coef * self.decay ** t
        return parts["coef_t"] * novelty, parts

    def new_episode(self) -> np.ndarray | None:
        return self.count.new_episode() if self.count is not None else None

    def reset(self) -> None:
        """Forget everything (counts, RND networks, t)."""
        with self._lock:
            self.t = 0
        if self.count is not None:
            self.count.reset()
        if self.rnd is not None:
            self.rnd.reset()

    def state_dict(self) -> dict[str, Any]:
        """What the memory has learnt, to checkpoint: `t`, the global count table (`count`)
        and the RND networks with their optimizer (`rnd`); numpy arrays and JSON scalars. The
        episodic tables are not part of it (each episode starts a fresh one)."""
        with self._lock:
            t = self.t
        return {"method": self.method, "t": t,
                "count": self.count.state_dict() if self.count is not None else None,
                "rnd": self.rnd.state_dict() if self.rnd is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`'s state.

        Raises:
            ValueError: it was saved by a memory with another method or table/network sizes.
        """
        if state.get("method") != self.method:
            raise ValueError(f"curiosity: saved state is of method {state.get('method')!r}, this "
                             f"memory's is {self.method!r}")
        if self.count is not None:
            self.count.load_state_dict(state["count"])
        if self.rnd is not None:
            self.rnd.load_state_dict(state["rnd"])
        with self._lock:
            self.t = int(state["t"])


class CuriosityBonus(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Add an exploration bonus for novel responses to the env's reward.

    reward = extrinsic + bonus, with `info["reward_components"]["extrinsic"]` = the inner env's
    reward, `["intrinsic"]` = bonus, and `info["curiosity"]` = the novelty parts. A NaN extrinsic
    reward stays NaN (a failed score is not rescued by curiosity). Stack it last (outermost), so
    that no other wrapper replaces the bonus.

    Args:
        env: env to wrap.
        memory: a shared `CuriosityMemory`; None builds an own one from `memory_kwargs`.
        reset_state_on_seed: a seeded `reset(seed=...)` forgets the wrapper's *own* memory (same
            seed and actions -> same rewards, Gymnasium's reproducibility contract); a shared
            memory is never reset by one env.
        **memory_kwargs: `CuriosityMemory` settings (method, coef, decay, n, table_size, ...).
    """

    def __init__(self, env: gym.Env, memory: CuriosityMemory | None = None, *, reset_state_on_seed: bool = True,
                 **memory_kwargs: Any):
        if memory is not None and memory_kwargs:
            raise ValueError(f"curiosity: options {sorted(memory_kwargs)} given with a shared memory")
        gym.utils.RecordConstructorArgs.__init__(self, reset_state_on_seed=reset_state_on_seed, **memory_kwargs)
        gym.Wrapper.__init__(self, env)
        self._own = memory is None
        self.memory = memory or CuriosityMemory(**memory_kwargs)
        self.reset_state_on_seed = bool(reset_state_on_seed)
        self._episodic = self.memory.new_episode()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if seed is not None and self.reset_state_on_seed and self._own:
            self.memory.reset()
        self._episodic = self.memory.new_episode()
        return self.env.reset(seed=seed, options=options)

    def step(self, action: str):
        obs, reward, terminated, truncated, info = self.env.step(action)
        bonus, parts = self.memory.bonus(str(action), self._episodic)
        out = dict(info)
        comps = dict(out.get("reward_components") or {})
        comps["extrinsic"] = float(reward)
        comps["intrinsic"] = float(bonus)
        out["reward_components"] = comps
        out["curiosity"] = parts
        total = float(reward) + bonus if not math.isnan(float(reward)) else math.nan
        return obs, total, terminated, truncated, out
