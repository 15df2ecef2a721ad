"""SandboxPool: warm sandboxes shared by many threads, and the module-level default pool."""

from __future__ import annotations

import atexit
import copy
import hashlib
import json
import logging
import os
import queue
import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from .backends import BACKENDS, BackendError, warn_unisolated
from .judge import judge, make_job, source_text
from .probe import probe
from .result import Limits, SandboxResult, TestOutcome
from .worker import GRACE_S, Worker

log = logging.getLogger(__name__)


def available_backends() -> list[str]:
    """Backends that work on this machine, best first (probed once per process)."""
    return [name for name in BACKENDS if probe(name) is None]


#: Backends ``auto`` may choose: only isolated ones (``subprocess`` runs only when named).
ISOLATED_BACKENDS = tuple(b for b in BACKENDS if b != "subprocess")


def resolve_backend(backend: str) -> str:
    """'auto' -> the first available *isolated* backend; a named one must be available.

    Raises BackendError when ``auto`` finds no isolated backend (it never falls back to the
    unisolated ``subprocess`` backend), ValueError for an unknown or unavailable named one.
    """
    if backend == "auto":
        reasons = []
        for name in ISOLATED_BACKENDS:
            reason = probe(name)
            if reason is None:
                return name
            reasons.append(f"{name}: {reason}")
            log.info("sandbox backend %s unavailable: %s", name, reason)
        raise BackendError(
            "no isolated sandbox backend works here (" + "; ".join(reasons) + "). Install "
            "bubblewrap (apt-get install bubblewrap; it needs unprivileged user namespaces), or "
            "use Docker (pip install docker and a reachable engine). To run untrusted code "
            "WITHOUT isolation anyway, name backend='subprocess' explicitly.")
    if backend not in BACKENDS:
        raise ValueError(f"unknown sandbox backend {backend!r}; choose from {['auto', *BACKENDS]}")
    reason = probe(backend)
    if reason is not None:
        raise ValueError(f"sandbox backend {backend!r} is not available: {reason}")
    return backend


def _sandbox_error(error: str, backend: str, total: int) -> SandboxResult:
    tests = [TestOutcome(f"test_{i}", False, "not run") for i in range(total)]
    return SandboxResult("sandbox_error", 0, total, tests, "", "", 0.0, 0.0, backend, error,
                         unisolated=backend == "subprocess")


