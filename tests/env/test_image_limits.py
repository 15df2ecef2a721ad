"""Images the Qwen2-VL image processor cannot render (zero side, aspect ratio over 200, or any
processor failure) are recorded env errors, never a crashed run; a batch with no trainable
tokens is a skipped update."""
import numpy as np
import pytest
from PIL import Image

from agentrl.env.base import TextEnv
from agentrl.env.content import content_error
from agentrl.rollout.agent_loop import EpisodeSpec, run_episodes
from agentrl.rollout.engines.base import SamplingParams
from agentrl.rollout.engines.scripted import ScriptedEngine


def _parts(img):
    return [{"type": "text", "text": "look"}, {"type": "image", "image": img}]


def test_content_error_rejects_zero_sides_and_extreme_aspect_with_size():
    assert content_error(_parts(np.zeros((10, 3000, 3), np.uint8))) == (
        "part 1: image of size 3000x10 (WxH) has aspect ratio 300, over the image processor's limit of 200")
    assert content_error(_parts(Image.new("RGB", (0, 0)))) == "part 1: image of size 0x0 (WxH) has a zero dimension"
    assert content_error(_parts(Image.new("RGB", (5, 0)))) == "part 1: image of size 5x0 (WxH) has a zero dimension"
    assert content_error(_parts(np.zeros((1, 200, 3), np.uint8))) is None  # exactly 200: accepted
    assert content_error(_parts(Image.new("RGB", (1, 1)))) is None  # under min_pixels: scaled up


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    from agentrl.models.vlm import build_tiny_vlm, load_vlm

    d = build_tiny_vlm(tmp_path_factory.mktemp("vlm") / "m", ["How many red squares?", "Wrong, look again."] * 5,
                       hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, vocab_size=320)
    return load_vlm(d)


class _Env(TextEnv):
    """Reset shows `reset_img`; the first step's feedback shows `step_img`."""

    def __init__(self, reset_img, step_img=None):
        self.reset_img, self.step_img = reset_img, step_img

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [{"role": "user", "content": _parts(self.reset_img)}], {}

    def step(self, action):
        return [{"role": "user", "content": _parts(self.step_img)}], 0.0, False, False, {}


class _PickyProcessor:
    """The real processor, except that it raises on 7-pixel-wide images (an unknown limit)."""

    def __init__(self, ip):
        self.ip = ip
        self.merge_size = ip.merge_size

    def __call__(self, images, **kw):
        if any(im.size[0] == 7 for im in images):
            raise RuntimeError("cannot resize this one")
        return self.ip(images=images, **kw)


def test_unrenderable_images_are_recorded_env_errors(vlm):
    from agentrl.rollout.chat import VisionChatRenderer

    _, tok, ip = vlm
    good = np.full((8, 6, 3), 9, np.uint8)
    r = VisionChatRenderer(tok, _PickyProcessor(ip))
    eng = ScriptedEngine(tok, lambda prompt: "7")
    p = SamplingParams(temperature=1.0, max_tokens=4, stop_token_ids=r.stop_ids)
    envs = [_Env(np.zeros((10, 3000, 3), np.uint8)), _Env(good, Image.new("RGB", (0, 0))),
            _Env(np.zeros((8, 7, 3), np.uint8)), _Env(good, np.zeros((8, 7, 3), np.uint8))]
    wide, zero_step, proc_reset, proc_step = run_episodes(
        eng, r, envs, [EpisodeSpec({"seed": s}) for s in range(4)], p, error_reward=-1.0,
        max_episode_tokens=400)
    assert wide.terminated and not wide.turns and wide.info["error"] == (
        "reset returned a bad observation: message 0: part 1: image of size 3000x10 (WxH) has aspect "
        "ratio 300, over the image processor's limit of 200")
    assert zero_step.terminated and zero_step.turns[0].reward == -1.0
    assert zero_step.info["errors"] == ["step returned a bad observation: message 0: part 1: image of "
                                        "size 0x0 (WxH) has a zero dimension"]
    assert proc_reset.terminated and not proc_reset.turns and not proc_reset.token_ids
    assert proc_reset.info["error"] == (
        "reset returned a bad observation: env _Env: image processor failed on image 0 of size 7x8 "
        "(WxH): RuntimeError: cannot resize this one")
    assert proc_step.terminated and proc_step.turns[0].reward == -1.0 and len(proc_step.turns) == 1
    assert proc_step.info["errors"] == [
        "step returned a bad observation: env _Env: image processor failed on image 0 of size 7x8 "
        "(WxH): RuntimeError: cannot resize this one"]
    assert proc_step.turns[0].info["env_exception"] is True


def test_learner_update_on_a_batch_without_trainable_tokens_is_skipped(vlm):
    from agentrl.algos import get_algorithm
    from agentrl.algos.shaping import build_batch
    from agentrl.config import algo_config
    from agentrl.learner.local import Learner
    from agentrl.types import Trajectory

    model, tok, _ = vlm
    trs = [Trajectory(group_id=0) for _ in range(2)]
    for t in trs:
        t.terminated = True
        t.info["error"] = "reset failed"
    batch = build_batch(trs, pad_id=tok.pad_token_id)
    algo, cfg = get_algorithm("grpo"), algo_config(name="grpo")
    batch["advantages"], _ = algo.advantages(batch, cfg)
    assert Learner(model, lr=1e-3).update(batch, algo, cfg) == {}


ENV_MODULE = '''
import numpy as np
from agentrl import TextEnv, register_env

class WideImage(TextEnv):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [{"role": "user", "content": [{"type": "text", "text": "count"},
                 {"type": "image", "image": np.zeros((10, 3000, 3), np.uint8)}]}], {}
    def step(self, action):
        return [], 1.0, True, False, {}

register_env("wideimg/WideImage-v0", WideImage, short_name="wideimg")
'''


def _train(tmp_path, *overrides):
    import os
    import subprocess
    import sys

    (tmp_path / "wideimg_envs.py").write_text(ENV_MODULE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.getcwd()])}
    return subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "train", "--import", "wideimg_envs", "--env", "wideimg",
         "--algo", "grpo", "--steps", "2", "--out", str(tmp_path / "run"), "sft.steps=0",
         "rollout.tasks_per_step=2", "algo.group_size=2", "train.eval_tasks=2", *overrides],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def test_cli_every_reset_bad_image_embedded_vlm_exits_2(tmp_path):
    res = _train(tmp_path, "model.vision=true")
    assert res.returncode == 2, res.stderr[-2000:]
    assert ("env wideimg: every reset raised or returned a bad observation (2000 of 2000) while gathering "
            "texts for the embedded tokenizer; last bad observation: part 1: image of size 3000x10 (WxH) "
            "has aspect ratio 300, over the image processor's limit of 200") in res.stderr + res.stdout
    assert "Traceback" not in res.stderr


def test_cli_every_reset_bad_image_given_vlm_skips_updates(tmp_path):
    import json

    from agentrl.models.vlm import build_tiny_vlm

    d = build_tiny_vlm(tmp_path / "vlm", ["How many?", "look again"] * 5, hidden_size=32, num_layers=1,
                       num_heads=2, intermediate_size=64, vocab_size=320)
    res = _train(tmp_path, f"model.path={d}")
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout + res.stderr
    assert "step 1: update skipped: the batch has no trainable tokens (4 episodes, 4 with an env error" in out
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("loss/skipped_empty_batch") for r in rows if "loss/lr" in r] == [1.0, 1.0]
