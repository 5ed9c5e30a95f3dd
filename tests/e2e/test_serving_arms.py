"""Arms of `unmask serve --routes` (issue 19, serving half): the policy's `arms:`/`health:`/`fallback`/`shadow`,
the live weights overlay, arm health and drill faults as units; then, on real uvicorn servers driven by the
real `openai` client, an upstream arm that is a second `unmask serve`, a dead upstream marked unhealthy, retries
on the fallback (an abort, a timeout, real NaN logits from a safetensors file with a NaN embedding row), shadow
copies with agreement, the weights overlay applied live, and the request log read back with `read_rows`."""

from __future__ import annotations

import json
import os
import shutil
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import openai
import pytest
import yaml
from typer.testing import CliRunner

from gates.serving_policy import RequestFacts, ServingPolicyError, load_serving_policy, parse_serving_policy
from gates.weights import apply_overlay, weights_sha256
from serving.arm_health import ArmHealth, FaultDrill
from serving.metrics import ServingMetrics
from serving.request_log import RequestLog, read_rows, row
from serving.weights_file import read_weights, write_weights
from tests.support.serving_fixtures import ext, openai_client


def policy_of(**top) -> dict:
    return {"routes": {}, "default": {"arm": "production"}} | top


UPSTREAM = {"upstream": "http://127.0.0.1:9/v1", "model": "production", "timeout_s": 30}


# the policy ---------------------------------------------------------------------------------------------


def test_arms_health_fallback_and_shadow_parse():
    policy = parse_serving_policy(
        policy_of(
            arms={
                "vllm-a": UPSTREAM | {"api_key_env": "UPSTREAM_KEY"},
                "slow-staging": {"alias": "staging", "faults": {"delay_s": 0.5, "abort_share": 20}},
            },
            health={"failures": 5},
            routes={
                "canary": {
                    "match": {"user": "a"},
                    "split": {"vllm-a": 10, "production": 90},
                    "fallback": "production",
                    "shadow": {"arm": "slow-staging", "share": 50},
                }
            },
            rollout={"steps": [5, 25]},
        )
    )  # gates/rollout_policy.py's key: accepted, left to it
    vllm, staging = policy.declared["vllm-a"], policy.declared["slow-staging"]
    assert (vllm.kind, vllm.upstream, vllm.model, vllm.api_key_env, vllm.timeout_s) == (
        "upstream",
        "http://127.0.0.1:9/v1",
        "production",
        "UPSTREAM_KEY",
        30,
    )
    assert staging.kind == "local" and staging.faults.delay_s == 0.5 and staging.faults.abort_share == 20
    assert (policy.health.failures, policy.health.cooldown_s) == (5, 10.0)  # cooldown defaulted
    canary = policy.routes[0]
    assert canary.fallback == "production" and canary.shadow.arm == "slow-staging"
    assert policy.arms() == ("vllm-a", "production", "slow-staging")
    assert policy.aliases() == ("production", "staging")  # what `unmask serve` must serve: no upstream arm
    assert parse_serving_policy(policy_of()).health.failures == 3  # the defaults


def test_a_rollout_edit_does_not_change_the_routes_digest():
    one = parse_serving_policy(policy_of(rollout={"steps": [5]}))
    assert one.sha256 == parse_serving_policy(policy_of(rollout={"steps": [5, 50]})).sha256


def test_shadow_share_is_sticky_and_near_its_share():
    policy = parse_serving_policy(policy_of(default={"arm": "production", "shadow": {"arm": "fallback", "share": 30}}))
    shadow = policy.default.shadow
    taken = [shadow.takes(f"u{i}", "default") for i in range(2000)]
    assert abs(100 * sum(taken) / 2000 - 30) <= 3
    assert all(shadow.takes("u7", "default") == taken[7] for _ in range(20))


