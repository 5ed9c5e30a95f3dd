"""The dashboard app under Streamlit's AppTest, and a registry holding a rolled-back rollout for its pages."""

from __future__ import annotations

import functools
from pathlib import Path

import streamlit.components.v2.manifest_scanner as manifest_scanner
from streamlit.testing.v1 import AppTest

from gates.canary import Observation, analyse
from gates.rollout_policy import parse_rollout_policy
from registry.rollouts import log_analysis, set_rollout_status, start_rollout_run
from tests.support import REPO

APP = str(REPO / "dashboards" / "app.py")

# Every `AppTest.run` registers Streamlit's custom components anew, scanning every installed distribution's metadata
# for component manifests (~0.4 s a run, 5% of the fast tier). The installed packages do not change while the suite
# runs, so one scan per process answers every run the same.
manifest_scanner.scan_component_manifests = functools.cache(manifest_scanner.scan_component_manifests)


def app_test(app: str | Path = APP) -> AppTest:
    """The dashboard (or another Streamlit script) under AppTest, with the suite's timeout."""
    return AppTest.from_file(str(app), default_timeout=120)


def page(path: str | None = None) -> AppTest:
    at = app_test()
    at.run()
    assert not at.exception, at.exception
    if path:
        at.switch_page(path).run()
        assert not at.exception, at.exception
    return at


POLICY_ROLLOUT = parse_rollout_policy(
    {
        "steps": [5, 25, 50, 100],
        "interval_s": 2,
        "min_requests": 5,
        "analysis": {"p95_latency_s": {"max": 0.5}, "error_rate": {"max": 0.05}},
    }
)


def interval(candidate_latency: float, candidate_errors: int, n: int = 10) -> list[Observation]:
    rows = [
        Observation("staging", "2", status=500 if i < candidate_errors else 200, latency_s=candidate_latency)
        for i in range(n)
    ]
    return rows + [Observation("production", "1", latency_s=0.05) for _ in range(n)]


def rolled_back_registry(folder):
    """A registry whose tiny-llada v1 was rolled back by rollout `default-9` (its p95 breached at 5%)."""
    from tests.support.gate_fixtures import fresh_registry, register_pair

    reg = fresh_registry(folder)
    register_pair(reg)
    run = start_rollout_run(
        reg, "default-9", "tiny-llada", "1", "default", "production", "staging", "production", POLICY_ROLLOUT.to_dict()
    )
    breach = analyse(interval(0.9, 3), "staging", "production", POLICY_ROLLOUT).to_dict()
    log_analysis(reg, run, "default-9", 0, 5, breach)
    set_rollout_status(reg, run, "rolled_back", "p95_latency_s breached")
    return reg
