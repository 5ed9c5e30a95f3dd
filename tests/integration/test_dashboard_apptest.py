"""The dashboard's six views under Streamlit's AppTest, on a registry filled by a real small run: what each
page shows equals what the registry holds (the verdict per stage, the policy that judged, the charts' data);
a holder failing its gates is red, verdicts of another policy and inconclusive gates amber; an empty or
unreachable registry is explained; no alias moves."""

from __future__ import annotations

import json
import re

import pandas as pd
import pyarrow as pa
import pytest
import yaml
from streamlit.testing.v1 import AppTest

import registry.read as read
from dashboards.cells import value_text
from gates.policy import POLICY_PATH, load_policy
from gates.readable import gate_threshold, gate_value, milliseconds, percent, significant
from gates.results import GateResult
from registry import STAGE_ALIASES, Registry
from registry.views import current_version, dashboard_policy
from tests.support import REPO
from tests.support.dashboard_pages import page
from tests.support.servers import free_port

PAGES = [
    "views/gate_board.py",
    "views/scores.py",
    "views/quality_latency.py",
    "views/candidate.py",
    "views/promotions.py",
]
VERDICT_PAGES = [
    "views/gate_board.py",
    "views/scores.py",
    "views/quality_latency.py",
    "views/candidate.py",
    "views/promotions.py",
]


@pytest.fixture
def reg(env):
    return Registry(env.tracking_uri)


def texts(at: AppTest, kind: str) -> list[str]:
    return [e.value for e in at.get(kind)]


def charts(at: AppTest) -> list[tuple[dict, pd.DataFrame]]:
    """Each Altair chart on the page: (its Vega-Lite spec, the data it draws)."""
    found = []
    for chart in at.get("vega_lite_chart"):
        data = [pa.ipc.open_stream(d.data.data).read_pandas() for d in chart.proto.datasets]
        found.append((json.loads(chart.proto.spec), data[0] if data else pd.DataFrame()))
    return found


def marks(spec: dict) -> list[dict]:
    """The unit specs of a (layered) Vega-Lite spec: mark, encoding, transform."""
    return [layer for layer in spec.get("layer", [spec])]


def label(holder) -> str:
    return f"{holder['model']} v{holder['version']}" if holder else "nobody"


def test_the_landing_verdict_names_per_stage_the_best_passing_version_its_holder_and_what_blocks_it(reg, env):
    at = page()
    assert at.title[0].value == "Verdict"
    policy = dashboard_policy()
    verdict = at.table[0].value
    assert list(verdict.index) == list(STAGE_ALIASES)
    held = read.aliases(reg)
    for stage in STAGE_ALIASES:
        scored = read.scores(stage, registry=reg, policy=policy)
        ranking, intervals = scored["ranking"], scored["intervals"].set_index("candidate")
        top = ranking.candidate.iloc[0] if len(ranking) else None  # the page leads with the top-ranked candidate
        ranking = ranking[ranking.open_signoffs == ""]  # recommended: promotable, not only ranked on evidence
        if ranking.empty:
            assert verdict.loc[stage, "recommended"] == "none passes" and verdict.loc[stage, "score"] == "—"
            subject = (top, current_version(reg, top)) if top else (env.candidate, env.candidate_version)
        else:
            best = ranking.candidate.iloc[0]
            subject = (best, current_version(reg, best))
            assert verdict.loc[stage, "recommended"] == f"{best} v{subject[1]}"
            assert verdict.loc[stage, "score"].startswith(significant(ranking.topsis.iloc[0]))
            low, high = intervals.loc[best, "quality_low"], intervals.loc[best, "quality_high"]
            assert verdict.loc[stage, "accuracy"] == (
                f"{percent(ranking.quality.iloc[0])} ({percent(low)} to "
                f"{percent(high)} on {intervals.loc[best, 'n_items']} items)"
            )
        assert verdict.loc[stage, "held by"].startswith(label(held[stage]))
        holder = (held[stage]["model"], held[stage]["version"]) if held[stage] else None
        if subject == holder:
            assert verdict.loc[stage, "next command"] == "—"
            continue
        # the blocker and its command are the decision's, as `unmask gates` prints it
        decision = read.promotion_decision(*subject, stage, registry=reg, policy=policy)
        assert verdict.loc[stage, "next command"] == decision.steps[0].command
        first = decision.blockers[0].text
        blocks = verdict.loc[stage, "what blocks it"]
        assert blocks.startswith(f"{subject[0]} v{subject[1]}: {decision.outcome}: {first}")
    # staging and production count only signed acts and the bundled roles list no keys: that step comes first
    assert verdict.loc["staging", "next command"] == "unmask keys init --name NAME"
    assert verdict.loc["staging", "held by"] == "nobody"
    # the poc holder passes its gates and every verdict was judged under this page's policy: no red banner;
    # the amber ones are the stages whose stored verdicts hold an inconclusive gate (too few items), no others
    assert not at.error
    unsettled = set(read.gate_results(registry=reg).query("verdict == 'inconclusive'").stage)
    assert unsettled and {w.value.split(":")[0].strip("*") for w in at.warning} == unsettled
    assert all(": inconclusive.**" in w.value for w in at.warning)


