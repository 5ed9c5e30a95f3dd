"""Fuzz: hostile input on every file and argument surface of `unmask` is refused, never half-accepted.

For every case (tests/support/fuzz_fixtures.refused): exit code 2, exactly one `error:` line naming the file
or argument and the key or value, no traceback, nothing written to the MLflow store. Surfaces:
CLI arguments, policies, checklists, catalogs, sweep files, task files and model folders; the HTTP
surface of `unmask serve` has its own fuzz in tests/e2e/test_serving_api.py.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gates.policy import POLICY_PATH
from tests.support import REPO
from tests.support.fuzz_fixtures import refused, row_counts, store_path

FAST = settings(
    max_examples=25,
    deadline=None,
    database=None,  # no .hypothesis/ folder in the checkout
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

# --- CLI arguments: checked by the shared callbacks of flows/commands/options.py ------------------

CLI_CASES = [
    (["eval", "--limit", "0"], "--limit", "0"),
    (["eval", "--limit", "-5"], "--limit", "-5"),
    (["eval", "--steps", "0"], "--steps", "0"),
    (["eval", "--threads", "-1"], "--threads", "-1"),
    (["eval", "--threads", "0"], "--threads", "0"),
    (["eval", "--gen-length", "0"], "--gen-length", "0"),
    (["eval", "--block-length", "-3"], "--block-length", "-3"),
    (["eval", "--batch-size", "0"], "--batch-size", "0"),
    (["eval", "--limit", "ten"], "--limit", "ten"),
    (["eval", "--sweep", "/nonexistent/sweep.yaml"], "/nonexistent/sweep.yaml", "not found"),
    (["generate", "hi", "--steps", "0"], "--steps", "0"),
    (["generate", "hi", "--gen-length", "0"], "--gen-length", "0"),
    (["generate", "hi", "--block-length", "0"], "--block-length", "0"),
    (["generate", "hi", "--device", "tpu"], "--device", "tpu"),
    (["generate", "hi", "--device", "cuda:x"], "--device", "cuda:x"),
    (["generate", "hi", "--device", ""], "--device", "''"),
    (
        ["generate", "hi", "--gen-length", "100000", "--block-length", "100000"],
        "gen_length 100000",
        "max_sequence_length",
    ),
    (["generate", "hi", "--model", "no-such-model"], "no-such-model"),
    (["generate", "hi", "--dtype", "float8"], "float8"),
    (["bench", "--gen-lengths", "0"], "--gen-lengths", "'0'"),
    (["bench", "--gen-lengths", ""], "--gen-lengths", "''"),
    (["bench", "--gen-lengths", "64,x"], "--gen-lengths", "64,x"),
    (["bench", "--gen-lengths", "64,-1"], "--gen-lengths", "64,-1"),
    (["bench", "--threads", "0"], "--threads", "0"),
    (["bench", "--reps", "0"], "--reps", "0"),
    (["bench", "--prompts", "0"], "--prompts", "0"),
    (["bench", "--warmup", "-1"], "--warmup", "-1"),
    (["bench", "--device", "tpu"], "--device", "tpu"),
    (["bench", "--block-length", "0"], "--block-length", "0"),
    (["serve", "--port", "99999"], "--port", "99999"),
    (["serve", "--port", "0"], "--port", "0"),
    (["serve", "--port", "-1"], "--port", "-1"),
    (["serve", "--port", "65536"], "--port", "65536"),
    (["serve", "--port", "http"], "--port", "http"),
    (["serve", "--device", "tpu"], "--device", "tpu"),
    (["serve", "--threads", "-2"], "--threads", "-2"),
    (["serve", "--max-batch", "0"], "--max-batch", "0"),
    (["dashboard", "--port", "70000"], "--port", "70000"),
    (["dashboard", "--port", "0"], "--port", "0"),
    (["train", "--steps", "0"], "--steps", "0"),
    (["train", "--threads", "-1"], "--threads", "-1"),
    (["train", "--device", "tpu"], "--device", "tpu"),
    (["train", "--stop-after", "0"], "--stop-after", "0"),
    (["train", "--model", "gpt-5"], "--model", "gpt-5"),
    (["audit", "--limit", "0"], "--limit", "0"),
    (["request-promotion", "tiny-llada", "poc", "--timeout", "0"], "--timeout", "0"),
    (["run", "--threads", "0"], "--threads", "0"),
    (["gates", "tiny-llada", "--stage", "canary"], "--stage", "canary"),
    (["gates"], "model"),
    (["eval", "--bogus"], "--bogus"),
    (["serve", "--weights", "tiny-llada"], "--weights", "NAME=FOLDER"),
    (["serve", "--weights", "tiny-llada=/nonexistent/folder"], "--weights", "/nonexistent/folder"),
    (["serve", "--api-key-file", "/nonexistent/keys"], "--api-key-file", "/nonexistent/keys", "cannot be read"),
    (["sign-off", "tiny-llada", "--stage", "canary", "--item", "x", "--by", "a", "--comment", "c"], "'canary'"),
    (["approve", "tiny-llada", "poc"], "--comment"),
    (["eval", "--tasks", "/nonexistent/tasks.jsonl"], "/nonexistent/tasks.jsonl", "not found"),
    (["models", "--catalog", "/nonexistent/catalog.yaml"], "/nonexistent/catalog.yaml", "not found"),
]


@pytest.mark.parametrize(
    "args, named", [(a, tuple(n)) for a, *n in CLI_CASES], ids=[" ".join(a)[:60] for a, *_ in CLI_CASES]
)
def test_cli_argument_is_refused(args, named):
    refused(args, *named)


def test_a_run_refused_after_booting_prefect_stops_the_server_it_booted(monkeypatch):
    """`unmask run` boots its local Prefect server before it checks its options (it boots on the other core
    meanwhile); refused, it stops that server at once. In process (a test, a notebook) it used to keep serving,
    its services polling, until the process ended: a refused run here cost 22 s of CPU over a suite."""
    from flows import local_prefect

    booted = []
    boot = local_prefect.LocalPrefect.boot.__func__
    monkeypatch.setattr(local_prefect, "_configured_api", lambda: False)  # local mode, even beside the test harness
    monkeypatch.setattr(
        local_prefect.LocalPrefect, "boot", classmethod(lambda cls: booted.append(boot(cls)) or booted[-1])
    )
    refused(["run", "--executor", "spark"], "--executor", "spark")
    [server] = booted
    assert server.child.poll() is not None and local_prefect.LocalPrefect._running is None


@FAST
@given(value=st.integers(max_value=0), option=st.sampled_from(["--limit", "--steps", "--threads", "--gen-length"]))
def test_any_count_below_one_is_refused(value, option):
    refused(["eval", option, str(value)], option, str(value))


@FAST
@given(port=st.one_of(st.integers(max_value=0), st.integers(min_value=65536)))
def test_any_port_outside_tcp_is_refused(port):
    refused(["serve", "--port", str(port)], "--port", str(port))


@FAST
@given(
    device=st.text(min_size=1, max_size=12).filter(
        lambda d: d.strip() == d and d not in ("cpu", "cuda", "mps") and not d.startswith(("cuda:", "-"))
    )
)
def test_any_unknown_device_is_refused(device):
    refused(["generate", "hi", "--device", device], "--device")


# --- policies: gates/policy.py --------------------------------------------------------------------


def _policy_data():
    return yaml.safe_load(POLICY_PATH.read_text())


def _gate(key_path):
    def edit(data, stage, value):
        *head, last = key_path.split(".")
        node = data["stages"][stage]
        for part in head:
            node = node[part]
        node[last] = value

    return edit


NAN, INF = float("nan"), float("inf")
POLICY_EDITS = [  # (what, key path under the stage, value, the value as the error line writes it)
    ("nan threshold", "gates.quality.threshold", NAN, "nan"),
    ("infinite threshold", "gates.quality.threshold", INF, "inf"),
    ("minus infinite threshold", "gates.quality.threshold", -INF, "-inf"),
    ("nan p95", "gates.latency.max_p95_s", NAN, "nan"),
    ("infinite p95", "gates.latency.max_p95_s", INF, "inf"),
    ("nan speedup", "gates.speedup.min_speedup", NAN, "nan"),
    ("infinite memory", "gates.memory.max_peak_mem_mb", INF, "inf"),
    ("nan error rate", "gates.error_rate.max_error_rate", NAN, "nan"),
    ("nan min change", "gates.quality_vs_fallback.min_absolute_change", NAN, "nan"),
    ("empty require", "gates.reproducibility.require", [], "[]"),
    ("empty tiers", "gates.license.allowed_tiers", [], "[]"),
    ("negative min_items", "gates.data_validity.min_items", -1, "-1"),
    ("unknown checklist item", "gates.tooling_maturity.checklist_item", "no-such-item", "'no-such-item'"),
    ("unknown task", "operating_point.task", "no-such-task", "'no-such-task'"),
    ("zero gen_length", "operating_point.gen_length", 0, "0"),
    ("nan weight", "scoring.weights.quality", NAN, "nan"),
]
POLICY_CASES = [(stage, *edit) for stage in ("poc", "staging", "production") for edit in POLICY_EDITS]


@pytest.mark.parametrize("stage, what, key, value, shown", POLICY_CASES, ids=[f"{c[0]}-{c[1]}" for c in POLICY_CASES])
def test_policy_is_refused_by_file_key_and_value(tmp_path, stage, what, key, value, shown):
    data = _policy_data()
    _gate(key)(data, stage, value)
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(data))
    refused(["gates", "tiny-llada", "--policy", str(path)], str(path), f"stages.{stage}.{key}", shown)


POLICY_COMMANDS = {
    "run": lambda path: ["run", "--policy", path],
    "request-promotion": lambda path: ["request-promotion", "tiny-llada", "poc", "--policy", path],
    "nightly-run": lambda path: ["nightly", "run", "--policy", path],
    "promote": lambda path: [
        "promote",
        "tiny-llada",
        "--to",
        "poc",
        "--approver",
        "a",
        "--comment",
        "c" * 30,
        "--policy",
        path,
    ],
}


@pytest.mark.parametrize("command", POLICY_COMMANDS)
@pytest.mark.parametrize("what, key, value, shown", [POLICY_EDITS[0], POLICY_EDITS[11]], ids=["nan", "negative"])
def test_every_command_that_takes_a_policy_refuses_it_first(tmp_path, command, what, key, value, shown):
    data = _policy_data()
    _gate(key)(data, "staging", value)
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(data))
    refused(POLICY_COMMANDS[command](str(path)), str(path), f"stages.staging.{key}", shown)


POLICY_FILES = [
    ("not-utf8", b"stages:\n  poc: \xff\xfe\n", "not UTF-8"),
    ("bad-yaml", b"stages: [unclosed\n", "not valid YAML"),
    ("a-list", b"- poc\n- staging\n", "'stages' mapping"),
    ("empty", b"", "'stages' mapping"),
    ("no-stage", b"stages: {poc: {}}\n", "stages.poc"),
]


@pytest.mark.parametrize("name, content, shown", POLICY_FILES, ids=[c[0] for c in POLICY_FILES])
def test_policy_file_that_is_not_a_policy_is_refused(tmp_path, name, content, shown):
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(content)
    refused(["gates", "tiny-llada", "--policy", str(path)], str(path), shown)


def test_missing_policy_file_is_refused(tmp_path):
    refused(["gates", "tiny-llada", "--policy", str(tmp_path / "none.yaml")], str(tmp_path / "none.yaml"), "not found")


@FAST
@given(
    value=st.one_of(
        st.just(NAN),
        st.just(INF),
        st.just(-INF),
        st.text(max_size=5),
        st.lists(st.integers(), max_size=2),
        st.booleans(),
        st.none(),
    )
)
def test_any_non_number_threshold_is_refused_by_the_policy_parser(value):
    from gates.policy import PolicyError, parse_policy

    data = _policy_data()
    data["stages"]["poc"]["gates"]["latency"]["max_p95_s"] = value
    with pytest.raises(PolicyError, match=r"^fuzz\.yaml: stages\.poc\.gates\.latency"):
        parse_policy(data, source="fuzz.yaml")


def test_a_nan_threshold_no_longer_passes_the_quality_gate():
    """The hole issue 23 found: NaN compares false both ways, so `value < nan` never failed a gate."""
    from gates.policy import PolicyError, parse_policy

    data = _policy_data()
    data["stages"]["poc"]["gates"]["quality"]["threshold"] = NAN
    with pytest.raises(PolicyError, match="expected a finite number, got nan"):
        parse_policy(data, source="p.yaml")
    assert math.isnan(NAN)


# --- checklists: checklists/checklist.py, read from $UNMASK_CHECKLISTS ----------------------------

CHECKLIST_DIR = REPO / "checklists"


def _checklist_data(stage="poc"):
    return yaml.safe_load((CHECKLIST_DIR / f"{stage}.yaml").read_text())


def _item(n, **changes):
    def edit(data):
        item = data["items"][n]
        for key, value in changes.items():
            if value is KeyError:
                item.pop(key, None)
            else:
                item[key] = value

    return edit


CHECKLIST_EDITS = [  # (what, edit of the poc checklist, named in the error)
    ("empty items", lambda d: d.__setitem__("items", []), "items"),
    ("items not a list", lambda d: d.__setitem__("items", {"a": 1}), "items"),
    ("wrong stage", lambda d: d.__setitem__("stage", "canary"), "'canary'"),
    ("item not a mapping", lambda d: d["items"].__setitem__(0, "license"), "items[0]"),
    ("missing id", _item(0, id=KeyError), "items[0].id"),
    ("numeric id", _item(0, id=7), "items[0].id"),
    ("duplicate id", lambda d: d["items"][1].__setitem__("id", d["items"][0]["id"]), "duplicate id"),
    ("unknown item key", _item(0, owner="ada"), "'owner'"),
    ("empty text", _item(0, text=" "), ".text"),
    ("text a number", _item(0, text=3), ".text"),
    ("frameworks missing one", _item(0, frameworks={"nist_ai_rmf": "GOVERN 1"}), ".frameworks"),
    (
        "bad NIST function",
        _item(0, frameworks={"nist_ai_rmf": "PLAN 1", "eu_ai_act_annex_iv": "2", "iso_42001": "9"}),
        "'PLAN 1'",
    ),
    ("evidence kind unknown", _item(0, evidence={"kind": "vibes"}), ".evidence.kind"),
    ("evidence missing", _item(0, evidence=KeyError), ".evidence.kind"),
    ("manual with a record field", _item(0, evidence={"kind": "manual", "record_field": "valid"}), ".evidence"),
    ("manual with a list of gates", _item(0, evidence={"kind": "manual", "gate": ["a", "b"]}), ".evidence.gate"),
    (
        "automatic with gate and field",
        _item(0, evidence={"kind": "automatic", "gate": "license", "record_field": "valid", "equals": True}),
        ".evidence",
    ),
    ("gate a number", _item(0, evidence={"kind": "automatic", "gate": 5}), ".evidence.gate"),
    ("gate list of numbers", _item(0, evidence={"kind": "automatic", "gate": [1, 2]}), ".evidence.gate"),
    (
        "record_field a number",
        _item(0, evidence={"kind": "automatic", "record_field": 5, "equals": 1}),
        ".evidence.record_field",
    ),
    (
        "non_empty a word",
        _item(0, evidence={"kind": "automatic", "record_field": "valid", "non_empty": "yes"}),
        ".evidence.non_empty",
    ),
    (
        "equals and non_empty",
        _item(0, evidence={"kind": "automatic", "record_field": "valid", "equals": True, "non_empty": True}),
        "equals or non_empty",
    ),
    ("unknown evidence key", _item(0, evidence={"kind": "automatic", "gate": "license", "weight": 2}), "'weight'"),
]
CHECKLIST_FILES = [
    ("not utf-8", b"stage: poc\nitems: \xff\n", "not UTF-8"),
    ("bad yaml", b"stage: poc\nitems: [\n", "not valid YAML"),
    ("a list", b"- stage\n- poc\n", "expected {stage"),
]


def _checklists(tmp_path, edit=None, content: bytes | None = None) -> Path:
    folder = tmp_path / "checklists"
    folder.mkdir()
    for stage in ("poc", "staging", "production"):
        shutil.copy(CHECKLIST_DIR / f"{stage}.yaml", folder / f"{stage}.yaml")
    if edit is not None:
        data = _checklist_data()
        edit(data)
        (folder / "poc.yaml").write_text(yaml.safe_dump(data))
    if content is not None:
        (folder / "poc.yaml").write_bytes(content)
    return folder


SIGN_OFF = ["sign-off", "tiny-llada", "--stage", "poc", "--item", "fallback-plan", "--by", "ada", "--comment", "ok"]
CHECKLIST_COMMANDS = {"gates": ["gates", "tiny-llada", "--stage", "poc"], "sign-off": SIGN_OFF}


@pytest.mark.parametrize("command", CHECKLIST_COMMANDS)
@pytest.mark.parametrize("what, edit, named", CHECKLIST_EDITS, ids=[c[0] for c in CHECKLIST_EDITS])
def test_malformed_checklist_is_one_line_from_gates_and_sign_off(tmp_path, command, what, edit, named):
    folder = _checklists(tmp_path, edit)
    refused(CHECKLIST_COMMANDS[command], str(folder / "poc.yaml"), named, env={"UNMASK_CHECKLISTS": str(folder)})


@pytest.mark.parametrize("command", CHECKLIST_COMMANDS)
@pytest.mark.parametrize("what, content, named", CHECKLIST_FILES, ids=[c[0] for c in CHECKLIST_FILES])
def test_unreadable_checklist_file_is_one_line(tmp_path, command, what, content, named):
    folder = _checklists(tmp_path, content=content)
    refused(CHECKLIST_COMMANDS[command], str(folder / "poc.yaml"), named, env={"UNMASK_CHECKLISTS": str(folder)})


@pytest.mark.parametrize("command", CHECKLIST_COMMANDS)
def test_missing_checklist_file_is_one_line(tmp_path, command):
    folder = _checklists(tmp_path)
    (folder / "poc.yaml").unlink()
    refused(CHECKLIST_COMMANDS[command], str(folder / "poc.yaml"), "not found", env={"UNMASK_CHECKLISTS": str(folder)})


@FAST
@given(text=st.text(max_size=200))
def test_any_text_as_a_checklist_is_a_checklist_or_a_checklist_error(tmp_path_factory, text):
    from checklists import ChecklistError, load_checklist

    folder = tmp_path_factory.mktemp("cl")
    (folder / "poc.yaml").write_text(text, encoding="utf-8")
    try:
        checklist = load_checklist("poc", folder)
    except ChecklistError as e:
        assert str(e).startswith(str(folder / "poc.yaml")) and "\n" not in str(e).strip()
    else:
        assert checklist.items  # accepted only with something to check


@pytest.fixture
def registered_store(tmp_path, monkeypatch):
    """A real SQLite MLflow store holding the tiny-llada / tiny-ar pair, as the state folder's own store."""
    from tests.support.gate_fixtures import fresh_registry, register_pair

    home = tmp_path / "home"
    monkeypatch.setenv("UNMASK_HOME", str(home))
    register_pair(fresh_registry(home))
    db = store_path(home)
    assert row_counts(db)["model_versions"] == 2
    return db


