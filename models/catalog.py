"""The candidate catalog: typed entries read from YAML and validated on load.

Every error names the catalog file, the entry's id (or its position) and the field, and says
what was expected, so a user adding their own candidate can fix it without reading this code.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, overload
from urllib.parse import urlsplit

import yaml

from models.licenses import LicenseClassError, license_class, normalized_spdx
from models.unique_keys import DuplicateKeyError, load_yaml

CATALOG_PATH = Path(__file__).resolve().parent / "catalog.yaml"

KINDS = ("masked-diffusion", "block-diffusion", "autoregressive", "api")
ROLES = ("candidate", "fallback")
ADAPTERS = ("llada", "diffusion-gemma", "dream", "sdar", "llada2", "nemotron", "causal-lm", "api", "none")
FIELDS = {
    "id",
    "family",
    "kind",
    "role",
    "source",
    "revision",
    "pinned",
    "sha256",
    "license",
    "license_name",
    "license_link",
    "card_license",
    "parameters",
    "active_parameters",
    "adapter",
    "decoding",
    "notes",
    "api_model",
    "api_key_env",
    "allow_outside_source",
    "architecture",
}
DECODING_FIELDS = {
    "mask_id": int,
    "eos_id": int,
    "eot_id": int,
    "pad_id": int,
    "gen_length": int,
    "block_length": int,
    "steps": int,
    "entropy_bound": float,
    "t_min": float,
    "t_max": float,
    "stability_threshold": int,
    "confidence_threshold": float,
    "temperature": float,
    "parallel": str,  # the commit rule (sampler/commit.py): Dream's schedule is `timesteps`
    # the masked block canvas (SDAR: sampler/masked_blocks.py)
    "canvas": str,
    "remasking": str,
    "commit_threshold": float,
    "top_k": int,
    "top_p": float,
    "mode": str,  # the seeded canvas (Nemotron-Labs-Diffusion): diffusion, self_speculative or autoregressive
}
ID_PATTERN = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
HF_REPO_PATTERN = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
COMMIT_PATTERN = re.compile(r"^[0-9a-f]{40}$")
SHA256_PATTERN = re.compile(r"^[0-9a-f]{64}$")
ARCHITECTURE_FIELDS = ("layers", "kv_heads", "head_dim", "vocab")
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")  # where an api entry may be plain http (another `unmask serve`)


class CatalogError(ValueError):
    """A catalog that cannot be used; the message names the file, the entry id and the field."""


@dataclass(frozen=True)
class Source:
    """Where an entry's files (or its API) live: scheme `hf`, `local` or `api`."""

    scheme: str
    location: str  # org/name, an absolute folder path, or a base URL

    def __str__(self) -> str:
        return f"hf://{self.location}" if self.scheme == "hf" else self.location


@dataclass(frozen=True)
class Architecture:
    """What a decode's KV cache and logits depend on: the text network's shape, as its config.json gives it."""

    layers: int  # transformer blocks (num_hidden_layers, n_layers)
    kv_heads: int  # key/value heads (num_key_value_heads; the query heads' count without grouped-query attention)
    head_dim: int  # width of one head (head_dim, else hidden size / query heads)
    vocab: int  # rows of the output layer (vocab_size)

    def __str__(self) -> str:
        return ", ".join(f"{name} {getattr(self, name):,}" for name in ARCHITECTURE_FIELDS)


@dataclass(frozen=True)
class CatalogEntry:
    """One candidate model, as written in the catalog."""

    id: str
    family: str
    kind: str
    role: str
    source: Source
    license: str
    adapter: str
    revision: str | None = None
    pinned: bool = False
    sha256: dict[str, str] = field(default_factory=dict)
    license_name: str | None = None
    license_link: str | None = None
    card_license: str | None = None
    parameters: int | None = None
    active_parameters: int | None = None  # per token, for a mixture of experts; None: all of them, or unknown
    architecture: Architecture | None = None  # the memory fit's shape before a pull; None: known once pulled
    decoding: dict[str, Any] = field(default_factory=dict)
    notes: str = ""
    api_model: str | None = None
    api_key_env: str | None = None

    @property
    def is_api(self) -> bool:
        return self.kind == "api"

    @property
    def license_label(self) -> str:
        return self.license_name if self.license == "other" and self.license_name else self.license

    @property
    def license_class(self) -> str:
        """`permissive` (passes on its own) or `sign-off` (a named person signs the license review off)."""
        return license_class(self.license)

    def license_matches(self, card_license: str) -> bool:
        """Whether a model card's `license:` tag agrees with this entry (case-insensitive)."""
        accepted = {self.license.lower()}
        if self.card_license:
            accepted.add(self.card_license.lower())
        return str(card_license).strip().lower() in accepted

    def api_status(self) -> tuple[bool, str]:
        """(evaluable, reason) for an API entry: evaluable once its key variable is set."""
        if not self.is_api:
            return False, "not an API entry"
        if not self.api_key_env or not os.environ.get(self.api_key_env):
            return False, f"not evaluable: API endpoint {self.source} needs a key in ${self.api_key_env or 'API_KEY'}"
        return True, f"endpoint {self.source}, key from ${self.api_key_env}"


