"""A document corpus and the small HTTP server that serves it (`agentrl serve-corpus DIR`).

Corpus formats accepted by `load_documents`:
- a directory of `.txt`/`.md` files: the first non-empty line is the title (a leading `#` is
  dropped), the rest is the text; the file name (without extension) is the slug;
- a `.jsonl` file, one document per line: `{"title": ..., "text": ...}` with optional `"id"`
  (the slug) and `"url"` (kept as `source_url`);
- a HotpotQA-style `.json` file (a list of records with `"context": [[title, [sentences]], ...]`):
  every context paragraph becomes a document (deduplicated by title).

The server (stdlib `ThreadingHTTPServer`) serves `GET /` (an HTML index linking every document),
`GET /doc/<slug>` (the document as an HTML page: `<h1>` title, one `<p>` per paragraph) and
`GET /healthz`; anything else is 404. It binds to loopback unless told otherwise.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import sys
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote


@dataclass(frozen=True)
class Document:
    """One corpus document. `slug` is its unique id and URL path part (`/doc/<slug>`)."""

    slug: str
    title: str
    text: str
    source_url: str = ""


def slugify(text: str) -> str:
    """Lower-case ASCII letters, digits and single dashes (`"Ilse Marrow (1839)"` ->
    `"ilse-marrow-1839"`); `"doc"` when nothing is left."""
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return s or "doc"


def _unique(slugs: Iterable[str]) -> list[str]:
    """Make slugs unique by suffixing `-2`, `-3`, ... to repeats, in order."""
    seen: dict[str, int] = {}
    out = []
    for s in slugs:
        n = seen.get(s, 0) + 1
        seen[s] = n
        out.append(s if n == 1 else f"{s}-{n}")
    return out


def make_documents(records: Iterable[dict[str, Any]]) -> list[Document]:
    """Documents from dicts with `title`, `text` and optional `id`/`slug` and `url`.

    Raises:
        ValueError: a record without a str `title` or `text`.
    """
    rows = list(records)
    for i, r in enumerate(rows):
        if not isinstance(r.get("title"), str) or not isinstance(r.get("text"), str):
            raise ValueError(f"corpus record {i}: needs str 'title' and 'text', got keys {sorted(r)}")
    slugs = _unique(slugify(str(r.get("id") or r.get("slug") or r["title"])) for r in rows)
    return [Document(s, r["title"].strip(), r["text"].strip(), str(r.get("url") or ""))
            for s, r in zip(slugs, rows, strict=True)]


def hotpot_documents(records: Iterable[dict[str, Any]]) -> list[Document]:
    """Documents from HotpotQA-style records: each `[title, [sentences]]` context paragraph is
    one document (text: the sentences joined by spaces); a title seen twice is kept once."""
    seen: set[str] = set()
    rows = []
    for rec in records:
        for title, sentences in rec.get("context", []):
            if title in seen:
                continue
            seen.add(title)
            text = " ".join(s.strip() for s in sentences).strip()
            rows.append({"title": title, "text": text})
    return make_documents(rows)


def load_documents(path: str | Path) -> list[Document]:
    """Load a corpus (see the module docstring for the formats).

    Raises:
        FileNotFoundError: `path` does not exist.
        ValueError: unsupported file type, empty corpus, or a malformed record (with its line).
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"corpus: {p} does not exist")
    if p.is_dir():
        rows = []
        for f in sorted(p.iterdir()):
            if f.suffix.lower() not in (".txt", ".md") or not f.is_file():
                continue
            lines = f.read_text(encoding="utf-8").strip().splitlines()
            if not lines:
                continue
            rows.append({"id": f.stem, "title": lines[0].lstrip("#").strip(),
                         "text": "\n".join(lines[1:]).strip()})
        docs = make_documents(rows)
    elif p.suffix.lower() == ".jsonl":
        rows = []
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"corpus {p}:{n}: invalid JSON ({e.msg})") from None
        docs = make_documents(rows)
    elif p.suffix.lower() == ".json":
        data = json.loads(p.read_text(encoding="utf-8"))
        if not isinstance(data, list):
            raise ValueError(f"corpus {p}: a .json corpus must be a HotpotQA-style list of records")
        docs = hotpot_documents(data)
    else:
        raise ValueError(f"corpus {p}: expected a directory, .jsonl or HotpotQA .json file")
    if not docs:
        raise ValueError(f"corpus {p}: no documents found")
    return docs


