"""Public data types of the sandbox: limits in, structured result out."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

VERDICTS = (
    "pass", "fail", "timeout", "memory_limit", "output_limit", "runtime_error",
    "syntax_error", "sandbox_error",
)


#: Largest accepted value per limit: beyond these, timers and rlimits overflow (a year of
#: seconds; 2**40 MiB, bytes or processes are far beyond any machine).
_LIMIT_MAX = {"wall_s": 3.2e7, "cpu_s": 3.2e7, "memory_mb": 2 ** 40, "max_procs": 2 ** 31 - 1,
              "file_size_mb": 2 ** 40, "output_bytes": 2 ** 40}


@dataclass
class Limits:
    """Resource limits of one run, all enforced from outside the solution.

    wall_s: wall-clock seconds for the whole run (setup + solution + all tests).
    cpu_s: CPU seconds per process (RLIMIT_CPU; SIGXCPU, then SIGKILL one second later).
    memory_mb: address space per process in MiB (RLIMIT_AS).
    max_procs: processes the run may have at once, itself included (RLIMIT_NPROC).
    file_size_mb: largest file a process may write, MiB (RLIMIT_FSIZE; /tmp is also capped).
    output_bytes: stdout + stderr bytes kept; more ends the run with ``output_limit``.
    """

    wall_s: float = 5.0
    cpu_s: float = 5.0
    memory_mb: int = 512
    max_procs: int = 32
    file_size_mb: int = 16
    output_bytes: int = 1 << 20

    def __post_init__(self):
        for name, top in _LIMIT_MAX.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"Limits.{name} must be a number, got {value!r}")
            if not 0 < value <= top:  # also rejects NaN and infinity
                raise ValueError(f"Limits.{name} must be > 0 and <= {top:g}, got {value!r}")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class TestOutcome:
    """One test: ``error`` is short text such as ``'AssertionError (at `assert f(2) == 4`)'``."""

    __test__ = False  # not a pytest class

    name: str
    passed: bool
    error: str | None = None


@dataclass
class SandboxResult:
    """Outcome of one sandboxed run.

    verdict: one of VERDICTS; ``pass`` iff every test was reported passed by the harness
      (for ``run_code``: the program ran to completion / exited with status 0).
    passed, total: tests passed / given.  tests: per-test outcomes, in order.
    stdout, stderr: captured output (decoded UTF-8, at most ``Limits.output_bytes`` in total).
    wall_s, cpu_s: wall-clock and CPU seconds of the run (CPU summed over its processes).
    backend: which backend ran it.  error: short reason when the verdict is not ``pass``.
    unisolated: True when the code ran without isolation (the explicitly named ``subprocess``
      backend): it could read and write the trainer's files and reach the network.
    retried: True when this is the verdict of a second run: the first was stopped by the
      wall-clock limit while starved of CPU (``agentrl.sandbox.pool.starved_timeout``).
    cached: True when the pool's verdict cache answered (the same job ran before, or at the
      same time in another thread; ``wall_s``/``cpu_s`` are that run's).
    """

    verdict: str
    passed: int
    total: int
    tests: list[TestOutcome] = field(default_factory=list)
    stdout: str = ""
    stderr: str = ""
    wall_s: float = 0.0
    cpu_s: float = 0.0
    backend: str = ""
    error: str | None = None
    unisolated: bool = False
    retried: bool = False
    cached: bool = False

    @property
    def pass_fraction(self) -> float:
        """passed / total in [0, 1]; with no tests, 1.0 for a ``pass`` verdict else 0.0."""
        if self.total == 0:
            return 1.0 if self.verdict == "pass" else 0.0
        return self.passed / self.total

    @property
    def ok(self) -> bool:
        return self.verdict == "pass"
