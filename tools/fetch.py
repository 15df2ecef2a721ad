"""`fetch`: HTTP GET through `httpx`, restricted to an allow-list of hosts, with a timeout, a size
cap, and HTML turned into plain text by the standard library's `html.parser`.

Allow-list entries: `"host"` (any port), `"host:port"`, or `"*.example.org"` (that domain's
subdomains). Redirects are followed by hand (at most `max_redirects`) and every hop is checked
against the allow-list, so an allowed host cannot redirect the agent elsewhere.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterable, Sequence
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

import httpx

from agentrl.infra.http_deadline import (
    DeadlineExceeded,
    fresh_connection_limits,
    request_with_deadline,
)
from agentrl_tools.registry import Tool, ToolError, tool

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")

_BLOCK_TAGS = {"address", "article", "aside", "blockquote", "dd", "div", "dl", "dt", "figcaption",
               "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6", "header", "hr", "li",
               "main", "nav", "ol", "p", "pre", "section", "table", "td", "th", "tr", "ul", "title"}
_BR = "\x00"  # stands for <br> until whitespace is collapsed
_SKIP_TAGS = {"script", "style", "noscript", "template", "svg", "head"}


class _TextExtractor(HTMLParser):
    """Collects visible text; block elements start new paragraphs, `<br>` a new line."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.blocks: list[list[str]] = [[]]
        self.skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIP_TAGS:
            self.skip += 1
        elif tag == "br":
            self.blocks[-1].append(_BR)
        elif tag in _BLOCK_TAGS:
            self.blocks.append([])
            if tag == "li":
                self.blocks[-1].append("- ")

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIP_TAGS:
            self.skip = max(0, self.skip - 1)
        elif tag in _BLOCK_TAGS:
            self.blocks.append([])

    def handle_data(self, data: str) -> None:
        if not self.skip:
            self.blocks[-1].append(data)


# a `<` whose tag never closes before the next `<` (or the end): `[^<>]*` runs are disjoint, so
# finding them all is linear
_UNCLOSED_LT = re.compile(r"<(?=[^<>]*(?:<|\Z))")


def _drop_comments(page: str) -> str:
    """`page` without `<!-- ... -->` comments (an unclosed one drops the rest), by `str.find`."""
    out, pos = [], 0
    while (start := page.find("<!--", pos)) >= 0:
        out.append(page[pos:start])
        end = page.find("-->", start + 4)
        if end < 0:
            return "".join(out)
        pos = end + 3
    out.append(page[pos:])
    return "".join(out)


def html_to_text(page: str) -> str:
    """Visible text of an HTML page: paragraphs (block elements) separated by a blank line,
    whitespace inside a paragraph collapsed, `<br>` kept as a line break, list items prefixed
    with `- `; `<head>`, scripts and styles dropped.

    Linear time: the standard library's `html.parser` rescans the rest of the page from every
    tag that is never closed (quadratic: `"<a " * 33_000` took 105 s), so comments are dropped
    first and every `<` not closed by a `>` before the next `<` is shown as text (`&lt;`). A page
    where a `<` sits inside an attribute value (`alt="a<b"`) shows that tag as text.
    """
    parser = _TextExtractor()
    parser.feed(_UNCLOSED_LT.sub("&lt;", _drop_comments(page)))
    parser.close()
    out = []
    for parts in parser.blocks:
        lines = [re.sub(r"\s+", " ", line).strip() for line in "".join(parts).split(_BR)]
        text = "\n".join(line for line in lines if line)
        if text and text != "-":
            out.append(text)
    return "\n\n".join(out)


def host_allowed(url: str, allowed_hosts: Iterable[str]) -> bool:
    """Whether `url` is http(s) and its host (and port, where the entry names one) is allowed."""
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return False
    host = (parts.hostname or "").lower()
    if parts.scheme not in ("http", "https") or not host:
        return False
    for entry in allowed_hosts:
        entry = entry.lower().strip()
        if entry.startswith("[") or entry.count(":") > 1:  # IPv6, optionally [addr]:port
            m = re.match(r"^\[(.+)\](?::(\d+))?$", entry)
            e_host, e_port = (m.group(1), m.group(2)) if m else (entry, None)
        else:
            e_host, _, e_port = entry.partition(":")
        if e_port and int(e_port) != port:
            continue
        if e_host == host or (e_host.startswith("*.") and host.endswith(e_host[1:])):
            return True
    return False


