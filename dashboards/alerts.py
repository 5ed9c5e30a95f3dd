"""Red findings every page that judges opens with: stage aliases moved outside unmask (drift), evidence or a
gate report that no longer hashes as registered (tampered), an audit trail whose hash chain is broken; the
versions registered before hashes were recorded."""

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
        st.error(
            f"**{version_label(row.model, row.version)}: {what} tampered.** {row.detail}", icon=":material/gpp_bad:"
        )
    unverified = integrity[integrity.status == "unverified"]
    if len(unverified):
        st.caption(
            "Evidence unverified (registered before evidence hashes were recorded): "
            + ", ".join(version_label(m, v) for m, v in zip(unverified.model, unverified.version))
        )


def show_chain_broken(uri: str) -> None:
    """A red banner when the audit trail's hash chain does not verify, naming the first entry tampered with."""
    chain = source.audit_chain(uri)
    if not chain["ok"]:
        st.error(
            f"**The audit trail was changed outside unmask.** {chain['summary']}. Every decision since that "
            "entry is in doubt (`unmask audit --verify`; see docs/integrity.md).",
            icon=":material/link_off:",
        )


def show_chain(uri: str) -> None:
    """The audit chain's status: intact in green, broken in red (the first broken entry named), else grey."""
    chain = source.audit_chain(uri)
    if chain["status"] == "intact":
        st.success(chain["summary"], icon=":material/link:")
    elif not chain["ok"]:
        show_chain_broken(uri)
    else:
        st.caption(f":gray[{chain['summary']}]")