@pytest.mark.parametrize(
    "what, key, value, shown",
    [POLICY_EDITS[0], POLICY_EDITS[9], POLICY_EDITS[12]],
    ids=["nan", "empty-require", "unknown-item"],
)
def test_a_refused_policy_leaves_a_registered_store_as_it_was(tmp_path, registered_store, what, key, value, shown):
    data = _policy_data()
    _gate(key)(data, "poc", value)
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(data))
    for args in (
        ["gates", "tiny-llada", "--policy", str(path)],
        ["promote", "tiny-llada", "--to", "poc", "--approver", "a", "--comment", "x" * 30, "--policy", str(path)],
    ):
        refused(args, str(path), shown, db=registered_store)


PROMOTE = ["promote", "tiny-llada", "--to", "poc", "--approver", "grace", "--comment", "c" * 30]


@pytest.mark.parametrize("command", [*CHECKLIST_COMMANDS, "promote"])
def test_a_refused_checklist_leaves_a_registered_store_as_it_was(tmp_path, registered_store, command):
    folder = _checklists(tmp_path, CHECKLIST_EDITS[0][1])
    refused(
        CHECKLIST_COMMANDS.get(command, PROMOTE),
        str(folder / "poc.yaml"),
        "items",
        env={"UNMASK_CHECKLISTS": str(folder)},
        db=registered_store,
    )


