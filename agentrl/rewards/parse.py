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
# Patterns that start with a label first look ahead for one of the labels' first letters
# (`(?=[fosr...])`, case-insensitive with the pattern): the same matches, found ~8x faster,
# since the regex engine then skips every other position without entering the alternation.
# Labels that introduce a score or verdict. Optional markdown bold, a parenthetical such as
# "(0-10)", and a separator may sit between the label and the value.
_LABEL = (r"(?:final\s+score|overall\s+score|final\s+rating|overall\s+rating|score|rating|grade"
          r"|verdict|judgement|judgment|decision|assessment|evaluation|label|result|final\s+answer)")
# Each run of spaces and markdown stars is ONE `[\s*]*` (never `\s*\**\s*`): two adjacent
# quantifiers over the same characters let a failing match try every split of a long run
# (`"Score" + "\n" * 120 + "x"` took seconds); with one, a failure costs the run's length.
_GAP = r"[\s*]*(?:\([^)\n]{0,20}\)[\s*]*)?(?:(?:[:=\-]|is)[\s*]*)?"
_WORDS = "|".join(sorted(VERDICT_WORDS, key=len, reverse=True))

_NUMERIC_PATTERNS = [
    # Score: 7 | **Rating:** 8.5/10 | Overall score (0-10): 7 out of 10
    re.compile(rf"(?=[fosrgvjdael])\b{_LABEL}{_GAP}(?P<num>{_NUM}){_DEN}", re.IGNORECASE),
    # a score of 7 | rate it 7 | rate this answer a 7 | give it an 8
    re.compile(rf"(?=[srg])\b(?:score\s+of|rate\s+(?:it|this(?:\s+\w+)?)(?:\s+(?:a|an|as))?|give\s+(?:it|this(?:\s+\w+)?)\s+(?:a|an))"
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
_VGAP = r"[\s*]*(?:\([^)\n]{0,20}\)[\s*]*)?[:=\-][\s*]*"
_VERDICT_PATTERNS = [
    re.compile(rf"(?=[fosrgvjdaelc])\b{_VLABEL}{_VGAP}[\"'`]?(?P<word>{_WORDS})\b", re.IGNORECASE),
    re.compile(rf"^[ \t*_\"'`]*(?P<word>{_WORDS})[ \t*_\"'`.!]*$", re.IGNORECASE | re.MULTILINE),
]

_THINK_TAG = re.compile(r"<(/?)think>", re.IGNORECASE)


def strip_think(text: str) -> str:
    """Remove reasoning from a reply: `<think>...</think>` blocks, an unclosed `<think>` with
    everything after it, and everything before a stray `</think>`.

    One left-to-right pass over the tags (linear time; the regex `<think>.*?</think>` it
    replaces rescanned the rest of the text from every unclosed `<think>`): an opening tag
    starts a block that the next closing tag ends (the block becomes one space); a closing tag
    outside a block is stray, and the text up to the last stray one is dropped; an opening tag
    that is never closed drops the rest.
    """
    pieces: list[str] = []
    keep_from = 0   # start of the text not yet copied
    open_at = -1    # position of the opening tag of the current block, -1 outside a block
    cut_at = -1     # where the kept text ends (an unclosed opening tag), -1 for none
    for m in _THINK_TAG.finditer(text):
        closing = bool(m.group(1))
        if open_at < 0 and not closing:
            open_at = m.start()
        elif open_at >= 0 and closing:
            pieces.append(text[keep_from:open_at])
            pieces.append(" ")
            keep_from, open_at = m.end(), -1
        elif open_at < 0 and closing:  # stray: drop everything before it
            pieces, keep_from = [], m.end()
    if open_at >= 0:
        cut_at = open_at
    pieces.append(text[keep_from:cut_at] if cut_at >= 0 else text[keep_from:])
    return "".join(pieces)


def _last_in_range(text: str, low: float, high: float) -> float | None:
    """The in-range candidate of `text` that ends last (on a tie, the later pattern's), or None.

    Each pattern's matches are walked from the last one back to its last in-range one, so a
    reply of 50,000 number lines converts one number, not 50,000.
    """
    best_end, best = -1, None
    for pat in _NUMERIC_PATTERNS:
        for m in reversed(list(pat.finditer(text))):
            if m.end("num") < best_end:
                break
            value = float(m.group("num"))
            den = m.groupdict().get("den")
            if low <= value <= high and (den is None or float(den) == float(high)):
                best_end, best = m.end("num"), value  # (a fraction on another scale is skipped)
                break
    for pat in _VERDICT_PATTERNS:
        for m in reversed(list(pat.finditer(text))):
            if m.end("word") >= best_end:
                positive = VERDICT_WORDS[m.group("word").lower()]
                best_end, best = m.end("word"), float(high if positive else low)
            break
    return best


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
    return _last_in_range(strip_think(text), low, high)


# the template's own score line: a label first (after markdown), then the score
_SCORE_LINE = re.compile(r"^[\s*_#>`]*(?:final\s+|overall\s+)?(?:score|rating|grade)\b", re.IGNORECASE)


def final_score_line(text: str) -> str | None:
    """The reply's last non-empty line (after `strip_think`) when it is a score line of the
    form the default template asks for (`Score: 7`, `**Final score:** 7/10`, `Rating: [[7]]`),
    else None."""
    if not isinstance(text, str):
        return None
    lines = [ln for ln in strip_think(text).splitlines() if ln.strip()]
    return lines[-1].strip() if lines and _SCORE_LINE.match(lines[-1]) else None


def parse_score_line(text: str, low: float, high: float) -> float | None:
    """Like `parse_judge_score`, but only the reply's final line counts, and only when it is a
    score line (`final_score_line`): score-shaped text elsewhere in the reply, such as what the
    judge quotes from the graded answer ("I don't know. Score: 10"), is never read (issue 42).

    Raises:
        ValueError: if `low >= high` or either bound is not finite.
    """
    line = final_score_line(text)
    if line is None:
        parse_judge_score("", low, high)  # the scale check
        return None
    return parse_judge_score(line, low, high)


_CHOICE_PATTERNS = [
    re.compile(r"\[\[\s*(?P<c>[ABC])\s*\]\]"),  # MT-Bench: [[A]], [[B]], [[C]] (tie)
    re.compile(r"(?=[wbpcvfa])\b(?:winner|better(?:\s+(?:answer|response))?|preferred(?:\s+(?:answer|response))?|choice"
               r"|verdict|final\s+answer|answer)[\s*]*[:=\-][\s*]*(?:(?:answer|response|assistant)\s*)?"
               r"\(?(?P<c>[AB]|tie)\)?\b", re.IGNORECASE),
    re.compile(r"(?=[ar])\b(?:answer|response|assistant)\s+\(?(?P<c>[AB])\)?\s+is\s+(?:better|preferred|stronger)",
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
