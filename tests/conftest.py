"""Shared fixtures. Every test process runs torch with one thread (2-core machines: several
processes with 2 threads each slow each other 4-7x)."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

SHARED_DATA = __import__("pathlib").Path(__file__).resolve().parents[2] / "shared" / "data"
"""HumanEval, HumanEval+, MBPP and MBPP+ (the project's shared data, beside the clone)."""


def pytest_sessionstart(session) -> None:
    """Under CI (`CI=true`) the dataset tests must run, not skip: CI lays shared/ beside the
    clone, so its absence there is an error of the set-up, reported before any test."""
    if os.environ.get("CI", "").lower() in ("1", "true") and not SHARED_DATA.is_dir():
        raise pytest.UsageError(f"CI=true but the shared data folder {SHARED_DATA} is missing: "
                                "the dataset tests would only skip")

TINY_TEXTS = [
    "Write a Python function `add_seven(x)` that returns x plus 7.",
    "def add_seven(x):\n    return x + 7",
    "Search the corpus and answer the question. The capital of France is Paris.",
    "<tool_call>{\"name\": \"search\", \"arguments\": {\"q\": \"cats\"}}</tool_call>",
] * 20


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A tiny Qwen2 model + offline ChatML tokenizer, built once per test session."""
    from agentrl.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", TINY_TEXTS,
                            hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                            vocab_size=400, seed=0)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def metaspace_tokenizer():
    """`name -> build_metaspace_tokenizer(FAMILIES[name])`: a family's special tokens and chat
    template on a SentencePiece-style tokenizer (Metaspace, `prepend_scheme="first"`, as the
    published Mistral v0.3 / Phi-3 ones), each built once per test session."""
    from agentrl.models.families import FAMILIES, build_metaspace_tokenizer

    built: dict = {}

    def get(name: str):
        if name not in built:
            built[name] = build_metaspace_tokenizer(FAMILIES[name])
        return built[name]
    return get


@pytest.fixture(scope="session")
def metaspace_family_dir(tmp_path_factory):
    """`name -> DIR`: a tiny model of family `name` with a SentencePiece-style tokenizer
    (`build_family(..., tokenizer="metaspace")`), each written once per test session."""
    from agentrl.models.families import build_family

    built: dict = {}

    def get(name: str) -> str:
        if name not in built:
            built[name] = build_family(name, tmp_path_factory.mktemp("metaspace") / name,
                                       tokenizer="metaspace")
        return built[name]
    return get
