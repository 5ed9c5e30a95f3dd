"""Preparing and planning a candidate whose files have not changed answers from disk without loading the model
(evals/step_cache.py): what a fully cached `unmask run` no longer pays (tiny-dgemma's transformers import).
Real model folders, real sweeps; only `load` is replaced, to show it is not called (and to count when it is)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from evals import pipeline, step_cache
from evals.sweep import load_sweep
from tests.support.flow_fixtures import CANDIDATE, FALLBACK, tiny_models, write_sweep


@pytest.fixture
def counted_loads(monkeypatch):
    """The real `load`, counted; the process's handle cache emptied so that every miss really loads."""
    loads: list[str] = []
    real = pipeline.load

    def load(ref, **kwargs):
        loads.append(str(ref))
        return real(ref, **kwargs)

    monkeypatch.setattr(pipeline, "load", load)
    pipeline._handle.cache_clear()
    yield loads
    pipeline._handle.cache_clear()


def fresh_process() -> None:
    pipeline._handle.cache_clear()  # what a new `unmask run` starts with


def test_an_unchanged_model_is_prepared_and_planned_without_loading_it(tmp_path, counted_loads):
    models = tiny_models(tmp_path / "models")
    spec = load_sweep(write_sweep(tmp_path / "tiny.yaml", [models[CANDIDATE], models[FALLBACK]]))
    first = {ref: pipeline.prepare_candidate(ref) for ref in (models[CANDIDATE], models[FALLBACK])}
    plans = {ref: pipeline.plan_points(p, spec) for ref, p in first.items()}
    assert sorted(counted_loads) == sorted(first)  # each loaded once (the plan reuses the process's handle)
    assert all(plan.points for plan in plans.values())

    fresh_process()
    counted_loads.clear()
    again = {ref: pipeline.prepare_candidate(ref) for ref in first}
    replanned = {ref: pipeline.plan_points(p, spec) for ref, p in again.items()}
    assert counted_loads == []
    assert again == first and replanned == plans


def test_a_changed_file_sweep_or_cache_entry_prepares_again(tmp_path, counted_loads):
    models = tiny_models(tmp_path / "models")
    ref = models[CANDIDATE]
    spec = load_sweep(write_sweep(tmp_path / "tiny.yaml", [ref]))
    prepared = pipeline.prepare_candidate(ref)
    pipeline.plan_points(prepared, spec)

    card = next(p for p in Path(ref).iterdir() if p.name in ("MODEL_CARD.md", "README.md", "config.json"))
    stat = card.stat()
    os.utime(card, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # touched: same bytes, a new stamp
    fresh_process()
    counted_loads.clear()
    assert pipeline.prepare_candidate(ref) == prepared
    assert counted_loads == [ref]  # the stamp changed, so the model was read again

    fresh_process()
    counted_loads.clear()
    assert pipeline.prepare_candidate(ref) == prepared and counted_loads == []  # and kept again
    other = load_sweep(write_sweep(tmp_path / "other.yaml", [ref], steps=(8,)))
    plan = pipeline.plan_points(prepared, other)
    assert counted_loads == [ref] and {p.config["steps"] for p in plan.points} == {8}  # another sweep: planned

    for kept in (Path(os.environ["UNMASK_HOME"]) / "cache" / "steps").glob("prepared-*.json"):
        kept.write_text("{not json")  # a damaged entry is a miss, not an error
    fresh_process()
    counted_loads.clear()
    assert pipeline.prepare_candidate(ref) == prepared and counted_loads == [ref]


def test_the_key_covers_files_catalog_code_and_parts(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "a.bin").write_bytes(b"1")
    stamp = step_cache.files_stamp(folder)
    assert [name for name, _size, _mtime in stamp] == ["a.bin"]
    key = step_cache.step_key("prepared", files=stamp)
    (folder / "a.bin").write_bytes(b"22")
    assert step_cache.step_key("prepared", files=step_cache.files_stamp(folder)) != key
    assert step_cache.step_key("plan", files=stamp) != key
    assert len(step_cache.code_digest()) == 64


def _records(accuracy: float = 0.9):
    from evals.records import EvalRecord

    common = dict(
        role="candidate",
        kind="masked-diffusion",
        task="arith",
        split="test",
        gen_length=16,
        n_items=8,
        valid=True,
        dataset_hash="d" * 16,
    )
    return [
        EvalRecord(
            candidate="tiny-llada",
            config={"steps": s},
            config_hash=f"h{s}",
            accuracy=accuracy,
            latency_p50_s=0.01 * s,
            latency_p95_s=0.02 * s,
            **common,
        )
        for s in (4, 8)
    ] + [
        EvalRecord(
            **(common | {"role": "fallback", "kind": "autoregressive"}),
            candidate="tiny-ar",
            config={},
            config_hash="ar",
            accuracy=0.8,
            latency_p50_s=0.05,
            latency_p95_s=0.06,
        )
    ]


def test_a_plot_of_the_same_records_is_copied_not_drawn_again(tmp_path, monkeypatch):
    from evals import plots

    first = plots.plot_quality_latency(_records(), tmp_path / "one")
    assert [p.name for p in first] == ["quality-latency-arith.png"] and first[0].read_bytes()[:4] == b"\x89PNG"
    drawn: list[Path] = []
    real = plots._draw_quality_latency
    monkeypatch.setattr(plots, "_draw_quality_latency", lambda *a: drawn.append(a[1]) or real(*a))
    again = plots.plot_quality_latency(_records(), tmp_path / "two")
    assert drawn == [] and again[0].read_bytes() == first[0].read_bytes()  # copied, byte for byte
    plots.plot_quality_latency(_records(accuracy=0.5), tmp_path / "three")  # other records: another picture
    plots.plot_quality_latency(_records(), tmp_path / "four", latency="latency_p95_s")  # another axis
    assert drawn == [tmp_path / "three", tmp_path / "four"]
    for kept in (step_cache.state_dir() / "cache" / "steps").glob("quality-latency-*/*.png"):
        kept.unlink()  # a kept copy gone: drawn again, never an error
    plots.plot_quality_latency(_records(), tmp_path / "five")
    assert drawn[-1] == tmp_path / "five" and (tmp_path / "five" / "quality-latency-arith.png").is_file()


def test_a_state_folder_that_cannot_keep_the_plot_still_gets_it_drawn(tmp_path, monkeypatch):
    from evals import plots

    (tmp_path / "not-a-folder").write_text("a file where the state folder must be")
    monkeypatch.setenv("UNMASK_HOME", str(tmp_path / "not-a-folder"))
    for _ in range(2):  # nothing kept, nothing to copy: drawn both times, never an error
        paths = plots.plot_quality_latency(_records(), tmp_path / "out")
        assert paths[0].read_bytes()[:4] == b"\x89PNG"
