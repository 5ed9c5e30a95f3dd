"""Where the dashboard's data comes from: one `Registry` per tracking URI, cached reads, and the two
friendly stops (registry unreachable, registry empty). Everything goes through `registry.read` and
`registry.views`; nothing here can move an alias.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import pandas as pd
import streamlit as st

import registry.decision as decision
import registry.links as links
import registry.read as read
import registry.views as views
from dashboards import verdict
from gates.roles import RolesError, load_roles
from registry import Registry, RegistryError, RegistryUnavailable, demo
from registry.connection import check_reachable, resolve_tracking_uri

TTL_S = 30  # new evaluations show up within this, or at once with "Refresh"


@st.cache_resource(show_spinner=False)
def _registry(tracking_uri: str) -> Registry:
    return Registry(tracking_uri)


def tracking_uri() -> str:
    return resolve_tracking_uri()


def policy_source() -> str:
    """Which policy file ranks and marks operating points ("" = the bundled one); part of cache keys."""
    return os.environ.get(views.POLICY_ENV, "")


def registry_or_stop() -> Registry:
    """The registry, or an explanation on the page and a stop when it cannot be read or holds nothing."""
    uri = tracking_uri()
    try:
        check_reachable(uri)  # every rerun: a server that went away is a message, not minutes of retries
        reg = _registry(uri)
        empty = not reg.model_names()  # not cached: data from `unmask run` shows on the next reload
    except RegistryUnavailable as e:
        st.error(f"**The registry is unreachable.** {e}", icon=":material/cloud_off:")
        st.stop()
    except RegistryError as e:
        st.error(f"**The registry cannot be read.** {e}", icon=":material/error:")
        st.stop()
    if empty:
        st.info(
            f"**No candidates in the registry yet** ({uri}).\n\nRun `unmask run` to evaluate the bundled "
            "tiny models, judge them against the stage gates and record everything here; then reload "
            "this page.",
            icon=":material/hourglass_empty:",
        )
        st.stop()
    return reg


@contextmanager
def one_read_per_question() -> Iterator[None]:
    """A page's run asks the registry each distinct question once (`Registry.reading`): its reads ask again and
    again who holds each stage and what each version's tags are (the verdict asks per stage). The dashboard writes
    nothing, so nothing read within one run goes stale in it; the next run reads afresh. A registry that cannot be
    opened gets no snapshot: the page says why (`registry_or_stop`)."""
    try:
        reg = _registry(tracking_uri())
    except RegistryError:
        reg = None
    with reg.reading() if reg is not None else nullcontext():
        yield


def refresh() -> None:
    st.cache_data.clear()


# cached reads, keyed by tracking URI (the Registry itself is not hashable) ---------------------------
@st.cache_data(ttl=TTL_S, show_spinner=False)
def aliases(uri: str) -> dict[str, Any]:
    return read.aliases(_registry(uri))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def versions(uri: str) -> pd.DataFrame:
    return views.shown_versions(_registry(uri))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def gate_board(uri: str) -> pd.DataFrame:
    return views.gate_board(_registry(uri))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def integrity(uri: str) -> pd.DataFrame:
    return views.integrity_board(_registry(uri))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def drifted_aliases(uri: str) -> dict[str, str]:
    return views.drifted_aliases(_registry(uri))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def gate_results(uri: str) -> pd.DataFrame:
    return read.gate_results(registry=_registry(uri))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def policy_weights(policy: str) -> dict[str, dict[str, float]]:
    loaded = views.dashboard_policy(policy or None)
    return {stage: dict(p.weights) for stage, p in loaded.stages.items()}


@st.cache_data(ttl=TTL_S, show_spinner=False)
def operating_points(policy: str) -> dict[str, tuple[str, int]]:
    """{stage: (task, gen_length)} the policy's gates judge."""
    stages = views.dashboard_policy(policy or None).stages
    return {stage: (p.operating_point.task, p.operating_point.gen_length) for stage, p in stages.items()}


