"""Promotions: the audit trail as a timeline (who moved which alias when, with what evidence), and the
nightly flow's regression findings."""

from __future__ import annotations

import pandas as pd
import plotly.express as px
import streamlit as st

from dashboards import source
from dashboards.cells import value_text

reg = source.registry_or_stop()
uri = reg.tracking_uri

st.title("Promotions")
events = source.audit_events(uri)
if events.empty:
    st.info("No approvals, sign-offs or alias moves yet: `unmask promote MODEL --to STAGE` records them.")
else:
    kinds = sorted(events.event.unique())
    chosen = st.multiselect("Events", kinds, default=kinds, key="audit_events")
    shown = events[events.event.isin(chosen)].copy()
    shown["at"] = pd.to_datetime(shown["when"], utc=True, format="ISO8601")
    shown["what"] = [f"{f or 'nobody'} → {t}" if e == "alias_move" else (f"{m} v{v}" if m else "")
                     for e, f, t, m, v in zip(shown.event, shown["from"], shown["to"], shown.model, shown.version)]
    shown["stage "] = shown.stage.replace("", "—")
    timeline = px.scatter(shown, x="at", y="stage ", color="event", symbol="event",
                          hover_data={"who": True, "what": True, "comment": True, "status": True, "at": True,
                                      "stage ": False},
                          category_orders={"stage ": ["production", "staging", "poc", "—"]})
    timeline.update_traces(marker={"size": 14})
    timeline.update_layout(height=360, xaxis_title="when (UTC)", yaxis_title="stage")
    st.plotly_chart(timeline, key="audit_timeline")
    newest_first = shown.sort_values("at", ascending=False)
    st.dataframe(pd.DataFrame({
        "when": newest_first["when"], "event": newest_first.event, "who": newest_first.who,
        "stage": newest_first.stage, "what": newest_first.what, "status": newest_first.status,
        "comment": newest_first.comment, "evidence": newest_first.evidence.map(value_text),
    }), hide_index=True, width="stretch")

st.subheader("Nightly regression findings")
findings = source.regression_findings(uri)
if findings.empty:
    st.write("None recorded. The nightly flow re-judges production and the candidates and records a finding "
             "here when a version no longer passes its gates.")
else:
    st.dataframe(findings.assign(failed_gates=findings.failed_gates.map(", ".join)), hide_index=True,
                 width="stretch")