def test_the_verdict_page_leads_with_the_decision_against_the_fallback(reg, env):
    from registry.decision import decisions

    at = page()
    shown = at.dataframe[0].value  # the first table on the page: the decision, before the stage verdicts
    decided = decisions(reg, dashboard_policy())
    assert len(shown) == len(decided) == 3 * len({d.model for d in decided}) and len(decided)
    for row, d in zip(shown.itertuples(), decided):
        f = d.figures
        assert (row.candidate, row.stage) == (f"{d.model} v{d.version}", d.stage)
        assert row._3.startswith(percent(f.accuracy)) and f"n={f.n_items}" in row._3
        assert row._4 == f.p95_text() and f.p95_ratio is not None
        assert f.paired and re.search(r"x (faster|slower) \([\d.]+–[\d.]+x\)", row._4), row._4  # with its interval
        assert row._5 == f.tokens_per_s_text() and f.tokens_per_s_ratio is not None
        assert row.decision.split(" ")[0] == d.outcome.value
        assert row._7 == ("; ".join(d.blocker_texts()) or ("nothing: it holds the stage" if d.holds else "nothing"))


def test_the_demo_banner_is_on_every_page_under_demo_roles_and_on_none_without(reg, env, monkeypatch):
    for path in [None, *PAGES, "views/rollout.py"]:
        assert not [e for e in texts(page(path), "error") if "DEMO" in e], path
    monkeypatch.setenv("UNMASK_ROLES", str(REPO / "gates" / "demo-roles.yaml"))
    for path in [None, *PAGES, "views/rollout.py"]:
        banners = [e for e in texts(page(path), "error") if e.startswith("**DEMO — not a decision.**")]
        assert len(banners) == 1 and "demo-roles.yaml" in banners[0], path


def test_every_verdict_page_names_the_policy_file_and_sha256_that_judged_it(reg, env):
    judged = read.judged_policies(reg)
    assert len(judged) and set(judged.policy_path) == {str(env.policy_path.resolve())}
    sha = judged.policy_sha256.iloc[0]
    assert sha == load_policy(env.policy_path).sha256
    for path in [None, *VERDICT_PAGES]:
        at = page(path)
        policy_line = next(c for c in texts(at, "caption") if c.startswith("Policy "))
        assert f"`{judged.policy_path.iloc[0]}` (sha256 `{sha}`)" in policy_line, path
        assert "every stored verdict was judged under it" in policy_line
        assert not any("different policy" in w for w in texts(at, "warning")), path


