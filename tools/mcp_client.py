"""Tools served by MCP servers (the `mcp` SDK, extra `mcp`): a server's `list_tools` become
`Tool` objects whose calls go to the server's `call_tool`.

A server is a stdio command (started as a subprocess) or a streamable-HTTP URL on loopback
(127.0.0.1, localhost, ::1; any other host is refused). Each process keeps one live connection
per server spec (`shared_connection`), shared by every env of the process, on one background
thread that runs an asyncio loop for all of them; the MCP session carries concurrent calls.

Failures are tool errors, never exceptions out of the env (contract 7):

- the tool raised, or the server refused the arguments: the server's `is_error` result ->
  `ToolError` with its text (kind `tool_error`);
- no answer within the tool timeout: `ToolTimeout` (kind `timeout`); the request is cancelled
  and the server is asked for its tool list at the next `ensure_alive` (a server that does not
  answer within `PING_TIMEOUT_S` is restarted);
- the server died (the connection closed) or is down: `ToolError` naming the server, the tail of
  its stderr, and that it restarts at the next episode (`ensure_alive`, called by the env's
  reset).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import json
import os
import shlex
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import anyio
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

from agentrl_tools.executor import ToolTimeout
from agentrl_tools.registry import JSON, Tool, ToolArgumentError, ToolError

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
"""The only hosts a streamable-HTTP server URL may name."""

PING_TIMEOUT_S = 5.0
"""After a call timed out, the server must answer a `tools/list` request within this many seconds at the next
`ensure_alive`, else it is restarted (a hung server)."""

_CLOSED = (MCPError, anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream,
           ConnectionError, EOFError)


@dataclass(frozen=True)
class ServerSpec:
    """One MCP server: a stdio `command` (argv) or a streamable-HTTP `url`.

    `name` labels it in errors; `prefix` is prepended to its tool names (two servers with a
    tool of the same name need one); `env` (extra environment variables) and `cwd` apply to a
    command.
    """

    name: str
    command: tuple[str, ...] = ()
    url: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    prefix: str = ""


def _check_url(url: str, where: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or (parts.hostname or "") not in LOOPBACK_HOSTS:
        raise ValueError(f"{where}: MCP server URL {url!r} must be http(s) on loopback "
                         f"({', '.join(LOOPBACK_HOSTS)}); other hosts are not reached")
    return url


def parse_servers(servers: Any, where: str = "env.kwargs.servers") -> list[ServerSpec]:
    """`ServerSpec`s of the config value `servers`: a list whose entries are a URL string, a
    command line string (split as a shell would, `shlex`), a list of argv strings, or a dict
    with `command` (string or list) and optional `args`, `env`, `cwd`, or with `url`; a dict
    may also give `name` and `prefix`. A single entry (not in a list) is one server.

    Raises:
        ValueError: no servers, an entry of another shape, an empty command, a URL that is not
            on loopback, or two entries with the same name; the message names the entry.
    """
    if isinstance(servers, str | dict):
        servers = [servers]
    if not isinstance(servers, Sequence) or not servers:
        raise ValueError(f"{where}: give the MCP servers, a list of commands or loopback URLs "
                         "(e.g. ['python my_server.py'] or ['http://127.0.0.1:8000/mcp'])")
    specs: list[ServerSpec] = []
    for i, entry in enumerate(servers):
        at = f"{where}[{i}]"
        spec = dict(entry) if isinstance(entry, dict) else {"command": entry}
        unknown = set(spec) - {"command", "args", "env", "cwd", "url", "name", "prefix"}
        if unknown:
            raise ValueError(f"{at}: unknown key(s) {sorted(unknown)}; expected command, args, env, "
                             "cwd, url, name, prefix")
        cmd = spec.get("command")
        if isinstance(cmd, str) and cmd.startswith(("http://", "https://")):
            spec["url"], cmd = cmd, None
        if spec.get("url") is not None:
            if cmd is not None:
                raise ValueError(f"{at}: give a command or a url, not both")
            url = _check_url(str(spec["url"]), at)
            specs.append(ServerSpec(name=str(spec.get("name", url)), url=url,
                                    prefix=str(spec.get("prefix", ""))))
            continue
        argv = shlex.split(cmd) if isinstance(cmd, str) else cmd
        if not isinstance(argv, list | tuple) or not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError(f"{at}: a server is a command (string or list of strings) or a url, "
                             f"got {entry!r}")
        argv = [*argv, *map(str, spec.get("args", []))]
        env = spec.get("env") or {}
        if not isinstance(env, dict):
            raise ValueError(f"{at}: env must be a mapping of variable names to values")
        script = next((a for a in argv[1:] if not a.startswith("-")), argv[0])
        specs.append(ServerSpec(name=str(spec.get("name", os.path.basename(script))), command=tuple(argv),
                                env=tuple(sorted((str(k), str(v)) for k, v in env.items())),
                                cwd=None if spec.get("cwd") is None else str(spec["cwd"]),
                                prefix=str(spec.get("prefix", ""))))
    names = [s.name for s in specs]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise ValueError(f"{where}: two servers are named {dup!r}; give each a distinct 'name'")
    return specs


# -- the background loop ---------------------------------------------------------------------

_LOOP_LOCK = threading.Lock()
_LOOP: asyncio.AbstractEventLoop | None = None


def _loop() -> asyncio.AbstractEventLoop:
    """The process's MCP event loop (started on first use, on a daemon thread)."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, daemon=True, name="mcp-loop").start()
            _LOOP = loop
        return _LOOP


