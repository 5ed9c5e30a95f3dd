"""Scores: the multi-criteria ranking of the versions that pass a stage's hard gates.

The weight sliders explore: they re-rank on this page only and change no policy.
"""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from dashboards import source
from dashboards.cells import CHART_PADDING
from dashboards.policy_note import show_policy
from gates.readable import milliseconds, percent, significant
from gates.scoring import TIER_SCORE
from registry import STAGE_ALIASES

reg = source.registry_or_stop()
uri = reg.tracking_uri

st.title("Scores")
show_policy(uri)
st.caption(
    "Hard gates filter, then weighted sum and TOPSIS rank the survivors on quality (higher is better), "
    "p95 latency and peak memory (lower is better) and license tier (permitted 3 ... unknown 0)."
)

stage = st.selectbox("Stage", STAGE_ALIASES, key="scores_stage")
policy_weights = source.policy_weights(source.policy_source())[stage]

st.markdown(
    "**Weights** — move them to explore; the policy keeps its own "
    f"({', '.join(f'{c} {w:g}' for c, w in policy_weights.items())})."
)
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
intervals = scored["intervals"].set_index("candidate")
TIERS = {score: tier for tier, score in TIER_SCORE.items()}

st.subheader(f"Ranking at {stage}")
waiting = ranking[ranking.open_signoffs != ""] if not ranking.empty else ranking
if ranking.empty:
    st.info(f"No version passes every measured {stage} gate, so nothing is ranked. See who was filtered and why below.")
else:
    if len(waiting):
        st.info(
            "**Ranked on evidence; not yet promotable:** "
            + ", ".join(f"{c} (open: {o})" for c, o in zip(waiting.candidate, waiting.open_signoffs))
            + f". Every measured {stage} gate passes; the open sign-offs keep them from promotion.",
            icon=":material/pending_actions:",
        )
    bars = pd.DataFrame(
        [
            {
                "candidate": r.candidate,
                "method": method,
                "score": getattr(r, column),
                "low": intervals.loc[r.candidate, f"{column}_low"],
                "high": intervals.loc[r.candidate, f"{column}_high"],
                "shown": significant(getattr(r, column)),
                "range": f"{significant(intervals.loc[r.candidate, f'{column}_low'])} to "
                f"{significant(intervals.loc[r.candidate, f'{column}_high'])}",
                "accuracy": percent(r.quality),
            }
            for r in ranking.itertuples()
            for method, column in (("TOPSIS", "topsis"), ("weighted sum", "weighted_sum"))
        ]
    )
    order = list(ranking.candidate)
    tooltip = [
        alt.Tooltip("candidate:N", title="version"),
        alt.Tooltip("method:N"),
        alt.Tooltip("shown:N", title="score"),
        alt.Tooltip("range:N", title="range on the accuracy's 95% interval"),
        alt.Tooltip("accuracy:N"),
    ]
    y = alt.Y("candidate:N", sort=order, title=None)
    base = alt.Chart(bars).encode(y=y, yOffset=alt.YOffset("method:N"), tooltip=tooltip)
    chart = base.mark_bar().encode(
        x=alt.X("score:Q", title="score (1 = best)", scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("method:N", title="method", legend=alt.Legend(orient="top")),
    ) + base.mark_rule(color="#333", strokeWidth=2).encode(x="low:Q", x2="high:Q")
    st.altair_chart(
        chart.properties(height=140 + 70 * len(order), padding=CHART_PADDING), width="stretch", key="scores_chart"
    )
    st.caption(
        "Bars: each passing version's score by both methods; whiskers: how far it moves while the version's "
        "accuracy runs across its 95% interval on the items measured (the others held)."
    )
    st.dataframe(
        pd.DataFrame(
            {
                "version": ranking.candidate,
                "accuracy": ranking.quality.map(percent),
                "accuracy 95% interval": [
                    f"{percent(intervals.loc[c, 'quality_low'])} to {percent(intervals.loc[c, 'quality_high'])}"
                    for c in ranking.candidate
                ],
                "p95 latency (ms)": ranking.latency.map(milliseconds),
                "peak memory (MB)": ranking.memory.map(significant),
                "license tier": ranking.license.map(lambda v: TIERS.get(int(v), str(v))),
                "weighted sum": ranking.weighted_sum.map(significant),
                "TOPSIS": ranking.topsis.map(significant),
                "rank (weighted sum)": ranking.rank_weighted_sum,
                "rank (TOPSIS)": ranking.rank_topsis,
                "on the Pareto front": ranking.pareto.map({True: "yes", False: "no"}),
                "promotable": ranking.open_signoffs.map(lambda o: f"not yet: {o}" if o else "yes"),
            }
        ),
        hide_index=True,
        width="stretch",
    )

st.subheader("Sensitivity")
st.caption("Each weight moved by ±20 % (the others rescaled): does the top candidate, and the whole ranking, hold?")
if ranking.empty or sensitivity.empty:
    st.write("Nothing ranked, so nothing to perturb.")
else:
    top = ranking.candidate.iloc[0]
    outcome = [
        "ranking holds" if w and t else "top holds, order changes" if top_t == top else "top changes"
        for w, t, top_t in zip(
            sensitivity.weighted_sum_ranking_holds, sensitivity.topsis_ranking_holds, sensitivity.top_topsis
        )
    ]
    cells = sensitivity.assign(outcome=outcome, weight_shown=sensitivity.weight.map(significant))
    heat = (
        alt.Chart(cells)
        .mark_rect(stroke="white", strokeWidth=2)
        .encode(
            x=alt.X("change:N", title="weight moved by", sort=["-20%", "+20%"], axis=alt.Axis(labelAngle=0)),
            y=alt.Y("criterion:N", title=None),
            color=alt.Color(
                "outcome:N",
                title="ranking",
                legend=alt.Legend(orient="top"),
                scale=alt.Scale(
                    domain=["ranking holds", "top holds, order changes", "top changes"],
                    range=["#8fd19e", "#f5d76e", "#e8837e"],
                ),
            ),
            tooltip=[
                alt.Tooltip("criterion:N"),
                alt.Tooltip("change:N", title="moved by"),
                alt.Tooltip("weight_shown:N", title="weight then"),
                alt.Tooltip("outcome:N", title="ranking"),
                alt.Tooltip("top_topsis:N", title="top by TOPSIS"),
                alt.Tooltip("top_weighted_sum:N", title="top by weighted sum"),
            ],
        )
    )
    st.altair_chart(heat.properties(height=340, padding=CHART_PADDING), width="stretch", key="sensitivity_chart")
    st.dataframe(
        pd.DataFrame(
            {
                "criterion": sensitivity.criterion,
                "moved by": sensitivity.change,
                "weight then": sensitivity.weight.map(significant),
                "top by weighted sum": sensitivity.top_weighted_sum,
                "top by TOPSIS": sensitivity.top_topsis,
                "weighted-sum ranking holds": sensitivity.weighted_sum_ranking_holds.map({True: "yes", False: "no"}),
                "TOPSIS ranking holds": sensitivity.topsis_ranking_holds.map({True: "yes", False: "no"}),
            }
        ),
        hide_index=True,
        width="stretch",
    )

st.subheader("Filtered by the hard gates")
if filtered.empty:
    st.write("Every version passed.")
else:
    st.dataframe(
        pd.DataFrame({"version": filtered.candidate, "failed gates": filtered.failed_gates.map("\n".join)}),
        hide_index=True,
        width="stretch",
    )
