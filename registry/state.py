"""What the registry holds about one version, read in one call, and who holds each stage: the read side that
judging, the dashboard's views and the server build on. Nothing here writes to MLflow (a drifted alias is
only logged, see `registry.integrity.report_drift`).

A `VersionState` is one `get_model_version` answer, frozen: the version's tags (evidence run, evaluation
time, reached stages, gate verdicts, and the approval lifecycle stored as JSON tags: requests, approvals,
declines, sign-offs) and the aliases it carries. Everything a decision reads about the version comes from it,
so one decision sees one consistent version.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from mlflow.exceptions import MlflowException

from gates.promotion import Approval, Decline, Duties, PromotionRequest, person
from registry import audit
from registry.audit import parse_ref, ref
from registry.connection import RegistryError, not_authenticated
from registry.integrity import alias_drift, report_drift
from registry.store import FALLBACK_ALIAS, STAGE_ALIASES, Registry, holders_of, model_tag, now_iso

Holder = tuple[str, str] | None  # (model, version)


# the approval lifecycle as stored in version tags ---------------------------------------------------
def _prefixed(tags: Mapping[str, str], prefix: str) -> list[dict[str, Any]]:
    found = []
    for key, value in tags.items():
        if key.startswith(prefix):
            try:
                found.append(json.loads(value))
            except (json.JSONDecodeError, TypeError):
                continue  # not ours (an edit by hand); never counts
    return found


def approvals_from_tags(tags: Mapping[str, str], stage: str, model: str, version: str) -> list[Approval]:
    """Every approval recorded for a stage of `model` `version`, oldest first. Where an approval belongs is where
    it is stored, never what its tag says: a signed approval copied onto another version no longer verifies."""
    fields = set(Approval.__dataclass_fields__) - {"model", "version"}
    found = [
        Approval(**{k: str(v) for k, v in a.items() if k in fields}, model=model, version=str(version))
        for a in _prefixed(tags, model_tag(f"approvals.{stage}."))
        if a.get("by") and a.get("stage") == stage
    ]
    # an approval a move used is consumed by it: the request the move did says which (one tag for all of them)
    moved = {
        used: r.closed_by
        for r in requests_from_tags(tags, stage)
        if r.status == "done" and r.closed_by
        for used in r.consumed.split(",")
        if used
    }
    found = [
        replace(a, status="consumed", closed_by=moved[a.id], closed_why=f"consumed by the move {moved[a.id]}")
        if a.status == "open" and a.id in moved
        else a
        for a in found
    ]
    return sorted(found, key=lambda a: (a.at, a.id))


def requests_from_tags(tags: Mapping[str, str], stage: str) -> list[PromotionRequest]:
    """Every promotion request recorded for a stage, oldest first."""
    fields = set(PromotionRequest.__dataclass_fields__)
    found = [
        PromotionRequest(**{k: str(v) for k, v in r.items() if k in fields})
        for r in _prefixed(tags, model_tag(f"requests.{stage}."))
        if r.get("id")
    ]
    return sorted(found, key=lambda r: (r.at, r.id))


def decline_from_tags(tags: Mapping[str, str], stage: str, model: str = "", version: str = "") -> Decline | None:
    """The decline recorded for a stage, naming the version it is stored on (`model`, `version`), or None."""
    raw = tags.get(model_tag(f"decline.{stage}"))
    if not raw:
        return None
    data = json.loads(raw)
    fields = {k: str(v) for k, v in data.items() if k in Decline.__dataclass_fields__}
    return Decline(**fields | {"model": model, "version": str(version)})


def signoffs_from_tags(tags: Mapping[str, str], stage: str) -> dict[str, dict[str, str]]:
    """Every sign-off recorded for a stage, current or not (see `gates.promotion.current_signoffs`)."""
    prefix = model_tag(f"signoff.{stage}.")
    return {k.removeprefix(prefix): json.loads(v) for k, v in tags.items() if k.startswith(prefix)}


@dataclass(frozen=True, eq=False)
class VersionState:
    """One registered version as MLflow answered for it once: its tags and the aliases it carries."""

    model: str
    version: str
    tags: Mapping[str, str]
    aliases: tuple[str, ...] = ()

    @property
    def evaluated_at(self) -> str:
        """When the version's evidence was last registered (ISO time; '' if never)."""
        return self.tags.get(model_tag("evaluated_at"), "")

    @property
    def reached(self) -> set[str]:
        """The stages the version has held at some time."""
        return {s for s in STAGE_ALIASES if model_tag(f"reached.{s}") in self.tags}

    def approvals(self, stage: str) -> list[Approval]:
        return approvals_from_tags(self.tags, stage, self.model, self.version)

    def approval(self, stage: str) -> Approval | None:
        """The newest approval recorded for a stage (whatever its status), or None."""
        found = self.approvals(stage)
        return found[-1] if found else None

    def requests(self, stage: str) -> list[PromotionRequest]:
        return requests_from_tags(self.tags, stage)

    def open_request(self, stage: str) -> PromotionRequest | None:
        """The newest open request asked on the version's current evidence, or None."""
        found = [r for r in self.requests(stage) if r.status == "open" and r.evaluated_at == self.evaluated_at]
        return found[-1] if found else None

    def declined(self, stage: str) -> Decline | None:
        return decline_from_tags(self.tags, stage, self.model, self.version)

    def signoffs(self, stage: str) -> dict[str, dict[str, str]]:
        return signoffs_from_tags(self.tags, stage)

    def duties(self, stage: str, request: PromotionRequest | None, mover: str = "", mover_person: str = "") -> Duties:
        """Who did what for the version: what the four-eyes rules of `gates.promotion` read (names, and the
        persons behind them: `gates.promotion.person`)."""
        registrant = self.tags.get(model_tag("evaluated_by"), "")
        return Duties(
            requester=request.by if request else "",
            mover=mover,
            registered_by=registrant,
            requester_person=request.person if request else "",
            mover_person=mover_person,
            registered_person=person(
                registrant,
                self.tags.get(model_tag("evaluated_identity"), ""),
                self.tags.get(model_tag("evaluated_account"), ""),
            )
            if registrant
            else "",
            request_id=request.id if request else "",
            request=request,
            declined=self.declined(stage),
            now=now_iso(),
        )


