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


def test_a_failed_write_leaves_no_temporary_file_and_the_old_record(tmp_path):
    """A value JSON cannot encode raises (the caller's bug) and a folder where the file should be
    is not an error; neither leaves a `.tmp-*` file nor touches the record already there."""
    p = tmp_path / "k.json"
    store_record(p, {"verdict": "pass"})
    try:
        store_record(p, {"verdict": object()})
    except TypeError:
        pass
    else:
        raise AssertionError("a value JSON cannot encode must raise TypeError")
    assert load_record(p) == {"verdict": "pass"}
    (tmp_path / "d.json").mkdir()  # os.replace of a file onto a folder fails
    store_record(tmp_path / "d.json", {"verdict": "fail"})
    assert sorted(x.name for x in tmp_path.iterdir()) == ["d.json", "k.json"]


def test_writers_racing_on_one_key_never_show_a_reader_half_a_record(tmp_path):
    """4 threads replace one key 50 times each with records of different sizes (1 B to 120 KB of
    text) while a reader reads it: every read is one of the written records, whole (never a
    miss after the first write, never a mix), and no temporary file is left (a plain
    `write_text` instead fails this test)."""
    import threading

    p = tmp_path / "k.json"
    records = [{"w": w, "blob": "x" * (w * 40_000 + 1)} for w in range(4)]
    store_record(p, records[0])
    stop, seen, bad = threading.Event(), [], []

    def read():
        while not stop.is_set():
            r = load_record(p)
            (seen if r in records else bad).append(r if r is None else r["w"])

    def write(w):
        for _ in range(50):
            store_record(p, records[w])

    reader = threading.Thread(target=read)
    reader.start()
    writers = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    reader.join()
    assert not bad and seen
    assert load_record(p) in records
    assert [x.name for x in tmp_path.iterdir()] == ["k.json"]
