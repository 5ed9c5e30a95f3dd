"""What `unmask serve` reads from the registry: which version holds a name, and how it should decode.

A served name is an alias (`production`, `fallback`, `staging`, `poc`, `candidate`) or a registered
model's name (its current version: `candidate`, else `fallback`, else the latest). Read-only, like
`registry.read`: nothing here writes to MLflow.

The server never serves what the registry did not move: a stage alias is read only on an audit chain that
verifies (`ChainBroken` otherwise: the server keeps serving what it serves), and an alias moved outside unmask
(drift: no recorded, verified move put it there) is not followed: the holder the audit trail's last settled
move left keeps serving, and an alert is logged (once per drift and process). The registration aliases
(`fallback`, which the default route sends its traffic to, and `candidate`) are held to the same rule against the
registrations in the trail.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gates.policy import Policy
from gates.results import operating_records
from registry import audit
from registry.connection import RegistryError
from registry.integrity import ChainBroken, alias_drift, log
from registry.state import stage_holder
from registry.store import ALIASES, STAGE_ALIASES, Registry, model_tag, reads_once
from registry.tracking import load_evidence
from registry.views import current_version, dashboard_policy

# The stage whose operating point a non-stage alias decodes at: a candidate is judged at the PoC next,
# and the fallback stands beside production.
OPERATING_STAGE = {"candidate": "poc", "fallback": "production"}


@dataclass(frozen=True)
class ServedVersion:
    """One registered version as the server sees it: identity, weights digest, operating config."""

    name: str  # what was asked for: an alias or a registered model name
    model: str  # the registered model
    version: str
    weights_sha256: str  # recorded at registration; the served folder must hash to it
    source: str  # the model reference to load (the version's `unmask.model` tag: a catalog id, bundled id or folder)
    kind: str
    stage: str  # the stage whose operating point `operating_config` is
    operating_config: dict[str, Any] | None = None  # the gate-chosen effective config, None: none recorded
    operating_config_hash: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    created: int = 0  # when the version was registered (Unix seconds)
    weights_artifact: str = ""  # where its weights were pushed (registry/weights.py's tag), "": never pushed

    @property
    def ref(self) -> str:
        return f"{self.model}/{self.version}"


_alerted: set[str] = set()  # drift alerts this process raised already (a server polls every few seconds)


def holder(registry: Registry, name: str, verified: bool = False) -> tuple[str, str] | None:
    """The (model, version) a served name points at now; None when nobody holds that alias.

    Stage aliases read through a move in flight (old holder until the move commits), on a chain that verifies
    (`verified`: the caller checked it just now), and never follow a drifted alias (see the module's note). A
    non-stage alias held by several models (`candidate` usually is) is ambiguous: ask for the model by name.
    """
    if name in STAGE_ALIASES:
        if not verified:
            _verified_chain(registry)
        return _moved_holder(registry, name)
    if name in ALIASES:
        held = _registered_holders(registry, name)
        if len(held) > 1:
            raise RegistryError(
                f"alias {name!r} is held by {', '.join(f'{m}/{v}' for m, v in held)}; "
                f"serve one of them by its registered model name"
            )
        return held[0] if held else None
    if name not in registry.model_names():
        raise RegistryError(
            f"{name!r} is neither an alias ({', '.join(ALIASES)}) nor a registered model "
            f"(registered: {', '.join(registry.model_names()) or 'none'})"
        )
    version = current_version(registry, name)
    return (name, version) if version else None


@reads_once
def holders(registry: Registry, names: list[str]) -> dict[str, tuple[str, str] | None]:
    """`holder` of each name (the chain verified once); what the server polls to notice an alias move. On one read
    of the store (`reads_once`): 3 MLflow calls a poll for production and fallback, 10 without (60 ms a poll
    against 18 ms on SQLite; a server polls every `poll_interval_s`)."""
    if any(name in STAGE_ALIASES for name in names):
        _verified_chain(registry)
    return {name: holder(registry, name, verified=True) for name in names}


def _verified_chain(registry: Registry) -> None:
    report = audit.verify(registry)
    if not report.ok:
        raise ChainBroken(report, "following the registry's aliases")


def _moved_holder(registry: Registry, stage: str) -> tuple[str, str] | None:
    """The stage's holder as the audit trail moved it: on drift, the last settled move's holder, with an alert."""
    found = stage_holder(registry, stage)
    drift = alias_drift(registry, stage)
    if drift is None:
        return found
    if str(drift) not in _alerted:
        _alerted.add(str(drift))
        kept = f"{drift.expected[0]}/{drift.expected[1]}" if drift.expected else "nothing new"
        log.error("alert: %s; the server does not follow it and keeps serving %s", drift, kept)
    return drift.expected


def _registered_holders(registry: Registry, alias: str) -> list[tuple[str, str]]:
    """Who holds a registration alias (`fallback`, `candidate`) as registrations put it there.

    Each registration is an audit entry (`evidence_registered`, its stage the alias it set). When the registry says
    otherwise (the alias set by hand on another version or model), the registrations' holders are served, with an
    alert, as a stage alias's last settled move is. A store whose trail holds no registration (written before
    registrations were audited) is read as the registry has it."""
    found = sorted(registry.holders(alias))
    registered = audit.events(registry, event="evidence_registered")
    if not registered:
        return found
    last = {e.model: e.version for e in sorted(registered, key=lambda e: e.seq) if e.stage == alias}  # chain order
    expected = sorted(last.items())
    if found == expected:
        return found
    drift = f"alias {alias} drifted: registrations left it on {_refs(expected)}, the registry has it on {_refs(found)}"
    if drift not in _alerted:
        _alerted.add(drift)
        log.error("alert: %s (set outside unmask); the server does not follow it and serves %s", drift, _refs(expected))
    return expected


def _refs(held: list[tuple[str, str]]) -> str:
    return ", ".join(f"{m}@{v}" for m, v in held) or "nothing"


def served_version(
    registry: Registry, name: str, at: tuple[str, str] | None = None, policy: Policy | None = None
) -> ServedVersion:
    """The version `name` points at (or `at`), with its recorded weights digest and operating config."""
    at = at or holder(registry, name)
    if at is None:
        raise RegistryError(f"no version holds {name!r}")
    model, version = at
    tags, created = registry.version_facts(model, version)  # one read: the digest, the config, when registered
    weights = tags.get(model_tag("weights_sha256"), "")
    if not weights:
        raise RegistryError(
            f"{model} version {version} has no {model_tag('weights_sha256')} tag: its weights "
            "cannot be checked, so it is not served"
        )
    evidence = load_evidence(registry, model, version)
    policy = policy or dashboard_policy()
    aliases = [a for a, v in registry.aliases_of(model).items() if v == version]
    stage = (
        name
        if name in STAGE_ALIASES
        else OPERATING_STAGE.get(
            name,
            next(
                (s for s in reversed(STAGE_ALIASES) if s in aliases),
                OPERATING_STAGE["fallback" if evidence.role == "fallback" else "candidate"],
            ),
        )
    )
    chosen = operating_records(evidence, policy.stage(stage))
    primary = next((r for r in chosen if r.task == policy.stage(stage).operating_point.task), None)
    primary = primary or (chosen[0] if chosen else None)
    return ServedVersion(
        name=name,
        model=model,
        version=version,
        weights_sha256=weights,
        source=tags.get(model_tag("model")) or evidence.candidate,
        kind=evidence.kind,
        stage=stage,
        operating_config=dict(primary.config) if primary else None,
        created=created,
        operating_config_hash=primary.config_hash if primary else "",
        extra={"aliases": sorted(aliases), "revision": evidence.model_revision},
        weights_artifact=tags.get(model_tag("weights_artifact"), ""),
    )
