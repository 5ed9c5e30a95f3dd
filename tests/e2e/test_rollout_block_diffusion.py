"""The bundled DiffusionGemma candidate (tiny-dgemma) served live: a canary rollout against the AR fallback
(tiny-ar), a shadow copy, and the serving contract on its trained weights.

The steps of docs/rollout.md, on the real parts: a real MLflow SQLite registry (tiny-ar the fallback, tiny-dgemma at
staging with production's sign-offs and two approvals signed by two listed keys), uvicorn serving `auto` through the
route's split, clients of the `openai` package as the load, and the rollout flow run by Prefect. The rollout walks
its steps on tiny-dgemma's answers and promotes it to production, and the canary gate then passes on that rollout.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from tests.support.gate_fixtures import OK, block_evidence, evidence, fresh_registry, record
from tests.support.rollout_fixtures import STEPS_OK, Load, write_policy, write_routes
from tests.support.serving_fixtures import OPERATING, digest, running_server, settings_for

pytestmark = pytest.mark.timeout(600)
MODEL = "tiny-dgemma"
# What an evaluation of tiny-dgemma records: its effective block config at gen_length 32 (one canvas, 16 steps).
BLOCK_OPERATING = {
    "max_new_tokens": 32,
    "max_denoising_steps": 16,
    "entropy_bound": 0.1,
    "t_min": 0.4,
    "t_max": 0.8,
    "stability_threshold": 1,
    "confidence_threshold": 0.005,
    "eos_ids": [1],
    "pad_id": 0,
    "seed": 0,
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory, prefect_harness):
    from checklists import load_checklist
    from registry import register_evidence, sign_off
    from registry.promotion import _move
    from tests.support.gate_fixtures import approve_as
    from tests.support.governance import team_environment

    root = tmp_path_factory.mktemp("rollout-dgemma")
    home = root / "home"
    env = pytest.MonkeyPatch()  # the module's state folder, registry and people's keys, restored after its last test
    env.setenv("UNMASK_HOME", str(home))
    team = team_environment(root)  # production counts only acts signed by listed keys
    for key, value in team.items():
        env.setenv(key, value)
    reg = fresh_registry(root)
    env.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    sha = digest("tiny-ar")
    rec = record("tiny-ar", "arith", config=OPERATING["tiny-ar"], weights_sha256=sha)
    register_evidence(reg, evidence("tiny-ar", [rec], weights_sha256=sha, serving=[]))
    version, _ = register_evidence(reg, block_evidence(MODEL, BLOCK_OPERATING, digest(MODEL), fallback=rec))
    _move(reg, "staging", None, (MODEL, version), "fixture", "staging passed", {"kind": "promotion"})
    for item in load_checklist("production").manual_items():
        sign_off(reg, MODEL, version, "production", item, "ada", f"{item} checked for production")
    approve_as(reg, MODEL, version, "production", OK, "linus", "grace")  # two listed keys: four eyes
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
            "version": version,
            "root": root,
            "server": server,
            "policy": write_policy(root / "policy.yaml"),
            "team": team,
        }
    env.undo()


def test_a_canary_of_tiny_dgemma_against_tiny_ar_walks_its_steps_and_promotes(stack, monkeypatch):
    from flows.rollout import plan_rollout, rollout_flow
    from flows.rollout_state import load_state, read_weights
    from gates import load_policy
    from gates.evaluate import evaluate_gates
    from registry import audit, load_evidence, stage_holder

    monkeypatch.setenv("UNMASK_HOME", str(stack["root"] / "home"))  # the server follows the overlay there
    for key, value in stack["team"].items():  # and the people's keys: the controller's request is signed
        monkeypatch.setenv(key, value)
    reg, v = stack["reg"], stack["version"]
    # judged on the error rate: at this machine's few requests per second a p95 bound needs more answers per look
    rollout = STEPS_OK | {"interval_s": 6, "confidence": 0.8, "analysis": {"error_rate": {"max": 0.5}}}
    state = plan_rollout(
        MODEL,
        "default",
        "production",
        write_routes(stack["root"] / "steps.yaml", rollout),
        str(stack["policy"]),
        server_url=stack["server"].base_url,
    )
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
    canary = [
        r
        for r in evaluate_gates(load_evidence(reg, MODEL, v), load_policy(stack["policy"]), "production")
        if r.gate == "canary"
    ]
    assert canary[0].passed and canary[0].evidence["rollout"] == state.id


def test_a_shadow_of_tiny_dgemma_is_recorded_and_compared_but_never_answers(stack, tmp_path):
    """A route answered by the fallback that copies every request to tiny-dgemma (`shadow: share 100`): the
    client gets tiny-ar's text, and the request log holds tiny-dgemma's copy with whether it agreed."""
    import openai
    import yaml

    from serving.request_log import read_rows

    routes = tmp_path / "shadow.yaml"
    header = {"name": "X-Route", "value": "mirror"}
    routes.write_text(
        yaml.safe_dump(
            {
                "routes": {
                    "mirror": {
                        "match": {"header": header},
                        "arm": "fallback",
                        "shadow": {"arm": "candidate", "share": 100},
                    },
                    "direct": {"match": {"header": header | {"value": "direct"}}, "arm": "candidate"},
                },
                "default": {"arm": "fallback"},
            },
            sort_keys=False,
        )
    )
    log_dir = tmp_path / "requests"
    settings = replace(
        settings_for(stack["reg"].tracking_uri, names=("candidate", "fallback"), log_dir=log_dir), routes_path=routes
    )
    prompt = "A box has 10 cups. Tom adds 14. How many in the box?"
    with running_server(settings) as server:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
        mirrored = client.completions.create(
            model="auto", prompt=prompt, max_tokens=32, extra_headers={"X-Route": "mirror"}
        )
        direct = client.completions.create(
            model="auto", prompt=prompt, max_tokens=32, extra_headers={"X-Route": "direct"}
        )
        fallback = client.completions.create(model="fallback", prompt=prompt, max_tokens=32)
        deadline = time.monotonic() + 30
        while not [r for r in read_rows(log_dir) if r["shadow"]] and time.monotonic() < deadline:
            time.sleep(0.3)  # the writer flushes every 2 s
        rows = read_rows(log_dir)
    assert mirrored.model_extra["unmask"]["arm"] == "fallback" and mirrored.choices[0].text == fallback.choices[0].text
    assert direct.model_extra["unmask"]["arm"] == "candidate"  # tiny-dgemma's own answer, for the comparison
    [shadow] = [r for r in rows if r["shadow"]]
    assert (shadow["route"], shadow["arm"], shadow["status"]) == ("mirror", "candidate", 200)
    assert shadow["agrees"] is (direct.choices[0].text == fallback.choices[0].text)


def test_the_bundled_tiny_dgemma_answers_16_at_once_as_alone_and_streams_its_plain_answer(stack):
    """The serving contract of block diffusion (tests/e2e/test_serving_block_diffusion.py, on a random fixture there)
    on the trained weights: 16 concurrent answers byte-identical to the solo ones, seed by seed, and the
    concatenated stream equal to the plain answer."""
    import asyncio

    import openai

    from evals.tasks import TASKS, make_split

    base = stack["server"].base_url + "/v1"
    prompts = [item.prompt for item in make_split(TASKS["arith"], "test", 16)]
    seeds = [i % 4 for i in range(16)]
    client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=120)
    solo = []
    for prompt, seed in zip(prompts, seeds):
        r = client.completions.create(model="staging", prompt=prompt, seed=seed, max_tokens=32)
        assert r.model_extra["unmask"]["batch_size"] == 1
        solo.append(r.choices[0].text)

    async def together() -> list[tuple[str, int]]:
        async with openai.AsyncOpenAI(base_url=base, api_key="unused", max_retries=0, timeout=120) as many:

            async def one(prompt: str, seed: int):
                r = await many.completions.create(model="staging", prompt=prompt, seed=seed, max_tokens=32)
                return r.choices[0].text, r.model_extra["unmask"]["batch_size"]

            return list(await asyncio.gather(*(one(p, s) for p, s in zip(prompts, seeds))))

    answers = asyncio.run(together())
    assert max(size for _, size in answers) >= 4  # it did batch, or this would prove nothing
    assert [text for text, _ in answers] == solo
    assert len(set(solo)) > 8 and sum("####" in text for text in solo) >= 12  # real, different answers
    for prompt in prompts[:2]:
        plain = client.completions.create(model="staging", prompt=prompt, seed=3, max_tokens=64).choices[0]
        chunks = list(client.completions.create(model="staging", prompt=prompt, seed=3, max_tokens=64, stream=True))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.text
        assert chunks[-1].choices[0].finish_reason == plain.finish_reason
