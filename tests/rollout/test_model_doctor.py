"""`agentrl doctor --model DIR` (issue 38, `agentrl.rollout.model_doctor`): on a tiny model
directory of every family (`build_family`: the family's special tokens and published template)
it reports the end of turn and its glue, history rewriting, the tool format `auto` picks, the
turn-boundary merges the probe episodes find, the system role, and the vocabulary against the
config and the embedding rows; a directory without a tokenizer or a chat template is a one-line
error with exit code 2."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.models.families import FAMILIES, build_family, build_family_tokenizer, family_config
from agentrl.rollout.model_doctor import inspect_model

# family: (end of turn, glue, rewrites history, tool parser, system role, merging probes)
EXPECTED = {
    "qwen2_5": ("<|im_end|>", "\n", False, "hermes", "rendered", ["\nHello.", "\n\nHello."]),
    "qwen3": ("<|im_end|>", "\n", True, "hermes", "rendered", []),
    "llama3_1": ("<|eot_id|>", "", False, "llama3_json", "rendered", []),
    "llama3_2": ("<|eot_id|>", "", False, "llama3_json", "rendered", []),
    "mistral_v0_3": ("</s>", "", True, "mistral", "folded into the user turn", []),
    "gemma3": ("<end_of_turn>", "\n", False, "hermes", "folded into the user turn", ["\nHello.", "\n\nHello."]),
    "phi3": ("<|end|>", "\n", False, "hermes", "rendered", ["\nHello.", "\n\nHello."]),
    "deepseek_r1_distill": ("<｜end▁of▁sentence｜>", "", True, "hermes", "rendered", ["\nHello.", "\n\nHello."]),
}
"""The merges are this offline tokenizer's (its BPE learned "\\n\\n" where the generation prompt
ends in "\\n" and a turn starts with one); a real model's tokenizer has its own."""


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {n: build_family(n, root / n, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
            for n in FAMILIES}


def test_every_family_has_a_row():
    assert sorted(EXPECTED) == sorted(FAMILIES)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_report_per_family(name, dirs):
    eot, glue, rewrites, parser, system, merging = EXPECTED[name]
    rep = inspect_model(dirs[name])
    n = len(build_family_tokenizer(FAMILIES[name]))
    assert rep["end_of_turn"][1] == eot and rep["glue"] == glue
    assert rep["stop"][0] == rep["end_of_turn"]
    assert rep["rewrites_history"] is rewrites and bool(rep["history_note"]) is rewrites
    assert rep["tool_parser"] == parser and rep["system_role"] == system
    assert [m.split(": ")[0] for m in rep["boundary_merges"]] == [f"a turn starting {p!r}" for p in merging]
    assert rep["vocabulary"] == {"tokenizer": n, "config": n, "embedding": n, "verdict": "ok"}


def test_cli_prints_the_report_and_exits_0(dirs):
    res = CliRunner().invoke(app, ["doctor", "--model", dirs["llama3_1"]])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[1].startswith("end of turn: <|eot_id|> (id 9); glue after it: ''")
    assert "rewrites history: no" in lines and "system role: rendered" in lines
    assert any(x.startswith("turn boundary merges: no") for x in lines)
    assert "tool format (rollout.tool_parser=auto): llama3_json (<|python_tag|> in the token and chat template)" in lines
    n = len(build_family_tokenizer(FAMILIES["llama3_1"]))
    assert f"vocabulary: tokenizer {n}, config {n}, embedding {n}: ok" in lines
    res = CliRunner().invoke(app, ["doctor", "--model", dirs["qwen3"]])
    assert "rewrites history: yes: drops the <think> blocks of earlier assistant turns" in res.output


def test_padded_embedding_rows_are_reported(tmp_path):
    """A model with 64 embedding rows beyond its tokenizer (as Qwen2.5-7B has): `padded`."""
    from transformers import Qwen2ForCausalLM

    tok = build_family_tokenizer(FAMILIES["qwen2_5"])
    cfg = family_config(FAMILIES["qwen2_5"], tok, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    cfg.vocab_size = len(tok) + 64
    Qwen2ForCausalLM(cfg).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    v = inspect_model(tmp_path)["vocabulary"]
    assert v["embedding"] == v["config"] == len(tok) + 64
    assert v["verdict"] == "padded: 64 rows beyond the tokenizer (sliced off the logits)"
    c = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**c, "vocab_size": len(tok) - 8}))
    # config.json no longer fits the weights (transformers refuses to load them): MISMATCH
    # names both sizes, and doctor exits 1 (it said the tokenizer was the problem, and exit 0)
    assert inspect_model(tmp_path)["vocabulary"]["verdict"] == (
        f"MISMATCH: {tmp_path / 'config.json'} says vocab_size {len(tok) - 8} but the weights' "
        f"embedding has {len(tok) + 64} rows: the weights do not fit the config (an embedding "
        "resized without saving config.json?); fix vocab_size or the weights")
    res = CliRunner().invoke(app, ["doctor", "--model", str(tmp_path)])
    assert res.exit_code == 1 and "MISMATCH" in res.output.splitlines()[-1], res.output


