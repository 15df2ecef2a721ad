"""Images in observations (issue 26): the env API's content parts, `check_env` on an image env,
and the clear error a text-only policy gives when an image arrives."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from PIL import Image

from agentrl.envs import (
    ChatMessages,
    TextEnv,
    content_error,
    content_text,
    is_image,
    message_images,
)
from agentrl.rollout.agent_loop import EpisodeSpec, ImageObservationError, run_episodes
from agentrl.rollout.chat import ChatRenderer
from agentrl.rollout.engines.base import SamplingParams
from agentrl.rollout.engines.scripted import ScriptedEngine


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
