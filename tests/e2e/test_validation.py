"""Great Expectations suites (real GX 1.x, ephemeral context) for task data and eval records."""

from __future__ import annotations

import pytest

from evals.evaluate import load_task
from evals.records import EvalRecord
from evals.tasks import TaskItem
from evals.validation import TaskDataError, check_task, validate_record, validate_task


def good_record(**changes) -> EvalRecord:
    base = dict(
        candidate="tiny-llada",
        role="candidate",
        kind="masked-diffusion",
        task="arith",
        split="test",
        config={"steps": 16, "gen_length": 32},
        config_hash="abc",
        gen_length=32,
        n_items=8,
        expected_items=8,
        accuracy=0.5,
        accuracy_strict=0.5,
        accuracy_flexible=0.6,
        latency_p50_s=0.01,
        latency_p95_s=0.02,
        latency_p99_s=0.03,
        tokens_per_s=10.0,
        tokens_per_forward=2.0,
        nfe=16.0,
        peak_mem_mb=100.0,
        output_hash="h",
        dataset_hash="d",
        weights_sha256="w",
    )
    return EvalRecord(**(base | changes))


def failed(record: EvalRecord) -> set[tuple[str, str]]:
    return {
        (f["expectation"], str(f["kwargs"].get("column") or f["kwargs"].get("column_A")))
        for f in record.validation["failed"]
    }


def test_a_good_record_is_valid_and_keeps_its_result():
    record = good_record()
    outcome = validate_record(record)
    assert record.valid is True and record.validation["success"] and record.validation["failed"] == []
    assert record.validation["evaluated"] > 20 and "great_expectations" in record.validation["engine"]
    assert outcome.result["success"] is True and "results" in outcome.result
    assert "<html" in outcome.html.lower()  # the Data Docs page kept with the record


def test_records_validated_on_several_threads_at_once_are_judged_as_alone():
    """A Dask executor runs cells on threads of one process, and each validates its record at the end: the process's
    one GX context (its suite, asset and batch definition, deleted and added again per call) was shared unguarded,
    and a full run once marked a good record invalid ("validation could not run: An error occurred while trying to
    s..."). Good and bad records on eight threads, released together, each get the verdict they get alone."""
    import threading

    records = [good_record() if i % 2 else good_record(accuracy=1.5) for i in range(8)]
    alone = [validate_record(good_record()).success, validate_record(good_record(accuracy=1.5)).success]
    start, errors = threading.Barrier(len(records)), []

    def judge(record: EvalRecord) -> None:
        start.wait()
        try:
            validate_record(record, html=False)
        except Exception as e:  # a crash is a finding too: it is reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=judge, args=(r,)) for r in records]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == [] and alone == [True, False]
    assert [r.valid for r in records] == [bool(i % 2) for i in range(8)], [r.validation for r in records]
    assert all("error" not in r.validation for r in records), [r.validation.get("error") for r in records]


BAD = [
    ({"accuracy": 1.5}, ("expect_column_values_to_be_between", "accuracy")),
    ({"accuracy_flexible": -0.1}, ("expect_column_values_to_be_between", "accuracy_flexible")),
    ({"latency_p50_s": 0.0}, ("expect_column_values_to_be_between", "latency_p50_s")),
    ({"latency_p95_s": 0.005}, ("expect_column_pair_values_a_to_be_greater_than_b", "latency_p95_s")),
    ({"latency_p99_s": 0.015}, ("expect_column_pair_values_a_to_be_greater_than_b", "latency_p99_s")),
    ({"nfe": 17.0}, ("expect_column_pair_values_a_to_be_greater_than_b", "nfe_max")),
    ({"nfe": 0.0}, ("expect_column_values_to_be_between", "nfe")),
    ({"n_items": 7}, ("expect_column_pair_values_to_be_equal", "n_items")),
    ({"expected_items": None}, ("expect_column_values_to_not_be_null", "expected_items")),
    ({"output_hash": None}, ("expect_column_values_to_not_be_null", "output_hash")),
]


@pytest.mark.parametrize("change,expectation", BAD, ids=[b[1][1] + "-" + str(list(b[0].values())[0]) for b in BAD])
def test_each_broken_rule_marks_the_record_invalid(change, expectation):
    record = good_record(**change)
    validate_record(record)
    assert record.valid is False
    assert expectation in failed(record)


def test_nfe_bounds_follow_the_decoder():
    ar = good_record(kind="autoregressive", config={"gen_length": 32, "steps": 32}, nfe=33.0)
    validate_record(ar, html=False)
    assert ar.valid is True  # prompt prefill + one call per token
    speculative = good_record(config={"steps": 16, "gen_length": 32, "speculative_draft": 4}, nfe=20.0)
    validate_record(speculative, html=False)
    assert speculative.valid is True


def test_generated_task_data_passes():
    task = load_task("arith", n=12)
    outcome = check_task(task, expected_size=12)
    assert outcome.success and outcome.summary()["evaluated"] >= 6


def item(key: str, prompt: str = "What is 1+1?", answer: str = "1+1=2\n#### 2", split: str = "test") -> TaskItem:
    return TaskItem(task="arith", prompt=prompt, answer=answer, target="2", key=key, split=split)


TASK_BAD = [
    ([item("a"), item("a")], None, "expect_column_values_to_be_unique"),
    ([item("a"), item("b", prompt="   ")], None, "expect_column_values_to_match_regex"),
    ([item("a"), item("b", answer="the answer is two")], None, "expect_column_values_to_match_regex"),
    ([item("a"), item("b")], 3, "expect_table_row_count_to_equal"),
    ([item("a"), item("b", split="train")], None, "expect_column_values_to_be_in_set"),
    ([item("a"), item("leaked")], None, "expect_column_values_to_not_be_in_set"),
]


@pytest.mark.parametrize("items,size,expectation", TASK_BAD, ids=[t[2] + str(i) for i, t in enumerate(TASK_BAD)])
def test_bad_task_data_fails_with_the_expectation_named(items, size, expectation):
    task = load_task("arith", n=2)
    task.items, task.train_keys = items, {"leaked", "x"}
    outcome = validate_task(task, expected_size=size)
    assert not outcome.success
    assert expectation in {f["expectation"] for f in outcome.failed}
    with pytest.raises(TaskDataError, match=expectation):
        check_task(task, expected_size=size)


def test_a_task_split_validated_once_is_read_back_by_content_without_great_expectations(tmp_path):
    import subprocess
    import sys

    task = load_task("arith", n=12)
    first = check_task(task, expected_size=12, cache=tmp_path)
    assert len(list(tmp_path.glob("task-*.json"))) == 1
    code = (
        "import sys; from pathlib import Path; from evals.evaluate import load_task; "
        "from evals.validation import check_task; "
        "o = check_task(load_task('arith', n=12), expected_size=12, cache=Path(sys.argv[1])); "
        "print(o.success, o.summary()['evaluated'], 'great_expectations' in sys.modules)"
    )
    again = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert again.stdout.split() == ["True", str(first.summary()["evaluated"]), "False"], again.stderr[-2000:]
    task.items = task.items[:-1] + [task.items[0]]  # new content: validated afresh, and it fails
    with pytest.raises(TaskDataError, match="expect_column_values_to_be_unique"):
        check_task(task, expected_size=12, cache=tmp_path)
    assert len(list(tmp_path.glob("task-*.json"))) == 2
    with pytest.raises(TaskDataError, match="expect_column_values_to_be_unique"):  # a kept failure still fails
        check_task(task, expected_size=12, cache=tmp_path)