# --- catalogs: models/catalog.py --------------------------------------------------------------------

GOOD_ENTRY = {
    "id": "good",
    "family": "llada",
    "kind": "masked-diffusion",
    "role": "candidate",
    "source": "hf://org/good",
    "revision": "main",
    "license": "MIT",
    "adapter": "llada",
}


def _entry(**changes):
    entry = dict(GOOD_ENTRY, id="bad", source="hf://org/bad")
    for key, value in changes.items():
        if value is KeyError:
            entry.pop(key, None)
        else:
            entry[key] = value
    return entry


CATALOG_ENTRIES = [  # (what, the broken entry, named in the error)
    ("source outside the tree", _entry(source="../../../../etc"), "'../../../../etc'"),
    ("absolute source outside", _entry(source="/etc"), "'/etc'"),
    ("home source outside", _entry(source="~/models/x"), "'~/models/x'"),
    ("outside flag not a bool", _entry(source="weights", allow_outside_source="yes"), "allow_outside_source"),
    ("unknown field", _entry(colour="red"), "'colour'"),
    ("upper-case id", _entry(id="Bad"), "'Bad'"),
    ("missing kind", _entry(kind=KeyError), "'kind'"),
    ("unknown kind", _entry(kind="quantum"), "'quantum'"),
    ("unknown role", _entry(role="judge"), "'judge'"),
    ("missing license", _entry(license=KeyError), "'license'"),
    ("non-SPDX license", _entry(license="free-ish"), "'free-ish'"),
    ("other license unnamed", _entry(license="other"), "license_name"),
    ("malformed hf", _entry(source="hf://just-a-name"), "'hf://just-a-name'"),
    ("unknown scheme", _entry(source="s3://bucket/x"), "'s3://bucket/x'"),
    ("url for a local kind", _entry(source="https://example.com/v1"), "'https://example.com/v1'"),
    ("pinned not a bool", _entry(pinned="yes"), "'yes'"),
    ("pinned without a commit", _entry(pinned=True), "revision"),
    ("sha256 not hex", _entry(sha256={"model.safetensors": "abc"}), "sha256"),
    ("negative parameters", _entry(parameters=-1), "-1"),
    ("unknown decoding key", _entry(decoding={"temperatur": 0.1}), "decoding.temperatur"),
    ("decoding wrong type", _entry(decoding={"steps": "many"}), "'many'"),
    ("unknown adapter", _entry(adapter="onnx"), "'onnx'"),
    ("adapter none without notes", _entry(adapter="none"), "notes"),
    (
        "api without api_model",
        _entry(kind="api", adapter="api", source="https://api.example.com/v1", revision=KeyError),
        "api_model",
    ),
    ("duplicate id", dict(GOOD_ENTRY), "duplicate"),
    ("entry not a mapping", "just-a-string", "entry #2"),
]


