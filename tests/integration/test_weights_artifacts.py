"""Weights that reach a serving host through the registry (issue 49, item 1).

`unmask weights push` uploads a version's folder as artifacts of its evidence run; a host that lacks the folder
fetches them into `<state>/weights/<sha256>`, verified against the sha256 recorded at registration before anything
is served. A real MLflow SQLite store, and the bundled tiny-llada copied into a folder of its own, registered under
that folder's name (what `unmask eval ./tiny-llada-tuned` leaves): no bundled or catalog id names it, so once the
folder is gone only the pushed weights can serve it.
"""

from __future__ import annotations

import hashlib
import shutil
import socket
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from models.digest import weights_sha256
from models.loading import resolve_model_path
from models.state import state_dir
from registry import Registry, audit, register_evidence
from registry.identity import current_actor
from registry.serving import ServedVersion, served_version
from registry.weights import ARTIFACT_TAG, WeightsArtifact, WeightsDiffer, WeightsUnavailable, push_weights
from registry.weights import served_weights as resolve
from serving.pool import ServeError, WeightsMismatch, load_checked
from tests.support.gate_fixtures import evidence, fresh_registry, record

NAME = "tiny-llada-tuned"


@pytest.fixture
def registered(tmp_path, monkeypatch) -> tuple[Registry, str, Path]:
    """NAME registered from its folder `work/NAME`, run from `work/` (where its source, the folder's name, resolves)."""
    work = tmp_path / "work"
    folder = Path(shutil.copytree(resolve_model_path("tiny-llada"), work / NAME))
    monkeypatch.chdir(work)
    reg = fresh_registry(tmp_path / "store")
    sha = weights_sha256(folder)
    rec = replace(record("tiny-llada", "arith", weights_sha256=sha), candidate=NAME)
    version, _ = register_evidence(
        reg, replace(evidence("tiny-llada", [rec], weights_sha256=sha, serving=[]), candidate=NAME)
    )
    assert reg.version_tags(NAME, version)["unmask.model"] == NAME
    return reg, version, folder


def cli(reg: Registry, *args: str):
    from flows.cli import _register_all, app

    _register_all()
    return CliRunner().invoke(app, list(args), env={"MLFLOW_TRACKING_URI": reg.tracking_uri, "COLUMNS": "200"})


def cache() -> Path:
    return state_dir() / "weights"


def test_a_host_without_the_folder_serves_the_pushed_weights_fetched_and_verified(registered, tmp_path):
    reg, version, folder = registered
    sha = weights_sha256(folder)
    pushed = cli(reg, "weights", "push", NAME, version)  # no --from: the folder its source resolves to here
    assert pushed.exit_code == 0, pushed.output
    assert f"pushed 5 files of {NAME} version {version}" in pushed.output and sha in pushed.output
    artifact = WeightsArtifact.from_tag(reg.version_tags(NAME, version)[ARTIFACT_TAG])
    assert sorted(artifact.files) == sorted(p.name for p in folder.iterdir())  # weights, config, tokenizer, card
    assert artifact.run_id == reg.version_tags(NAME, version)["unmask.evidence_run"]
    # the push is in the audit chain: who, from which machine's folder, where to, each file's sha256
    [entry] = audit.events(reg, model=NAME, event="weights_pushed")
    pusher = current_actor(reg.tracking_uri).name
    assert (entry.version, entry.who, entry.evidence["actor"]["by"]) == (version, pusher, pusher)
    assert entry.evidence["weights_sha256"] == sha and entry.evidence["files"] == artifact.files
    assert f"{socket.gethostname()}:{folder}" in entry.comment and artifact.run_id in entry.comment
    assert audit.verify(reg).ok

    folder.rename(tmp_path / "elsewhere")  # the registering machine's folder: not on this host
    served = served_version(reg, NAME)
    assert served.weights_artifact and not cache().exists()
    handle = load_checked(served, {}, "cpu", "float32", reg)
    assert handle.path == cache() / sha and handle.weights_sha256 == sha == served.weights_sha256
    assert sorted(p.name for p in cache().iterdir()) == [sha]  # no partial download left beside it

    # a second serve reuses the cached copy, checked again: one whose weights changed is fetched anew
    assert resolve(reg, served) == str(cache() / sha)
    stored = cache() / sha / "model.safetensors"
    stored.write_bytes(b"\0" + stored.read_bytes()[1:])
    assert resolve(reg, served) == str(cache() / sha) and weights_sha256(cache() / sha) == sha
    # --weights still wins over the registry's copy
    bundled = str(resolve_model_path("tiny-llada"))
    assert load_checked(served, {NAME: bundled}, "cpu", "float32", reg).path == Path(bundled)


