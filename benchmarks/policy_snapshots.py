"""The policy at every step end of an `agentrl.train.train` call, for held-out curves evaluated
after the run (`async_vs_sync.py`'s time to accuracy).

An evaluation inside the loop (`train.eval_every`) pauses the learner but not an asynchronous
run's actor: the in-flight episodes' env steps go on while the evaluation holds the engine, so
the seconds taken out of the clock for the evaluation are partly training seconds of the async
run (issue 43's first time-to-accuracy figure names the bias). Here nothing is evaluated while
the run trains: a wrapper of `MetricsLog.log` copies the learner's weights at each step end
(in memory, a few milliseconds for the embedded model; those seconds are taken out of the
clock) and the copies are written as model directories and evaluated afterwards, with the
held-out harness of `agentrl eval` (`eval_policies`). The run's own evaluation after RL, of its
final weights, must equal the evaluation of the last copy (`async_vs_sync.py` checks it).

Nothing of the library is changed: the hooks wrap `agentrl.learner.local.Learner.__init__`
(to hold the policy being trained) and `agentrl.log.metrics.MetricsLog.log`, and are removed
when the `keep_snapshots` block ends.
"""

from __future__ import annotations

import contextlib
import io
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Snapshot:
    """The policy after RL step `step` (1-based): `t` training seconds (`perf/loop_s` minus the
    seconds of the copies before it), `state` its weights (CPU tensors), `path` once written."""

    step: int
    t: float
    state: dict[str, Any]
    path: Path | None = None


@dataclass
class Snapshots:
    """What `keep_snapshots` collected: the snapshots in step order, the learner (its model
    writes them) and `copy_s`, the seconds the copies took so far (taken out of `Snapshot.t`)."""

    items: list[Snapshot] = field(default_factory=list)
    learner: Any = None
    copy_s: float = 0.0


@contextlib.contextmanager
def keep_snapshots(every: int = 1, last: int | None = None) -> Iterator[Snapshots]:
    """Within the block, every `every`-th `train` step end (a `MetricsLog.log` call carrying
    `perf/loop_s`; step `last` too) copies the in-process learner's weights into the yielded
    `Snapshots`. Raises RuntimeError at a step end when no in-process learner was built
    (`train.learner_workers` > 0)."""
    import agentrl.learner.local as learner_mod
    from agentrl.log.metrics import MetricsLog

    snaps = Snapshots()
    init, log = learner_mod.Learner.__init__, MetricsLog.log

    def init_kept(self: Any, *args: Any, **kw: Any) -> None:
        init(self, *args, **kw)
        snaps.learner = self

    def log_step(self: Any, step: int, metrics: dict[str, float]) -> None:
        log(self, step, metrics)
        if "perf/loop_s" not in metrics or (step % every and step != last):
            return
        if snaps.learner is None:
            raise RuntimeError("keep_snapshots: no in-process learner (learner ranks are not supported)")
        t0 = time.perf_counter()
        state = {k: v.detach().to("cpu", copy=True) for k, v in snaps.learner.model.state_dict().items()}
        snaps.items.append(Snapshot(step, metrics["perf/loop_s"] - snaps.copy_s, state))
        snaps.copy_s += time.perf_counter() - t0

    learner_mod.Learner.__init__, MetricsLog.log = init_kept, log_step  # type: ignore[method-assign]
    try:
        yield snaps
    finally:
        learner_mod.Learner.__init__, MetricsLog.log = init, log  # type: ignore[method-assign]


def write_snapshots(snaps: Snapshots, tokenizer_dir: Path, root: Path) -> list[Path]:
    """Write each snapshot as a Hugging Face model directory ROOT/step_N (the learner's model
    with the snapshot's weights loaded, and the tokenizer of `tokenizer_dir`), free its
    in-memory copy, and return the paths in step order."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    model = snaps.learner.model
    for s in snaps.items:
        s.path = root / f"step_{s.step}"
        model.load_state_dict(s.state)
        model.save_pretrained(s.path)
        tok.save_pretrained(s.path)
        s.state = {}
    return [s.path for s in snaps.items if s.path is not None]


def eval_policies(paths: list[Path], config: Path, out: Path, tasks: int, env_threads: int | None,
                  samples: int = 1) -> list[dict]:
    """`agentrl eval --model P -c CONFIG --max-tasks TASKS --samples SAMPLES` for each P of
    `paths` (`env_threads` None: the config's), in this process, one after another
    (OUT/<P's name>); returns each evaluation's summary ("overall" and "tasks")."""
    from rich.console import Console

    from agentrl.eval.cli import eval_command

    res = []
    for p in paths:
        s = eval_command(model=str(p), config=str(config), out=str(out / p.name), max_tasks=tasks,
                         samples=samples, env_threads=env_threads, console=Console(file=io.StringIO()))
        res.append(json.loads((out / p.name / "summary.json").read_text()) if (out / p.name / "summary.json").exists()
                   else s)
    return res


def answers(eval_dir: Path) -> list[str]:
    """The assistant messages of an evaluation's results.jsonl (EVAL_DIR: `agentrl eval`'s out,
    or a run's eval/<tag>), in file order: two evaluations of the same weights on the same tasks
    and seeds give the same list."""
    rows = [json.loads(x) for x in (eval_dir / "results.jsonl").read_text().splitlines() if x.strip()]
    return [m["content"] for r in rows for m in r["messages"] if m["role"] == "assistant"]