def test_a_holder_failing_its_gates_is_red_and_other_policies_and_inconclusive_gates_amber(tmp_path, monkeypatch):
    from registry import judge, promote, record_gate_report, sign_off
    from tests.support.gate_fixtures import fresh_registry, register_pair

    reg = fresh_registry(tmp_path)
    _, v = register_pair(reg)
    for item in ("fallback-plan", "tooling-maturity"):
        sign_off(reg, "tiny-llada", v, "poc", item, "ada", f"{item} reviewed for the PoC")
    promote(
        "tiny-llada", "poc", approver="grace", comment="evidence reviewed, gates and checklist are green", registry=reg
    )
    # the poc holder judged again under a stricter policy: it fails the poc gates it holds
    strict = yaml.safe_load(POLICY_PATH.read_text())
    strict["stages"]["poc"]["gates"]["quality"]["threshold"] = 0.9999
    strict_path = tmp_path / "strict.yaml"
    strict_path.write_text(yaml.safe_dump(strict, sort_keys=False))
    strict_policy = load_policy(strict_path)
    decision = judge(reg, "tiny-llada", v, "poc", strict_policy)
    assert [r.gate for r in decision.gate_results if not r.passed] == ["quality"]
    # a staging quality verdict that more items would settle, as a three-valued gate writes it
    unsettled = GateResult(
        "quality", "staging", False, 0.52, ">= 0.5", "accuracy 0.52: the interval spans 0.5", verdict="inconclusive"
    )
    record_gate_report(reg, "tiny-llada", v, "staging", [unsettled], policy=load_policy().cited())
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    monkeypatch.delenv("UNMASK_POLICY", raising=False)  # the pages judge by the bundled policy

    at = page()
    red = [e for e in texts(at, "error")]
    assert len(red) == 1 and red[0].startswith(
        f"**poc is held by tiny-llada v{v}, which fails its poc gates:** quality."
    )
    assert "`unmask rollback --stage poc`" in red[0]
    assert at.table[0].value.loc["poc", "held by"] == f"tiny-llada v{v}, failing 1 gate"
    amber = texts(at, "warning")
    assert any(
        w.startswith("**poc: evidence may be stale.**")
        and f"tiny-llada v{v} was judged at poc under another policy (sha256 {strict_policy.sha256[:12]}" in w
        for w in amber
    ), amber
    assert any(w.startswith("**staging: inconclusive.**") and f"tiny-llada v{v}: quality" in w for w in amber), amber
    for path in [None, *VERDICT_PAGES]:
        shown = page(path)
        flagged = [w for w in texts(shown, "warning") if "different policy" in w]
        assert len(flagged) == 1, path
        assert f"`{strict_path.resolve()}` (sha256 `{strict_policy.sha256}`): tiny-llada v{v} at poc" in flagged[0]
        assert f"sha256 `{load_policy().sha256}`" in next(c for c in texts(shown, "caption") if c.startswith("Policy "))
    board = page("views/gate_board.py").table[1].value
    assert board.loc[f"tiny-llada v{v} [candidate, poc]", "poc"] == "failed 10/11"
    cells = page("views/gate_board.py")
    staging = next(e for e in cells.expander if "· staging ·" in e.label and e.label.startswith("tiny-llada"))
    assert staging.table[0].value.loc["quality", "result"] == "inconclusive"


def test_after_a_rollback_to_the_fallback_the_page_does_not_advise_rolling_back_onto_what_was_rolled_back(
    tmp_path, monkeypatch
):
    """Item 51.15: with the fallback on poc after a rollback (and failing the candidate gates it was never meant to
    pass), the page said "Put the previous holder back with `unmask rollback --stage poc`": the rolled-back one."""
    from registry import promote, record_gate_report, rollback, sign_off
    from tests.support.gate_fixtures import fresh_registry, register_pair

    reg = fresh_registry(tmp_path)
    v_ar, v = register_pair(reg)
    for item in ("fallback-plan", "tooling-maturity"):
        sign_off(reg, "tiny-llada", v, "poc", item, "ada", f"{item} reviewed for the PoC")
    promote(
        "tiny-llada", "poc", approver="grace", comment="evidence reviewed, gates and checklist are green", registry=reg
    )
    rollback("poc", who="oncall", comment="p95 regression seen in the canary", registry=reg)
    failing = GateResult("quality", "poc", False, 0.2, ">= 0.5", "accuracy 0.2 below 0.5")
    record_gate_report(reg, "tiny-ar", v_ar, "poc", [failing], policy=load_policy().cited())
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    monkeypatch.delenv("UNMASK_POLICY", raising=False)

    at = page()
    assert not any("rollback --stage poc" in e for e in texts(at, "error") + texts(at, "warning"))
    on_fallback = [w for w in texts(at, "warning") if w.startswith(f"**poc is on the fallback, tiny-ar v{v_ar}**")]
    assert len(on_fallback) == 1 and "only through a new promotion: `unmask " in on_fallback[0], texts(at, "warning")
    assert at.table[0].value.loc["poc", "held by"] == f"tiny-ar v{v_ar} (the fallback)"


