"""A version's weights in the registry's artifact store: pushed once from a folder, fetched by a serving host that
lacks the folder, and trusted only when they hash to the sha256 the registry recorded at registration.

`push_weights` (`unmask weights push MODEL VERSION`) uploads a model folder (the safetensors `models.digest` names,
config, tokenizer and the other small files beside them; never an optimizer or trainer state) as artifacts of the
version's evidence run under `weights/`, once the folder hashes to the version's recorded weights sha256, and records
where they went, with each file's sha256, in the version's `unmask.weights_artifact` tag. The upload and the download
go through MLflow's artifact repository of the run, so a server started with `--serve-artifacts` proxies both: a pod
that reaches only the tracking server fetches them.

`served_weights` is the one place a serving host decides what to load for a version: a `--weights` folder as given;
else the version's source (catalog id, bundled id or folder) when it resolves here to the recorded weights; else the
pushed weights, downloaded into a temporary folder beside `<state>/weights/<sha256>` and renamed into place only
once they hash right (a later serve checks the cached copy again and reuses it).
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from mlflow.exceptions import MlflowException

from models.catalog import CatalogError, load_catalog
from models.checkpoint import CheckpointError
from models.digest import file_sha256, weight_files, weights_sha256
from models.loading import WEIGHTS_DIR, catalog_entry, resolve_model_path
from models.state import TOKEN, state_dir
from registry import audit
from registry.audit import AuditEvent
from registry.connection import RegistryError
from registry.identity import current_actor
from registry.store import Registry, model_tag, now_iso
from registry.tracking import evidence_run_id

if TYPE_CHECKING:
    from registry.serving import ServedVersion

log = logging.getLogger("unmask.weights")

ARTIFACT_PATH = "weights"  # the folder of the evidence run's artifacts the files go to
ARTIFACT_TAG = model_tag("weights_artifact")
SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_METADATA_BYTES = 64 * 2**20  # a tokenizer is a few MB; a larger file beside the weights is not metadata
OTHER_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".onnx")  # none of them in the digest
TRAINING_STATE = ("optimizer", "trainer_state")  # what a resumable checkpoint keeps beside the model


class WeightsUnavailable(RegistryError):
    """No weights of a version can be had here: no folder, and no pushed weights (or none that can be read)."""


class WeightsDiffer(RegistryError):
    """A folder or pushed artifact whose weights do not hash to the version's recorded sha256."""


@dataclass(frozen=True)
class WeightsArtifact:
    """Where a version's pushed weights are: the evidence run, its artifact folder, each file's sha256 at the push."""

    run_id: str
    path: str
    files: dict[str, str]  # file name -> sha256

    def __str__(self) -> str:
        return f"run {self.run_id}, artifacts {self.path}/"

    def to_tag(self) -> str:
        return json.dumps({"run_id": self.run_id, "path": self.path, "files": self.files}, sort_keys=True)

    @classmethod
    def from_tag(cls, text: str) -> WeightsArtifact:
        """The artifact a tag records; ValueError when the tag is not such a record (a path for a name is not)."""
        try:
            data = json.loads(text)
            files = {str(name): str(digest) for name, digest in dict(data["files"]).items()}
            artifact = cls(str(data["run_id"]), str(data["path"]), files)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"its {ARTIFACT_TAG} tag is not a weights artifact record ({e})") from None
        names = [artifact.run_id, artifact.path, *artifact.files]
        if not artifact.files or not all(TOKEN.fullmatch(n) for n in names):
            raise ValueError(f"its {ARTIFACT_TAG} tag names no files, or a path where a name belongs: {text[:200]!r}")
        return artifact


@dataclass(frozen=True)
class PushedWeights:
    """What `push_weights` uploaded: from which folder, to where, and the files it left out with why."""

    model: str
    version: str
    folder: Path
    weights_sha256: str
    artifact: WeightsArtifact
    left_out: dict[str, str] = field(default_factory=dict)


def files_to_push(folder: Path) -> tuple[list[Path], dict[str, str]]:
    """The files a push uploads (the weights, then the other small files of the folder) and those it leaves out."""
    weights = weight_files(folder)
    pushed, left_out = list(weights), {}
    for path in sorted(folder.iterdir()):
        if path in weights:
            continue
        why = _left_out(path)
        if why:
            left_out[path.name] = why
        else:
            pushed.append(path)
    return pushed, left_out