@pytest.mark.parametrize(
    "top, where",
    [
        ({"arms": {"a": UPSTREAM | {"colour": 1}}}, r"arms\.a\.colour: unknown key"),
        ({"arms": {"a": UPSTREAM | {"upstream": "ftp://x/v1"}}}, r"arms\.a\.upstream: expected an http\(s\) base URL"),
        ({"arms": {"a": UPSTREAM | {"upstream": "not a url"}}}, r"arms\.a\.upstream"),
        ({"arms": {"a": UPSTREAM | {"timeout_s": 0}}}, r"arms\.a\.timeout_s: expected a positive number"),
        ({"arms": {"a": UPSTREAM | {"timeout_s": -2}}}, r"arms\.a\.timeout_s"),
        ({"arms": {"a": {"upstream": "http://h/v1"}}}, r"arms\.a\.model: expected"),
        ({"arms": {"a": UPSTREAM | {"api_key_env": "my key"}}}, r"arms\.a\.api_key_env: expected an environment"),
        ({"arms": {"a": UPSTREAM | {"alias": "staging"}}}, r"arms\.a: expected exactly one of upstream"),
        ({"arms": {"a": {"alias": "staging", "model": "m"}}}, r"arms\.a\.model: only an upstream arm"),
        ({"arms": {"a": {"alias": "staging", "faults": {"abort_share": 120}}}}, r"arms\.a\.faults\.abort_share"),
        ({"arms": {"a": {"alias": "staging", "faults": {"nan": 1}}}}, r"arms\.a\.faults\.nan: unknown key"),
        ({"arms": {"a": {"alias": "staging", "faults": {"delay_s": -1}}}}, r"arms\.a\.faults\.delay_s"),
        ({"arms": {"default": {"alias": "staging"}}}, r"arms\.default: an arm may not have a route's name"),
        ({"health": {"failures": 0}}, r"health\.failures: expected a positive integer"),
        ({"health": {"cooldown_s": "soon"}}, r"health\.cooldown_s"),
        ({"health": {"retries": 2}}, r"health\.retries: unknown key"),
        ({"default": {"arm": "production", "fallback": ""}}, r"default\.fallback: expected an arm name"),
        ({"default": {"arm": "production", "shadow": {"arm": "x", "share": 101}}}, r"default\.shadow\.share"),
        ({"default": {"arm": "production", "shadow": "staging"}}, r"default\.shadow: expected \{arm"),
        ({"rollouts": {}}, r"rollouts: unknown key; expected routes, default, arms, health, limits, rollout"),
    ],
)
def test_bad_arms_are_refused_naming_the_key(tmp_path, top, where):
    path = tmp_path / "serving.yaml"
    path.write_text(yaml.safe_dump(policy_of(**top)))
    with pytest.raises(ServingPolicyError, match=where) as caught:
        load_serving_policy(path)
    assert str(caught.value).startswith(f"{path}: ") and "\n" not in str(caught.value)


def test_the_bundled_serving_policy_still_loads():
    assert load_serving_policy().aliases() == ("fallback", "production")


# the weights overlay -----------------------------------------------------------------------------------


def test_write_weights_is_read_back_and_applied_with_the_same_sticky_hash(tmp_path):
    path = write_weights(tmp_path / "rollouts" / "weights.json", {"default": {"staging": 25, "production": 75}})
    data = json.loads(path.read_text())
    assert data == {
        "routes": {"default": {"staging": 25, "production": 75}},
        "sha256": weights_sha256({"default": {"staging": 25, "production": 75}}),
    }
    assert not list(path.parent.glob(".weights-*"))  # the temporary file was renamed, none left behind
    overlay = read_weights(path)
    policy = parse_serving_policy(policy_of())
    applied = apply_overlay(policy, overlay, {"production", "staging"}, str(path))
    same = parse_serving_policy(policy_of(default={"split": {"staging": 25, "production": 75}}))
    assert applied.default.split == (("staging", 25), ("production", 75))
    assert all(applied.default.pick(f"u{i}") == same.default.pick(f"u{i}") for i in range(300))
    assert read_weights(tmp_path / "none.json") is None


