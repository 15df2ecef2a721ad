"""Every parser of model or judge text runs in linear time (#21 item 2).

Each parser gets 100,000-character adversarial inputs: long runs of newlines, tabs, spaces or
markdown after a label ("Score" + "\\n" * n + "x" backtracked for seconds in the judge-score
parser), repeated prefixes, unclosed fences and tags. Each call must take under 0.25 s of CPU
time (`time.thread_time`, so that other processes on a loaded machine do not count); a
quadratic parser takes seconds on these inputs, a linear one milliseconds to tens of them (the
slowest, `html_to_text` on 100,000 "<", 0.08 s on an idle 2-core machine and 0.106 s under a CI
run's load, which failed the earlier 0.1 s limit: CPU time still grows with a loaded machine's
cache and frequency contention).
"""

from __future__ import annotations

import time

import pytest

from agentrl.rewards.curiosity import ngram_buckets
from agentrl.rewards.judge import RuleJudge
from agentrl.rewards.lexicon import LexiconSafetyClassifier
from agentrl.rewards.parse import parse_judge_score, parse_pairwise_choice, strip_think
from agentrl_envs.code_sandbox import defines, extract_code
from agentrl_envs.toy import ToyEnv
from agentrl_envs.web_qa import exact_match, extract_answer, normalize_answer, token_f1
from agentrl_tools.fetch import html_to_text
from agentrl_tools.parser import parse_tool_calls

N = 100_000
LIMIT_S = 0.25


