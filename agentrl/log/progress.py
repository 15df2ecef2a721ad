"""Progress of the long stages of a run (model build, tokenizer training, warm start,
evaluation, RL), one way for all of them.

On a terminal (`console.is_terminal`) each stage is a rich progress bar with its elapsed time
and ETA, all stages in one live display (rich allows one at a time). Without a terminal
(output sent to a file or a pipe: `nohup`, Slurm, Ray jobs) each stage prints plain lines,
flushed as written, so a log file grows while the run works:

    [sft] 120/300 steps (40%) · 0:00:31 elapsed · ETA 0:00:46 · loss 1.234

at most one every `every_s` seconds (0: one per advance), plus the first and the last. A stage
without a known total (one library call, e.g. tokenizer training) prints a start and an end
line. `Reporter(None)` prints the plain lines with `print`; `Reporter(..., enabled=False)`
prints nothing (`--quiet`).

The ETA is `elapsed / done x (total - done)` (a linear extrapolation of the stage so far);
rich's bar uses its own moving-window speed estimate.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["Reporter", "Stage", "format_seconds"]


def format_seconds(s: float) -> str:
    """`H:MM:SS` of a non-negative number of seconds (`-:--:--` for NaN, inf or negative)."""
    if not (s == s) or s < 0 or s == float("inf"):
        return "-:--:--"
    s = int(round(s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class Stage:
    """One stage's progress; made by `Reporter.stage`, used as a context manager or closed
    with `close()`. `advance(n, info)` adds `n` done units and sets the info text shown after
    the bar (or at the end of the plain line)."""

    def __init__(self, reporter: Reporter, name: str, total: int | None, unit: str, every_s: float,
                 completed: int = 0):
        self.r, self.name, self.total, self.unit, self.every_s = reporter, name, total, unit, every_s
        self.start_done = self.done = completed
        self.t0 = self.last = time.perf_counter()
        self.printed = 0
        self.closed = False
        self.task = None
        if reporter.progress is not None:
            self.task = reporter.progress.add_task(name, total=total, completed=completed, info="")
        elif reporter.enabled and total is None:
            reporter.line(f"[{name}] {unit} ...")

    def eta(self, now: float | None = None) -> float:
        """Seconds left at `now` (default: the clock) by linear extrapolation of this stage's
        rate (NaN before the first unit, or without a total)."""
        n = self.done - self.start_done
        if self.total is None or n <= 0:
            return float("nan")
        now = time.perf_counter() if now is None else now
        return (now - self.t0) / n * (self.total - self.done)

    def plain(self, info: str = "", now: float | None = None) -> str:
        """The plain progress line of the stage at `now` (default: the clock)."""
        now = time.perf_counter() if now is None else now
        el = format_seconds(now - self.t0)
        if self.total is None:
            head = f"[{self.name}] {self.unit} · {el} elapsed"
        else:
            pct = 100.0 * self.done / self.total if self.total else 100.0
            head = (f"[{self.name}] {self.done}/{self.total} {self.unit} ({pct:.0f}%) · {el} elapsed"
                    f" · ETA {format_seconds(self.eta(now))}")
        return head + (f" · {info}" if info else "")

    def advance(self, n: int = 1, info: str = "") -> None:
        """Add `n` done units; `info` is shown with the progress (e.g. the step's reward)."""
        self.done += n
        if self.task is not None:
            self.r.progress.update(self.task, advance=n, info=info)
            return
        if not self.r.enabled:
            return
        now = time.perf_counter()
        last = self.total is not None and self.done >= self.total
        if self.printed == 0 or last or now - self.last >= self.every_s:
            self.r.line(self.plain(info, now))
            self.last, self.printed = now, self.printed + 1

    def close(self, info: str = "") -> None:
        """End the stage: its bar leaves the live display (the last bar stops it); a stage
        without a total prints its end line with the seconds it took."""
        if self.closed:
            return
        self.closed = True
        if self.task is not None:  # the bar goes; a line stays in the terminal's history
            self.r.progress.remove_task(self.task)
            self.r.release()
            took = format_seconds(time.perf_counter() - self.t0)
            self.r.line(f"[{self.name}] {self.unit}: done in {took}" if self.total is None else
                        f"[{self.name}] {self.done}/{self.total} {self.unit} in {took}"
                        + (f" · {info}" if info else ""))
        elif self.r.enabled and self.total is None:
            self.r.line(f"[{self.name}] {self.unit}: done in {time.perf_counter() - self.t0:.1f} s"
                        + (f" · {info}" if info else ""))

    def __enter__(self) -> Stage:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Reporter:
    """Where a run's progress goes (see the module doc).

    Args:
        console: a rich Console (bars when it is a terminal, else plain lines on it); None:
            plain lines with `print(..., flush=True)`.
        enabled: False prints nothing (`quiet`).
    """

    def __init__(self, console: Any = None, *, enabled: bool = True):
        self.console, self.enabled = console, enabled
        self.progress: Any = None
        self.live = 0  # stages open on the live display

    @property
    def terminal(self) -> bool:
        """Whether stages draw rich bars (an enabled reporter on a terminal console)."""
        return bool(self.enabled and self.console is not None and self.console.is_terminal)

    def line(self, text: str) -> None:
        """Print one plain line now (flushed)."""
        if self.console is None:
            print(text, flush=True)
        else:
            self.console.print(text, markup=False, highlight=False, soft_wrap=True)
            f = getattr(self.console, "file", None)
            if f is not None and hasattr(f, "flush"):
                f.flush()

    def stage(self, name: str, total: int | None, *, unit: str = "steps", every_s: float = 10.0,
              completed: int = 0) -> Stage:
        """Open a stage of `total` units (None: unknown, e.g. one library call) starting at
        `completed`; without a terminal a plain line is printed at most every `every_s` s."""
        if self.terminal:
            if self.progress is None:
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    Progress,
                    TextColumn,
                    TimeElapsedColumn,
                    TimeRemainingColumn,
                )

                self.progress = Progress(
                    TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                    TextColumn("{task.fields[info]}"), console=self.console)
                self.progress.start()
            self.live += 1
        return Stage(self, name, total, unit, every_s, completed)

    def release(self) -> None:
        """A live stage closed: stop the display when none is left."""
        self.live -= 1
        if self.live <= 0 and self.progress is not None:
            self.progress.stop()
            self.progress, self.live = None, 0

    def stop(self) -> None:
        """Stop the live display, whatever is open (on an error)."""
        if self.progress is not None:
            self.progress.stop()
            self.progress, self.live = None, 0
