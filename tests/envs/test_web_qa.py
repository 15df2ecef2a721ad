"""web_qa: answer scoring, the corpus server, scripted multi-turn episodes over real HTTP
(search -> fetch -> answer) with exact observations, rewards and masks, the allow-list, HotpotQA
loading, the bundled data, and Gymnasium's env checker."""

from __future__ import annotations

import json

import gymnasium as gym
import httpx
import pytest
from gymnasium.utils.env_checker import check_env

from agentrl.env.registry import make_env, register_env
from agentrl.infra.corpus_server import (
    load_documents,
    make_documents,
    paragraphs,
    serve_corpus,
    slugify,
)
from agentrl_envs.web_qa import (
    DEFAULT_CORPUS,
    DEFAULT_QUESTIONS,
    WebQAEnv,
    exact_match,
    extract_answer,
    load_hotpot,
    load_questions,
    normalize_answer,
    supporting_urls,
    token_f1,
)
from agentrl_tools.search import SearchIndex

# ---------------------------------------------------------------------------------------------
# scoring
# ---------------------------------------------------------------------------------------------


def test_normalize_answer_squad():
    assert normalize_answer("The  Bay of Corrin.") == "bay of corrin"
    assert normalize_answer("An apple, a pear!") == "apple pear"
    assert normalize_answer("12,000") == "12000"
    assert normalize_answer("Theatre") == "theatre"  # 'the' only as a whole word


def test_exact_match_and_f1_hand_computed():
    assert exact_match("the Lantern Fair", ["Lantern Fair"]) == 1.0
    assert exact_match("Lantern", ["Lantern Fair"]) == 0.0
    assert exact_match("Hollin and Vane", ["Hollin & Vane", "Hollin and Vane"]) == 1.0
    # pred "port" vs gold "port ewan": c=1, P=1/1, R=1/2 -> F1 = 2*1*0.5/1.5 = 0.666667
    assert token_f1("Port", ["Port Ewan"]) == pytest.approx(2 / 3)
    # pred "port ewan town" vs "port ewan": c=2, P=2/3, R=1 -> F1 = 2*(2/3)/(5/3) = 0.8
    assert token_f1("Port Ewan town", ["Port Ewan"]) == pytest.approx(0.8)
    # best over golds, multiset overlap: pred "x x y" vs gold "x y y": c = min(2,1)+min(1,2) = 2, P=R=2/3 -> F1 = 2/3
    assert token_f1("x x y", ["zzz", "x y y"]) == pytest.approx(2 / 3)
    assert token_f1("", ["Port Ewan"]) == 0.0
    assert token_f1("yes it is", ["yes"]) == 0.0  # HotpotQA: yes/no must match exactly
    assert token_f1("yes", ["yes"]) == 1.0


def test_extract_answer():
    assert extract_answer("I searched.\nAnswer: Tarnhollow.") == "Tarnhollow."
    assert extract_answer("answer: one\nFinal answer: **two**") == "**two**"
    assert extract_answer("<think>Answer: wrong</think>Port Ewan") == "Port Ewan"
    assert extract_answer("  just text  ") == "just text"


# ---------------------------------------------------------------------------------------------
# corpus and server
# ---------------------------------------------------------------------------------------------

