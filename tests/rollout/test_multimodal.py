"""Images in observations (issue 26): the env API's content parts, `check_env` on an image env,
and the clear error a text-only policy gives when an image arrives."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from PIL import Image

from agentrl.env.base import ChatMessages, TextEnv
from agentrl.env.content import content_error, content_text, message_images
from agentrl.rollout.agent_loop import EpisodeSpec, ImageObservationError, run_episodes
from agentrl.rollout.chat import ChatRenderer
from agentrl.rollout.engines.base import SamplingParams
from agentrl.rollout.engines.scripted import ScriptedEngine
from agentrl.types import is_image


def _img(seed: int, h: int = 8, w: int = 6) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8)


class ImageEnv(TextEnv):
    """Shows a seeded random image (as a PIL image, or an array with `as_array`), asks for its
    top-left pixel's red value; second turn repeats the image if wrong."""

    def __init__(self, as_array: bool = False, image_on_step: bool = True):
        self.as_array = as_array
        self.image_on_step = image_on_step

    def _image(self):
        return self.arr if self.as_array else Image.fromarray(self.arr)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.arr = self.np_random.integers(0, 256, size=(8, 6, 3), dtype=np.uint8)
        return [{"role": "user", "content": [{"type": "image", "image": self._image()},
                                             {"type": "text", "text": "red of the first pixel?"}]}], {}

    def step(self, action):
        right = action.strip() == str(int(self.arr[0, 0, 0]))
        if right:
            return [], 1.0, True, False, {}
        parts = [{"type": "text", "text": "wrong, look again"}]
        if self.image_on_step:
            parts.append({"type": "image", "image": self._image()})
        return [{"role": "user", "content": parts}], 0.0, False, False, {}


def test_content_parts_accepted_and_rejected_with_reasons():
    space = ChatMessages()
    pil = Image.fromarray(_img(0))
    ok = [{"role": "user", "content": "plain"},
          {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image", "image": pil},
                                       {"type": "image", "image": _img(1)}]},
          {"role": "user", "content": []}]
    assert space.contains(ok)
    assert message_images(ok)[0] is pil and np.array_equal(message_images(ok)[1], _img(1))
    assert content_text(ok[1]["content"]) == "a" and content_text("x") == "x"
    bad = {
        "float image": ([{"type": "image", "image": _img(0).astype(np.float32)}], "float32"),
        "grey image": ([{"type": "image", "image": np.zeros((4, 4), np.uint8)}], "(4, 4)"),
        "rgba image": ([{"type": "image", "image": np.zeros((4, 4, 4), np.uint8)}], "(4, 4, 4)"),
        "empty image": ([{"type": "image", "image": np.zeros((0, 4, 3), np.uint8)}], "(0, 4, 3)"),
        "path as image": ([{"type": "image", "image": "cat.png"}], "got str"),
        "text not str": ([{"type": "text", "text": 3}], "str 'text'"),
        "unknown part": ([{"type": "audio", "audio": b""}], "'text' or 'image'"),
        "not a list": ({"type": "text", "text": "a"}, "got dict"),
        "none": (None, "got NoneType"),
    }
    for name, (content, words) in bad.items():
        err = content_error(content)
        assert err is not None and words in err, (name, err)
        assert not space.contains([{"role": "user", "content": content}]), name
    assert is_image(pil) and is_image(_img(2)) and not is_image([[0, 0, 0]])


@pytest.mark.parametrize("as_array", [False, True])
def test_check_env_passes_on_image_observations(as_array):
    env = ImageEnv(as_array=as_array)
    check_env(env, skip_render_check=True)
    a, _ = env.reset(seed=3)
    b, _ = env.reset(seed=3)
    ia, ib = np.asarray(message_images(a)[0]), np.asarray(message_images(b)[0])
    assert np.array_equal(ia, ib) and ia.shape == (8, 6, 3)  # seeded: the same image


def test_text_only_model_names_env_and_model_when_an_image_arrives(tiny_tokenizer):
    r = ChatRenderer(tiny_tokenizer)
    assert not r.accepts_images
    eng = ScriptedEngine(tiny_tokenizer, lambda prompt: "7")
    p = SamplingParams(temperature=1.0, max_tokens=8, stop_token_ids=r.stop_ids)
    with pytest.raises(ImageObservationError) as e:
        run_episodes(eng, r, [ImageEnv()], [EpisodeSpec({"seed": 0})], p)
    assert "ImageEnv" in str(e.value) and tiny_tokenizer.name_or_path in str(e.value)
    assert "text-only" in str(e.value) and "model.vision" in str(e.value)


