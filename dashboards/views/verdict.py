"""Verdict: what to adopt at each stage, who holds it now, and what blocks it, with the command that clears it."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboards import source
from dashboards.alerts import show_chain_broken, show_drift, show_tampered
from dashboards.cells import version_label
from dashboards.policy_note import show_policy
from dashboards.verdict import StageVerdict
from gates.decision import Decision
from gates.readable import percent, significant

reg = source.registry_or_stop()
uri = reg.tracking_uri

st.title("Verdict")
show_policy(uri)
show_chain_broken(uri)
show_drift(uri)
show_tampered(uri)
lines = source.stage_verdicts(uri, source.policy_source())
decided = source.decided(uri, source.policy_source())


def accuracy_cell(d: Decision) -> str:
    f = d.figures
    if f.accuracy is None:
        return "—"
    assert f.accuracy_interval is not None  # set with the accuracy (gates.decision)
    low, high = f.accuracy_interval
    return f"{percent(f.accuracy)} ({percent(low)} to {percent(high)}, n={f.n_items})"


def blocks_cell(d: Decision) -> str:
    return "; ".join(d.blocker_texts()) or ("nothing: it holds the stage" if d.holds else "nothing")


if decided:
    st.subheader("The decision, against the AR fallback")
    st.caption(
        f"Per candidate and stage: accuracy on {decided[0].figures.task} with its 95% interval, p95 latency and "
        f"text tokens/s against the AR fallback ({decided[0].figures.fallback or 'none registered'}) at the same "
        "concurrency with 95% intervals (solo: timed interleaved with the fallback on the same prompts; or the "
        "serving gate's load test of both, round by round), the decision (adopt, blocked, inconclusive) judged "
        "afresh, and what blocks it, in order."
    )
    st.dataframe(
        pd.DataFrame(
            {
                "candidate": [f"{d.model} v{d.version}" for d in decided],
                "stage": [d.stage for d in decided],
                "accuracy (95% CI)": [accuracy_cell(d) for d in decided],
                "p95 vs AR": [d.figures.p95_text() for d in decided],
                "tokens/s vs AR": [d.figures.tokens_per_s_text() for d in decided],
                "decision": [d.outcome.value + (" (ranked on evidence)" if d.ranked_only else "") for d in decided],
                "what blocks it": [blocks_cell(d) for d in decided],
            }
        ),
        hide_index=True,
        width="stretch",
        key="decision_table",
        column_config={"what blocks it": st.column_config.TextColumn(width="large")},
    )
pending = [f"{line.stage}: {', '.join(line.pending)}" for line in lines if line.pending]
if pending:
    st.info(
        "**Ranked on evidence; not yet promotable:** " + "; ".join(pending) + ". Their measured gates pass; "
        "the open sign-offs in brackets keep them from promotion (Scores has the ranking).",
        icon=":material/pending_actions:",
    )


def label(holder: tuple[str, str] | None) -> str:
    return version_label(*holder) if holder else ""


for line in lines:
    if line.holder and line.holder_is_fallback:  # rolling back again would put back what was rolled back from
        st.warning(
            f"**{line.stage} is on the fallback, {label(line.holder)}**, where a rollback put it: the autoregressive "
            f"stack answers while no candidate holds {line.stage}, and is not judged as one. A candidate comes back "
            "only through a new promotion" + (f": `{line.command}`." if line.command else "."),
            icon=":material/undo:",
        )
    elif line.holder and line.holder_failed:
        st.error(
            f"**{line.stage} is held by {label(line.holder)}, which fails its {line.stage} gates:** "
            f"{', '.join(line.holder_failed)}. Put the previous holder back with "
            f"`unmask rollback --stage {line.stage}`, or see why with "
            f"`unmask gates {line.holder[0]} --stage {line.stage}`.",
            icon=":material/dangerous:",
        )
for line in lines:
    for why in line.stale:
        st.warning(f"**{line.stage}: evidence may be stale.** {why}.", icon=":material/update:")
    if line.inconclusive:
        st.warning(
            f"**{line.stage}: inconclusive.** Neither pass nor fail yet (more items would settle it): "
            f"{'; '.join(line.inconclusive)}.",
            icon=":material/help:",
        )

# -- failed rollouts: a finding on the version (registry.views.failed_rollouts; docs/rollout.md) --------------
for f in source.failed_rollouts(uri).itertuples():
    if f.stands:
        st.error(
            f"**{f.stage}: {label((f.model, f.version))} may not be promoted: rollout {f.rollout} was "
            f"{f.status.replace('_', ' ')}** ({f.reason}). {f.advice[0].upper() + f.advice[1:]}.",
            icon=":material/undo:",
        )
# -- end of failed rollouts ------------------------------------------------------------------------------------


def score_text(line: StageVerdict) -> str:
    if line.score is None:
        return "—"
    spread = line.score_interval
    shown = significant(line.score)
    if spread and spread[1] - spread[0] > 1e-9:
        shown += f" ({significant(spread[0])} to {significant(spread[1])})"
    return shown


def quality_text(line: StageVerdict) -> str:
    if line.quality is None:
        return "—"
    shown = percent(line.quality)
    if line.quality_interval:
        low, high = line.quality_interval
        shown += f" ({percent(low)} to {percent(high)} on {line.n_items} items)"
    return shown


def blocks_text(line: StageVerdict) -> str:
    if line.subject is None:
        return line.blocker
    if not line.blocker:
        return f"nothing: {label(line.subject)} holds {line.stage}"
    return f"{label(line.subject)}: {line.blocker}"


def holder_text(line: StageVerdict) -> str:
    if not line.holder:
        return "nobody"
    if line.holder_is_fallback:
        return f"{label(line.holder)} (the fallback)"
    if line.holder_failed:
        n = len(line.holder_failed)
        return f"{label(line.holder)}, failing {n} gate{'' if n == 1 else 's'}"
    return label(line.holder) + ("" if line.holder_judged else ", not judged here")


st.caption(
    "Recommended: the best version that passes every gate of the stage, by the policy's TOPSIS score "
    "among the passing ones (in brackets: the score's range while the version's accuracy runs across its "
    "95% interval). Next: the first command that clears what stands between it and the stage."
)
st.table(
    pd.DataFrame(
        {
            "recommended": [label(line.recommended) or "none passes" for line in lines],
            "score": [score_text(line) for line in lines],
            "accuracy": [quality_text(line) for line in lines],
            "held by": [holder_text(line) for line in lines],
            "what blocks it": [blocks_text(line) for line in lines],
            "next command": [line.command or "—" for line in lines],
        },
        index=pd.Index([line.stage for line in lines], name="stage"),
    )
)
later = [(line.stage, c) for line in lines for c in line.more_steps]
if later:
    with st.expander("The commands after the next one"):
        st.table(pd.DataFrame({"stage": [s for s, _ in later], "then": [c for _, c in later]}).set_index("stage"))
st.caption("The gate board has every gate's value, threshold and reason; Scores ranks every passing version.")
