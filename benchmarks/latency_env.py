"""A benchmark env with I/O latency: each step waits `latency_s` (like a remote judge or tool)
and rewards the fraction of 'a' characters in the answer; `turns` agent turns per episode."""

from __future__ import annotations

import time

from agentrl.env.base import TextEnv


class LatencyEnv(TextEnv):
    """Write about a topic, `turns` times; reward = fraction of 'a' (averaged over the turns);
    each step sleeps `latency_s` seconds."""

    def __init__(self, latency_s: float = 0.5, turns: int = 1):
        self.latency_s = latency_s
        self.turns = turns

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        i = int(self.np_random.integers(1000))
        self.turn = 0
        return [{"role": "user", "content": f"Write about topic number {i}."}], {"task_id": str(i)}

    def step(self, action):
        time.sleep(self.latency_s)
        self.turn += 1
        reward = action.count("a") / max(1, len(action)) / self.turns
        if self.turn >= self.turns:
            return [], reward, True, False, {}
        return [{"role": "user", "content": "Write more."}], reward, False, False, {}
