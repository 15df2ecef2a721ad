"""web_qa: answer a multi-hop question by searching and fetching documents over HTTP.

Episode: the agent gets a question; each turn it may call `search` (BM25 over the corpus,
returning titles, URLs and snippets) and `fetch` (HTTP GET of an allowed URL, HTML turned into
text). A turn without a tool call is its final answer (`Answer: ...` or plain text): reward is
the normalised exact match (`reward="em"`) or token F1 (`reward="f1"`) against the gold answers
(SQuAD normalisation), and the episode ends. Each tool turn earns `-tool_call_penalty` per call.

Documents are served by `agentrl.infra.corpus_server` at `<base>/doc/<slug>`; with no
`fetch_base_url` the env starts one server per corpus per process (127.0.0.1, free port, daemon
thread) on first reset and shares it between env instances.
"""

from __future__ import annotations

import json
import re
import string
import sys
import threading
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from agentrl.env.base import TextEnv
from agentrl.infra.corpus_server import (
    Document,
    hotpot_documents,
    load_documents,
    serve_corpus,
    slugify,
)
from agentrl_envs.code_datasets import normalize_split
from agentrl_envs.splits import duplicates_line, heldout_mask, normalise_text
from agentrl_envs.tool_env import tool_info
from agentrl_tools.executor import ToolRunner, add_system_text
from agentrl_tools.fetch import make_fetch_tool
from agentrl_tools.parser import ToolCall, ToolCallParser
from agentrl_tools.search import SearchIndex, make_search_tool

DATA_DIR = Path(__file__).parent / "data" / "web_qa"
DEFAULT_CORPUS = DATA_DIR / "corpus.jsonl"
DEFAULT_QUESTIONS = DATA_DIR / "questions.jsonl"
HELDOUT_FRACTION = 0.2

SYSTEM_PROMPT = (
    "You answer questions using a document collection. Use the search tool to find documents "
    "and the fetch tool to read a document by its URL. Questions usually need facts from two "
    "documents. When you know the answer, reply without a tool call as: Answer: <answer> "
    "(short: a name, a number or a few words)."
)


# ---------------------------------------------------------------------------------------------
# Scoring (SQuAD v1.1 evaluation script; HotpotQA's yes/no rule)
# ---------------------------------------------------------------------------------------------

_DROP_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(s: str) -> str:
    """SQuAD normalisation: lower-case, drop punctuation, drop the articles a/an/the, collapse
    whitespace (`"The  Bay of Corrin."` -> `"bay of corrin"`)."""
    s = s.lower().translate(_DROP_PUNCTUATION)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def exact_match(prediction: str, golds: Sequence[str]) -> float:
    """1.0 if the normalised prediction equals any normalised gold answer, else 0.0."""
    p = normalize_answer(prediction)
    return float(any(p == normalize_answer(g) for g in golds))


def token_f1(prediction: str, golds: Sequence[str]) -> float:
    """Best token F1 over the gold answers (SQuAD v1.1): with c = |pred ∩ gold| (multiset),
    P = c/|pred|, R = c/|gold|, F1 = 2PR/(P+R); 0 when c = 0. As in HotpotQA's script, a
    prediction or gold of yes/no/noanswer scores 0 unless the two are equal."""
    best = 0.0
    p_norm = normalize_answer(prediction)
    p_toks = p_norm.split()
    for g in golds:
        g_norm = normalize_answer(g)
        special = {"yes", "no", "noanswer"}
        if (p_norm in special or g_norm in special) and p_norm != g_norm:
            continue
        common = sum((Counter(p_toks) & Counter(g_norm.split())).values())
        if common == 0:
            continue
        precision, recall = common / len(p_toks), common / len(g_norm.split())
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


# Linear time: the line prefix excludes newlines (`[\s*#>_-]*` at every line start re-read all
# the blank lines after it: 16,000 newlines took 5 s), and the answer is `(.*)` stripped
# afterwards (`(.*?)\s*$` retried the trailing `\s*` at every character of a long line).
_ANSWER = re.compile(r"(?im)^(?:[^\S\n]|[*#>_-])*(?:final\s+)?answer\s*[:：]\s*(.*)$")


def extract_answer(text: str) -> str:
    """The agent's answer: what follows the last `Answer:` line (`Final answer:` too), else the
    whole text; `<think>...</think>` blocks are dropped first."""
    text = re.sub(r"<think>.*?(</think>|$)", "", text, flags=re.DOTALL)
    found = [a.strip() for a in _ANSWER.findall(text)]
    return (found[-1] if found else text).strip()