def test_gate_board_shows_each_stored_verdict_and_every_gate_with_value_threshold_and_reason(reg, env):
    at = page("views/gate_board.py")
    assert at.title[0].value == "Gate board"
    held = read.aliases(reg)
    holders = at.table[0].value.loc["held by"]
    assert (
        holders["poc"]
        == f"{env.candidate} v{env.candidate_version}"
        == f"{held['poc']['model']} v{held['poc']['version']}"
    )
    assert holders["candidate"] == f"{env.candidate} v{env.candidate_version}"
    assert holders["fallback"] == f"{env.fallback} v{env.fallback_version}"
    assert holders["staging"] == holders["production"] == "—"

    board = at.table[1].value
    results = read.gate_results(registry=reg)
    for label, model, version in (
        (f"{env.candidate} v{env.candidate_version} [candidate, poc]", env.candidate, env.candidate_version),
        (f"{env.fallback} v{env.fallback_version} [fallback]", env.fallback, env.fallback_version),
    ):
        for stage in ("poc", "staging", "production"):
            mine = results[(results.model == model) & (results.version == version) & (results.stage == stage)]
            verdict = "passed" if mine.passed.all() else "failed"
            assert board.loc[label, stage].endswith(f"{verdict} {int(mine.passed.sum())}/{len(mine)}")
    assert board.loc[f"{env.candidate} v{env.candidate_version} [candidate, poc]", "poc"].startswith("passed")
    assert board.loc[f"{env.candidate} v{env.candidate_version} [candidate, poc]", "staging"].startswith("failed")

    # the expander of the candidate at staging lists every gate as stored
    staging = [
        e
        for e in at.expander
        if e.label.startswith(f"{env.candidate} v{env.candidate_version}") and "· staging ·" in e.label
    ]
    assert len(staging) == 1
    shown = staging[0].table[0].value
    stored = results[(results.model == env.candidate) & (results.stage == "staging")].set_index("gate")
    assert list(shown.index) == list(stored.index)
    specs = {g.name: g for g in dashboard_policy().stage("staging").gates}
    for gate, row in stored.iterrows():
        # the stored verdict's word: a speed gate measured on a loaded host is inconclusive, neither pass nor FAIL
        assert (
            shown.loc[gate, "result"] == {"pass": "pass", "fail": "FAIL", "inconclusive": "inconclusive"}[row.verdict]
        )
        assert shown.loc[gate, "why"] == row.reason
        # in the gate's unit, 3 significant digits, thresholds as a person writes them
        assert shown.loc[gate, "measured"] == gate_value(specs[gate].kind, row.value)
        assert shown.loc[gate, "required"] == value_text(gate_threshold(specs[gate], row.threshold))  # ">=" as "≥"
    assert shown.loc["latency", "required"].startswith("≤ ") and shown.loc["latency", "measured"].endswith(" ms")
    assert shown.loc["quality", "measured"].endswith("%")
    assert "reproducibility" in staging[0].label  # a failed gate is named without opening the row


