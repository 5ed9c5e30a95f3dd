"""Before a rollout moves any traffic: does the live server serve both arms, with the right weights?

A server that does not serve an arm's alias rejects the split the controller writes, and the rollout would
starve on "0 requests" while its status shows 25%. So `unmask rollout start` asks the server first
(`GET /health`: ready, the aliases it serves and the version each points at; `GET /v1/unmask/routes`: the
route and its declared arms; `GET /v1/models/<alias>`: the weights hash) and refuses, naming what is missing.
"""

from __future__ import annotations

from typing import Any

import httpx

TIMEOUT_S = 10.0


def _get(client: httpx.Client, url: str) -> tuple[int, Any]:
    response = client.get(url)
    try:
        return response.status_code, response.json()
    except ValueError:
        return response.status_code, None


def preflight_problems(server_url: str, route: str, expected: dict[str, tuple[str, str, str]]) -> list[str]:
    """What keeps the server at `server_url` from serving a rollout on `route`; [] when nothing does.

    `expected` maps each arm to the (model, version, weights_sha256) it must serve."""
    base = server_url.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    try:
        with httpx.Client(timeout=TIMEOUT_S) as client:
            status, health = _get(client, f"{base}/health")
            if status != 200 or not isinstance(health, dict) or health.get("status") != "ready":
                state = (health or {}).get("status", status) if isinstance(health, dict) else status
                return [f"the server at {base} is not ready ({state}); start `unmask serve --routes FILE` first"]
            status, routes = _get(client, f"{base}/v1/unmask/routes")
            if status == 404 or not isinstance(routes, dict):
                return [f"the server at {base} routes nothing: start it with --routes (the file naming route {route})"]
            names = [r.get("name") for r in routes.get("routes") or []]
            if route not in names:
                return [
                    f"the server at {base} has no route {route!r} (its routes: {', '.join(map(str, names))}; "
                    f"file {routes.get('file')})"
                ]
            served = health.get("served") or {}
            declared = routes.get("arms") or {}
            problems = []
            for arm, (model, version, weights) in expected.items():
                spec = declared.get(arm) or {}
                if spec.get("kind") == "upstream":
                    continue  # another server answers for it; its own preflight is its operator's
                alias = spec.get("alias") or arm
                if alias not in served:
                    problems.append(
                        f"the server at {base} does not serve the `{alias}` alias of arm {arm} (serves: "
                        f"{', '.join(sorted(served)) or 'nothing'}; add --alias {alias})"
                    )
                    continue
                status, card = _get(client, f"{base}/v1/models/{alias}")
                facts = (card or {}).get("unmask") or {} if isinstance(card, dict) else {}
                if (facts.get("model"), str(facts.get("version"))) != (model, version):
                    problems.append(
                        f"arm {arm} (alias {alias}) serves {facts.get('model')} v{facts.get('version')}, "
                        f"the rollout needs {model} v{version}: the server has not picked up the alias yet"
                    )
                elif weights and facts.get("weights_sha256") != weights:
                    problems.append(
                        f"arm {arm} serves weights {str(facts.get('weights_sha256'))[:12]}, {model} "
                        f"v{version} is registered with {weights[:12]}"
                    )
            return problems
    except httpx.HTTPError as e:
        return [
            f"no server answers at {base} ({type(e).__name__}); start `unmask serve` with both arms, or pass "
            "--server URL"
        ]