class LateImageEnv(ImageEnv):
    """Text at reset, an image only in the feedback of step 1."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [{"role": "user", "content": "guess a number"}], {}

    def step(self, action):
        return [{"role": "user", "content": [{"type": "image", "image": self._image()}]}], 0.0, False, False, {}


def test_text_only_model_errors_on_an_image_in_a_later_turn(tiny_tokenizer):
    import gymnasium as gym

    gym.register("test/LateImage-v0", entry_point=LateImageEnv)
    try:
        env = gym.make("test/LateImage-v0")
        r = ChatRenderer(tiny_tokenizer)
        eng = ScriptedEngine(tiny_tokenizer, lambda prompt: "7")
        p = SamplingParams(temperature=1.0, max_tokens=8, stop_token_ids=r.stop_ids)
        with pytest.raises(ImageObservationError, match="env test/LateImage-v0 sent an image"):
            run_episodes(eng, r, [env], [EpisodeSpec({"seed": 0})], p)
    finally:
        del gym.registry["test/LateImage-v0"]


def test_warm_start_examples_refuse_images_for_a_text_only_model(tiny_tokenizer):
    """`sft_examples` with a text renderer refuses an image env before any step (the text
    template would drop the image and the warm start would train on the question alone)."""
    from agentrl.sft import sft_examples
    from agentrl_envs.visual_count import VisualCountEnv

    with pytest.raises(ImageObservationError, match="VisualCountEnv sent an image observation"):
        sft_examples(VisualCountEnv("train"), ChatRenderer(tiny_tokenizer), 2, seed=0)
    text = sft_examples(_TextAnswers(), ChatRenderer(tiny_tokenizer), 2, seed=0)
    assert len(text) == 2 and text[0].vision is None  # text observations: unchanged


class _TextAnswers(TextEnv):
    """A text env with a reference answer."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [{"role": "user", "content": "Say 7."}], {}

    def reference_answer(self):
        return "7"

    def step(self, action):
        return [], float(action.strip() == "7"), True, False, {}


# -- rendering images in the agent loop (a vision renderer on the embedded tiny VLM) ------------
@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    from agentrl.models.vlm import build_tiny_vlm, load_vlm

    d = build_tiny_vlm(tmp_path_factory.mktemp("vlm") / "m", ["How many red squares are in the image?",
                       "Wrong, look again.", "Which cell holds the circle? 1,2"] * 5,
                       hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, vocab_size=320)
    return load_vlm(d)


