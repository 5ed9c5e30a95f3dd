"""The policy in view: which policy file (and sha256) produced the verdicts a page shows, and which verdicts
were judged under another one."""

from __future__ import annotations

import os

import streamlit as st

from dashboards import source
from dashboards.cells import policy_label
from gates.roles import ROLES_ENV


def show_policy(uri: str) -> None:
    """Name this page's policy under its title; warn (amber) about stored verdicts judged under others."""
    current = source.policy_cited(source.policy_source())
    judged = source.judged_policies(uri)
    others = judged[judged.policy_sha256 != current["sha256"]]
    held = (
        "every stored verdict was judged under it"
        if len(judged) and others.empty
        else "no verdict stored yet"
        if judged.empty
        else f"{len(judged) - len(others)} of {len(judged)} stored verdicts were judged under it"
    )
    st.caption(f"Policy {policy_label(current['path'], current['sha256'])}: {held}.")
    if others.empty:
        return
    lines = [
        f"- {policy_label(path, sha)}: "
        + ", ".join(f"{m} v{v} at {s}" for m, v, s in zip(group.model, group.version, group.stage))
        for (path, sha), group in others.groupby(["policy_path", "policy_sha256"], sort=False)
    ]
    st.warning(
        "**Verdicts judged under a different policy** than this page's, so they may no longer hold "
        "(judge again and record with `unmask gates MODEL --store`):\n" + "\n".join(lines),
        icon=":material/policy:",
    )


def show_demo(uri: str) -> None:
    """The DEMO banner, on every page, while the policy, the roles or the registry is a demonstration."""
    marks = source.demo_marks(uri, source.policy_source(), os.environ.get(ROLES_ENV, ""))
    if marks:
        st.error(
            f"**DEMO — not a decision.** {'; '.join(marks)}: thresholds relaxed and people made up to show "
            "the mechanics. A demo policy cannot move production on a real registry.",
            icon=":material/science:",
        )
