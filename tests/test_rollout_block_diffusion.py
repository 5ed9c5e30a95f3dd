"""A live canary rollout of the bundled DiffusionGemma candidate (tiny-dgemma) against the AR fallback (tiny-ar).

The steps of docs/rollout.md, on the real parts: a real MLflow SQLite registry (tiny-ar the fallback, tiny-dgemma at
staging with production's sign-offs and two approvals from two OS accounts), uvicorn serving `auto` through the
route's split, clients of the `openai` package as the load, and the rollout flow run by Prefect. The rollout walks
its steps on tiny-dgemma's answers and promotes it to production, and the canary gate then passes on that rollout.
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from gate_fixtures import evidence, fresh_registry, record
from serving_fixtures import OPERATING, digest, running_server, settings_for
from test_rollout import OK, STEPS_OK, Load, write_policy, write_routes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
MODEL = "tiny-dgemma"
# What an evaluation of tiny-dgemma records: its effective block config at gen_length 32 (one canvas, 16 steps).
BLOCK_OPERATING = {"max_new_tokens": 32, "max_denoising_steps": 16, "entropy_bound": 0.1, "t_min": 0.4, "t_max": 0.8,
                   "stability_threshold": 1, "confidence_threshold": 0.005, "eos_ids": [1], "pad_id": 0, "seed": 0}


@pytest.fixture(scope="module")
def stack(tmp_path_factory, prefect_harness):
    from checklists import load_checklist
    from registry import register_evidence, sign_off
    from registry.promotion import _move
    from tests.gate_fixtures import approve_as

    root = tmp_path_factory.mktemp("rollout-dgemma")
    home = root / "home"
    saved = {k: os.environ.get(k) for k in ("UNMASK_HOME", "MLFLOW_TRACKING_URI")}
    os.environ["UNMASK_HOME"] = str(home)
    reg = fresh_registry(root)
    os.environ["MLFLOW_TRACKING_URI"] = reg.tracking_uri
    sha = digest("tiny-ar")
    rec = record("tiny-ar", "arith", config=OPERATING["tiny-ar"], weights_sha256=sha)
    register_evidence(reg, evidence("tiny-ar", [rec], weights_sha256=sha, serving=[]))
    sha = digest(MODEL)
    rec = replace(record("tiny-llada", "arith"), candidate=MODEL, kind="block-diffusion", config=BLOCK_OPERATING,
                  weights_sha256=sha)
    # gate_fixtures' evidence is shaped on a diffusion candidate's; renamed to this one, with its own weights digest
    version, _ = register_evidence(reg, replace(evidence("tiny-llada", [rec], weights_sha256=sha, serving=[]),
                                                candidate=MODEL, kind="block-diffusion"))
    _move(reg, "staging", None, (MODEL, version), "fixture", "staging passed", {"kind": "promotion"})
    for item in load_checklist("production").manual_items():
        sign_off(reg, MODEL, version, "production", item, "ada", f"{item} checked for production")
    approve_as(reg, MODEL, version, "production", OK, "linus", "grace")  # two OS accounts: four eyes
    routes = write_routes(root / "serving.yaml", STEPS_OK)
    settings = replace(settings_for(reg.tracking_uri, names=("staging", "fallback"), log_dir=home / "serving" / "requests",
                                    poll_interval_s=0.2), routes_path=routes)
    with running_server(settings) as server:
        yield {"reg": reg, "version": version, "root": root, "server": server,
               "policy": write_policy(root / "policy.yaml")}
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def test_a_canary_of_tiny_dgemma_against_tiny_ar_walks_its_steps_and_promotes(stack, monkeypatch):
    from flows.rollout import plan_rollout, rollout_flow
    from flows.rollout_state import load_state, read_weights
    from gates import load_policy
    from gates.evaluate import evaluate_gates
    from registry import audit, load_evidence, stage_holder

    monkeypatch.setenv("UNMASK_HOME", str(stack["root"] / "home"))  # the server follows the overlay there
    reg, v = stack["reg"], stack["version"]
    # judged on the error rate: at this machine's few requests per second a p95 bound needs more answers per look
    rollout = STEPS_OK | {"interval_s": 6, "confidence": 0.8, "analysis": {"error_rate": {"max": 0.5}}}
    state = plan_rollout(MODEL, "default", "production", write_routes(stack["root"] / "steps.yaml", rollout),
                         str(stack["policy"]), server_url=stack["server"].base_url)
    with Load(stack["server"].base_url) as load:
        outcome = rollout_flow(state.id, flush_grace_s=2.5)
    assert outcome["status"] == "completed", outcome
    assert load.failed == 0 and "staging" in load.arms and "fallback" in load.arms  # both arms answered, no error
    done = load_state(state.id)
    assert [a["weight"] for a in done.analyses] == [50, 100] and all(a["verdict"] == "pass" for a in done.analyses)
    assert done.analyses[-1]["arms"]["staging"]["requests"] > 0  # tiny-dgemma's own answers were analysed
    assert stage_holder(reg, "production") == (MODEL, v)
    assert "default" not in read_weights()  # the route's own split serves again
    move = [e for e in audit.events(reg, stage="production", event=audit.MOVE) if e.status == "FINISHED"][-1]
    assert move.to_ref == f"{MODEL}@{v}" and state.id in move.comment and audit.verify(reg).ok
    canary = [r for r in evaluate_gates(load_evidence(reg, MODEL, v), load_policy(stack["policy"]), "production")
              if r.gate == "canary"]
    assert canary[0].passed and canary[0].evidence["rollout"] == state.id