def test_two_turn_image_episode_ids_masks_and_pixels_exact(vlm):
    """A scripted two-turn `visual_count` episode (wrong, then right; the feedback repeats the
    image): the ids are the template's rendering with each image's placeholder widened to
    84x84 px -> 6x6 patches -> 36 / 2**2 = 9 ids, the mask is 1 exactly on the two sampled
    turns, the placeholders are context (mask 0), and the pixels are the two boards'."""
    import json

    import torch

    from agentrl.models.vlm import IMAGE_PAD, VISION_END, VISION_START, encode_images
    from agentrl.rollout.chat import VisionChatRenderer
    from agentrl_envs.visual_count import FEEDBACK, VisualCountEnv, draw, make_task

    model, tok, ip = vlm
    r = VisionChatRenderer(tok, ip)
    assert r.accepts_images and r.image_token_id == tok.convert_tokens_to_ids(IMAGE_PAD)
    task = make_task(3, questions=["where"])
    wrong = f"{int(task.answer[0]) % 3 + 1},{task.answer[2]}"
    answers = iter([wrong, task.answer])
    eng = ScriptedEngine(tok, lambda prompt: next(answers))
    env = VisualCountEnv(questions=["where"], max_turns=2, feedback_image=True, image_format="array")
    p = SamplingParams(temperature=1.0, max_tokens=16, stop_token_ids=r.stop_ids)
    [tr] = run_episodes(eng, r, [env], [EpisodeSpec({"options": {"task": 3}})], p)
    assert [t.reward for t in tr.turns] == [0.0, 1.0] and tr.terminated

    image = VISION_START + IMAGE_PAD * 9 + VISION_END
    text = (f"<|im_start|>user\n{image}{task.question}<|im_end|>\n<|im_start|>assistant\n"
            f"{wrong}<|im_end|>\n<|im_start|>user\n{FEEDBACK}{image}<|im_end|>\n<|im_start|>assistant\n"
            f"{task.answer}<|im_end|>")
    assert tr.token_ids == tok.encode(text, add_special_tokens=False)
    im_end = r.end_of_turn_id
    sampled = [t for t, m in zip(tr.token_ids, tr.loss_mask) if m]
    assert sampled == (tok.encode(wrong, add_special_tokens=False) + [im_end]
                       + tok.encode(task.answer, add_special_tokens=False) + [im_end])
    pad = r.image_token_id
    spans = tr.vision["image_spans"]
    assert len(spans) == 2 and all(e - s == 9 for s, e in spans)
    assert [i for i, t in enumerate(tr.token_ids) if t == pad] == [*range(*spans[0]), *range(*spans[1])]
    assert all(tr.loss_mask[i] == 0 for s, e in spans for i in range(s, e))
    board = draw(task.items)
    want = encode_images(ip, [board, board])
    assert torch.equal(tr.vision["pixel_values"], want["pixel_values"])
    assert tr.vision["image_grid_thw"].tolist() == [[1, 6, 6], [1, 6, 6]]
    # the trajectory feeds the model as is: placeholders match the images' features
    ids = torch.tensor([tr.token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids, pixel_values=tr.vision["pixel_values"],
                       image_grid_thw=tr.vision["image_grid_thw"], mm_token_type_ids=(ids == pad).long()).logits
    assert logits.shape[1] == len(tr.token_ids) and torch.isfinite(logits).all()
    d = json.loads(json.dumps(tr.to_dict()))
    assert d["vision"] == {"image_grid_thw": [[1, 6, 6], [1, 6, 6]], "image_spans": spans}
    assert d["messages"][0]["content"][0] == {"type": "image", "image": "<image 84x84>"}


def test_text_trajectories_keep_their_dict_shape(tiny_tokenizer):
    from agentrl.types import Trajectory

    tr = Trajectory()
    tr.append_context([1, 2])
    d = tr.to_dict()
    assert "vision" not in d and tr.vision is None
    assert Trajectory.from_dict(d).to_dict() == d


def test_vision_engine_and_learner_logprobs_agree_on_an_unchanged_policy(vlm):
    """Case L4 for images: two-turn `visual_count` episodes sampled by `VisionHFEngine` from
    ids + pixels; the teacher-forced logprobs of the same (unchanged) model on the whole
    trajectory equal the sampler's on every sampled token (ratio 1 up to float32 rounding),
    no vision token is ever sampled, and the pixels matter to the sampler."""
    import torch

    from agentrl.models.vision_logprobs import vision_logprobs
    from agentrl.rollout.chat import VisionChatRenderer
    from agentrl.rollout.engines.hf_vision import VisionHFEngine
    from agentrl_envs.visual_count import VisualCountEnv

    torch.manual_seed(0)
    model, tok, ip = vlm
    r = VisionChatRenderer(tok, ip)
    eng = VisionHFEngine(model, image_token_id=r.image_token_id, banned_ids=r.vision_token_ids)
    envs = [VisualCountEnv(max_turns=2, feedback_image=True) for _ in range(2)]
    p = SamplingParams(temperature=1.0, max_tokens=6, stop_token_ids=r.stop_ids)
    trs = run_episodes(eng, r, envs, [EpisodeSpec({"options": {"task": k}}) for k in (1, 2)], p, seed=0)
    n_checked = 0
    for tr in trs:
        assert len(tr.vision["image_spans"]) == len(tr.turns)  # an image per opening/feedback
        lp = vision_logprobs(model, tr.token_ids, tr.vision, image_token_id=r.image_token_id,
                             banned_ids=r.vision_token_ids)
        mask = torch.tensor(tr.loss_mask, dtype=torch.bool)
        sampler = torch.tensor(tr.sampler_logprobs)
        assert torch.allclose(lp[mask], sampler[mask], atol=1e-4), (lp[mask] - sampler[mask]).abs().max()
        assert (lp[mask] - sampler[mask]).exp().sub(1).abs().max() < 1e-3  # ratio 1
        sampled = [t for t, m in zip(tr.token_ids, tr.loss_mask) if m]
        assert not set(sampled) & set(r.vision_token_ids)
        n_checked += int(mask.sum())
    assert n_checked >= 4
    # same seed and ids, other pixels: other logprobs (the engine looks at the image)
    tr = trs[0]
    first = tr.turns[0].start
    prompt, vis = tr.token_ids[:first], tr.vision
    n0 = int(vis["image_grid_thw"][0].prod())
    one = {"pixel_values": vis["pixel_values"][:n0], "image_grid_thw": vis["image_grid_thw"][:1]}
    other = {"pixel_values": -one["pixel_values"], "image_grid_thw": one["image_grid_thw"]}
    q = SamplingParams(temperature=1.0, max_tokens=1, stop_token_ids=r.stop_ids, seed=0)
    a, b = eng.generate([prompt, prompt], q, images=[one, other])
    assert a.logprobs != b.logprobs or a.token_ids != b.token_ids
    with pytest.raises(ValueError, match="1 image entries for 2 prompts"):
        eng.generate([prompt, prompt], q, images=[one])


def test_vision_forward_inputs_checks_placeholders():
    import torch

    from agentrl.models.vision_logprobs import vision_forward_inputs

    grid = torch.tensor([[1, 4, 6]])  # 24 patches -> 6 placeholders
    vis = {"pixel_values": torch.zeros(24, 1176), "image_grid_thw": grid}
    ok = vision_forward_inputs([1, 9, 9, 9, 9, 9, 9, 2], vis, 9)
    assert ok["mm_token_type_ids"].tolist() == [[0, 1, 1, 1, 1, 1, 1, 0]]
    assert set(ok) == {"input_ids", "pixel_values", "image_grid_thw", "mm_token_type_ids"}
    with pytest.raises(ValueError, match="5 image placeholder ids for images of 6 merged patches"):
        vision_forward_inputs([1, 9, 9, 9, 9, 9, 2], vis, 9)
    assert set(vision_forward_inputs([1, 2], None, 9)) == {"input_ids"}


def test_learner_takes_pixel_values_ratio_one_then_a_grpo_step(vlm, tmp_path):
    """The Learner on a batch of image episodes (`collate` adds `vision`): its logprobs of the
    unchanged policy equal the sampler's (ratio 1, case L4), its micro-batch split does not
    change them, and one GRPO step has a finite loss and moves the weights, text and vision
    tower alike."""
    import copy
    import math

    import torch

    from agentrl.algos import get_algorithm
    from agentrl.algos.shaping import build_batch
    from agentrl.config import algo_config
    from agentrl.learner.local import Learner
    from agentrl.rollout.chat import VisionChatRenderer
    from agentrl.rollout.engines.hf_vision import VisionHFEngine
    from agentrl_envs.visual_count import VisualCountEnv

    torch.manual_seed(0)
    model, tok, ip = vlm
    model = copy.deepcopy(model)  # trained below: keep the module's copy unchanged
    r = VisionChatRenderer(tok, ip)
    eng = VisionHFEngine(model, image_token_id=r.image_token_id, banned_ids=r.vision_token_ids)
    envs = [VisualCountEnv(max_turns=2, feedback_image=True) for _ in range(4)]
    p = SamplingParams(temperature=1.0, max_tokens=5, stop_token_ids=r.stop_ids)
    specs = [EpisodeSpec({"options": {"task": k}}, group_id=k // 2) for k in range(4)]
    trs = run_episodes(eng, r, envs, specs, p, seed=1)
    for i, tr in enumerate(trs):  # rewards that differ within each group (random answers all fail)
        tr.turns[-1].reward = float(i % 2)
    batch = build_batch(trs, pad_id=tok.pad_token_id)
    assert len(batch["vision"]) == 4
    mask = batch["loss_mask"].bool()
    for mbs in (1, 3):
        lp = Learner(model, lr=1e-3, micro_batch_size=mbs).logprobs(batch)
        assert (lp[mask] - batch["sampler_logprobs"][mask]).abs().max() < 1e-4
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    cfg = algo_config(name="grpo")
    algo = get_algorithm("grpo")
    batch["advantages"], _ = algo.advantages(batch, cfg)
    m = Learner(model, lr=1e-2, micro_batch_size=2).update(batch, algo, cfg)
    assert math.isfinite(m["loss"]) and m["grad_norm"] > 0
    moved = {k for k, v in model.named_parameters() if not torch.equal(v, before[k])}
    assert any("visual" in k for k in moved) and any("language_model" in k for k in moved)


class BadImageEnv(ImageEnv):
    """Reset fine; the feedback carries a float image (an env bug)."""

    def step(self, action):
        return [{"role": "user", "content": [{"type": "image", "image": np.zeros((4, 4, 3))}]}], 0.0, False, False, {}


class BadResetEnv(ImageEnv):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [{"role": "user", "content": [{"type": "image", "image": "cat.png"}]}], {"task_id": "bad"}


def test_a_malformed_image_is_a_recorded_failed_step_not_a_crash(vlm):
    from agentrl.rollout.chat import VisionChatRenderer

    _, tok, ip = vlm
    r = VisionChatRenderer(tok, ip)
    eng = ScriptedEngine(tok, lambda prompt: "7")
    p = SamplingParams(temperature=1.0, max_tokens=8, stop_token_ids=r.stop_ids)
    bad_step, bad_reset, good = run_episodes(
        eng, r, [BadImageEnv(), BadResetEnv(), ImageEnv()], [EpisodeSpec({"seed": s}) for s in range(3)], p,
        error_reward=-1.0, max_episode_tokens=200)
    assert bad_step.terminated and bad_step.turns[0].reward == -1.0
    assert "step returned a bad observation: message 0: part 0: 'image' must be" in bad_step.info["errors"][0]
    assert "float64" in bad_step.info["errors"][0]
    assert bad_reset.terminated and not bad_reset.turns and "reset returned a bad observation" in bad_reset.info["error"]
    assert bad_reset.task_id == "bad"
    assert len(good.turns) >= 1 and good.vision is not None