def _left_out(path: Path) -> str | None:
    if not path.is_file():
        return "not a file (a push takes the folder's own files)"
    if not TOKEN.fullmatch(path.name):
        return "a hidden file, or a name the registry's record cannot carry"
    if path.name.startswith(TRAINING_STATE):
        return "training state, not the model"
    if path.suffix in OTHER_WEIGHTS:
        return "weights the digest does not cover"
    if path.stat().st_size > MAX_METADATA_BYTES:
        return f"larger than {MAX_METADATA_BYTES // 2**20} MiB, and not one of the weights"
    return None


def push_weights(registry: Registry, model: str, version: str, folder: str | Path | None = None) -> PushedWeights:
    """Upload the weights of `model` version `version` from `folder` (default: where its source resolves here) as
    artifacts of its evidence run, refused unless the folder hashes to the recorded weights sha256; `ARTIFACT_TAG`
    then says where they are."""

    tags = registry.version_tags(model, version)
    recorded = tags.get(model_tag("weights_sha256"), "")
    if not recorded:
        raise RegistryError(
            f"{model} version {version} has no {model_tag('weights_sha256')} tag: there is no digest to check its "
            "weights against, so none are pushed"
        )
    source = tags.get(model_tag("model")) or model
    if folder is None:
        try:
            folder = resolve_model_path(source)
        except CheckpointError as e:
            raise WeightsUnavailable(
                f"{model} version {version}: its source {source!r} is no folder on this machine ({e}); name the "
                f"folder that was evaluated: unmask weights push {model} {version} --from FOLDER"
            ) from None
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise WeightsUnavailable(f"{model} version {version}: {folder} is not a folder")
    files, left_out = files_to_push(folder)
    try:
        digests = {path.name: file_sha256(path) for path in files}
        found = weights_sha256(folder, digests)
    except OSError as e:
        raise WeightsUnavailable(f"{model} version {version}: {folder} cannot be read: {e}") from None
    if found != recorded:
        raise WeightsDiffer(
            f"refusing to push {folder} as the weights of {model} version {version}: they hash to "
            f"{found or 'nothing'} but the registry recorded {recorded} for that version; push the folder that was "
            "evaluated"
        )
    run_id = evidence_run_id(registry, model, version, tags)
    try:
        repo = registry.artifacts(run_id)
        for path in files:
            repo.log_artifact(str(path), ARTIFACT_PATH)  # type: ignore[no-untyped-call]  # unannotated in mlflow
    except (MlflowException, OSError) as e:
        raise RegistryError(f"{model} version {version}: uploading {folder} to run {run_id} failed: {e}") from None
    artifact = WeightsArtifact(run_id, ARTIFACT_PATH, digests)
    registry.set_version_tags(model, version, {ARTIFACT_TAG: artifact.to_tag()})
    pusher, pushed_from = current_actor(registry.tracking_uri), folder.resolve()
    audit.append(  # who put weights where every serving host may fetch them, from which machine's folder
        registry,
        AuditEvent(
            "weights_pushed",
            pusher.name,
            now_iso(),
            "",
            model,
            version,
            comment=f"weights {recorded[:12]} pushed from {pusher.host}:{pushed_from} to {artifact} "
            f"({len(digests)} files{f', {len(left_out)} left out' if left_out else ''})",
            evidence={
                "weights_sha256": recorded,
                "folder": str(pushed_from),
                "run_id": run_id,
                "path": ARTIFACT_PATH,
                "files": dict(digests),
                "left_out": dict(left_out),
                "actor": pusher.to_dict(),
            },
        ),
    )
    return PushedWeights(model, version, folder, recorded, artifact, left_out)


def served_weights(registry: Registry | None, version: ServedVersion, override: str | None = None) -> str:
    """The model reference a serving host loads `version` from (see the module's note). WeightsUnavailable names
    everything tried and how to fix it; WeightsDiffer refuses pushed weights that do not hash right."""
    if override:
        return override  # --weights wins; the loader still checks its digest
    recorded, source, tried = version.weights_sha256, version.source, []
    try:
        local = resolve_model_path(source)
    except CheckpointError as e:
        tried.append(f"its source {source!r}: {e}")
    else:
        if not version.weights_artifact:
            return source  # nothing else to load: the loader refuses it if it hashes otherwise
        try:
            found = weights_sha256(local)
        except OSError as e:
            found = f"nothing readable ({e})"
        if found == recorded:
            return source
        tried.append(f"its source {source!r} is {local}, whose weights hash to {found or 'nothing'}, not {recorded}")
    where = f"{version.ref} ({version.name})"
    if not version.weights_artifact:
        raise WeightsUnavailable(
            f"{where}: no weights to serve here: {'; '.join(tried)}; and none were pushed to the registry (no "
            f"{ARTIFACT_TAG} tag). {_fixes(version)}"
        )
    if registry is None:
        raise WeightsUnavailable(f"{where}: {'; '.join(tried)}; its pushed weights need the registry to fetch them")
    try:
        artifact = WeightsArtifact.from_tag(version.weights_artifact)
    except ValueError as e:
        raise WeightsUnavailable(f"{where}: {'; '.join(tried)}; {e}. {_fixes(version)}") from None
    return str(fetched(registry, artifact, recorded, where))