# ---------------------------------------------------------------------------------------------
# Questions and corpora
# ---------------------------------------------------------------------------------------------

def _question(rec: dict[str, Any], i: int) -> dict[str, Any]:
    if not isinstance(rec.get("question"), str):
        raise ValueError(f"question record {i}: needs a str 'question'")
    answers = rec.get("answers", rec.get("answer"))
    answers = [answers] if isinstance(answers, str) else answers
    if not answers or not all(isinstance(a, str) for a in answers):
        raise ValueError(f"question record {i}: needs 'answers' (list of str) or 'answer' (str)")
    return {"id": str(rec.get("id", rec.get("_id", f"q{i}"))), "question": rec["question"],
            "answers": list(answers), "supporting": list(rec.get("supporting", []))}


def load_hotpot(path: str | Path) -> tuple[list[Document], list[dict[str, Any]]]:
    """Corpus and questions from a HotpotQA-style JSON file (a list of records with `question`,
    `answer`, `_id`, `context: [[title, [sentences]], ...]`, optional `supporting_facts`).
    The corpus is every context paragraph (deduplicated by title); a question's `supporting` are
    the slugs of its supporting-fact titles.

    Raises:
        ValueError: not a list, or a record without question/answer.
    """
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, list):
        raise ValueError(f"{path}: HotpotQA JSON must be a list of records")
    docs = hotpot_documents(data)
    slug_of = {d.title: d.slug for d in docs}
    questions = []
    for i, rec in enumerate(data):
        q = _question(rec, i)
        titles = dict.fromkeys(t for t, _ in rec.get("supporting_facts", []))
        q["supporting"] = [slug_of[t] for t in titles if t in slug_of]
        questions.append(q)
    return docs, questions


def select_split(questions: list[dict[str, Any]], split: str) -> list[dict[str, Any]]:
    """The questions of `split`: `all`, or a fixed hash split keyed on content, the same rule as
    code_sandbox's (`agentrl_envs.splits`): `heldout` when `split_fraction` of the smallest id
    among the questions with the same whitespace-normalised text is below `HELDOUT_FRACTION`,
    else `train` (a file without repeated questions splits by its own ids).

    Raises:
        ValueError: unknown split (`test`, `eval`, `held_out` are aliases of `heldout`).
    """
    split = normalize_split(split)
    if split == "all":
        return list(questions)
    held = heldout_mask([q["id"] for q in questions], [normalise_text(q["question"]) for q in questions],
                        HELDOUT_FRACTION)
    return [q for q, h in zip(questions, held, strict=True) if h == (split == "heldout")]


_REPORTED: set[str] = set()


def report_duplicates(name: str, questions: list[dict[str, Any]]) -> None:
    """Print one `[dataset]` line on stderr, once per file and process, when the file asks the
    same question under several ids."""
    if name not in _REPORTED:
        _REPORTED.add(name)
        line = duplicates_line(name, [q["id"] for q in questions], [normalise_text(q["question"]) for q in questions])
        if line:
            print(line, file=sys.stderr, flush=True)


def load_questions(path: str | Path) -> list[dict[str, Any]]:
    """Questions from a JSONL file (`question`, `answers` list or `answer` str, optional `id`
    and `supporting` slugs) or a HotpotQA-style JSON list.

    Raises:
        FileNotFoundError, ValueError: missing file, bad JSON or record (with the line).
    """
    p = Path(path)
    if p.suffix.lower() == ".json":
        return load_hotpot(p)[1]
    out: list[dict[str, Any]] = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                out.append(_question(json.loads(line), len(out)))
            except json.JSONDecodeError as e:
                raise ValueError(f"questions {p}:{n}: invalid JSON ({e.msg})") from None
    if not out:
        raise ValueError(f"questions {p}: no questions")
    return out


_SHARED_LOCK = threading.Lock()
_SHARED: dict[str, tuple[list[Document], SearchIndex, list[str]]] = {}  # key -> docs, index, [url]


def _shared_corpus(key: str, docs: list[Document]) -> tuple[list[Document], SearchIndex]:
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = (docs, SearchIndex(docs), [])
        d, index, _ = _SHARED[key]
        return d, index


def _shared_server(key: str) -> str:
    """Base URL of this process's corpus server for `key`, starting it on first use."""
    with _SHARED_LOCK:
        docs, _, urls = _SHARED[key]
        if not urls:
            urls.append(serve_corpus(docs, host="127.0.0.1", port=0)[2])
        return urls[0]