def _run(prefix: str, filler: str, suffix: str = "x") -> str:
    """`prefix`, then `filler` repeated up to N characters, then `suffix`."""
    return prefix + filler * ((N - len(prefix)) // len(filler)) + suffix


def _rep(unit: str) -> str:
    return unit * (N // len(unit))


ADVERSARIAL = {
    # runs of whitespace / markdown after a label (the judge-score parser's catastrophe)
    "score_newlines": _run("Score", "\n"),
    "score_tabs": _run("Score", "\t"),
    "score_spaces": _run("Score", " "),
    "score_stars": _run("Score", "*"),
    "score_space_star": _run("**Score**", " *"),
    "score_colon_spaces": _run("Score:", " \n"),
    "score_paren": _run("Overall score (0-10)", " \t"),
    "score_is": _run("Score is", " "),
    "rating_nbsp": _run("Rating", "\u00a0"),
    "verdict_spaces": _run("Verdict:", " "),
    "answer_label_newlines": _run("Answer", "\n"),
    "winner_gap": "winner" + " " * (N // 2) + ":" + " " * (N // 2) + "x",
    "better_answer_stars": _run("Better answer", "*"),
    "rate_it": _run("rate it", " "),
    "give_this": _run("give this answer", " "),
    "score_of": _run("score of", "\n"),
    "final_newlines": _run("final", "\n"),
    # repeated prefixes
    "score_repeated": _rep("Score: "),
    "score_word_repeated": _rep("Score"),
    "bold_score_repeated": _rep("**Score**"),
    "verdict_repeated": _rep("Verdict: "),
    "answer_repeated": _rep("Answer: "),
    "final_answer_tabs": _run("Final answer:", " \t"),
    "answer_lines": _rep("Answer\n"),
    "quote_lines": _rep("> \n"),
    "dash_lines": _rep("-\n"),
    "winner_repeated": _rep("winner: "),
    "response_a": _rep("Response A "),
    # numbers and fractions
    "digits": _rep("1"),
    "digits_spaced": _rep("1 "),
    "slashes": _rep("1/"),
    "dotted": _rep("1.1."),
    "out_of_gap": _run("7 out", " "),
    "out_of_spaces": _run("7 out of", " "),
    "brackets_open": _run("[[", " "),
    "brackets_repeated": _rep("[["),
    "bare_lines": _rep("7\n"),
    # tags: think, tool calls
    "think_open": _rep("<think>"),
    "think_close": _rep("</think>"),
    "think_unclosed": _run("<think>", "x"),
    "think_mixed": _rep("<think></think><think>"),
    "tool_call_open": _rep("<tool_call>"),
    "tool_call_brace": _run("<tool_call>", "{"),
    "tool_call_string": _run('<tool_call>{"name": "', "a"),
    "tool_call_nested": _run("<tool_call>", "["),
    # code fences
    "fence_python": _rep("```python"),
    "fence_python_nl": _rep("```python\n"),
    "backticks": _rep("`"),
    "fences": _rep("```"),
    "fence_unclosed": _run("```python\n", "x"),
    "fence_spaces": _run("```", " "),
    "blank_lines": _rep("\n"),
    "def_spaces": _run("def f", " "),
    "async_newlines": _run("async", "\n"),
    "name_spaces": _run("f", " "),
    "async_def_repeated": _rep("async def f"),
    # refusal / safety lexicon
    "i_cant_spaces": _run("I can't", " "),
    "i_spaces": _run("I", " "),
    "sorry_spaces": _run("I'm sorry", " "),
    "make_spaces": _run("make", " "),
    "pick_spaces": _run("pick", " "),
    "distinct_words": " ".join(f"w{i}" for i in range(N // 6)),
    # html
    "lt": _rep("<"),
    "open_tags": _rep("<a "),
    "comment_unclosed": _run("<!--", "x"),
    "amp": _rep("&"),
    "cdata": _run("<![CDATA[", "x"),
    # unicode whose lower-case is longer
    "dotted_capital_i": _rep("\u0130"),
}

_RULE = RuleJudge()
_LEXICON = LexiconSafetyClassifier()
_TOY = ToyEnv()
_TOY.reset(seed=0)
_USER = [{"role": "user", "content": "What is the capital city of France?"}]

PARSERS = {
    "parse_judge_score": lambda t: parse_judge_score(t, 0, 10),
    "parse_pairwise_choice": parse_pairwise_choice,
    "strip_think": strip_think,
    "web_qa.extract_answer": extract_answer,
    "web_qa.normalize_answer": normalize_answer,
    "web_qa.token_f1": lambda t: token_f1(t, ["the capital of France"]),
    "web_qa.exact_match": lambda t: exact_match(t, ["Paris"]),
    "code_sandbox.extract_code": extract_code,
    "code_sandbox.defines": lambda t: defines(t, "f"),
    "parser.hermes": parse_tool_calls,
    "RuleJudge": lambda t: _RULE.judge(_USER, t),
    "RuleJudge.keywords": lambda t: _RULE.judge(_USER, t, keywords=["Paris", "Ile de France"]),
    "lexicon": lambda t: _LEXICON.p_unsafe(["how do I make meth"], [t]),
    "curiosity.ngram_buckets": ngram_buckets,
    "toy.step": lambda t: _TOY.step(t),
    "fetch.html_to_text": html_to_text,
}


def _cpu_seconds(fn, text: str) -> float:
    t0 = time.thread_time()
    fn(text)
    return time.thread_time() - t0


@pytest.mark.parametrize("parser", list(PARSERS))
def test_parser_is_linear_on_adversarial_inputs(parser):
    fn = PARSERS[parser]
    slow = {}
    for name, text in ADVERSARIAL.items():
        assert len(text) >= N - 30
        spent = _cpu_seconds(fn, text)
        for _ in range(2):  # a hiccup of a loaded machine is not quadratic (that takes seconds)
            if spent >= LIMIT_S:
                spent = min(spent, _cpu_seconds(fn, text))
        if spent >= LIMIT_S:
            slow[name] = round(spent, 3)
    assert not slow, f"{parser} took >= {LIMIT_S} s on: {slow}"


def test_the_inputs_of_the_issue_parse_fast_and_right():
    """The reported cases, with their (unchanged) results."""
    for gap in ("\n", "\t", " ", "*"):
        text = "Score" + gap * 120 + "x"
        assert _cpu_seconds(lambda t: parse_judge_score(t, 0, 10), text) < LIMIT_S
        assert parse_judge_score(text, 0, 10) is None
        assert parse_judge_score("Score" + gap * 120 + "7", 0, 10) == 7.0
    # shared cases D8
    for text, expected in (("Score" + "\n" * 100_000 + "7", 7.0), ("Rating:" + " " * 100_000, None)):
        assert _cpu_seconds(lambda t: parse_judge_score(t, 0, 10), text) < LIMIT_S
        assert parse_judge_score(text, 0, 10) == expected
    text = "\n" * 16_000
    assert _cpu_seconds(extract_answer, text) < LIMIT_S
    assert extract_answer(text) == ""
    assert extract_answer("Let me think.\n" + "\n" * 16_000 + "Answer: Paris\n") == "Paris"
