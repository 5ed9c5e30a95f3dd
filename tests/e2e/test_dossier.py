"""The adoption dossier (`unmask report`): built from the registry only, every gate value as the registry holds
it, every section present, logged on the version and linked from the Candidate page, printed to a PDF by
headless Chromium, and archived with the promotion it was approved on."""

from __future__ import annotations

import json
import os
import re
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import registry.read as read
from dashboards.dossier import SECTIONS, content_sha256, stated_sha256, verify_html
from gates.results import GateResult
from registry import Registry, RegistryError
from registry.dossiers import DOSSIER_TAG, attach_dossier, latest_dossier, log_dossier
from registry.loadtests import serving_records as read_serving
from registry.tracking import load_gate_report
from tests.support import REPO
from tests.support.flow_fixtures import cli_app, seed_registry

PAGE1 = REPO / "docs" / "dossier-page1.png"


class DossierPage(HTMLParser):
    """The parts of a dossier's HTML the tests read: its sections and every gate row's data."""

    def __init__(self, html: str):
        super().__init__()
        self.sections: list[str] = []
        self.gates: list[dict[str, str]] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section" and attrs.get("data-section"):
            self.sections.append(attrs["data-section"])
        if tag == "tr" and attrs.get("data-gate"):
            self.gates.append(attrs)


class BuilderInThisProcess:
    """`flows.dossier`'s `subprocess`, for the tests about what a dossier holds: the builder's command line
    (`python -m dashboards.dossier ...`) runs its `main` in this process, with the environment the command
    gives, its stdout, stderr and exit status handed back as the child's would be. A child costs ~3 s of
    CPU importing MLflow again; the PDF and promote-flow tests keep the real child process."""

    TimeoutExpired = subprocess.TimeoutExpired

    @staticmethod
    def run(command, cwd=None, env=None, **_):
        import contextlib
        import io

        from dashboards.dossier.__main__ import main

        assert command[1:3] == ["-m", "dashboards.dossier"], command
        out, err = io.StringIO(), io.StringIO()
        with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            for key, value in (env or {}).items():
                if os.environ.get(key) != value:
                    mp.setenv(key, value)
            if cwd:
                mp.chdir(cwd)
            code = main(command[3:])
        return subprocess.CompletedProcess(command, code, out.getvalue(), err.getvalue())


def report(*args: str, own_process: bool = False):
    """`unmask report ARGS`, in-process; the dossier builder in this process too unless `own_process`."""
    import flows.dossier

    with pytest.MonkeyPatch.context() as mp:
        if not own_process:
            mp.setattr(flows.dossier, "subprocess", BuilderInThisProcess)
        return CliRunner().invoke(cli_app("report"), ["report", *args])