@st.cache_data(ttl=TTL_S, show_spinner=False)
def scores(uri: str, policy: str, stage: str, weights: tuple[tuple[str, float], ...]) -> dict[str, pd.DataFrame]:
    return read.scores(stage, dict(weights), registry=_registry(uri), policy=views.dashboard_policy(policy or None))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def quality_latency(uri: str, policy: str) -> pd.DataFrame:
    return views.quality_latency(_registry(uri), views.dashboard_policy(policy or None))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def load_curves(uri: str) -> pd.DataFrame:
    return views.load_curves(_registry(uri))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def stage_timeline(uri: str) -> tuple[pd.DataFrame, str]:
    return views.stage_timeline(_registry(uri))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def benchmarks(uri: str) -> pd.DataFrame:
    return views.benchmark_frame(views.latest_benchmark_records(_registry(uri)))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def candidate_view(uri: str, model: str, version: str) -> dict[str, Any]:
    return views.candidate_view(_registry(uri), model, version)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def checklist(uri: str, model: str, version: str, stage: str) -> pd.DataFrame:
    return read.checklist(model, version, stage, _registry(uri))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def audit_events(uri: str) -> pd.DataFrame:
    return read.audit_events(registry=_registry(uri))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def decisions(uri: str) -> pd.DataFrame:
    return views.decisions(_registry(uri))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def audit_chain(uri: str) -> dict[str, Any]:
    return read.audit_chain(_registry(uri))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def regression_findings(uri: str) -> pd.DataFrame:
    return views.regression_findings(_registry(uri))


def mlflow_ui_command(uri: str) -> str:
    return links.mlflow_ui_command(_registry(uri).tracking_uri)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def judged_policies(uri: str) -> pd.DataFrame:
    return read.judged_policies(_registry(uri))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def policy_cited(policy: str) -> dict[str, str]:
    """{path, sha256} of the policy this dashboard ranks and judges by."""
    return views.dashboard_policy(policy or None).cited()


@st.cache_data(ttl=TTL_S, show_spinner=False)
def stage_verdicts(uri: str, policy: str) -> list[Any]:
    return verdict.stage_verdicts(_registry(uri), views.dashboard_policy(policy or None))


def gate_specs(policy: str) -> dict[tuple[str, str], Any]:
    """{(stage, gate name): GateSpec} of the dashboard's policy, to write values and thresholds in their units."""
    stages = views.dashboard_policy(policy or None).stages
    return {(stage, g.name): g for stage, p in stages.items() for g in p.gates}


@st.cache_data(ttl=TTL_S, show_spinner=False)
def rollout_board(uri: str) -> dict[str, pd.DataFrame]:
    return views.rollout_board(_registry(uri))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def failed_rollouts(uri: str) -> pd.DataFrame:
    return views.failed_rollouts(_registry(uri))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def decided(uri: str, policy: str) -> list[Any]:
    """Every candidate's decision per stage (`registry.decision`), judged afresh under the page's policy."""
    return decision.decisions(_registry(uri), views.dashboard_policy(policy or None))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def version_decisions(uri: str, model: str, version: str, policy: str) -> list[Any]:
    """One version's decision per stage (`registry.decision`), judged afresh under the page's policy."""
    judged_under = views.dashboard_policy(policy or None)
    return decision.decisions(_registry(uri), judged_under, [model], versions={model: version})


@st.cache_data(ttl=TTL_S, show_spinner=False)
def demo_marks(uri: str, policy: str, roles_file: str) -> list[str]:
    """What makes this dashboard a demonstration: a `demo: true` policy or roles file (`roles_file`: $UNMASK_ROLES,
    "" for the bundled one; part of the cache key), a registry marked demo."""
    try:
        roles = load_roles(roles_file or None)
    except RolesError:
        roles = None
    policy_read = views.dashboard_policy(policy or None)
    try:
        check_reachable(uri)
        return demo.demo_marks(_registry(uri), policy_read, roles)
    except RegistryError:  # the page's own stop explains an unreachable registry
        return demo.demo_marks(None, policy_read, roles)
