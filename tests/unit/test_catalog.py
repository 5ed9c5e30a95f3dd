"""The candidate catalog: the shipped file is complete and valid; bad entries fail with id and field."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
import yaml

from models.catalog import CATALOG_PATH, CatalogError, load_catalog

GOOD = {
    "id": "my-model",
    "family": "llada",
    "kind": "masked-diffusion",
    "role": "candidate",
    "source": "hf://org/my-model",
    "revision": "main",
    "license": "MIT",
    "adapter": "llada",
}


ARCH = {"layers": 32, "kv_heads": 4, "head_dim": 128, "vocab": 1000}
API = {"kind": "api", "adapter": "api", "source": "https://api.example.com/v1", "api_model": "m", "revision": None}


def write_catalog(tmp_path: Path, *entries: dict) -> Path:
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump({"entries": list(entries)}))
    return path


def with_(**changes) -> dict:
    entry = dict(GOOD)
    for key, value in changes.items():
        if value is None:
            entry.pop(key, None)
        else:
            entry[key] = value
    return entry


def test_shipped_catalog_names_every_model_the_issue_lists():
    catalog = load_catalog(CATALOG_PATH)
    sources = {str(e.source) for e in catalog}
    for repo in (
        "GSAI-ML/LLaDA-8B-Base",
        "GSAI-ML/LLaDA-8B-Instruct",
        "GSAI-ML/LLaDA-1.5",
        "google/diffusiongemma-26B-A4B-it",
        "Dream-org/Dream-v0-Instruct-7B",
        "meta-llama/Meta-Llama-3-8B-Instruct",
        "Qwen/Qwen2.5-7B-Instruct",
    ):
        assert f"hf://{repo}" in sources
    for entry_id in (
        "tiny-llada",
        "tiny-ar",
        "mercury",
        "mercury-coder-mini",
        "mercury-3b-research",
        "gemini-diffusion",
    ):
        assert entry_id in catalog
    kinds = {e.id: e.kind for e in catalog}
    assert kinds["diffusiongemma-26b-a4b"] == "block-diffusion"
    assert kinds["mercury"] == "api" and kinds["tiny-ar"] == "autoregressive"
    roles = {e.id: e.role for e in catalog}
    assert roles["tiny-ar"] == roles["qwen2.5-7b-instruct"] == roles["llama-3-8b-instruct"] == "fallback"


def test_shipped_licenses_and_decoding_defaults():
    catalog = load_catalog()
    assert catalog.get("llada-1.5").license == "MIT"
    assert catalog.get("diffusiongemma-26b-a4b").license == "Apache-2.0"
    llama = catalog.get("llama-3-8b-instruct")
    assert llama.license == "other" and "Llama 3" in llama.license_name and llama.license_link.startswith("https://")
    assert llama.license_matches("llama3") and not llama.license_matches("mit")
    mercury_3b = catalog.get("mercury-3b-research")
    assert mercury_3b.license == "other" and "non-commercial" in mercury_3b.license_name
    for entry in catalog:
        if entry.family == "llada" and entry.source.scheme == "hf":
            assert (entry.decoding["mask_id"], entry.decoding["eos_id"], entry.decoding["eot_id"]) == (
                126336,
                126081,
                126348,
            )
        if entry.source.scheme == "hf" and not entry.pinned:
            assert entry.revision == "main"  # unverified pins are marked, never invented


def test_each_shipped_architecture_names_the_source_it_was_read_from():
    """A stated shape is a published config.json's numbers, never a guess: a comment right above names its source."""
    lines = CATALOG_PATH.read_text().splitlines()
    stated = [i for i, line in enumerate(lines) if line.strip().startswith("architecture:")]
    assert len(stated) == sum(e.architecture is not None for e in load_catalog()) >= 9
    for i in stated:
        above = i
        while lines[above - 1].strip().startswith("#"):
            above -= 1
        assert re.search(r"read from .*config\.json", " ".join(lines[above:i])), lines[i]


def test_bundled_sources_resolve_to_the_weights_folder():
    catalog = load_catalog()
    assert Path(catalog.get("tiny-llada").source.location) == CATALOG_PATH.parent / "weights" / "tiny-llada"
    assert catalog.get("tiny-ar").source.scheme == "local"


def test_api_entries_are_not_evaluable_without_a_key(monkeypatch):
    entry = load_catalog().get("mercury")
    monkeypatch.delenv(entry.api_key_env, raising=False)
    evaluable, reason = entry.api_status()
    assert not evaluable and entry.api_key_env in reason
    monkeypatch.setenv(entry.api_key_env, "secret")
    assert entry.api_status()[0]


