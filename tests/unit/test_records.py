"""EvalRecord: JSON, Parquet and CSV round trips, the incremental store, and contract compatibility."""

from __future__ import annotations

import json

import pytest

from evals.records import EvalRecord, LicenseResult, ReproducibilityResult, records_from_frame, records_to_frame
from evals.store import RecordStore, load_records


def make_record(**changes) -> EvalRecord:
    base = dict(
        candidate="tiny-llada",
        role="candidate",
        kind="masked-diffusion",
        task="arith",
        split="test",
        config={"steps": 8, "gen_length": 16, "block_length": 8},
        config_hash="abc123",
        n_items=4,
        expected_items=4,
        accuracy=0.5,
        accuracy_strict=0.5,
        accuracy_flexible=0.75,
        latency_p50_s=0.01,
        latency_p95_s=0.02,
        latency_p99_s=0.03,
        time_to_first_block_s=0.004,
        throughput_items_per_s=80.0,
        batch_size=2,
        tokens_per_s=100.0,
        tokens_per_s_with_padding=400.0,
        tokens_per_forward=2.0,
        nfe=8.0,
        peak_mem_mb=300.0,
        errors=1,
        error_messages=["item 3: NonFiniteLogitsError: nan"],
        output_hash="f" * 64,
        dataset_hash="d" * 64,
        weights_sha256="w" * 64,
        fingerprint={"torch": "2.13", "threads": 2},
        valid=True,
        validation={"success": True, "failed": []},
        created_at="2026-11-30T10:00:00+00:00",
    )
    return EvalRecord(**(base | changes))


def test_json_round_trip_keeps_every_field():
    record = make_record()
    data = json.loads(json.dumps(record.to_dict()))
    assert data["record_id"] == record.record_id
    assert EvalRecord.from_dict(data) == record


def test_record_from_before_the_added_fields_still_loads():
    old = {
        k: v
        for k, v in make_record().to_dict().items()
        if k not in ("error_messages", "expected_items", "warmup", "sweep")
    }
    record = EvalRecord.from_dict(old)
    assert record.error_messages == [] and record.expected_items is None and record.sweep == ""


def test_missing_required_field_is_named():
    data = make_record().to_dict()
    del data["config_hash"]
    with pytest.raises(ValueError, match="config_hash"):
        EvalRecord.from_dict(data)


def test_record_id_names_what_was_measured_not_when():
    a, b = make_record(), make_record(created_at="2027-01-01", accuracy=0.9)
    assert a.record_id == b.record_id
    assert make_record(config_hash="other").record_id != a.record_id


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".jsonl"])
def test_store_round_trips_through_each_format(tmp_path, suffix):
    store = RecordStore(tmp_path / "out")
    records = [
        make_record(),
        make_record(
            candidate="tiny-ar",
            role="fallback",
            kind="autoregressive",
            accuracy_strict=None,
            time_to_first_block_s=None,
            valid=None,
            validation={},
            error_messages=[],
            errors=0,
        ),
    ]
    for r in records:
        store.add(r)
    loaded = load_records(tmp_path / "out" / f"records{suffix}")
    assert [r.to_dict() for r in loaded] == [r.to_dict() for r in records]


def test_store_writes_each_record_as_it_arrives(tmp_path):
    store = RecordStore(tmp_path)
    store.add(make_record(), {"success": True}, "<html></html>")
    assert len(load_records(tmp_path / "records.parquet")) == 1
    assert len(load_records(tmp_path / "records.csv")) == 1
    store.add(make_record(config_hash="second"))
    assert [r.config_hash for r in load_records(tmp_path)] == ["abc123", "second"]
    assert (tmp_path / "validation" / f"{make_record().record_id}.json").is_file()
    assert (tmp_path / "validation" / f"{make_record().record_id}.html").is_file()
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temporaries


def test_frame_has_flat_columns():
    frame = records_to_frame([make_record()])
    assert isinstance(frame.loc[0, "config"], str) and json.loads(frame.loc[0, "config"])["steps"] == 8
    assert records_from_frame(frame)[0] == make_record()


def test_evidence_types_serialise():
    r = ReproducibilityResult(
        candidate="x",
        reproducible=False,
        same_process=True,
        fresh_process=False,
        batch_invariant=True,
        differences=["fresh process gave hash ..."],
    )
    assert json.loads(json.dumps(r.to_dict()))["differences"] == ["fresh process gave hash ..."]
    assert LicenseResult(candidate="x", expression="MIT", tier="permitted").to_dict()["tier"] == "permitted"
