"""`python`: run a snippet of Python code in agentrl's sandbox and return what it printed.

The sandbox (`agentrl.sandbox.run_code`) enforces wall-time, CPU, memory, process and output
limits; this tool only formats its result for the agent.
"""

from __future__ import annotations

from typing import Any

from agentrl_tools.registry import Tool, tool


def format_sandbox_result(result: Any) -> str:
    """Observation text of a `SandboxResult`: stdout, then stderr when there is any, then the
    verdict and its reason when it is not `pass` (timeout, runtime_error, memory_limit, ...).

    Format::

        <stdout>
        [stderr]
        <stderr>
        [verdict: timeout] <error>
    """
    parts: list[str] = []
    if result.stdout:
        parts.append(result.stdout.rstrip("\n"))
    if result.stderr:
        parts.append("[stderr]\n" + result.stderr.rstrip("\n"))
    if result.verdict != "pass":
        parts.append(f"[verdict: {result.verdict}]" + (f" {result.error}" if result.error else ""))
    return "\n".join(parts) if parts else "[no output]"


def make_python_tool(*, limits: Any = None, backend: str = "auto", name: str = "python") -> Tool:
    """A `python` tool running code through `agentrl.sandbox.run_code` with these limits.

    Args:
        limits: `agentrl.sandbox.Limits` (None: the sandbox's defaults, 5 s wall and CPU,
            512 MiB).
        backend: sandbox backend ("auto", "bwrap", "docker", "subprocess").
        name: tool name shown to the agent.
    """

    def python(code: str) -> str:
        """Run Python code in a sandbox and return its printed output (stdout, then stderr).

        Each call starts a fresh interpreter: nothing persists between calls. Print what you
        want to see.

        Args:
            code: a complete Python program.
        """
        from agentrl.sandbox import run_code

        return format_sandbox_result(run_code(code, limits=limits, backend=backend))

    return tool(python, name=name)


#: the `python` tool with the sandbox's default limits
python = make_python_tool()