SMALL = [
    {"id": "alpha-lab", "title": "Alpha Lab", "text": "Alpha Lab was founded by Dora Quinn.\n\nIt builds clocks."},
    {"id": "dora-quinn", "title": "Dora Quinn", "text": "Dora Quinn was born in Mossbay. She liked tea."},
    {"id": "mossbay", "title": "Mossbay", "text": "Mossbay is a fishing village <on> the coast & bay."},
]
QUESTIONS = [{"id": "s1", "question": "Where was the founder of Alpha Lab born?", "answers": ["Mossbay"],
              "supporting": ["alpha-lab", "dora-quinn"]},
             {"id": "s2", "question": "What does Alpha Lab build?", "answer": "clocks"}]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    d = tmp_path_factory.mktemp("webqa")
    (d / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in SMALL))
    (d / "questions.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return d


def test_documents_slugs_and_formats(tmp_path, small):
    assert slugify("Ilse Marrow (1839)") == "ilse-marrow-1839" and slugify("!!") == "doc"
    docs = make_documents([{"title": "A b", "text": "x"}, {"title": "A b", "text": "y"}])
    assert [d.slug for d in docs] == ["a-b", "a-b-2"]
    with pytest.raises(ValueError, match="record 0"):
        make_documents([{"title": "no text"}])
    (tmp_path / "one.md").write_text("# First Doc\n\nPara one.\nstill one.\n\nPara two.\n")
    (tmp_path / "skip.bin").write_text("x")
    [doc] = load_documents(tmp_path)
    assert (doc.slug, doc.title) == ("one", "First Doc")
    assert paragraphs(doc.text) == ["Para one. still one.", "Para two."]
    assert [d.slug for d in load_documents(small / "corpus.jsonl")] == ["alpha-lab", "dora-quinn", "mossbay"]
    with pytest.raises(FileNotFoundError):
        load_documents(tmp_path / "missing")


def test_corpus_server_pages(small):
    server, thread, base = serve_corpus(small / "corpus.jsonl")
    try:
        assert base.startswith("http://127.0.0.1:") and thread.daemon
        with httpx.Client(trust_env=False) as c:
            page = c.get(f"{base}/doc/mossbay")
            assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
            assert page.text == (
                '<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>Mossbay</title></head>\n'
                "<body>\n<h1>Mossbay</h1>\n<p>Mossbay is a fishing village &lt;on&gt; the coast &amp; bay.</p>\n"
                "</body></html>\n")
            index = c.get(f"{base}/").text
            assert '<li><a href="/doc/alpha-lab">Alpha Lab</a></li>' in index
            assert c.get(f"{base}/doc/nope").status_code == 404
            assert c.get(f"{base}/healthz").text == "ok\n"
    finally:
        server.shutdown()
        server.server_close()


def test_serve_corpus_command(small):
    """`python -m agentrl.infra.corpus_server PATH --port 0` (what `agentrl serve-corpus` runs)."""
    import re
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "agentrl.infra.corpus_server", str(small / "corpus.jsonl"),
                             "--port", "0"], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving 3 documents from "), line
        base = re.search(r"at (http://127\.0\.0\.1:\d+)", line).group(1)
        with httpx.Client(trust_env=False) as c:
            assert "Dora Quinn was born in Mossbay." in c.get(f"{base}/doc/dora-quinn").text
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# ---------------------------------------------------------------------------------------------
# scripted episodes
# ---------------------------------------------------------------------------------------------


def call(name, **arguments):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def test_search_fetch_answer_exact_observations(small):
    env = WebQAEnv(small / "corpus.jsonl", small / "questions.jsonl", tool_call_penalty=0.1)
    obs, info = env.reset(seed=0, options={"task": {"id": "s1"}})
    base = env.base_url()
    assert base.startswith("http://127.0.0.1:")
    assert obs[1] == {"role": "user", "content": "Where was the founder of Alpha Lab born?"}
    assert obs[0]["role"] == "system" and '"name": "search"' in obs[0]["content"]
    assert info["task_id"] == "s1" and info["tools_in_prompt"] is True

    obs, r, term, trunc, info = env.step("Let me search.\n" + call("search", query="Alpha Lab founder"))
    assert obs == [{"role": "tool", "name": "search", "content":
                    f"[1] Alpha Lab\nURL: {base}/doc/alpha-lab\nAlpha Lab was founded by Dora Quinn."}]
    assert (r, term, trunc) == (pytest.approx(-0.1), False, False)

    obs, r, term, trunc, info = env.step(call("fetch", url=f"{base}/doc/dora-quinn"))
    assert obs == [{"role": "tool", "name": "fetch",
                    "content": "Dora Quinn\n\nDora Quinn was born in Mossbay. She liked tea."}]
    assert (r, term) == (pytest.approx(-0.1), False)

    obs, r, term, trunc, info = env.step("She was born in a village.\nAnswer: Mossbay")
    assert (obs, r, term, trunc) == ([], 1.0, True, False)
    assert info["answer"] == "Mossbay" and info["em"] == 1.0 and info["gold"] == ["Mossbay"]
    assert info["tool_calls"] == 2 and info["tool_errors"] == 0