def test_the_dossier_holds_every_gate_value_of_the_registry_and_every_section(env, tmp_path):
    reg = Registry(env.tracking_uri)
    done = report(env.candidate, "--version", env.candidate_version, "--out", str(tmp_path), "--no-pdf")
    assert done.exit_code == 0, done.output
    html_path = tmp_path / f"{env.candidate}-v{env.candidate_version}-dossier.html"
    html = html_path.read_text()
    page = DossierPage(html)
    assert page.sections == list(SECTIONS)

    stored = read.gate_results(env.candidate, env.candidate_version, registry=reg)
    assert len(stored) > 10 and set(stored.stage) == {"poc", "staging", "production"}
    shown = {(g["data-stage"], g["data-gate"]): g for g in page.gates}
    assert len(shown) == len(page.gates) == len(stored)
    for row in stored.itertuples():
        gate = shown[(row.stage, row.gate)]
        assert json.loads(gate["data-value"]) == row.value, (row.stage, row.gate)
        assert json.loads(gate["data-threshold"]) == row.threshold
        raw = next(
            r
            for r in load_gate_report(reg, env.candidate, env.candidate_version, row.stage)["results"]
            if r["gate"] == row.gate
        )  # a stored verdict (pass / fail / inconclusive) wins over `passed`
        assert gate["data-verdict"] == GateResult.from_dict(raw).verdict
        if row.run_id:  # every gate names the MLflow run of the record it judged
            assert row.run_id in html
    for record in read.records(env.candidate, env.candidate_version, registry=reg).itertuples():
        assert record.run_id in html and record.config_hash in html
    # the state of the trail and what was decided on it
    from registry import audit

    trail = re.search(r'id="audit-verification">([^<]+)<', html).group(1)
    assert trail == audit.verify(reg).status == "intact"
    assert "alias_move" in html and "approval" in html and "rollback" in html

    # stamped: its code commit, and a sha256 of its own content that anyone can check
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    assert head and head in html
    assert verify_html(html) and stated_sha256(html) == content_sha256(html)
    assert not verify_html(html.replace("<h1>", "<h1>edited ", 1))

    # logged on the version's evidence run, the version tag naming it as the latest
    ref = latest_dossier(reg, env.candidate, env.candidate_version)
    assert ref is not None and ref.sha256 == stated_sha256(html) and ref.pdf == ""
    assert reg.load_artifact_bytes(ref.run_id, ref.html) == html_path.read_bytes()
    assert DOSSIER_TAG in reg.version_tags(env.candidate, env.candidate_version)


def test_open_risks_name_failed_gates_weak_tasks_and_what_was_not_measured(env, tmp_path):
    from dashboards.dossier import dossier_content

    content = dossier_content(Registry(env.tracking_uri), env.candidate, env.candidate_version)
    risks = content["limitations"]
    kinds = {r["kind"] for r in risks}
    failed = {(s, g["gate"]) for s, gates in content["gates"].items() for g in gates["results"] if not g["passed"]}
    assert failed and all(any(f"{s} / {gate}:" in r["text"] for r in risks) for s, gate in failed)
    assert {"fail gate", "not measured"} <= kinds
    assert any(r["text"].startswith("GPU") for r in risks) and any("long context" in r["text"] for r in risks)
    assert any(r["text"].startswith("serving under load") for r in risks)  # no load test in this evidence
    if env.candidate == "tiny-llada":  # the bundled model: its card reports the sort task as weak
        assert any(r["kind"] == "weak task" and r["text"].startswith("sort") for r in risks)
        assert any(r["kind"] == "unverified catalog field" and "pinned" in r["text"] for r in risks)


