"""The flows for real (Prefect test harness, MLflow SQLite, tiny random-weight models, a 2-point sweep)."""

from __future__ import annotations

import pytest
import yaml
from prefect.artifacts import Artifact

from flows.evaluate import EvaluationOptions, evaluate_candidate
from flows.review import gate_review
from registry import Registry, load_evidence
from tests.support import REPO
from tests.support.flow_fixtures import (
    CANDIDATE,
    FALLBACK,
    broken_model,
    seed_registry,
    tiny_models,
    undecodable_model,
    write_policy,
    write_sweep,
)

NO_PROBE = EvaluationOptions(reproducibility=False)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny_models(tmp_path_factory.mktemp("flow_models"))


@pytest.fixture
def sweep(models, tmp_path):
    return write_sweep(tmp_path / "tiny.yaml", [models[FALLBACK], models[CANDIDATE]])


def result_files(home):
    return {p.name: p.stat().st_mtime_ns for p in (home / "results").glob("point-*")}


def test_evaluate_candidate_logs_judges_publishes_and_a_rerun_measures_nothing(
    prefect_harness, models, sweep, tmp_path, monkeypatch
):
    home = tmp_path / "home"
    monkeypatch.setenv("UNMASK_HOME", str(home))
    seed_registry(home)
    first = evaluate_candidate(models[CANDIDATE], sweep, EvaluationOptions(fresh_process_probe=False))
    assert (first["candidate"], first["points"], first["cached"], first["version"]) == (CANDIDATE, 2, 0, "1")
    assert set(first["verdicts"]) == {"poc", "staging", "production"}
    assert first["mlflow_run"].endswith(f"/runs/{first['evidence_run_id']}")
    files = result_files(home)
    assert len(files) == 2 and all((home / "results" / name).read_text().lstrip().startswith("{") for name in files)

    gates = Artifact.get(f"gates-{CANDIDATE}")
    summary = Artifact.get(f"evaluation-{CANDIDATE}")
    assert gates.type == "table" and "tooling_maturity" in gates.data
    assert first["evidence_run_id"] in summary.data and "mlflow ui --backend-store-uri sqlite:///" in summary.data

    again = evaluate_candidate(models[CANDIDATE], sweep, EvaluationOptions(fresh_process_probe=False))
    assert (again["points"], again["cached"], again["version"]) == (2, 2, "1")  # same weights: same version
    assert again["evidence_reused"] and again["evidence_run_id"] == first["evidence_run_id"]  # nothing re-logged
    assert result_files(home) == files  # nothing measured again, nothing rewritten
    assert Artifact.get(f"gates-{CANDIDATE}").id != gates.id  # the key's history grows

    remeasured = evaluate_candidate(models[CANDIDATE], sweep, NO_PROBE.model_copy(update={"remeasure": True}))
    assert remeasured["cached"] == 0


def test_gate_review_scores_the_models_and_a_broken_one_fails_alone(
    prefect_harness, models, sweep, tmp_path, monkeypatch
):
    monkeypatch.setenv("UNMASK_HOME", str(tmp_path / "home"))
    seed_registry(tmp_path / "home")
    broken = broken_model(tmp_path, models[CANDIDATE])
    options = NO_PROBE.model_copy(update={"policy": write_policy(tmp_path / "policy.yaml")})  # judged at gen_length 8
    undecodable = undecodable_model(tmp_path, models[CANDIDATE])
    review = gate_review([models[CANDIDATE], broken, undecodable, models[FALLBACK]], sweep, options)
    rows = {r["candidate"]: r for r in review["scorecard"]}
    assert list(rows) == [FALLBACK, CANDIDATE, broken, "undecodable"]  # the fallback first: candidates compare to it
    assert rows[broken]["qualifies"] == "failed" and "safetensors" in rows[broken]["reasons"][0].lower()
    assert rows["undecodable"]["qualifies"] in ("none", "failed")  # reported, and the others still complete
    undecodable = rows["undecodable"]  # invalid records fail data_validity; what they cannot judge is inconclusive
    assert any(r.startswith("data_validity:") and "invalid" in r for r in undecodable["reasons"]), undecodable
    assert any("error" in r for r in undecodable["reasons"] + undecodable["inconclusive"]), undecodable
    for name in (FALLBACK, CANDIDATE):
        assert rows[name]["version"] == "1" and rows[name]["qualifies"] == "none"  # no sign-offs yet
        assert any(r.startswith("tooling_maturity:") for r in rows[name]["reasons"])
        assert rows[name]["score"] is None and rows[name]["rank"] is None  # hard gates filter before scores rank
    assert "| " + broken + " |" in Artifact.get("gate-review-summary").data
    stored = load_evidence(Registry(review["tracking_uri"]), CANDIDATE, "1")  # timed in pairs with the fallback
    [speed] = stored.speed
    assert speed.baseline_model == FALLBACK and speed.rounds >= 2 and speed.ratio("p95") is not None
    assert not load_evidence(Registry(review["tracking_uri"]), FALLBACK, "1").speed  # the fallback has no baseline


