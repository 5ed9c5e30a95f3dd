"""Routes and the sticky traffic split of `unmask serve --routes`: the serving policy file, each matcher
kind's contract, the split's stickiness and shares as pure functions, and routing on a real uvicorn
server driven by the real `openai` client, with a weight change and a bad edit applied live."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import httpx
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from gates.serving_policy import (
    MATCHERS,
    SERVING_POLICY_PATH,
    RequestFacts,
    ServingPolicyError,
    bucket,
    load_serving_policy,
    parse_serving_policy,
    pick_arm,
)
from serving.request_log import read_rows
from tests.support.serving_fixtures import (
    PROMPTS,
    ext,
    openai_client,
    running_server,
    settings_for,
    shared_serving_registry,
)

# one example per matcher kind: (its settings, facts it matches, facts it does not). A new kind needs a line here.
MATCHER_EXAMPLES = {
    "path": ("/v1/chat/completions", RequestFacts(path="/v1/chat/completions"), RequestFacts(path="/v1/completions")),
    "header": (
        {"name": "X-Route", "value": "latency"},
        RequestFacts("/v1/completions", {"x-route": "latency"}),
        RequestFacts("/v1/completions", {"x-route": "quality"}),
    ),
    "user": (
        ["alice", "bob"],
        RequestFacts("/v1/completions", user="bob"),
        RequestFacts("/v1/completions", user="carol"),
    ),
    "metadata": (
        {"name": "tier", "value": "batch"},
        RequestFacts("/v1/completions", metadata={"tier": "batch"}),
        RequestFacts("/v1/completions", metadata={"tier": "live"}),
    ),
    "max_tokens_above": (
        128,
        RequestFacts("/v1/completions", max_tokens=129),
        RequestFacts("/v1/completions", max_tokens=128),
    ),
}


def policy_of(routes: dict | None = None, default: dict | None = None) -> dict:
    return {"routes": routes or {}, "default": default or {"arm": "production"}}


def test_every_registered_matcher_has_a_contract_example():
    assert set(MATCHER_EXAMPLES) == set(MATCHERS)


@pytest.mark.parametrize("kind", sorted(MATCHERS))
def test_matcher_contract(kind):
    settings, hit, miss = MATCHER_EXAMPLES[kind]
    policy = parse_serving_policy(policy_of({"r": {"match": {kind: settings}, "arm": "fallback"}}))
    matcher = policy.routes[0].match
    assert matcher.kind == kind and matcher.matches(hit) and not matcher.matches(miss)
    assert policy.choose(hit).name == "r" and policy.choose(miss).name == "default"
    assert isinstance(matcher.describe(), str) and matcher.describe()
    with pytest.raises(ServingPolicyError, match=rf"routes\.r\.match\.{kind}: expected"):
        parse_serving_policy(policy_of({"r": {"match": {kind: {"nonsense": [1]}}, "arm": "fallback"}}))


def test_the_bundled_file_parses_and_routes_long_answers_to_the_fallback():
    policy = load_serving_policy()
    assert policy.sha256 and policy.source == str(SERVING_POLICY_PATH)
    long = policy.choose(RequestFacts("/v1/completions", max_tokens=200))
    assert long.name == "long" and long.arms() == ("fallback",)
    assert policy.choose(RequestFacts("/v1/completions", max_tokens=16)).name == "default"
    assert set(policy.arms()) == {"fallback", "production"}


def test_routes_are_tried_in_file_order():
    policy = parse_serving_policy(
        policy_of(
            {
                "first": {"match": {"user": "alice"}, "arm": "fallback"},
                "second": {"match": {"path": "/v1/completions"}, "arm": "staging"},
            }
        )
    )
    assert policy.choose(RequestFacts("/v1/completions", user="alice")).name == "first"
    assert policy.choose(RequestFacts("/v1/completions", user="bob")).name == "second"


@pytest.mark.parametrize(
    "data, where",
    [
        (policy_of(default={"split": {"production": 90, "fallback": 5}}), r"default\.split: weights sum to 95"),
        (
            policy_of(default={"split": {"production": 101, "fallback": -1}}),
            r"default\.split\.production: expected an integer",
        ),
        (policy_of(default={"split": {"production": 50.5, "fallback": 49.5}}), r"default\.split\.production"),
        (
            policy_of(default={"arm": "production", "split": {"production": 100}}),
            r"default: expected exactly one of arm",
        ),
        (policy_of(default={"match": {"user": "x"}, "arm": "p"}), r"default: unknown key 'match'"),
        ({"routes": {}}, r"default: missing"),
        ({"default": {"arm": "p"}, "rollouts": {}}, r"rollouts: unknown key"),
        (policy_of({"r": {"match": {"colour": "red"}, "arm": "p"}}), r"routes\.r\.match\.colour: unknown matcher"),
        (policy_of({"r": {"arm": "p"}}), r"routes\.r\.match: expected one matcher"),
        (policy_of({"r": {"match": {"max_tokens_above": -3}, "arm": "p"}}), r"routes\.r\.match\.max_tokens_above"),
        (
            policy_of({"r": {"match": {"path": "/v1/embeddings"}, "arm": "p"}}),
            r"routes\.r\.match\.path: expected one of",
        ),
        (policy_of({"auto": {"match": {"user": "a"}, "arm": "p"}}), r"routes\.auto: 'auto' is reserved"),
        (policy_of({"r": {"match": {"user": "a"}, "arm": ""}}), r"routes\.r\.arm: expected an alias name"),
    ],
)
def test_bad_route_files_are_refused_naming_the_file_and_key(tmp_path, data, where):
    path = tmp_path / "serving.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ServingPolicyError, match=where) as caught:
        load_serving_policy(path)
    assert str(caught.value).startswith(f"{path}: ")


def test_unreadable_route_files_are_refused_in_one_line(tmp_path):
    with pytest.raises(ServingPolicyError, match="serving policy file not found"):
        load_serving_policy(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("default: {arm: [unclosed\n")
    with pytest.raises(ServingPolicyError, match=r"not valid YAML") as caught:
        load_serving_policy(broken)
    assert "\n" not in str(caught.value)


def test_the_split_is_sticky_per_key():
    route = parse_serving_policy(policy_of(default={"split": {"production": 50, "fallback": 50}})).default
    for user in ("alice", "bob", "carol", "dave"):
        assert len({route.pick(user) for _ in range(50)}) == 1


@pytest.mark.parametrize(
    "weights",
    [
        {"production": 95, "fallback": 5},
        {"production": 50, "fallback": 50},
        {"production": 25, "fallback": 0, "staging": 75},
    ],
)
def test_the_split_shares_match_the_weights_within_three_points(weights):
    split = tuple(weights.items())
    counts = Counter(pick_arm(split, bucket(f"user-{i}", "default")) for i in range(2000))
    for arm, weight in weights.items():
        assert abs(100 * counts[arm] / 2000 - weight) <= 3, (arm, counts)
    assert all(counts[arm] == 0 for arm, weight in weights.items() if weight == 0)  # a zero weight gets nobody


def test_raising_a_canary_weight_keeps_the_users_it_already_had():
    """Cumulative weights: a user in the first 5% of the canary is still in it at 25%."""
    before = (("canary", 5), ("stable", 95))
    after = (("canary", 25), ("stable", 75))
    keys = [f"u{i}" for i in range(500)]
    moved_out = [k for k in keys if pick_arm(before, bucket(k)) == "canary" and pick_arm(after, bucket(k)) != "canary"]
    assert moved_out == [] and any(pick_arm(before, bucket(k)) == "canary" for k in keys)


def test_unmask_serve_refuses_a_bad_routes_file_naming_the_key(tmp_path, monkeypatch):
    from tests.support.fuzz_fixtures import unmask_app

    monkeypatch.setenv("UNMASK_HOME", str(tmp_path / "home"))
    bad = tmp_path / "serving.yaml"
    bad.write_text(yaml.safe_dump(policy_of(default={"split": {"production": 70, "fallback": 20}})))
    result = CliRunner().invoke(unmask_app(), ["serve", "--routes", str(bad), "--port", "8765"])
    assert result.exit_code == 2, result.output
    assert "default.split: weights sum to 90" in result.output and "Traceback" not in result.output


def test_the_route_table_keeps_its_routes_through_a_bad_edit_and_takes_the_next_good_one(tmp_path):
    from serving.metrics import ServingMetrics
    from serving.routing import RouteTable

    path, metrics = tmp_path / "serving.yaml", ServingMetrics()
    write_routes(path, {"production": 100, "fallback": 0})
    table = RouteTable(path, ["production", "fallback"], metrics)
    assert not table.refresh()  # unchanged
    good = path.read_text()
    path.write_text(good.replace("production: 100", "staging: 100"))  # an arm this server does not serve
    assert not table.refresh() and "arm 'staging' is not served here" in table.last_error
    path.write_text(good.replace("default:", "defualt:"))
    assert not table.refresh() and "defualt: unknown key" in table.last_error
    assert table.policy.default.split == (("production", 100), ("fallback", 0))  # kept
    path.write_text(good)  # back to the routes in force: the error clears, nothing reloads
    assert not table.refresh() and table.last_error is None
    write_routes(path, {"production": 10, "fallback": 90})
    assert table.refresh() and table.policy.default.split == (("production", 10), ("fallback", 90))
    assert metrics.route_reload_failures._value.get() == 2 and metrics.route_reloads._value.get() == 1
    with pytest.raises(ServingPolicyError, match="route 'fallback' has the name of a served alias"):
        path.write_text(
            yaml.safe_dump(
                {
                    "routes": {"fallback": {"match": {"user": "a"}, "arm": "production"}},
                    "default": {"arm": "production"},
                }
            )
        )
        RouteTable(path, ["production", "fallback"], metrics)


# a real server ----------------------------------------------------------------------------------------------


def write_routes(path: Path, default_split: dict[str, int]) -> None:
    path.write_text(
        yaml.safe_dump(
            {
                "routes": {
                    "long": {"match": {"max_tokens_above": 24}, "arm": "fallback"},
                    "latency": {"match": {"header": {"name": "X-Route", "value": "latency"}}, "arm": "fallback"},
                    "tagged": {"match": {"metadata": {"name": "tier", "value": "batch"}}, "arm": "fallback"},
                },
                "default": {"split": default_split},
            },
            sort_keys=False,
        )
    )


@pytest.fixture(scope="module")
def routed(tmp_path_factory):
    registry = shared_serving_registry()
    folder = tmp_path_factory.mktemp("routes")
    routes = folder / "serving.yaml"
    write_routes(routes, {"production": 50, "fallback": 50})
    settings = settings_for(registry.tracking_uri, log_dir=folder / "log", poll_interval_s=0.2)
    settings.routes_path = routes
    with running_server(settings) as running:
        running.routes_file, running.log_dir = routes, folder / "log"
        yield running


@pytest.fixture(scope="module")
def client(routed):
    return openai_client(routed)


def arm_of(client, user: str, **kw) -> str:
    r = client.completions.create(model="auto", prompt=PROMPTS[0], max_tokens=4, user=user, **kw)
    return ext(r)["arm"]


@pytest.mark.timeout(300)
def test_routes_on_a_real_server(routed, client, tmp_path):
    # matchers: shape, header, metadata -> the fallback; the answer says which route and arm served it
    long = client.completions.create(model="auto", prompt=PROMPTS[0], max_tokens=32)
    assert (ext(long)["route"], ext(long)["arm"], long.model) == ("long", "fallback", "tiny-ar")
    fast = client.chat.completions.create(
        model="auto",
        messages=[{"role": "user", "content": PROMPTS[1]}],
        max_tokens=4,
        extra_headers={"X-Route": "latency"},
    )
    assert (ext(fast)["route"], ext(fast)["arm"]) == ("latency", "fallback")
    tagged = client.completions.create(
        model="auto", prompt=PROMPTS[1], max_tokens=4, extra_body={"metadata": {"tier": "batch"}}
    )
    assert ext(tagged)["route"] == "tagged"
    # a route's name routes too (its matcher is skipped); an alias still means that alias, not routed
    named = client.completions.create(model="latency", prompt=PROMPTS[1], max_tokens=4)
    assert ext(named)["route"] == "latency" and ext(named)["arm"] == "fallback"
    streamed = [
        c
        for c in client.completions.create(model="auto", prompt=PROMPTS[2], max_tokens=32, stream=True)
        if c.model_extra.get("unmask")
    ]
    assert [(ext(c)["route"], ext(c)["arm"]) for c in streamed] == [("long", "fallback")]  # the finish chunk
    plain = client.completions.create(model="production", prompt=PROMPTS[1], max_tokens=4)
    assert ext(plain)["route"] is None and ext(plain)["arm"] is None and ext(plain)["alias"] == "production"

    # stickiness: one user, one arm, across 50 requests; the 50/50 split sends some users each way
    users = [f"user-{i}" for i in range(12)]
    arms = {u: arm_of(client, u) for u in users}
    assert {arms[users[0]]} == {arm_of(client, users[0]) for _ in range(50)}
    assert set(arms.values()) == {"production", "fallback"}
    # without a user, the X-Session header is the key
    sessions = {arm_of(client, None, extra_headers={"X-Session": "s-1"}) for _ in range(5)}
    assert len(sessions) == 1

    # the weights change live: everyone to the fallback, then a bad edit keeps those routes and is counted
    write_routes(routed.routes_file, {"production": 0, "fallback": 100})
    deadline = time.monotonic() + 20
    while arm_of(client, users[0]) != "fallback" or {arm_of(client, u) for u in users} != {"fallback"}:
        assert time.monotonic() < deadline, "the new weights were not applied"
        time.sleep(0.2)
    good = routed.routes_file.read_text()
    routed.routes_file.write_text(good.replace("fallback: 100", "fallback: 90"))
    deadline = time.monotonic() + 20
    while "unmask_route_reload_failures_total 1.0" not in httpx.get(routed.base_url + "/metrics").text:
        assert time.monotonic() < deadline, "the bad edit was not counted"
        time.sleep(0.2)
    health = httpx.get(routed.base_url + "/health").json()
    assert "default.split: weights sum to 90" in health["routes"]["last_error"]
    assert {arm_of(client, u) for u in users} == {"fallback"}  # the old (good) routes still serve
    metrics = httpx.get(routed.base_url + "/metrics").text
    assert 'unmask_route_requests_total{arm="fallback",endpoint="completions",route="default",status="200"}' in metrics
    assert "unmask_route_reloads_total 1.0" in metrics

    # the request log carries route and arm
    deadline = time.monotonic() + 20
    while True:
        rows = pd.DataFrame(read_rows(routed.log_dir))
        if len(rows) and (rows.route == "tagged").any() or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert set(rows.route.dropna()) >= {"long", "latency", "tagged", "default"}
    long_rows = rows[rows.route == "long"]
    assert (long_rows.arm == "fallback").all() and (long_rows.alias == "fallback").all()
    assert rows[rows.alias == "production"].route.isna().any()  # the plain alias request was not routed