def test_scores_rank_as_the_registry_scores_and_sliders_rerank_without_touching_the_policy(reg, env):
    policy_text = env.policy_path.read_text()
    at = page("views/scores.py")
    expected = read.scores("poc", registry=reg, policy=dashboard_policy())
    ranking = at.dataframe[0].value
    want = expected["ranking"]
    assert list(ranking.version) == list(want.candidate)
    assert {env.candidate, env.fallback} == set(ranking.version)
    assert list(ranking["TOPSIS"]) == [significant(x) for x in want.topsis]
    assert list(ranking["weighted sum"]) == [significant(x) for x in want.weighted_sum]
    assert list(ranking.accuracy) == [percent(x) for x in want.quality]
    assert list(ranking["p95 latency (ms)"]) == [milliseconds(x) for x in want.latency]
    assert len(at.dataframe[1].value) == len(expected["sensitivity"]) == 8  # 4 criteria x +/-20 %
    # the bar chart: both scores of every ranked version, whiskers spanning the accuracy's 95% interval
    (bars_spec, bars), (heat_spec, heat) = charts(at)
    intervals = expected["intervals"].set_index("candidate")
    for row in want.itertuples():
        for method, column in (("TOPSIS", "topsis"), ("weighted sum", "weighted_sum")):
            drawn = bars[(bars.candidate == row.candidate) & (bars.method == method)].iloc[0]
            assert drawn.score == pytest.approx(getattr(row, column))
            assert (drawn.low, drawn.high) == pytest.approx(
                (intervals.loc[row.candidate, f"{column}_low"], intervals.loc[row.candidate, f"{column}_high"])
            )
            assert drawn.low <= drawn.score + 1e-12 and drawn.score <= drawn.high + 1e-12
    assert [m["mark"]["type"] for m in marks(bars_spec)] == ["bar", "rule"]
    # the sensitivity as a chart: one cell per criterion and direction, coloured by whether the ranking holds
    assert len(heat) == 8 and set(heat.criterion) == set(expected["sensitivity"].criterion)
    holds = expected["sensitivity"].weighted_sum_ranking_holds & expected["sensitivity"].topsis_ranking_holds
    assert list(heat.outcome == "ranking holds") == list(holds)

    # all weight on latency: the faster one ranks first, by both methods
    for criterion in ("quality", "memory", "license"):
        at.slider(key=f"weight_poc_{criterion}").set_value(0.0)
    at.slider(key="weight_poc_latency").set_value(1.0).run()
    assert not at.exception
    reranked = at.dataframe[0].value
    fastest = want.sort_values("latency").candidate.iloc[0]
    assert reranked.version.iloc[0] == fastest
    explored = read.scores(
        "poc", {"quality": 0, "latency": 1, "memory": 0, "license": 0}, registry=reg, policy=dashboard_policy()
    )["ranking"]
    assert list(reranked["TOPSIS"]) == [significant(x) for x in explored.topsis]
    assert env.policy_path.read_text() == policy_text  # the sliders explore; the policy is untouched
    again = page("views/scores.py")  # a new session starts from the policy's weights
    assert again.slider(key="weight_poc_latency").value == dashboard_policy().stage("poc").weights["latency"]
    assert list(again.dataframe[0].value.version) == list(want.candidate)


def same_points(xs, ys, want_xs, want_ys) -> bool:
    """The same (x, y) points in any order, to float tolerance."""
    got, want = sorted(zip(xs, ys)), sorted(zip(want_xs, want_ys))
    return [x for x, _ in got] == pytest.approx([x for x, _ in want]) and [y for _, y in got] == pytest.approx(
        [y for _, y in want]
    )