@pytest.mark.parametrize(
    "content, where",
    [
        ('{"routes": {"default": {"production": 90}}}', r"routes\.default: weights sum to 90"),
        ('{"routes": {"default": {"production": 100}}, "sha256": "0000"}', r"sha256: does not match"),
        ('{"routes": {"default": {"production": 100}}, "extra": 1}', r"extra: unknown key"),
        ('{"routes": {"default": {"production": 100.0}}}', r"routes\.default\.production: expected an integer"),
        ("[1, 2]", r"expected \{\"routes\""),
        ('{"routes": ', r"not valid JSON"),
    ],
)
def test_a_bad_weights_file_is_refused_naming_the_key(tmp_path, content, where):
    path = tmp_path / "weights.json"
    path.write_text(content)
    with pytest.raises(ServingPolicyError, match=where) as caught:
        read_weights(path)
    assert str(caught.value).startswith(f"{path}: ")


def test_an_overlay_must_name_routes_and_arms_that_exist(tmp_path):
    policy = parse_serving_policy(policy_of())
    with pytest.raises(ServingPolicyError, match=r"routes\.canary: no such route"):
        apply_overlay(policy, {"canary": (("production", 100),)}, {"production"}, "w.json")
    with pytest.raises(ServingPolicyError, match=r"routes\.default\.staging: not an arm served or declared"):
        apply_overlay(policy, {"default": (("staging", 100),)}, {"production"}, "w.json")
    with pytest.raises(ServingPolicyError, match=r"weights sum to 50"):
        write_weights(tmp_path / "w.json", {"default": {"production": 50}})
    assert not (tmp_path / "w.json").exists()


def test_the_route_table_follows_the_overlay_and_keeps_it_through_a_bad_one(tmp_path):
    from serving.routing import RouteTable

    routes, weights, metrics = tmp_path / "serving.yaml", tmp_path / "weights.json", ServingMetrics()
    routes.write_text(yaml.safe_dump(policy_of(default={"split": {"production": 100, "fallback": 0}}), sort_keys=False))
    table = RouteTable(routes, ["production", "fallback"], metrics, weights)
    facts = RequestFacts("/v1/completions")
    assert table.decide("auto", facts, "u1", "user").arm.name == "production"
    write_weights(weights, {"default": {"fallback": 100, "production": 0}})
    assert table.refresh() and table.decide("auto", facts, "u1", "user").arm.name == "fallback"
    weights.write_text('{"routes": {"default": {"fallback": 70}}}')
    assert not table.refresh() and "weights sum to 70" in table.weights_error
    assert table.policy.default.split == (("fallback", 100), ("production", 0))  # kept
    write_weights(weights, {"default": {"staging": 100}})  # a valid file, an arm nobody serves
    assert not table.refresh() and "default.staging: not an arm served or declared" in table.weights_error
    assert metrics.weights_reload_failures._value.get() == 2 and metrics.weights_reloads._value.get() == 1
    weights.unlink()  # no overlay: the policy's own split again
    assert table.refresh() and table.policy.default.split == (("production", 100), ("fallback", 0))
    assert table.weights_error is None


def test_upstream_key_env_must_be_set_when_the_table_loads(tmp_path, monkeypatch):
    from serving.routing import RouteTable

    monkeypatch.delenv("UNMASK_TEST_UNSET_KEY", raising=False)
    routes = tmp_path / "serving.yaml"
    routes.write_text(
        yaml.safe_dump(
            policy_of(arms={"up": UPSTREAM | {"api_key_env": "UNMASK_TEST_UNSET_KEY"}}, default={"arm": "up"})
        )
    )
    with pytest.raises(ServingPolicyError, match=r"arms\.up\.api_key_env: \$UNMASK_TEST_UNSET_KEY is not set"):
        RouteTable(routes, ["production"], ServingMetrics())
    monkeypatch.setenv("UNMASK_TEST_UNSET_KEY", "sk-test")
    assert (
        RouteTable(routes, ["production"], ServingMetrics())
        .decide("auto", RequestFacts("/v1/completions"), "u", "user")
        .arm.kind
        == "upstream"
    )


