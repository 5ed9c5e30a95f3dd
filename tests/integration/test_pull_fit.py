"""`unmask pull` refuses an entry that does not fit before any download, and `unmask models` lists class and fit.

The refusal is proved offline: the Hub download is replaced by a function that fails the test if called.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from models.checkpoint import save_checkpoint
from models.llada import LLaDAConfig, LLaDAModelLM, init_weights

BIG = {
    "id": "big-8b",
    "family": "llada",
    "kind": "masked-diffusion",
    "role": "candidate",
    "source": "hf://acme/big-8b",
    "revision": "main",
    "license": "other",
    "license_name": "NVIDIA Nemotron Open Model License",
    "license_link": "https://example.com/license",
    "parameters": 8_000_000_000,
    "adapter": "llada",
    "decoding": {"gen_length": 128},
}


@pytest.fixture
def app(tmp_path, monkeypatch) -> typer.Typer:
    from flows.commands import models as models_cmd
    from flows.commands import pull as pull_cmd

    def no_download(*args: object, **kwargs: object) -> None:
        raise AssertionError("the fit check should have refused before any download")

    monkeypatch.setattr("models.pull.from_hub", no_download)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("UNMASK_MODEL_STORE", str(tmp_path / "store"))
    cli = typer.Typer()
    pull_cmd.register(cli)
    models_cmd.register(cli)
    return cli


def write_catalog(folder: Path, *entries: dict[str, object]) -> Path:
    path = folder / "catalog.yaml"
    path.write_text(yaml.safe_dump({"entries": list(entries)}))
    return path


def test_pull_refuses_with_need_and_have_per_term_before_downloading(tmp_path, app):
    catalog = write_catalog(tmp_path, BIG)
    result = CliRunner().invoke(
        app, ["pull", "big-8b", "--catalog", str(catalog), "--device", "cuda", "--memory", "1GiB"]
    )
    assert result.exit_code == 1, result.output
    assert "model 'big-8b' does not fit: nothing was downloaded" in result.output
    assert "weights: 14.90 GiB (8,000,000,000 parameters x 2-byte dtype)" in result.output  # 16e9 bytes, bf16
    assert "kv_cache: unknown" in result.output and "have: 1.00 GiB (stated --memory, cuda)" in result.output
    assert not (tmp_path / "store").exists()


def test_an_unknown_size_is_not_refused_and_bad_options_are_named(tmp_path, app):
    catalog = write_catalog(tmp_path, BIG | {"parameters": None})
    result = CliRunner().invoke(app, ["pull", "big-8b", "--catalog", str(catalog), "--memory", "1GiB"])
    assert "memory fit: unknown: needs 0.00 KiB + unknown" in result.output
    assert isinstance(result.exception, AssertionError)  # it went on to the download (stubbed here)
    bad = CliRunner().invoke(app, ["pull", "big-8b", "--catalog", str(catalog), "--memory", "lots"])
    assert bad.exit_code == 2 and "'lots' is not a size" in bad.output


def test_no_fit_check_pulls_anyway_and_the_manifest_keeps_the_override(tmp_path, app):
    folder = tmp_path / "weights"
    cfg = LLaDAConfig(d_model=16, n_heads=2, n_layers=1, vocab_size=40, mask_token_id=39, eos_token_id=38)
    save_checkpoint(init_weights(LLaDAModelLM(cfg), seed=0), folder)
    catalog = write_catalog(tmp_path, BIG | {"source": "weights", "revision": None})
    args = ["pull", "big-8b", "--catalog", str(catalog), "--memory", "1GiB"]
    assert CliRunner().invoke(app, args).exit_code == 1
    result = CliRunner().invoke(app, [*args, "--no-fit-check"])
    assert result.exit_code == 0, result.output
    assert "memory fit: overridden by --no-fit-check, does not fit" in result.output
    manifest = json.loads((tmp_path / "store" / "big-8b" / "unmask-pull.json").read_text())
    fit = manifest["memory_fit"]
    assert fit["overridden"] and fit["verdict"] == "does not fit" and fit["have"] == 2**30
    assert fit["terms"]["kv_cache"]["bytes"] == 2 * 1 * 2 * 8 * 1024 * 4  # the config is here now: float32 on cpu


def test_models_lists_license_class_and_fit(tmp_path, app):
    small = BIG | {"id": "small", "license": "Apache-2.0", "parameters": 1000}
    for key in ("license_name", "license_link"):
        small.pop(key)
    catalog = write_catalog(tmp_path, BIG, small)
    result = CliRunner().invoke(
        app, ["models", "--catalog", str(catalog), "--device", "cuda", "--memory", "1GiB"], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): line for line in result.output.splitlines() if line.startswith("│")}
    assert "sign-off" in rows["big-8b"] and "no 14.9+? > 1.0 GiB" in rows["big-8b"]
    assert "permissive" in rows["small"] and "? 0.0+?/1.0 GiB" in rows["small"]
