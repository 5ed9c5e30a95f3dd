"""Pull and verify against a real Hugging Face cache layout (blobs/, snapshots/<commit>/, refs/main).

The cache is written by the test exactly as huggingface_hub lays it out: LFS files (safetensors,
pickles) as blobs named by their sha256, small files as blobs named by their git blob sha1, the
snapshot as relative symlinks. `snapshot_download` runs for real, offline.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import yaml

from models.catalog import load_catalog
from models.checkpoint import save_checkpoint
from models.llada import LLaDAConfig, LLaDAModelLM, init_weights
from models.loading import load
from models.pull import MANIFEST, PullError, entry_path, model_store, pull, pulled_path, read_findings

COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO = "acme/tiny-dllm"
CARD = "---\nlicense: mit\nlanguage: en\n---\n# tiny\n"


@pytest.fixture(scope="module")
def checkpoint_files(tmp_path_factory) -> dict[str, bytes]:
    """A real (tiny, random) LLaDA checkpoint as file name -> bytes."""
    folder = tmp_path_factory.mktemp("ckpt")
    cfg = LLaDAConfig(
        d_model=16, n_heads=2, n_layers=1, vocab_size=40, mask_token_id=39, eos_token_id=38, max_sequence_length=64
    )
    save_checkpoint(init_weights(LLaDAModelLM(cfg), seed=0), folder)
    files = {p.name: p.read_bytes() for p in folder.iterdir()}
    files["README.md"] = CARD.encode()
    return files


def write_hub_cache(cache: Path, repo: str, files: dict[str, bytes], commit: str = COMMIT, ref: str = "main") -> Path:
    """Lay `files` out as huggingface_hub's cache does; return the snapshot folder."""
    repo_dir = cache / f"models--{repo.replace('/', '--')}"
    blobs, snapshot = repo_dir / "blobs", repo_dir / "snapshots" / commit
    blobs.mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        if name.endswith((".safetensors", ".bin", ".pt")):
            blob = hashlib.sha256(data).hexdigest()  # LFS file: blob named by its sha256
        else:
            blob = hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()  # git blob id
        (blobs / blob).write_bytes(data)
        (snapshot / name).symlink_to(Path("..") / ".." / "blobs" / blob)
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / ref).write_text(commit)
    return snapshot


def write_catalog(tmp_path: Path, **changes) -> Path:
    entry = {
        "id": "tiny-dllm",
        "family": "llada",
        "kind": "masked-diffusion",
        "role": "candidate",
        "source": f"hf://{REPO}",
        "revision": "main",
        "license": "MIT",
        "adapter": "llada",
    }
    entry.update(changes)
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump({"entries": [entry]}))
    return path


