"""`visual_count` (agentrl/VisualCount-v0, issue 26): check_env with image observations, exact
pixels, answers checked against the drawn image, disjoint splits, scripted episodes with exact
rewards and feedback."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from PIL import Image

from agentrl.env.base import ChatMessages
from agentrl.env.content import message_images
from agentrl.env.registry import make_env
from agentrl_envs.visual_count import (
    COLOURS,
    FEEDBACK,
    HELDOUT_FRACTION,
    Item,
    VisualCountEnv,
    draw,
    make_task,
    parse_answer,
)


@pytest.mark.parametrize("fmt", ["pil", "array"])
def test_check_env_passes(fmt):
    check_env(make_env("visual_count", env_kwargs={"image_format": fmt}).unwrapped, skip_render_check=True)
    check_env(VisualCountEnv("heldout", image_format=fmt, max_turns=2), skip_render_check=True)


def test_draw_exact_pixels():
    """A 2x2 board of 12-px cells (margin 12 // 6 = 2): a red square at (0, 0), a blue circle at
    (1, 1); grid lines grey (200) on rows/columns 0 and 12, the rest white."""
    img = draw([Item(0, 0, "red", "square"), Item(1, 1, "blue", "circle")], grid=2, cell=12)
    assert img.shape == (24, 24, 3) and img.dtype == np.uint8
    red, blue = np.array(COLOURS["red"]), np.array(COLOURS["blue"])
    assert (img[2:10, 2:10] == red).all()  # the square's inner box, rows/cols 2..9
    assert (img[1, 1:12] == 255).all() and (img[10, 1:12] == 255).all()  # its margin stays white
    assert (img[0, :] == 200).all() and (img[:, 12] == 200).all()
    # circle: centre (17.5, 17.5) in board coordinates, radius (12 - 4) / 2 = 4
    assert (img[17, 17] == blue).all() and (img[14, 17] == blue).all()  # distance 3.5 <= 4
    assert (img[13, 13] == 255).all()  # the inner box's corner: distance 6.4 > 4
    assert (img[0:12, 12:24][1:, 1:] == 255).all() and (img[12:24, 0:12][1:, 1:] == 255).all()
    with pytest.raises(ValueError, match="outside the 2x2 grid"):
        draw([Item(2, 0, "red", "square")], grid=2, cell=12)


def _read_board(img, grid=3, cell=28):
    """Read the shapes back from the pixels: colour from the cell centre; square when the inner
    box's top-left corner is filled, triangle when only its bottom-left corner is, circle when
    neither (and the centre is)."""
    m = cell // 6
    found = []
    for r in range(grid):
        for c in range(grid):
            b = img[r * cell:(r + 1) * cell, c * cell:(c + 1) * cell]
            centre = tuple(int(v) for v in b[cell // 2, cell // 2])
            if centre == (255, 255, 255):
                continue
            colour = next(k for k, v in COLOURS.items() if v == centre)
            tl, bl = (b[m, m] != 255).any(), (b[cell - m - 1, m] != 255).any()
            shape = "square" if tl else "triangle" if bl else "circle"
            found.append((r, c, colour, shape))
    return found


def test_answers_agree_with_the_drawn_image():
    kinds = set()
    for seed in range(300):
        t = make_task(seed)
        board = _read_board(draw(t.items))
        assert sorted(board) == sorted((i.row, i.col, i.colour, i.shape) for i in t.items)
        kinds.add(t.kind)
        if t.kind == "count":
            words = t.question.split()
            colour, shape = words[2], words[3][:-1]  # "How many red squares are ..."
            assert t.answer == str(sum(1 for b in board if b[2] == colour and b[3] == shape))
        else:
            [(r, c, _, _)] = [b for b in board if b[3] == "circle"]
            assert t.answer == f"{r + 1},{c + 1}"
    assert kinds == {"count", "where"}
    assert make_task(7) == make_task(7) and make_task(7, questions=["where"]).kind == "where"


def test_colour_question_answers_agree_with_the_drawn_image_and_scripted_episode():
    """`colour` (opt-in): exactly one circle, the answer is its colour as read from the pixels;
    the default kinds are unchanged."""
    seen = set()
    for seed in range(200):
        t = make_task(seed, questions=["colour"])
        [(_, _, colour, _)] = [b for b in _read_board(draw(t.items)) if b[3] == "circle"]
        assert t.kind == "colour" and t.answer == colour and t.question.startswith("What colour is the circle?")
        seen.add(colour)
    assert seen == set(COLOURS)
    assert {make_task(s).kind for s in range(100)} == {"count", "where"}
    assert parse_answer("colour", "It is Blue.") == "blue" and parse_answer("colour", "reddish") is None
    env, obs, _, t = _task_env("colour")
    assert obs[0]["content"][1]["text"] == t.question
    assert env.step(f"{t.answer}")[1:4] == (1.0, True, False)
    env.reset(options={"task": t.seed})
    _, r, term, _, info = env.step("no idea")
    assert r == 0.0 and term and "no colour name" in info["error"]
    check_env(VisualCountEnv(questions=["colour"]), skip_render_check=True)


def test_splits_are_disjoint_and_seeded():
    train, held = VisualCountEnv("train"), VisualCountEnv("heldout")
    flags = [held.in_split(k) for k in range(2000)]
    assert all(train.in_split(k) != h for k, h in zip(range(2000), flags))
    assert abs(np.mean(flags) - HELDOUT_FRACTION) < 0.03
    for s in range(30):
        _, info = train.reset(seed=s)
        assert not held.in_split(int(info["task_id"].split("/")[1]))
    a, ia = held.reset(seed=5)
    b, ib = held.reset(seed=5)
    assert ia == ib and np.array_equal(np.asarray(message_images(a)[0]), np.asarray(message_images(b)[0]))
    eval_seeds = [t["options"]["task"] for t in held.eval_tasks()]
    assert len(eval_seeds) == 64 and all(held.in_split(k) for k in eval_seeds)
    train_seed = next(k for k in range(100) if train.in_split(k))
    with pytest.raises(ValueError, match="not in split 'heldout'"):
        held.reset(options={"task": train_seed})


def _task_env(kind, **kw):
    env = VisualCountEnv(questions=[kind], **kw)
    k = next(k for k in range(100) if make_task(k, questions=[kind]).kind == kind)
    obs, info = env.reset(options={"task": k})
    return env, obs, info, make_task(k, questions=[kind])


def test_single_attempt_rewards():
    env, obs, info, t = _task_env("count")
    assert ChatMessages().contains(obs) and obs[0]["content"][1]["text"] == t.question
    assert isinstance(obs[0]["content"][0]["image"], Image.Image)
    assert np.array_equal(np.asarray(obs[0]["content"][0]["image"]), draw(t.items))
    assert env.step(f"There are {t.answer}.")[1:4] == (1.0, True, False)
    env.reset(options={"task": t.seed})
    wrong = str(int(t.answer) + 1)
    msgs, r, term, trunc, info = env.step(wrong)
    assert (msgs, r, term, trunc, info["success"]) == ([], 0.0, True, False, False)
    env.reset(options={"task": t.seed})
    _, r, term, _, info = env.step("no idea")
    assert r == 0.0 and term and "no number" in info["error"]


def test_multi_turn_feedback_then_right():
    env, obs, _, t = _task_env("where", max_turns=3, feedback_image=True, image_format="array")
    r, c = (int(x) for x in t.answer.split(","))
    wrong = f"{r % 3 + 1},{c}"
    msgs, rew, term, trunc, info = env.step(wrong)
    assert (rew, term, trunc, info["attempts"]) == (0.0, False, False, 1)
    assert msgs[0]["role"] == "user" and msgs[0]["content"][0] == {"type": "text", "text": FEEDBACK}
    assert np.array_equal(msgs[0]["content"][1]["image"], obs[0]["content"][0]["image"])
    assert env.step("somewhere")[1:4] == (0.0, False, False)
    msgs, rew, term, trunc, info = env.step(f"row {r} column {c}")
    assert (msgs, rew, term, trunc, info["success"], info["attempts"]) == ([], 1.0, True, False, True, 3)


def test_attempts_run_out_truncated_and_max_turns_from_make_env():
    env = make_env("visual_count", max_turns=2, env_kwargs={"questions": ["count"]})
    assert env.unwrapped.max_turns == 2
    env.reset(seed=0)
    bad = str(int(env.unwrapped.task.answer) + 1)
    msgs, _, _, _, _ = env.step(bad)
    assert msgs[0]["content"] == [{"type": "text", "text": FEEDBACK}]  # no image by default
    assert env.step(bad)[1:4] == (0.0, False, True)


def test_parse_answer_and_bad_arguments():
    assert parse_answer("count", "I see 3 of them") == "3" and parse_answer("count", "three") == "3"
    assert parse_answer("count", "none") is None
    assert parse_answer("where", "2,3") == "2,3" and parse_answer("where", "row 1, column 2") == "1,2"
    assert parse_answer("where", "Row 3 col 1") == "3,1" and parse_answer("where", "middle") is None
    assert parse_answer("where", "23") is None and parse_answer("where", "(2, 1)") == "2,1"
    for kw, words in [({"split": "dev"}, "split"), ({"questions": ["size"]}, "unknown kinds"),
                      ({"image_format": "png"}, "image_format"), ({"max_turns": 0}, "max_turns"),
                      ({"max_items": 1}, "max_items"), ({"cell": 4}, "cell")]:
        with pytest.raises(ValueError, match=words):
            VisualCountEnv(**kw)
    with pytest.raises(ValueError, match="task seed"):
        VisualCountEnv().reset(options={"task": -1})
