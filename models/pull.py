"""Pull and verify a catalog entry into the local model store, atomically.

A pull copies only what unmask loads (config, safetensors, tokenizer, model card, license) from
the Hugging Face cache (via `snapshot_download` at the entry's revision) or from a local folder
into `<state>/models/<id>/`. Before anything lands in the store every file is checked: a
safetensors file must be complete, a file the catalog pins must match its sha256, a file taken from
the Hugging Face cache must match the hash its blob is named by, and a repository that ships only
pickle weights is refused. The folder is assembled in a temporary directory and renamed into place,
so an interrupted or refused pull leaves the store exactly as it was.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shutil
import struct
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.catalog import Catalog, CatalogEntry, load_catalog
from models.checkpoint import PICKLE_SUFFIXES, CheckpointError, read_card
from models.state import state_dir

# What a pull keeps: what unmask loads, plus the card and license text the license gate reads.
ALLOW_PATTERNS = (
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "processor_config.json",
    "preprocessor_config.json",
    "README.md",
    "MODEL_CARD.md",
    "LICENSE*",
    "USE_POLICY.md",
)
MANIFEST = "unmask-pull.json"
FINDINGS = "findings.json"
CHUNK = 1 << 20


class PullError(RuntimeError):
    """A pull that was refused or could not run; the store is unchanged."""


@dataclass
class PullResult:
    entry_id: str
    path: Path
    files: dict[str, str]  # name -> sha256
    commit: str | None
    findings: list[dict[str, Any]] = field(default_factory=list)


def model_store(store: str | Path | None = None) -> Path:
    """The model store: `store`, else $UNMASK_MODEL_STORE, else <state folder>/models."""
    if store is not None:
        return Path(store).expanduser()
    if os.environ.get("UNMASK_MODEL_STORE"):
        return Path(os.environ["UNMASK_MODEL_STORE"]).expanduser()
    return state_dir(create=False) / "models"


def pulled_path(entry_id: str, store: str | Path | None = None) -> Path | None:
    """The store folder of a completed pull (its manifest is written last), else None."""
    folder = model_store(store) / entry_id
    return folder if (folder / MANIFEST).is_file() else None


def entry_path(entry: CatalogEntry, store: str | Path | None = None) -> Path:
    """Where an entry's files are now: its pulled copy, else its local source folder."""
    pulled = pulled_path(entry.id, store)
    if pulled is not None:
        return pulled
    if entry.source.scheme == "local" and Path(entry.source.location).is_dir():
        return Path(entry.source.location)
    if entry.is_api:
        raise PullError(f"model '{entry.id}' is served by an API ({entry.source}); there are no files to load")
    raise PullError(f"model '{entry.id}' is not pulled yet: run `unmask pull {entry.id}`")


def pull(
    entry_or_id: CatalogEntry | str,
    *,
    catalog: Catalog | None = None,
    store: str | Path | None = None,
    cache_dir: str | Path | None = None,
    endpoint: str | None = None,
    offline: bool | None = None,
    fit: dict[str, Any] | None = None,
) -> PullResult:
    """Fetch, verify and install one catalog entry into the model store; return where it landed.

    offline: None reads $HF_HUB_OFFLINE at call time; True uses the Hugging Face cache only.
    endpoint: a Hub mirror URL (default: huggingface_hub's, i.e. $HF_ENDPOINT).
    fit: the memory fit judged before the pull (sampler/fit.py, and whether it was overridden), kept in the manifest.
    """
    entry = entry_or_id if isinstance(entry_or_id, CatalogEntry) else (catalog or load_catalog()).get(entry_or_id)
    if entry.is_api:
        raise PullError(
            f"model '{entry.id}' is an API model ({entry.source}); nothing to pull. {entry.api_status()[1]}"
        )
    if entry.source.scheme == "hf":
        source_dir, commit, remote_files = from_hub(entry, cache_dir=cache_dir, endpoint=endpoint, offline=offline)
    else:
        source_dir, commit, remote_files = from_folder(entry), None, None
    root = model_store(store)
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".partial-{entry.id}-", dir=root))
    try:
        files = stage_files(entry, source_dir, staging, remote_files)
        findings = license_findings(entry, staging)
        (staging / FINDINGS).write_text(json.dumps(findings, indent=2) + "\n")
        manifest = {
            "id": entry.id,
            "source": str(entry.source),
            "revision": entry.revision,
            "commit": commit,
            "pinned": entry.pinned,
            "files": files,
            "findings": len(findings),
            "memory_fit": fit,
            "pulled_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")  # written last: marks completeness
        install(staging, root / entry.id)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return PullResult(entry.id, root / entry.id, files, commit, findings)