class Catalog:
    """Entries by id, in file order."""

    def __init__(self, entries: list[CatalogEntry], path: Path, broken: list[tuple[str, str]] | None = None):
        self.path = path
        self._entries = {e.id: e for e in entries}
        self.broken = list(broken or [])  # (id or #position, error) of entries refused by a tolerant load

    def __iter__(self) -> Iterator[CatalogEntry]:
        return iter(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self._entries

    def ids(self) -> list[str]:
        return list(self._entries)

    def get(self, entry_id: str) -> CatalogEntry:
        try:
            return self._entries[entry_id]
        except KeyError:
            raise CatalogError(
                f"{self.path}: no entry with id '{entry_id}'; known: {', '.join(self._entries)}"
            ) from None


def load_catalog(path: str | Path | None = None, *, tolerant: bool = False) -> Catalog:
    """Read and validate a catalog file (default: $UNMASK_CATALOG, else the bundled catalog.yaml).

    tolerant: an entry that fails validation is left out and kept in `Catalog.broken` with its error
    (`unmask models` lists the rest); otherwise the first one raises. A file that is not a catalog
    at all raises either way.
    """
    path = Path(path or os.environ.get("UNMASK_CATALOG") or CATALOG_PATH).expanduser()
    if not path.is_file():
        raise CatalogError(f"{path}: catalog file not found")
    return _parsed_catalog(path, path.read_bytes(), tolerant)


@functools.lru_cache(maxsize=16)
def _parsed_catalog(path: Path, raw: bytes, tolerant: bool) -> Catalog:
    """The catalog these bytes hold, parsed once per content (a run looks entries up some thirty times; the
    bytes are read each time, so an edited file is parsed again)."""
    try:
        data = load_yaml(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise CatalogError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except DuplicateKeyError as e:
        raise CatalogError(f"{path}: {e}; each key once") from None
    except yaml.YAMLError as e:
        raise CatalogError(f"{path}: not valid YAML ({' '.join(str(e).split())})") from None
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise CatalogError(f"{path}: expected a mapping with an 'entries' list")
    entries: list[CatalogEntry] = []
    broken: list[tuple[str, str]] = []
    seen: set[str] = set()
    for index, raw in enumerate(data["entries"]):
        try:
            entry = parse_entry(raw, index, path)
            if entry.id in seen:
                raise CatalogError(f"{path}: entry '{entry.id}': field 'id' is a duplicate; ids must be unique")
        except CatalogError as e:
            if not tolerant:
                raise
            label = raw.get("id") if isinstance(raw, dict) and isinstance(raw.get("id"), str) else f"#{index + 1}"
            broken.append((label, str(e)))
            continue
        seen.add(entry.id)
        entries.append(entry)
    return Catalog(entries, path, broken)


def parse_entry(raw: Any, index: int, path: Path) -> CatalogEntry:
    """Validate one entry mapping; `index` names it when its id is missing."""
    if not isinstance(raw, dict):
        raise CatalogError(f"{path}: entry #{index + 1}: expected a mapping, got {type(raw).__name__}")
    entry_id = raw.get("id")
    where = f"{path}: entry '{entry_id}'" if isinstance(entry_id, str) else f"{path}: entry #{index + 1}"

    def fail(field_name: str, expected: str) -> CatalogError:
        return CatalogError(f"{where}: field '{field_name}' {expected}")

    @overload
    def text(name: str, required: Literal[True] = ...) -> str: ...

    @overload
    def text(name: str, required: bool) -> str | None: ...

    def text(name: str, required: bool = True) -> str | None:
        value = raw.get(name)
        if value is None and not required:
            return None
        if not isinstance(value, str) or not value.strip():
            raise fail(name, "is missing" if value is None else f"must be a non-empty string, got {value!r}")
        return value.strip()

    unknown = sorted(set(raw) - FIELDS)
    if unknown:
        raise fail(unknown[0], f"is not a catalog field; known fields: {', '.join(sorted(FIELDS))}")
    entry_id = text("id")
    if not ID_PATTERN.match(entry_id):
        raise fail("id", f"must be lower-case letters, digits, '.', '_' or '-', got {entry_id!r}")
    kind = text("kind")
    if kind not in KINDS:
        raise fail("kind", f"is {kind!r}; expected one of: {', '.join(KINDS)}")
    role = text("role")
    if role not in ROLES:
        raise fail("role", f"is {role!r}; expected one of: {', '.join(ROLES)}")
    outside = raw.get("allow_outside_source", False)
    if not isinstance(outside, bool):
        raise fail("allow_outside_source", f"must be true or false, got {outside!r}")
    source = parse_source(text("source"), kind, path, fail, allow_outside=outside)
    license_id, name, link = parse_license(raw, fail)
    adapter = text("adapter", required=False) or ("api" if kind == "api" else None)
    if adapter not in ADAPTERS:
        raise fail("adapter", f"is {adapter!r}; expected one of: {', '.join(ADAPTERS)}")
    if (adapter == "api") != (kind == "api"):
        raise fail("adapter", f"'{adapter}' does not fit kind '{kind}' (adapter api is for kind api only)")
    if adapter == "none" and not raw.get("notes"):
        raise fail("notes", "is required when adapter is 'none': say why the model cannot be evaluated")
    revision = text("revision", required=source.scheme == "hf")
    pinned = raw.get("pinned", False)
    if not isinstance(pinned, bool):
        raise fail("pinned", f"must be true or false, got {pinned!r}")
    if pinned and source.scheme == "hf" and not COMMIT_PATTERN.match(revision or ""):
        raise fail("revision", f"must be a 40-hex commit when pinned is true, got {revision!r}")
    sha256, (parameters, active) = parse_sha256(raw, fail), parse_counts(raw, fail)
    decoding, architecture = parse_decoding(raw.get("decoding"), fail), parse_architecture(raw, kind, fail)
    if kind == "api" and not raw.get("api_model"):
        raise fail("api_model", "is missing; an API entry names the model its endpoint serves")
    return CatalogEntry(
        id=entry_id,
        family=text("family"),
        kind=kind,
        role=role,
        source=source,
        license=license_id,
        adapter=adapter,
        revision=revision,
        pinned=pinned,
        sha256=dict(sha256),
        license_name=name,
        license_link=link,
        card_license=text("card_license", required=False),
        parameters=parameters,
        active_parameters=active,
        architecture=architecture,
        decoding=decoding,
        notes=str(raw.get("notes") or "").strip(),
        api_model=text("api_model", required=False),
        api_key_env=text("api_key_env", required=False),
    )


def parse_sha256(raw: dict[str, Any], fail: Callable[[str, str], CatalogError]) -> dict[str, str]:
    sha256 = raw.get("sha256") or {}
    if not isinstance(sha256, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and SHA256_PATTERN.match(v) for k, v in sha256.items()
    ):
        raise fail("sha256", "must map file names to 64 lower-case hex digits")
    return sha256


def parse_counts(raw: dict[str, Any], fail: Callable[[str, str], CatalogError]) -> tuple[int | None, int | None]:
    """`parameters` and `active_parameters`: positive integers or null, the active ones at most all of them."""
    counts: list[int | None] = []
    for name in ("parameters", "active_parameters"):
        value = raw.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            raise fail(name, f"must be a positive integer or null, got {value!r}")
        counts.append(value)
    parameters, active = counts
    if active is not None and (parameters is None or active > parameters):
        raise fail("active_parameters", f"must be at most 'parameters' ({parameters}), got {active}")
    return parameters, active


def parse_architecture(raw: dict[str, Any], kind: str, fail: Callable[[str, str], CatalogError]) -> Architecture | None:
    """`{layers, kv_heads, head_dim, vocab}`: each a positive integer, all four given; absent or null: None (always
    for an api entry, whose memory is its provider's)."""
    value = raw.get("architecture")
    if value is None:
        return None
    if kind == "api":
        raise fail("architecture", "is for a model that runs here; an api entry's memory is its provider's")
    if not isinstance(value, dict):
        raise fail("architecture", f"must be a mapping of {', '.join(ARCHITECTURE_FIELDS)}, got {value!r}")
    unknown = sorted(set(value) - set(ARCHITECTURE_FIELDS))
    if unknown:
        raise fail(
            f"architecture.{unknown[0]}", f"is not an architecture field; known: {', '.join(ARCHITECTURE_FIELDS)}"
        )
    counts: dict[str, int] = {}
    for name in ARCHITECTURE_FIELDS:
        given = value.get(name)
        if given is None:
            raise fail(
                f"architecture.{name}", "is missing; the memory fit needs all four of " + ", ".join(ARCHITECTURE_FIELDS)
            )
        if not isinstance(given, int) or isinstance(given, bool) or given <= 0:
            raise fail(f"architecture.{name}", f"must be a positive integer, got {given!r}")
        counts[name] = given
    return Architecture(**counts)


def parse_source(
    value: str, kind: str, path: Path, fail: Callable[[str, str], CatalogError], allow_outside: bool = False
) -> Source:
    """`hf://org/name`, `https://host/...` (api only) or a folder; relative folders are relative to the catalog.

    A folder must lie inside the catalog's own folder tree (`../../../../etc` would otherwise be
    listed as ready) unless the entry says `allow_outside_source: true`.
    """
    if "://" in value:
        scheme, _, rest = value.partition("://")
        if scheme == "hf":
            if not HF_REPO_PATTERN.match(rest):
                raise fail("source", f"{value!r} is malformed; expected hf://org/name")
            if kind == "api":
                raise fail("source", f"{value!r}: an api entry needs an https:// base URL")
            return Source("hf", rest)
        if scheme in ("http", "https"):
            if not urlsplit(value).hostname:
                raise fail("source", f"{value!r} is malformed; expected https://host/path")
            if kind != "api":
                raise fail("source", f"{value!r}: a URL source is only for kind api; use hf://org/name or a folder")
            if scheme == "http" and urlsplit(value).hostname not in LOOPBACK_HOSTS:
                raise fail(
                    "source",
                    f"{value!r}: a key travels with every request, so an api entry needs https:// "
                    f"(http:// only on this machine: {', '.join(LOOPBACK_HOSTS)})",
                )
            return Source("api", value.rstrip("/"))
        raise fail("source", f"{value!r}: unknown scheme '{scheme}://'; expected hf://, https:// or a folder path")
    if kind == "api":
        raise fail("source", f"{value!r}: an api entry needs an https:// base URL")
    folder = Path(os.path.expandvars(value)).expanduser()
    if not folder.is_absolute():
        folder = path.parent / folder
    folder, home = folder.resolve(), path.parent.resolve()
    if not allow_outside and not folder.is_relative_to(home):
        raise fail(
            "source",
            f"{value!r} resolves to {folder}, outside the catalog's folder {home}; move the model "
            f"under it, or set allow_outside_source: true on this entry",
        )
    return Source("local", str(folder))


def parse_license(raw: dict[str, Any], fail: Callable[[str, str], CatalogError]) -> tuple[str, str | None, str | None]:
    """An SPDX expression (LicenseRef-* allowed), or `other` with license_name and license_link."""
    value = raw.get("license")
    if value is None or (isinstance(value, str) and not value.strip()):
        raise fail(
            "license",
            "is missing; give an SPDX id (e.g. Apache-2.0, MIT) or 'other' with license_name and license_link",
        )
    if not isinstance(value, str):
        raise fail("license", f"must be a string, got {value!r}")
    name, link = raw.get("license_name"), raw.get("license_link")
    for key, given in (("license_name", name), ("license_link", link)):
        if given is not None and (not isinstance(given, str) or not given.strip()):
            raise fail(key, f"must be a non-empty string, got {given!r}")
    if link is not None and not re.match(r"^https?://\S+$", link):
        raise fail("license_link", f"must be an http(s) URL, got {link!r}")
    if value == "other" or value.startswith("LicenseRef-"):
        if not name or not link:
            missing = "license_name" if not name else "license_link"
            raise fail(missing, f"is required when license is '{value}'")
        return value, name, link
    try:
        return normalized_spdx(value), name, link
    except LicenseClassError as e:
        raise fail("license", f"{e}; use an SPDX id, or 'other' with license_name and license_link") from None


def parse_decoding(value: Any, fail: Callable[[str, str], CatalogError]) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise fail("decoding", f"must be a mapping, got {type(value).__name__}")
    out: dict[str, Any] = {}
    for key, given in value.items():
        if key not in DECODING_FIELDS:
            raise fail(f"decoding.{key}", f"is not a decoding setting; known: {', '.join(sorted(DECODING_FIELDS))}")
        want = DECODING_FIELDS[key]
        ok = (
            isinstance(given, str)
            if want is str
            else isinstance(given, int) and not isinstance(given, bool)
            if want is int
            else isinstance(given, (int, float)) and not isinstance(given, bool)
        )
        if given is not None and not ok:
            raise fail(f"decoding.{key}", f"must be {want.__name__}, got {given!r}")
        out[key] = float(given) if want is float and given is not None else given
    return out
