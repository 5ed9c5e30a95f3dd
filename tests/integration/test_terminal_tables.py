"""The table commands at COLUMNS=80: headers and model names whole, numbers as people write them,
what did not fit named under the table; `next:` names the command that clears the real blocker.

The real CLI (typer's CliRunner) over a real SQLite MLflow store; `fits_80` checks the layout.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from tests.support.eval_fixtures import write_model
from tests.support.flow_fixtures import (
    cli_app,
)
from tests.support.gate_fixtures import act_as, evidence, fresh_registry, record, register_pair
from tests.support.tables import NARROW, dropped, fits_80

# staging and production count only acts signed by listed keys: the bundled roles with the people's keys listed
pytestmark = pytest.mark.usefixtures("team_keys")

RAW_FLOAT = re.compile(r"\d\.\d{5,}")  # 0.02230288574997985: more digits than any measurement here supports


def rows(text: str) -> dict[str, list[str]]:
    """The body rows of a table by their first cell, each cell's wrapped lines joined by a space."""
    found: list[list[str]] = []
    for line in text.splitlines():
        if not line.startswith("│"):
            continue
        cells = [cell.strip() for cell in line.strip("│").split("│")]
        if cells[0]:
            found.append(cells)
        else:  # a wrapped line of the row above
            found[-1] = [f"{a} {b}".strip() for a, b in zip(found[-1], cells)]
    return {cells[0]: cells for cells in found}