def version_state(registry: Registry, model: str, version: str) -> VersionState:
    """The version's tags and aliases, in one MLflow call."""
    try:
        found = registry.client.get_model_version(model, version)
    except MlflowException as e:
        raise not_authenticated(registry.tracking_uri, e) or RegistryError(
            f"{model} version {version} does not exist: {e.message}"
        ) from None
    return VersionState(model, str(version), MappingProxyType(dict(found.tags)), tuple(found.aliases or ()))


def evaluated_at(registry: Registry, model: str, version: str) -> str:
    """When the version's evidence was last registered (ISO time; '' if never)."""
    return version_state(registry, model, version).evaluated_at


def reached_stages(registry: Registry, model: str, version: str) -> set[str]:
    return version_state(registry, model, version).reached


# who holds a stage -------------------------------------------------------------------------------
def stage_holder(registry: Registry, stage: str, everything: Mapping[str, Mapping[str, str]] | None = None) -> Holder:
    """The (model, version) holding a stage alias, reading through a move still in flight or interrupted.

    An alias that is not where the audit trail's last settled move left it is reported (logged as drift) and
    returned as found: readers show what the registry holds, promote and rollback refuse to act on it.
    `everything`: `Registry.all_aliases()` as the caller has just read it, so as not to read it twice.
    """
    holders = registry.holders(stage) if everything is None else holders_of(everything, stage)
    pending = audit.pending_moves(registry, stage)
    if pending:
        last = pending[-1]
        target = parse_ref(last.to_ref)
        return target if target in holders else parse_ref(last.from_ref)
    if len(holders) > 1:
        raise RegistryError(
            f"stage {stage} is held by {', '.join(ref(*h) for h in holders)} with no move in "
            "flight; the registry was edited outside unmask"
        )
    report_drift(alias_drift(registry, stage, holders, pending), registry.tracking_uri)
    return holders[0] if holders else None


def fallback_holder(registry: Registry, everything: Mapping[str, Mapping[str, str]] | None = None) -> Holder:
    holders = registry.holders(FALLBACK_ALIAS) if everything is None else holders_of(everything, FALLBACK_ALIAS)
    return holders[0] if holders else None