@pytest.mark.parametrize(
    "entry, field, words",
    [
        (with_(kind="continuous-diffusion"), "kind", "masked-diffusion"),
        (with_(license=None), "license", "missing"),
        (with_(license="Apache 2"), "license", "SPDX"),
        (with_(license="other"), "license_name", "required"),
        (with_(license="other", license_name="Custom"), "license_link", "required"),
        (with_(source="hf://just-a-name"), "source", "hf://org/name"),
        (with_(source="s3://bucket/x"), "source", "unknown scheme"),
        (with_(source="https://api.example.com/v1"), "source", "only for kind api"),
        (with_(role="primary"), "role", "candidate"),
        (with_(revision=None), "revision", "missing"),
        (with_(pinned=True), "revision", "40-hex"),
        (with_(sha256={"model.safetensors": "abc"}), "sha256", "64"),
        (with_(decoding={"mask": 3}), "decoding.mask", "not a decoding setting"),
        (with_(decoding={"gen_length": "long"}), "decoding.gen_length", "int"),
        (with_(adapter="none"), "notes", "why"),
        (with_(colour="blue"), "colour", "not a catalog field"),
        (with_(architecture=[32, 4, 128, 1000]), "architecture", "must be a mapping of layers, kv_heads"),
        (with_(architecture=ARCH | {"layers": 0}), "architecture.layers", "positive integer, got 0"),
        (with_(architecture=ARCH | {"kv_heads": True}), "architecture.kv_heads", "positive integer, got True"),
        (with_(architecture=ARCH | {"head_dim": "128"}), "architecture.head_dim", "positive integer, got '128'"),
        (with_(architecture={"layers": 32, "kv_heads": 4, "head_dim": 128}), "architecture.vocab", "missing"),
        (with_(architecture=ARCH | {"hidden": 4096}), "architecture.hidden", "not an architecture field"),
        (with_(**API, architecture=ARCH), "architecture", "an api entry's memory is its provider's"),
    ],
)
def test_bad_entry_names_id_and_field(tmp_path, entry, field, words):
    path = write_catalog(tmp_path, entry)
    with pytest.raises(CatalogError) as info:
        load_catalog(path)
    message = str(info.value)
    assert "'my-model'" in message and f"'{field}'" in message and words in message
    assert str(path) in message


def test_duplicate_id_is_refused(tmp_path):
    path = write_catalog(tmp_path, GOOD, with_(source="hf://org/other"))
    with pytest.raises(CatalogError, match=r"entry 'my-model': field 'id' is a duplicate"):
        load_catalog(path)


def test_entry_without_id_is_named_by_position(tmp_path):
    path = write_catalog(tmp_path, GOOD, with_(id=None, source="hf://org/x"))
    with pytest.raises(CatalogError, match=r"entry #2: field 'id' is missing"):
        load_catalog(path)


def test_user_entries_spdx_expression_licenseref_and_relative_folder(tmp_path):
    (tmp_path / "mine").mkdir()
    path = tmp_path / "catalog.yaml"
    path.write_text(
        textwrap.dedent("""
        entries:
          - {id: a, family: llada, kind: masked-diffusion, role: candidate, source: hf://o/a, revision: main,
             license: apache-2.0 OR mit, adapter: llada}
          - {id: b, family: x, kind: autoregressive, role: fallback, source: mine, license: LicenseRef-acme,
             license_name: ACME model license, license_link: "https://acme.example/license", adapter: causal-lm}
          - {id: c, family: mercury, kind: api, role: candidate, source: "https://api.example.com/v1/",
             api_model: m, license: other, license_name: Terms, license_link: "https://example.com/terms"}
    """)
    )
    catalog = load_catalog(path)
    assert catalog.get("a").license == "Apache-2.0 OR MIT"
    assert catalog.get("b").source.location == str(tmp_path / "mine")
    assert catalog.get("c").adapter == "api" and str(catalog.get("c").source) == "https://api.example.com/v1"
    with pytest.raises(CatalogError, match="no entry with id 'z'"):
        catalog.get("z")


def test_environment_variable_selects_the_catalog(tmp_path, monkeypatch):
    monkeypatch.setenv("UNMASK_CATALOG", str(write_catalog(tmp_path, GOOD)))
    assert load_catalog().ids() == ["my-model"]