@pytest.fixture
def registered(tmp_path, monkeypatch):
    """tiny-ar (fallback) and tiny-llada (candidate, with a p95 of many digits) in a fresh store."""
    reg = fresh_registry(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    candidate = evidence(
        records=[record(latency_p95_s=0.02230288574997985, peak_mem_mb=797.1484375), record(task="sort")]
    )
    _, version = register_pair(reg, candidate)
    return reg, version


def test_gates_at_80_columns_reads_as_words_and_names_the_sign_off_first(registered):
    result = CliRunner().invoke(cli_app("gates"), ["gates", "tiny-llada", "--stage", "poc"], env=NARROW)
    assert result.exit_code == 1, result.output  # blocked: the sign-offs and the approval are missing
    text = result.output
    fits_80(
        text,
        ["gate", "passed", "measured", "required", "why", "record"],
        ["tiny-llada", "tooling_maturity", "quality_vs_fallback"],
    )
    assert "record" in dropped(text)  # the record id goes first at 80 columns, and says so
    assert not RAW_FLOAT.search(text) and "['" not in text and "{'" not in text, text
    gates = {gate: cells[2:4] for gate, cells in rows(text).items()}  # (measured, required)
    assert gates["latency"] == ["22.3 ms", "<= 5000 ms"] and gates["memory"] == ["797 MB", "<= 16384 MB"]
    assert gates["quality"] == ["72.0%", ">= 30%"] and gates["quality_vs_fallback"] == ["72.0%", ">= fallback - 20 pts"]
    assert gates["license"] == ["permitted", "permitted or caution"]
    assert gates["reproducibility"] == ["same process", "same process"]
    assert gates["data_validity"] == ["120 items", ">= 16 items"] and gates["error_rate"] == ["0%", "<= 5%"]
    assert gates["speedup"][1] == ">= 0.2x" and gates["tooling_maturity"] == [
        "no sign-off",
        "sign-off of tooling-maturity",
    ]
    # the first step is what blocks first: the unsigned checklist items, then the approval, then the move
    steps = [line.strip() for line in text.splitlines() if line.strip().startswith(("next:", "then:"))]
    assert steps[0] == (
        'next: unmask sign-off tiny-llada --stage poc --item fallback-plan --comment "what was checked"'
    ), steps
    assert steps[1].startswith("then: unmask sign-off tiny-llada --stage poc --item tooling-maturity")
    assert steps[2].startswith("then: unmask approve tiny-llada poc --comment")
    assert steps[3] == "then: unmask promote tiny-llada --to poc"


def test_gates_hint_follows_the_blocker_once_the_sign_offs_are_in(registered):
    from registry import approve, sign_off

    reg, version = registered
    for item in ("fallback-plan", "tooling-maturity"):
        sign_off(reg, "tiny-llada", version, "poc", item, "ada", f"{item} checked")
    run = CliRunner().invoke
    text = run(cli_app("gates"), ["gates", "tiny-llada", "--stage", "poc"], env=NARROW).output
    steps = [line.strip() for line in text.splitlines() if line.strip().startswith(("next:", "then:"))]
    assert steps[0].startswith("next: unmask approve tiny-llada poc --comment") and "sign-off" not in " ".join(steps)
    approve(reg, "tiny-llada", version, "poc", "grace", "poc evidence reviewed")
    adopt = run(cli_app("gates"), ["gates", "tiny-llada", "--stage", "poc"], env=NARROW)
    text = adopt.output
    assert adopt.exit_code == 0 and "decision: tiny-llada v1 -> poc: adopt" in text
    assert "next: unmask promote tiny-llada --to poc" in text
    # staging needs poc first: that promotion is named before the approval staging needs
    text = run(cli_app("gates"), ["gates", "tiny-llada", "--stage", "staging"], env=NARROW).output
    steps = [line.strip() for line in text.splitlines() if line.strip().startswith(("next:", "then:"))]
    assert "then: unmask promote tiny-llada --to poc" in steps
    assert steps.index("then: unmask promote tiny-llada --to poc") < steps.index(
        "then: unmask promote tiny-llada --to staging"
    )


def test_a_policy_given_to_gates_is_the_one_the_promote_hint_judges_under(registered, tmp_path):
    import shutil

    from gates.policy import POLICY_PATH

    policy = tmp_path / "my policy.yaml"  # a space: the hint quotes it so it can be pasted
    shutil.copy(POLICY_PATH, policy)
    text = (
        CliRunner()
        .invoke(cli_app("gates"), ["gates", "tiny-llada", "--stage", "poc", "--policy", str(policy)], env=NARROW)
        .output
    )
    steps = [line.strip() for line in text.splitlines() if line.strip().startswith(("next:", "then:"))]
    assert steps[-1] == f"then: unmask promote tiny-llada --to poc --policy '{policy}'", steps
    assert not any(
        "--policy" in step for step in steps if "sign-off" in step or "approve" in step
    )  # they judge nothing


def test_sign_offs_and_approval_older_than_the_latest_evaluation_are_asked_for_again(registered):
    from registry import approve, register_evidence, sign_off

    reg, version = registered
    for item in ("fallback-plan", "tooling-maturity"):
        sign_off(reg, "tiny-llada", version, "poc", item, "ada", f"{item} checked")
    approve(reg, "tiny-llada", version, "poc", "grace", "poc evidence reviewed")
    again, _ = register_evidence(reg, evidence())  # re-evaluated: what was signed and approved predates it
    assert again == version
    text = CliRunner().invoke(cli_app("gates"), ["gates", "tiny-llada", "--stage", "poc"], env=NARROW).output
    assert "predates the latest evaluation" in text
    steps = [
        line.strip().split(" --by")[0].split(" --comment")[0]
        for line in text.splitlines()
        if line.strip().startswith(("next:", "then:"))
    ]
    assert steps == [
        "next: unmask sign-off tiny-llada --stage poc --item fallback-plan",
        "then: unmask sign-off tiny-llada --stage poc --item tooling-maturity",
        "then: unmask approve tiny-llada poc",
        "then: unmask promote tiny-llada --to poc",
    ], text


def test_a_failed_measurement_asks_for_new_evidence_first(tmp_path, monkeypatch):
    reg = fresh_registry(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    register_pair(reg, evidence(records=[record(accuracy=0.1), record(task="sort")]))
    text = CliRunner().invoke(cli_app("gates"), ["gates", "tiny-llada", "--stage", "poc"], env=NARROW).output
    assert rows(text)["quality"][1:4] == ["no", "10.0%", ">= 30%"]
    first = next(line.strip() for line in text.splitlines() if line.strip().startswith("next:"))
    assert first == "next: unmask run --model tiny-llada", text


def test_an_inconclusive_gate_has_its_own_word_says_what_settles_it_and_the_run_that_does(tmp_path, monkeypatch):
    reg = fresh_registry(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    register_pair(reg, evidence(records=[record(n_items=16), record(task="sort", n_items=16)]))
    result = CliRunner().invoke(cli_app("gates"), ["gates", "tiny-llada", "--stage", "staging", "--store"], env=NARROW)
    assert result.exit_code == 1, result.output  # blocked: tooling_maturity fails (a missing sign-off)
    text = result.output
    fits_80(text, ["gate", "passed", "measured", "required", "why"], ["tiny-llada", "data_validity"])
    assert "-> staging: blocked (10/12 gates passed, 1 inconclusive)" in text
    assert rows(text)["data_validity"][1:4] == ["inconclusive", "16 items", ">= 50 items"]
    assert rows(text)["tooling_maturity"][1] == "no"  # a missing sign-off is still a fail
    lines = [line.strip() for line in text.splitlines()]
    assert "inconclusive data_validity: needs 34 more items on arith (50 per task)" in lines
    steps = [line for line in lines if line.startswith(("next:", "then:"))]
    assert steps[0] == "next: unmask run --model tiny-llada --items 50", steps
    from registry.read import gate_results  # what `unmask gates` recorded, for the dashboard

    stored = gate_results("tiny-llada", "1", "staging", registry=reg).set_index("gate")
    assert (
        stored.loc["data_validity", "verdict"] == "inconclusive" and stored.loc["tooling_maturity", "verdict"] == "fail"
    )
    assert stored.loc["data_validity", "settle"] == "needs 34 more items on arith (50 per task)"
    tags = reg.version_tags("tiny-llada", "1")
    assert tags["unmask.gates.staging"] == "failed" and tags["unmask.gates.staging.inconclusive"] == "data_validity"


def test_audit_at_80_columns_keeps_who_what_and_the_comment(registered, monkeypatch):
    run = CliRunner().invoke
    app = cli_app("promote")
    act_as("ada")  # each from their own keys folder (gate_fixtures.act_as)
    signed = run(
        app,
        [
            "sign-off",
            "tiny-llada",
            "--stage",
            "poc",
            "--item",
            "fallback-plan",
            "--by",
            "ada",
            "--comment",
            "fallback plan reviewed with the on-call team",
        ],
        env=NARROW,
    )
    assert signed.exit_code == 0, signed.output
    act_as("grace")
    refused = run(
        app,
        [
            "promote",
            "tiny-llada",
            "--to",
            "poc",
            "--approver",
            "grace",
            "--comment",
            "evidence reviewed, gates and checklist are green",
        ],
        env=NARROW,
    )
    assert refused.exit_code == 1
    trail = run(app, ["audit"], env=NARROW)
    assert trail.exit_code == 0, trail.output
    fits_80(
        trail.output,
        ["when (UTC)", "event", "who", "stage", "model", "from", "to", "status", "comment"],
        ["tiny-llada", "ada", "grace", "promotion_refused", "signoff"],
    )
    assert "on-call" in trail.output and "status" in dropped(trail.output)


def test_eval_at_80_columns(tmp_path, monkeypatch):
    monkeypatch.setenv("UNMASK_HOME", str(tmp_path / "home"))
    model = write_model(tmp_path / "tiny-diffusion-model")
    tasks = tmp_path / "gsm.jsonl"
    tasks.write_text("\n".join(json.dumps({"question": f"{i}+1?", "answer": f"#### {i + 1}"}) for i in range(3)) + "\n")
    result = CliRunner().invoke(
        cli_app("eval"),
        [
            "eval",
            "--model",
            str(model),
            "--tasks",
            str(tasks),
            "--gen-length",
            "8",
            "--steps",
            "4",
            "--no-repro",
            "--no-plot",
        ],
        env=NARROW,
    )
    assert result.exit_code == 0, result.output
    text = result.output[result.output.index("eval records") :]
    fits_80(
        text,
        [
            "candidate",
            "task",
            "config",
            "accuracy",
            "p50 latency (ms)",
            "p95 latency (ms)",
            "first block (ms)",
            "items/s",
            "tokens/s",
            "tokens per forward",
            "forward passes",
            "peak memory (MB)",
            "errors",
            "valid",
        ],
        ["tiny-diffusion-model"],
    )
    assert re.search(r"│ +\d+(\.\d+)?% │", text), text  # accuracy as a percentage
    assert dropped(text), text  # fourteen columns do not fit 80; the footer says which went


def test_bench_at_80_columns(tmp_path):
    from tests.support.eval_fixtures import write_random_model

    folders = write_random_model(tmp_path / "rand-llada"), write_random_model(tmp_path / "rand-ar", causal=True, seed=1)
    result = CliRunner().invoke(
        cli_app("bench"),
        [
            "bench",
            "--model",
            str(folders[0]),
            "--ar-model",
            str(folders[1]),
            "--gen-lengths",
            "32",
            "--block-length",
            "16",
            "--prompts",
            "2",
            "--reps",
            "3",
            "--warmup",
            "0",
            "--configs",
            "vanilla,parallel-threshold-0.9,tiny-ar",
        ],
        env=NARROW,
    )
    assert result.exit_code == 0, result.output
    text = result.stdout
    fits_80(
        text,
        [
            "config",
            "gen length",
            "accuracy arith",
            "accuracy sort",
            "forward passes",
            "sequential calls",
            "tokens per forward",
            "tokens/s (padded)",
            "tokens/s (text)",
            "speedup",
            "speedup 95% interval",
            "peak memory (MB)",
            "draft acceptance",
            "same text as vanilla",
        ],
        ["vanilla", "parallel-threshold-0.9", "tiny-ar"],
    )
    assert re.search(r"│ vanilla .*│ +1\.00x │", text), text  # the baseline's speedup, to 3 digits
    assert not RAW_FLOAT.search(text)


def test_numbers_keep_the_digits_a_measurement_supports():
    from gates.readable import exact, milliseconds, percent, significant

    assert significant(0.02230288574997985) == "0.0223" and significant(797.1484375) == "797"
    assert significant(1234.5) == "1230" and significant(1.0) == "1.00" and significant(-0.5) == "-0.500"
    assert significant(None) == "-" and significant(0) == "0" and significant(123456.0) == "123000"
    assert milliseconds(0.02230288574997985) == "22.3" and percent(0.9375) == "93.8%" and percent(1.0) == "100%"
    assert exact(1e9) == "1000000000" and exact(0.2) == "0.2" and exact(16384) == "16384"  # thresholds: as written


def test_every_bundled_threshold_reads_as_a_person_writes_it():
    from gates import load_policy
    from gates.readable import gate_threshold

    production = {g.name: gate_threshold(g, None) for g in load_policy().stage("production").gates}
    assert production == {
        "quality": ">= 60%",
        "quality_vs_fallback": ">= fallback",
        "quality_vs_production": ">= 98% of production",
        "latency": "<= 1000 ms",
        "speedup": ">= 1x",
        "memory": "<= 4096 MB",
        "license": "permitted",
        "reproducibility": "same process, fresh process and batch invariant",
        "data_validity": ">= 100 items",
        "error_rate": "no errors",
        "tooling_maturity": "sign-off of tooling-maturity",
        "license_review": "permissive, or sign-off of license-review",
        "serving": "16 in flight: p95 <= 2000 ms, no errors, >= 1x fallback tokens/s",
    }
    staging = {g.name: gate_threshold(g, None) for g in load_policy().stage("staging").gates}
    assert staging["quality_vs_fallback"] == ">= fallback - 5 pts" and staging["error_rate"] == "<= 1%"
    assert staging["license"] == "permitted or caution"
    assert staging["serving"] == "16 in flight: p95 <= 5000 ms, errors <= 1%, >= 0.1x fallback tokens/s"


@pytest.mark.parametrize("explain", [False, True])
def test_models_at_80_columns(explain, tmp_path, monkeypatch):
    monkeypatch.setenv("UNMASK_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("UNMASK_CATALOG", raising=False)
    result = CliRunner().invoke(cli_app("models"), ["models"] + (["--explain"] if explain else []), env=NARROW)
    assert result.exit_code == 0, result.output
    fits_80(
        result.output,
        ["id", "kind", "role", "license", "size", "pulled"] + (["status"] if explain else []),
        ["tiny-llada", "tiny-ar", "diffusiongemma-26b-a4b", "candidate", "Apache-2.0"]
        + ([] if explain else ["masked-diffusion"]),
    )  # with --explain the kind gives way to the status


def test_an_inconclusive_gate_that_a_load_test_settles_names_the_load_test_not_a_run(tmp_path, monkeypatch):
    reg = fresh_registry(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    candidate = evidence(records=[record(n_items=100), record(task="sort", n_items=100)])
    register_pair(reg, replace(candidate, serving=[]))
    text = CliRunner().invoke(cli_app("gates"), ["gates", "tiny-llada", "--stage", "staging"], env=NARROW).output
    assert rows(text)["serving"][1] == "inconclusive", text
    steps = [line.strip() for line in text.splitlines() if line.strip().startswith(("next:", "then:"))]
    assert "next: unmask loadtest --model tiny-llada --concurrency 16" in steps, text
    assert not any(s.startswith(("next: unmask run", "then: unmask run")) for s in steps), steps


def test_unmask_gates_records_nothing_unless_asked_to_store(tmp_path, monkeypatch):
    from registry.read import gate_results

    reg = fresh_registry(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    register_pair(reg, evidence(records=[record(n_items=16), record(task="sort", n_items=16)]))
    shown = CliRunner().invoke(cli_app("gates"), ["gates", "tiny-llada", "--stage", "staging"], env=NARROW)
    assert shown.exit_code == 1, shown.output  # blocked, and printed all the same
    assert "recorded nowhere" in shown.output
    assert gate_results("tiny-llada", "1", "staging", registry=reg).empty  # the dashboard's verdicts untouched
    stored = CliRunner().invoke(cli_app("gates"), ["gates", "tiny-llada", "--stage", "staging", "--store"], env=NARROW)
    assert stored.exit_code == 1, stored.output
    assert not gate_results("tiny-llada", "1", "staging", registry=reg).empty
    # the decision is stored with the gate report (hashed alike) and read back as it was
    shown = CliRunner().invoke(cli_app("gates"), ["gates", "tiny-llada", "--stage", "staging", "--stored"], env=NARROW)
    assert "decision when judged: tiny-llada v1 -> staging: blocked (" in " ".join(shown.output.split()), shown.output


def test_help_groups_the_commands_by_task_with_plain_flag_types():
    from flows.cli import HELP_PANELS, _register_all, app

    _register_all()
    shown = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "120"})
    assert shown.exit_code == 0, shown.output
    text = shown.output
    starts = [text.index(f"─ {panel} ─") for panel in HELP_PANELS]
    assert starts == sorted(starts)  # evaluate, decide, serve, roll out, audit
    for panel, names in HELP_PANELS.items():
        block = text[text.index(f"─ {panel} ─") :].split("╰", 1)[0]
        rows = [
            line[2:].split(" ", 1)[0] for line in block.splitlines()[1:] if line.startswith("│ ") and line[2:3].strip()
        ]  # not a wrapped description's next line
        assert [r for r in rows if r] == [n for n in names if n in rows], panel
        assert set(names) <= set(rows), panel
    for command in (["--help"], ["run", "--help"], ["gates", "--help"], ["rollout", "start", "--help"]):
        out = CliRunner().invoke(app, command, env={"COLUMNS": "160"}).output
        assert "<bool>" not in out and "<str>" not in out and "<path>" not in out, command
    assert "PATH" in CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "160"}).output


def test_the_decision_table_of_two_candidates_fits_80_columns_in_40_lines_with_every_word_whole(tmp_path, monkeypatch):
    """The default run's decision table (two candidates, three stages) at COLUMNS=80: the less read speed columns
    give way (named under it), no word is folded, the blockers shown in a few words each, and 40 lines at most."""
    from flows.commands.run import console, decision_table
    from gates import load_policy
    from registry.decision import decisions

    reg = fresh_registry(tmp_path)
    register_pair(reg, evidence(records=[record(n_items=16), record(task="sort", n_items=16)]))
    found = decisions(reg, load_policy())
    two = found + [replace(d, model="tiny-dgemma") for d in found]  # a second candidate, judged alike
    monkeypatch.setenv("COLUMNS", "80")
    with console.capture() as cap:
        console.print(decision_table(two))
    text = cap.get()
    fits_80(text, ["candidate, stage", "accuracy (95% CI)", "p95 vs AR", "tokens/s vs AR", "decision"], ["tiny-llada"])
    assert len(text.splitlines()) <= 40, text
    assert "tokens/s vs AR" in dropped(text)
    words = set(re.split(r"[\s│┃]+", text)) | {w.rstrip(",") for w in re.split(r"[\s│┃]+", text)}
    for d in two:  # every word of the blockers shown, the outcome and the stage appear whole, never folded
        for label in d.blocker_labels()[:2]:
            assert set(label.replace("_", " ").split()) <= words, (label, text)
        assert {d.outcome.value, d.stage} <= words
    assert {"(47.5%–88.0%,", "n=16)", "slower", "(2.00–2.00x)"} <= words, text
