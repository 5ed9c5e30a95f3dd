"""The architects' dashboard: `unmask dashboard`, or `streamlit run dashboards/app.py`.

Seven read-only views of the registry: the verdict per stage first, then gates, scores, quality-latency, one
candidate, promotions and staged rollouts.
The registry is `$MLFLOW_TRACKING_URI`, else the embedded store under the state folder; the policy
that ranks and marks operating points is `$UNMASK_POLICY`, else the bundled one.
"""

from __future__ import annotations

import streamlit as st

from dashboards import source
from dashboards.policy_note import show_demo
from registry import RegistryError

st.set_page_config(page_title="unmask: adoption gates", page_icon=":material/rule:", layout="wide")
# A table cell may break inside a long word (a path, a command's flag): the rule is on the Markdown paragraph
# inside the cell too, whose own style (normal) wins without !important. On a narrow window the columns share the
# table's box evenly (Streamlit's auto layout let a 7-column table run 60 px past an 800 px window): it fits instead
# of hiding its last columns off screen.
st.html(
    "<style>[data-testid='stTable'] :is(td, th, td *, th *) { overflow-wrap: anywhere !important; }"
    "@media (max-width: 1100px) { [data-testid='stTable'] table { table-layout: fixed; width: 100%; } }</style>"
)

PAGES = [
    st.Page("views/verdict.py", title="Verdict", icon=":material/verified:", default=True),  # at /
    st.Page("views/gate_board.py", title="Gate board", icon=":material/grid_view:", url_path="gate-board"),
    st.Page("views/scores.py", title="Scores", icon=":material/leaderboard:", url_path="scores"),
    st.Page(
        "views/quality_latency.py", title="Quality vs latency", icon=":material/show_chart:", url_path="quality-latency"
    ),
    st.Page("views/candidate.py", title="Candidate", icon=":material/badge:", url_path="candidate"),
    st.Page("views/promotions.py", title="Promotions", icon=":material/history:", url_path="promotions"),
    st.Page("views/rollout.py", title="Rollout", icon=":material/alt_route:", url_path="rollout"),
]

page = st.navigation(PAGES)
with st.sidebar:
    st.caption(f"Registry: `{source.tracking_uri()}`")
    st.caption("Read-only: promotions go through `unmask promote`, behind gates and an approval.")
    if st.button("Refresh", icon=":material/refresh:"):
        source.refresh()
show_demo(source.tracking_uri())  # above every page's title: a demo never reads as a decision
try:
    with source.one_read_per_question():
        page.run()
except RegistryError as e:  # e.g. a forged baseline's evidence: explained, not a traceback
    st.error(f"**The registry cannot be read as it stands.** {e}", icon=":material/error:")
