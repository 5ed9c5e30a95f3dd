"""Promotions: whether the audit trail's hash chain verifies, the audit trail as a timeline (who moved which
alias when, with what evidence), the nightly flow's regression findings, and every decision with who made it
(name, host and identity source)."""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from checklists import STAGES
from dashboards import source
from dashboards.alerts import show_chain
from dashboards.cells import CHART_PADDING, value_text
from dashboards.policy_note import show_policy

reg = source.registry_or_stop()
uri = reg.tracking_uri

# what each audit event is to a reader, and how it is drawn: (name, shape, colour)
MARKS = {
    "promote": ("triangle-up", "#1a7f37"),
    "rollback": ("triangle-down", "#cf222e"),
    "sign-off": ("diamond", "#0969da"),
    "approval": ("square", "#8250df"),
    "decline": ("cross", "#57606a"),
    "refusal": ("triangle-right", "#d4a72c"),
    "rollout": ("wedge", "#1f6feb"),
    "nightly finding": ("circle", "#bc4c00"),
    "registration": ("triangle-left", "#0a3069"),
    "decision": ("arrow", "#9a6700"),
    "other": ("stroke", "#6e7781"),
}
QUIET = ("registration", "decision")  # on every evaluation and judgement: off the timeline unless asked for
LABELLED = ("promote", "rollback")  # the alias moves carry a label; the rest say who and what on hover
LABEL_LIMIT_PX = 110


def kind_of(event: str, evidence: dict[str, Any] | None) -> str:
    """What an audit event is on the timeline: a refusal (the rules said no) is not a decline (a person said no)."""
    if event == "alias_move":
        return {"promotion": "promote", "rollback": "rollback"}.get((evidence or {}).get("kind") or "", "other")
    if event.startswith("rollout_"):
        return "rollout"
    if event.endswith("_refused"):
        return "refusal"
    return {
        "signoff": "sign-off",
        "approval": "approval",
        "decline": "decline",
        "gate_evaluation": "nightly finding",
        "evidence_registered": "registration",
        "decision_changed": "decision",
    }.get(event, "other")


def labelled(kinds: pd.Series, rows: pd.Series) -> list[bool]:
    """Which events get a text label: alias moves, and on each row only every other one of them at most, so two
    labels (LABEL_LIMIT_PX wide, alternating above and below) never share the space between two marks."""
    keep: list[bool] = []
    last: dict[Any, int] = {}  # row -> the index of its last labelled event
    for n, (kind, row) in enumerate(zip(kinds, rows)):
        ok = kind in LABELLED and n - last.get(row, -99) >= 2
        if ok:
            last[row] = n
        keep.append(ok)
    return keep


st.title("Promotions")
show_policy(uri)
show_chain(uri)
events = source.audit_events(uri)
if events.empty:
    st.info("No approvals, sign-offs or alias moves yet: `unmask promote MODEL --to STAGE` records them.")
else:
    events = events.assign(kind=[kind_of(e, ev) for e, ev in zip(events.event, events.evidence)])
    kinds = [k for k in MARKS if k in set(events.kind)]
    chosen = st.multiselect("Events", kinds, default=[k for k in kinds if k not in QUIET] or kinds, key="audit_events")
    shown = events[events.kind.isin(chosen)].copy()
    shown["what"] = [
        f"{f or 'nobody'} → {t}" if e == "alias_move" else (f"{m} v{v}" if m else "")
        for e, f, t, m, v in zip(shown.event, shown["from"], shown["to"], shown.model, shown.version)
    ]
    shown["stage "] = shown.stage.where(shown.stage.isin(STAGES), "—")  # a registration's candidate or fallback
    shown["n"] = range(1, len(shown) + 1)  # oldest first, evenly spaced: events seconds apart stay apart
    # the plot's width per event in an 800 px window with the sidebar open (axis title and labels take the rest);
    # two labels on a row are two events apart, so a label may be nearly twice that wide
    width_px = 320 / max(len(shown), 1)
    limit = int(min(LABEL_LIMIT_PX, 2 * width_px - 6))
    legible = limit >= 24  # narrower than that, a label is an ellipsis: the marks say it on hover instead
    shown["label"] = [
        f"{m} v{v}" if m and keep and legible else ""
        for m, v, keep in zip(shown.model, shown.version, labelled(shown.kind, shown["stage "]))
    ]
    plotted = shown[["n", "when", "kind", "who", "stage ", "what", "label", "comment", "status"]]
    stages = ["production", "staging", "poc", "—"]
    x = alt.X(
        "n:Q",
        title="audit events, oldest first (hover for the time)",
        axis=alt.Axis(tickMinStep=1),
        scale=alt.Scale(domain=[0.5, len(shown) + 0.5], nice=False),
    )
    y = alt.Y(
        "stage :N", title="stage", sort=stages, scale=alt.Scale(domain=[s for s in stages if s in set(shown["stage "])])
    )
    base = alt.Chart(plotted).encode(x=x, y=y)
    present = [k for k in MARKS if k in set(shown.kind)]
    marks = base.mark_point(size=260, filled=True, opacity=0.9).encode(
        shape=alt.Shape(
            "kind:N",
            title="event",
            scale=alt.Scale(domain=present, range=[MARKS[k][0] for k in present]),
            legend=alt.Legend(orient="bottom", columns=3),
        ),
        color=alt.Color(
            "kind:N",
            title="event",
            scale=alt.Scale(domain=present, range=[MARKS[k][1] for k in present]),
            legend=alt.Legend(orient="bottom", columns=3),
        ),
        tooltip=[
            alt.Tooltip("when:N", title="when (UTC)"),
            alt.Tooltip("kind:N", title="event"),
            alt.Tooltip("who:N"),
            alt.Tooltip("stage :N", title="stage"),
            alt.Tooltip("what:N"),
            alt.Tooltip("comment:N"),
            alt.Tooltip("status:N"),
        ],
    )
    # labels alternate above and below their marks, so neighbours on a row stay twice as far apart
    above = (
        base.transform_filter("datum.n % 2 == 1 && datum.label != ''")
        .mark_text(dy=-17, fontSize=11, limit=limit)
        .encode(text="label:N")
    )
    below = (
        base.transform_filter("datum.n % 2 == 0 && datum.label != ''")
        .mark_text(dy=19, fontSize=11, limit=limit)
        .encode(text="label:N")
    )
    st.altair_chart(
        alt.layer(marks, above, below).properties(height=160 + 80 * len(set(shown["stage "])), padding=CHART_PADDING),
        width="stretch",
        key="audit_timeline",
    )
    newest_first = shown.sort_values("when", ascending=False)
    st.dataframe(
        pd.DataFrame(
            {
                "when (UTC)": newest_first["when"],
                "event": newest_first.kind,
                "who": newest_first.who,
                "stage": newest_first.stage,
                "what": newest_first.what,
                "status": newest_first.status,
                "comment": newest_first.comment,
                "evidence": newest_first.evidence.map(value_text),
            }
        ),
        hide_index=True,
        width="stretch",
    )