def test_quality_latency_plots_every_record_the_pareto_front_the_fallback_and_the_operating_point(reg, env):
    at = page("views/quality_latency.py")
    records = read.records(registry=reg)
    policy = dashboard_policy()
    gen_length = policy.stage("poc").operating_point.gen_length
    assert at.selectbox(key="ql_task").value == "arith"
    assert at.selectbox(key="ql_gen_length").value == gen_length
    assert at.radio(key="ql_x").value == "latency_p95_s"
    (spec, drawn), _ = charts(at)  # the second: the AUP curve; no load test was logged, so no load chart
    assert any(i.value.startswith("No load test logged yet") for i in at.info)
    here = records[records.gen_length == gen_length]
    # every record, x in ms; the fallback as its own marked series
    assert same_points(drawn.x, drawn.accuracy, here.latency_p95_s * 1e3, here.accuracy)
    fallback = drawn[drawn.point == "AR fallback"]
    ar = here[here.model == env.fallback]
    assert list(fallback.x) == pytest.approx(list(ar.latency_p95_s * 1e3))
    assert set(fallback.series) == {f"AR fallback ({env.fallback} v{env.fallback_version})"}
    # the operating point is the record the poc gates cite
    cited = read.gate_results(env.candidate, env.candidate_version, "poc", registry=reg)
    op = records[records.record_id == cited[cited.gate == "latency"].record_id.iloc[0]]
    assert list(drawn[drawn.operating].x) == pytest.approx(list(op.latency_p95_s * 1e3))
    # the front: sorted by latency, accuracy strictly rises; it starts at the fastest validated record
    front = drawn[drawn.front & (drawn.series == f"{env.candidate} v{env.candidate_version}")].sort_values("x")
    assert all(b > a for a, b in zip(front.accuracy, front.accuracy[1:]))
    mine = here[(here.model == env.candidate) & (here.valid == True)]  # noqa: E712
    assert front.x.min() == pytest.approx(mine.latency_p95_s.min() * 1e3)
    # drawn: the front as a line, the records with hover tooltips (no text labels to overlap), the ring
    layers = marks(spec)
    assert [m["mark"]["type"] for m in layers] == ["line", "point", "point"]
    assert not any(m["mark"]["type"] == "text" for m in layers) and "tooltip" in layers[1]["encoding"]
    # y fitted to the data, not 0-1
    low, high = here.accuracy.min(), here.accuracy.max()
    pad = max(0.02, 0.1 * (high - low))
    assert layers[1]["encoding"]["y"]["scale"]["domain"] == pytest.approx([max(0, low - pad), min(1, high + pad)])
    table = at.dataframe[0].value
    assert sorted(table["run id"]) == sorted(here.run_id)
    by_run = here.set_index("run_id")
    assert list(table.accuracy) == [percent(by_run.accuracy[r]) for r in table["run id"]]
    assert list(table["p95 latency (ms)"]) == [milliseconds(by_run.latency_p95_s[r]) for r in table["run id"]]

    # quality per sampling step, and per tokens per forward (where more is better: the front runs the other way)
    at.radio(key="ql_x").set_value("steps").run()
    (_, by_steps), _ = charts(at)
    steps = [float(c.get("steps") or n) for c, n in zip(here.config, here.nfe)]
    assert sorted(by_steps.x) == pytest.approx(sorted(steps))
    at.radio(key="ql_x").set_value("tokens_per_forward").run()
    (spec_tpf, by_tpf), _ = charts(at)
    assert sorted(by_tpf.x) == pytest.approx(sorted(here.tokens_per_forward))
    assert marks(spec_tpf)[1]["encoding"]["x"]["title"].startswith("tokens per forward")
    best = by_tpf[by_tpf.series == f"{env.candidate} v{env.candidate_version}"]
    assert best[best.front].x.max() == pytest.approx(best[best.point == "validated"].x.max())

    other = max(records.gen_length.unique())
    at.radio(key="ql_x").set_value("latency_p95_s")
    at.selectbox(key="ql_gen_length").set_value(other).run()
    (_, longer), _ = charts(at)
    assert sorted(longer.x) == pytest.approx(sorted(records[records.gen_length == other].latency_p95_s * 1e3))
    assert not longer.operating.any()  # the gates judge another length
    assert f"arith at generation length {gen_length}" in at.warning[0].value