def test_fetched_weights_are_read_once_on_their_way_from_the_download_to_the_loader(registered, tmp_path, monkeypatch):
    """The download is checked in its temporary folder, which is then renamed into the cache: the loader's own check
    of the cached folder reads no file again (a settled file's digest is kept by the file, not by its path)."""
    from models import digest
    from models.pull import sha256_of

    reg, version, folder = registered
    sha = weights_sha256(folder)
    pushed = push_weights(reg, NAME, version, folder)
    folder.rename(tmp_path / "elsewhere")
    real_time = digest.time.time  # 60 s on: the download counts as settled
    monkeypatch.setattr(digest, "time", SimpleNamespace(time=lambda: real_time() + 60))
    reads: list[Path] = []
    monkeypatch.setattr(digest, "sha256_of", lambda path: reads.append(path) or sha256_of(path))

    handle = load_checked(served_version(reg, NAME), {}, "cpu", "float32", reg)
    assert handle.path == cache() / sha and handle.weights_sha256 == sha
    assert sorted(p.name for p in reads) == sorted(pushed.artifact.files)  # each pushed file once, in the download
    assert all(".partial-" in str(p) for p in reads)


def test_pushed_weights_changed_in_the_artifact_store_are_refused_and_never_cached(registered, tmp_path):
    reg, version, folder = registered
    sha = weights_sha256(folder)
    pushed = push_weights(reg, NAME, version, folder)
    folder.rename(tmp_path / "elsewhere")
    run = reg.get_run(pushed.artifact.run_id)
    stored = Path(run.info.artifact_uri.removeprefix("file://")) / "weights" / "model.safetensors"
    original = stored.read_bytes()
    data = bytearray(original)
    data[len(data) // 2] ^= 0xFF
    stored.write_bytes(bytes(data))
    tampered = hashlib.sha256(data).hexdigest()

    served = served_version(reg, NAME)
    with pytest.raises(WeightsMismatch) as refused:
        load_checked(served, {}, "cpu", "float32", reg)
    message = str(refused.value)
    assert sha in message and tampered in message and pushed.artifact.run_id in message, message
    assert not (cache() / sha).exists() and list(cache().iterdir()) == []  # the download was dropped

    # a file beside the weights changed after the push is refused too, by the sha256 the tag recorded for it
    stored.write_bytes(original)
    config = stored.parent / "config.json"
    config.write_text(config.read_text() + " ")
    with pytest.raises(WeightsDiffer, match="config.json"):
        resolve(reg, served)
    assert list(cache().iterdir()) == []


def test_a_push_of_weights_other_than_the_registered_ones_is_refused(registered):
    reg, version, _ = registered
    other = resolve_model_path("tiny-ar")
    refused = cli(reg, "weights", "push", NAME, version, "--from", str(other))
    assert refused.exit_code == 2, refused.output
    text = " ".join(refused.output.split())
    assert weights_sha256(other) in text and reg.version_tags(NAME, version)["unmask.weights_sha256"] in text, text
    assert ARTIFACT_TAG not in reg.version_tags(NAME, version)
    assert audit.events(reg, model=NAME, event="weights_pushed") == []  # a refused push records no push


def test_with_no_folder_and_nothing_pushed_the_refusal_says_how_to_serve_it(registered, tmp_path):
    reg, version, folder = registered
    folder.rename(tmp_path / "elsewhere")
    served = served_version(reg, NAME)
    with pytest.raises(ServeError) as refused:
        load_checked(served, {}, "cpu", "float32", reg)
    message = str(refused.value)
    assert f"unmask weights push {NAME} {version} --from FOLDER" in message and f"--weights {NAME}=FOLDER" in message
    assert repr(NAME) in message and ARTIFACT_TAG in message, message
    unpushable = cli(reg, "weights", "push", NAME, version)  # nor can it be pushed from here without --from
    assert unpushable.exit_code == 2 and "--from FOLDER" in unpushable.output, unpushable.output
    # a catalog entry at a pinned hub revision that was never pulled here: pull it, or push its weights
    hub = ServedVersion("production", "llada-8b-base", "1", "0" * 64, "llada-8b-base", "masked-diffusion", "production")
    with pytest.raises(WeightsUnavailable, match="unmask pull llada-8b-base"):
        resolve(None, hub)


def test_render_warns_of_an_arm_whose_weights_no_pod_can_fetch_until_they_are_pushed(registered, monkeypatch):
    from registry.promotion import _move

    reg, version, folder = registered
    _move(reg, "production", None, (NAME, version), "weights-test", "weights tests", {"kind": "promotion"})
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    render = ["deploy", "render", "--target", "k8s", "--tracking-uri", "http://mlflow.team:5000"]
    before = cli(reg, *render)
    assert before.exit_code == 0, before.output
    assert f"unmask weights push {NAME} {version} --from FOLDER" in " ".join(before.stderr.split())
    push_weights(reg, NAME, version, folder)
    after = cli(reg, *render)
    assert after.exit_code == 0 and after.stderr == "", after.stderr
    assert after.stdout == before.stdout  # the manifests themselves do not change