class StderrTail:
    """A stdio server's stderr: a pipe whose write end the server inherits, read by a daemon
    thread that keeps the last `keep` characters (a server that logs every call cannot fill a
    disk, and a crash's traceback is at hand for the error message)."""

    def __init__(self, keep: int = 4000):
        r, w = os.pipe()
        self.file = os.fdopen(w, "w", encoding="utf-8", errors="replace")
        self._keep, self._text, self._lock = keep, "", threading.Lock()
        self._eof = threading.Event()
        threading.Thread(target=self._read, args=(r,), daemon=True, name="mcp-stderr").start()

    def _read(self, fd: int) -> None:
        try:
            with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as f:
                while True:
                    chunk = f.read1(4096) if hasattr(f, "read1") else f.readline()
                    if not chunk:
                        return
                    with self._lock:
                        self._text = (self._text + chunk)[-self._keep:]
        finally:
            self._eof.set()

    def settle(self, timeout_s: float = 1.0) -> None:
        """For a server that died: close our write end and wait up to `timeout_s` seconds for
        the reader to reach the end (the server's copy closes when it exits), so the tail holds
        the last lines it wrote (a crash's message is written just before the connection
        closes, and the reader thread may not have read it yet)."""
        self.close()
        self._eof.wait(timeout_s)

    def text(self) -> str:
        with self._lock:
            return self._text

    def close(self) -> None:
        """Close our copy of the write end (the reader ends when the server's copy closes too)."""
        try:
            self.file.close()
        except OSError:
            pass


def _result_text(result: Any) -> str:
    """A `CallToolResult`'s content as text: its text blocks joined by newlines, other blocks as
    `[<type> content]`; with no content, its structured content as JSON."""
    parts = [getattr(b, "text", None) if getattr(b, "type", "") == "text" else f"[{getattr(b, 'type', '?')} content]"
             for b in result.content or []]
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False, default=str)
    return "\n".join(p for p in parts if p is not None)