def test_promotion_waits_for_a_typed_approval_and_nightly_rolls_back_a_regression(
    prefect_harness, models, sweep, tmp_path, monkeypatch, team_keys
):
    import threading
    import time

    from typer.testing import CliRunner

    from checklists import load_checklist
    from flows.nightly import nightly
    from flows.promote import promote_flow, waiting_promotions
    from gates import load_policy
    from registry import Registry, promote, sign_off, stage_holder
    from registry.read import audit_events
    from tests.support.flow_fixtures import cli_app
    from tests.support.gate_fixtures import act_as, approve_as

    monkeypatch.setenv("UNMASK_HOME", str(tmp_path / "home"))
    seed_registry(tmp_path / "home")
    loose = write_policy(tmp_path / "loose.yaml")
    options = EvaluationOptions(policy=loose, fresh_process_probe=False)
    review = gate_review(None, sweep, options)
    assert {r["candidate"]: r["qualifies"] for r in review["scorecard"]} == {FALLBACK: "none", CANDIDATE: "none"}
    registry = Registry()

    for stage in ("poc", "staging", "production"):
        for item in load_checklist(stage).manual_items():
            sign_off(registry, CANDIDATE, "1", stage, item, "ada", f"{item} checked for {stage}")

    # no approval within the timeout: the flow fails saying so, nothing moves
    timed_out = promote_flow(CANDIDATE, "poc", timeout_s=2, poll_interval_s=1, policy=loose, return_state=True)
    assert timed_out.is_failed() and "never resumed" in timed_out.message
    assert "no approval for dllm v1 to poc within 2 s" in Artifact.get(f"promotion-{CANDIDATE}-poc").data
    assert stage_holder(registry, "poc") is None

    # the paused flow resumes with `unmask approve`'s typed input and moves the alias
    outcome = {}
    thread = threading.Thread(
        target=lambda: outcome.update(promote_flow(CANDIDATE, "poc", timeout_s=120, poll_interval_s=1, policy=loose))
    )
    thread.start()
    deadline = time.monotonic() + 90
    while not waiting_promotions(CANDIDATE, "poc") and time.monotonic() < deadline:
        time.sleep(0.5)
    # the paused run said so in the registry: `unmask approve` asks Prefect only when one may be waiting
    assert registry.version_tags(CANDIDATE, "1")["unmask.waiting_flow.poc"] == str(
        waiting_promotions(CANDIDATE, "poc")[0].id
    )
    act_as("grace")  # grace approves from her own keys folder
    approved = CliRunner().invoke(
        cli_app("approve"), ["approve", CANDIDATE, "poc", "--by", "grace", "--comment", "PoC evidence reviewed"]
    )
    act_as(None)
    assert approved.exit_code == 0, approved.output
    thread.join(120)
    assert outcome["status"] == "promoted" and stage_holder(registry, "poc") == (CANDIDATE, "1")
    assert registry.version_tags(CANDIDATE, "1")["unmask.waiting_flow.poc"] == ""  # no longer waiting
    approvals = audit_events(model=CANDIDATE, event="approval", registry=registry)
    assert list(approvals["who"]) == ["grace"]

    for stage in ("staging", "production"):  # four eyes: approvers with listed keys of their own
        approve_as(
            registry,
            CANDIDATE,
            "1",
            stage,
            f"{stage} evidence reviewed, all green",
            *(("grace", "linus") if stage == "production" else ("grace",)),
        )
        promote(CANDIDATE, stage, policy=load_policy(loose), registry=registry)
    assert stage_holder(registry, "production") == (CANDIDATE, "1")

    # tonight the policy asks for more quality than production has: a finding, and back to the fallback
    strict = write_policy(tmp_path / "strict.yaml", quality=0.99)
    night = nightly(sweep, options.model_copy(update={"policy": strict}))
    assert night["status"] == "regression" and night["finding"]["rolled_back"]
    assert any(f["gate"] == "quality" for f in night["production"]["failed"])
    assert stage_holder(registry, "production") == (FALLBACK, "1")
    assert all(r["cached"].split("/")[0] == r["cached"].split("/")[1] for r in night["scorecard"])  # reused
    findings = audit_events(stage="production", event="gate_evaluation", registry=registry)
    assert findings["comment"].str.startswith("regression").any()
    assert "Regression" in Artifact.get("nightly-report").data


