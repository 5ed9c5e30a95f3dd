"""`unmask bench` on a block-diffusion model (the tiny random DiffusionGemma), its memory admission, and the
block sampler's rows-only denoising.

Speed is never asserted; only that each row is measured and reported consistently, that a row that cannot fit the
memory budget is refused before anything decodes, and that computing fewer rows changes no token."""

from __future__ import annotations

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from evals.bench import (
    BLOCK_EXACT,
    BLOCK_REFERENCE,
    ROW_SETS,
    BenchSetup,
    BlockVariant,
    held_out_prompts,
    row_set,
    run_bench,
    variants_named,
)
from models import load
from sampler.block_diffusion import BlockDiffusionConfig
from sampler.decode import decode_prompts
from sampler.memory import footprint
from tests.support.eval_fixtures import write_diffusion_gemma, write_random_model


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench_block")
    return (
        write_diffusion_gemma(root / "rand-dgemma"),
        write_random_model(root / "rand-llada"),
        write_random_model(root / "rand-ar", causal=True, seed=1),
    )


def cli(*args: str):
    from flows.cli import _register_all, app

    _register_all()
    return CliRunner().invoke(app, ["bench", *args])


def test_the_row_set_follows_the_model_kind(folders):
    block, llada = load(folders[0]), load(folders[1])
    assert row_set(block.kind) is ROW_SETS["block-diffusion"] and row_set(llada.kind) is ROW_SETS["masked-diffusion"]
    names = [v.name for v in variants_named(None, block.kind)]
    assert names[0] == BLOCK_REFERENCE and "tiny-ar" in names and "vanilla" not in names
    assert "vanilla" in [v.name for v in variants_named(None, llada.kind)]
    with pytest.raises(ValueError, match="unknown bench config 'dual-cache'; known: exact-48"):
        variants_named(["dual-cache"], block.kind)


@pytest.mark.parametrize("kind", list(ROW_SETS))
def test_each_row_set_has_its_reference_and_every_row_builds_a_config(kind, folders):
    handle = load(folders[0] if kind == "block-diffusion" else folders[1])
    rows = ROW_SETS[kind]
    named = {v.name: v for v in rows.variants}
    assert rows.reference in named and named[rows.reference].lossless and named[rows.reference].default
    setup = rows.fitted(handle, BenchSetup(gen_lengths=(16,), block_length=16))
    for v in rows.variants:
        if v.kind == "ar":
            continue
        config = v.config(handle, 16, setup)
        assert config.gen_length == 16 and config.seed == setup.seed
        if kind == "block-diffusion":  # the row's settings are what decodes, over the model's defaults
            assert isinstance(config, BlockDiffusionConfig)
            assert all(getattr(config, k) == value for k, value in v.settings.items()), v.name
            assert v.lossless == (v.settings == BLOCK_EXACT)


SMALL = dict(gen_lengths=(8, 16), prompts=2, reps=3, warmup=0, threads=1, batch_sizes=(1, 2))
ROWS = [BLOCK_REFERENCE, "steps-4", "steps-16 bound-1", "tiny-ar"]  # in the table's order


@pytest.fixture(scope="module")
def report(folders):
    block, ar = load(folders[0]), load(folders[2])
    setup = row_set(block.kind).fitted(block, BenchSetup(**SMALL))
    return block, setup, run_bench(block, setup, variants_named(ROWS, block.kind), ar_loaded=ar)


def test_block_rows_are_finite_and_consistent(report):
    block, setup, rep = report
    assert [(r.config, r.gen_length, r.batch) for r in rep.rows] == [
        (c, n, b) for n in (8, 16) for b in (1, 2) for c in ROWS
    ]
    longest = max(len(ids) for p in held_out_prompts(block, setup) for ids in p.ids)
    variants = {v.name: v for v in variants_named(ROWS, block.kind)}
    for r in rep.rows:
        for value in (
            r.nfe,
            r.sequential_calls,
            r.tokens_per_forward,
            r.tokens_per_s,
            r.text_tokens_per_s,
            r.speedup_vs_vanilla,
            r.peak_mem_mb,
            r.computed_peak_mb,
            r.accuracy,
        ):
            assert math.isfinite(value), (r.config, r.to_dict())
        assert r.nfe >= 1 and r.sequential_calls >= 1 and r.tokens_per_s > 0 and r.peak_mem_mb > 0
        assert r.tokens_per_forward == pytest.approx(r.gen_length / r.sequential_calls)
        if r.kind == "ar":
            continue
        canvases = r.gen_length // block.canvas_length
        steps = variants[r.config].settings["max_denoising_steps"]
        assert r.nfe <= steps * canvases  # decoder calls: at most the step budget of each canvas
        if r.config == BLOCK_REFERENCE:  # no early stop: every canvas decoded takes all 48 steps
            assert r.nfe % 48 == 0 and r.speedup_vs_vanilla == pytest.approx(1.0) and r.lossless
        config = variants[r.config].config(block, r.gen_length, setup)
        assert r.computed_peak_mb == pytest.approx(footprint(block, longest, config).batch(r.batch) / 2**20)