# ---------------------------------------------------------------------------------------------
# The env
# ---------------------------------------------------------------------------------------------

class WebQAEnv(TextEnv):
    """Multi-hop question answering with `search` and `fetch` tools (see the module docstring).

    Args:
        corpus: corpus path (directory of .txt/.md, .jsonl, or HotpotQA .json). Default: the
            bundled corpus, or the contexts of `questions` when that is a HotpotQA .json file.
        questions: questions path (JSONL or HotpotQA .json). Default: the bundled questions.
        fetch_base_url: base URL of a server serving the corpus at `/doc/<slug>` (e.g. one
            started by `agentrl serve-corpus`). None: start one on 127.0.0.1.
        allowed_hosts: hosts `fetch` may reach besides the corpus server's own host:port.
        reward: "em" (normalised exact match) or "f1" (token F1), best over gold answers.
        tool_call_penalty: reward subtracted per tool call (>= 0).
        max_tool_calls: tool calls allowed per episode.
        tool_timeout_s: wall-clock limit per tool call, seconds.
        search_k: default number of search results.
        fetch_max_chars: page text returned by fetch at most, characters.
        parser: tool-call format (see `agentrl_tools.parser.PARSERS`).
        tools_in_prompt: list the tools in the system message (else only `info["tools"]`).
        system_prompt: instructions before the tool list.
        split: `all` (default), `train` or `heldout`: which questions this env draws from (a
            fixed hash split of question ids, see `select_split`).

    Reset info: `task_id`, `question`, `tools_in_prompt` (and `tools` when False, see
    `agentrl_envs.tool_env.tool_info`). Final step info: `answer`, `gold`, `em`, `f1`, and the
    tool counters `tool_calls`, `tool_errors`, `tool_error_kinds`.

    Raises:
        ValueError: unknown `reward` or split, negative penalty, bad corpus or question files,
            a split with no questions.
    """

    def __init__(self, corpus: str | Path | None = None, questions: str | Path | None = None, *,
                 fetch_base_url: str | None = None, allowed_hosts: Sequence[str] = (),
                 reward: str = "em", tool_call_penalty: float = 0.0, max_tool_calls: int = 6,
                 tool_timeout_s: float = 10.0, search_k: int = 3, fetch_max_chars: int = 4000,
                 parser: str | ToolCallParser = "hermes", tools_in_prompt: bool = True,
                 system_prompt: str = SYSTEM_PROMPT, split: str = "all"):
        if reward not in ("em", "f1"):
            raise ValueError(f"web_qa: reward must be 'em' or 'f1', got {reward!r}")
        if tool_call_penalty < 0:
            raise ValueError(f"web_qa: tool_call_penalty must be >= 0, got {tool_call_penalty}")
        questions_path = Path(questions) if questions is not None else DEFAULT_QUESTIONS
        if corpus is None and questions_path.suffix.lower() == ".json":
            key = f"hotpot:{questions_path.resolve()}"
            docs, self.questions = load_hotpot(questions_path)
        else:
            corpus_path = Path(corpus) if corpus is not None else DEFAULT_CORPUS
            key = f"corpus:{corpus_path.resolve()}"
            docs = _SHARED[key][0] if key in _SHARED else load_documents(corpus_path)
            self.questions = load_questions(questions_path)
        report_duplicates(str(questions_path), self.questions)
        self.questions = select_split(self.questions, split)
        if not self.questions:
            raise ValueError(f"web_qa: split {split!r} has no questions")
        self.docs, self.index = _shared_corpus(key, docs)
        self._key = key
        self.fetch_base_url = fetch_base_url.rstrip("/") if fetch_base_url else None
        self.allowed_hosts = tuple(allowed_hosts)
        self.reward_kind = reward
        self.tool_call_penalty = tool_call_penalty
        self.max_tool_calls = max_tool_calls
        self.tool_timeout_s = tool_timeout_s
        self.search_k = search_k
        self.fetch_max_chars = fetch_max_chars
        self.parser = parser
        self.tools_in_prompt = tools_in_prompt
        self.system_prompt = system_prompt
        self.runner: ToolRunner | None = None
        self.task: dict[str, Any] | None = None

    # -- tools ----------------------------------------------------------------------------------

    def base_url(self) -> str:
        """The corpus server's base URL (starting the shared local server on first use)."""
        if self.fetch_base_url is None:
            self.fetch_base_url = _shared_server(self._key)
        return self.fetch_base_url

    def tool_schemas(self) -> list[dict[str, Any]]:
        """OpenAI-style schemas of `search` and `fetch`."""
        return self._ensure_runner().schemas()

    def doc_url(self, doc: Document) -> str:
        """URL of a document on the corpus server."""
        return f"{self.base_url()}/doc/{doc.slug}"

    def _ensure_runner(self) -> ToolRunner:
        if self.runner is None:
            own = urlsplit(self.base_url()).netloc.rsplit("@", 1)[-1]
            search = make_search_tool(self.index, self.doc_url, default_k=self.search_k)
            fetch = make_fetch_tool((own, *self.allowed_hosts), timeout_s=min(5.0, self.tool_timeout_s),
                                    max_chars=self.fetch_max_chars)
            self.runner = ToolRunner([search, fetch], parser=self.parser,
                                     max_tool_calls=self.max_tool_calls, timeout_s=self.tool_timeout_s)
        return self.runner

    # -- hooks used by training and evaluation ---------------------------------------------------

    def eval_tasks(self) -> list[dict[str, Any]]:
        """Reset kwargs of every question of this env's split, in file order."""
        return [{"options": {"task": {"id": q["id"]}}} for q in self.questions]

    def reference_answer(self) -> str | None:
        """A good first turn for the current task (supervised warm start): a search for the
        question in the tool-call format."""
        if self.task is None:
            return None
        return self._ensure_runner().parser.format_call(ToolCall("search", {"query": self.task["question"]}))

    def corpus_texts(self) -> list[str]:
        """Texts for training the embedded tokenizer: documents, questions, answers, and one
        oracle episode's tool calls and tool outputs."""
        texts = [f"{d.title}\n{d.text}" for d in self.docs]
        texts += [q["question"] for q in self.questions] + [f"Answer: {q['answers'][0]}" for q in self.questions]
        runner = self._ensure_runner()
        texts.append(runner.system_prompt())
        search = runner.tools["search"]
        for q in self.questions[:20]:
            texts.append(runner.parser.format_call(ToolCall("search", {"query": q["question"]})))
            texts.append(search(query=q["question"]))
        return texts

    # -- episode --------------------------------------------------------------------------------

    def _pick_task(self, options: dict[str, Any] | None) -> dict[str, Any]:
        task = (options or {}).get("task")
        if task is None:
            return self.questions[int(self.np_random.integers(len(self.questions)))]
        if isinstance(task, str):
            task = {"id": task}
        if isinstance(task, dict) and "question" in task:
            return _question(task, 0)
        if isinstance(task, dict) and "id" in task:
            for q in self.questions:
                if q["id"] == str(task["id"]):
                    return q
            raise ValueError(f"web_qa: no question with id {task['id']!r}")
        raise ValueError("web_qa: options['task'] must be a question id or a dict with 'question' "
                         "and 'answers' (or 'id')")

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        runner = self._ensure_runner()
        runner.reset()
        self.task = self._pick_task(options)
        messages = [{"role": "system", "content": self.system_prompt},
                    {"role": "user", "content": self.task["question"]}]
        if self.tools_in_prompt:
            messages = add_system_text(messages, runner.system_prompt())
        info = {"task_id": self.task["id"], "question": self.task["question"],
                **tool_info(runner, self.tools_in_prompt)}
        return messages, info

    def step(self, action: str):
        if self.task is None or self.runner is None:
            raise RuntimeError("web_qa: call reset() before step()")
        turn = self.runner.handle(action)
        if turn is not None:
            info: dict[str, Any] = {**self.runner.stats(), "step_tool_calls": turn.n_calls,
                                    "step_tool_errors": turn.n_errors}
            if turn.errors:
                info["error"] = turn.errors[0]
            return turn.messages, 0.0 - self.tool_call_penalty * turn.n_calls, False, False, info
        answer = extract_answer(action)
        gold = self.task["answers"]
        em, f1 = exact_match(answer, gold), token_f1(answer, gold)
        reward = em if self.reward_kind == "em" else f1
        info = {**self.runner.stats(), "answer": answer, "gold": gold, "em": em, "f1": f1,
                "task_id": self.task["id"]}
        return [], float(reward), True, False, info


def supporting_urls(env: WebQAEnv, task: dict[str, Any]) -> list[str]:
    """URLs of a task's supporting documents (for scripted policies and inspection)."""
    by_slug = {d.slug: d for d in env.docs}
    return [env.doc_url(by_slug[s]) for s in task.get("supporting", []) if s in by_slug]


__all__ = ["WebQAEnv", "normalize_answer", "exact_match", "token_f1", "extract_answer",
           "load_questions", "load_hotpot", "supporting_urls", "slugify"]