@pytest.mark.parametrize("what, entry, named", CATALOG_ENTRIES, ids=[c[0] for c in CATALOG_ENTRIES])
def test_one_broken_catalog_entry_is_named_and_the_others_still_listed(tmp_path, what, entry, named):
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump({"entries": [GOOD_ENTRY, entry]}))
    line = refused(["models", "--catalog", str(path)], str(path), named)
    assert "good" not in line.split(":", 2)[-1] or what == "duplicate id"


def test_models_table_lists_the_valid_entry_and_marks_the_broken_one(tmp_path):
    from typer.testing import CliRunner

    from tests.support.fuzz_fixtures import unmask_app

    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump({"entries": [GOOD_ENTRY, _entry(source="../../../../etc")]}))
    result = CliRunner().invoke(unmask_app(), ["models", "--catalog", str(path)], env={"COLUMNS": "120"})
    rows = [line for line in result.output.splitlines() if line.startswith("│")]
    assert any("good" in r and "masked-diffusion" in r for r in rows) and any(
        "bad" in r and "broken" in r for r in rows
    )


CATALOG_FILES = [
    ("not utf-8", b"entries:\n  - id: caf\xe9\n", "not UTF-8"),
    ("bad yaml", b"entries: [\n", "not valid YAML"),
    ("no entries", b"models: []\n", "'entries' list"),
    ("a list", b"- id: x\n", "'entries' list"),
]