def promoted_to_production(reg, model: str, version: str) -> None:
    """`model` `version` holds production through a settled move that cites its evidence run, as promote leaves it."""
    from registry.promotion import _move

    run_id = reg.version_tags(model, version)["unmask.evidence_run"]
    _move(
        reg,
        "production",
        None,
        (model, version),
        "test",
        "production held",
        {"kind": "promotion", "evidence_run": run_id},
    )


def test_the_nightly_raises_its_sweep_to_the_evidence_production_was_promoted_on(tmp_path, monkeypatch, models):
    from evals.sweep import load_sweep
    from flows.nightly import EvidenceLevel, evidence_level, nightly_sweep
    from tests.support.gate_fixtures import evidence, fresh_registry, record, register_pair

    monkeypatch.setenv("UNMASK_HOME", str(tmp_path / "home"))
    reg = fresh_registry(tmp_path)
    _, v = register_pair(reg, evidence(records=[record(n_items=120), record(task="sort", n_items=150)]))
    assert evidence_level.fn(reg.tracking_uri) == EvidenceLevel(100, {})  # nobody holds production: the policy's floor
    promoted_to_production(reg, "tiny-llada", v)
    level = evidence_level.fn(reg.tracking_uri)
    assert level == EvidenceLevel(100, {"arith": 120, "sort": 150}) and level.items("infill") == 100
    thin = write_sweep(tmp_path / "thin.yaml", [models[FALLBACK], models[CANDIDATE]], n=16)
    raised = nightly_sweep(thin, level)
    assert raised != thin and raised.startswith(str(tmp_path / "home" / "sweeps"))
    assert [t.n for t in load_sweep(raised).tasks] == [120]  # arith: as many items as production was promoted on
    assert nightly_sweep(raised, level) == raised  # a sweep that asks enough is used as it is
    assert [t.n for t in load_sweep(thin).tasks] == [16]  # the user's file is untouched


def test_thinner_evidence_is_inconclusive_never_a_regression_and_rolls_nothing_back(tmp_path):
    from flows.nightly import evidence_level, judge_production, record_inconclusive
    from registry import register_evidence, stage_holder
    from registry.read import audit_events
    from tests.support.gate_fixtures import evidence, fresh_registry, record, register_pair

    reg = fresh_registry(tmp_path)
    _, v = register_pair(reg)  # 120 items per task
    promoted_to_production(reg, "tiny-llada", v)
    level = evidence_level.fn(reg.tracking_uri)
    # tonight the same weights were measured on 16 items a task: the default sweep
    assert register_evidence(reg, evidence(records=[record(n_items=16), record(task="sort", n_items=16)]))[0] == v
    verdict = judge_production.fn(reg.tracking_uri, None, level)
    assert verdict.thinner == (
        "arith measured on 16 items tonight, production needs 120",
        "sort measured on 16 items tonight, production needs 120",
    )
    assert [r.gate for r in verdict.inconclusive] == ["data_validity"]
    assert [r.gate for r in verdict.failed] == ["speedup"]  # too slow even so, but measured on thinner evidence
    assert [r.gate for r in verdict.unsigned] == ["tooling_maturity"]  # a sign-off, not a measurement
    assert not verdict.regressed and verdict.undecided  # so: no regression, nothing to roll back
    outcome = record_inconclusive.fn(verdict, reg.tracking_uri)
    assert outcome["rolled_back"] is False and "needs 84 more items on arith" in outcome["inconclusive"]
    assert stage_holder(reg, "production") == ("tiny-llada", v)
    noted = audit_events(stage="production", event="gate_evaluation", registry=reg).iloc[-1]
    assert noted["comment"].startswith("inconclusive: tonight's evidence cannot judge production, nothing rolled back")
    assert noted["evidence"]["kind"] == "inconclusive" and noted["evidence"]["thinner"] == list(verdict.thinner)
    # the same failure on evidence as strong as production's is a regression, as before
    register_evidence(reg, evidence(records=[record(n_items=130), record(task="sort", n_items=130)]))
    again = judge_production.fn(reg.tracking_uri, None, level)
    assert again.regressed and not again.undecided and not again.thinner


