"""The shared on-disk JSON cache (`agentrl.infra.jsoncache`) of the code env's reference check
and trivial-solution probes: a record round-trips, a corrupt or foreign file is a miss (never an
error), a write leaves no temporary file and an unwritable cache is not an error."""

from __future__ import annotations

import json

import agentrl_envs.reference_check as reference_check
import agentrl_envs.trivial_probe as trivial_probe
from agentrl.infra.jsoncache import cache_dir, load_record, store_record


def test_a_record_round_trips_and_is_replaced_whole(tmp_path):
    path = tmp_path / "a" / "b" / "k.json"  # the folders are made
    rec = {"task_id": "Mbpp/164", "passed": ["return True", 'return ""'], "n": 3, "x": None}
    store_record(path, rec)
    assert load_record(path) == rec
    assert json.loads(path.read_text()) == rec  # plain JSON on disk
    store_record(path, {"task_id": "t", "verdict": "fail"})
    assert load_record(path) == {"task_id": "t", "verdict": "fail"}
    assert [p.name for p in path.parent.iterdir()] == ["k.json"]  # no temporary file left


def test_a_missing_corrupt_or_foreign_file_is_a_miss(tmp_path):
    assert load_record(tmp_path / "none.json") is None
    for i, raw in enumerate([b'{"task_id": "t", "verd', b"", b"[1, 2]", b'"pass"', b"null",
                             b"\xff\xfe{}", b"{'single': 'quotes'}"]):
        p = tmp_path / f"{i}.json"
        p.write_bytes(raw)
        assert load_record(p) is None, raw
    assert load_record(tmp_path) is None  # a folder where the file should be


def test_an_unwritable_cache_is_not_an_error(tmp_path):
    (tmp_path / "file").write_text("x")
    path = tmp_path / "file" / "k.json"  # its folder cannot be made: a file is in the way
    store_record(path, {"verdict": "pass"})
    assert load_record(path) is None
    assert (tmp_path / "file").read_text() == "x"


def test_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTRL_CACHE_DIR", str(tmp_path))
    assert cache_dir("reference_check") == tmp_path / "reference_check"
    assert reference_check.cache_dir() == tmp_path / "reference_check"
    assert trivial_probe.cache_dir() == tmp_path / "trivial_probe"
    monkeypatch.delenv("AGENTRL_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir("trivial_probe") == tmp_path / "home" / ".cache" / "agentrl" / "trivial_probe"


def test_the_envs_read_their_own_field_and_miss_on_a_bad_one(tmp_path):
    """A record of the other cache, a wrong type, or a corrupt file is a miss for each reader."""
    p = tmp_path / "k.json"
    store_record(p, {"task_id": "t", "verdict": "runtime_error"})
    assert reference_check._load(p) == "runtime_error" and trivial_probe._load(p) is None
    store_record(p, {"task_id": "t", "passed": ["return 0", 1]})
    assert trivial_probe._load(p) == ["return 0", "1"] and reference_check._load(p) is None
    store_record(p, {"task_id": "t", "passed": []})
    assert trivial_probe._load(p) == []  # probed, none passes: a hit
    store_record(p, {"verdict": 3, "passed": "return 0"})
    assert reference_check._load(p) is None and trivial_probe._load(p) is None
    p.write_text('{"verdict": "pass"')
    assert reference_check._load(p) is None and trivial_probe._load(p) is None
