"""Red findings every page that judges opens with: stage aliases moved outside unmask (drift) and evidence
that no longer hashes as registered (tampered); the versions registered before hashes were recorded."""

from __future__ import annotations

import streamlit as st

from dashboards import source
from dashboards.cells import version_label


def show_drift(uri: str) -> None:
    for stage, drift in source.drifted_aliases(uri).items():
        st.error(f"**{stage} drifted.** {drift}", icon=":material/warning:")


def show_tampered(uri: str) -> None:
    integrity = source.integrity(uri)
    for row in integrity[integrity.status == "tampered"].itertuples():
        what = "gate report" if str(row.artifact).startswith("gates/") else "evidence"
        st.error(f"**{version_label(row.model, row.version)}: {what} tampered.** {row.detail}",
                 icon=":material/gpp_bad:")
    unverified = integrity[integrity.status == "unverified"]
    if len(unverified):
        st.caption("Evidence unverified (registered before evidence hashes were recorded): "
                   + ", ".join(version_label(m, v) for m, v in zip(unverified.model, unverified.version)))
