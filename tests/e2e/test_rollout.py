"""The rollout controller on loopback: a real `unmask serve` (uvicorn in a thread) over a real SQLite registry,
real `openai` client load, the Prefect flow, the weights overlay and the request log, in short intervals.

tiny-llada holds `staging` (the candidate arm), nobody holds production, so the baseline arm is `fallback`
(tiny-ar). The tests run in file order on one registry: a breach rolls back, too little traffic pauses (resume
continues, abort rolls back), and a controller killed mid-rollout resumes and completes the promotion.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC

import pytest
import yaml

from tests.support import REPO
from tests.support.gate_fixtures import OK
from tests.support.rollout_fixtures import STEPS_OK, Load, write_policy, write_routes
from tests.support.serving_fixtures import OPERATING, digest, running_server, settings_for

pytestmark = pytest.mark.timeout(600)


def approve_production(reg, version: str) -> None:
    from tests.support.gate_fixtures import approve_as

    approve_as(reg, "tiny-llada", version, "production", OK, "linus", "grace")  # two listed keys: four eyes


@pytest.fixture(scope="module")
def stack(tmp_path_factory, prefect_harness):
    """Registry (tiny-ar fallback, tiny-llada at staging with production's sign-offs and two approvals), the
    state folder, and a server routing `auto` with the weights overlay followed every 0.2 s."""
    from checklists import load_checklist
    from registry import register_evidence, sign_off
    from registry.promotion import _move
    from tests.support.gate_fixtures import evidence, fresh_registry, record
    from tests.support.governance import team_environment

    root = tmp_path_factory.mktemp("rollout")
    home = root / "home"
    team = team_environment(root)  # production counts only acts signed by listed keys
    saved = {k: os.environ.get(k) for k in ("UNMASK_HOME", "MLFLOW_TRACKING_URI", *team)}
    os.environ["UNMASK_HOME"] = str(home)
    os.environ.update(team)
    reg = fresh_registry(root)
    os.environ["MLFLOW_TRACKING_URI"] = reg.tracking_uri
    versions, recs = {}, {}
    for name in ("tiny-ar", "tiny-llada"):
        sha = digest(name)
        recs[name] = rec = record(name, "arith", config=OPERATING[name], weights_sha256=sha)
        ev = evidence(name, [rec], weights_sha256=sha, serving=[], fallback=recs["tiny-ar"])
        versions[name], _ = register_evidence(reg, ev)
    v = versions["tiny-llada"]
    _move(reg, "staging", None, ("tiny-llada", v), "fixture", "staging passed", {"kind": "promotion"})
    for item in load_checklist("production").manual_items():
        sign_off(reg, "tiny-llada", v, "production", item, "ada", f"{item} checked for production")
    approve_production(reg, v)
    routes = write_routes(root / "serving.yaml", STEPS_OK)
    settings = replace(
        settings_for(
            reg.tracking_uri, names=("staging", "fallback"), log_dir=home / "serving" / "requests", poll_interval_s=0.2
        ),
        routes_path=routes,
    )
    with running_server(settings) as server:
        yield {
            "reg": reg,
            "version": v,
            "root": root,
            "home": home,
            "server": server,
            "policy": write_policy(root / "policy.yaml"),
            "prefect": prefect_harness,
            "team": team,
        }
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def stack_home(stack, monkeypatch):
    """The stack's state folder for this test too (conftest gives every test its own): the server follows the
    overlay there and logs its requests there."""
    monkeypatch.setenv("UNMASK_HOME", str(stack["home"]))
    for key, value in stack["team"].items():  # and its people's keys
        monkeypatch.setenv(key, value)
    return stack


def ensure_approved(stack) -> None:
    """Two open approvals of production (a failed or aborted rollout voids them: each test after one approves)."""
    from registry.approvals import approvals_of

    if not [a for a in approvals_of(stack["reg"], "tiny-llada", stack["version"], "production") if a.status == "open"]:
        approve_production(stack["reg"], stack["version"])


def start(stack, name: str, rollout: dict):
    from flows.rollout import plan_rollout

    ensure_approved(stack)
    return plan_rollout(
        "tiny-llada",
        "default",
        "production",
        write_routes(stack["root"] / f"{name}.yaml", rollout),
        str(stack["policy"]),
    )


def test_a_breached_p95_rolls_back_within_the_interval_and_is_audited(stack_home):
    stack = stack_home
    from flows.rollout import rollout_flow
    from flows.rollout_state import load_state, read_weights
    from registry import audit, stage_holder
    from registry.rollouts import analyses, rollouts

    reg = stack["reg"]
    breach = STEPS_OK | {"interval_s": 4, "analysis": {"p95_latency_s": {"max": 0.0001}}}  # no answer is that fast
    state = start(stack, "breach", breach)
    with Load(stack["server"].base_url) as load:
        outcome = rollout_flow(state.id, flush_grace_s=2.5)
    assert outcome["status"] == "rolled_back", outcome
    assert load.failed == 0 and "staging" in load.arms  # the candidate served, and no client saw an error
    assert read_weights()["default"] == {"staging": 0, "fallback": 100}
    after = load_state(state.id)
    assert after.status == "rolled_back" and after.step_index == 0 and len(after.analyses) == 1  # the first interval
    assert stage_holder(reg, "production") is None  # nothing moved
    [entry] = audit.events(reg, event="rollout_rollback")
    assert entry.evidence["rollout"] == state.id and entry.evidence["analysis"]["verdict"] == "fail"
    assert "p95_latency_s" in entry.comment and audit.verify(reg).ok
    [step] = [e for e in audit.events(reg, event="rollout_step") if e.evidence["rollout"] == state.id]  # events out
    assert (step.evidence["verdict"], step.evidence["step"], step.seq) == ("fail", 0, entry.seq - 1), step
    assert step.evidence["analysis_run"] == after.analyses[0]["run_id"] and "p95_latency_s" in step.comment
    from registry.views import regression_findings

    finding = regression_findings(reg).iloc[0]  # a finding, beside the nightly's
    assert finding["failed_gates"] == ["p95_latency_s"] and state.id in finding["action"]
    [record] = [r for r in rollouts(reg, "tiny-llada") if r.id == state.id]
    assert record.status == "rolled_back"
    assert [a.verdict for a in analyses(reg, state.id)] == ["fail"]
    # consequences: the approvals given for the rollout are void (audited, citing it) ...
    voided = [e for e in audit.events(reg, event="approval_void") if state.id in e.comment]
    assert len(voided) == 2 and {e.evidence["approved_by"] for e in voided} == {"linus", "grace"}
    # ... `unmask gates` fails citing the rollout, and a new rollout needs new approvals
    from typer.testing import CliRunner

    from flows.rollout import RolloutRefused
    from tests.support.fuzz_fixtures import unmask_app

    shown = CliRunner().invoke(
        unmask_app(),
        ["gates", "tiny-llada", "--stage", "production", "--policy", str(stack["policy"])],
        env={"COLUMNS": "250"},
    )
    assert "-> production: blocked" in shown.output and state.id in shown.output, shown.output
    assert shown.exit_code == 1  # the exit code is the decision
    assert "rolled back by its canary analysis" in shown.output and "put the previous" not in shown.output
    from flows.rollout import plan_rollout

    with pytest.raises(RolloutRefused, match="approval"):
        plan_rollout(
            "tiny-llada",
            "default",
            "production",
            write_routes(stack["root"] / "again.yaml", STEPS_OK),
            str(stack["policy"]),
        )
    from gates import load_policy
    from registry import judge

    verdict = judge(reg, "tiny-llada", stack["version"], "production", load_policy(stack["policy"]), record=False)
    assert not verdict.allowed and any(state.id in r.text for r in verdict.reasons)


@contextmanager
def drill(stack, faults: dict):
    """The server's own routes file with drill faults on the candidate arm (`staging`), live; restored after."""
    import httpx

    path = stack["root"] / "serving.yaml"
    plain = path.read_text()
    data = yaml.safe_load(plain) | {
        "arms": {"staging": {"alias": "staging", "faults": faults}},
        "health": {"failures": 3, "cooldown_s": 0.5},
    }
    url = stack["server"].base_url + "/v1/unmask/routes"

    def shown() -> dict | None:
        return httpx.get(url).json()["arms"].get("staging", {}).get("faults")

    def until(check) -> None:
        end = time.monotonic() + 20
        while not check() and time.monotonic() < end:
            time.sleep(0.1)
        assert check(), httpx.get(url).json()

    path.write_text(yaml.safe_dump(data, sort_keys=False))
    until(lambda: shown() and all(shown()[k] == v for k, v in faults.items()))
    try:
        yield
    finally:
        path.write_text(plain)
        until(lambda: not shown())
        time.sleep(0.6)  # past the cooldown: the next request to staging is its probe, and it succeeds


def rolled_back_by(stack, state, metric: str) -> dict:
    from flows.rollout_state import load_state, read_weights
    from registry import audit, stage_holder

    reg = stack["reg"]
    after = load_state(state.id)
    assert after.status == "rolled_back" and after.step_index == 0 and len(after.analyses) == 1  # the first interval
    assert read_weights()["default"] == {"staging": 0, "fallback": 100}
    assert stage_holder(reg, "production") is None  # nothing moved
    entry = next(e for e in audit.events(reg, event="rollout_rollback") if e.evidence["rollout"] == state.id)
    assert metric in entry.comment and audit.verify(reg).ok
    return after.analyses[0]


def test_a_slowed_candidate_breaches_p95_and_is_rolled_back_within_the_interval(stack_home):
    from flows.rollout import rollout_flow

    stack = stack_home
    slow = STEPS_OK | {"interval_s": 5, "analysis": {"p95_latency_s": {"max": 0.4}}}
    with drill(stack, {"delay_s": 0.6}):  # an injected latency regression: every candidate answer >= 0.6 s
        state = start(stack, "slowed", slow)
        with Load(stack["server"].base_url) as load:
            outcome = rollout_flow(state.id, flush_grace_s=2.5)
    assert outcome["status"] == "rolled_back", outcome
    assert load.failed == 0 and "staging" in load.arms  # slow, not failing: the candidate answered
    analysis = rolled_back_by(stack, state, "p95_latency_s")
    assert analysis["verdict"] == "fail" and analysis["arms"]["staging"]["p95_s"] >= 0.6


def test_a_failing_candidate_is_answered_by_the_fallback_and_rolled_back(stack_home):
    from flows.rollout import rollout_flow

    stack = stack_home
    failing = STEPS_OK | {"interval_s": 4, "analysis": {"p95_latency_s": {"max": 60.0}, "error_rate": {"max": 0.05}}}
    with drill(stack, {"abort_share": 100}):  # every candidate attempt raises: the fallback answers each
        state = start(stack, "failing", failing)
        with Load(stack["server"].base_url) as load:
            outcome = rollout_flow(state.id, flush_grace_s=2.5)
    assert outcome["status"] == "rolled_back", outcome
    assert load.failed == 0 and "staging" not in load.arms  # 0 failed client requests: every answer is tiny-ar's
    analysis = rolled_back_by(stack, state, "error_rate")
    assert analysis["arms"]["staging"]["error_rate"] == 1.0 and analysis["arms"]["staging"]["requests"] >= 3


def test_too_little_traffic_pauses_resume_continues_and_abort_rolls_back(stack_home):
    stack = stack_home
    from flows.rollout import abort_rollout, prepare_resume, rollout_flow
    from flows.rollout_state import load_state, read_weights
    from registry import audit, stage_holder

    reg = stack["reg"]
    state = start(stack, "quiet", STEPS_OK | {"min_requests": 1000})  # no load: never enough
    outcome = rollout_flow(state.id, flush_grace_s=0.5)
    assert outcome["status"] == "paused" and f"unmask rollout resume {state.id}" in outcome["message"]
    assert "no requests at all on the route in the interval" in outcome["message"]  # not "0 routed to staging"
    assert "1000 needed on staging" in outcome["message"]
    paused = load_state(state.id)
    assert paused.status == "paused" and paused.step_index == 0 and stage_holder(reg, "production") is None
    assert read_weights()["default"] == {"staging": 50, "fallback": 50}  # nothing moved: the step holds
    from typer.testing import CliRunner

    from tests.support.fuzz_fixtures import unmask_app

    shown = CliRunner().invoke(unmask_app(), ["rollout", "status", state.id], env={"COLUMNS": "250"})
    assert shown.exit_code == 0 and state.id in shown.output and "paused" in shown.output and "1/2" in shown.output
    from flows.rollout import RolloutRefused

    with pytest.raises(RolloutRefused, match="one rollout per route"):
        start(stack, "second", STEPS_OK)
    prepare_resume(state.id)
    assert rollout_flow(state.id, flush_grace_s=0.5)["status"] == "paused"
    resumed = load_state(state.id)
    assert resumed.step_index == 0 and len(resumed.analyses) == 2  # the same step, judged again
    assert [e["what"] for e in resumed.events].count("resumed") == 1
    result = abort_rollout(state.id, "not enough traffic today")
    assert result["status"] == "aborted" and load_state(state.id).status == "aborted"
    assert read_weights()["default"] == {"staging": 0, "fallback": 100}
    [entry] = audit.events(reg, event="rollout_abort")
    assert entry.evidence["rollout"] == state.id and "not enough traffic today" in entry.comment
    # issue 51, item 15: the status says the weight the route gives the candidate now, not its last step's
    row = next(
        line
        for line in CliRunner()
        .invoke(unmask_app(), ["rollout", "status", state.id], env={"COLUMNS": "250"})
        .output.splitlines()
        if state.id in line
    )
    assert "aborted" in row and "0% (was 50%)" in row, row
    from registry.identity import current_actor

    assert entry.who == current_actor(reg.tracking_uri).name


def test_abort_stops_a_running_controller_in_its_interval(stack_home):
    from flows.rollout import abort_rollout, rollout_flow
    from flows.rollout_state import load_state, read_weights

    stack = stack_home
    state = start(stack, "long", STEPS_OK | {"interval_s": 120})
    outcome = {}
    controller = threading.Thread(target=lambda: outcome.update(rollout_flow(state.id, flush_grace_s=0.5)))
    controller.start()
    deadline = time.monotonic() + 60
    while load_state(state.id).weight != 50 and time.monotonic() < deadline:
        time.sleep(0.1)
    result = abort_rollout(state.id, "changed our mind", wait_s=60)  # less than the interval: refused if it waited
    controller.join(60)
    assert not controller.is_alive() and not load_state(state.id).analyses  # it stopped inside its interval
    assert outcome["status"] == "aborting" and result["status"] == "aborted"
    assert load_state(state.id).status == "aborted" and read_weights()["default"] == {"staging": 0, "fallback": 100}


def test_a_server_that_does_not_serve_the_candidate_is_refused_before_any_traffic_moves(stack_home):
    from flows.rollout import RolloutRefused, plan_rollout
    from flows.rollout_state import all_states, read_weights
    from tests.support.servers import free_port

    stack = stack_home
    ensure_approved(stack)  # refused for the server alone, not for approvals an earlier rollback voided
    routes = write_routes(stack["root"] / "preflight.yaml", STEPS_OK)
    before, overlay = len(all_states()), read_weights()
    settings = replace(settings_for(stack["reg"].tracking_uri, names=("fallback",)), routes_path=routes)
    with running_server(settings) as fallback_only:  # a live server that does not serve `staging`
        with pytest.raises(RolloutRefused) as refused:
            plan_rollout(
                "tiny-llada", "default", "production", routes, str(stack["policy"]), server_url=fallback_only.base_url
            )
    assert "does not serve the `staging` alias of arm staging" in str(refused.value)
    assert "--alias staging" in str(refused.value) and "\n" not in str(refused.value)
    with pytest.raises(RolloutRefused, match="no server answers at http://127.0.0.1:"):
        plan_rollout(
            "tiny-llada",
            "default",
            "production",
            routes,
            str(stack["policy"]),
            server_url=f"http://127.0.0.1:{free_port()}",
        )
    assert len(all_states()) == before and read_weights() == overlay  # nothing recorded, no traffic moved
    served = plan_rollout(
        "tiny-llada", "default", "production", routes, str(stack["policy"]), server_url=stack["server"].base_url
    )  # the stack's server serves both: accepted
    from flows.rollout import abort_rollout

    abort_rollout(served.id, "preflight test only")


def test_a_candidate_answering_fast_and_wrong_is_rolled_back_on_its_probe_accuracy(stack_home):
    """The corrupt drill: status 200, fast, every candidate answer garbled; probes with known answers catch it
    while latency and the error rate stay within their bounds."""
    from flows.rollout import rollout_flow
    from flows.rollout_state import load_state

    stack = stack_home
    # the fallback (tiny-ar) answers these held-out arith probes right; 0 of 6 right shows < 50% at 97%. The
    # probes are the route's traffic here (routed requests like any other, in the request log): on two shared
    # cores a second load would leave too few answers in the interval
    quality = STEPS_OK | {
        "interval_s": 30,
        "probes": {"task": "arith", "per_s": 5},
        "analysis": {"p95_latency_s": {"max": 60.0}, "error_rate": {"max": 0.5}, "probe_accuracy": {"min": 0.5}},
    }
    with drill(stack, {"corrupt_share": 100}):
        state = plan_rollout_on(stack, "corrupt", quality)
        try:
            outcome = rollout_flow(state.id, flush_grace_s=2.5)
        finally:
            if load_state(state.id).active:  # never leave the route busy for the tests after this one
                from flows.rollout import abort_rollout

                abort_rollout(state.id, "test cleanup")
    assert outcome["status"] == "rolled_back", outcome["message"]
    import httpx  # `unmask serve` answers the analysis endpoint too, under its own routes file's policy

    seen = httpx.get(
        stack["server"].base_url + "/v1/unmask/analysis",
        timeout=30,
        params={"route": "default", "candidate": "staging", "baseline": "fallback", "window_s": 120},
    )
    assert seen.status_code == 200 and seen.json()["verdict"] in ("pass", "fail", "inconclusive"), seen.text
    assert [m["name"] for m in seen.json()["metrics"]] == ["p95_latency_s", "error_rate"]
    analysis = rolled_back_by(stack, state, "probe_accuracy")
    verdicts = {m["metric"]: m for m in analysis["metrics"]}
    assert verdicts["probe_accuracy"]["verdict"] == "fail", verdicts
    assert verdicts["p95_latency_s"]["verdict"] != "fail" and verdicts["error_rate"]["verdict"] != "fail"
    arms = analysis["arms"]
    assert arms["staging"]["probe_accuracy"] == 0.0 and arms["staging"]["probes"] >= 5
    assert arms["staging"]["error_rate"] == 0.0 and arms["staging"]["requests"] >= 6  # answered, status 200
    print(
        "corrupt drill:",
        {k: (v["verdict"], v["value"], v["interval"]) for k, v in verdicts.items()},
        "fallback probe accuracy",
        arms["fallback"]["probe_accuracy"],
        "probes",
        arms["fallback"]["probes"],
    )
    assert load_state(state.id).server_url == stack["server"].base_url


def plan_rollout_on(stack, name: str, rollout: dict):
    """`start`, with the stack's server given: preflight checked, probes sent there."""
    from flows.rollout import plan_rollout

    ensure_approved(stack)
    return plan_rollout(
        "tiny-llada",
        "default",
        "production",
        write_routes(stack["root"] / f"{name}.yaml", rollout),
        str(stack["policy"]),
        server_url=stack["server"].base_url,
    )


def test_a_killed_controller_resumes_at_its_step_and_the_rollout_promotes(stack_home):
    stack = stack_home
    from datetime import datetime

    from flows.rollout import prepare_resume, rollout_flow
    from flows.rollout_state import load_state, read_weights, request_rows, rollouts_dir
    from gates import load_policy
    from gates.evaluate import evaluate_gates
    from registry import audit, load_evidence, recover, stage_holder
    from registry.rollouts import analyses, rollouts

    reg, v = stack["reg"], stack["version"]
    # at this machine's few requests per second a p95 cannot pass (it needs 69 answers per look, then more:
    # gates/sequential.py); the completing rollout is judged on its error rate, at 80% over the whole rollout
    routes = write_routes(
        stack["root"] / "steps.yaml",
        STEPS_OK | {"interval_s": 8, "confidence": 0.8, "analysis": {"error_rate": {"max": 0.5}}},
    )
    env = os.environ | {
        "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "PREFECT_API_URL": stack["prefect"],
    }
    before = {p.name for p in rollouts_dir().glob("*.json")}
    ensure_approved(stack)
    controller = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from flows.cli import main; main()",
            "rollout",
            "start",
            "tiny-llada",
            "--route",
            "default",
            "--to",
            "production",
            "--routes",
            str(routes),
            "--policy",
            str(stack["policy"]),
            "--server",
            stack["server"].base_url,
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 240
        state = None
        while time.monotonic() < deadline and state is None:  # killed once the first step serves
            new = [p for p in rollouts_dir().glob("*.json") if p.name not in before and p.name != "weights.json"]
            if new:
                data = json.loads(new[0].read_text())
                if any(e["what"] == "weights" for e in data["events"]):
                    state = data
            if controller.poll() is not None:
                pytest.fail(f"the controller ended before it was killed: {controller.stdout.read()}")
            time.sleep(0.1)
        assert state is not None, "the controller never wrote the first step's weights"
        controller.send_signal(signal.SIGKILL)
    finally:
        controller.kill()
        controller.wait(30)
    rollout_id = state["id"]
    killed = load_state(rollout_id)
    assert killed.status == "running" and killed.step_index == 0 and killed.weight == 50
    assert read_weights()["default"] == {"staging": 50, "fallback": 50}
    assert recover(reg, "production") == []  # no alias half-moved
    # the load comes back with the controller: `unmask loadtest --url` (one user per prompt), as docs/rollout.md
    report = stack["root"] / "loadtest.json"
    loadtest = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from flows.cli import main; main()",
            "loadtest",
            "--url",
            stack["server"].base_url + "/v1",
            "--model",
            "auto",
            "--concurrency",
            "2",
            "--requests",
            "300",
            "--duration",
            "120",
            "--max-tokens",
            "8",
            "--no-stream",
            "--no-log",
            "--json",
            str(report),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        since = datetime.now(UTC).isoformat()
        deadline = time.monotonic() + 120
        while not request_rows(since=since) and time.monotonic() < deadline and loadtest.poll() is None:
            time.sleep(0.5)  # its first answers are logged: the load is on
        prepare_resume(rollout_id)
        outcome = rollout_flow(rollout_id, flush_grace_s=2.5)
    finally:
        loadtest.send_signal(signal.SIGTERM)  # the rollout is over: the load stops and reports what it measured
        output = loadtest.communicate(timeout=180)[0]
    assert outcome["status"] == "completed", outcome
    assert loadtest.returncode == 0, output
    records = json.loads(report.read_text())["records"]
    assert records and all(r["error_rate"] == 0 for r in records)  # no client saw an error
    done = load_state(rollout_id)
    assert [a["weight"] for a in done.analyses] == [50, 100] and all(a["verdict"] == "pass" for a in done.analyses)
    assert stage_holder(reg, "production") == ("tiny-llada", v)
    assert "default" not in read_weights()  # the route's own split serves again
    move = [e for e in audit.events(reg, stage="production", event=audit.MOVE) if e.status == "FINISHED"][-1]
    assert move.to_ref == f"tiny-llada@{v}" and rollout_id in move.comment
    assert move.evidence["thresholds"]["canary"] == 100  # the promotion judged the canary gate, and it passed
    assert [r.status for r in rollouts(reg, "tiny-llada", v) if r.id == rollout_id] == ["completed"]
    assert [a.weight for a in analyses(reg, rollout_id)] == [50, 100]
    canary = [
        r
        for r in evaluate_gates(load_evidence(reg, "tiny-llada", v), load_policy(stack["policy"]), "production")
        if r.gate == "canary"
    ]
    assert canary[0].passed and canary[0].evidence["rollout"] == rollout_id