class SandboxPool:
    """``workers`` warm sandboxes (default: one per core) used by any number of threads.

    Each call takes an idle worker, runs one job in a fresh child inside it, and gives the
    worker back; calls block while all workers are busy.  Thread-safe.  ``retry_starved``
    (default True): a run that the wall-clock limit stopped while it had less CPU than it
    could have used (``starved_timeout``) runs once more, so that a verdict does not depend
    on the machine's load (docs/sandbox.md, "Verdicts and load").

    ``cache_size`` (default 2048; 0 turns it off): ``run_tests(..., cache=True)`` keeps the
    verdicts of the last ``cache_size`` distinct such jobs (the same solution source, tests,
    setup, names, limits, split and ``cache_scope``) and answers the same job again from it,
    without running it; a job asked while its twin runs waits for the twin's verdict
    (docs/sandbox.md, "Verdict cache"). A group of samples repeats programs
    (benchmarks/results/verdict_cache.md), so the cache saves their runs. Not cached: what `cacheable`
    refuses (a ``sandbox_error``, a timeout the machine's load may have caused, much text);
    ``run_code`` (the agent's tool runs) never is.
    """

    def __init__(self, workers: int | None = None, backend: str = "auto",
                 limits: Limits | None = None, tmpfs_mb: int = 128, retry_starved: bool = True,
                 cache_size: int = 2048):
        self.backend = resolve_backend(backend)
        if self.backend == "subprocess":
            warn_unisolated()
        self.limits = limits or Limits()
        n = workers or os.cpu_count() or 1
        if n < 1:
            raise ValueError(f"workers must be >= 1, got {n}")
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 0:
            raise ValueError(f"cache_size must be an int >= 0, got {cache_size!r}")
        self._workers = [Worker(self.backend, tmpfs_mb) for _ in range(n)]
        # LIFO: the most recently used (warm) worker is reused first.
        self._idle: queue.LifoQueue[Worker] = queue.LifoQueue()
        for w in self._workers:
            self._idle.put(w)
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = False
        self.retry_starved = retry_starved
        #: runs made again after a starved wall-clock timeout (`starved_timeout`)
        self.starved_retries = 0
        self.cache_size = cache_size
        self._cache: OrderedDict[str, SandboxResult] = OrderedDict()
        self._inflight: dict[str, threading.Event] = {}
        #: `run_tests` calls answered from the verdict cache (or by a twin run in flight)
        self.cache_hits = 0

    @property
    def size(self) -> int:
        return len(self._workers)

    @property
    def host_pids(self) -> list[int]:
        """Host pids of the running sandboxes (bwrap or server processes); for leak checks."""
        return [p for p in (w.host_pid for w in self._workers) if p is not None]

    @property
    def restarts(self) -> int:
        """Sandbox servers started beyond the first per worker (after crashes/timeouts)."""
        return sum(max(0, w.starts - 1) for w in self._workers)

    def _run(self, job: dict, names: list[str] | None) -> SandboxResult:
        """Run `job` on an idle worker and judge it. A wall-clock timeout of a starved run
        (`starved_timeout`: it had less CPU than it could have used, so the machine's load
        stopped it, not its code) is run once more with the same limits (fresh per-run
        tokens) and the second run's verdict stands (`SandboxResult.retried`); with
        `retry_starved=False` the first verdict stands."""
        if self._closed:
            raise RuntimeError("SandboxPool is closed")
        worker = self._idle.get()
        try:
            raw = self._attempt(worker, job)
            retried = False
            if self.retry_starved and isinstance(raw, dict) and starved_timeout(raw, job["limits"]):
                log.info("sandbox run stopped by the wall-clock limit with %.2f s of CPU: run again",
                         raw.get("cpu_s", 0.0))
                job = fresh_tokens(job)
                raw, retried = self._attempt(worker, job), True
                with self._lock:
                    self.starved_retries += 1
            if isinstance(raw, str):
                return _sandbox_error(raw, self.backend, len(job["tests"]))
            res = judge(job, raw, names, self.backend)
            res.unisolated = self.backend == "subprocess"
            res.retried = retried
            return res
        finally:
            self._idle.put(worker)

    def _attempt(self, worker: Worker, job: dict) -> dict | str:
        """The raw result of `job` on `worker` (a dead server is restarted and the job retried
        once), or the error text when the sandbox could not run it."""
        timeout = job["limits"]["wall_s"] + GRACE_S
        last_error = ""
        for attempt in range(2):
            if self._closed:
                return "SandboxPool was closed during the run"
            try:
                return worker.run(job, timeout)
            except TimeoutError:
                return _unanswered(timeout)
            except BackendError as e:
                last_error = str(e)
                log.warning("sandbox worker failed (attempt %d): %s", attempt + 1, e)
        return last_error

    def run_tests(self, code: str, tests: list[str], *, setup: str = "",
                  names: list[str] | None = None, limits: Limits | None = None,
                  backend: str | None = None, force_split: bool = False,
                  cache: bool = False, cache_scope: int | str | None = None) -> SandboxResult:
        """See :func:`agentrl.sandbox.run_tests` (``backend`` must be None or this pool's;
        ``force_split``: two processes even where every test is runner-decided,
        :func:`agentrl.sandbox.judge.make_job`; ``cache=True``: answer from the verdict cache
        when it holds the same job, and keep this verdict there; see the class;
        ``cache_scope``: part of the cache key, so that only calls of the same scope share a
        verdict, e.g. code_sandbox's episodes of one reset seed: one group of one step)."""
        self._check_backend(backend)
        if names is not None and len(names) != len(tests):
            raise ValueError(f"names has {len(names)} entries for {len(tests)} tests")
        limits = limits or self.limits

        def run() -> SandboxResult:
            return self._run(make_job("tests", code, tests, setup, "", limits, force_split), names)

        if not cache or not self.cache_size:
            return run()
        return self._cached(job_key(code, tests, setup, names, limits, force_split, cache_scope), limits, run)

    def _cached(self, key: str, limits: Limits, run: Callable[[], SandboxResult]) -> SandboxResult:
        """`run()`'s result, or a copy of the cached one for `key` (marked `cached`); a call
        whose key is running in another thread waits for that run and takes its verdict. When
        that run's verdict is not kept (`cacheable` refuses it, e.g. a `sandbox_error` or a
        starved timeout, or the run raised), the waiters run the job themselves, side by side
        (not one after another: N twins of a slow uncacheable program would take N runs' time
        and could pass the agent loop's step timeout)."""
        with self._lock:
            hit = self._hit(key)
            if hit is not None:
                return hit
            twin = self._inflight.get(key)
            if twin is None:
                mine = self._inflight[key] = threading.Event()
        if twin is not None:
            twin.wait()
            with self._lock:
                hit = self._hit(key)
            if hit is not None:
                return hit
            res = run()
            with self._lock:
                self._keep(key, res, limits)
            return res
        res: SandboxResult | None = None
        try:
            res = run()
            return res
        finally:
            with self._lock:
                del self._inflight[key]
                if res is not None:
                    self._keep(key, res, limits)
            mine.set()

    def _hit(self, key: str) -> SandboxResult | None:
        """A copy of the cached result of `key` marked `cached` (counted in `cache_hits`), or
        None. Call with `_lock` held."""
        hit = self._cache.get(key)
        if hit is None:
            return None
        self._cache.move_to_end(key)
        self.cache_hits += 1
        out = copy.deepcopy(hit)
        out.cached = True
        return out

    def _keep(self, key: str, res: SandboxResult, limits: Limits) -> None:
        """Cache a copy of `res` under `key` when `cacheable`, evicting the least recently used
        beyond `cache_size`. Call with `_lock` held."""
        if cacheable(res, limits):
            self._cache[key] = copy.deepcopy(res)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

    def run_code(self, code: str, *, stdin: str = "", limits: Limits | None = None,
                 backend: str | None = None) -> SandboxResult:
        """See :func:`agentrl.sandbox.run_code`."""
        self._check_backend(backend)
        return self._run(make_job("code", code, [], "", stdin, limits or self.limits), None)

    def map_tests(self, jobs: list[dict]) -> list[SandboxResult]:
        """Run many ``run_tests`` jobs (dicts of its keyword arguments) in parallel, in order."""
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.size, thread_name_prefix="agentrl-sbx")
        futures = [self._executor.submit(self._run_kwargs, j) for j in jobs]
        return [f.result() for f in futures]

    def _run_kwargs(self, job: dict) -> SandboxResult:
        return self.run_tests(**job)

    def _check_backend(self, backend: str | None) -> None:
        if backend not in (None, "auto", self.backend):
            raise ValueError(f"this pool runs backend {self.backend!r}, not {backend!r}")

    def close(self) -> None:
        """Kill every sandbox of the pool (idempotent)."""
        self._closed = True
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        for w in self._workers:
            w.shutdown()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