# health and drills -------------------------------------------------------------------------------------


def test_an_arm_is_unhealthy_after_n_failures_and_healthy_after_a_probe_succeeds():
    from gates.serving_arms import HealthSpec

    metrics = ServingMetrics()
    health = ArmHealth(lambda: HealthSpec(failures=3, cooldown_s=0.2), metrics)
    health.failed("a", "connection", "refused")
    health.succeeded("a")  # in a row: a success in between starts the count again
    for _ in range(2):
        health.failed("a", "connection", "refused")
    assert health.healthy("a")
    health.failed("a", "connection", "cannot reach http://127.0.0.1:9/v1")
    report = health.report("a")
    assert not report["healthy"] and "3 failures in a row" in report["reason"] and "127.0.0.1:9" in report["reason"]
    assert not health.admits("a")  # cooling down
    time.sleep(0.25)
    assert health.admits("a") and not health.admits("a")  # one probe at a time
    health.failed("a", "timeout", "slow")  # the probe failed: a new cooldown
    assert not health.healthy("a") and not health.admits("a")
    time.sleep(0.25)
    assert health.admits("a")
    health.succeeded("a")
    assert health.healthy("a") and health.report("a")["reason"] is None
    text = metrics.render().decode()
    assert (
        'unmask_arm_healthy{arm="a"} 1.0' in text
        and 'unmask_arm_failures_total{arm="a",reason="connection"} 4.0' in text
    )
    assert 'unmask_arm_unhealthy{arm="a",reason="timeout"} 0.0' in text


@pytest.mark.parametrize("share", [0, 20, 50, 100])
def test_a_fault_share_fires_on_exactly_that_share(share):
    drill = FaultDrill()
    fired = [drill.fires("a", "abort", share) for _ in range(100)]
    assert sum(fired) == share and sum(drill.fires("b", "abort", share) for _ in range(10)) == share // 10


# the request log reader --------------------------------------------------------------------------------


def test_read_rows_reads_finished_files_since_a_time(tmp_path):
    log = RequestLog(tmp_path, flush_rows=1, flush_s=0.05)
    old = row(endpoint="completions", status=200) | {"time": "2020-01-01T00:00:00.000+00:00"}
    log.append(old)
    log.append(row(endpoint="chat", status=500, retried=True, decode_failure=True, arm="canary"))
    log.close()
    (tmp_path / "requests-x.parquet.partial").write_bytes(b"half a file")  # a flush in progress: not read
    rows = read_rows(tmp_path)
    assert [r["endpoint"] for r in rows] == ["completions", "chat"]
    recent = read_rows(tmp_path, since=datetime.now(UTC) - timedelta(minutes=5))
    assert len(recent) == 1 and recent[0]["retried"] is True and recent[0]["decode_failure"] is True
    assert read_rows(tmp_path, since=datetime(2019, 1, 1)) == rows  # a naive time is read as UTC
    assert read_rows(tmp_path / "none") == []


# real servers: a front `unmask serve --routes` and a second `unmask serve` as its upstream ---------------

NAN_TOKEN = "@"  # its embedding row is NaN in the front server's production weights: a prompt with it is NaN


def nan_weights(folder: Path) -> Path:
    """tiny-llada with one NaN embedding row: warm-up and ordinary prompts decode, a prompt with `@` gives NaN
    logits."""
    from safetensors.torch import load_file, save_file

    import models
    from models.loading import resolve_model_path

    shutil.copytree(resolve_model_path("tiny-llada"), folder)
    tensors = load_file(folder / "model.safetensors")
    (row_id,) = models.load("tiny-llada").encode(NAN_TOKEN)
    tensors["model.transformer.wte.weight"][row_id] = float("nan")
    save_file(tensors, folder / "model.safetensors")
    return folder


