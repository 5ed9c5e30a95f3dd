"""The dashboard's five views under Streamlit's AppTest, on a registry filled by a real small run: what each
page shows equals what the registry holds; an empty or unreachable registry is explained; no alias moves."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

import registry.read as read
from dashboard_fixtures import free_port, shared_dashboard_registry, stop, wait_healthy
from registry import Registry
from registry.views import dashboard_policy

APP = str(Path(__file__).resolve().parents[1] / "dashboards" / "app.py")
PAGES = ["views/gate_board.py", "views/scores.py", "views/quality_latency.py", "views/candidate.py",
         "views/promotions.py"]


@pytest.fixture(scope="module")
def filled():
    return shared_dashboard_registry()


@pytest.fixture
def env(filled, monkeypatch):
    for key, value in filled.env().items():
        monkeypatch.setenv(key, value)
    return filled


@pytest.fixture
def reg(env):
    return Registry(env.tracking_uri)


def page(path: str | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    assert not at.exception, at.exception
    if path:
        at.switch_page(path).run()
        assert not at.exception, at.exception
    return at


def close(shown: str, stored: float) -> bool:
    return float(shown) == pytest.approx(stored, rel=1e-3, abs=1e-9)


def test_gate_board_shows_each_stored_verdict_and_every_gate_with_value_threshold_and_reason(reg, env):
    at = page()
    assert at.title[0].value == "Gate board"
    held = read.aliases(reg)
    holders = at.table[0].value.loc["held by"]
    assert holders["poc"] == f"{env.candidate} v{env.candidate_version}" == \
        f"{held['poc']['model']} v{held['poc']['version']}"
    assert holders["candidate"] == f"{env.candidate} v{env.candidate_version}"
    assert holders["fallback"] == f"{env.fallback} v{env.fallback_version}"
    assert holders["staging"] == holders["production"] == "—"

    board = at.table[1].value
    results = read.gate_results(registry=reg)
    for label, model, version in ((f"{env.candidate} v{env.candidate_version} [candidate, poc]", env.candidate,
                                   env.candidate_version),
                                  (f"{env.fallback} v{env.fallback_version} [fallback]", env.fallback,
                                   env.fallback_version)):
        for stage in ("poc", "staging", "production"):
            mine = results[(results.model == model) & (results.version == version) & (results.stage == stage)]
            verdict = "passed" if mine.passed.all() else "failed"
            assert board.loc[label, stage].endswith(f"{verdict} {int(mine.passed.sum())}/{len(mine)}")
    assert board.loc[f"{env.candidate} v{env.candidate_version} [candidate, poc]", "poc"].startswith("passed")
    assert board.loc[f"{env.candidate} v{env.candidate_version} [candidate, poc]", "staging"].startswith("failed")

    # the expander of the candidate at staging lists every gate as stored
    staging = [e for e in at.expander if e.label.startswith(f"{env.candidate} v{env.candidate_version}")
               and "· staging ·" in e.label]
    assert len(staging) == 1
    shown = staging[0].table[0].value
    stored = results[(results.model == env.candidate) & (results.stage == "staging")].set_index("gate")
    assert list(shown.index) == list(stored.index)
    for gate, row in stored.iterrows():
        assert shown.loc[gate, "result"] == ("pass" if row.passed else "FAIL")
        assert shown.loc[gate, "reason"] == row.reason
        if isinstance(row.value, float):
            assert close(shown.loc[gate, "value"], row.value)
    assert "reproducibility" in staging[0].label  # a failed gate is named without opening the row


def test_scores_rank_as_the_registry_scores_and_sliders_rerank_without_touching_the_policy(reg, env):
    policy_text = env.policy_path.read_text()
    at = page("views/scores.py")
    expected = read.scores("poc", registry=reg, policy=dashboard_policy())
    ranking = at.dataframe[0].value
    assert list(ranking.candidate) == list(expected["ranking"].candidate)
    assert {env.candidate, env.fallback} == set(ranking.candidate)
    for column in ("weighted_sum", "topsis", "quality", "latency", "memory"):
        assert list(ranking[column]) == pytest.approx(list(expected["ranking"][column]))
    assert len(at.dataframe[1].value) == len(expected["sensitivity"]) == 8  # 4 criteria x +/-20 %

    # all weight on latency: the faster one ranks first, by both methods
    for criterion in ("quality", "memory", "license"):
        at.slider(key=f"weight_poc_{criterion}").set_value(0.0)
    at.slider(key="weight_poc_latency").set_value(1.0).run()
    assert not at.exception
    reranked = at.dataframe[0].value
    fastest = expected["ranking"].sort_values("latency").candidate.iloc[0]
    assert reranked.candidate.iloc[0] == fastest
    explored = read.scores("poc", {"quality": 0, "latency": 1, "memory": 0, "license": 0}, registry=reg,
                           policy=dashboard_policy())["ranking"]
    assert list(reranked.topsis) == pytest.approx(list(explored.topsis))
    assert env.policy_path.read_text() == policy_text  # the sliders explore; the policy is untouched
    again = page("views/scores.py")  # a new session starts from the policy's weights
    assert again.slider(key="weight_poc_latency").value == dashboard_policy().stage("poc").weights["latency"]
    assert list(again.dataframe[0].value.candidate) == list(expected["ranking"].candidate)


def same_points(xs, ys, want_xs, want_ys) -> bool:
    """The same (x, y) points in any order, to float tolerance."""
    got, want = sorted(zip(xs, ys)), sorted(zip(want_xs, want_ys))
    return [x for x, _ in got] == pytest.approx([x for x, _ in want]) and \
        [y for _, y in got] == pytest.approx([y for _, y in want])


def _values(array) -> list:
    """A Plotly trace array: a list, or a typed array Plotly encodes as {dtype, bdata (base64)}."""
    if isinstance(array, dict) and "bdata" in array:
        return np.frombuffer(base64.b64decode(array["bdata"]), dtype=array["dtype"]).tolist()
    return list(array)


def _chart(at: AppTest, index: int = 0) -> dict[str, dict[str, list]]:
    """The traces of a Plotly chart on the page, by name: {"x": [...], "y": [...]}."""
    spec = json.loads(at.get("plotly_chart")[index].proto.spec)
    return {t.get("name", str(i)): {"x": _values(t["x"]), "y": _values(t["y"])} for i, t in enumerate(spec["data"])}


def test_quality_latency_plots_every_record_the_pareto_front_the_fallback_and_the_operating_point(reg, env):
    at = page("views/quality_latency.py")
    records = read.records(registry=reg)
    policy = dashboard_policy()
    gen_length = policy.stage("poc").operating_point.gen_length
    assert at.selectbox(key="ql_task").value == "arith"
    assert at.selectbox(key="ql_gen_length").value == gen_length
    traces = _chart(at)
    mine = records[(records.model == env.candidate) & (records.gen_length == gen_length)]
    curve = traces[f"{env.candidate} v{env.candidate_version}"]
    assert same_points(curve["x"], curve["y"], mine.latency_p95_s, mine.accuracy)
    ar = records[(records.model == env.fallback) & (records.gen_length == gen_length)]
    star = traces["AR fallback"]
    assert (star["x"], star["y"]) == (pytest.approx(list(ar.latency_p95_s)), pytest.approx(list(ar.accuracy)))
    # the operating point is the record the poc gates cite
    cited = read.gate_results(env.candidate, env.candidate_version, "poc", registry=reg)
    latency_record = cited[cited.gate == "latency"].record_id.iloc[0]
    op = records[records.record_id == latency_record]
    assert traces[f"{env.candidate} operating point"]["x"] == pytest.approx(list(op.latency_p95_s))
    # the front: sorted by latency, accuracy strictly rises
    front = traces[f"{env.candidate} Pareto front"]
    assert front["x"] == sorted(front["x"]) and all(b > a for a, b in zip(front["y"], front["y"][1:]))
    assert min(front["x"]) == pytest.approx(mine.latency_p95_s.min())
    table = at.dataframe[0].value
    assert sorted(table.run_id) == sorted(records[records.gen_length == gen_length].run_id)

    other = max(records.gen_length.unique())
    at.selectbox(key="ql_gen_length").set_value(other).run()
    traces = _chart(at)
    longer = records[(records.model == env.candidate) & (records.gen_length == other)]
    assert sorted(traces[f"{env.candidate} v{env.candidate_version}"]["x"]) == pytest.approx(
        sorted(longer.latency_p95_s))
    assert f"{env.candidate} operating point" not in traces  # the gates judge another length
    assert f"arith at generation length {gen_length}" in at.warning[0].value


def test_candidate_page_shows_card_license_reproducibility_checklists_and_runs(reg, env):
    at = page("views/candidate.py")
    assert at.selectbox(key="candidate_model").value == env.candidate
    from registry import load_evidence

    evidence = load_evidence(reg, env.candidate, env.candidate_version)
    summary = at.table[0].value.iloc[0]
    assert summary["license tier"] == evidence.license.tier and summary["reached"] == "poc"
    assert summary["kind"] == evidence.kind and summary["role"] == "candidate"
    probe = at.table[1].value.loc["probe"]
    assert probe["same process"] == ("yes" if evidence.reproducibility.same_process else "no")
    assert probe["fresh process"] == ("yes" if evidence.reproducibility.fresh_process else "no")
    card = at.dataframe[0].value.set_index("field")["value"]
    assert card["weights sha256"] == evidence.weights_sha256
    assert evidence.license.expression in " ".join(m.value for m in at.markdown)
    assert [w.value for w in at.warning if w.value.startswith("Finding")] == \
        [f"Finding: {f}" for f in evidence.license.findings]
    poc = at.tabs[0].dataframe[0].value
    stored = read.checklist(env.candidate, env.candidate_version, "poc", reg)
    assert list(poc["item"]) == list(stored["item"]) and list(poc.done) == list(stored.done.astype(bool))
    assert "approved by grace" in at.tabs[0].success[0].value.lower()
    signed = poc[poc["item"] == "tooling-maturity"]["evidence or sign-off"].iloc[0]
    assert "ada" in signed
    runs = at.dataframe[-1].value
    assert set(runs.run_id) == {r.run_id for r in evidence.records} | {
        reg.version_tags(env.candidate, env.candidate_version)["unmask.evidence_run"]}
    assert "mlflow ui --backend-store-uri" in " ".join(c.value for c in at.caption)


def test_promotions_page_shows_the_audit_trail_and_the_nightly_finding(reg, env):
    at = page("views/promotions.py")
    events = read.audit_events(registry=reg)
    table = at.dataframe[0].value
    assert len(table) == len(events)
    assert list(table["when"]) == sorted(events["when"], reverse=True)
    moves = table[table.event == "alias_move"]
    assert list(moves.what)[::-1] == [f"{f or 'nobody'} → {t}" for f, t in
                                      zip(events[events.event == "alias_move"]["from"],
                                          events[events.event == "alias_move"]["to"])]
    assert {"grace", "oncall", "nightly"} <= set(table.who)
    assert sum(len(t["x"]) for t in _chart(at).values()) == len(events)
    findings = at.dataframe[1].value
    assert len(findings) == 1 and findings.model.iloc[0] == env.candidate and findings.stage.iloc[0] == "production"
    # the finding lists exactly the production gates the candidate's last judgement failed
    judged = read.gate_results(env.candidate, env.candidate_version, "production", registry=reg)
    failed = set(judged[~judged.passed.astype(bool)].gate)
    assert failed and set(findings.failed_gates.iloc[0].split(", ")) == failed
    assert findings.action.iloc[0] == "no rollback"


def test_no_page_moves_an_alias_or_writes_to_the_audit_trail(reg, env):
    before = (reg.all_aliases(), len(read.audit_events(registry=reg)))
    for path in PAGES:
        page(path)
    assert (reg.all_aliases(), len(read.audit_events(registry=reg))) == before


def test_an_empty_registry_says_how_to_produce_data(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("UNMASK_HOME", str(tmp_path))
    for path in [None, *PAGES[1:]]:
        at = page(path)
        assert "`unmask run`" in at.info[0].value and not at.error


def test_an_unreachable_registry_is_a_clear_message(monkeypatch):
    port = free_port()  # nothing listens on it
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    at = page()
    message = at.error[0].value
    assert "unreachable" in message and f"127.0.0.1:{port}" in message and "mlflow server" in message
    assert not at.dataframe and not at.table


@pytest.mark.slow
def test_unmask_dashboard_serves_the_state_folders_registry_headless_until_stopped_by_pid(env, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI")  # the state folder's store, as after `unmask run`
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", "from flows.cli import main; main()", "dashboard", "--port",
                               str(port)], env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/_stcore/health", server)
    finally:
        stop(server)  # `unmask dashboard` became the server: its pid is the server's
    output = server.stdout.read().replace("\n", "")
    assert f"registry: {env.tracking_uri}" in output and f"http://127.0.0.1:{port}" in output


@pytest.mark.slow
def test_through_an_mlflow_server_the_board_is_the_same_and_runs_link_to_its_ui(env, monkeypatch, tmp_path):
    embedded = page()
    port = free_port()
    log = tmp_path / "mlflow.log"
    with log.open("w") as out:
        server = subprocess.Popen(
            [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port),
             "--workers", "1", "--backend-store-uri", env.tracking_uri],
            env=dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"), stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", server, log)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
        served = page()
        assert served.table[1].value.equals(embedded.table[1].value)
        assert served.table[0].value.equals(embedded.table[0].value)
        candidate = page("views/candidate.py")
        runs = candidate.dataframe[-1].value
        assert all(url.startswith(f"http://127.0.0.1:{port}/#/experiments/") and url.endswith(run)
                   for url, run in zip(runs.url, runs.run_id))
    finally:
        stop(server)


def test_candidate_page_says_when_an_approval_and_sign_offs_predate_the_latest_evaluation(tmp_path, monkeypatch):
    # as tests.gate_fixtures, like every other module: a second module object would migrate a second template store
    from tests.gate_fixtures import evidence, fresh_registry, register_pair
    from registry import approve, judge, register_evidence, sign_off

    reg = fresh_registry(tmp_path)
    _, v = register_pair(reg)
    sign_off(reg, "tiny-llada", v, "poc", "tooling-maturity", "ada", "ONNX export and CPU serving reviewed")
    approve(reg, "tiny-llada", v, "poc", "grace", "evidence reviewed, gates and checklist are green")
    judge(reg, "tiny-llada", v, "poc")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    board = page()  # a gate board where only part of the versions and stages were judged
    matrix = board.table[1].value
    assert matrix.loc["tiny-ar v1 [fallback]", "poc"] == "not judged"
    assert matrix.loc["tiny-llada v1 [candidate]", "poc"] == "passed 10/10"
    at = page("views/candidate.py")
    at.selectbox(key="candidate_model").set_value("tiny-llada").run()
    assert "approved by grace" in at.tabs[0].success[0].value.lower() and not at.tabs[0].warning

    register_evidence(reg, evidence())  # re-evaluated: what grace and ada saw is not what is stored now
    judge(reg, "tiny-llada", v, "poc")
    next(b for b in at.button if b.label == "Refresh").click().run()  # reads are cached until a refresh
    assert not at.exception, at.exception
    warnings = [w.value for w in at.tabs[0].warning]
    assert not at.tabs[0].success
    assert any(w.startswith("Approval by grace") and "no longer counts" in w for w in warnings)
    assert "Sign-offs given before the latest evaluation no longer count: tooling-maturity." in warnings
    poc = at.tabs[0].dataframe[0].value.set_index("item")
    assert not poc.loc["tooling-maturity", "done"]
