"""HTTP requests bounded as a whole: one deadline across connect, send and every read, and a cap
on the reply's size (used by the judge client and the web fetch tool).

`httpx` timeouts bound each socket operation, not the request: a server that drips one byte
every 0.5 s keeps a `timeout=2` request alive for as long as it likes. Here:

- the request is streamed and every chunk is checked against a `time.monotonic()` deadline;
- a watchdog timer shuts the connection's socket down at the deadline, which wakes a read
  blocked inside `httpx` (also while the headers are still dripping in). The socket is learnt
  from httpcore's `trace` request extension (`connection.connect_tcp` / `start_tls`), so the
  client must open a new connection per request: make it with `fresh_connection_limits()`
  (no keep-alive; one TCP, and for https one TLS, handshake per request);
- a `Content-Length` above `max_bytes` is refused before reading the body, and a body that
  grows past it is refused (or, with `truncate=True`, cut) as soon as it does, so a 150 MB reply
  is never buffered.

The client's own settings (environment proxies with `trust_env`, headers, TLS) are untouched.
Not bounded by the deadline: DNS resolution of a host name (the system resolver cannot be
interrupted; an IP address or a local name resolves at once).
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx


class DeadlineExceeded(Exception):
    """The whole request took longer than its time limit."""


class ReplyTooLarge(Exception):
    """The reply's body is larger than the size cap."""


@dataclass
class Reply:
    """A finished response: status, headers, the body (at most `max_bytes`), whether it was cut."""

    status_code: int
    headers: httpx.Headers
    content: bytes
    encoding: str | None = None
    truncated: bool = False
    elapsed_s: float = 0.0
    url: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """The body decoded with the response's charset (UTF-8 when none), bad bytes replaced."""
        return self.content.decode(self.encoding or "utf-8", errors="replace")


def fresh_connection_limits(max_connections: int | None = None) -> httpx.Limits:
    """`httpx.Limits` for a client used with `request_with_deadline`: no keep-alive, so every
    request opens (and reports) its own connection, which the watchdog can shut down."""
    return httpx.Limits(max_connections=max_connections, max_keepalive_connections=0)


class _Watchdog:
    """Collects the sockets of one request and shuts them down when the deadline passes."""

    def __init__(self) -> None:
        self.sockets: list[socket.socket] = []
        self.fired = False
        self._lock = threading.Lock()

    def trace(self, event: str, info: dict[str, Any]) -> None:
        """httpcore `trace` extension: remember the socket of every new (TLS) stream."""
        if event.endswith(("connect_tcp.complete", "start_tls.complete")):
            stream = info.get("return_value")
            sock = stream.get_extra_info("socket") if stream is not None else None
            if sock is not None:
                with self._lock:
                    self.sockets.append(sock)
                    fired = self.fired
                if fired:  # connected just as the deadline passed
                    _shutdown(sock)

    def fire(self) -> None:
        with self._lock:
            self.fired = True
            sockets = list(self.sockets)
        for sock in sockets:
            _shutdown(sock)


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)  # wakes a blocked recv/send in another thread
    except OSError:
        pass  # already closed


def request_with_deadline(client: httpx.Client, method: str, url: str, *, timeout_s: float,
                          max_bytes: int, truncate: bool = False, **kwargs: Any) -> Reply:
    """`client.request(method, url, **kwargs)` finished within `timeout_s` seconds in all.

    Args:
        client: an `httpx.Client` made with `limits=fresh_connection_limits(...)` (with
            keep-alive, a reused connection cannot be shut down and only `httpx`'s per-read
            timeout bounds a stalled read).
        timeout_s: wall-clock limit of the whole request (connect, send, headers, body), s.
        max_bytes: largest body accepted, bytes (decoded, i.e. after any gzip).
        truncate: cut a larger body at `max_bytes` (and set `truncated`) instead of refusing.
        **kwargs: passed to `client.stream` (`json=`, `headers=`, ...).

    Returns:
        a `Reply`.

    Raises:
        DeadlineExceeded: the limit passed (the message says after how long).
        ReplyTooLarge: the body (or its `Content-Length`) is over `max_bytes` and not `truncate`.
        httpx.HTTPError: any other transport failure (connection refused, protocol error).
    """
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    dog = _Watchdog()
    timer = threading.Timer(timeout_s, dog.fire)
    timer.daemon = True
    timer.start()
    extensions = {**kwargs.pop("extensions", {}), "trace": dog.trace}

    def expired() -> DeadlineExceeded:
        return DeadlineExceeded(f"no complete reply within {timeout_s:g} s "
                                f"(after {time.monotonic() - t0:.1f} s)")

    try:
        with client.stream(method, url, timeout=httpx.Timeout(timeout_s), extensions=extensions,
                           **kwargs) as r:
            length = r.headers.get("content-length", "")
            if length.isdigit() and int(length) > max_bytes and not truncate:
                raise ReplyTooLarge(f"reply of {int(length)} bytes is over the {max_bytes}-byte cap")
            body, cut = bytearray(), False
            for chunk in r.iter_bytes():
                body.extend(chunk)
                if len(body) > max_bytes:
                    if not truncate:
                        raise ReplyTooLarge(f"reply is over the {max_bytes}-byte cap")
                    del body[max_bytes:]
                    cut = True
                    break
                if time.monotonic() > deadline:
                    raise expired()
            if time.monotonic() > deadline:
                raise expired()
            return Reply(r.status_code, r.headers, bytes(body), r.charset_encoding, cut,
                         time.monotonic() - t0, str(r.url))
    except httpx.TimeoutException:
        raise expired() from None
    except httpx.HTTPError:
        if dog.fired or time.monotonic() > deadline:  # the watchdog cut the connection
            raise expired() from None
        raise
    finally:
        timer.cancel()