def front_policy(upstream: str, dead: str) -> dict:
    return {
        "arms": {
            "vllm-a": {
                "upstream": upstream,
                "model": "production",
                "api_key_env": "UNMASK_TEST_UPSTREAM_KEY",
                "timeout_s": 30,
            },
            "gone": {"upstream": dead, "model": "production", "timeout_s": 2},
            "hasty": {"upstream": upstream, "model": "production", "timeout_s": 0.001},  # no decode is that fast
            "aborting": {"alias": "production", "faults": {"abort_share": 100}},
            "stuck": {"alias": "production", "timeout_s": 0.3, "faults": {"delay_s": 5}},
            "slow-shadow": {"alias": "fallback", "faults": {"delay_s": 6}},
        },
        "health": {"failures": 3, "cooldown_s": 60},
        "routes": {
            "up": {"match": {"header": {"name": "X-Route", "value": "up"}}, "arm": "vllm-a"},
            "down": {"match": {"header": {"name": "X-Route", "value": "down"}}, "arm": "gone"},
            "abort": {"match": {"header": {"name": "X-Route", "value": "abort"}}, "arm": "aborting"},
            "hurry": {
                "match": {"header": {"name": "X-Route", "value": "hurry"}},
                "arm": "hasty",
                "fallback": "production",
            },
            "stall": {"match": {"header": {"name": "X-Route", "value": "stall"}}, "arm": "stuck"},
            "mirror": {
                "match": {"header": {"name": "X-Route", "value": "mirror"}},
                "arm": "production",
                "shadow": {"arm": "vllm-a", "share": 100},
            },
            "busy": {
                "match": {"header": {"name": "X-Route", "value": "busy"}},
                "arm": "production",
                "shadow": {"arm": "slow-shadow", "share": 100},
            },
        },
        "default": {"arm": "production"},
    }


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    from tests.support.servers import free_port
    from tests.support.serving_fixtures import (
        digest,
        running_server,
        serving_registry,
        settings_for,
        shared_serving_registry,
    )

    folder = tmp_path_factory.mktemp("arms")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("UNMASK_TEST_UPSTREAM_KEY", "sk-never-logged-4242")
        with running_server(settings_for(shared_serving_registry().tracking_uri, log_dir=folder / "up-log")) as up:
            weights = nan_weights(folder / "tiny-llada-nan")
            registry = serving_registry(folder / "front-registry", weights={"tiny-llada": digest(str(weights))})
            routes = folder / "serving.yaml"
            routes.write_text(
                yaml.safe_dump(front_policy(up.base_url + "/v1", f"http://127.0.0.1:{free_port()}/v1"), sort_keys=False)
            )
            settings = settings_for(
                registry.tracking_uri, log_dir=folder / "log", poll_interval_s=0.2, sources={"tiny-llada": str(weights)}
            )
            settings.routes_path, settings.weights_path, settings.max_shadows = routes, folder / "weights.json", 1
            with running_server(settings) as front:
                front.up, front.log_dir, front.weights = up, folder / "log", folder / "weights.json"
                yield front


@pytest.fixture(scope="module")
def client(servers):
    return openai_client(servers)