def test_quality_latency_shows_each_versions_aup_with_the_curve_it_came_from(reg, env):
    from evals.parallelism import aup

    at = page("views/quality_latency.py")
    records = read.records(registry=reg)
    gen_length = dashboard_policy().stage("poc").operating_point.gen_length
    here = records[(records.gen_length == gen_length) & (records.task == "arith") & (records.valid == True)]  # noqa: E712
    shown = {m.label: m.value for m in at.metric}
    for model, version in ((env.candidate, env.candidate_version), (env.fallback, env.fallback_version)):
        mine = here[here.model == model]
        expected = aup(list(zip(mine.tokens_per_forward, mine.accuracy))).aup
        label = f"{model} v{version}" + (" (AR fallback)" if model == env.fallback else "")
        assert shown[label] == significant(expected), (label, shown)
    _, (spec, curve) = charts(at)
    mine = curve[curve.series == f"{env.candidate} v{env.candidate_version}"]
    assert sorted(mine["tokens per forward"]) == pytest.approx(
        sorted(here[here.model == env.candidate].tokens_per_forward)
    )
    assert [m["mark"]["type"] for m in marks(spec)] == ["line", "point"]
    assert any("AUP (d3LLM, arXiv:2601.07568)" in c.value for c in at.caption)


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
    decided = at.dataframe[0].value  # the decision per stage leads, as every surface renders it
    from registry.decision import decisions

    expected = decisions(reg, dashboard_policy(), [env.candidate], versions={env.candidate: env.candidate_version})
    assert list(decided.stage) == [d.stage for d in expected]
    assert [c.split(" ")[0] for c in decided.decision] == [d.outcome.value for d in expected]
    assert list(decided["what blocks it"]) == ["; ".join(d.blocker_texts()) or "nothing" for d in expected]
    card = at.dataframe[1].value.set_index("field")["value"]
    assert card["weights sha256"] == evidence.weights_sha256
    assert evidence.license.expression in " ".join(m.value for m in at.markdown)
    assert [w.value for w in at.warning if w.value.startswith("Finding")] == [
        f"Finding: {f}" for f in evidence.license.findings
    ]
    poc = at.tabs[0].dataframe[0].value
    stored = read.checklist(env.candidate, env.candidate_version, "poc", reg)
    assert list(poc["item"]) == list(stored["item"]) and list(poc.done) == list(stored.done.astype(bool))
    assert "approved by grace" in at.tabs[0].success[0].value.lower()
    signed = poc[poc["item"] == "tooling-maturity"]["evidence or sign-off"].iloc[0]
    assert "ada" in signed
    runs = at.dataframe[-1].value
    assert set(runs.run_id) == {r.run_id for r in evidence.records} | {
        reg.version_tags(env.candidate, env.candidate_version)["unmask.evidence_run"]
    }
    assert "mlflow ui --backend-store-uri" in " ".join(c.value for c in at.caption)


