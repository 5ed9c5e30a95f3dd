"""Fuzz, round two (issue 36): the surfaces added since the first round, each refused up front in one line.

Surfaces: roles files, serving policies (routes, arms, health, limits), rollout policies, load test and rollout
arguments, environment variables. Most cases call the validator in-process (what every command calls first):
the error is the surface's own class, one line, naming the file (or option, or variable), the key and the value.
A sample of each surface goes through the real `unmask` CLI (tests/support/fuzz_fixtures.refused: exit 2, one `error:`
line, no traceback, the store unchanged). Property tests cover YAML duplicates and numeric extremes.
`test_every_new_surface_has_at_least_50_cases` counts them.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import REPO
from tests.support.fuzz_fixtures import refused

FAST = settings(
    max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def one_line(error: Exception, *named: object) -> str:
    text = str(error)
    assert "\n" not in text and text.strip() == text, f"not one line: {text!r}"
    for part in named:
        assert str(part) in text, f"{part!r} not named in: {text}"
    return text


def _set(data: dict, dotted: str, value) -> dict:
    """A deep copy of `data` with `dotted` (a.b.c) set to `value` (DELETE removes it)."""
    out = copy.deepcopy(data)
    *head, last = dotted.split(".")
    node = out
    for key in head:
        node = node[key]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return out


DELETE = object()

# --- roles: gates/roles.py ---------------------------------------------------------------------------------------
# a team's roles file with named people (what an authenticated server's users would be): its groups, users and
# counts are what the validation reads; the bundled demo file lets anyone ("*") and is checked below too
TEAM_ROLES = yaml.safe_load("""
users: [ada, bob, eve, grace, linus, olga]
groups:
  architects: [ada]
  approvers: [bob, eve, grace, linus]
  oncall: [olga]
stages:
  poc:
    sign_off: {"*": [architects]}
    approve: [approvers]
    emergency_rollback: [oncall]
    approvals: {count: 1, distinct: true}
    approval_ttl_hours: 168
    self_approval: true
  staging:
    sign_off: {"*": [architects]}
    approve: [approvers]
    emergency_rollback: [oncall]
    approvals: {count: 1, distinct: true}
    approval_ttl_hours: 72
    self_approval: false
  production:
    sign_off: {"*": [architects]}
    approve: [approvers]
    emergency_rollback: [oncall]
    approvals: {count: 2, distinct: true}
    approval_ttl_hours: 24
    self_approval: false