def test_fetch_outside_allow_list_is_refused_and_episode_goes_on(small):
    env = WebQAEnv(small / "corpus.jsonl", small / "questions.jsonl")
    env.reset(seed=0, options={"task": "s2"})
    port = env.base_url().rsplit(":", 1)[1]
    obs, r, term, trunc, info = env.step(call("fetch", url="http://example.com/") +
                                         call("fetch", url=f"http://localhost:{port}/doc/mossbay"))
    assert obs == [
        {"role": "tool", "name": "fetch", "content": "Error: fetching 'http://example.com/' is not allowed: "
         f"its host is not in the allowed hosts (127.0.0.1:{port})"},
        {"role": "tool", "name": "fetch", "content": f"Error: fetching 'http://localhost:{port}/doc/mossbay' "
         f"is not allowed: its host is not in the allowed hosts (127.0.0.1:{port})"}]
    assert (r, term, trunc) == (0.0, False, False)
    assert info["tool_errors"] == 2 and "not allowed" in info["error"]
    # T2-T4 inside web_qa: errors are observations, counted; the episode goes on
    obs, r, term, _, info = env.step('<tool_call>{"name": "search", "arguments": {"query": "cl')
    assert obs[0]["content"].startswith("Error: the tool call is cut off") and not term
    obs, _, term, _, info = env.step('<tool_call>{"name": "search", "arguments": [1, 2]}</tool_call>')
    assert obs[0]["content"].startswith("Error: the arguments of 'search' must be a JSON object") and not term
    assert info["tool_error_kinds"] == {"tool_error": 2, "parse": 2}
    _, r, term, _, info = env.step("It builds clocks.")  # no 'Answer:' -> the whole text
    # "it builds clocks" vs "clocks": c=1, P=1/3, R=1 -> F1 = 2*(1/3)/(4/3) = 0.5
    assert (r, term) == (0.0, True) and info["f1"] == pytest.approx(0.5)


def test_f1_reward_extra_hosts_and_external_server(small):
    server, _, base = serve_corpus(small / "corpus.jsonl")
    try:
        env = WebQAEnv(small / "corpus.jsonl", small / "questions.jsonl", fetch_base_url=base + "/",
                       reward="f1", allowed_hosts=["127.0.0.2"])
        env.reset(seed=0, options={"task": {"question": "Who founded Alpha Lab?", "answers": ["Dora Quinn"]}})
        assert env.base_url() == base
        obs, *_ = env.step(call("search", query="Alpha Lab", k=1))
        assert f"URL: {base}/doc/alpha-lab" in obs[0]["content"]
        obs, *_ = env.step(call("fetch", url=f"{base}/doc/alpha-lab"))
        assert obs[0]["content"] == "Alpha Lab\n\nAlpha Lab was founded by Dora Quinn.\n\nIt builds clocks."
        obs, *_ = env.step(call("fetch", url="http://127.0.0.2:1/x"))  # allowed, but nothing there
        assert obs[0]["content"].startswith("Error: fetching http://127.0.0.2:1/x failed")
        _, r, term, _, info = env.step("Answer: Dora")
        # "dora" vs "dora quinn": P=1, R=1/2 -> F1 = 2/3
        assert r == pytest.approx(2 / 3) and info["em"] == 0.0
    finally:
        server.shutdown()
        server.server_close()


def test_bad_options_and_kwargs(small):
    with pytest.raises(ValueError, match="reward must be 'em' or 'f1'"):
        WebQAEnv(small / "corpus.jsonl", small / "questions.jsonl", reward="bleu")
    env = WebQAEnv(small / "corpus.jsonl", small / "questions.jsonl")
    with pytest.raises(ValueError, match="no question with id 'zz'"):
        env.reset(options={"task": {"id": "zz"}})
    with pytest.raises(RuntimeError, match="reset"):
        WebQAEnv(small / "corpus.jsonl", small / "questions.jsonl").step("x")