def test_a_version_without_evaluation_is_refused_naming_what_is_missing(tmp_path, monkeypatch):
    home = tmp_path / "home"
    seed_registry(home)
    monkeypatch.setenv("UNMASK_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    reg = Registry()
    reg.client.create_registered_model("bare")  # registered by hand, never evaluated by unmask
    reg.client.create_model_version("bare", str(tmp_path / "weights"))
    done = report("bare", "--version", "1", "--out", str(tmp_path / "out"))
    assert done.exit_code == 2
    assert "bare version 1 has no evaluation yet: no evidence run (unmask.evidence_run tag)" in done.output
    assert "Traceback" not in done.output and not list((tmp_path / "out").glob("*.html"))

    for args, said in (
        (["bare", "--version", "9"], "bare has no version '9' (versions: 1)"),
        (["nobody"], "no registered model 'nobody'"),
        (["bare", "--stage", "prod"], "--stage must be one of poc, staging, production"),
    ):
        done = report(*args, "--out", str(tmp_path / "out"))
        assert done.exit_code == 2 and said in done.output, done.output


def test_a_version_evaluated_but_never_judged_is_refused(tmp_path, monkeypatch):
    from registry import register_evidence
    from tests.support.gate_fixtures import evidence, fresh_registry

    reg = fresh_registry(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    version, _ = register_evidence(reg, evidence())
    done = report("tiny-llada", "--out", str(tmp_path / "out"))
    assert done.exit_code == 2
    assert (
        f"tiny-llada version {version} has evaluation records but no gate report for any stage; judge it "
        f"first (unmask gates tiny-llada --version {version} --store)"
    ) in done.output


def test_the_load_test_section_holds_the_serving_records_of_the_version_and_of_the_fallback(tmp_path, monkeypatch):
    from registry import judge
    from tests.support.gate_fixtures import fresh_registry, register_pair

    reg = fresh_registry(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    _, v = register_pair(reg)  # both carry what `unmask loadtest` logged at 16 in flight
    judge(reg, "tiny-llada", v, "poc")
    done = report("tiny-llada", "--out", str(tmp_path / "out"), "--no-pdf")
    assert done.exit_code == 0, done.output
    html = next((tmp_path / "out").glob("*.html")).read_text()
    mine = re.search(r'<table id="loadtest">(.*?)</table>', html, re.S).group(1)
    theirs = re.search(r'<table id="fallback-loadtest">(.*?)</table>', html, re.S).group(1)
    [served] = read_serving(reg, "tiny-llada", v)
    assert f"<td>{served.concurrency}</td><td>{served.requests}</td><td>700</td><td>900</td>" in mine  # p50, p95 ms
    assert served.run_id and served.run_id in mine and "960" in mine and "100.0%" in mine
    assert "<td>600</td>" in theirs and "800" in theirs  # tiny-ar's p95 and tokens/s on the same load
    assert "no load-test records" not in html


def test_the_candidate_page_links_the_latest_dossier(env, tmp_path):
    from tests.support.dashboard_pages import app_test

    reg = Registry(env.tracking_uri)
    done = report(env.candidate, "--version", env.candidate_version, "--out", str(tmp_path), "--no-pdf")
    assert done.exit_code == 0, done.output
    ref = latest_dossier(reg, env.candidate, env.candidate_version)
    at = app_test()
    at.run()
    at.switch_page("views/candidate.py").run()
    assert not at.exception, at.exception
    shown = [m.value for m in at.markdown if "Adoption dossier" in m.value]
    assert shown and ref.sha256[:12] in shown[0] and ref.html in shown[0]


def test_a_dossier_changed_after_logging_is_not_attached(tmp_path):
    from registry import register_evidence
    from tests.support.gate_fixtures import evidence, fresh_registry

    reg = fresh_registry(tmp_path)
    version, _ = register_evidence(reg, evidence())
    html = tmp_path / "d.html"
    html.write_text("<html>the dossier the approver saw</html>")
    ref = log_dossier(reg, "tiny-llada", version, html, None, "0" * 64)
    audit_run = reg.client.create_run(reg.experiment_id("unmask-audit")).info.run_id
    attached = attach_dossier(reg, audit_run, ref)
    assert reg.load_artifact_bytes(audit_run, attached["artifacts"]["html"]) == html.read_bytes()
    stored = Path(reg.client.get_run(ref.run_id).info.artifact_uri.removeprefix("file://")) / ref.html
    stored.write_text("<html>a different dossier</html>")  # edited in the artifact store afterwards
    with pytest.raises(RegistryError, match="was changed after it was logged"):
        attach_dossier(reg, reg.client.create_run(reg.experiment_id("unmask-audit")).info.run_id, ref)


@pytest.mark.browser
def test_the_pdf_printed_by_chromium_opens_with_every_page_and_a_first_page_that_is_not_blank(env, tmp_path):
    from PIL import Image

    done = report(env.candidate, "--version", env.candidate_version, "--out", str(tmp_path), own_process=True)
    assert done.exit_code == 0, done.output
    pdf = tmp_path / f"{env.candidate}-v{env.candidate_version}-dossier.pdf"
    info = subprocess.run(["pdfinfo", str(pdf)], capture_output=True, text=True, check=True).stdout
    pages = int(next(line.split()[-1] for line in info.splitlines() if line.startswith("Pages:")))
    assert pages >= 4  # the identity, evaluation and gates sections each start a page
    text = subprocess.run(["pdftotext", "-layout", str(pdf), "-"], capture_output=True, text=True, check=True).stdout
    first, *_, last = text.split("\f")[:pages]
    # page 1 is the decision: the version, the recommendation; the evidence sections follow
    assert f"{env.candidate} v{env.candidate_version}" in first and "Recommendation:" in first
    for heading in (
        "1. Identity",
        "2. Evaluation",
        "3. Operating point",
        "5. Gates per stage",
        "8. Limitations and open risks",
    ):
        assert heading in text
    assert "Content sha256" in last or "Content sha256" in text.split("\f")[pages - 1]
    subprocess.run(
        ["pdftoppm", "-png", "-r", "80", "-f", "1", "-l", "1", "-singlefile", str(pdf), str(tmp_path / "page1")],
        check=True,
    )
    image = np.asarray(Image.open(tmp_path / "page1.png").convert("L"), dtype=float)
    assert image.shape[0] > image.shape[1] > 500  # portrait A4
    assert image.std() > 20 and (image < 128).mean() > 0.01  # ink on the page, not a blank sheet
    # archived on the version, PDF too
    reg = Registry(env.tracking_uri)
    ref = latest_dossier(reg, env.candidate, env.candidate_version)
    assert reg.load_artifact_bytes(ref.run_id, ref.pdf) == pdf.read_bytes()
    if os.environ.get("UNMASK_UPDATE_SCREENSHOT") == "1":
        subprocess.run(
            [
                "pdftoppm",
                "-png",
                "-r",
                "110",
                "-f",
                "1",
                "-l",
                "1",
                "-singlefile",
                str(pdf),
                str(PAGE1.with_suffix("")),
            ],
            check=True,
        )


@pytest.mark.browser
def test_the_promote_flow_archives_the_dossier_the_approver_saw_with_the_move(prefect_harness, tmp_path, monkeypatch):
    from flows.promote import promote_flow
    from registry import approve
    from tests.support.gate_fixtures import OK, fresh_registry, register_pair, sign_all

    reg = fresh_registry(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    monkeypatch.setenv("UNMASK_HOME", str(tmp_path / "home"))
    _, version = register_pair(reg)
    sign_all(reg, "tiny-llada", version, "poc")
    approve(reg, "tiny-llada", version, "poc", "grace", OK)  # recorded already: the flow does not wait
    outcome = promote_flow("tiny-llada", "poc", timeout_s=30, poll_interval_s=1)
    assert outcome["status"] == "promoted", outcome
    attached, ref = outcome["dossier"], latest_dossier(reg, "tiny-llada", version)
    assert attached["audit_run_id"] == outcome["move"]["audit_run_id"] and ref.pdf
    moves = read.audit_events("tiny-llada", event="alias_move", registry=reg)
    assert list(moves.audit_run_id) == [attached["audit_run_id"]]
    html = reg.load_artifact_bytes(attached["audit_run_id"], attached["artifacts"]["html"])
    assert html == reg.load_artifact_bytes(ref.run_id, ref.html) and verify_html(html.decode())
    assert reg.load_artifact_bytes(attached["audit_run_id"], attached["artifacts"]["pdf"]).startswith(b"%PDF")
    assert DossierPage(html.decode()).sections == list(SECTIONS)
    assert {g["data-stage"] for g in DossierPage(html.decode()).gates} == {"poc"}  # the stage it was approved for


def test_evidence_changed_after_registration_gives_no_dossier(tmp_path, monkeypatch):
    from registry import register_evidence
    from registry.tracking import evidence_run_id
    from tests.support.gate_fixtures import evidence, fresh_registry

    reg = fresh_registry(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    version, _ = register_evidence(reg, evidence())
    run_id = evidence_run_id(reg, "tiny-llada", version)
    records = Path(reg.client.get_run(run_id).info.artifact_uri.removeprefix("file://")) / "evidence" / "records.json"
    records.write_text(records.read_text().replace('"accuracy": 0.72', '"accuracy": 0.99'))  # a forged score
    done = report("tiny-llada", "--out", str(tmp_path / "out"))
    assert done.exit_code == 2
    assert "evidence artifact evidence/records.json" in done.output and "was changed after registration" in done.output


def test_on_a_tracking_server_every_run_it_names_is_a_link_to_the_mlflow_ui(env):
    from dashboards.dossier import dossier_content, render_html

    content = dossier_content(Registry(env.tracking_uri), env.candidate, env.candidate_version, "poc")
    assert content["run_url"] == ""  # the embedded store has no UI to link to: runs are named
    content["run_url"] = (
        "http://127.0.0.1:5000/#/runs/"  # as `registry.links.run_url_base` gives for http://127.0.0.1:5000
    )
    html = render_html(content)
    linked = set(re.findall(r'href="http://127\.0\.0\.1:5000/#/runs/([0-9a-f]{32})"', html))
    named = {r["run_id"] for r in content["evaluation"]["records"]} | {content["evidence_run_id"]}
    named |= {g["run_id"] for g in content["gates"]["poc"]["results"] if g["run_id"]}
    assert named <= linked and verify_html(html)


class Headings(HTMLParser):
    """Every element id in a dossier, the text of its headings, and the signature block's lines."""

    def __init__(self, html: str):
        super().__init__()
        self.ids: set[str] = set()
        self.headings: list[str] = []
        self.signature_lines: list[dict[str, str]] = []
        self._in_heading = False
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if "signature-line" in (attrs.get("class") or ""):
            self.signature_lines.append(attrs)
        self._in_heading = tag in ("h2", "h3")
        if self._in_heading:
            self.headings.append("")

    def handle_endtag(self, tag):
        if tag in ("h2", "h3"):
            self._in_heading = False

    def handle_data(self, data):
        if self._in_heading:
            self.headings[-1] += data


def test_the_dossier_is_signable_recommendation_annex_iv_model_card_and_a_signature_line_per_approval(
    env, tmp_path, monkeypatch
):
    from dashboards.dossier.decision import ANNEX_IV, MODEL_CARD
    from gates.roles import load_roles

    done = report(env.candidate, "--version", env.candidate_version, "--out", str(tmp_path), "--no-pdf")
    assert done.exit_code == 0, done.output
    html = (tmp_path / f"{env.candidate}-v{env.candidate_version}-dossier.html").read_text()
    page = Headings(html)
    headings = [h.strip() for h in page.headings]
    for anchor, title in ANNEX_IV:
        assert anchor in page.ids and title in headings, title
    for title in MODEL_CARD:
        assert title in headings or title == "Metrics and why they fit" and "Metrics and why they fit" in headings, (
            title
        )
    assert {"Recommendation", "Signatures", "Staged rollouts"} <= set(headings)
    assert "recommendation-verdict" in page.ids and "decision-line" in page.ids
    verdict = html.split('id="recommendation-verdict">', 1)[1].split("<", 1)[0]
    assert verdict in ("adopt", "blocked", "inconclusive")  # the production decision's outcome
    roles = load_roles()
    for stage in ("poc", "staging", "production"):
        lines = [s for s in page.signature_lines if s["data-stage"] == stage]
        assert len(lines) >= roles.stage(stage).approvals_count, stage
    # the fixture approved poc (and staging): those lines are signed with the recorded approver
    assert any(s["data-signed"] == "yes" for s in page.signature_lines if s["data-stage"] == "poc")
    assert "demo-banner" not in page.ids and "demo-mark" not in page.ids  # the bundled roles, a fixture policy

    monkeypatch.setenv("UNMASK_ROLES", str(REPO / "gates" / "demo-roles.yaml"))
    done = report(env.candidate, "--version", env.candidate_version, "--out", str(tmp_path / "demo"), "--no-pdf")
    assert done.exit_code == 0, done.output
    demo = Headings((tmp_path / "demo" / f"{env.candidate}-v{env.candidate_version}-dossier.html").read_text())
    assert {"demo-banner", "demo-mark"} <= demo.ids  # the mark is position: fixed, printed on every PDF page