@pytest.mark.parametrize("command", ["models", "pull"])
@pytest.mark.parametrize("what, content, named", CATALOG_FILES, ids=[c[0] for c in CATALOG_FILES])
def test_catalog_file_that_is_not_a_catalog_is_refused(tmp_path, command, what, content, named):
    path = tmp_path / "catalog.yaml"
    path.write_bytes(content)
    args = ["models", "--catalog", str(path)] if command == "models" else ["pull", "x", "--catalog", str(path)]
    refused(args, str(path), named)


@pytest.mark.parametrize("what, entry, named", CATALOG_ENTRIES[:3], ids=[c[0] for c in CATALOG_ENTRIES[:3]])
def test_pull_refuses_a_source_outside_the_catalog(tmp_path, what, entry, named):
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump({"entries": [entry]}))
    refused(["pull", "bad", "--catalog", str(path)], str(path), named, "allow_outside_source")


@FAST
@given(
    entry=st.dictionaries(
        st.sampled_from(sorted(GOOD_ENTRY) + ["sha256", "decoding", "pinned", "x"]),
        st.one_of(
            st.text(max_size=8), st.integers(), st.booleans(), st.none(), st.lists(st.text(max_size=3), max_size=2)
        ),
        max_size=9,
    )
)
@example(entry={"license": "\x1b"})  # license-expression's validate() raised AttributeError on it
def test_any_entry_is_an_entry_or_a_catalog_error_naming_the_file(tmp_path_factory, entry):
    from models.catalog import CatalogError, load_catalog

    path = tmp_path_factory.mktemp("cat") / "catalog.yaml"
    path.write_text(yaml.safe_dump({"entries": [dict(GOOD_ENTRY, **entry)]}))
    try:
        load_catalog(path)
    except CatalogError as e:
        assert str(e).startswith(f"{path}: ")
    tolerant = load_catalog(path, tolerant=True)
    assert len(tolerant) + len(tolerant.broken) == 1