def paragraphs(text: str) -> list[str]:
    """Paragraphs of a document text: blocks separated by blank lines, inner newlines joined."""
    return [re.sub(r"\s*\n\s*", " ", b).strip() for b in re.split(r"\n\s*\n", text) if b.strip()]


def document_html(doc: Document) -> str:
    """The HTML page of a document (title, `<h1>`, one `<p>` per paragraph; text escaped)."""
    body = "\n".join(f"<p>{html.escape(p)}</p>" for p in paragraphs(doc.text))
    t = html.escape(doc.title)
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{t}</title></head>\n"
            f"<body>\n<h1>{t}</h1>\n{body}\n</body></html>\n")


def index_html(docs: Sequence[Document]) -> str:
    """The HTML index page: a list of links to every document."""
    items = "\n".join(f"<li><a href=\"/doc/{d.slug}\">{html.escape(d.title)}</a></li>" for d in docs)
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>Corpus</title></head>\n"
            f"<body>\n<h1>Corpus</h1>\n<ul>\n{items}\n</ul>\n</body></html>\n")


def _handler(docs: Sequence[Document]) -> type[BaseHTTPRequestHandler]:
    pages = {d.slug: document_html(d).encode("utf-8") for d in docs}
    index = index_html(docs).encode("utf-8")

    class Handler(BaseHTTPRequestHandler):
        server_version = "agentrl-corpus/1"

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            path = unquote(self.path.split("?", 1)[0].split("#", 1)[0])
            if path in ("/", "/index.html"):
                self._send(200, index, "text/html")
            elif path == "/healthz":
                self._send(200, b"ok\n", "text/plain")
            elif path.startswith("/doc/") and path[5:].rstrip("/") in pages:
                self._send(200, pages[path[5:].rstrip("/")], "text/html")
            else:
                self._send(404, f"not found: {path}\n".encode(), "text/plain")

        def _send(self, status: int, body: bytes, ctype: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", f"{ctype}; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence access logs
            pass

    return Handler


def serve_corpus(path: str | Path | Sequence[Document], host: str = "127.0.0.1", port: int = 0
                 ) -> tuple[ThreadingHTTPServer, threading.Thread, str]:
    """Start serving a corpus in a daemon thread.

    Args:
        path: a corpus path (see `load_documents`) or already-loaded documents.
        host: interface to bind; loopback by default.
        port: TCP port; 0 picks a free one.

    Returns:
        (server, thread, base_url) with base_url like `"http://127.0.0.1:41234"`; stop with
        `server.shutdown(); server.server_close()`.

    Raises:
        OSError: the address cannot be bound.
        FileNotFoundError, ValueError: see `load_documents`.
    """
    docs = load_documents(path) if isinstance(path, str | Path) else list(path)
    server = ThreadingHTTPServer((host, port), _handler(docs))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                              name="corpus-server", daemon=True)
    thread.start()
    h, p = str(server.server_address[0]), server.server_address[1]
    shown = f"[{h}]" if ":" in h else h
    return server, thread, f"http://{shown}:{p}"


def main(path: str | Path, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Serve a corpus until interrupted (the `agentrl serve-corpus DIR --port N` command).

    Prints the base URL and the number of documents, then blocks; Ctrl-C stops the server.
    """
    docs = load_documents(path)
    server, thread, url = serve_corpus(docs, host=host, port=port)
    print(f"serving {len(docs)} documents from {path} at {url}  (index: {url}/, pages: {url}/doc/<slug>)",
          flush=True)
    try:
        thread.join()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m agentrl.infra.corpus_server", description=main.__doc__)
    ap.add_argument("path", help="corpus directory, .jsonl, or HotpotQA-style .json")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8765)
    a = ap.parse_args(sys.argv[1:])
    main(a.path, a.host, a.port)
