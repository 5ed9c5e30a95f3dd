"""One arm of a controller's split (`unmask serve --alias A --route R`): KServe's `canaryTrafficPercent` or Argo
Rollouts' `setWeight` sends each request to the stable or the canary revision, each a server of one alias. Their
rows named no route or arm, so the canary analysis judged nothing and answered inconclusive for ever. Here two real
servers (the bundled tiny models, a real MLflow registry), in process over httpx's ASGI transport, log to one
folder as a shared volume would have them, and the analysis of that folder counts both arms' requests and equals
`gates.canary.analyse` over the rows."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from gates.canary import Observation, analyse
from gates.rollout_policy import load_rollout_policy
from registry.clock import SimulatedClock
from serving import create_app
from serving.analysis_api import standalone_app
from serving.request_log import read_rows
from tests.support.serving_fixtures import settings_for, shared_serving_registry

pytestmark = pytest.mark.timeout(300)

POLICY = {"steps": [25, 100], "interval_s": 60, "min_requests": 4, "analysis": {"error_rate": {"max": 0.5}}}
# the names a client of the split service may send: either revision answers `auto` and the route's name; a pod's
# own alias is answered by that pod only (the other revision refuses it, 404, counted against its arm)
ASKED = {"production": ["default", "auto", "default", "production"], "fallback": ["auto", "default", "fallback"]}


@contextlib.asynccontextmanager
async def arm_server(alias: str, folder: Path):
    """`unmask serve --alias ALIAS --route default --request-log-dir FOLDER` in process, models loaded."""
    settings = settings_for(shared_serving_registry().tracking_uri, names=(alias,), log_dir=folder)
    settings.route = "default"
    app = create_app(settings)
    async with app.router.lifespan_context(app):  # loads the models; on the way out the request log is written
        while not app.state.pool.ready:
            assert not app.state.pool.error, app.state.pool.error
            await asyncio.sleep(0.05)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=f"http://{alias}") as client:
            yield client


def one_window(times: list[datetime]) -> tuple[float, datetime]:
    """A window width of the epoch-aligned grid (serving/looks.py) whose one window holds every time, and a moment
    just after that window ends (when the analysis judges it)."""
    for width in (86_400, 86_399):  # two grids: no 30 s of requests straddles a boundary of both
        ends = {math.floor(t.timestamp() / width) * width + width for t in times}
        if len(ends) == 1:
            return width, datetime.fromtimestamp(ends.pop() + 1, UTC)
    raise AssertionError(f"the requests straddle both grids: {times}")


def test_the_stable_and_canary_pods_rows_are_judged_together_by_route_and_arm(tmp_path):
    folder = tmp_path / "requests"  # the volume every revision's pods mount (--request-log-claim)

    async def traffic() -> dict[str, list[dict]]:
        answers: dict[str, list[dict]] = {}
        async with arm_server("production", folder) as canary, arm_server("fallback", folder) as stable:
            for alias, client in (("production", canary), ("fallback", stable)):
                answers[alias] = []
                for model in ASKED[alias]:
                    body = {"model": model, "prompt": "Mia has 37 pens and buys 45 more. How many now?"}
                    answer = await client.post("/v1/completions", json=body | {"max_tokens": 8})
                    assert answer.status_code == 200, answer.text
                    answers[alias].append(answer.json())
            refused = await canary.post("/v1/completions", json={"model": "fallback", "prompt": "hi", "max_tokens": 4})
            assert refused.status_code == 404  # the stable revision's alias: a client the canary breaks
            metrics = (await canary.get("/metrics")).text
        assert (
            'unmask_route_requests_total{arm="production",endpoint="completions",route="default",status="200"} 4.0'
            in (metrics)
        )
        return answers

    answers = asyncio.run(traffic())
    for alias, given in answers.items():  # each answer says the route and arm, as a router's does
        assert {(a["unmask"]["route"], a["unmask"]["arm"], a["unmask"]["alias"]) for a in given} == {
            ("default", alias, alias)
        }

    rows = read_rows(folder)
    assert Counter((r["route"], r["arm"], r["status"]) for r in rows) == {
        ("default", "production", 200): 4,
        ("default", "production", 404): 1,
        ("default", "fallback", 200): 3,
    }
    window_s, after = one_window([datetime.fromisoformat(r["time"]) for r in rows])
    routes = tmp_path / "serving.yaml"
    routes.write_text(yaml.safe_dump({"routes": {}, "default": {"split": {"production": 100}}, "rollout": POLICY}))

    async def ask() -> dict:
        app = standalone_app(routes, folder, clock=SimulatedClock(after))
        query = f"route=default&candidate=production&baseline=fallback&window_s={window_s}&revision=rs-1"
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://analysis") as client:
            answer = await client.get(f"/v1/unmask/analysis?{query}")
        assert answer.status_code == 200, answer.text
        return answer.json()

    judged = asyncio.run(ask())
    assert judged["window"]["end"] == (after - timedelta(seconds=1)).isoformat()
    expected = analyse(
        [Observation.from_row(r) for r in rows], "production", "fallback", load_rollout_policy(routes), look=1
    )
    assert (judged["verdict"], judged["reason"], judged["arms"]) == (expected.verdict, expected.reason, expected.arms)
    assert [m["verdict"] for m in judged["metrics"]] == [m.verdict for m in expected.metrics]
    assert {arm: summary["requests"] for arm, summary in judged["arms"].items()} == {"production": 5, "fallback": 3}


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--alias", "production", "--route", "default", "--routes", "gates/serving.yaml"], "with --routes"),
        (["--route", "default"], "serve exactly one name (--alias or --model), the arm its requests are logged as"),
        (["--alias", "production", "--alias", "fallback", "--route", "default"], "serving production, fallback"),
        (["--alias", "production", "--route", "auto"], "--route 'auto': reserved"),
    ],
)
def test_a_route_beside_routes_or_other_than_one_served_name_is_one_line_exit_2(tmp_path, monkeypatch, args, says):
    monkeypatch.setenv("UNMASK_HOME", str(tmp_path))
    from flows.cli import _register_all, app

    _register_all()
    r = CliRunner().invoke(app, ["serve", *args])
    assert r.exit_code == 2 and says in r.output, r.output
    assert [line for line in r.output.splitlines() if line] == [r.output.strip()]  # one line
