"""Rollout: per route, the arms of each staged rollout with their weights, the p95 latency and error rate of
each arm at every canary analysis (Plotly), each step's verdict and reason, rollouts paused for a human, and
the rollbacks with their audit entries. Read-only: `unmask rollout resume|abort` act."""

from __future__ import annotations

import plotly.graph_objects as go
import streamlit as st

from dashboards import source
from dashboards.cells import value_text
from registry import RegistryError

reg = source.registry_or_stop()
uri = reg.tracking_uri

VERDICT_COLOURS = {"pass": "#1a7f37", "fail": "#cf222e", "inconclusive": "#bf8700"}
ROLE_DASH = {"candidate": "solid", "baseline": "dot"}
SERIES = {
    "p95_s": ("p95 latency", "seconds"),
    "error_rate": ("error rate", "share of requests"),
    "probe_accuracy": ("probe accuracy (exact match on held-out prompts)", "share of probes right"),
}

st.title("Rollout")
st.caption(
    "Staged rollouts on live traffic: each step moves the candidate arm's weight, a canary analysis of the "
    "interval's requests decides (pass advances, fail counts toward the failure limit and rolls back, "
    "inconclusive pauses for a human). See docs/rollout.md."
)
board = source.rollout_board(uri)
rollouts, analyses, events = board["rollouts"], board["analyses"], board["events"]
if rollouts.empty:
    st.info(
        "**No rollouts yet.** `unmask rollout start MODEL --route ROUTE --to production` starts one on a route "
        "of `gates/serving.yaml` while `unmask serve --routes` serves it (docs/rollout.md).",
        icon=":material/alt_route:",
    )
    st.stop()

for r in rollouts[rollouts.status == "paused"].itertuples():
    st.warning(
        f"**Rollout {r.id} on route {r.route} is paused at {r.weight}%, waiting for a human**: {r.reason}  \n"
        f"`unmask rollout resume {r.id}` runs the step again; `unmask rollout abort {r.id}` rolls it back.",
        icon=":material/pause_circle:",
    )
failed = source.failed_rollouts(uri)
for r in rollouts[rollouts.status.isin(["rolled_back", "aborted"])].itertuples():
    event = "rollout_rollback" if r.status == "rolled_back" else "rollout_abort"
    entry = events[(events.rollout == r.id) & (events.event == event)]
    where = f" (audit entry {entry.iloc[-1].seq}, run `{entry.iloc[-1].audit_run_id}`)" if not entry.empty else ""
    finding = failed[failed.rollout == r.id]
    voided = len(finding.iloc[0].voided_approvals) if not finding.empty else 0
    how = "was rolled back by its canary analysis" if r.status == "rolled_back" else "was aborted"
    # nothing moved: the stage alias moves only at the end, so there is no previous holder to put back
    st.error(
        f"**Rollout {r.id} of {r.model} v{r.version} on route {r.route} {how}**{where}: {r.reason}  \n"
        f"Nothing to undo: the candidate's weight is 0 and {r.stage} never moved. Investigate the failed "
        f"analysis below, re-evaluate and register new evidence, or start a new rollout with new approvals "
        f"(this one voided {voided} approval{'' if voided == 1 else 's'}); until then "
        f"`unmask gates {r.model} --stage {r.stage}` fails citing {r.id}.",
        icon=":material/undo:",
    )

routes = list(dict.fromkeys(rollouts.route))
route = st.selectbox("Route", routes, key="rollout_route")
mine = rollouts[rollouts.route == route]
chosen = st.selectbox(
    "Rollout (newest first)",
    list(mine.id),
    key="rollout_id",
    format_func=lambda i: (
        f"{i}: {mine.set_index('id').loc[i, 'model']} "
        f"v{mine.set_index('id').loc[i, 'version']} ({mine.set_index('id').loc[i, 'status']})"
    ),
)
r = mine.set_index("id").loc[chosen]
try:
    judged = source.version_decisions(uri, str(r.model), str(r.version), source.policy_source())
except RegistryError as e:  # a rollout of a version the registry no longer holds: the board still shows it
    judged = []
    st.caption(f"No decision on {r.model} v{r.version}: {e}")