# --- sweep files: evals/sweep.py --------------------------------------------------------------------

GOOD_SWEEP = {
    "name": "fuzz",
    "models": ["tiny-llada"],
    "tasks": [{"task": "arith", "n": 2}],
    "base": {"gen_length": 8, "block_length": 8},
    "grid": {"steps": [4]},
}
SWEEP_CASES = [
    ("unknown top key", {"modles": ["x"]}, "'modles'"),
    ("no models", {"models": []}, "'models'"),
    ("base unknown setting", {"base": {"temprature": 0.1}}, "base.temprature"),
    ("grid not a list", {"grid": {"steps": 4}}, "grid.steps"),
    ("grid empty list", {"grid": {"steps": []}}, "grid.steps"),
    ("measure negative", {"measure": {"batch_size": -1}}, "measure.batch_size"),
    ("threads zero", {"threads": 0}, "'threads'"),
    ("unknown task", {"tasks": [{"task": "chess"}]}, "'chess'"),
    ("bad split", {"tasks": [{"task": "arith", "split": "holdout"}]}, "'holdout'"),
    ("n zero", {"tasks": [{"task": "arith", "n": 0}]}, "tasks[0].n"),
    ("task and file", {"tasks": [{"task": "arith", "file": "x.jsonl"}]}, "exactly one"),
    ("name a list", {"name": ["a"]}, "'name'"),
    (
        "beyond the context",
        {"base": {"gen_length": 1024, "block_length": 1024}, "grid": {"steps": [1024]}},
        "max_sequence_length",
    ),
]


