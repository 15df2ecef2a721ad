"""Images for `VLLMEngine` (a Qwen2-VL-style model directory, such as the embedded tiny VLM).

vLLM takes a token prompt with images as `{"prompt_token_ids": ids, "multi_modal_data":
{"image": [PIL images]}}`, runs the model's Hugging Face image processor itself, and widens each
image placeholder to one id per merged patch. So the prompt handed to vLLM has ONE placeholder
per image (`collapse_image_pads`); given our widened ids, vLLM widens them again (measured:
9 placeholders became 17). The engine checks that vLLM's widened prompt is ours, id for id.

Without torchvision (the CPU torch wheel has no torchvision build here), vLLM 0.32's Qwen2-VL
cannot load: `vllm/model_executor/models/qwen2_vl.py` imports `smart_resize` from
`transformers.models.qwen2_vl.image_processing_qwen2_vl`, which imports torchvision, and
`Qwen2VLProcessor.from_pretrained` builds the video processor, which needs torchvision.
`patch_transformers_without_torchvision` stands in for both, in this process, and only when
torchvision is missing: the image processor module is served by the PIL one
(`image_processing_pil_qwen2_vl`, same `smart_resize`, same pixels), and the video processor is
a stub that refuses videos. It relies on transformers 5.x internals
(`_LazyAutoProcessorMapping._MAPPING_NAMES`, `ProcessorMixin.check_argument_for_proper_class`)
and says so when they are not there. vLLM's inspection of the model class, which it runs in a
child process on a miss of its on-disk model-info cache, then runs in this process, where the
stand-ins are (`_inspect_models_in_process`; a fresh machine has no such cache).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading
import types
from collections.abc import Sequence
from typing import Any

from agentrl.models.vlm import to_pil

IMAGE_PROCESSOR_MODULE = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
MAX_IMAGES_PER_PROMPT = 16
"""vLLM's `limit_mm_per_prompt["image"]` default here (videos: 0); `rollout.vllm_kwargs` sets
another."""

_patched = False
_lock = threading.Lock()


def collapse_image_pads(ids: Sequence[int], pad_id: int) -> list[int]:
    """`ids` with each run of consecutive `pad_id`s shortened to one `pad_id` (the inverse of
    `agentrl.models.vlm.expand_image_pads` when images are separated by other ids, as the chat
    template's `<|vision_start|>` / `<|vision_end|>` make them).

    Example: `[5, 9, 9, 9, 7, 9, 9]` with pad 9 -> `[5, 9, 7, 9]`.
    """
    out: list[int] = []
    for t in ids:
        if t == pad_id and out and out[-1] == pad_id:
            continue
        out.append(int(t))
    return out


def image_prompt(ids: Sequence[int], vision: dict[str, Any] | None, pad_id: int) -> dict[str, Any]:
    """The vLLM prompt of `ids` (placeholders widened) and its `Trajectory.vision`: collapsed
    placeholders and the images as PIL images; a plain token prompt without images.

    Raises:
        ValueError: `vision` has image grids but no `images` (a renderer that kept only pixel
            values: vLLM needs the images), or a count of placeholder runs that is not the
            number of images.
    """
    if vision is None or vision.get("image_grid_thw") is None or len(vision["image_grid_thw"]) == 0:
        return {"prompt_token_ids": [int(t) for t in ids]}
    images = vision.get("images") or []
    n = len(vision["image_grid_thw"])
    if len(images) != n:
        raise ValueError(f"the vllm engine needs the images themselves: the trajectory has {n} image "
                         f"grids and {len(images)} images (render with VisionChatRenderer)")
    short = collapse_image_pads(ids, pad_id)
    if short.count(pad_id) != n:
        raise ValueError(f"{short.count(pad_id)} image placeholder runs in the prompt for {n} images")

    return {"prompt_token_ids": short, "multi_modal_data": {"image": [to_pil(im) for im in images]}}


def torchvision_available() -> bool:
    """Whether `torchvision` can be found (not imported: a mismatched build fails on import)."""
    return importlib.util.find_spec("torchvision") is not None


class _PilModuleLoader(importlib.abc.Loader):
    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as pil

        module.smart_resize = pil.smart_resize  # type: ignore[attr-defined]
        module.Qwen2VLImageProcessor = pil.Qwen2VLImageProcessorPil  # type: ignore[attr-defined]


class _PilModuleFinder(importlib.abc.MetaPathFinder):
    """Serves `IMAGE_PROCESSOR_MODULE` from the PIL image processor's module."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname == IMAGE_PROCESSOR_MODULE:
            return importlib.util.spec_from_loader(fullname, _PilModuleLoader())
        return None


def _inspect_models_in_process() -> None:
    """vLLM inspects a model class in a child process (`registry._run_in_subprocess`, "to avoid
    initializing CUDA") unless its on-disk model-info cache has it; the child imports
    `vllm/model_executor/models/qwen2_vl.py` without the stand-ins above and fails on the
    missing torchvision. Where torchvision is missing (the CPU build: no CUDA to protect) the
    inspection runs in this process, with the stand-ins.

    Raises:
        RuntimeError: vLLM has no `registry._run_in_subprocess` (its internals moved)."""
    from vllm.model_executor.models import registry

    if not callable(getattr(registry, "_run_in_subprocess", None)):
        raise RuntimeError(f"vllm {__import__('vllm').__version__}: no model_executor.models.registry."
                           "_run_in_subprocess to run the model inspection in process; install torchvision")
    registry._run_in_subprocess = lambda fn: fn()


def patch_transformers_without_torchvision() -> bool:
    """Let vLLM load a Qwen2-VL model where torchvision is missing (module doc). Idempotent;
    does nothing when torchvision is installed.

    Returns:
        True when the stand-ins are in place (now or from an earlier call), False when
        torchvision is there (nothing to do).

    Raises:
        RuntimeError: transformers lacks the internals the stand-ins replace (another major
            version), or the torchvision-based module was imported already (and failed).
    """
    global _patched
    if torchvision_available():
        return False
    with _lock:
        if _patched:
            return True
        import transformers.processing_utils as pu
        from transformers.utils import PushToHubMixin

        mapping = getattr(getattr(pu, "_LazyAutoProcessorMapping", None), "_MAPPING_NAMES", None)
        check = getattr(pu.ProcessorMixin, "check_argument_for_proper_class", None)
        if not isinstance(mapping, dict) or "video_processor" not in mapping or check is None:
            raise RuntimeError(f"transformers {__import__('transformers').__version__}: cannot stand in for "
                               "torchvision's Qwen2-VL processors (internals changed); install torchvision")
        if IMAGE_PROCESSOR_MODULE in sys.modules and not hasattr(sys.modules[IMAGE_PROCESSOR_MODULE], "smart_resize"):
            raise RuntimeError(f"{IMAGE_PROCESSOR_MODULE} was imported without torchvision before the stand-in")

        class NoVideoProcessor(PushToHubMixin):
            """The video processor's attributes that vLLM's Qwen2-VL reads; refuses videos."""

            merge_size, temporal_patch_size, patch_size = 2, 2, 14
            model_input_names = ["pixel_values_videos", "video_grid_thw"]

            class valid_kwargs:  # noqa: N801 - vLLM reads its annotations
                pass

            def to_dict(self) -> dict[str, Any]:
                return {}

            def __call__(self, *args: Any, **kwargs: Any) -> Any:
                raise ValueError("videos need torchvision (not installed); agentrl sends images only")

        class AutoNoVideoProcessor:
            @classmethod
            def from_pretrained(cls, *args: Any, **kwargs: Any) -> NoVideoProcessor:
                return NoVideoProcessor()

        def checked(self: Any, name: str, arg: Any) -> Any:
            if isinstance(arg, NoVideoProcessor):
                return NoVideoProcessor
            return check(self, name, arg)

        sys.meta_path.insert(0, _PilModuleFinder())
        stub = types.ModuleType("agentrl_no_video_processor")
        stub.AutoVideoProcessor = AutoNoVideoProcessor  # type: ignore[attr-defined]
        sys.modules[stub.__name__] = stub
        mapping["video_processor"] = (stub.__name__, "AutoVideoProcessor")
        pu.ProcessorMixin.check_argument_for_proper_class = checked  # type: ignore[method-assign]
        _inspect_models_in_process()
        _patched = True
        return True