def logged(servers, until, timeout_s: float = 20.0) -> list[dict]:
    """The front server's request-log rows once `until(rows)` holds (the writer flushes every 2 s)."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = read_rows(servers.log_dir)
        if until(rows) or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


PROMPT = "A box has 10 cups. Tom adds 14. How many in the box?"


@pytest.mark.timeout(300)
def test_an_upstream_arm_answers_plain_streamed_and_chat(servers, client):
    up = openai.OpenAI(base_url=servers.up.base_url + "/v1", api_key="unused", max_retries=0, timeout=60)
    direct = up.completions.create(model="production", prompt=PROMPT, max_tokens=8)
    routed = client.completions.create(model="auto", prompt=PROMPT, max_tokens=8, extra_headers={"X-Route": "up"})
    assert routed.choices[0].text == direct.choices[0].text
    assert (ext(routed)["route"], ext(routed)["arm"], ext(routed)["upstream"]) == (
        "up",
        "vllm-a",
        servers.up.base_url + "/v1",
    )
    assert ext(routed)["version"] == ext(direct)["version"]  # the upstream's own extension passes through
    chat = client.chat.completions.create(model="up", messages=[{"role": "user", "content": PROMPT}], max_tokens=8)
    assert chat.choices[0].message.content == direct.choices[0].text and ext(chat)["arm"] == "vllm-a"
    chunks = list(
        client.completions.create(
            model="up", prompt=PROMPT, max_tokens=8, stream=True, stream_options={"include_usage": True}
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == direct.choices[0].text
    assert [ext(c)["arm"] for c in chunks if c.model_extra.get("unmask")] == ["vllm-a"]  # on the finish chunk
    assert chunks[-1].usage.completion_tokens == direct.usage.completion_tokens
    # the unmask settings travel upstream: the upstream decodes with them, as it would asked directly
    tuned = dict(prompt=PROMPT, max_tokens=8, extra_body={"unmask": {"block_length": 4}})
    relayed = client.completions.create(model="up", **tuned)
    asked = up.completions.create(model="production", **tuned)
    assert ext(relayed)["config_hash"] == ext(asked)["config_hash"] != ext(direct)["config_hash"]
    assert relayed.choices[0].text == asked.choices[0].text
    # an upstream 4xx is the request's own fault, passed back as it is
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model="up", prompt=PROMPT, max_tokens=100_000)
    rows = logged(servers, lambda rows: sum(r["arm"] == "vllm-a" for r in rows) >= 5)
    mine = [r for r in rows if r["arm"] == "vllm-a" and not r["shadow"]]
    assert {r["upstream"] for r in mine} == {servers.up.base_url + "/v1"}
    assert sorted(r["status"] for r in mine) == [200, 200, 200, 200, 400]  # a stream read to its end is a 200
    assert all(r["model"] == "tiny-llada" for r in mine if r["status"] == 200 and not r["stream"])
    # the key travels to the upstream, but never into a log, the health or the routes view
    everything = (
        json.dumps(rows, default=str)
        + httpx.get(servers.base_url + "/health").text
        + httpx.get(servers.base_url + "/v1/unmask/routes").text
    )
    assert "sk-never-logged-4242" not in everything


@pytest.mark.timeout(300)
def test_a_dead_upstream_is_retried_on_the_fallback_then_marked_unhealthy(servers, client):
    answers = [client.completions.create(model="down", prompt=PROMPT, max_tokens=4) for _ in range(5)]
    assert all(ext(a)["arm"] == "fallback" and a.model == "tiny-ar" for a in answers)  # 0 failed client requests
    # unhealthy after 3 failures: the next ones go to the fallback at once, still logged as the split's choice
    assert [ext(a)["retry_of"] for a in answers] == ["gone"] * 5
    arm = httpx.get(servers.base_url + "/health").json()["arms"]["gone"]
    assert arm["healthy"] is False and "3 failures in a row" in arm["reason"] and "cannot reach" in arm["reason"]
    assert arm["since"]
    metrics = httpx.get(servers.base_url + "/metrics").text
    assert 'unmask_arm_healthy{arm="gone"} 0.0' in metrics
    assert 'unmask_arm_unhealthy{arm="gone",reason="connection"} 1.0' in metrics
    assert 'unmask_retries_total{arm="gone",fallback="fallback",route="down"} 5.0' in metrics
    rows = logged(servers, lambda rows: sum(r["route"] == "down" for r in rows) >= 10)
    down = [r for r in rows if r["route"] == "down"]
    failed = [r for r in down if r["retried"]]
    assert len(failed) == 5 and all(r["arm"] == "gone" for r in failed)
    tried = [r for r in failed if r["status"] == 502]
    skipped = [r for r in failed if r["status"] == 503]
    assert len(tried) == 3 and all("cannot reach" in r["error"] for r in tried)
    assert len(skipped) == 2 and all(
        "gone is unhealthy" in r["error"] and "cannot reach" in r["error"] for r in skipped
    )  # the health's reason, for the analysis and the on-call
    assert sum(r["retry_of"] == "gone" and r["arm"] == "fallback" and r["status"] == 200 for r in down) == 5


@pytest.mark.timeout(300)
def test_an_abort_a_timeout_and_real_nan_logits_are_answered_by_the_fallback(servers, client):
    aborted = client.completions.create(model="abort", prompt=PROMPT, max_tokens=4)
    stalled = client.chat.completions.create(
        model="stall", messages=[{"role": "user", "content": PROMPT}], max_tokens=4
    )
    nan = client.completions.create(model="auto", prompt=f"{NAN_TOKEN} {PROMPT}", max_tokens=4)
    hurried = client.completions.create(model="hurry", prompt=PROMPT, max_tokens=4)  # the upstream times out
    assert (ext(hurried)["arm"], ext(hurried)["retry_of"]) == ("production", "hasty")  # its route's own fallback
    nan_streamed = list(
        client.completions.create(model="auto", prompt=f"{NAN_TOKEN} {PROMPT}", max_tokens=4, stream=True)
    )
    assert [ext(r)["arm"] for r in (aborted, stalled, nan)] == ["fallback"] * 3
    assert [ext(r)["retry_of"] for r in (aborted, stalled, nan)] == ["aborting", "stuck", "production"]
    assert [(ext(c)["arm"], ext(c)["retry_of"]) for c in nan_streamed if c.model_extra.get("unmask")] == [
        ("fallback", "production")
    ]  # retried before a byte; it says so
    plain = client.completions.create(model="auto", prompt=PROMPT, max_tokens=4)  # 2 in a row: still healthy
    assert ext(plain)["arm"] == "production" and ext(plain)["retry_of"] is None
    rows = logged(servers, lambda rows: sum(bool(r["retried"]) for r in rows if r["route"] != "down") >= 4)
    failed = {
        (r["arm"], r["error"].split(":")[0], r["decode_failure"]) for r in rows if r["retried"] and r["route"] != "down"
    }
    assert ("aborting", "aborting", False) in failed and ("stuck", "stuck", False) in failed
    assert ("production", "production", True) in failed  # real NaN logits: a decode failure
    nan_rows = [r for r in rows if r["arm"] == "production" and r["decode_failure"]]
    assert nan_rows and all("non-finite logits" in r["error"] and r["status"] == 500 for r in nan_rows)
    hasty = next(r for r in rows if r["arm"] == "hasty")
    assert hasty["status"] == 504 and "no answer from" in hasty["error"] and hasty["retried"]
    stuck = next(r for r in rows if r["arm"] == "stuck")
    assert stuck["status"] == 504 and "injected delay" in stuck["error"]


@pytest.mark.timeout(300)
def test_shadow_copies_are_recorded_compared_and_bounded(servers, client):
    mirrored = client.completions.create(model="mirror", prompt=PROMPT, max_tokens=8)
    assert ext(mirrored)["arm"] == "production"  # the shadow's answer is never returned
    logged(servers, lambda rows: any(r["shadow"] and r["route"] == "mirror" for r in rows))  # its slot is free again
    streamed = list(client.completions.create(model="mirror", prompt=PROMPT, max_tokens=8, stream=True))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == mirrored.choices[0].text
    rows = logged(servers, lambda rows: sum(bool(r["shadow"]) and r["route"] == "mirror" for r in rows) >= 2)
    shadows = [r for r in rows if r["shadow"] and r["route"] == "mirror"]
    # the upstream serves the real tiny-llada; the front's differs only in the NaN row: they agree, streamed or not
    assert [(r["arm"], r["status"], r["agrees"], r["upstream"], r["stream"]) for r in shadows] == [
        ("vllm-a", 200, True, servers.up.base_url + "/v1", False)
    ] * 2
    # at most one shadow in flight (max_shadows=1): the slow shadow holds the slot, the next copies are dropped
    busy = [client.completions.create(model="busy", prompt=PROMPT, max_tokens=4) for _ in range(3)]
    assert all(ext(b)["arm"] == "production" for b in busy)
    metrics = httpx.get(servers.base_url + "/metrics").text
    assert 'unmask_shadow_dropped_total{arm="slow-shadow",route="busy"} 2.0' in metrics
    rows = logged(servers, lambda rows: any(r["shadow"] and r["route"] == "busy" for r in rows), timeout_s=40)
    slow = [r for r in rows if r["shadow"] and r["route"] == "busy"]
    alone = client.completions.create(model="fallback", prompt=PROMPT, max_tokens=4)  # what the shadow answers
    agrees = alone.choices[0].text == busy[0].choices[0].text
    assert len(slow) == 1 and slow[0]["arm"] == "slow-shadow" and slow[0]["agrees"] is agrees
    verdict = "agree" if agrees else "disagree"
    assert (
        f'unmask_shadow_requests_total{{arm="slow-shadow",outcome="{verdict}",route="busy"}} 1.0'
        in httpx.get(servers.base_url + "/metrics").text
    )
    # shadows stay out of the route metrics a rollout judges
    assert 'unmask_route_requests_total{arm="vllm-a",endpoint="completions",route="mirror"' not in metrics


@pytest.mark.timeout(300)
def test_the_weights_overlay_moves_traffic_live_and_a_bad_one_is_kept_out(servers, client):
    def arms_of_users() -> set[str]:
        return {
            ext(client.completions.create(model="auto", prompt=PROMPT, max_tokens=4, user=f"u{i}"))["arm"]
            for i in range(6)
        }

    def view() -> dict:
        return httpx.get(servers.base_url + "/v1/unmask/routes").json()

    def until(condition, what: str) -> None:
        deadline = time.monotonic() + 20
        while not condition():
            assert time.monotonic() < deadline, what
            time.sleep(0.2)

    assert arms_of_users() == {"production"}
    write_weights(servers.weights, {"default": {"fallback": 100, "production": 0}})
    until(lambda: view()["routes"][-1]["weights_from"] == "overlay", "the overlay was not applied")
    assert arms_of_users() == {"fallback"}
    default = view()["routes"][-1]
    assert default["name"] == "default" and default["split"] == {"fallback": 100, "production": 0}
    # a bad overlay, put in place whole (a write_text truncates first: the server's poll could read it empty and
    # count that as the failure instead, as a full run here did)
    (servers.weights.parent / "bad.json").write_text('{"routes": {"default": {"fallback": 60}}}')
    os.replace(servers.weights.parent / "bad.json", servers.weights)
    until(lambda: view()["weights_error"] is not None, "the bad overlay was not noticed")
    assert "weights sum to 60" in view()["weights_error"] and arms_of_users() == {"fallback"}  # kept
    assert "unmask_weights_reload_failures_total 1.0" in httpx.get(servers.base_url + "/metrics").text
    servers.weights.unlink()
    until(lambda: view()["routes"][-1]["weights_from"] == "policy", "removing the overlay did not restore the policy")
    assert arms_of_users() == {"production"}
    arms = view()["arms"]
    assert arms["vllm-a"]["kind"] == "upstream" and arms["aborting"]["faults"]["abort_share"] == 100
    assert arms["production"]["kind"] == "local" and arms["production"]["healthy"] is True


def test_unmask_serve_refuses_an_unset_upstream_key_in_one_line(tmp_path, monkeypatch):
    from tests.support.fuzz_fixtures import unmask_app

    monkeypatch.setenv("UNMASK_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("UNMASK_TEST_UNSET_KEY", raising=False)
    routes = tmp_path / "serving.yaml"
    routes.write_text(
        yaml.safe_dump(
            policy_of(arms={"up": UPSTREAM | {"api_key_env": "UNMASK_TEST_UNSET_KEY"}}, default={"arm": "up"})
        )
    )
    result = CliRunner().invoke(unmask_app(), ["serve", "--routes", str(routes), "--port", "8766"])
    assert result.exit_code == 2, result.output
    assert "arms.up.api_key_env: $UNMASK_TEST_UNSET_KEY is not set" in result.output
    assert "Traceback" not in result.output