@pytest.mark.parametrize("what, change, named", SWEEP_CASES, ids=[c[0] for c in SWEEP_CASES])
def test_sweep_file_is_refused_by_key(tmp_path, what, change, named):
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(dict(GOOD_SWEEP, **change)))
    refused(["eval", "--sweep", str(path), "--no-repro", "--no-plot", "--out", str(tmp_path / "out")], str(path), named)


@pytest.mark.parametrize(
    "content, named",
    [(b"models: [\n", "not valid YAML"), (b"- 1\n", "expected a mapping"), (b"name: caf\xe9\n", "not UTF-8")],
    ids=["bad-yaml", "a-list", "not-utf8"],
)
def test_sweep_file_that_is_not_a_sweep_is_refused(tmp_path, content, named):
    path = tmp_path / "sweep.yaml"
    path.write_bytes(content)
    refused(["eval", "--sweep", str(path)], str(path), named)


# --- task files: evals/tasks/gsm8k.py ---------------------------------------------------------------

GOOD_LINE = json.dumps({"question": "1+1?", "answer": "#### 2"})
TASK_CASES = [
    ("not json", b"{question: 1+1}\n", ":1: not valid JSON"),
    ("missing question", json.dumps({"answer": "#### 2"}).encode() + b"\n", "field 'question'"),
    ("answer a number", json.dumps({"question": "q", "answer": 2}).encode() + b"\n", "field 'answer'"),
    ("no final answer", json.dumps({"question": "q", "answer": "two"}).encode() + b"\n", "'#### N'"),
    ("a list line", b"[1, 2]\n", "expected a JSON object"),
    ("a number line", b"42\n", "expected a JSON object"),
    ("not utf-8", b'{"question": "caf\xe9", "answer": "#### 1"}\n', "not UTF-8"),
    ("5 MB line", json.dumps({"question": "9" * 5_000_000, "answer": "#### 1"}).encode() + b"\n", "over 256 KiB"),
    ("bad second line", GOOD_LINE.encode() + b"\n{\n", ":2: not valid JSON"),
]