def make_fetch_tool(allowed_hosts: Sequence[str], *, timeout_s: float = 5.0, max_bytes: int = 1_000_000,
                    max_chars: int = 6000, max_redirects: int = 3, name: str = "fetch") -> Tool:
    """A `fetch(url)` tool for the given hosts.

    Args:
        allowed_hosts: hosts the agent may fetch from (see the module docstring).
        timeout_s: time limit of the whole fetch, redirects included (connect, send and every
            read together; a server dripping bytes is cut off at the limit), seconds.
        max_bytes: bytes read at most from a response body; the rest is dropped (noted).
        max_chars: characters of page text returned at most (the rest is dropped, noted).
        max_redirects: redirects followed at most.
        name: tool name shown to the agent.
    """
    hosts = tuple(allowed_hosts)

    def fetch(url: str) -> str:
        """Fetch a web page by URL and return its text (HTML converted to plain text).

        Args:
            url: an http(s) URL, e.g. one returned by search.
        """
        return fetch_text(url, hosts, timeout_s=timeout_s, max_bytes=max_bytes,
                          max_chars=max_chars, max_redirects=max_redirects)

    return tool(fetch, name=name)


_CLIENTS: dict[bool, httpx.Client] = {}
_CLIENTS_LOCK = threading.Lock()


def _client(trust_env: bool) -> httpx.Client:
    """A shared client (making one costs ~0.1-0.7 s for its SSL context; clients are
    thread-safe), without keep-alive (`agentrl.infra.http_deadline`). trust_env=False for loopback: a proxy from the environment must not
    intercept requests to the local corpus server."""
    with _CLIENTS_LOCK:
        if trust_env not in _CLIENTS:
            _CLIENTS[trust_env] = httpx.Client(follow_redirects=False, trust_env=trust_env,
                                               limits=fresh_connection_limits())
        return _CLIENTS[trust_env]


def fetch_text(url: str, allowed_hosts: Sequence[str], *, timeout_s: float = 5.0,
               max_bytes: int = 1_000_000, max_chars: int = 6000, max_redirects: int = 3) -> str:
    """GET `url` and return its text; see `make_fetch_tool` for the arguments.

    Raises:
        ToolError: a URL with a control character, host not allowed (checked before any
            connection, and at every redirect),
            HTTP error status, too many redirects, a non-text content type, timeout or
            connection failure.
    """
    deadline = time.monotonic() + timeout_s
    for _ in range(max_redirects + 1):
        bad = next((c for c in url if ord(c) < 32 or ord(c) == 127), None)
        if bad is not None:  # urlsplit drops \t \r \n silently; httpx refuses them (InvalidURL)
            raise ToolError(f"invalid URL {url[:200]!r}: it contains the control character {bad!r}")
        if not host_allowed(url, allowed_hosts):
            shown = ", ".join(allowed_hosts) or "none"
            raise ToolError(f"fetching {url!r} is not allowed: its host is not in the allowed hosts ({shown})")
        loopback = (urlsplit(url).hostname or "") in LOOPBACK_HOSTS
        left = deadline - time.monotonic()
        if left <= 0:
            raise ToolError(f"fetching {url} took longer than {timeout_s:g} s")
        try:
            r = request_with_deadline(_client(trust_env=not loopback), "GET", url, timeout_s=left,
                                      max_bytes=max_bytes, truncate=True,
                                      headers={"User-Agent": "agentrl-fetch/1"})
        except DeadlineExceeded:
            raise ToolError(f"fetching {url} took longer than {timeout_s:g} s") from None
        except (httpx.HTTPError, httpx.InvalidURL) as e:
            raise ToolError(f"fetching {url} failed: {type(e).__name__}: {e}") from None
        if r.status_code in (301, 302, 303, 307, 308) and "location" in r.headers:
            url = urljoin(url, r.headers["location"])
            continue
        if r.status_code >= 400:
            raise ToolError(f"HTTP {r.status_code} for {url}")
        ctype = r.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype and not (ctype.startswith("text/") or ctype in ("application/json", "application/xhtml+xml")):
            raise ToolError(f"cannot read content type {ctype!r} from {url}")
        raw, cut = r.text, r.truncated
        text = html_to_text(raw) if ctype in ("text/html", "application/xhtml+xml") or (
            not ctype and raw.lstrip()[:1] == "<") else raw.strip()
        if len(text) > max_chars:
            text = text[:max_chars] + f"\n[... {len(text) - max_chars} more characters truncated]"
        if cut:
            text += f"\n[page cut at {max_bytes} bytes]"
        return text
    raise ToolError(f"too many redirects (more than {max_redirects})")


#: a `fetch` tool allowed to reach loopback hosts only (a local corpus server)
fetch = make_fetch_tool(LOOPBACK_HOSTS)