def test_a_nightly_on_a_thin_sweep_measures_enough_and_an_unsettled_gate_rolls_nothing_back(
    prefect_harness, models, tmp_path, monkeypatch, team_keys
):
    from flows.nightly import nightly
    from registry import Registry, sign_off, stage_holder
    from registry.read import audit_events

    monkeypatch.setenv("UNMASK_HOME", str(tmp_path / "home"))
    seed_registry(tmp_path / "home")
    loose = write_policy(tmp_path / "loose.yaml")
    options = EvaluationOptions(policy=loose, fresh_process_probe=False)  # no probe result would be inconclusive
    promoted_sweep = write_sweep(tmp_path / "four.yaml", [models[FALLBACK], models[CANDIDATE]], steps=(2,), n=4)
    gate_review(None, promoted_sweep, options)
    registry = Registry()
    promoted_to_production(registry, CANDIDATE, "1")
    sign_off(registry, CANDIDATE, "1", "production", "tooling-maturity", "ada", "tooling reviewed")

    thin = write_sweep(tmp_path / "two.yaml", [models[FALLBACK], models[CANDIDATE]], steps=(2,), n=2)
    night = nightly(thin, options)
    assert night["status"] == "ok", night["production"]
    assert night["evidence_level"]["tasks"] == {"arith": 4} and night["sweep"] != thin
    assert all(r["cached"] == "1/1" for r in night["scorecard"])  # the promoted points again, from the cache
    assert stage_holder(registry, "production") == (CANDIDATE, "1")

    # tonight's policy asks for a settled quality verdict that 4 items cannot give: inconclusive, not a regression
    data = yaml.safe_load(open(loose))
    data["stages"]["production"]["gates"]["quality"].update(threshold=0.2, require_settled=True)
    unsettled = tmp_path / "unsettled.yaml"
    unsettled.write_text(yaml.safe_dump(data))
    from typer.testing import CliRunner

    from tests.support.flow_fixtures import cli_app

    result = CliRunner().invoke(
        cli_app("nightly"), ["nightly", "run", "--sweep", thin, "--policy", str(unsettled)], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    assert "nightly: inconclusive" in result.output and "nothing rolled back: quality: needs" in result.output
    assert "measured at production's evidence level" in result.output and "BROKEN" not in result.output
    assert stage_holder(registry, "production") == (CANDIDATE, "1")
    assert "Inconclusive" in Artifact.get("nightly-report").data
    noted = audit_events(stage="production", event="gate_evaluation", registry=registry).iloc[-1]
    assert noted["comment"].startswith("inconclusive") and [g["gate"] for g in noted["evidence"]["inconclusive"]] == [
        "quality"
    ]


def test_the_nightly_deployment_and_prefect_yaml_agree_on_the_schedule():

    import yaml

    from flows.nightly import DEFAULT_CRON, nightly, nightly_deployment

    deployment = nightly_deployment()
    assert deployment.entrypoint == "flows/nightly.py:nightly" and deployment.name == "nightly"
    assert deployment.schedules[0].schedule.cron == DEFAULT_CRON
    spec = yaml.safe_load((REPO / "prefect.yaml").read_text())
    declared = {d["name"]: d for d in spec["deployments"]}
    assert declared["nightly"]["entrypoint"] == deployment.entrypoint and nightly.name == "nightly"
    assert declared["nightly"]["schedules"][0]["cron"] == DEFAULT_CRON


def test_only_models_that_pass_every_gate_of_the_stage_are_scored():
    from flows.review import passed_stage

    def outcome(*passed, error=None):
        gates = [{"gate": f"g{i}", "passed": p, "reason": ""} for i, p in enumerate(passed)]
        return {"error": error} if error else {"verdicts": {"poc": {"gates": gates}}}

    assert passed_stage(outcome(True, True), "poc")
    assert not passed_stage(outcome(True, False), "poc")
    assert not passed_stage(outcome(), "poc")  # judged on nothing is not a pass
    assert not passed_stage(outcome(error="RuntimeError: no weights"), "poc")
    assert not passed_stage(outcome(True, True), "staging")


def test_stage_verdicts_stay_typed_in_the_flow_and_become_plain_data_only_in_the_outcome():
    from flows.evaluate import gate_rows, summary_markdown
    from gates import STAGES, GateResult, load_policy
    from gates.decision import decide
    from gates.roles import parse_roles
    from gates.stages import qualified_stage
    from tests.support.gate_fixtures import evidence
    from tests.support.governance import bundled_with_keys, signed_signoffs, signers_of

    base = {"fallback": evidence("tiny-ar"), "production": None}
    roles, ada = parse_roles(bundled_with_keys(["ada"])), signers_of(["ada"])["ada"]  # past poc: signed acts only
    verdicts = {
        stage: decide(
            evidence(),
            load_policy(),
            stage,
            base,
            signed_signoffs(stage, ada, ("tooling-maturity",)),
            None,
            set(),
            roles=roles,
        )
        for stage in STAGES
    }
    assert qualified_stage(verdicts) == "staging"  # too slow for production: speedup 0.5x
    assert qualified_stage({"staging": verdicts["staging"]}) is None  # a stage counts only above a passed one
    rows = gate_rows(verdicts)
    assert len(rows) == sum(len(v.gate_results) for v in verdicts.values())
    assert {r["gate"] for r in rows if not r["passed"]} == {"speedup"} and all(r["record_id"] for r in rows)
    plain = {stage: v.to_dict() for stage, v in verdicts.items()}
    assert [GateResult.from_dict(g) for g in plain["production"]["gates"]] == list(verdicts["production"].gate_results)
    no_approval = "no approval recorded for production: an approver must sign off the promotion"
    assert no_approval in plain["production"]["blockers"]
    outcome = {
        "candidate": "tiny-llada",
        "version": "1",
        "qualified": "staging",
        "evidence_run_id": "abc",
        "mlflow_run": "http://127.0.0.1:5000/#/experiments/1/runs/abc",
        "tracking_uri": "sqlite:///x.db",
        "weights_sha256": "0" * 64,
        "points": 2,
        "cached": 0,
        "evidence_reused": False,
        "failures": [],
    }
    summary = summary_markdown(outcome, verdicts)
    assert "## production gates" in summary and "speedup over fallback 0.500x" in summary


def strict_probe_policy(tmp_path) -> str:
    """The loose test policy (judged at the tiny sweep's gen_length), but production requires the whole
    reproducibility probe (same process, fresh process, batch-invariant) and no error at all."""
    path = write_policy(tmp_path / "policy.yaml")
    policy = yaml.safe_load(open(path))
    policy["stages"]["production"]["gates"] |= {
        "reproducibility": {"require": ["same_process", "fresh_process", "batch_invariant"]},
        "error_rate": {"max_error_rate": 0.0},
    }
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    return path


# slow: loads transformers and decodes in a fresh process: about 20 s on two cores
def test_a_hugging_face_fallback_is_evaluated_probed_and_judged(prefect_harness, models, tmp_path, monkeypatch):
    from tests.support.eval_fixtures import hub_llama_copy

    home = tmp_path / "home"
    monkeypatch.setenv("UNMASK_HOME", str(home))
    seed_registry(home)
    hub = hub_llama_copy(models[FALLBACK], tmp_path / "hub-llama")
    sweep = write_sweep(tmp_path / "ar.yaml", [str(hub)])
    outcome = evaluate_candidate(str(hub), sweep, EvaluationOptions(policy=strict_probe_policy(tmp_path)))
    assert (outcome["candidate"], outcome["role"], outcome["kind"]) == ("hub-llama", "fallback", "autoregressive")
    assert outcome["failures"] == [] and outcome["points"] == 1
    gates = {g["gate"]: g for g in outcome["verdicts"]["production"]["gates"]}
    for name in ("reproducibility", "error_rate", "license", "data_validity"):  # the probe ran in a fresh process too
        assert gates[name]["passed"], gates[name]["reason"]


# slow: transformers' DiffusionGemma in this process and in a fresh one: about 20 s on two cores
def test_a_block_diffusion_candidate_is_evaluated_probed_and_judged(prefect_harness, tmp_path, monkeypatch):
    from tests.support.eval_fixtures import write_diffusion_gemma

    home = tmp_path / "home"
    monkeypatch.setenv("UNMASK_HOME", str(home))
    seed_registry(home)
    folder = write_diffusion_gemma(tmp_path / "dg")
    sweep = write_sweep(tmp_path / "dg.yaml", [str(folder)])
    outcome = evaluate_candidate(str(folder), sweep, EvaluationOptions(policy=strict_probe_policy(tmp_path)))
    assert (outcome["candidate"], outcome["role"], outcome["kind"]) == ("dg", "candidate", "block-diffusion")
    assert outcome["failures"] == [] and outcome["points"] == 2  # steps 2 and 8 of the tiny sweep
    gates = {g["gate"]: g for g in outcome["verdicts"]["production"]["gates"]}
    for name in ("error_rate", "license", "data_validity"):
        assert gates[name]["passed"], gates[name]["reason"]
    # Seeded block sampling repeats in this process and in a fresh one, and in a batch as `unmask serve` forms
    # it (each row its own generator, its positions counted from its first token) as alone (issue 51, item 2).
    repro = gates["reproducibility"]
    assert repro["value"] == {"same_process": True, "fresh_process": True, "batch_invariant": True}
    assert repro["passed"], repro["reason"]
