"""The reads behind the dashboard's verdict: score intervals from the accuracy's sampling noise, the policy
each stored verdict was judged under, and a promotion decision judged without writing anything."""

from __future__ import annotations

import pytest
import yaml

import registry.read as read
from evals.intervals import wilson_interval
from gates.policy import POLICY_PATH, load_policy
from registry import judge
from tests.support.gate_fixtures import evidence, fast_llada, fresh_registry, record, register_pair


def test_a_score_interval_spans_the_score_and_narrows_with_more_items():
    stage = load_policy().stage("poc")

    def pair(n: int) -> list:
        return [evidence("tiny-ar", [record("tiny-ar", n_items=n)]), evidence("tiny-llada", [record(n_items=n)])]

    wide, narrow = pair(20), pair(20000)
    spans = {}
    for name, candidates in (("wide", wide), ("narrow", narrow)):
        got = read.score_intervals(candidates, ["tiny-ar", "tiny-llada"], stage).set_index("candidate")
        llada = got.loc["tiny-llada"]
        low, high = wilson_interval(0.72, int(llada.n_items))
        assert (llada.quality_low, llada.quality_high) == pytest.approx((low, high))
        assert llada.topsis_low <= llada.topsis_high and llada.weighted_sum_low <= llada.weighted_sum_high
        spans[name] = llada.topsis_high - llada.topsis_low
    # min-max normalised, two versions score 0 or 1 on quality: only an interval reaching past the other one
    # (0.70) moves the score, as 20 items do and 20000 do not
    assert spans["narrow"] == 0 < spans["wide"]


def test_a_lone_candidate_scores_1_whatever_its_accuracy_and_the_unranked_get_no_interval():
    stage = load_policy().stage("poc")
    got = read.score_intervals([evidence(), evidence("tiny-ar")], ["tiny-llada"], stage)
    assert list(got.candidate) == ["tiny-llada"]
    assert (got.topsis_low.iloc[0], got.topsis_high.iloc[0]) == (1.0, 1.0)


def test_scores_come_with_their_intervals(tmp_path):
    reg = fresh_registry(tmp_path)
    register_pair(reg, fast_llada())
    scored = read.scores("poc", registry=reg)
    assert set(scored["intervals"].candidate) == set(scored["ranking"].candidate)
    for row, iv in zip(
        scored["ranking"].itertuples(),
        scored["intervals"].set_index("candidate").loc[scored["ranking"].candidate].itertuples(),
    ):
        assert iv.topsis_low - 1e-12 <= row.topsis <= iv.topsis_high + 1e-12


def test_judged_policies_name_the_file_and_sha256_of_each_stored_verdict(tmp_path):
    reg = fresh_registry(tmp_path)
    _, v = register_pair(reg)
    strict = yaml.safe_load(POLICY_PATH.read_text())
    strict["stages"]["staging"]["gates"]["quality"]["threshold"] = 0.99
    strict_path = tmp_path / "strict.yaml"
    strict_path.write_text(yaml.safe_dump(strict))
    judge(reg, "tiny-llada", v, "poc")
    judge(reg, "tiny-llada", v, "staging", load_policy(strict_path))
    judged = read.judged_policies(reg).set_index("stage")
    assert judged.loc["poc", "policy_path"] == str(POLICY_PATH.resolve())
    assert judged.loc["poc", "policy_sha256"] == load_policy().sha256
    assert judged.loc["staging", "policy_path"] == str(strict_path.resolve())
    assert judged.loc["staging", "policy_sha256"] == load_policy(strict_path).sha256 != load_policy().sha256
    results = read.gate_results("tiny-llada", v, registry=reg)  # the same, on every gate row, with its verdict
    assert set(results[results.stage == "staging"].policy_sha256) == {load_policy(strict_path).sha256}
    assert set(results.verdict) <= {"pass", "fail"} and list(results.verdict == "pass") == list(results.passed)


def test_a_promotion_decision_is_judged_afresh_and_recorded_nowhere(tmp_path):
    reg = fresh_registry(tmp_path)
    _, v = register_pair(reg)
    before = (reg.version_tags("tiny-llada", v), len(read.audit_events(registry=reg)))
    decision = read.promotion_decision("tiny-llada", v, "poc", registry=reg)
    assert decision.stage == "poc" and decision.gate_results and not decision.allowed  # no sign-off, no approval
    assert (reg.version_tags("tiny-llada", v), len(read.audit_events(registry=reg))) == before


def test_a_promotion_decision_on_tampered_evidence_is_none_and_writes_no_finding(tmp_path):
    from tests.support.forgery import forge_records

    reg = fresh_registry(tmp_path)
    _, v = register_pair(reg)
    forge_records(reg, "tiny-llada", v)
    before = len(read.audit_events(registry=reg))
    assert read.promotion_decision("tiny-llada", v, "poc", registry=reg) is None
    assert len(read.audit_events(registry=reg)) == before