""")
ANYONE_ROLES = yaml.safe_load((REPO / "gates" / "roles.yaml").read_text())

ROLES_STAGE_EDITS = [  # (what, key under stages.<stage>, value, named beside the key)
    ("a thousand approvals", "approvals.count", 1000, "1000"),
    ("more approvals than approvers", "approvals.count", 5, "4 who may approve"),
    ("zero approvals", "approvals.count", 0, "0"),
    ("negative approvals", "approvals.count", -1, "-1"),
    ("approval count as text", "approvals.count", "2", "'2'"),
    ("approval count as bool", "approvals.count", True, "True"),
    ("approvals not distinct", "approvals.distinct", False, "False"),
    ("approvals unknown key", "approvals.quorum", 2, "quorum"),
    ("misspelled group", "approve", ["approver"], "'approver'"),
    ("approver listed twice", "approve", ["approvers", "approvers"], "listed twice"),
    ("user listed twice in a rule", "emergency_rollback", ["olga", "olga"], "listed twice"),
    ("unknown user in a rule", "emergency_rollback", ["mallory"], "'mallory'"),
    ("rule not a list", "approve", "approvers", "'approvers'"),
    ("sign-off of an unknown item", "sign_off", {"no-such-item": ["architects"]}, "no-such-item"),
    ("sign-off by a misspelled group", "sign_off", {"*": ["architect"]}, "'architect'"),
    ("ttl zero", "approval_ttl_hours", 0, "0"),
    ("ttl negative", "approval_ttl_hours", -1, "-1"),
    ("ttl infinite", "approval_ttl_hours", math.inf, "inf"),
    ("ttl text", "approval_ttl_hours", "a day", "'a day'"),
    ("self approval text", "self_approval", "yes", "'yes'"),
    ("unknown stage key", "quorum", 2, "quorum"),
    ("approve missing", "approve", DELETE, "approve"),
]
ROLES_TOP_EDITS = [  # (what, dotted key, value, named)
    ("user listed twice", "users", ["ada", "bob", "ada", "eve", "grace", "linus", "olga"], "'ada' is listed twice"),
    ("no users", "users", [], "users"),
    ("users not a list", "users", "ada", "users"),
    ("group member unknown", "groups.oncall", ["olga", "zed"], "'zed'"),
    ("group member twice", "groups.approvers", ["bob", "eve", "bob"], "listed twice"),
    ("group named like a user", "groups.ada", ["bob"], "'ada' is a user too"),
    ("group named *", "groups.*", ["bob"], "groups.*"),
    ("groups not a mapping", "groups", ["ada"], "groups"),
    ("unknown top key", "owners", ["ada"], "owners"),
    ("unknown stage", "stages.canary", {}, "stages.canary"),
    ("stage missing", "stages.poc", DELETE, "stages.poc"),
    ("stages not a mapping", "stages", [], "stages"),
]
ROLES_CASES = [
    (f"{stage}: {what}", f"stages.{stage}.{key}", value, (f"stages.{stage}", shown))
    for stage in ("poc", "staging", "production")
    for what, key, value, shown in ROLES_STAGE_EDITS
    if not (stage == "production" and key == "approvals.count" and value == 1)
] + [(what, key, value, (shown,)) for what, key, value, shown in ROLES_TOP_EDITS]


def _write(tmp_path: Path, name: str, data) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("what, key, value, named", ROLES_CASES, ids=[c[0] for c in ROLES_CASES])
def test_roles_file_is_refused_by_file_key_and_value(tmp_path, what, key, value, named):
    from gates.roles import RolesError, load_roles

    path = _write(tmp_path, "roles.yaml", _set(TEAM_ROLES, key, value))
    with pytest.raises(RolesError) as e:
        load_roles(path)
    one_line(e.value, path, *named)


@pytest.mark.parametrize("stage", ["poc", "staging", "production"])
def test_a_misspelled_group_is_refused_even_when_anyone_is_a_user(tmp_path, stage):
    from gates.roles import RolesError, load_roles

    path = _write(tmp_path, "roles.yaml", _set(ANYONE_ROLES, f"stages.{stage}.approve", ["aprovers"]))
    with pytest.raises(RolesError) as e:
        load_roles(path)
    one_line(e.value, path, f"stages.{stage}.approve", "'aprovers'", "did you mean 'approvers'")


def test_a_stage_given_twice_in_a_roles_file_is_refused(tmp_path):
    from gates.roles import RolesError, load_roles

    text = (REPO / "gates" / "demo-roles.yaml").read_text()
    path = tmp_path / "roles.yaml"
    path.write_text(text + "\n  poc:\n    sign_off: {}\n    approve: []\n    emergency_rollback: []\n")
    with pytest.raises(RolesError) as e:
        load_roles(path)
    one_line(e.value, path, "duplicate key 'poc'")


def test_the_bundled_roles_still_load():
    from gates.roles import load_roles

    for name in ("roles.yaml", "demo-roles.yaml"):
        assert load_roles(REPO / "gates" / name).stage("production").approvals_count == 2


@pytest.mark.parametrize(
    "what, key, value, named",
    [ROLES_CASES[0], ROLES_CASES[1], ROLES_CASES[8]],
    ids=["a thousand", "more than approvers", "misspelled group"],
)
def test_a_refused_roles_file_is_one_line_from_the_cli(tmp_path, what, key, value, named):
    path = _write(tmp_path, "roles.yaml", _set(TEAM_ROLES, key, value))
    refused(
        ["sign-off", "tiny-llada", "--stage", "poc", "--item", "fallback-plan", "--comment", "ok"],
        str(path),
        *named,
        env={"UNMASK_ROLES": str(path)},
    )


# --- serving policies: gates/serving_policy.py, gates/serving_arms.py, gates/request_limits.py --------------------
SERVING = yaml.safe_load((REPO / "gates" / "serving.yaml").read_text())
SERVING_CASES = [  # (what, dotted key, value, named)
    ("matcher empty", "routes.long.match", {}, "routes.long.match"),
    ("matcher unknown", "routes.long.match", {"prompt_contains": "x"}, "prompt_contains"),
    ("two matchers", "routes.long.match", {"max_tokens_above": 1, "user": "a"}, "routes.long.match"),
    ("max_tokens_above negative", "routes.long.match", {"max_tokens_above": -1}, "-1"),
    ("max_tokens_above text", "routes.long.match", {"max_tokens_above": "many"}, "'many'"),
    ("max_tokens_above float", "routes.long.match", {"max_tokens_above": 1.5}, "1.5"),
    ("path unknown", "routes.long.match", {"path": "/v1/embeddings"}, "/v1/embeddings"),
    ("user empty list", "routes.long.match", {"user": []}, "[]"),
    ("header without value", "routes.latency.match", {"header": {"name": "X-Route"}}, "routes.latency.match"),
    ("header name empty", "routes.latency.match", {"header": {"name": "", "value": "x"}}, "routes.latency.match"),
    ("arm empty", "routes.long.arm", "", "routes.long.arm"),
    ("arm a number", "routes.long.arm", 5, "5"),
    ("arm and split", "routes.long.split", {"fallback": 100}, "exactly one of arm"),
    ("neither arm nor split", "routes.long.arm", DELETE, "exactly one of arm"),
    ("fallback empty", "routes.long.fallback", "", "routes.long.fallback"),
    ("fallback a list", "routes.long.fallback", ["a"], "routes.long.fallback"),
    ("unknown route key", "routes.long.weight", 5, "'weight'"),
    ("route not a mapping", "routes.long", "fallback", "routes.long"),
    ("route named auto", "routes.auto", {"match": {"user": "a"}, "arm": "fallback"}, "reserved"),
    ("route named default", "routes.default", {"match": {"user": "a"}, "arm": "fallback"}, "reserved"),
    ("route name with a space", "routes.a b", {"match": {"user": "a"}, "arm": "fallback"}, "routes.a b"),
    ("routes a list", "routes", ["long"], "routes"),
    ("default missing", "default", DELETE, "default"),
    ("default with a matcher", "default.match", {"user": "a"}, "'match'"),
    ("split sums to 99", "default.split", {"production": 99, "fallback": 0}, "sum to 99"),
    ("split sums to 101", "default.split", {"production": 100, "fallback": 1}, "sum to 101"),
    ("split weight negative", "default.split", {"production": 100, "fallback": -10}, "-10"),
    ("split weight float", "default.split", {"production": 99.5, "fallback": 0.5}, "99.5"),
    ("split weight text", "default.split", {"production": "100"}, "'100'"),
    ("split weight above 100", "default.split", {"production": 200}, "200"),
    ("split empty", "default.split", {}, "default.split"),
    ("split a list", "default.split", ["production"], "default.split"),
    ("shadow share 101", "routes.long.shadow", {"arm": "production", "share": 101}, "101"),
    ("shadow share negative", "routes.long.shadow", {"arm": "production", "share": -1}, "-1"),
    ("shadow share text", "routes.long.shadow", {"arm": "production", "share": "all"}, "'all'"),
    ("shadow share float", "routes.long.shadow", {"arm": "production", "share": 0.5}, "0.5"),
    ("shadow without arm", "routes.long.shadow", {"share": 10}, "routes.long.shadow"),
    ("shadow unknown key", "routes.long.shadow", {"arm": "production", "rate": 1}, "rate"),
    ("unknown top key", "routing", {}, "routing"),
    ("arm named like a route", "arms", {"long": {"alias": "staging"}}, "arms.long"),
    ("arm named auto", "arms", {"auto": {"alias": "staging"}}, "arms.auto"),
    ("upstream not a URL", "arms", {"up": {"upstream": "localhost:8000", "model": "m"}}, "arms.up"),
    ("upstream ftp", "arms", {"up": {"upstream": "ftp://127.0.0.1/v1", "model": "m"}}, "ftp://"),
    (
        "arm timeout negative",
        "arms",
        {"up": {"upstream": "http://127.0.0.1:8001/v1", "model": "m", "timeout_s": -1}},
        "timeout_s",
    ),
    ("arm unknown key", "arms", {"up": {"alias": "staging", "weight": 1}}, "weight"),
    ("fault abort share 101", "arms", {"s": {"alias": "staging", "faults": {"abort_share": 101}}}, "abort_share"),
    ("fault delay negative", "arms", {"s": {"alias": "staging", "faults": {"delay_s": -1}}}, "delay_s"),
    ("fault nan share negative", "arms", {"s": {"alias": "staging", "faults": {"nan_share": -5}}}, "nan_share"),
    ("health failures zero", "health", {"failures": 0}, "health.failures"),
    ("health cooldown negative", "health", {"cooldown_s": -1}, "health.cooldown_s"),
    ("health unknown key", "health", {"retries": 3}, "retries"),
    ("limits max_steps zero", "limits", {"max_steps": 0}, "limits.max_steps"),
    ("limits max_steps text", "limits", {"max_steps": "many"}, "'many'"),
    ("limits max_steps float", "limits", {"max_steps": 4.5}, "4.5"),
    ("limits max_canvas negative", "limits", {"max_canvas": -1}, "limits.max_canvas"),
    ("limits token-forwards huge", "limits", {"max_token_forwards": 2**40}, "limits.max_token_forwards"),
    ("limits time budget zero", "limits", {"time_budget_s": 0}, "limits.time_budget_s"),
    ("limits time budget a year", "limits", {"time_budget_s": 3.2e7}, "limits.time_budget_s"),
    ("limits time budget nan", "limits", {"time_budget_s": math.nan}, "limits.time_budget_s"),
    ("limits unknown key", "limits", {"max_batch": 4}, "max_batch"),
    ("limits a list", "limits", [256], "limits"),
]


@pytest.mark.parametrize("what, key, value, named", SERVING_CASES, ids=[c[0] for c in SERVING_CASES])
def test_serving_policy_is_refused_by_file_key_and_value(tmp_path, what, key, value, named):
    from gates.serving_policy import ServingPolicyError, load_serving_policy

    path = _write(tmp_path, "serving.yaml", _set(SERVING, key, value))
    with pytest.raises(ServingPolicyError) as e:
        load_serving_policy(path)
    one_line(e.value, path, named)


def test_a_route_given_twice_is_refused(tmp_path):
    from gates.serving_policy import ServingPolicyError, load_serving_policy

    text = (
        (REPO / "gates" / "serving.yaml")
        .read_text()
        .replace("  latency:\n", "  long:\n    match: {user: x}\n    arm: fallback\n  latency:\n", 1)
    )
    path = tmp_path / "serving.yaml"
    path.write_text(text)
    with pytest.raises(ServingPolicyError) as e:
        load_serving_policy(path)
    one_line(e.value, path, "duplicate key 'long'")


def test_the_bundled_serving_policy_still_loads_with_default_limits():
    from gates.request_limits import RequestLimits
    from gates.serving_policy import load_serving_policy

    assert load_serving_policy().limits == RequestLimits()


@pytest.mark.parametrize(
    "what, key, value, named",
    [SERVING_CASES[3], SERVING_CASES[24], SERVING_CASES[51]],
    ids=["matcher", "split", "limits"],
)
def test_a_refused_serving_policy_is_one_line_from_serve(tmp_path, what, key, value, named):
    path = _write(tmp_path, "serving.yaml", _set(SERVING, key, value))
    refused(["serve", "--routes", str(path), "--port", "1"], "--routes", str(path), named)


# --- rollout policies: gates/rollout_policy.py (the loader; the statistics are gates/canary.py's) -----------------
ROLLOUT = SERVING["rollout"]
ROLLOUT_CASES = [  # (what, key under rollout, value, named)
    ("error rate max 5: can never fail", "analysis.error_rate", {"max": 5}, "error_rate.max"),
    ("error rate max -0.1: can never pass", "analysis.error_rate", {"max": -0.1}, "-0.1"),
    ("error rate min above 1", "analysis.error_rate", {"min": 1.5}, "1.5"),
    ("decode failure max 2", "analysis.decode_failure_rate", {"max": 2}, "decode_failure_rate.max"),
    ("decode failure max -1", "analysis.decode_failure_rate", {"max": -1}, "-1"),
    ("agreement min 1.01", "analysis.agreement", {"min": 1.01}, "1.01"),
    ("agreement min -0.5", "analysis.agreement", {"min": -0.5}, "-0.5"),
    ("p95 max negative", "analysis.p95_latency_s", {"max": -1}, "p95_latency_s.max"),
    ("p95 max nan", "analysis.p95_latency_s", {"max": math.nan}, "nan"),
    ("p95 max inf", "analysis.p95_latency_s", {"max": math.inf}, "inf"),
    ("p95 max text", "analysis.p95_latency_s", {"max": "fast"}, "'fast'"),
    ("p95 max bool", "analysis.p95_latency_s", {"max": True}, "True"),
    ("ratio max negative", "analysis.p95_ratio_vs_baseline", {"max": -2}, "-2"),
    ("min above max", "analysis.p95_latency_s", {"min": 3, "max": 2}, "above max"),
    ("bound unknown key", "analysis.p95_latency_s", {"below": 2}, "below"),
    ("bounds empty", "analysis.p95_latency_s", {}, "p95_latency_s"),
    ("bounds a number", "analysis.p95_latency_s", 2.0, "p95_latency_s"),
    ("unknown metric", "analysis.p99_latency_s", {"max": 1}, "p99_latency_s"),
    ("analysis empty", "analysis", {}, "rollout.analysis"),
    ("analysis a list", "analysis", ["error_rate"], "rollout.analysis"),
    ("interval 1e12", "interval_s", 1.0e12, "1000000000000.0"),
    ("interval 1e12 as YAML writes it", "interval_s", "1e12", "'1e12'"),
    ("interval a day and a second", "interval_s", 86_401, "86401"),
    ("interval zero", "interval_s", 0, "interval_s"),
    ("interval negative", "interval_s", -60, "-60"),
    ("interval nan", "interval_s", math.nan, "nan"),
    ("interval inf", "interval_s", math.inf, "inf"),
    ("interval text", "interval_s", "a minute", "'a minute'"),
    ("interval bool", "interval_s", True, "True"),
    ("steps empty", "steps", [], "rollout.steps"),
    ("steps zero", "steps", [0, 100], "rollout.steps"),
    ("steps above 100", "steps", [50, 101], "101"),
    ("steps falling", "steps", [50, 25, 100], "rising"),
    ("steps repeated", "steps", [25, 25, 100], "rising"),
    ("steps not ending at 100", "steps", [5, 50], "ending at 100"),
    ("steps float", "steps", [5.5, 100], "5.5"),
    ("steps text", "steps", "5,25,100", "'5,25,100'"),
    ("min requests zero", "min_requests", 0, "min_requests"),
    ("min requests negative", "min_requests", -3, "-3"),
    ("min requests float", "min_requests", 2.5, "2.5"),
    ("min requests text", "min_requests", "20", "'20'"),
    ("failure limit zero", "failure_limit", 0, "failure_limit"),
    ("failure limit float", "failure_limit", 1.5, "1.5"),
    ("inconclusive unknown", "inconclusive", "retry", "'retry'"),
    ("inconclusive bool", "inconclusive", False, "False"),
    ("unknown key", "rollback", True, "rollback"),
    ("steps missing", "steps", DELETE, "rollout.steps"),
    ("interval missing", "interval_s", DELETE, "rollout.interval_s"),
    ("confidence of 1", "confidence", 1.0, "rollout.confidence"),  # a missing min_requests is derived instead
    ("analysis missing", "analysis", DELETE, "rollout.analysis"),
]


@pytest.mark.parametrize("what, key, value, named", ROLLOUT_CASES, ids=[c[0] for c in ROLLOUT_CASES])
def test_rollout_policy_is_refused_by_file_key_and_value(tmp_path, what, key, value, named):
    from gates.rollout_policy import RolloutPolicyError, load_rollout_policy

    path = _write(tmp_path, "serving.yaml", _set(SERVING, f"rollout.{key}", value))
    with pytest.raises(RolloutPolicyError) as e:
        load_rollout_policy(path)
    one_line(e.value, path, "rollout", named)


def test_a_missing_min_requests_is_derived_from_the_analysis(tmp_path):
    from gates.rollout_policy import parse_rollout_policy, requests_to_pass

    policy = parse_rollout_policy({k: v for k, v in ROLLOUT.items() if k != "min_requests"}, "serving.yaml")
    assert policy.min_requests == max(requests_to_pass(b) for b in policy.analysis) >= 34


def test_the_bundled_rollout_policy_still_loads():
    from gates.rollout_policy import load_rollout_policy

    assert load_rollout_policy(REPO / "gates" / "serving.yaml").steps[-1] == 100


@pytest.mark.parametrize(
    "what, key, value, named",
    [ROLLOUT_CASES[0], ROLLOUT_CASES[1], ROLLOUT_CASES[20]],
    ids=["max 5", "max -0.1", "interval 1e12"],
)
def test_a_refused_rollout_policy_is_one_line_from_rollout_start(tmp_path, what, key, value, named):
    path = _write(tmp_path, "serving.yaml", _set(SERVING, f"rollout.{key}", value))
    refused(["rollout", "start", "tiny-llada", "--route", "long", "--routes", str(path)], str(path), named)


def test_rollout_start_checks_its_stage_policy_before_any_work(tmp_path):
    refused(
        ["rollout", "start", "tiny-llada", "--route", "long", "--policy", str(tmp_path / "nope.yaml")],
        "nope.yaml",
        "not found",
    )


# --- load test and rollout arguments: evals/loadtest.check_spec, models.state.check_token ---------------------------
GOOD_LOAD = dict(base_url="http://127.0.0.1:8000/v1", models=("production",))
LOAD_CASES = [  # (what, LoadSpec changes, named)
    ("url without scheme", {"base_url": "127.0.0.1:8000/v1"}, "--url"),
    ("url ftp", {"base_url": "ftp://127.0.0.1/v1"}, "--url"),
    ("url empty", {"base_url": ""}, "--url"),
    ("url a file", {"base_url": "file:///etc/passwd"}, "--url"),
    ("no models", {"models": ()}, "--model"),
    ("an empty model name", {"models": ("",)}, "--model"),
    ("no levels", {"concurrency": ()}, "--concurrency"),
    ("level zero", {"concurrency": (0,)}, "--concurrency"),
    ("level negative", {"concurrency": (1, -4)}, "-4"),
    ("level bool", {"concurrency": (True,)}, "--concurrency"),
    ("level far too many", {"concurrency": (1, 100_000)}, "100000"),
    ("level just above the bound", {"concurrency": (1025,)}, "1025"),
    ("requests zero", {"requests": 0}, "--requests"),
    ("requests negative", {"requests": -1}, "--requests"),
    ("requests a hundred million", {"requests": 100_000_000}, "100000000"),
    ("requests just above the bound", {"requests": 10_001}, "10001"),
    ("requests float", {"requests": 2.5}, "2.5"),
    ("duration zero", {"duration_s": 0}, "--duration"),
    ("duration negative", {"duration_s": -1.0}, "--duration"),
    ("duration nan", {"duration_s": math.nan}, "--duration"),
    ("duration inf", {"duration_s": math.inf}, "--duration"),
    ("max tokens zero", {"max_tokens": 0}, "--max-tokens"),
    ("max tokens negative", {"max_tokens": -100}, "--max-tokens"),
    ("endpoint embeddings", {"endpoint": "embeddings"}, "--endpoint"),
    ("endpoint empty", {"endpoint": ""}, "--endpoint"),
    ("timeout zero", {"timeout_s": 0}, "--timeout"),
    ("timeout negative", {"timeout_s": -5}, "--timeout"),
    ("timeout nan", {"timeout_s": math.nan}, "--timeout"),
    ("timeout inf", {"timeout_s": math.inf}, "--timeout"),
]
LEVEL_TEXTS = ["", ",", "a", "1,,x", "1.5", "1;4", "0x10", "one"]
ROLLOUT_IDS = [
    "../x",
    "../../outside/forged",
    "/etc/passwd",
    "",
    ".",
    "..",
    ".hidden",
    "a/b",
    "a\\b",
    "x" * 129,
    "a b",
    "a\x00b",
    "~",
    "~/x",
    "$HOME",
    "-rf",
    "a/../b",
    "rollout\n",
    "é",
    "id;rm",
    "*",
    "long-*",
]


@pytest.mark.parametrize("what, changes, named", LOAD_CASES, ids=[c[0] for c in LOAD_CASES])
def test_load_test_argument_is_refused_naming_the_option(what, changes, named):
    from evals.loadtest import LoadSpec, LoadTestError, check_spec

    with pytest.raises(LoadTestError) as e:
        check_spec(LoadSpec(**(GOOD_LOAD | changes)))
    one_line(e.value, named)


@pytest.mark.parametrize("text", LEVEL_TEXTS)
def test_concurrency_text_is_refused_naming_the_option(text):
    from evals.loadtest import LoadTestError
    from flows.commands.loadtest import parse_levels

    with pytest.raises(LoadTestError) as e:
        parse_levels(text)
    one_line(e.value, "--concurrency")


@pytest.mark.parametrize("value", ROLLOUT_IDS, ids=[repr(v)[:30] for v in ROLLOUT_IDS])
def test_an_id_that_is_not_a_token_is_refused(value):
    from flows.rollout_state import RolloutNotFound, load_state
    from models.state import check_token

    with pytest.raises(ValueError) as e:
        check_token(value, "rollout")
    one_line(e.value, "rollout", "not a path")
    with pytest.raises(RolloutNotFound):  # the state file reader refuses it too, whatever calls it
        load_state(value)


@pytest.mark.parametrize("command", ["status", "abort", "resume"])
@pytest.mark.parametrize("value", ["../../outside/forged", "../x", "/etc/passwd"])
def test_rollout_commands_refuse_a_path_as_an_id_before_reading_anything(tmp_path, command, value):
    outside = Path(str(tmp_path / "home" / "rollouts" / value) + ".json")
    refused(["rollout", command, value], repr(value), "not a path")
    assert not outside.exists()


@pytest.mark.parametrize(
    "args, named",
    [
        (["loadtest", "--requests", "100000000"], "100000000"),
        (["loadtest", "--concurrency", "1,5000"], "5000"),
        (["loadtest", "--max-tokens", "0"], "--max-tokens"),
        (["loadtest", "--duration", "-1"], "--duration"),
    ],
)
def test_load_test_arguments_are_one_line_from_the_cli(args, named):
    refused(args, named)


def test_load_test_json_under_a_file_is_refused_before_the_load(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    refused(["loadtest", "--json", str(blocker / "out.json")], "--json", str(blocker), "is a file")


# --- environment variables: flows/commands/options.check_environment ----------------------------------------------
def _env_cases(tmp: Path) -> list[tuple[str, dict[str, str], tuple[str, ...]]]:
    blocker = tmp / "a-file"
    folder = tmp / "a-folder"
    cases = []
    for name in ("UNMASK_HOME", "UNMASK_MODEL_STORE"):
        for value in (blocker, blocker / "x", blocker / "x" / "y", blocker / "..." / "z"):
            cases.append((f"{name} under a file {value.name}", {name: str(value)}, (name, str(blocker), "is a file")))
    for name in ("UNMASK_CATALOG", "UNMASK_ROLES", "UNMASK_POLICY", "UNMASK_CHROMIUM"):
        for value in (tmp / "missing.yaml", folder, blocker / "x.yaml", tmp / "missing" / "deeper.yaml"):
            why = "a folder, not a file" if value == folder else "no such file"
            cases.append((f"{name} {value.name}", {name: str(value)}, (name, str(value), why)))
    for value in (tmp / "missing", blocker, blocker / "x", tmp / "missing" / "x"):
        cases.append(
            (
                f"UNMASK_CHECKLISTS {value.name}",
                {"UNMASK_CHECKLISTS": str(value)},
                ("UNMASK_CHECKLISTS", str(value), "no such folder"),
            )
        )
    for value in (
        "0",
        "-1",
        "many",
        "1.5",
        "1e3",
        "99999",
        "4294967297",
        "+2",
        "0x2",
        "2 threads",
        "½",
        "-0",
        "00",
        "3 4",
        "3.0",
        "inf",
        "nan",
        "1_000",
        "\u0663\u0663\u0663\u0663",
        "10000",
        "\u00b2",  # superscript two: str.isdigit() says yes, int() says no
        "1\u00b9",
    ):
        cases.append((f"UNMASK_THREADS {value}", {"UNMASK_THREADS": value}, ("UNMASK_THREADS", repr(value))))
    for value in ("garbage:::", "ftp://host/store", "s3://bucket/mlruns", "javascript:alert(1)"):
        cases.append(
            (f"MLFLOW_TRACKING_URI {value}", {"MLFLOW_TRACKING_URI": value}, ("MLFLOW_TRACKING_URI", "unknown scheme"))
        )
    for value in ("::::", "./mlruns", "file:///tmp/mlruns", "mlflow.db"):  # item 51.14: a file store MLflow refuses
        cases.append(
            (f"MLFLOW_TRACKING_URI {value}", {"MLFLOW_TRACKING_URI": value}, ("MLFLOW_TRACKING_URI", "a file store"))
        )
    return cases


ENV_CASE_IDS = [c[0] for c in _env_cases(Path("/t"))]


@pytest.fixture
def env_tmp(tmp_path):
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "a-folder").mkdir()
    return tmp_path


@pytest.mark.parametrize("index", range(len(ENV_CASE_IDS)), ids=ENV_CASE_IDS)
def test_environment_variable_is_refused_naming_it_and_its_value(env_tmp, index):
    import typer

    from flows.commands.options import check_environment

    what, env, named = _env_cases(env_tmp)[index]
    with pytest.raises(typer.BadParameter) as e:
        check_environment(env)
    one_line(e.value.format_message(), *named)


@pytest.mark.parametrize("index", [0, 9, 24, 33], ids=[ENV_CASE_IDS[i] for i in (0, 9, 24, 33)])
def test_environment_variable_is_one_line_from_the_cli(env_tmp, index):
    what, env, named = _env_cases(env_tmp)[index]
    refused(["audit"], *named, env=env)


def test_unmask_home_under_a_file_is_one_line_from_the_installed_command(env_tmp):
    import os
    import subprocess
    import sys

    home = env_tmp / "a-file" / "home"
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", "audit"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, UNMASK_HOME=str(home)),
    )
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "UNMASK_HOME" in errors[0] and "is a file" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


# --- YAML duplicates: one reader everywhere (models/unique_keys.py, checklists/yaml_file.py) -------------------------
KEY = st.text(alphabet="abcdefghij_", min_size=1, max_size=6)
SCALAR = st.one_of(st.integers(-5, 5), st.booleans(), st.text(alphabet="xyz", max_size=3))


def _loaders():
    from checklists.yaml_file import load_yaml as leaf_loader
    from models.unique_keys import load_yaml as low_loader

    return leaf_loader, low_loader


@FAST
@given(
    mapping=st.dictionaries(KEY, SCALAR, min_size=1, max_size=6),
    twice=st.integers(0, 5),
    depth=st.integers(0, 2),
    flow=st.booleans(),
)
def test_any_mapping_with_a_key_twice_is_refused_by_both_readers(mapping, twice, depth, flow):
    import yaml as pyyaml

    pairs = list(mapping.items())
    key, value = pairs[twice % len(pairs)]
    items = [*pairs, (key, value)]
    body = (
        "{" + ", ".join(f"{k}: {pyyaml.safe_dump(v).splitlines()[0]}" for k, v in items) + "}"
        if flow
        else "\n".join(f"{'  ' * depth}{k}: {pyyaml.safe_dump(v).splitlines()[0]}" for k, v in items)
    )
    text = "".join(f"{'  ' * d}n{d}:\n" for d in range(depth)) + (("  " * depth) + body if flow else body) + "\n"
    for load in _loaders():
        with pytest.raises(pyyaml.YAMLError) as e:
            load(text)
        assert f"duplicate key {key!r}" in str(e.value)


@FAST
@given(data=st.dictionaries(KEY, st.one_of(SCALAR, st.dictionaries(KEY, SCALAR, max_size=3)), max_size=5))
def test_yaml_without_duplicates_reads_as_pyyaml_reads_it(data):
    import yaml as pyyaml

    text = pyyaml.safe_dump(data)
    for load in _loaders():
        assert load(text) == pyyaml.safe_load(text)


@pytest.mark.parametrize("where", ["catalog", "sweep", "policy", "checklist", "license", "task", "config"])
def test_every_reader_refuses_a_key_given_twice(tmp_path, monkeypatch, where):
    """Each file kind, through its own loader: the file and the key are named."""
    import shutil

    if where == "catalog":
        from models.catalog import CatalogError as error
        from models.catalog import load_catalog as load

        path = tmp_path / "catalog.yaml"
        path.write_text("entries: []\nentries: []\n")
    elif where == "sweep":
        from evals.sweep import SweepError as error
        from evals.sweep import load_sweep as load

        path = tmp_path / "sweep.yaml"
        path.write_text("name: a\nmodels: [tiny-llada]\ntasks: [arith]\nname: b\n")
    elif where == "policy":
        from gates.policy import PolicyError as error
        from gates.policy import load_policy as load

        path = tmp_path / "policy.yaml"
        text = (REPO / "gates" / "policy.yaml").read_text()
        path.write_text(text + "\n" + text[text.index("stages:") :])
    elif where == "checklist":
        from checklists import ChecklistError as error

        shutil.copytree(REPO / "checklists", tmp_path / "c", ignore=shutil.ignore_patterns("*.py", "__pycache__"))
        path = tmp_path / "c" / "poc.yaml"
        path.write_text(path.read_text() + "stage: poc\n")

        def load(p):
            from checklists import load_checklist

            return load_checklist("poc", p.parent)
    elif where == "license":
        from evals.license import LicensePolicyError as error
        from evals.license import load_policy as load

        path = tmp_path / "licenses.yaml"
        path.write_text("tiers: {}\ntiers: {}\n")
    elif where == "task":
        error = ValueError
        path = tmp_path / "tasks.jsonl"
        path.write_text('{"question": "1+1?", "answer": "#### 2", "answer": "#### 3"}\n')

        def load(p):
            from evals.tasks.gsm8k import load_gsm8k

            return load_gsm8k(p)
    else:
        from models.checkpoint import CheckpointError as error
        from models.checkpoint import read_config

        shutil.copytree(REPO / "models" / "weights" / "tiny-llada", tmp_path / "m")
        path = tmp_path / "m" / "config.json"
        path.write_text(path.read_text().rstrip().rstrip("}") + ', "vocab_size": 7}')

        def load(p):
            return read_config(p.parent)

    with pytest.raises(error) as e:
        load(path)
    one_line(e.value, path, "duplicate key")


# --- numeric extremes ---------------------------------------------------------------------------------------------
EXTREME = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**70), 2**70))


@FAST
@given(value=EXTREME, key=st.sampled_from(["interval_s", "min_requests", "failure_limit"]))
def test_any_rollout_number_is_a_policy_or_a_one_line_refusal(value, key):
    from gates.rollout_policy import MAX_INTERVAL_S, RolloutPolicyError, parse_rollout_policy

    try:
        policy = parse_rollout_policy(_set(ROLLOUT, key, value), "serving.yaml")
    except RolloutPolicyError as e:
        one_line(e, "serving.yaml", f"rollout.{key}")
        return
    assert math.isfinite(policy.interval_s) and 0 < policy.interval_s <= MAX_INTERVAL_S
    assert policy.min_requests >= 1 and policy.failure_limit >= 1


@FAST
@given(
    value=EXTREME,
    metric=st.sampled_from(["error_rate", "decode_failure_rate", "agreement", "p95_latency_s"]),
    bound=st.sampled_from(["min", "max"]),
)
def test_any_analysis_bound_is_in_range_or_refused(value, metric, bound):
    from gates.rollout_policy import SHARE_METRICS, RolloutPolicyError, parse_rollout_policy

    data = _set(ROLLOUT, f"analysis.{metric}", {bound: value})
    try:
        policy = parse_rollout_policy(data, "serving.yaml")
    except RolloutPolicyError as e:
        one_line(e, "serving.yaml", f"rollout.analysis.{metric}.{bound}")
        return
    (given_range,) = [m for m in policy.analysis if m.metric == metric]
    number = getattr(given_range, bound)
    assert math.isfinite(number) and number >= 0 and (metric not in SHARE_METRICS or number <= 1)


@FAST
@given(value=EXTREME, stage=st.sampled_from(["poc", "staging", "production"]))
def test_any_approval_count_can_be_met_or_is_refused(value, stage):
    from gates.roles import RolesError, parse_roles

    try:
        roles = parse_roles(_set(TEAM_ROLES, f"stages.{stage}.approvals.count", value), "roles.yaml")
    except RolesError as e:
        one_line(e, "roles.yaml", f"stages.{stage}.approvals.count")
        return
    assert 1 <= roles.stage(stage).approvals_count <= len(roles.groups["approvers"])


@FAST
@given(value=EXTREME, key=st.sampled_from(["max_steps", "max_canvas", "max_token_forwards", "time_budget_s"]))
def test_any_request_limit_is_bounded_or_refused(value, key):
    from gates.request_limits import MAX_TIME_BUDGET_S, parse_request_limits
    from gates.serving_arms import ServingPolicyError

    try:
        limits = parse_request_limits({key: value}, "serving.yaml: limits")
    except ServingPolicyError as e:
        one_line(e, "serving.yaml", f"limits.{key}")
        return
    assert 0 < getattr(limits, key) <= (MAX_TIME_BUDGET_S if key == "time_budget_s" else 2**31)


# --- the count the closing note reports ---------------------------------------------------------------------------
def test_every_new_surface_has_at_least_50_cases():
    counts = {
        "roles": len(ROLES_CASES) + 3 + 1 + 3,
        "serving routes/arms/limits": len(SERVING_CASES) + 1 + 3,
        "rollout policy": len(ROLLOUT_CASES) + 3 + 1,
        "load test and rollout arguments": len(LOAD_CASES) + len(LEVEL_TEXTS) + len(ROLLOUT_IDS) + 9 + 4 + 1,
        "environment variables": len(ENV_CASE_IDS) + 4 + 1,
    }
    assert all(n >= 50 for n in counts.values()), counts
