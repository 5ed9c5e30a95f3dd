"""What the rollout tests share: a policy of two quick steps, routes with a rollout, and a bounded load."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import openai
import yaml

from tests.support import REPO
from tests.support.serving_fixtures import PROMPTS

STEPS_OK = {
    "steps": [50, 100],
    "interval_s": 3,
    "min_requests": 3,
    "failure_limit": 1,
    "inconclusive": "pause",
    "analysis": {"p95_latency_s": {"max": 60.0}, "error_rate": {"max": 0.2}},
}


def write_routes(path: Path, rollout: dict) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "routes": {"long": {"match": {"max_tokens_above": 64}, "arm": "fallback"}},
                "default": {"split": {"fallback": 100}},
                "rollout": rollout,
            },
            sort_keys=False,
        )
    )
    return path


def write_policy(path: Path) -> Path:
    """The demo policy, production without the load-test gate (no load test here) and with a canary at 100%."""
    data = yaml.safe_load((REPO / "gates" / "demo-policy.yaml").read_text())
    data.pop("demo", None)  # this test's own policy, not the demo: a demo policy may not move production here
    production = data["stages"]["production"]["gates"]
    production.pop("serving")
    production["canary"] = {"min_weight": 100}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


class Load:
    """Requests to `model: auto` from many users (the sticky split spreads them), until stopped; bounded in requests
    and in time. The time bound is what ends it: a count alone ran out on a fast host (a tiny model answers in
    milliseconds) before the rollout's last step had seen a request."""

    def __init__(self, base_url: str, max_requests: int = 20_000, max_s: float = 180.0):
        self.client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=60)
        self.stop, self.sent, self.failed, self.max = threading.Event(), 0, 0, max_requests
        self.deadline = time.monotonic() + max_s
        self.arms: list[str] = []
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(2)]

    def _run(self, worker: int) -> None:
        while not self.stop.is_set() and self.sent < self.max and time.monotonic() < self.deadline:
            user = f"user-{worker}-{self.sent}"
            self.sent += 1
            try:
                r = self.client.completions.create(
                    model="auto", prompt=PROMPTS[self.sent % len(PROMPTS)], max_tokens=8, user=user
                )
                self.arms.append(r.model_extra["unmask"]["arm"])
            except openai.APIError:
                self.failed += 1

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(90)
