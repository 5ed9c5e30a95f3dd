"""The verdict the landing page opens with: per stage, what to adopt, what holds it now, and what blocks it.

Composed from registry reads only (`registry.read`, `registry.views`): the recommendation is the best
passing version by the policy's scoring (`read.scores`, TOPSIS), its blocker is the first of the
commands `unmask gates` would print (the decision's steps, judged afresh and recorded nowhere). A holder that
fails the gates of the stage it holds is a red finding; evidence judged under another policy, stale
sign-offs or approvals, and inconclusive gates are amber ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

import registry.read as read
import registry.views as views
from gates.decision import Decision
from gates.policy import Policy
from registry import FALLBACK_ALIAS, STAGE_ALIASES, Registry
from registry.decision import decisions_of


@dataclass(frozen=True)
class StageVerdict:
    """One stage's line on the landing page."""

    stage: str
    holder: tuple[str, str] | None  # (model, version) holding the stage alias now
    holder_failed: tuple[str, ...] = ()  # gates the holder fails at this stage, as last judged
    holder_inconclusive: tuple[str, ...] = ()
    holder_judged: bool = False  # whether the holder was ever judged at this stage
    holder_is_fallback: bool = False  # the AR fallback holds it (a rollback put it there): not judged as a candidate
    recommended: tuple[str, str] | None = None  # the best version passing every gate of the stage
    score: float | None = None  # its TOPSIS score among the passing versions
    score_interval: tuple[float, float] | None = None  # while its quality runs across its 95% interval
    quality: float | None = None
    quality_interval: tuple[float, float] | None = None
    n_items: int = 0
    subject: tuple[str, str] | None = None  # whom the blocker is about: the recommendation, else the candidate
    blocker: str = ""  # in words; "" when the subject holds the stage
    command: str = ""  # what clears it
    more_steps: tuple[str, ...] = ()  # the commands after `command`, in order
    stale: tuple[str, ...] = ()  # why the evidence behind this line may be out of date
    inconclusive: tuple[str, ...] = ()  # gates whose verdict is neither pass nor fail
    pending: tuple[str, ...] = ()  # ranked on evidence, not yet promotable: "tiny-llada v1 (tooling_maturity)"


def _label(holder: tuple[str, str | None] | None) -> str:
    return f"{holder[0]} v{holder[1]}" if holder else ""


def stage_verdicts(reg: Registry, policy: Policy) -> list[StageVerdict]:
    """The landing page's verdict, one StageVerdict per stage, poc first."""
    held = read.aliases(reg)
    results = read.gate_results(registry=reg)
    judged = read.judged_policies(reg)
    candidates = read.list_candidates(reg)
    board = views.integrity_board(reg)
    tampered = set(zip(board.model[board.status == "tampered"], board.version[board.status == "tampered"]))
    versions = [(m, views.current_version(reg, m)) for m in candidates[candidates.role == "candidate"].model]
    adopting = [(m, v) for m, v in versions if v and (m, v) not in tampered]
    lines = []
    decided: dict[tuple[str, str], dict[str, Decision] | None] = {}
    fallback = held.get(FALLBACK_ALIAS)
    fallbacks = {(f["model"], f["version"]) for f in ([fallback] if isinstance(fallback, dict) else fallback or [])}
    for stage in STAGE_ALIASES:
        alias = held.get(stage)
        holder = (alias["model"], alias["version"]) if alias else None
        mine = _results_of(results, holder, stage)
        scored = read.scores(stage, registry=reg, policy=policy)
        ranking, intervals = scored["ranking"], scored["intervals"].set_index("candidate")
        first = str(ranking.candidate.iloc[0]) if len(ranking) else ""
        first_version = views.current_version(reg, first) if first else None
        top = (first, first_version) if first and first_version else None
        recommended, score, score_iv, quality, quality_iv, n = None, None, None, None, None, 0
        waiting = ranking[ranking.open_signoffs != ""]
        pending = tuple(
            f"{_label((r.candidate, views.current_version(reg, r.candidate)))} ({r.open_signoffs})"
            for r in waiting.itertuples()
        )
        ranking = ranking[ranking.open_signoffs == ""]  # recommended: promotable on every gate, sign-offs too
        if len(ranking):
            best = ranking.iloc[0]
            version = views.current_version(reg, best.candidate)
            assert version is not None  # ranked (read.scores): it has a registration
            recommended = (best.candidate, version)
            score, quality = float(best.topsis), float(best.quality)
            if best.candidate in intervals.index:
                iv = intervals.loc[best.candidate]
                score_iv = (float(iv.topsis_low), float(iv.topsis_high))
                quality_iv, n = (float(iv.quality_low), float(iv.quality_high)), int(iv.n_items)
        # whom the blocker is about: the recommendation, else the top-ranked candidate, else the first registered
        subject = recommended or top or (adopting[0] if adopting else None)
        blocker, command, more = _blocker(reg, policy, subject, holder, stage, decided)
        stale = _stale(reg, judged, policy, [h for h in (holder, subject) if h], stage)
        shown = pd.concat([mine, _results_of(results, subject, stage)]) if subject != holder else mine
        lines.append(
            StageVerdict(
                stage,
                holder,
                tuple(mine.gate[mine.verdict == "fail"]),
                tuple(mine.gate[mine.verdict == "inconclusive"]),
                bool(len(mine)),
                holder in fallbacks,
                recommended,
                score,
                score_iv,
                quality,
                quality_iv,
                n,
                subject,
                blocker,
                command,
                more,
                stale,
                tuple(
                    sorted(
                        {
                            f"{_label((r.model, r.version))}: {r.gate}"
                            for r in shown[shown.verdict == "inconclusive"].itertuples()
                        }
                    )
                ),
                pending,
            )
        )
    return lines