@pytest.mark.parametrize("what, content, named", TASK_CASES, ids=[c[0] for c in TASK_CASES])
def test_task_file_is_refused_by_line_and_field(tmp_path, what, content, named):
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(content)
    refused(
        [
            "eval",
            "--model",
            "tiny-llada",
            "--tasks",
            str(path),
            "--gen-length",
            "8",
            "--steps",
            "4",
            "--no-repro",
            "--no-plot",
            "--out",
            str(tmp_path / "out"),
        ],
        str(path),
        named,
    )


def test_task_file_missing_and_gen_length_beyond_the_context(tmp_path):
    refused(["eval", "--model", "tiny-llada", "--tasks", str(tmp_path / "none.jsonl")], "none.jsonl", "not found")
    path = tmp_path / "tasks.jsonl"
    path.write_text(GOOD_LINE + "\n")
    refused(
        [
            "eval",
            "--model",
            "tiny-llada",
            "--tasks",
            str(path),
            "--gen-length",
            "100000",
            "--no-repro",
            "--no-plot",
            "--out",
            str(tmp_path / "out"),
        ],
        "gen_length 100000",
        "max_sequence_length 640",
    )


def test_a_5mb_prompt_is_refused_before_it_is_tokenised():
    refused(["generate", "9" * 5_000_000], "5000000 characters", "max_sequence_length")


# --- model folders: models/checkpoint.py and the adapters ------------------------------------------


@pytest.fixture(scope="module")
def good_model(tmp_path_factory):
    from tests.support.eval_fixtures import write_model

    return write_model(tmp_path_factory.mktemp("fuzz-model") / "m")


def _copy(good: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(good, folder)
    return folder


MODEL_CASES = [
    ("no config", lambda f: (f / "config.json").unlink(), "config.json"),
    ("config not json", lambda f: (f / "config.json").write_text("{d_model: 32"), "config.json"),
    ("config not utf-8", lambda f: (f / "config.json").write_bytes(b'{"d_model": "\xff"}'), "config.json"),
    ("config a list", lambda f: (f / "config.json").write_text("[1]"), "config.json"),
    ("no weights", lambda f: (f / "model.safetensors").unlink(), "safetensors"),
    (
        "truncated weights",
        lambda f: (f / "model.safetensors").write_bytes((f / "model.safetensors").read_bytes()[:100]),
        "model.safetensors",
    ),
    (
        "pickle only",
        lambda f: ((f / "model.safetensors").unlink(), (f / "pytorch_model.bin").write_bytes(b"\x80\x04K.")),
        "pickle",
    ),
    ("no tokenizer", lambda f: (f / "tokenizer.json").unlink(), "tokenizer"),
]


@pytest.mark.parametrize("what, damage, named", MODEL_CASES, ids=[c[0] for c in MODEL_CASES])
def test_broken_model_folder_is_refused_by_file(tmp_path, good_model, what, damage, named):
    folder = _copy(good_model, tmp_path)
    damage(folder)
    refused(["generate", "hi", "--model", str(folder), "--gen-length", "8", "--block-length", "8"], named)


def test_the_fuzz_suite_has_at_least_150_cases():
    """The count issue 23 asks for, per surface (parametrised cases; Hypothesis examples come on top)."""
    counts = {
        "cli arguments": len(CLI_CASES),
        "policies": len(POLICY_CASES) + len(POLICY_FILES) + 1 + 3 * 2 + 2 * len(POLICY_COMMANDS),
        "checklists": 2 * (len(CHECKLIST_EDITS) + len(CHECKLIST_FILES) + 1) + 3,
        "catalogs": len(CATALOG_ENTRIES) + 2 * len(CATALOG_FILES) + 3,
        "sweep files": len(SWEEP_CASES) + 3,
        "task files": len(TASK_CASES) + 3,
        "model folders": len(MODEL_CASES),
    }
    print(counts, sum(counts.values()))
    assert sum(counts.values()) >= 150, counts