decided = {d.stage: d for d in judged}.get(str(r.stage))
if decided is not None:  # what the rollout leaves the version with: the decision every surface renders
    said = "; ".join(decided.blocker_texts()[:1]) or "nothing blocks it"
    st.markdown(
        f"**Decision on {r.model} v{r.version} at {r.stage}: {decided.outcome.value}** ({said}"
        + (f"; {len(decided.blockers) - 1} more" if len(decided.blockers) > 1 else "")
        + f"). `unmask gates {r.model} --stage {r.stage}` lists everything."
    )

left, mid, right = st.columns(3)
left.metric("status", r.status)
mid.metric(f"candidate · {r.candidate}", f"{r.weight}%")
right.metric(f"baseline · {r.baseline}", f"{100 - r.weight}%")
st.caption(
    f"{r.model} v{r.version} to {r.stage}; steps {', '.join(f'{s}%' for s in r.steps) or 'unrecorded'}; "
    f"started {r.started}" + (f"; MLflow run [{r.run_id}]({r.url})" if r.url else f"; MLflow run `{r.run_id}`")
)

steps = analyses[analyses.rollout == chosen]
if steps.empty:
    st.info("No analysis yet: the first one is made at the end of the first interval.")
else:
    for column, (title, unit) in SERIES.items():
        if steps[column].isna().all():
            continue  # e.g. no probes in this rollout's policy
        figure = go.Figure()
        for arm, rows in steps.groupby("arm", sort=False):
            rows = rows.sort_values("at")
            role = rows.role.iloc[0] or "arm"
            figure.add_trace(
                go.Scatter(
                    x=rows["at"].tolist(),
                    y=rows[column].tolist(),
                    name=f"{arm} ({role})",
                    mode="lines+markers",
                    line={"dash": ROLE_DASH.get(role, "dash")},
                    marker={"size": 11, "color": [VERDICT_COLOURS.get(v, "#6e7781") for v in rows.verdict]},
                    customdata=list(zip(rows.step + 1, rows.weight, rows.verdict, rows.requests)),
                    hovertemplate="step %{customdata[0]} at %{customdata[1]}%<br>%{customdata[2]}<br>"
                    "%{y} · %{customdata[3]} requests<extra>" + arm + "</extra>",
                )
            )
        figure.update_layout(
            title=f"{title} per arm at each analysis (marker: the step's verdict)",
            xaxis_title="analysis time",
            yaxis_title=unit,
            height=320,
            margin={"l": 10, "r": 10, "t": 40, "b": 10},
            legend={"orientation": "h"},
        )
        figure.update_yaxes(
            rangemode="nonnegative"
        )  # latencies and shares are never negative (a constant 0 drew -1..1)
        st.plotly_chart(figure, key=f"rollout_{column}")
    per_step = steps.drop_duplicates("run_id")[
        ["step", "weight", "verdict", "confidence", "reason", "at", "run_id"]
    ].copy()
    per_step["step"] = per_step.step + 1
    per_step["probe accuracy"] = [
        ", ".join(
            f"{a} {value_text(p)} ({value_text(n)})"
            for a, p, n in zip(g.arm, g.probe_accuracy, g.probes)
            if n == n and n
        )
        or "no probes"
        for _, g in steps.groupby("run_id", sort=False)
    ]
    per_step["requests"] = [
        ", ".join(f"{a} {value_text(n)}" for a, n in zip(g.arm, g.requests))
        for _, g in steps.groupby("run_id", sort=False)
    ]
    st.subheader("Analyses")
    st.caption(
        "confidence: each metric's bounds at that look; a rollout's looks together spend 1 - its policy's "
        "`confidence` (docs/rollout.md, the statistics)."
    )
    st.dataframe(
        per_step,
        hide_index=True,
        column_config={
            "weight": st.column_config.NumberColumn(format="%d%%"),
            "confidence": st.column_config.NumberColumn(format="%.4f"),
        },
    )

mine_events = events[events.rollout == chosen]
st.subheader("Audit entries")
if mine_events.empty:
    st.caption("None recorded for this rollout.")
else:
    st.dataframe(mine_events[["when", "event", "who", "comment", "seq", "audit_run_id"]], hide_index=True)