st.subheader("Which version held each stage when")
timeline, unverified = source.stage_timeline(uri)
if unverified:
    st.error(unverified)
if timeline.empty:
    st.info("No stage alias has moved yet: `unmask promote MODEL --to STAGE` moves one.")
else:
    order = [s for s in ("poc", "staging", "production") if s in set(timeline.stage)]
    bars = (
        alt.Chart(timeline)
        .mark_bar(height=26, cornerRadius=3)
        .encode(
            # no tick labels: a timeline of seconds or of months gets labels that collide at 800 px; hover tells
            x=alt.X("since:T", title="time (UTC), oldest left: hover a bar", axis=alt.Axis(labels=False, ticks=False)),
            x2="until:T",
            y=alt.Y("stage:N", sort=order, title="stage"),
            color=alt.Color("holder:N", title="version", legend=None),  # the table below names each holder
            tooltip=["stage:N", "holder:N", "since:N", "held:N", "how:N", "moved_by:N", "approvals:N", "why:N"],
        )
    )
    st.altair_chart(
        bars.properties(height=80 + 50 * len(order), padding=CHART_PADDING), width="stretch", key="stage_timeline"
    )
    st.dataframe(timeline.iloc[::-1], hide_index=True, width="stretch")
    st.caption(
        "One bar per holder, one colour per version (hover for who, since when, how and by whom). "
        "From the audit chain's settled alias moves, as `unmask history` prints them: each move gives the stage to "
        "a version until the stage's next move. `unmask history --stage production --at TIME` answers which "
        "version served it at a given time."
    )

st.subheader("Nightly regression findings")
findings = source.regression_findings(uri)
if findings.empty:
    st.write(
        "None recorded. The nightly flow re-judges production and the candidates and records a finding "
        "here when a version no longer passes its gates."
    )
else:
    st.dataframe(
        pd.DataFrame(
            {
                "when (UTC)": findings["when"],
                "model": findings.model,
                "version": findings.version,
                "stage": findings.stage,
                "finding": findings.finding,
                "failed gates": findings.failed_gates.map(", ".join),
                "action": findings.action,
                "audit run": findings.audit_run_id,
            }
        ),
        hide_index=True,
        width="stretch",
    )

st.subheader("Who did what")
decided = source.decisions(uri)
if decided.empty:
    st.write(
        "No decisions yet: sign-offs (`unmask sign-off`), approvals and declines (`unmask approve`, "
        "`unmask reject`), promotions and rollbacks are listed here with who made them."
    )
else:
    st.dataframe(
        pd.DataFrame(
            {
                "when (UTC)": decided["when"],
                "decision": decided.decision,
                "who": decided.who,
                "host": decided.host.replace("", "—"),
                "identity": decided.identity.replace("", "—"),
                "stage": decided.stage,
                "version": [f"{m} v{v}" if m else "" for m, v in zip(decided.model, decided.version)],
                "what": decided.what,
                "status": decided.status,
                "comment": decided.comment,
                "audit run": decided.audit_run_id,
            }
        ),
        hide_index=True,
        width="stretch",
    )