def _fixes(version: ServedVersion) -> str:
    entry = catalog_entry(version.source)
    pull = f"pull it here (`unmask pull {entry.id}`), " if entry is not None and not entry.is_api else ""
    return (
        f"To serve it, {pull}push its weights from a host that has the folder (`unmask weights push {version.model} "
        f"{version.version} --from FOLDER`), or serve a folder here (`--weights {version.model}=FOLDER`)"
    )


def fetched(registry: Registry, artifact: WeightsArtifact, recorded: str, where: str) -> Path:
    """The pushed weights in the cache folder `<state>/weights/<recorded>`: the cached copy when it still hashes
    right, else downloaded into a temporary folder beside it and renamed into place only once it does."""
    if not SHA256.fullmatch(recorded):
        raise WeightsDiffer(f"{where}: the recorded weights digest {recorded!r} is not a sha256")
    cache = state_dir() / "weights"
    target = cache / recorded
    if target.is_dir():
        problem = differs(target, artifact, recorded)
        if problem is None:
            return target
        log.warning("the cached weights %s: %s; fetching them again", target, problem)
        shutil.rmtree(target, ignore_errors=True)
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".partial-{recorded[:12]}-", dir=cache))
    try:
        got = _download(registry, artifact, staging, where)
        problem = differs(got, artifact, recorded)
        if problem is not None:
            raise WeightsDiffer(f"{where}: refusing the weights pushed to {artifact}: {problem}")
        try:
            got.rename(target)
        except OSError:  # another server of this state folder put them there first
            if not target.is_dir() or differs(target, artifact, recorded) is not None:
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("fetched the weights of %s from %s into %s", where, artifact, target)
    return target


def _download(registry: Registry, artifact: WeightsArtifact, into: Path, where: str) -> Path:
    """The files the artifact lists (only those), downloaded under `into`; returns the folder they are in."""
    try:
        repo = registry.artifacts(artifact.run_id)
        for name in artifact.files:
            repo.download_artifacts(f"{artifact.path}/{name}", str(into))  # type: ignore[no-untyped-call]
    except (MlflowException, OSError, RegistryError) as e:
        raise WeightsUnavailable(f"{where}: its weights pushed to {artifact} cannot be downloaded: {e}") from None
    return into / artifact.path


def differs(folder: Path, artifact: WeightsArtifact, recorded: str) -> str | None:
    """How `folder` is not the pushed weights, or None: its weights digest against the recorded one first, then
    every other pushed file against its sha256 at the push."""
    try:
        # kept for the process (models/digest): the loader's own check of the folder renamed into place reads nothing
        digests = {name: file_sha256(folder / name) for name in artifact.files if (folder / name).is_file()}
        found = weights_sha256(folder, digests)
    except OSError as e:
        return f"it cannot be read: {e}"
    if found != recorded:
        return f"its weights hash to {found or 'nothing'} but the registry recorded {recorded}"
    changed = sorted(name for name, digest in artifact.files.items() if digests.get(name) != digest)
    if changed:
        return f"{', '.join(changed)} missing or not as pushed (the sha256 in {ARTIFACT_TAG} differs)"
    return None


def unreachable_source(model: str, tags: Mapping[str, str]) -> str | None:
    """The source of a version no pod can load, else None. Pushed weights, a catalog id (pulled at its pinned
    revision) and a model bundled in the image reach a pod; a folder of the machine that registered it does not."""
    if tags.get(ARTIFACT_TAG):
        return None
    source = tags.get(model_tag("model")) or model
    try:
        if source in load_catalog():
            return None
    except CatalogError:
        pass
    return None if TOKEN.fullmatch(source) and (WEIGHTS_DIR / source).is_dir() else source