def store_state(store: Path) -> dict[str, str]:
    """Every path under the store with its content hash: 'left as it was' means this is unchanged."""
    if not store.exists():
        return {}
    return {
        str(p.relative_to(store)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(store.rglob("*"))
    }


@pytest.fixture
def env(tmp_path, monkeypatch):
    cache, store = tmp_path / "hf-cache", tmp_path / "store"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("UNMASK_MODEL_STORE", str(store))
    monkeypatch.delenv("UNMASK_CATALOG", raising=False)
    return cache, store


def run_pull(tmp_path, cache, **changes):
    return pull("tiny-dllm", catalog=load_catalog(write_catalog(tmp_path, **changes)), cache_dir=cache)


def test_pull_from_offline_cache_installs_verified_files_that_load(tmp_path, env, monkeypatch, checkpoint_files):
    cache, store = env
    write_hub_cache(cache, REPO, checkpoint_files | {"pytorch_model.bin": b"pickle", "train.py": b"print()"})
    pins = {"model.safetensors": hashlib.sha256(checkpoint_files["model.safetensors"]).hexdigest()}
    result = run_pull(tmp_path, cache, sha256=pins)
    assert result.path == store / "tiny-dllm" and result.commit == COMMIT
    names = sorted(p.name for p in result.path.iterdir())
    assert names == sorted(["config.json", "model.safetensors", "README.md", MANIFEST, "findings.json"])
    manifest = json.loads((result.path / MANIFEST).read_text())
    assert manifest["commit"] == COMMIT and manifest["files"]["model.safetensors"] == pins["model.safetensors"]
    assert read_findings(result.path) == []
    # the catalog id now resolves to the pulled copy
    monkeypatch.setenv("UNMASK_CATALOG", str(tmp_path / "catalog.yaml"))
    loaded = load("tiny-dllm")
    assert loaded.path == result.path and loaded.mask_id == 39


def test_card_license_disagreement_is_recorded_not_applied(tmp_path, env, checkpoint_files):
    cache, store = env
    write_hub_cache(cache, REPO, checkpoint_files | {"README.md": b"---\nlicense: cc-by-nc-4.0\n---\n"})
    result = run_pull(tmp_path, cache)
    (finding,) = read_findings(result.path)
    assert finding["check"] == "license" and finding["severity"] == "error"
    assert (finding["catalog"], finding["card"]) == ("MIT", "cc-by-nc-4.0")
    assert load_catalog(tmp_path / "catalog.yaml").get("tiny-dllm").license == "MIT"


def test_repull_replaces_the_previous_copy(tmp_path, env, checkpoint_files):
    cache, store = env
    write_hub_cache(cache, REPO, checkpoint_files)
    first = run_pull(tmp_path, cache)
    (first.path / "stale.txt").write_text("x")
    second = run_pull(tmp_path, cache)
    assert not (second.path / "stale.txt").exists()
    assert [p.name for p in store.iterdir()] == ["tiny-dllm"]


def corrupt(data: bytes) -> bytes:
    """Same length, last bytes flipped: the safetensors structure stays valid, the content does not."""
    return data[:-4] + bytes(b ^ 0xFF for b in data[-4:])


@pytest.mark.parametrize(
    "case, words",
    [
        ("corrupt-blob", "corrupt in the Hugging Face cache"),
        ("pin-mismatch", "sha256 mismatch: catalog pins"),
        ("truncated", "truncated"),
        ("pickle-only", "only pickle weights (pytorch_model.bin)"),
        ("missing-revision", "revision 'v2' is not in the Hugging Face cache"),
        ("no-config", "config.json is missing"),
    ],
)
def test_bad_checkpoint_is_refused_and_store_left_as_it_was(tmp_path, env, checkpoint_files, case, words):
    cache, store = env
    # an earlier good pull of another model must survive untouched
    (store / "other").mkdir(parents=True)
    (store / "other" / MANIFEST).write_text("{}")
    files, changes = dict(checkpoint_files), {}
    if case == "corrupt-blob":
        snapshot = write_hub_cache(cache, REPO, files)
        Path(os.path.realpath(snapshot / "model.safetensors")).write_bytes(corrupt(files["model.safetensors"]))
    else:
        if case == "pin-mismatch":
            changes["sha256"] = {"model.safetensors": "0" * 64}
        elif case == "truncated":
            files["model.safetensors"] = files["model.safetensors"][:-100]
        elif case == "pickle-only":
            del files["model.safetensors"]
            files["pytorch_model.bin"] = b"\x80\x04K\x01."
        elif case == "missing-revision":
            changes["revision"] = "v2"
        elif case == "no-config":
            del files["config.json"]
        write_hub_cache(cache, REPO, files)
    before = store_state(store)
    with pytest.raises(PullError) as info:
        run_pull(tmp_path, cache, **changes)
    assert words in str(info.value)
    assert "tiny-dllm" in str(info.value)
    assert store_state(store) == before


def test_no_network_and_no_cache_fails_at_once_saying_how_to_provide_files(tmp_path, env):
    cache, store = env
    catalog = load_catalog(write_catalog(tmp_path))
    with pytest.raises(PullError) as offline:
        pull("tiny-dllm", catalog=catalog, cache_dir=cache)
    assert "HF_HUB_OFFLINE is set" in str(offline.value) and f"hf download {REPO}" in str(offline.value)
    # a real network fault: nothing listens on the discard port, so the connection is refused at once
    with pytest.raises(PullError) as unreachable:
        pull("tiny-dllm", catalog=catalog, cache_dir=cache, offline=False, endpoint="http://127.0.0.1:9")
    message = str(unreachable.value)
    assert "the Hub cannot be reached" in message and "HF_HUB_CACHE" in message and "local folder" in message
    assert store_state(store) == {}


def test_local_folder_source_is_copied_and_verified(tmp_path, env, checkpoint_files):
    _, store = env
    folder = tmp_path / "mine"
    folder.mkdir()
    for name, data in checkpoint_files.items():
        (folder / name).write_bytes(data)
    (folder / "optimizer.pt").write_bytes(b"junk")
    result = run_pull(tmp_path, None, source=str(folder), revision=None)
    assert (result.path / "model.safetensors").read_bytes() == checkpoint_files["model.safetensors"]
    assert not (result.path / "optimizer.pt").exists()
    (folder / "model.safetensors").write_bytes(checkpoint_files["model.safetensors"][:-10])
    with pytest.raises(PullError, match="truncated"):
        run_pull(tmp_path, None, source=str(folder), revision=None)
    with pytest.raises(PullError, match="does not exist"):
        run_pull(tmp_path, None, source=str(tmp_path / "nowhere"), revision=None)


def test_unpulled_and_api_entries_explain_themselves(tmp_path, env):
    _, store = env
    entry = load_catalog(write_catalog(tmp_path)).get("tiny-dllm")
    with pytest.raises(PullError, match=r"not pulled yet: run `unmask pull tiny-dllm`"):
        entry_path(entry)
    (store / ".partial-tiny-dllm-x").mkdir(parents=True)  # what a killed pull leaves behind
    with pytest.raises(PullError, match="not pulled yet"):
        entry_path(entry)
    mercury = load_catalog().get("mercury")
    with pytest.raises(PullError, match="API model"):
        pull(mercury)


def test_model_store_follows_unmask_home(tmp_path, monkeypatch):
    monkeypatch.delenv("UNMASK_MODEL_STORE", raising=False)
    monkeypatch.setenv("UNMASK_HOME", str(tmp_path))
    assert model_store() == tmp_path / "models"


def test_the_model_store_and_the_registry_share_one_state_folder_and_a_lookup_creates_none(tmp_path, monkeypatch):
    from registry.connection import default_tracking_uri

    home = tmp_path / "not-yet"
    monkeypatch.delenv("UNMASK_MODEL_STORE", raising=False)
    monkeypatch.setenv("UNMASK_HOME", str(home))
    assert pulled_path("tiny-llada") is None and not home.exists()  # asking whether a model is pulled writes nothing
    assert default_tracking_uri() == f"sqlite:///{home.resolve()}/mlflow/mlflow.db"
    assert model_store().parent == home.resolve()


def test_cli_pull_and_models(tmp_path, env, monkeypatch, checkpoint_files):
    import typer
    from typer.testing import CliRunner

    from flows.commands import models as models_cmd
    from flows.commands import pull as pull_cmd

    cache, store = env
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("UNMASK_CATALOG", str(write_catalog(tmp_path)))
    app = typer.Typer()
    pull_cmd.register(app)
    models_cmd.register(app)
    runner = CliRunner()
    failed = runner.invoke(app, ["pull", "tiny-dllm"])
    assert failed.exit_code == 2 and "HF_HUB_OFFLINE is set" in failed.output
    listed = runner.invoke(app, ["models"], env={"COLUMNS": "200"})
    assert listed.exit_code == 0 and "tiny-dllm" in listed.output and "no" in listed.output
    write_hub_cache(cache, REPO, checkpoint_files)
    pulled = runner.invoke(app, ["pull", "tiny-dllm"])
    assert pulled.exit_code == 0 and "3 files verified" in pulled.output and COMMIT in pulled.output
    listed = runner.invoke(app, ["models", "--explain"], env={"COLUMNS": "200"})
    assert "pulled" in listed.output and "ready" in listed.output
