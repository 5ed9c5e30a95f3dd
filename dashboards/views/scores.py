"""Scores: the multi-criteria ranking of the versions that pass a stage's hard gates.

The weight sliders explore: they re-rank on this page only and change no policy.
"""

from __future__ import annotations

import streamlit as st

from dashboards import source
from registry import STAGE_ALIASES

reg = source.registry_or_stop()
uri = reg.tracking_uri

st.title("Scores")
st.caption("Hard gates filter, then weighted sum and TOPSIS rank the survivors on quality (higher is better), "
           "p95 latency and peak memory (lower is better) and license tier (permitted 3 ... unknown 0).")

stage = st.selectbox("Stage", STAGE_ALIASES, key="scores_stage")
policy_weights = source.policy_weights(source.policy_source())[stage]

st.markdown("**Weights** — move them to explore; the policy keeps its own "
            f"({', '.join(f'{c} {w:g}' for c, w in policy_weights.items())}).")
weights = {}
for column, (criterion, default) in zip(st.columns(len(policy_weights)), policy_weights.items()):
    weights[criterion] = column.slider(criterion, 0.0, 1.0, float(default), 0.05, key=f"weight_{stage}_{criterion}")
if not any(weights.values()):
    st.warning("Every weight is 0: nothing to rank by. Showing the policy's weights.")
    weights = dict(policy_weights)
total = sum(weights.values())
normalised = {c: w / total for c, w in weights.items()}
if any(abs(normalised[c] - policy_weights[c]) > 1e-9 for c in policy_weights):
    st.caption("Exploring: " + ", ".join(f"{c} {w:.2f}" for c, w in normalised.items()) + " (normalised to sum 1).")

scored = source.scores(uri, source.policy_source(), stage, tuple(sorted(weights.items())))
ranking, sensitivity, filtered = scored["ranking"], scored["sensitivity"], scored["filtered"]

st.subheader(f"Ranking at {stage}")
if ranking.empty:
    st.info(f"No version passes every {stage} gate, so nothing is ranked. See who was filtered and why below.")
else:
    st.dataframe(ranking, hide_index=True, width="stretch", column_config={
        "weighted_sum": st.column_config.NumberColumn("weighted sum", format="%.4f"),
        "topsis": st.column_config.NumberColumn("TOPSIS", format="%.4f"),
        "rank_weighted_sum": "rank (weighted sum)", "rank_topsis": "rank (TOPSIS)",
        "latency": st.column_config.NumberColumn("p95 latency (s)", format="%.4f"),
        "memory": st.column_config.NumberColumn("peak memory (MB)", format="%.0f"),
    })

st.subheader("Sensitivity")
st.caption("Each weight moved by ±20 % (the others rescaled): does the top candidate, and the whole ranking, hold?")
if sensitivity.empty:
    st.write("Nothing ranked, so nothing to perturb.")
else:
    st.dataframe(sensitivity, hide_index=True, width="stretch")

st.subheader("Filtered by the hard gates")
if filtered.empty:
    st.write("Every version passed.")
else:
    st.dataframe(filtered.assign(failed_gates=filtered.failed_gates.map("\n".join)), hide_index=True,
                 width="stretch")