def from_hub(
    entry: CatalogEntry, *, cache_dir: str | Path | None, endpoint: str | None, offline: bool | None
) -> tuple[Path, str | None, list[str] | None]:
    """snapshot_download at the pinned revision; map every failure to a message that says what to do."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        IncompleteSnapshotError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo, revision = entry.source.location, entry.revision or "main"
    if offline is None:
        offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    cache_dir = cache_dir or os.environ.get("HF_HUB_CACHE") or None
    where = f"hf://{repo}@{revision}"
    try:
        folder = snapshot_download(
            repo,
            revision=revision,
            allow_patterns=list(ALLOW_PATTERNS),
            cache_dir=cache_dir,
            local_files_only=offline,
            endpoint=endpoint,
        )
    except GatedRepoError as e:
        raise PullError(f"{where}: gated repository; accept its license on the Hub and set HF_TOKEN ({e})") from None
    except RevisionNotFoundError:
        raise PullError(
            f"{where}: revision '{revision}' does not exist in {repo}; fix 'revision' in the catalog"
        ) from None
    except RepositoryNotFoundError:
        raise PullError(f"{where}: repository {repo} not found (or private); check 'source' in the catalog") from None
    except IncompleteSnapshotError as e:
        raise PullError(f"{where}: the cached copy is incomplete and the Hub cannot complete it ({e})") from None
    except LocalEntryNotFoundError:
        from huggingface_hub import constants

        cache = Path(cache_dir or constants.HF_HUB_CACHE)
        reason = "HF_HUB_OFFLINE is set" if offline else "the Hub cannot be reached"
        cached = cache / f"models--{repo.replace('/', '--')}"
        missing = (
            f"revision '{revision}' is not in the Hugging Face cache at {cached}"
            if cached.is_dir()
            else f"no copy of {repo} in the Hugging Face cache at {cache}"
        )
        raise PullError(
            f"{where}: {reason} and {missing}. Provide the files: on a machine with access run "
            f"`hf download {repo} --revision {revision}` and copy its cache folder into {cache} (or set HF_HUB_CACHE), "
            f"or point this entry's 'source' at a local folder holding config.json, *.safetensors and tokenizer.json."
        ) from None
    except HfHubHTTPError as e:
        raise PullError(f"{where}: the Hub refused the download ({e})") from None
    snapshot = Path(folder)
    return snapshot, snapshot.name, cached_listing(repo, snapshot.name, cache_dir)


def cached_listing(repo: str, commit: str, cache_dir: str | Path | None) -> list[str] | None:
    """Every file of the repository at `commit`, when huggingface_hub cached the listing, else None."""
    try:
        from huggingface_hub import get_cached_repo_tree

        return [
            f.path if hasattr(f, "path") else str(f)
            for f in get_cached_repo_tree(repo, revision=commit, cache_dir=cache_dir)
        ]
    except Exception:  # the listing is an optional extra check; its absence is not an error
        return None


def from_folder(entry: CatalogEntry) -> Path:
    folder = Path(entry.source.location)
    if not folder.is_dir():
        raise PullError(
            f"model '{entry.id}': source folder {folder} does not exist; put config.json, *.safetensors and "
            f"tokenizer.json there (or change 'source' in the catalog)"
        )
    return folder


def stage_files(entry: CatalogEntry, source: Path, staging: Path, remote_files: list[str] | None) -> dict[str, str]:
    """Copy the allowed top-level files into `staging`, verifying each; return name -> sha256."""
    present = sorted(p.name for p in source.iterdir() if p.is_file())
    refuse_pickle_only(entry, source, present + [f for f in remote_files or [] if "/" not in f])
    wanted = [n for n in present if any(fnmatch.fnmatch(n, pat) for pat in ALLOW_PATTERNS)]
    missing_pins = sorted(set(entry.sha256) - set(wanted))
    if missing_pins:
        raise PullError(f"model '{entry.id}': {source / missing_pins[0]} is pinned in the catalog (sha256) but missing")
    if "config.json" not in wanted:
        raise PullError(f"model '{entry.id}': {source / 'config.json'} is missing")
    files: dict[str, str] = {}
    for name in wanted:
        src = source / name
        if name.endswith(".safetensors"):
            check_safetensors_complete(src, entry.id)
        digest = sha256_of(src)
        check_hashes(entry, src, name, digest)
        place(src, staging / name)
        files[name] = digest
    return files


def refuse_pickle_only(entry: CatalogEntry, source: Path, names: list[str]) -> None:
    if any(n.endswith(".safetensors") for n in names):
        return
    pickles = sorted({n for n in names if n.endswith(PICKLE_SUFFIXES)})
    if pickles:
        raise PullError(
            f"model '{entry.id}': {source} ships only pickle weights ({', '.join(pickles)}); unmask loads safetensors "
            f"only (pickle can run code on load). Ask the publisher for safetensors or convert them yourself."
        )
    raise PullError(f"model '{entry.id}': no *.safetensors weights in {source}")


def check_safetensors_complete(path: Path, entry_id: str) -> None:
    """The header's declared tensor extent must equal the file size: catches truncation without a pin."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise PullError(f"model '{entry_id}': {path} is truncated ({size} bytes; not a safetensors file)")
        (header_len,) = struct.unpack("<Q", head)
        if 8 + header_len > size:
            raise PullError(
                f"model '{entry_id}': {path} is truncated (header declares {header_len} bytes, file has {size})"
            )
        try:
            header = json.loads(f.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise PullError(f"model '{entry_id}': {path} has a corrupt safetensors header ({e})") from None
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    if 8 + header_len + end != size:
        raise PullError(
            f"model '{entry_id}': {path} is truncated or padded: tensors need {8 + header_len + end} bytes, "
            f"file has {size}"
        )


def check_hashes(entry: CatalogEntry, src: Path, name: str, digest: str) -> None:
    """Catalog pin first; then the Hugging Face blob name (sha256 for LFS files, git sha1 for the rest)."""
    pinned = entry.sha256.get(name)
    if pinned and pinned != digest:
        raise PullError(f"model '{entry.id}': {src} sha256 mismatch: catalog pins {pinned}, file has {digest}")
    if not src.is_symlink():
        return
    blob = Path(os.path.realpath(src)).name
    if len(blob) == 64 and all(c in "0123456789abcdef" for c in blob) and blob != digest:
        raise PullError(
            f"model '{entry.id}': {src} is corrupt in the Hugging Face cache: sha256 {digest}, expected {blob}"
        )
    if len(blob) == 40 and all(c in "0123456789abcdef" for c in blob) and blob != git_blob_sha1(src):
        raise PullError(
            f"model '{entry.id}': {src} is corrupt in the Hugging Face cache: git blob hash differs from {blob}"
        )


def verify_pins(entry: CatalogEntry, folder: Path) -> None:
    """Before a load: every file the catalog pins for `entry` exists in `folder` and hashes to its pin.

    Hashes are kept in <state>/cache/sha256.json by path, size and mtime, so a second load of an
    unchanged file reads no bytes; an edited or replaced file is hashed again.
    CheckpointError names the file, the pinned and the actual hash.
    """
    if not entry.sha256:
        return
    cache_path = state_dir(create=False) / "cache" / "sha256.json"
    try:
        cache = json.loads(cache_path.read_text(encoding="utf-8"))
        cache = cache if isinstance(cache, dict) else {}
    except (OSError, ValueError):
        cache = {}
    changed = False
    for name, pinned in sorted(entry.sha256.items()):
        path = folder / name
        try:
            stat = path.stat()
        except OSError:
            raise CheckpointError(
                f"model '{entry.id}': {path} is pinned in the catalog (sha256 {pinned}) but missing"
            ) from None
        key, stamp = os.path.realpath(path), [stat.st_size, stat.st_mtime_ns]
        known = cache.get(key)
        if isinstance(known, dict) and known.get("stamp") == stamp and isinstance(known.get("sha256"), str):
            digest = known["sha256"]
        else:
            digest = sha256_of(path)
            cache[key], changed = {"stamp": stamp, "sha256": digest}, True
        if digest != pinned:
            raise CheckpointError(
                f"model '{entry.id}': {path} sha256 mismatch: the catalog pins {pinned}, the file "
                f"has {digest}; restore the file, or pull it again (`unmask pull {entry.id}`)"
            )
    if changed:
        try:
            cache_path.parent.mkdir(parents=True, exist_ok=True)
            partial = cache_path.with_name(f".{cache_path.name}.{os.getpid()}")
            partial.write_text(json.dumps(cache, indent=1, sort_keys=True), encoding="utf-8")
            os.replace(partial, cache_path)
        except OSError:  # a read-only state folder: the check held, only the shortcut is not kept
            pass


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def git_blob_sha1(path: Path) -> str:
    h = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def place(src: Path, dst: Path) -> None:
    """Hard-link the resolved file when the filesystem allows (no second copy of 16 GB), else copy."""
    real = Path(os.path.realpath(src))
    try:
        os.link(real, dst)
    except OSError:
        shutil.copyfile(real, dst)


def license_findings(entry: CatalogEntry, folder: Path) -> list[dict[str, Any]]:
    """Compare the model card's `license:` with the catalog; a disagreement is a finding, never an edit."""
    try:
        card = read_card(folder)
    except ValueError as e:
        return [
            {
                "check": "license",
                "severity": "warning",
                "catalog": entry.license,
                "card": None,
                "message": f"model card unreadable: {e}",
            }
        ]
    if not card:
        return [
            {
                "check": "license",
                "severity": "warning",
                "catalog": entry.license,
                "card": None,
                "message": "no model card (README.md) to confirm the license",
            }
        ]
    card_license = card.get("license")
    if card_license is None:
        return [
            {
                "check": "license",
                "severity": "warning",
                "catalog": entry.license,
                "card": None,
                "message": f"{card['file']} has no 'license:' in its YAML header",
            }
        ]
    if entry.license_matches(str(card_license)):
        return []
    return [
        {
            "check": "license",
            "severity": "error",
            "catalog": entry.license,
            "card": str(card_license),
            "card_license_name": card.get("license_name"),
            "card_license_link": card.get("license_link"),
            "message": f"{card['file']} declares license '{card_license}' but the catalog says '{entry.license_label}'",
        }
    ]


def read_findings(folder: Path) -> list[dict[str, Any]]:
    path = folder / FINDINGS
    return json.loads(path.read_text()) if path.is_file() else []


def install(staging: Path, target: Path) -> None:
    """Rename the staged folder into place; a previous pull is swapped out, then removed."""
    previous = None
    if target.exists():
        previous = target.with_name(f".old-{target.name}-{os.getpid()}-{time.monotonic_ns()}")
        os.replace(target, previous)
    try:
        os.replace(staging, target)
    except OSError:
        if previous is not None:
            os.replace(previous, target)
        raise
    if previous is not None:
        shutil.rmtree(previous, ignore_errors=True)