def test_promotions_page_shows_the_audit_trail_by_kind_and_the_nightly_finding(reg, env):
    at = page("views/promotions.py")
    trail = read.audit_events(registry=reg)
    # registrations and decision changes (one per evaluation and judgement) are off the timeline unless chosen
    [kinds] = [m for m in at.multiselect if m.label == "Events"]
    assert {"registration", "decision"} <= set(kinds.options) and not {"registration", "decision"} & set(kinds.value)
    events = trail[~trail.event.isin(["evidence_registered", "decision_changed"])]
    table = at.dataframe[0].value
    assert len(table) == len(events)
    assert list(table["when (UTC)"]) == sorted(events["when"], reverse=True)
    moves = table[table.event.isin(["promote", "rollback"])]
    assert list(moves.what)[::-1] == [
        f"{f or 'nobody'} → {t}"
        for f, t in zip(events[events.event == "alias_move"]["from"], events[events.event == "alias_move"]["to"])
    ]
    assert {"grace", "oncall", "nightly"} <= set(table.who)
    # the timeline: one mark per event, each kind its own shape and colour, labelled with model and version
    (spec, drawn), (_, held) = charts(at)  # the audit timeline, then which version held each stage when
    assert len(drawn) == len(events)
    from registry.history import stage_history

    assert list(held.holder) == [t.holder for t in stage_history(reg).tenures]
    # a refusal (the rules said no) has its own mark, apart from a decline (a person said no)
    assert {"promote", "rollback", "sign-off", "approval", "refusal", "nightly finding"} <= set(drawn.kind)
    # only alias moves carry a label ("model vN"); the other marks say who and what on hover
    assert all(label in ("", f"{m} v{v}") for label, m, v in zip(drawn.label, events.model, events.version))
    # (two moves of one stage next to each other: every other one is labelled, so the labels never collide)
    assert "promote" in set(drawn[drawn.label != ""].kind) <= {"promote", "rollback"}
    point, text, more_text = marks(spec)
    assert more_text["mark"]["type"] == "text" and more_text["encoding"]["text"]["field"] == "label"
    shapes, colours = point["encoding"]["shape"]["scale"], point["encoding"]["color"]["scale"]
    assert len(set(shapes["range"])) == len(shapes["domain"]) == len(set(drawn.kind))
    assert len(set(colours["range"])) == len(colours["domain"])
    assert text["mark"]["type"] == "text" and text["encoding"]["text"]["field"] == "label"
    assert set(drawn[drawn.kind == "rollback"].who) == {"oncall"}
    [findings] = [d.value for d in at.dataframe if "failed gates" in d.value.columns]
    assert len(findings) == 1 and findings.model.iloc[0] == env.candidate and findings.stage.iloc[0] == "production"
    # the finding lists exactly the production gates the candidate's last judgement failed
    judged = read.gate_results(env.candidate, env.candidate_version, "production", registry=reg)
    failed = set(judged[~judged.passed.astype(bool)].gate)
    assert failed and set(findings["failed gates"].iloc[0].split(", ")) == failed
    assert findings.action.iloc[0] == "no rollback"
    kinds.set_value(kinds.options).run()
    assert len(at.dataframe[0].value) == len(trail)  # chosen, every entry is there


def test_no_page_moves_an_alias_or_writes_to_the_audit_trail(reg, env):
    before = (reg.all_aliases(), len(read.audit_events(registry=reg)))
    for path in [None, *PAGES]:
        page(path)
    assert (reg.all_aliases(), len(read.audit_events(registry=reg))) == before


def test_an_empty_registry_says_how_to_produce_data(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("UNMASK_HOME", str(tmp_path))
    for path in [None, *PAGES]:
        at = page(path)
        assert "`unmask run`" in at.info[0].value and not at.error


def test_an_unreachable_registry_is_a_clear_message(monkeypatch):
    port = free_port()  # nothing listens on it
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    at = page()
    message = at.error[0].value
    assert "unreachable" in message and f"127.0.0.1:{port}" in message and "mlflow server" in message
    assert not at.dataframe and not at.table


def test_candidate_page_says_when_an_approval_and_sign_offs_predate_the_latest_evaluation(tmp_path, monkeypatch):
    # as tests.gate_fixtures, like every other module: a second module object would migrate a second template store
    from registry import approve, judge, register_evidence, sign_off
    from tests.support.gate_fixtures import evidence, fresh_registry, register_pair

    reg = fresh_registry(tmp_path)
    _, v = register_pair(reg)
    sign_off(reg, "tiny-llada", v, "poc", "tooling-maturity", "ada", "ONNX export and CPU serving reviewed")
    approve(reg, "tiny-llada", v, "poc", "grace", "evidence reviewed, gates and checklist are green")
    judge(reg, "tiny-llada", v, "poc")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    board = page("views/gate_board.py")  # a gate board where only part of the versions and stages were judged
    matrix = board.table[1].value
    assert matrix.loc["tiny-ar v1 [fallback]", "poc"] == "not judged"
    assert matrix.loc["tiny-llada v1 [candidate]", "poc"] == "passed 11/11"
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