def _results_of(results: pd.DataFrame, holder: tuple[str, str] | None, stage: str) -> pd.DataFrame:
    if holder is None:
        return results.iloc[0:0]
    return results[(results.model == holder[0]) & (results.version == holder[1]) & (results.stage == stage)]


def _blocker(
    reg: Registry,
    policy: Policy,
    subject: tuple[str, str] | None,
    holder: tuple[str, str] | None,
    stage: str,
    decided: dict[tuple[str, str], dict[str, Decision] | None],
) -> tuple[str, str, tuple[str, ...]]:
    """(what blocks `subject` from holding `stage`, in words; the command that clears it; the commands after).
    `decided`: the decisions made so far on this page, by version (each version judged once for all stages)."""
    if subject is None:
        return "no candidate is registered: nothing to adopt yet", "unmask run", ()
    if subject == holder:
        return "", "", ()
    if subject not in decided:  # one judgement of a version for every stage it is the subject of
        decided[subject] = decisions_of(reg, *subject, STAGE_ALIASES, policy)
    judged = decided[subject]
    decision = judged[stage] if judged else None
    if decision is None:
        return (
            f"{_label(subject)}'s evidence is tampered: nothing is judged on it",
            f"unmask run --model {subject[0]}",
            (),
        )
    steps = [s.command for s in decision.steps]
    if not decision.blockers:
        return f"nothing: {decision.headline()}", steps[0] if steps else "", tuple(steps[1:])
    why = f"{decision.outcome.value}: {decision.blockers[0].text}"
    more = len(decision.blockers) - 1
    return why + (f" (and {more} more)" if more else ""), steps[0] if steps else "", tuple(steps[1:])


def _stale(
    reg: Registry, judged: pd.DataFrame, policy: Policy, versions: list[tuple[str, str]], stage: str
) -> tuple[str, ...]:
    """Why the verdicts about `versions` at `stage` may no longer hold: judged under another policy than
    this page's, or sign-offs and approvals given before the latest evaluation."""
    found = []
    for model, version in dict.fromkeys(versions):
        mine = judged[(judged.model == model) & (judged.version == version) & (judged.stage == stage)]
        if len(mine) and mine.policy_sha256.iloc[0] != policy.sha256:
            found.append(
                f"{model} v{version} was judged at {stage} under another policy (sha256 "
                f"{mine.policy_sha256.iloc[0][:12] or 'unrecorded'}, this page: {policy.sha256[:12]}): "
                f"judge again and record with `unmask gates {model} --stage {stage} --store`"
            )
        status = read.version_status(model, version, reg)
        signed = sorted(i for i, s in status["signoffs"].get(stage, {}).items() if s["stale"])
        if signed:
            found.append(
                f"{model} v{version}: sign-offs given before its latest evaluation no longer count at "
                f"{stage}: {', '.join(signed)}"
            )
        approval = status["approvals"].get(stage)
        if approval and approval.get("stale"):
            found.append(
                f"{model} v{version}: the {stage} approval by {approval['by']} predates its latest "
                "evaluation and no longer counts"
            )
    return tuple(found)
