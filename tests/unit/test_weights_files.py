"""What `unmask weights push` takes from a folder, and the digest it checks, for a sharded checkpoint saved beside
its training state (registry/weights.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from models import digest
from models.digest import weights_sha256
from models.pull import sha256_of
from registry.weights import WeightsArtifact, files_to_push

SHARDS = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]


def test_a_push_takes_the_shards_and_small_files_and_never_the_training_state(tmp_path):
    index = {"metadata": {}, "weight_map": {"a": SHARDS[0], "b": SHARDS[1], "c": SHARDS[0]}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    for i, name in enumerate(SHARDS):
        (tmp_path / name).write_bytes(bytes([i]) * 1000)
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "optimizer.safetensors").write_bytes(b"moments")
    (tmp_path / "trainer_state.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"pickle")
    (tmp_path / ".DS_Store").write_bytes(b"")
    (tmp_path / "last").mkdir()

    pushed, left_out = files_to_push(tmp_path)
    assert [p.name for p in pushed] == [*SHARDS, "config.json", "model.safetensors.index.json", "tokenizer.json"]
    assert sorted(left_out) == [".DS_Store", "last", "optimizer.safetensors", "pytorch_model.bin", "trainer_state.json"]
    # the digest from the hashes a push already has is the digest of the folder
    known = {p.name: sha256_of(p) for p in pushed}
    assert weights_sha256(tmp_path, known) == weights_sha256(tmp_path) != known[SHARDS[0]]


BAD_RECORDS = [
    json.dumps({"run_id": "0" * 32, "path": "weights", "files": {"../../etc/passwd": "1" * 64}}),
    json.dumps({"run_id": "0" * 32, "path": "weights", "files": {"sub/config.json": "1" * 64}}),
    json.dumps({"run_id": "0" * 32, "path": "../weights", "files": {"config.json": "1" * 64}}),
    json.dumps({"run_id": "0" * 32, "path": "weights", "files": {}}),
    "[]",
    "",
]


def test_a_weights_record_round_trips_through_its_tag():
    artifact = WeightsArtifact("0" * 32, "weights", {"config.json": "1" * 64})
    assert WeightsArtifact.from_tag(artifact.to_tag()) == artifact


@pytest.mark.parametrize("text", BAD_RECORDS)
def test_a_weights_record_naming_a_path_or_nothing_is_not_followed(text):
    with pytest.raises(ValueError, match="unmask.weights_artifact"):
        WeightsArtifact.from_tag(text)


def test_a_folder_s_weights_are_read_once_per_process_while_they_stay_as_they_were(tmp_path, monkeypatch):
    """A serving host hashes a folder before loading it and the loaded handle hashes it again: a settled file (its
    stamps more than SETTLED_S old) is read once; a file written just now, and a rewrite (another size), are read
    every time. The clock is the files' own stamps plus an offset, so a slow machine cannot settle them early."""
    for i, name in enumerate(SHARDS):
        (tmp_path / name).write_bytes(bytes([i]) * 1000)
    reads = []
    monkeypatch.setattr(digest, "sha256_of", lambda path: reads.append(path.name) or sha256_of(path))

    def clock_after_stamps(seconds: float) -> None:
        newest = max(max(p.stat().st_mtime, p.stat().st_ctime) for p in tmp_path.iterdir())
        monkeypatch.setattr(digest, "time", SimpleNamespace(time=lambda: newest + seconds))

    clock_after_stamps(digest.SETTLED_S / 2)
    fresh = weights_sha256(tmp_path)
    assert weights_sha256(tmp_path) == fresh and reads == SHARDS * 2  # just written: read each time

    clock_after_stamps(digest.SETTLED_S * 5)
    reads.clear()
    assert weights_sha256(tmp_path) == weights_sha256(tmp_path) == fresh
    assert reads == SHARDS  # settled: the second look reads nothing

    (tmp_path / SHARDS[1]).write_bytes(b"rewritten")
    clock_after_stamps(digest.SETTLED_S * 5)
    reads.clear()
    changed = weights_sha256(tmp_path)
    assert changed != fresh and reads == [SHARDS[1]]
    assert changed == weights_sha256(tmp_path, {n: sha256_of(tmp_path / n) for n in SHARDS})