#: Results with more characters of text than this (`result_chars`: stdout, stderr and the error
#: texts) are not cached (memory: the cache holds at most `cache_size` x this much text).
CACHE_MAX_OUTPUT = 16_384
#: A timeout is cached when its run used at least this share of min(wall_s, cpu_s) CPU seconds.
CACHE_TIMEOUT_CPU_SHARE = 0.8


def job_key(code: str | bytes, tests: list[str], setup: str, names: list[str] | None,
            limits: Limits, force_split: bool, scope: int | str | None = None) -> str:
    """The verdict cache's key of a `run_tests` job: a SHA-256 over everything that decides
    its verdict (the sources as the sandbox runs them, `source_text`; the names, every limit
    and `force_split`) and the caller's `scope` (`run_tests`'s `cache_scope`). Per-run tokens
    are not part of it: they are drawn anew for every run. Raises TypeError for a source that
    is neither str nor bytes (as `make_job` does), or a scope that is not an int, str or None."""
    if scope is not None and (isinstance(scope, bool) or not isinstance(scope, (int, str))):
        raise TypeError(f"cache_scope must be an int, str or None, got {type(scope).__name__}")
    blob = json.dumps([source_text(code, "code"), [source_text(t, "tests[]") for t in tests],
                       source_text(setup, "setup"), names, limits.to_dict(), bool(force_split),
                       scope if scope is None or isinstance(scope, str) else int(scope)],
                      sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


def cacheable(res: SandboxResult, limits: Limits) -> bool:
    """May `res` (a run under `limits`) answer the same job again? Not a `sandbox_error` (the
    sandbox failed, not the code); a `timeout` only when the run had at least
    `CACHE_TIMEOUT_CPU_SHARE` of the CPU seconds it could have used (a CPU-bound loop, which
    an idle machine stops the same way; a run the load slowed may pass next time); not output
    beyond `CACHE_MAX_OUTPUT` characters of text (`result_chars`, memory)."""
    if res.verdict == "sandbox_error" or result_chars(res) > CACHE_MAX_OUTPUT:
        return False
    if res.verdict == "timeout":
        return res.cpu_s >= CACHE_TIMEOUT_CPU_SHARE * min(limits.wall_s, limits.cpu_s)
    return True


def result_chars(res: SandboxResult) -> int:
    """Characters of text `res` holds: stdout, stderr, its error and every test's name and error
    (a task with many tests, or a one-process solution writing report lines, can put up to the
    report's 1 MiB into the error texts while printing nothing)."""
    return (len(res.stdout) + len(res.stderr) + len(res.error or "")
            + sum(len(t.name) + len(t.error or "") for t in res.tests))


#: A wall-clock timeout is starved (`starved_timeout`) when the run had less than this share of
#: the CPU seconds it could have used before the deadline.
STARVED_CPU_SHARE = 0.1


def starved_timeout(raw: dict, limits: dict) -> bool:
    """Did the wall-clock limit stop a run that the machine's load starved of CPU?

    True when `raw` (the server's result, or `_unanswered`'s) is a wall-clock timeout and its
    processes used less than `STARVED_CPU_SHARE` of min(`wall_s`, `cpu_s`) CPU seconds. A
    CPU-bound loop on a free core uses about `wall_s` (or is stopped by its CPU limit first),
    so it is not retried; a run that waited for a core (load), or one that sleeps or blocks
    (a second run stops it the same way), is. Units: seconds.
    """
    if not raw.get("timeout"):
        return False
    room = min(float(limits["wall_s"]), float(limits["cpu_s"]))
    return float(raw.get("cpu_s") or 0.0) < STARVED_CPU_SHARE * room


def fresh_tokens(job: dict) -> dict:
    """`job` for a second run: a copy with new per-run secret tokens when it runs split (a
    one-process job's tokens are plain markers and stay)."""
    if not job.get("split"):
        return job
    return {**job, "tokens": [secrets.token_hex(16) for _ in job["tokens"]]}


def _unanswered(timeout: float) -> dict:
    """Raw result for a server that did not answer in time (it has been killed)."""
    return {"stdout": "", "stderr": "", "report": "", "exit_code": None, "signal": None,
            "timeout": True, "output_limit": False, "wall_s": timeout, "cpu_s": 0.0}


_default_pools: dict[str, SandboxPool] = {}
_default_lock = threading.Lock()


def default_pool(backend: str = "auto") -> SandboxPool:
    """The process-wide pool for ``backend`` (one worker per core), created on first use."""
    with _default_lock:
        pool = _default_pools.get(backend)
        if pool is None:
            pool = SandboxPool(backend=backend)
            _default_pools[backend] = pool
            if backend != pool.backend:
                _default_pools.setdefault(pool.backend, pool)
        return pool


@atexit.register
def _close_default_pools() -> None:
    for pool in set(_default_pools.values()):
        pool.close()
