"""Candidate: one version's model card, license, reproducibility evidence, environment, checklists and runs."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboards import source
from dashboards.cells import value_text
from dashboards.policy_note import show_policy
from registry import CANDIDATE_ALIAS, STAGE_ALIASES
from registry.dossiers import dossier_location, latest_dossier

reg = source.registry_or_stop()
uri = reg.tracking_uri

st.title("Candidate")
show_policy(uri)
versions = source.versions(uri)
left, right = st.columns(2)
candidates_first = versions.sort_values(
    "aliases", key=lambda a: a.map(lambda held: CANDIDATE_ALIAS not in held), kind="stable"
)
model = left.selectbox("Model", list(dict.fromkeys(candidates_first.model)), key="candidate_model")
mine = versions[versions.model == model]
labels = {v: f"v{v}" + (f" [{', '.join(a)}]" if a else "") for v, a in zip(mine.version, mine.aliases)}
version = right.selectbox(
    "Version", list(labels), index=len(labels) - 1, format_func=lambda v: labels[v], key=f"candidate_version_{model}"
)
integrity = source.integrity(uri)
check = integrity[(integrity.model == model) & (integrity.version == version)]
if len(check) and check.status.iloc[0] == "tampered":
    what = "Gate report" if str(check.artifact.iloc[0]).startswith("gates/") else "Evidence"
    st.error(f"**{what} tampered.** {check.detail.iloc[0]}", icon=":material/gpp_bad:")
    st.stop()
view = source.candidate_view(uri, model, version)

st.table(
    pd.DataFrame(
        {
            "role": [view["role"]],
            "kind": [view["kind"]],
            "license tier": [view["license"]["tier"] if view["license"] else "unchecked"],
            "reached": [", ".join(s for s in STAGE_ALIASES if s in view["status"]["reached"]) or "no stage yet"],
        },
        index=[f"v{version}"],
    )
)
if view["failures"]:
    st.error("Load or decode failures: " + "; ".join(view["failures"]))

decided = source.version_decisions(uri, model, version, source.policy_source())
if decided:
    st.subheader("The decision")
    st.caption(
        "Per stage, judged afresh on the stored evidence (docs/decision.md): adopt, blocked or inconclusive, what "
        "blocks it in order, the command that clears it, and the approvals recorded with their standing."
    )
    st.dataframe(
        pd.DataFrame(
            {
                "stage": [d.stage for d in decided],
                "decision": [d.outcome.value + (" (holds it)" if d.holds else "") for d in decided],
                "what blocks it": ["; ".join(d.blocker_texts()) or "nothing" for d in decided],
                "next command": [d.steps[0].command if d.steps else "—" for d in decided],
                "approvals that count": [
                    ", ".join(f"{a.by} ({a.at[:16]})" for a in d.approvals if a.counts) or "—" for d in decided
                ],
                "approvals that do not": [
                    "; ".join(f"{a.by}: {a.why}" for a in d.approvals if not a.counts) or "—" for d in decided
                ],
            }
        ),
        hide_index=True,
        width="stretch",
        key="candidate_decision",
        column_config={"what blocks it": st.column_config.TextColumn(width="large")},
    )

dossier = latest_dossier(reg, model, version)  # the board's document: `unmask report`, or the promote flow
if dossier is None:
    st.caption(f"No adoption dossier yet: `unmask report {model} --version {version} --out DIR` writes one.")
else:
    where = {f: dossier_location(reg, dossier, f) for f in ("html", "pdf") if getattr(dossier, f)}
    st.markdown(
        f"**Adoption dossier** ({dossier.at[:19]} UTC, sha256 `{dossier.sha256[:12]}`): "
        + " · ".join(
            f"[{f.upper()}]({loc})" if loc.startswith("http") else f"{f.upper()} `{loc}`" for f, loc in where.items()
        )
    )

st.subheader("Model card")
card = {"revision": view["revision"] or "local", "weights sha256": view["weights_sha256"]} | view["card"]
st.dataframe(
    pd.DataFrame({"field": list(card), "value": [value_text(v) for v in card.values()]}),
    hide_index=True,
    width="stretch",
)

st.subheader("License")
lic = view["license"]
if lic is None:
    st.warning("No license check was recorded for this version.")
else:
    st.markdown(f"`{lic['expression']}` — tier **{lic['tier']}**")
    for reason in lic["reasons"]:
        st.markdown(f"- {reason}")
    for finding in lic["findings"]:
        st.warning(f"Finding: {finding}", icon=":material/flag:")

st.subheader("Reproducibility")
repro = view["reproducibility"]
if repro is None:
    st.warning("No reproducibility probe was recorded for this version.")
else:
    checks = {
        "reproducible": "reproducible",
        "same process": "same_process",
        "fresh process": "fresh_process",
        "batch invariant": "batch_invariant",
    }
    st.table(pd.DataFrame({label: ["yes" if repro[key] else "no"] for label, key in checks.items()}, index=["probe"]))
    for difference in repro["differences"]:
        st.warning(difference)
    st.caption(f"config {repro['config_hash']}; output hashes: " + ", ".join(h[:12] for h in repro["output_hashes"]))

with st.expander("Environment fingerprint"):
    st.json(view["fingerprint"])

st.subheader("Checklists")
for tab, stage in zip(st.tabs(list(STAGE_ALIASES)), STAGE_ALIASES):
    with tab:
        items = source.checklist(uri, model, version, stage)
        if items.empty:
            st.write(f"Not judged at {stage} yet.")
            continue
        approval = view["status"]["approvals"].get(stage)
        if approval and approval.get("stale"):
            st.warning(
                f"Approval by {approval['by']} at {approval['at']} predates the latest evaluation and no "
                "longer counts: approve again."
            )
        elif approval:
            st.success(f"Approved by {approval['by']} at {approval['at']}: {approval['comment']}")
        stale = sorted(item for item, signoff in view["status"]["signoffs"].get(stage, {}).items() if signoff["stale"])
        if stale:
            st.warning(f"Sign-offs given before the latest evaluation no longer count: {', '.join(stale)}.")
        st.dataframe(
            pd.DataFrame(
                {
                    "item": items["item"],
                    "done": items.done.astype(bool),
                    "kind": items.kind,
                    "text": items.text,
                    "evidence or sign-off": [
                        reason if not ev else f"{reason} ({value_text(ev)})"
                        for reason, ev in zip(items.reason, items.evidence)
                    ],
                }
            ),
            hide_index=True,
            width="stretch",
        )

st.subheader("MLflow runs")
runs = view["runs"]
if runs.url.notna().any():
    st.dataframe(
        runs,
        hide_index=True,
        width="stretch",
        column_config={"url": st.column_config.LinkColumn("open in MLflow", display_text="open")},
    )
else:
    st.dataframe(runs.drop(columns="url"), hide_index=True, width="stretch")
    st.caption(f"Browse them with `{source.mlflow_ui_command(uri)}`.")
