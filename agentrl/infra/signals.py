"""Ctrl-C and SIGTERM during the training loop: the first asks the loop to stop after the step
in progress (it saves a checkpoint and raises `RunInterrupted`); a second one stops at once
(`SecondSignal`). Both carry the shell's exit status (`signal_exit_code`), which `agentrl train`
exits with."""

from __future__ import annotations

import signal as sig
import threading
from typing import Any


def signal_exit_code(name: str | None) -> int:
    """The exit status of a run stopped by signal `name` (the shell's convention, 128 + the
    signal's number): SIGINT (Ctrl-C) 130, SIGTERM 143; None (a plain KeyboardInterrupt) 130."""
    return 128 + int(sig.Signals[name] if name else sig.SIGINT)


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C / SIGTERM stopped the run after saving its last completed step; `exit_code` is
    `signal_exit_code` of the signal (130 or 143)."""

    def __init__(self, message: str, signal: str | None = None) -> None:
        super().__init__(message)
        self.exit_code = signal_exit_code(signal)


class SecondSignal(KeyboardInterrupt):
    """A second Ctrl-C / SIGTERM: the run stops at once without saving; `exit_code` as
    `RunInterrupted`'s."""

    def __init__(self, signal: str) -> None:
        super().__init__(signal)
        self.exit_code = signal_exit_code(signal)


class StopRequest:
    """Ctrl-C (SIGINT) and SIGTERM during the RL loop: the first asks the loop to stop after
    the step in progress (it saves a checkpoint and raises `RunInterrupted`); a second one
    interrupts at once (`SecondSignal`, a KeyboardInterrupt, no save). Handlers are installed only in the main
    thread and restored by `uninstall`."""

    def __init__(self) -> None:
        self.signal: str | None = None
        self._old: dict[int, Any] = {}

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.signal is not None:
            raise SecondSignal(sig.Signals(signum).name)
        self.signal = sig.Signals(signum).name

    def install(self) -> None:
        """Take over SIGINT and SIGTERM (no-op outside the main thread)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for s_ in (sig.SIGINT, sig.SIGTERM):
            self._old[s_] = sig.signal(s_, self._handle)

    def uninstall(self) -> None:
        """Restore the previous handlers."""
        for s_, h in self._old.items():
            sig.signal(s_, h)
        self._old.clear()