def test_hotpot_style_json(tmp_path):
    data = [{"_id": "h1", "question": "Which river flows through Brill?", "answer": "Wend",
             "supporting_facts": [["Brill", 0], ["Wend", 0]],
             "context": [["Brill", ["Brill is a town.", " The river Wend flows through it."]],
                         ["Wend", ["The Wend is a river."]]]},
            {"_id": "h2", "question": "Is Brill a town?", "answer": "yes",
             "context": [["Brill", ["Brill is a town."]]]}]
    path = tmp_path / "hotpot.json"
    path.write_text(json.dumps(data))
    docs, qs = load_hotpot(path)
    assert [(d.slug, d.text) for d in docs] == [("brill", "Brill is a town. The river Wend flows through it."),
                                               ("wend", "The Wend is a river.")]
    assert qs[0] == {"id": "h1", "question": "Which river flows through Brill?", "answers": ["Wend"],
                     "supporting": ["brill", "wend"]}
    env = WebQAEnv(questions=path)
    obs, info = env.reset(seed=0, options={"task": "h2"})
    assert obs[1]["content"] == "Is Brill a town?"
    out, *_ = env.step(call("fetch", url=env.base_url() + "/doc/brill"))
    assert out[0]["content"] == "Brill\n\nBrill is a town. The river Wend flows through it."
    assert env.step("Answer: yes")[1] == 1.0


# ---------------------------------------------------------------------------------------------
# the bundled data, registration, checker, determinism
# ---------------------------------------------------------------------------------------------


def test_bundled_data_is_multi_hop_and_searchable():
    docs = {d.slug: d for d in load_documents(DEFAULT_CORPUS)}
    questions = load_questions(DEFAULT_QUESTIONS)
    assert 30 <= len(docs) <= 60 and 20 <= len(questions) <= 40
    assert len({q["id"] for q in questions}) == len(questions)
    index = SearchIndex(list(docs.values()))
    for q in questions:
        sup = q["supporting"]
        assert len(set(sup)) == 2 and all(s in docs for s in sup), q["id"]
        text = normalize_answer(" ".join(docs[s].title + " " + docs[s].text for s in sup))
        assert any(normalize_answer(a) in text for a in q["answers"]), q["id"]
        top = {h.doc.slug for h in index.search(q["question"], k=3)}
        assert top & set(sup), f"{q['id']}: no supporting document in the top 3 for the question"


WEBQA_REGISTRATION = dict(env_id="agentrl/WebQA-v0", entry_point="agentrl_envs.web_qa:WebQAEnv",
                          short_name="web_qa", max_turns=8,
                          description="multi-hop QA with search and fetch tools over a local HTTP corpus")


def test_registered_env_runs_an_oracle_episode_on_bundled_data():
    register_env(**WEBQA_REGISTRATION)
    env = make_env("web_qa")
    obs, info = env.reset(seed=3)
    inner = env.unwrapped
    task = inner.task
    assert info["task_id"] == task["id"] and obs[1]["content"] == task["question"]
    obs, r, *_ = env.step(call("search", query=task["question"]))
    assert obs[0]["content"].startswith("[1] ")
    for url in supporting_urls(inner, task):
        obs, r, term, _, _ = env.step(call("fetch", url=url))
        assert not obs[0]["content"].startswith("Error") and not term
    _, r, term, trunc, info = env.step(f"Answer: {task['answers'][0]}")
    assert (r, term, trunc) == (1.0, True, False)


def test_turn_limit_truncates():
    register_env(**WEBQA_REGISTRATION)
    env = make_env("web_qa", max_turns=2)
    env.reset(seed=0)
    assert env.step(call("search", query="lighthouse"))[3] is False
    _, _, term, trunc, _ = env.step(call("search", query="lighthouse"))
    assert (term, trunc) == (False, True)


