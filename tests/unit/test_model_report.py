"""The model report: per-band sort scores, the steps-ratio rows and the MODEL_CARD written from them."""

from __future__ import annotations

import json
import sys

import pytest
import yaml
from rich.console import Console

from evals import model_report
from evals.tasks import TASKS, alphabet, make_split
from evals.tasks.base import TaskItem
from evals.tasks.mixture import TrainingMixture
from models.pull import sha256_of
from models.tokenizer_build import build_char_tokenizer
from models.training import TrainConfig, train


def sort_item(letters: str) -> TaskItem:
    answer = "".join(sorted(letters))
    return TaskItem(task="sort", prompt=f"Sort: {letters}", answer=answer, target=answer, key=f"sort:{letters}")


def test_band_accuracy_splits_sort_items_by_answer_length():
    items = [sort_item("ba"), sort_item("cba"), sort_item("z" * 30), sort_item("y" * 70)]
    predictions = [
        {"exact-match": True, "char-accuracy": 1.0},
        {"exact-match": False, "char-accuracy": 0.5},
        {"exact-match": True, "char-accuracy": 1.0},
        {"exact-match": False, "char-accuracy": 0.25},
    ]
    bands = model_report.band_accuracy(TASKS["sort"], items, predictions)
    assert [(b["band"], b["n"]) for b in bands] == [("2-24", 2), ("25-60", 1), ("61-120", 1)]
    assert bands[0]["accuracy"] == {"exact-match": 0.5, "char-accuracy": 0.75}
    assert bands[2]["accuracy"]["exact-match"] == 0.0
    assert model_report.band_accuracy(TASKS["arith"], items[:1], predictions[:1]) == []  # arith has no bands


def test_reproduce_commands_name_each_evaluation_run():
    rows = [{"task": "arith", "n": 200, "gen_length": 32, "ratio": r} for r in (1, 2)]
    rows += [{"task": "sort", "n": 50, "gen_length": 256, "ratio": 1}]
    commands = [model_report.reproduce_command("models/weights/m", g) for g in model_report.row_groups(rows)]
    assert commands == [
        "python -m evals.model_report models/weights/m --split test --n 200 --tasks arith --ratios 1,2",
        "python -m evals.model_report models/weights/m --split test --n 50 --tasks sort --ratios 1 "
        "--gen-length sort=256",
    ]
    # two runs at one length and item count, with different modes, stay two commands (neither re-runs the other)
    rows = [
        {"task": "arith", "n": 100, "gen_length": 256, "ratio": 1, "mode": m} for m in ("threshold", "vanilla+exit")
    ]
    rows += [{"task": "sort", "n": 100, "gen_length": 256, "ratio": 1, "mode": "vanilla+exit"}]
    commands = [model_report.reproduce_command("m", g) for g in model_report.row_groups(rows)]
    assert commands == [
        "python -m evals.model_report m --split test --n 100 --tasks arith --ratios 1 --modes threshold,vanilla+exit "
        "--gen-length arith=256",
        "python -m evals.model_report m --split test --n 100 --tasks sort --ratios 1 --modes vanilla+exit "
        "--gen-length sort=256",
    ]


@pytest.fixture(scope="module")
def micro_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("micro")
    cfg = TrainConfig(
        model_id="micro",
        d_model=32,
        n_layers=1,
        n_heads=2,
        mlp_hidden=64,
        steps=4,
        warmup=1,
        checkpoint_every=4,
        log_every=2,
    )
    source = TrainingMixture(TASKS, {"arith": 1.0, "sort": 1.0}, {"arith": 4, "sort": 4})
    train(cfg, source, build_char_tokenizer(alphabet()), folder / "out", folder / "state", console=Console(quiet=True))
    return folder / "out"


def test_card_is_written_from_saved_rows(micro_model, tmp_path, monkeypatch):
    from models import load

    loaded = load(micro_model)
    rows = model_report.steps_ratio_table(loaded, "test", 3, [1, 2], tasks=["arith", "sort"], gen_lengths={"sort": 32})
    assert [(r["task"], r["ratio"], r["steps"]) for r in rows] == [
        ("arith", 1, 32),
        ("arith", 2, 16),
        ("sort", 1, 32),
        ("sort", 2, 16),
    ]
    sort_rows = [r for r in rows if r["task"] == "sort"]
    assert all(sum(b["n"] for b in r["bands"]) == 3 for r in sort_rows)
    # the bands agree with the row's own accuracy
    for r in sort_rows:
        assert sum(b["n"] * b["accuracy"]["char-accuracy"] for b in r["bands"]) / 3 == pytest.approx(
            r["accuracy"]["char-accuracy"]
        )
    saved = tmp_path / "rows.json"
    saved.write_text(json.dumps(rows))
    notes = tmp_path / "notes.md"
    notes.write_text("Measured on a micro model.\n")
    monkeypatch.setattr(sys, "argv", ["model_report", str(micro_model), "--card", str(saved), "--notes", str(notes)])
    model_report.main()
    card = (micro_model / "MODEL_CARD.md").read_text()
    header = yaml.safe_load(card.split("---\n")[1])
    assert header["sha256"]["model.safetensors"] == sha256_of(micro_model / "model.safetensors")
    assert header["training_steps"] == 4 and header["kind"] == "masked-diffusion"
    # the headline scores are the full-step arith row (sort was measured at an overridden gen_length)
    assert header["heldout_test"] == {"arith": {m: round(v, 4) for m, v in rows[0]["accuracy"].items()}}
    assert "--tasks sort --ratios 1,2 --gen-length sort=32" in card
    assert "### Sort by answer length" in card and "Measured on a micro model." in card
    assert "steps = gen_length/2" in card


def test_heldout_items_for_the_card_are_never_training_items():
    test_keys = {i.key for i in make_split(TASKS["sort"], "test", 50)}
    source = TrainingMixture(TASKS, {"sort": 1.0}, {"sort": 16})
    trained = {f"sort:{p.removeprefix('Sort: ')}" for s in range(20) for p, _ in source.batch(s).pairs}
    assert not test_keys & trained


def test_modes_are_rows_of_their_own_and_a_table_per_generation_length(micro_model, tmp_path, monkeypatch):
    from models import load

    loaded = load(micro_model)
    rows = model_report.steps_ratio_table(
        loaded, "test", 2, [1, 2], tasks=["arith"], gen_lengths={"arith": 64}, modes=["vanilla", "threshold+dual+exit"]
    )
    assert [(r["mode"], r["ratio"], r["gen_length"]) for r in rows] == [
        ("threshold+dual+exit", 1, 64),
        ("vanilla", 1, 64),
        ("vanilla", 2, 64),
    ]
    fast, vanilla = rows[0], rows[1]
    assert fast["forwards_per_batch"] <= vanilla["forwards_per_batch"] == 64  # vanilla: one call per step
    table = model_report.modes_table(rows)
    assert "| arith | 64 | 2 |" in table and "threshold+dual+exit" in table.splitlines()[0]
    assert "(64 fwd)" in table
    # the steps-ratio table keeps to vanilla rows, and the reproduce command names the modes
    assert "threshold" not in model_report.scores_table(rows)
    [group] = model_report.row_groups(rows)
    assert model_report.reproduce_command("m", group) == (
        "python -m evals.model_report m --split test --n 2 --tasks arith --ratios 1,2 "
        "--modes threshold+dual+exit,vanilla --gen-length arith=64"
    )
    with pytest.raises(ValueError, match="unknown decoding mode 'nope'"):
        model_report.mode_config("nope", 32)
