"""`search`: BM25 ranking (the `bm25s` library) over a document corpus, returning titles, URLs
and snippets.

Tokenization is bm25s's: lower-cased words of two or more letters/digits, English stopwords
removed, no stemming by default (so results do not depend on an optional stemmer being
installed; pass `stemmer=` to use one). The snippet of a hit is its sentence that contains the
most distinct query words (the first sentence on a tie), cut to `snippet_chars`.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import bm25s
from bm25s.tokenization import Tokenizer

from agentrl.infra.corpus_server import Document
from agentrl_tools.registry import Tool, ToolError, tool

_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")


@dataclass(frozen=True)
class SearchHit:
    """One ranked document: its BM25 score and the snippet shown to the agent."""

    doc: Document
    score: float
    snippet: str


class SearchIndex:
    """A BM25 index over documents (title and text are indexed together).

    Args:
        docs: the corpus.
        k1, b: BM25 parameters (Robertson et al.; bm25s's defaults 1.5 and 0.75).
        stemmer: optional word -> stem callable (e.g. `Stemmer.Stemmer("english").stemWord`).
        snippet_chars: snippets longer than this are cut (with "...").

    Raises:
        ValueError: empty corpus.
    """

    def __init__(self, docs: Sequence[Document], *, k1: float = 1.5, b: float = 0.75,
                 stemmer: Callable[[str], str] | None = None, snippet_chars: int = 240):
        if not docs:
            raise ValueError("search index: empty corpus")
        self.docs = list(docs)
        self.snippet_chars = snippet_chars
        self._tokenizer = Tokenizer(stopwords="en", stemmer=stemmer)
        corpus_ids = self._tokenizer.tokenize([f"{d.title}\n{d.text}" for d in self.docs],
                                              return_as="ids", show_progress=False)
        self._bm25 = bm25s.BM25(k1=k1, b=b)
        self._bm25.index(corpus_ids, show_progress=False)
        self._lock = threading.Lock()

    def query_terms(self, query: str) -> set[str]:
        """The query's words as the index sees them (stopwords dropped, stemmed if configured)."""
        words = self._tokenizer.tokenize([query], update_vocab=False, return_as="string",
                                         show_progress=False)[0]
        return {w for w in words if w}

    def search(self, query: str, k: int = 3) -> list[SearchHit]:
        """The `k` best documents with a positive BM25 score, best first (ties: corpus order)."""
        k = max(1, min(k, len(self.docs)))
        with self._lock:
            q = self._tokenizer.tokenize([query], update_vocab=False, return_as="ids",
                                         show_progress=False)
            idx, scores = self._bm25.retrieve(q, k=len(self.docs), show_progress=False, n_threads=0)
        ranked = sorted(((float(s), int(i)) for i, s in zip(idx[0], scores[0], strict=True) if s > 0),
                        key=lambda t: (-t[0], t[1]))[:k]
        terms = self.query_terms(query)
        return [SearchHit(self.docs[i], s, self.snippet(self.docs[i], terms)) for s, i in ranked]

    def snippet(self, doc: Document, terms: set[str]) -> str:
        """The sentence of `doc` sharing the most distinct words with `terms`, cut to size."""
        sentences = [s.strip() for s in _SENTENCE.split(doc.text.replace("\n", " ")) if s.strip()]
        if not sentences:
            return ""

        def overlap(s: str) -> int:
            words = set(self._tokenizer.tokenize([s], update_vocab=False, return_as="string",
                                                 show_progress=False)[0])
            return len(words & terms)

        best = max(range(len(sentences)), key=lambda i: (overlap(sentences[i]), -i))
        s = sentences[best]
        return s if len(s) <= self.snippet_chars else s[: self.snippet_chars - 3].rstrip() + "..."


def format_hits(hits: Sequence[SearchHit], url_for: Callable[[Document], str], query: str) -> str:
    """Observation text of search results::

        [1] <title>
        URL: <url>
        <snippet>

        [2] ...

    or `No results for '<query>'.` when there are none.
    """
    if not hits:
        return f"No results for {query!r}."
    return "\n\n".join(f"[{n}] {h.doc.title}\nURL: {url_for(h.doc)}\n{h.snippet}"
                       for n, h in enumerate(hits, 1))


def make_search_tool(index: SearchIndex, url_for: Callable[[Document], str], *,
                     default_k: int = 3, max_k: int = 10, max_query_chars: int = 1000,
                     name: str = "search") -> Tool:
    """A `search(query, k=default_k)` tool over `index`.

    Args:
        index: the BM25 index.
        url_for: document -> URL shown in results (called at search time, so it may depend on a
            server started later).
        default_k: number of results when the agent does not say.
        max_k: largest `k` the agent may ask for.
        max_query_chars: longest query accepted (a longer one is a tool error: the search's
            cost grows with the query's words, ~0.7 s for 20,000).
        name: tool name shown to the agent.
    """

    def search(query: str, k: int = default_k) -> str:
        """Search the document collection and return the best matches with their title, URL and
        a snippet. Fetch a URL to read the whole document.

        Args:
            query: keywords to search for.
            k: number of results (1 to 10).
        """
        if not query.strip():
            raise ToolError("the query is empty")
        if len(query) > max_query_chars:
            raise ToolError(f"the query is longer than {max_query_chars} characters; use a few keywords")
        if not 1 <= k <= max_k:
            raise ToolError(f"k must be between 1 and {max_k}, got {k}")
        return format_hits(index.search(query, k), url_for, query)

    t = tool(search, name=name)
    t.parameters["properties"]["k"]["description"] = f"number of results (1 to {max_k})."
    return t