def test_splits_and_training_hooks():
    train, held, every = WebQAEnv(split="train"), WebQAEnv(split="test"), WebQAEnv()
    ids = lambda e: {q["id"] for q in e.questions}  # noqa: E731
    assert ids(train) | ids(held) == ids(every) and not ids(train) & ids(held)
    assert 0 < len(ids(held)) < len(ids(train))
    assert held.eval_tasks()[0] == {"options": {"task": {"id": held.questions[0]["id"]}}}
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        WebQAEnv(split="dev")
    assert held.reference_answer() is None  # before reset
    obs, info = held.reset(**held.eval_tasks()[0])
    ref = held.reference_answer()
    assert ref == ('<tool_call>\n{"name": "search", "arguments": {"query": '
                   + json.dumps(held.task["question"]) + "}}\n</tool_call>")
    out, r, term, _, _ = held.step(ref)  # the reference first turn is a valid search call
    assert out[0]["content"].startswith("[1] ") and not term
    texts = held.corpus_texts()
    assert len(texts) > len(held.docs) and any(t.startswith("URL: ") or "\nURL: " in t for t in texts)
    assert held.runner.n_calls == 1  # building tokenizer texts does not touch the episode's counters


def test_check_env():
    env = WebQAEnv()
    check_env(env, skip_render_check=True)


def test_reset_is_deterministic_g1():
    def seq(env):
        return [env.reset(seed=123)[1]["task_id"], env.reset()[1]["task_id"], env.reset()[1]["task_id"]]

    a, b = seq(WebQAEnv()), seq(WebQAEnv())
    assert a == b
    many = {WebQAEnv().reset(seed=s)[1]["task_id"] for s in range(12)}
    assert len(many) > 3  # seeds do pick different questions


def test_envs_share_one_corpus_server():
    e1, e2 = WebQAEnv(), WebQAEnv()
    e1.reset(seed=0)
    e2.reset(seed=0)
    assert e1.base_url() == e2.base_url() and e1.index is e2.index


def test_gym_make_kwargs_pass_through(small):
    register_env(**WEBQA_REGISTRATION)
    env = gym.make("agentrl/WebQA-v0", corpus=str(small / "corpus.jsonl"),
                   questions=str(small / "questions.jsonl"))
    obs, info = env.reset(seed=0, options={"task": "s1"})
    assert info["task_id"] == "s1"


# ---------------------------------------------------------------------------------------------
# through the agent loop: token ids, masks and rewards
# ---------------------------------------------------------------------------------------------


def test_agent_loop_masks_tool_output(small, tiny_tokenizer):
    from agentrl.rollout.agent_loop import EpisodeSpec, run_episodes
    from agentrl.rollout.chat import ChatRenderer
    from agentrl.rollout.engines.base import SamplingParams
    from agentrl.rollout.engines.scripted import ScriptedEngine

    env = WebQAEnv(small / "corpus.jsonl", small / "questions.jsonl", tool_call_penalty=0.05)
    env.reset(seed=0)
    base = env.base_url()
    actions = [call("search", query="Alpha Lab"), call("fetch", url=f"{base}/doc/dora-quinn"),
               "Answer: Mossbay"]
    it = iter(actions)
    tok = tiny_tokenizer
    r = ChatRenderer(tok)
    eng = ScriptedEngine(tok, lambda prompt: next(it))
    [tr] = run_episodes(eng, r, [env], [EpisodeSpec({"seed": 0, "options": {"task": "s1"}})],
                        SamplingParams(max_tokens=200, stop_token_ids=r.stop_ids), max_episode_tokens=20000)
    assert tr.info.get("errors") is None and tr.terminated and not tr.truncated
    assert [m["role"] for m in tr.messages] == ["system", "user", "assistant", "tool", "assistant", "tool",
                                                "assistant"]
    assert tr.messages[5]["content"] == "Dora Quinn\n\nDora Quinn was born in Mossbay. She liked tea."
    sampled = [t for t, m in zip(tr.token_ids, tr.loss_mask, strict=True) if m]
    expected = []
    for a in actions:
        expected += tok.encode(a, add_special_tokens=False) + [r.end_of_turn_id]
    assert sampled == expected  # only agent tokens are trained: tool output has mask 0
    assert [t.reward for t in tr.turns] == [pytest.approx(-0.05), pytest.approx(-0.05), 1.0]
    assert tr.episode_return == pytest.approx(0.9)
