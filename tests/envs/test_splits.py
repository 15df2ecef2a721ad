"""Train/held-out splits keyed on content (`agentrl_envs.splits`): the same problem under two ids
is never in both splits (OpenRLHF #1089: HumanEval plus relabelled copies), a file without
duplicates splits exactly as the id hash did before, and duplicates are reported at load in one
line. Real data: the shared HumanEval and MBPP files (skipped without ../shared/data)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from agentrl_envs.code_datasets import CodeTask, content_key, load_dataset, select_split
from agentrl_envs.splits import canonical_ids, duplicate_groups, duplicates_line, split_fraction
from agentrl_envs.web_qa import DEFAULT_QUESTIONS, load_questions
from agentrl_envs.web_qa import select_split as select_questions

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"shared data not found at {DATA}")


def old_split(ids: list[str], split: str, fraction: float = 0.2) -> list[str]:
    """The split before this change: the hash of the id alone."""
    return [i for i in ids if (split_fraction(i) < fraction) == (split == "heldout")]


def test_canonical_ids_and_groups_by_hand():
    ids = ["b", "a", "c", "d", "e"]
    keys = ["x", "y", "x", "y", "z"]  # b = c, a = d, e alone
    assert canonical_ids(ids, keys) == ["b", "a", "b", "a", "e"]
    assert duplicate_groups(ids, keys) == [["b", "c"], ["a", "d"]]
    assert duplicates_line("f", ids, keys).startswith(
        "[dataset] f: 2 task(s) repeat the problem of another task (2 problem(s) under several ids, e.g. b = c)")
    assert duplicates_line("f", ["a"], ["x"]) is None


def test_content_key_normalises_whitespace_and_keeps_the_entry_point():
    a = CodeTask("t/1", "Write  f(x)\n  returning x.", "f", ["pass"])
    b = CodeTask("t/2", " Write f(x) returning\tx. ", "f", ["pass"])
    c = CodeTask("t/3", "Write f(x) returning x.", "g", ["pass"])
    assert content_key(a) == content_key(b) != content_key(c)


@needs_data
def test_humaneval_with_relabelled_copies_has_no_problem_in_both_splits(tmp_path, capfd):
    with gzip.open(DATA / "HumanEval.jsonl.gz", "rt") as f:
        records = [json.loads(line) for line in f if line.strip()]
    copies = [{**r, "task_id": f"HumanEval/{164 + i}",  # relabelled, one with its layout changed
               "prompt": r["prompt"].replace("    ", "  ") if i == 0 else r["prompt"]}
              for i, r in enumerate(records)]
    path = tmp_path / "he_copies.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records + copies))
    tasks = load_dataset(str(path))
    [line] = capfd.readouterr().err.splitlines()  # one line at load
    assert line.startswith(f"[dataset] {path}: 164 task(s) repeat the problem of another task (164 problem(s)")
    ids = [t.task_id for t in tasks]
    key_of = {t.task_id: content_key(t) for t in tasks}
    # the old id hash: problems in both splits (the bug reproduced)
    old_both = {key_of[i] for i in old_split(ids, "train")} & {key_of[i] for i in old_split(ids, "heldout")}
    assert len(old_both) > 20
    train, held = select_split(tasks, "train"), select_split(tasks, "heldout")
    assert len(train) + len(held) == 328
    assert not {content_key(t) for t in train} & {content_key(t) for t in held}
    # each original keeps its own split (HumanEval/N is the smallest id of its group by string
    # order except where the copy's id sorts first), and each copy follows its group
    canon = dict(zip(ids, canonical_ids(ids, [key_of[i] for i in ids]), strict=True))
    assert {t.task_id for t in held} == {i for i in ids if split_fraction(canon[i]) < 0.2}


@needs_data
@pytest.mark.parametrize("name", ["HumanEval.jsonl.gz", "mbpp_sanitized.json",
                                  pytest.param("HumanEvalPlus.jsonl.gz", marks=pytest.mark.slow),
                                  pytest.param("MbppPlus.jsonl.gz", marks=pytest.mark.slow)])
def test_files_without_duplicates_split_as_before(name, capfd):
    tasks = load_dataset(str(DATA / name))
    assert "[dataset]" not in capfd.readouterr().err
    ids = [t.task_id for t in tasks]
    for split in ("train", "heldout"):
        assert [t.task_id for t in select_split(tasks, split)] == old_split(ids, split)


def test_web_qa_questions_split_by_content(capfd):
    qs = load_questions(DEFAULT_QUESTIONS)
    ids = [q["id"] for q in qs]
    for split in ("train", "heldout"):  # the bundled file has no repeats: as before
        assert [q["id"] for q in select_questions(qs, split)] == old_split(ids, split)
    held = select_questions(qs, "heldout")[0]
    twin = {**held, "id": "zz-copy", "question": "  " + held["question"].replace(" ", "\n")}
    assert split_fraction("zz-copy") >= 0.2  # by its own id it would be trained on
    assert twin in select_questions(qs + [twin], "heldout")
    assert twin not in select_questions(qs + [twin], "train")