def test_fewer_rows_than_the_tokenizer_has_ids_is_a_mismatch_and_exit_1(tmp_path):
    """Config and weights agree, but the tokenizer has 8 ids beyond the embedding: a sampled or
    rendered id past the table would crash the run: MISMATCH, exit 1."""
    from transformers import Qwen2ForCausalLM

    tok = build_family_tokenizer(FAMILIES["qwen2_5"])
    cfg = family_config(FAMILIES["qwen2_5"], tok, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    cfg.vocab_size = len(tok) - 8
    Qwen2ForCausalLM(cfg).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    n = len(tok)
    past = ", ".join(tok.convert_ids_to_tokens([n - 8, n - 7, n - 6]))
    assert inspect_model(tmp_path)["vocabulary"]["verdict"] == (  # train's and load_model's wording
        f"MISMATCH: {tmp_path}: the tokenizer's ids go up to {n - 1} but the model has {n - 8} embedding "
        f"rows: ids {n - 8}-{n - 1} ({past}, ...) have none; use the tokenizer saved with these weights, "
        f"or resize the embedding to {n} rows (model.resize_token_embeddings({n}), then save_pretrained)")
    res = CliRunner().invoke(app, ["doctor", "--model", str(tmp_path)])
    assert res.exit_code == 1, res.output


def test_a_directory_without_config_json_is_missing_and_exit_1(tmp_path):
    """A tokenizer alone (no config.json): the template report prints, the vocabulary line says
    config.json is missing, exit 1 (it said `ok`-like and exit 0 while train refuses it)."""
    tok = build_family_tokenizer(FAMILIES["llama3_1"])
    tok.save_pretrained(tmp_path)
    res = CliRunner().invoke(app, ["doctor", "--model", str(tmp_path)])
    assert res.exit_code == 1, res.output
    assert res.output.splitlines()[-1] == (
        f"vocabulary: tokenizer {len(tok)}: MISSING: {tmp_path} has no config.json (agentrl "
        "train/serve/eval cannot load a model from it; only the tokenizer was checked)")


def test_a_directory_without_tokenizer_or_template_is_a_one_line_error(tmp_path, dirs):
    empty = tmp_path / "empty"
    empty.mkdir()
    res = CliRunner().invoke(app, ["doctor", "--model", str(empty)])
    assert res.exit_code == 2
    assert res.output.strip() == (f"--model {empty}: no tokenizer (no tokenizer.json, tokenizer_config.json, "
                                  "tokenizer.model or vocab.json)")
    res = CliRunner().invoke(app, ["doctor", "--model", str(tmp_path / "missing")])
    assert res.exit_code == 2 and res.output.strip() == f"--model {tmp_path / 'missing'}: not a directory"
    tok = build_family_tokenizer(FAMILIES["phi3"])
    tok.chat_template = None
    tok.save_pretrained(tmp_path / "plain")
    res = CliRunner().invoke(app, ["doctor", "--model", str(tmp_path / "plain")])
    assert res.exit_code == 2 and "the tokenizer has no chat template" in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_the_start_up_table_is_the_benchmark_s_output():
    """docs/models.md's start-up table is `benchmarks/model_families.py`'s table of the committed
    benchmarks/results/model_families.json (every family, its commit named beside it)."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("model_families_bench", root / "benchmarks" / "model_families.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    res = json.loads((root / "benchmarks" / "results" / "model_families.json").read_text())
    assert sorted(res["families"]) == sorted(FAMILIES) and res["command"] == "python benchmarks/model_families.py"
    for r in res["families"].values():
        assert r["startup_s"] == pytest.approx(r["engine_s"] + r["renderer_s"] + r["first_generate_s"], rel=0.5)
        assert r["peak_rss_mib"] >= r["rss_after_imports_mib"] and r["drift"] is False
    doc = (root / "docs" / "models.md").read_text()
    assert bench.table(res) in doc and f"at commit `{res['commit']}`" in doc


def test_a_template_without_an_end_of_turn_token_fails_with_exit_1(tmp_path):
    """A template that closes turns with plain text only: the renderer refuses it (no control
    token after an assistant message); the report says so and exits 1, the rest still shown."""
    tok = build_family_tokenizer(FAMILIES["phi3"])
    tok.chat_template = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    tok.save_pretrained(tmp_path)
    res = CliRunner().invoke(app, ["doctor", "--model", str(tmp_path)])
    assert res.exit_code == 1
    lines = res.output.splitlines()
    assert lines[1] == ("chat template: FAIL: chat template: cannot locate the assistant's end-of-turn token "
                        "(no control token follows an assistant message)")
    assert lines[2].startswith("tool format (rollout.tool_parser=auto): hermes (no tool-call format recognised")
    assert lines[3] == (f"vocabulary: tokenizer {len(tok)}: MISSING: {tmp_path} has no config.json (agentrl "
                        "train/serve/eval cannot load a model from it; only the tokenizer was checked)")


def test_a_corrupt_weights_file_is_a_report_line_not_a_traceback(tmp_path, dirs):
    """A truncated model.safetensors (an interrupted copy): the report still prints, its
    vocabulary line says which file cannot be read, and the exit code is 1 (the run could not
    load the weights)."""
    import shutil

    d = tmp_path / "qwen3"
    shutil.copytree(dirs["qwen3"], d)
    w = d / "model.safetensors"
    w.write_bytes(w.read_bytes()[:50])
    res = CliRunner().invoke(app, ["doctor", "--model", str(d)])
    assert res.exit_code == 1, res.output
    last = res.output.strip().splitlines()[-1]
    assert last.startswith(f"vocabulary: tokenizer 640, config 640: UNREADABLE: {w} is not a "
                           "readable safetensors file ("), last
    assert res.output.splitlines()[1].startswith("end of turn: <|im_end|>")