class MCPConnection:
    """A live client session with one MCP server, driven on the shared loop; `call` is
    synchronous (for `ToolRunner`'s threads).

    Args:
        spec: the server.
        connect_timeout_s: seconds to start the server, connect and list its tools.
    """

    def __init__(self, spec: ServerSpec, connect_timeout_s: float = 30.0):
        self.spec = spec
        self.connect_timeout_s = connect_timeout_s
        self.tools: list[Any] = []  # mcp Tool objects (name, description, input_schema)
        self.starts = 0
        self._lock = threading.Lock()
        self._client: Any = None
        self._stop: asyncio.Event | None = None
        self._holder: concurrent.futures.Future | None = None
        self._dead = True
        self._suspect = False
        self._errlog: Any = None
        self._gen = 0

    # -- life cycle ------------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        """Connected, and no call has seen the connection close since."""
        return not self._dead and self._holder is not None and not self._holder.done()

    def start(self) -> None:
        """Start (or restart) the server and list its tools (all pages).

        Raises:
            ConnectionError: it did not start, connect or list its tools within
                `connect_timeout_s` (the message names the server and ends with its stderr).
        """
        with self._lock:
            self._start_locked()

    def start_if_down(self) -> None:
        """`start` unless it is up (checked under the lock, so racing envs start it once)."""
        with self._lock:
            if not self.alive:
                self._start_locked()

    def _start_locked(self) -> None:
        self._close_locked()
        self._gen += 1
        ready: concurrent.futures.Future = concurrent.futures.Future()
        self._errlog = StderrTail() if self.spec.url is None else None
        self._holder = asyncio.run_coroutine_threadsafe(self._hold(ready, self._gen), _loop())
        try:
            ready.result(self.connect_timeout_s)
        except BaseException as e:  # noqa: BLE001 - re-raised with the server named
            tail = self.stderr_tail()
            self._close_locked()
            why = "timed out" if isinstance(e, concurrent.futures.TimeoutError) else f"{type(e).__name__}: {e}"
            raise ConnectionError(f"MCP server {self.spec.name!r} ({self._where()}) did not start: "
                                  f"{why}{tail}") from None
        self._dead, self._suspect = False, False
        self.starts += 1

    def _where(self) -> str:
        return self.spec.url or shlex.join(self.spec.command)

    def _transport(self) -> Any:
        if self.spec.url is not None:
            return self.spec.url
        params = StdioServerParameters(command=self.spec.command[0], args=list(self.spec.command[1:]),
                                       env=dict(self.spec.env) or None, cwd=self.spec.cwd)
        return stdio_client(params, errlog=self._errlog.file)

    async def _hold(self, ready: concurrent.futures.Future, gen: int) -> None:
        """Enter the client, list the tools, then hold the session open until `_stop`."""
        self._stop = stop = asyncio.Event()
        try:
            async with Client(self._transport(), cache=None) as client:
                tools, cursor = [], None
                while True:
                    page = await client.list_tools(cursor=cursor)
                    tools += list(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
                self.tools, self._client = tools, client
                ready.set_result(None)
                await stop.wait()
        except BaseException as e:  # noqa: BLE001 - reported through `ready` or as a dead server
            if not ready.done():
                ready.set_exception(e if isinstance(e, Exception) else RuntimeError(repr(e)))
        finally:
            if gen == self._gen:  # not a restarted session's
                self._client, self._dead = None, True

    def ensure_alive(self) -> bool:
        """Restart the server if it died, or if it timed out a call and does not answer a tool
        listing within `PING_TIMEOUT_S`. Returns whether it is up; a failed restart leaves it down (its
        calls are tool errors) and is tried again at the next call of this method."""
        if self.alive and self._suspect:
            try:
                # a listing, not `ping` (removed in the 2026-07-28 protocol); no cache (cache=None)
                asyncio.run_coroutine_threadsafe(self._client.list_tools(), _loop()).result(PING_TIMEOUT_S)
                self._suspect = False
            except Exception:  # noqa: BLE001 - no answer: restart it
                self._dead = True
        if self.alive:
            return True
        try:
            self.start_if_down()
        except ConnectionError:
            return False
        return True

    def _close_locked(self) -> None:
        if self._holder is not None and not self._holder.done() and self._stop is not None:
            _loop().call_soon_threadsafe(self._stop.set)
            try:
                self._holder.result(10.0)  # the stdio client closes stdin, then terminates the process
            except Exception:  # noqa: BLE001 - closing a broken session
                pass
        self._holder, self._dead = None, True
        if self._errlog is not None:
            self._errlog.close()
            self._errlog = None

    def close(self) -> None:
        """Stop the session (a stdio server process is ended)."""
        with self._lock:
            self._close_locked()

    def stderr_tail(self, n: int = 400) -> str:
        """`"; stderr: ..."` with the last `n` characters the server wrote on stderr, or ''."""
        text = " ".join(self._errlog.text().split())[-n:] if self._errlog is not None else ""
        return f"; stderr: ...{text}" if text else ""

    # -- calls -----------------------------------------------------------------------------------

    def call(self, name: str, arguments: dict[str, Any], timeout_s: float | None) -> str:
        """Call tool `name` on the server; its result as text.

        Raises:
            ToolTimeout: no answer within `timeout_s` seconds (the request is cancelled).
            ToolError: the server's error result, a protocol error, or the server is down or
                died during the call.
        """
        client = self._client
        if not self.alive or client is None:
            raise ToolError(f"MCP server {self.spec.name!r} is down; it is restarted at the next "
                            "episode")

        async def run() -> Any:
            return await asyncio.wait_for(client.call_tool(name, arguments), timeout_s)

        fut = asyncio.run_coroutine_threadsafe(run(), _loop())
        try:
            result = fut.result(None if timeout_s is None else timeout_s + 5.0)
        except (TimeoutError, asyncio.TimeoutError, concurrent.futures.TimeoutError):
            fut.cancel()
            self._suspect = True
            raise ToolTimeout(f"timed out after {timeout_s:g} s") from None
        except _CLOSED as e:
            if isinstance(e, MCPError) and "closed" not in str(e).lower():
                raise ToolError(f"MCP server {self.spec.name!r}: {e}") from None
            self._dead = True
            if self._errlog is not None:
                self._errlog.settle()
            raise ToolError(f"MCP server {self.spec.name!r} closed the connection during the call "
                            f"(it crashed or exited){self.stderr_tail(300)}; it is restarted at the "
                            "next episode") from None
        except Exception as e:  # noqa: BLE001 - e.g. an HTTP server that went away: probed at reset
            self._suspect = True
            raise ToolError(f"MCP server {self.spec.name!r}: the call failed: {type(e).__name__}: {e}") from None
        if result.is_error:
            raise ToolError(_result_text(result) or f"tool {name!r} failed (no message)")
        return _result_text(result)


class MCPTool(Tool):
    """A tool of an MCP server. `validate` checks only that the arguments are an object with
    the schema's required keys: the server validates the rest (its refusal is a tool error)."""

    def validate(self, arguments: Any) -> dict[str, Any]:
        if not isinstance(arguments, dict):
            raise ToolArgumentError(f"arguments of {self.name!r} must be a JSON object")
        missing = [k for k in self.parameters.get("required", []) if k not in arguments]
        if missing:
            raise ToolArgumentError(
                f"missing required argument(s) {', '.join(map(repr, missing))} for {self.name!r}")
        return dict(arguments)


def connection_tools(conn: MCPConnection, timeout_s: float | None) -> list[Tool]:
    """The server's tools as `MCPTool`s (names with the spec's prefix; schema the server's
    `input_schema`; each call waits at most `timeout_s`)."""
    out: list[Tool] = []
    for t in conn.tools:
        def fn(_name: str = t.name, **kwargs: Any) -> str:
            return conn.call(_name, kwargs, timeout_s)

        params: JSON = dict(t.input_schema or {"type": "object", "properties": {}})
        out.append(MCPTool(fn=fn, name=conn.spec.prefix + t.name, description=t.description or "",
                           parameters=params))
    return out


_SHARED_LOCK = threading.Lock()
_SHARED: dict[ServerSpec, MCPConnection] = {}


def shared_connection(spec: ServerSpec, connect_timeout_s: float = 30.0) -> MCPConnection:
    """The process's connection to `spec`, started on first use (and restarted if down).

    Raises:
        ConnectionError: see `MCPConnection.start`.
    """
    with _SHARED_LOCK:
        conn = _SHARED.get(spec)
        if conn is None:
            conn = _SHARED[spec] = MCPConnection(spec, connect_timeout_s)
    if not conn.alive:
        conn.start_if_down()
    return conn


def close_all() -> None:
    """Close every shared connection (run at exit, so that no server process outlives us)."""
    with _SHARED_LOCK:
        conns = list(_SHARED.values())
        _SHARED.clear()
    for c in conns:
        try:
            c.close()
        except Exception as e:  # noqa: BLE001 - best effort at exit
            print(f"[mcp] closing {c.spec.name}: {e}", file=sys.stderr)


atexit.register(close_all)