def test_the_report_names_the_reference_the_canvas_and_aup_per_length(report):
    block, _, rep = report
    assert rep.reference == BLOCK_REFERENCE and f"canvas {block.canvas_length}" in rep.title
    assert set(rep.aup) == {8, 16}
    assert all(
        line.startswith(f"gen {n}: ") and f"of {BLOCK_REFERENCE}" in line and "AUP" in line
        for n, line in zip((8, 16), rep.verdicts)
    )
    saved = rep.to_dict()
    assert saved["reference"] == BLOCK_REFERENCE and all("computed_peak_mb" in r for r in saved["rows"])
    assert any(n.startswith("memory admission: the largest computed peak is ") for n in rep.notes)


def test_the_cli_runs_block_rows_and_writes_json(folders, tmp_path):
    out = tmp_path / "bench.json"
    result = cli(
        "--model",
        str(folders[0]),
        "--ar-model",
        "",
        "--gen-lengths",
        "8",
        "--prompts",
        "2",
        "--reps",
        "3",
        "--warmup",
        "0",
        "--configs",
        f"{BLOCK_REFERENCE},steps-4",
        "--memory-budget",
        "1GiB",
        "--json",
        str(out),
    )
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert [r["config"] for r in data["rows"]] == [BLOCK_REFERENCE, "steps-4"] and data["setup"][
        "memory_budget"
    ] == 2**30
    assert "steps-4" in result.stdout and "memory admission: the largest computed peak is" in result.stdout
    assert "within the memory budget of 1024.0 MiB, checked before decoding" in result.stdout


@pytest.mark.parametrize("which", [0, 1], ids=["block-diffusion", "masked-diffusion"])
def test_a_row_that_cannot_fit_the_budget_is_refused_in_one_line_before_anything_decodes(which, folders, tmp_path):
    out = tmp_path / "bench.json"
    result = cli(
        "--model",
        str(folders[which]),
        "--ar-model",
        "",
        "--gen-lengths",
        "8,16",
        "--block-length",
        "8",
        "--prompts",
        "2",
        "--batch",
        "1,2",
        "--reps",
        "3",
        "--warmup",
        "0",
        "--memory-budget",
        "4KiB",
        "--json",
        str(out),
    )
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.output
    assert "--memory-budget: " in errors[0] and "at batch 2, gen length 16 needs" in errors[0]
    assert "above the memory budget of 0.0 MiB (4096 bytes)" in errors[0]
    assert "bench pass" not in result.output and not out.exists()  # nothing decoded, nothing written


def test_a_bad_budget_or_a_length_off_the_canvas_is_refused(folders):
    bad = cli("--model", str(folders[0]), "--memory-budget", "lots")
    assert bad.exit_code == 2 and "--memory-budget: 'lots' is not a size" in bad.output
    off = cli("--model", str(folders[0]), "--gen-lengths", "12", "--configs", "steps-4")
    assert (
        off.exit_code == 2 and "gen_length 12 must be a multiple of" in off.output and "canvas length 8" in off.output
    )


class WholeBatch:
    """The adapter without `cache_rows` (every denoising call computes the whole batch), counting rows computed."""

    def __init__(self, adapter, hide: bool):
        self.adapter, self.hide, self.rows = adapter, hide, 0

    def __getattr__(self, name):
        if name == "cache_rows" and self.hide:
            raise AttributeError(name)
        return getattr(self.adapter, name)

    def denoise(self, canvas, *args):
        self.rows += canvas.shape[0]
        return self.adapter.denoise(canvas, *args)


# On this fixture: with row draws at 4.6 three rows end their answer in the first canvas and one goes on for two
# more; with batch draws at 4.83 the rows' canvases stop at different steps (13, 6, 6 and 19 decoder calls).
@pytest.mark.parametrize("row_seeded, confidence", [(True, 4.6), (False, 4.83)], ids=["row draws", "batch draws"])
def test_denoising_only_the_rows_still_read_changes_no_token(row_seeded, confidence, folders):
    handle = load(folders[0])
    config = BlockDiffusionConfig(
        max_new_tokens=24,
        max_denoising_steps=8,
        stability_threshold=0,
        confidence_threshold=confidence,
        eos_ids=(23,),
        pad_id=0,
        seed=11,
    )
    prompts = [[2, 5, 6, 7, 8], [2, 9, 10, 11, 12], [2, 30, 31, 32, 33], [2, 40, 41, 42, 43]]
    seeds = [3, 1, 4, 1] if row_seeded else None
    rows_only, whole = WholeBatch(handle, hide=False), WholeBatch(handle, hide=True)
    a = decode_prompts(rows_only, prompts, config, row_seeds=seeds)
    b = decode_prompts(whole, prompts, config, row_seeds=seeds)
    assert (
        torch.equal(a.sequences, b.sequences)
        and a.block_diffusion.decoder_forwards == b.block_diffusion.decoder_forwards
    )
    assert rows_only.rows < whole.rows  # the case really skips rows
    assert rows_only.rows >= sum(a.block_diffusion.decoder_forwards)  # every row that denoised was computed


def test_a_block_row_decodes_each_prompt_as_it_would_alone(folders):
    handle = load(folders[0])
    setup = row_set(handle.kind).fitted(handle, BenchSetup(gen_lengths=(16,), prompts=3))
    variant = BlockVariant("steps-4", {"max_denoising_steps": 4})
    config = variant.config(handle, 16, setup)
    ids = [i for p in held_out_prompts(handle, setup) for i in p.ids]
    batch = variant.decode(handle, ids, config).generated
    for row, prompt in enumerate(ids):
        assert torch.equal(batch[row], variant.decode(handle, [prompt], config).generated[0]), row
