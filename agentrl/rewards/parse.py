"""Parse an AI judge's reply: a score on a numeric scale, a verdict word, or a pairwise choice.

Rules (docs/rewards.md has the table):
- Reasoning is ignored: text inside `<think>...</think>` is dropped; an unclosed `<think>` drops
  the rest of the reply; a stray `</think>` (templates that open the block themselves) drops
  everything before it.
- Candidates are found only in score positions, never in free numbers ("1969", "3 facts"):
  a labelled number (`Score: 7`, `**Rating:** 8.5`, `Overall score (0-10): 7`, `score of 7`,
  `I'd rate it 7`, `I give it a 7`), a fraction (`7/10`, `7 out of 10`), a bracketed number
  (`[[7]]`, MT-Bench style), or a reply (or line) that is only a number.
  A fraction counts only when its denominator equals `high` (`9/10` on a 0-10 scale is 9; `4/5`
  on a 0-10 scale is not a score on the asked scale and is skipped).
- Verdict words count in the same positions (labelled `Verdict: correct`, or a line that is only
  the word): positive words map to `high`, negative words to `low` (`VERDICT_WORDS`).
- The last candidate in range `[low, high]` (inclusive) wins. A score outside the range is not
  clamped: with no in-range candidate the result is None (case R2: `Score: 90` on 0-10 -> None).
"""

from __future__ import annotations

import math
import re

#: verdict word -> True (maps to `high`) or False (maps to `low`)
VERDICT_WORDS: dict[str, bool] = {
    "good": True, "bad": False,
    "yes": True, "no": False,
    "correct": True, "incorrect": False,
    "right": True, "wrong": False,
    "pass": True, "fail": False,
    "passed": True, "failed": False,
    "acceptable": True, "unacceptable": False,
    "true": True, "false": False,
    "helpful": True, "unhelpful": False,
}

_NUM = r"[-+]?\d+(?:\.\d+)?"
_DEN = rf"(?:\s*(?:/|out\s+of)\s*(?P<den>{_NUM}))?"
# Labels that introduce a score or verdict. Optional markdown bold, a parenthetical such as
# "(0-10)", and a separator may sit between the label and the value.
_LABEL = (r"(?:final\s+score|overall\s+score|final\s+rating|overall\s+rating|score|rating|grade"
          r"|verdict|judgement|judgment|decision|assessment|evaluation|label|result|final\s+answer)")
_GAP = r"\**\s*(?:\([^)\n]{0,20}\))?\s*\**\s*(?:[:=\-]|is)?\s*\**\s*"
_WORDS = "|".join(sorted(VERDICT_WORDS, key=len, reverse=True))

