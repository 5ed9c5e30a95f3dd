"""Gate board: which version qualifies for which stage, and why not; who holds each alias now."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboards import source
from dashboards.alerts import show_drift, show_tampered
from dashboards.cells import holder_text, policy_short, value_text, verdict_text, version_label
from dashboards.policy_note import show_policy
from gates.readable import gate_threshold, gate_value
from registry import ALIASES, CANDIDATE_ALIAS, FALLBACK_ALIAS, STAGE_ALIASES

reg = source.registry_or_stop()
uri = reg.tracking_uri

st.title("Gate board")
show_policy(uri)
st.caption(
    "Each cell: the stage's gates as last judged on the version's validated records. "
    "Open a row below for every gate's value, threshold and reason."
)

held = source.aliases(uri)
st.subheader("Aliases")
st.table(pd.DataFrame({alias: [holder_text(held.get(alias))] for alias in ALIASES}, index=["held by"]))
show_drift(uri)

board = source.gate_board(uri)
st.subheader("Gates by stage")
show_tampered(uri)
if board.empty:
    st.info("Registered models, but no evaluated version yet: run `unmask run` to evaluate and judge them.")
    st.stop()
# candidates first, the fallback last: the board reads top-down from what is being adopted
board = board.sort_values(
    "aliases",
    key=lambda a: a.map(lambda h: 0 if CANDIDATE_ALIAS in h else 2 if FALLBACK_ALIAS in h else 1),
    kind="stable",
)
board["row"] = [version_label(m, v, a) for m, v, a in zip(board.model, board.version, board.aliases)]
board["cell"] = [verdict_text(*x) for x in zip(board.verdict, board.passed, board.total)]
matrix = board.pivot(index="row", columns="stage", values="cell")[list(STAGE_ALIASES)]
matrix = matrix.loc[list(dict.fromkeys(board.row))]
matrix.index.name = "version"


def _colour(cell: str) -> str:
    if "inconclusive" in cell:
        return "background-color: #fdf0c8; color: #7a5300"
    if "pass" in cell:
        return "background-color: #d7f5dd; color: #0b5d1e"
    if "fail" in cell.lower():
        return "background-color: #fbdada; color: #8a1c1c"
    return "color: #777"


st.table(matrix.style.map(_colour))

results = source.gate_results(uri)
specs_of = source.gate_specs(source.policy_source())
RESULT_WORDS = {"pass": "pass", "fail": "FAIL", "inconclusive": "inconclusive"}
st.subheader("Why")
for row in board.itertuples():
    if row.verdict == "not judged":
        continue
    failed = f": {', '.join(row.failed_gates)}" if row.failed_gates else ""
    with st.expander(f"{row.row} · {row.stage} · {row.verdict} ({row.passed} of {row.total} gates){failed}"):
        mine = results[(results.model == row.model) & (results.version == row.version) & (results.stage == row.stage)]
        specs = [specs_of.get((row.stage, gate)) for gate in mine.gate]
        st.table(
            pd.DataFrame(
                {
                    "gate": mine.gate,
                    "result": mine.verdict.map(RESULT_WORDS),
                    "measured": [gate_value(getattr(spec, "kind", None), v) for spec, v in zip(specs, mine.value)],
                    # through value_text: a cell starting ">=" is a Markdown quote in st.table, read as "= 30%"
                    "required": [value_text(gate_threshold(spec, t)) for spec, t in zip(specs, mine.threshold)],
                    "why": mine.reason,
                }
            )
            .set_index("gate")
            .style.map(_colour, subset=["result"])
        )
        cited = mine.iloc[0] if len(mine) else None
        st.caption(
            f"judged at {row.evaluated_at}"
            + (f" under {policy_short(cited.policy_path, cited.policy_sha256)}" if cited is not None else "")
        )