_NUMERIC_PATTERNS = [
    # Score: 7 | **Rating:** 8.5/10 | Overall score (0-10): 7 out of 10
    re.compile(rf"\b{_LABEL}{_GAP}(?P<num>{_NUM}){_DEN}", re.IGNORECASE),
    # a score of 7 | rate it 7 | rate this answer a 7 | give it an 8
    re.compile(rf"\b(?:score\s+of|rate\s+(?:it|this(?:\s+\w+)?)(?:\s+(?:a|an|as))?|give\s+(?:it|this(?:\s+\w+)?)\s+(?:a|an))"
               rf"\s+(?P<num>{_NUM}){_DEN}", re.IGNORECASE),
    # 7/10 | 7 out of 10 (a fraction without a label)
    re.compile(rf"(?<![\w.])(?P<num>{_NUM})\s*(?:/|out\s+of)\s*(?P<den>{_NUM})(?![\w.])", re.IGNORECASE),
    # [[7]]
    re.compile(rf"\[\[\s*(?P<num>{_NUM})\s*\]\]"),
    # a line that is only a number: "7", "**7**", "7."
    re.compile(rf"^[ \t*_\"']*(?P<num>{_NUM})[ \t*_\"'.]*$", re.MULTILINE),
]
# Verdict labels also include "answer"/"correct(ness)", and need an explicit separator
# ("Answer: yes"), so prose such as "the answer is wrong in places" is not a verdict.
_VLABEL = rf"(?:{_LABEL}|answer|correctness|correct)"
_VGAP = r"\**\s*(?:\([^)\n]{0,20}\))?\s*\**\s*[:=\-]\s*\**\s*"
_VERDICT_PATTERNS = [
    re.compile(rf"\b{_VLABEL}{_VGAP}[\"'`]?(?P<word>{_WORDS})\b", re.IGNORECASE),
    re.compile(rf"^[ \t*_\"'`]*(?P<word>{_WORDS})[ \t*_\"'`.!]*$", re.IGNORECASE | re.MULTILINE),
]

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.IGNORECASE | re.DOTALL)
_THINK_OPEN = re.compile(r"<think>", re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</think>", re.IGNORECASE)


def strip_think(text: str) -> str:
    """Remove reasoning from a reply: `<think>...</think>` blocks, an unclosed `<think>` with
    everything after it, and everything before a stray `</think>`."""
    text = _THINK_BLOCK.sub(" ", text)
    closes = list(_THINK_CLOSE.finditer(text))
    if closes:  # a closing tag without its opening one: the reasoning came before it
        text = text[closes[-1].end():]
    m = _THINK_OPEN.search(text)
    if m:  # opened but never closed: the rest is reasoning (e.g. cut off by max_tokens)
        text = text[: m.start()]
    return text


def _candidates(text: str, low: float, high: float) -> list[tuple[int, float]]:
    """(end position, value) of every score candidate in `text`, in-range or not."""
    out: list[tuple[int, float]] = []
    for pat in _NUMERIC_PATTERNS:
        for m in pat.finditer(text):
            value = float(m.group("num"))
            den = m.groupdict().get("den")
            if den is not None and float(den) != float(high):
                continue  # a fraction on another scale is not a score on ours
            out.append((m.end("num"), value))
    for pat in _VERDICT_PATTERNS:
        for m in pat.finditer(text):
            positive = VERDICT_WORDS[m.group("word").lower()]
            out.append((m.end("word"), float(high if positive else low)))
    return out


def parse_judge_score(text: str, low: float, high: float) -> float | None:
    """The judge's score on its scale `[low, high]`, or None when the reply has no valid score.

    Args:
        text: the judge's reply.
        low: lowest score of the scale (inclusive); negative verdict words map here.
        high: highest score of the scale (inclusive); positive verdict words map here.

    Returns:
        The last in-range candidate (see the module docstring for what counts), as a float;
        None when there is none. Out-of-range scores are never clamped (case R2).

    Raises:
        ValueError: if `low >= high` or either bound is not finite.
    """
    if not (math.isfinite(low) and math.isfinite(high)) or low >= high:
        raise ValueError(f"judge scale must have finite low < high, got [{low}, {high}]")
    if not isinstance(text, str) or not text:
        return None
    cands = _candidates(strip_think(text), low, high)
    cands.sort(key=lambda c: c[0])
    for _, value in reversed(cands):
        if math.isfinite(value) and low <= value <= high:
            return value
    return None


_CHOICE_PATTERNS = [
    re.compile(r"\[\[\s*(?P<c>[ABC])\s*\]\]"),  # MT-Bench: [[A]], [[B]], [[C]] (tie)
    re.compile(r"\b(?:winner|better(?:\s+(?:answer|response))?|preferred(?:\s+(?:answer|response))?|choice"
               r"|verdict|final\s+answer|answer)\s*\**\s*[:=\-]\s*\**\s*(?:answer|response|assistant)?\s*"
               r"\(?(?P<c>[AB]|tie)\)?\b", re.IGNORECASE),
    re.compile(r"\b(?:answer|response|assistant)\s+\(?(?P<c>[AB])\)?\s+is\s+(?:better|preferred|stronger)",
               re.IGNORECASE),
    re.compile(r"^[ \t*_\"'`(]*(?P<c>[AB])[ \t*_\"'`).]*$", re.MULTILINE),
]


def parse_pairwise_choice(text: str) -> str | None:
    """Which of two answers a pairwise judge prefers.

    Recognised (after `strip_think`): `[[A]]`/`[[B]]`/`[[C]]` (C = tie, MT-Bench), `Winner: A`,
    `Better answer: B`, `Verdict: tie`, `Response A is better`, or a line that is only `A`/`B`.
    The last recognised choice wins.

    Returns:
        "A", "B", "tie", or None when the reply names no choice.
    """
    if not isinstance(text, str) or not text:
        return None
    text = strip_think(text)
    found: list[tuple[int, str]] = []
    for pat in _CHOICE_PATTERNS:
        for m in pat.finditer(text):
            c = m.group("c").upper()
            found.append((m.end("c"), "tie" if c in ("C", "TIE") else c))
    if not found:
        return None
    return max(found, key=lambda f: f[0])[1]
