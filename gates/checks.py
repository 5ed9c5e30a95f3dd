"""The gate checks: one small class per gate kind, registered in `GATE_CHECKS` by the kind a policy names.

Each check reads a `GateContext` (the candidate's evidence, its operating records, the baselines' and the
sign-offs) and one `GateSpec` of the stage, and gives one `GateResult`: pass, fail, or inconclusive with what
would settle it. A new gate kind is one class here and its line in `GATE_CHECKS` (and its case in the contract
test, tests/unit/test_gate_checks.py). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from evals.intervals import difference_interval, wilson_interval
from evals.paired import UNSTEADY_SPREAD, RatioEstimate
from evals.parallelism import aup, tpf_at_accuracy  # gates read evals' records and measures
from evals.records import CandidateEvidence, EvalRecord, ServingRecord, SpeedComparison
from gates.intervals import items_to_settle, ratio_verdict, rounds_to_settle, spans_bound
from gates.policy import SERVING_LIMITS, GateSpec, StagePolicy
from gates.readable import exact, gate_threshold, milliseconds, percent, signed_points, significant
from gates.results import GateResult, cite, operating_records
from gates.verdict import FAIL, INCONCLUSIVE, PASS


class GateCheck(Protocol):
    """One gate kind: judges a stage's gate of that kind on a candidate."""

    kind: ClassVar[str]

    def check(self, ctx: GateContext, spec: GateSpec) -> GateResult: ...


@dataclass(frozen=True)
class GateContext:
    evidence: CandidateEvidence
    stage: StagePolicy
    records: list[EvalRecord]  # operating records of the candidate
    primary: EvalRecord | None
    baselines: dict[str, tuple[CandidateEvidence | None, EvalRecord | None]]
    signoffs: Mapping[str, Any]


def _result(
    ctx: GateContext, spec: GateSpec, passed: bool, value: Any, threshold: Any, reason: str, **evidence: Any
) -> GateResult:
    cited = cite(ctx.primary) | {k: v for k, v in evidence.items() if v is not None}
    return GateResult(spec.name, ctx.stage.stage, bool(passed), value, threshold, reason, cited)


def _inconclusive(
    ctx: GateContext, spec: GateSpec, value: Any, threshold: Any, reason: str, settle: str, **evidence: Any
) -> GateResult:
    """Too little evidence to judge: not a pass, not a fault of the model; `settle` says what would decide it."""
    cited = cite(ctx.primary) | {k: v for k, v in evidence.items() if v is not None}
    return GateResult(
        spec.name,
        ctx.stage.stage,
        False,
        value,
        threshold,
        f"{reason}; {settle}",
        cited,
        verdict=INCONCLUSIVE,
        settle=settle,
    )


def _measure_at(ctx: GateContext) -> str:
    op = ctx.stage.operating_point
    return f"measure task {op.task!r} at gen_length {op.gen_length}"


def _no_record(ctx: GateContext, spec: GateSpec, threshold: Any) -> GateResult:
    op = ctx.stage.operating_point
    return _inconclusive(
        ctx,
        spec,
        None,
        threshold,
        f"no validated record of {ctx.evidence.candidate} on task {op.task!r} at gen_length {op.gen_length}",
        _measure_at(ctx),
    )


def _uncertainty(
    mt: Any, value: float, n: int, base_value: float | None, base_n: int | None
) -> tuple[str, dict[str, Any]]:
    """The 95% intervals behind a quality verdict, in words and as evidence, and whether they span a
    bound the verdict turned on (then more items could change it: the verdict is not settled)."""
    lo, hi = wilson_interval(value, n)
    words = f" (95% CI {percent(lo)}-{percent(hi)} on {n} items"
    cite: dict[str, Any] = {"ci95": [round(lo, 4), round(hi, 4)], "n_items": n}
    if base_value is not None and base_n:
        d_lo, d_hi = difference_interval(value, n, base_value, base_n)
        words += (
            f"; difference {signed_points(value - base_value)}, 95% CI {signed_points(d_lo)} to {signed_points(d_hi)}"
        )
        cite["difference_ci95"] = [round(d_lo, 4), round(d_hi, 4)]
    words += ")"
    spans = spans_bound(mt, value, n, base_value, base_n)
    if spans:
        words += "; not settled: the interval spans the bound, more items could change this verdict"
    cite["settled"] = not spans
    return words, cite


class QualityGate:
    kind: ClassVar[str] = "quality"

    def check(self, ctx: GateContext, spec: GateSpec) -> GateResult:
        mt = spec.metric_threshold
        assert mt is not None, "a quality gate is parsed with its threshold (policy._parse_gate)"
        metric = spec.params.get("metric", "accuracy")
        task = spec.params.get("task", ctx.stage.operating_point.task)
        record = next((r for r in ctx.records if r.task == task), None)
        if record is None or getattr(record, metric) is None:
            return _no_record(ctx, spec, mt.describe())
        value = float(getattr(record, metric))
        base_value, base_n, base_cite = None, None, {}
        relative_to = spec.params.get("relative_to")
        if relative_to:
            base_evidence, _ = ctx.baselines.get(relative_to, (None, None))
            base_record = next((r for r in operating_records(base_evidence, ctx.stage) if r.task == task), None)
            if base_record is None or getattr(base_record, metric) is None:
                if base_evidence is not None:  # a baseline model whose records cannot be compared: evidence missing
                    return _inconclusive(
                        ctx,
                        spec,
                        value,
                        mt.describe(),
                        f"no validated {relative_to} record on task {task!r} to compare {metric} against",
                        f"{_measure_at(ctx)} for the {relative_to} model too",
                    )
                if spec.params.get("if_no_baseline", "fail") == "pass":
                    return _result(
                        ctx,
                        spec,
                        True,
                        value,
                        mt.describe(),
                        f"no {relative_to} model yet; nothing to compare {metric} against",
                    )
                return _result(
                    ctx,
                    spec,
                    False,
                    value,
                    mt.describe(),
                    f"no validated {relative_to} record on task {task!r} to compare {metric} against",
                )
            base_value, base_n = float(getattr(base_record, metric)), base_record.n_items
            base_cite = {
                "baseline": relative_to,
                "baseline_record_id": base_record.record_id,
                "baseline_run_id": base_record.run_id,
                "baseline_value": base_value,
            }
        # every quality metric is a share of items scored right, so its sampling error is a binomial one
        noise, noise_cite = _uncertainty(mt, value, record.n_items, base_value, base_n)
        if spec.params.get("require_settled") and not noise_cite["settled"]:
            need = items_to_settle(mt, value, record.n_items, base_value, base_n)
            settle = (
                f"needs {need - record.n_items} more items on {task} ({need} in all) at this {metric}"
                if need
                else f"the {metric} lies on its bound; no number of items settles it"
            )
            return _inconclusive(
                ctx,
                spec,
                value,
                mt.describe(),
                f"{metric} on {task} {percent(value)}{noise}",
                settle,
                **base_cite,
                **noise_cite,
                items_needed=need and need - record.n_items,
                items_per_task=need,
            )
        misses = mt.failures(value, base_value, fmt=percent)
        if misses:
            return _result(
                ctx,
                spec,
                False,
                value,
                mt.describe(),
                f"{metric} on {task}: " + "; ".join(misses) + noise,
                **base_cite,
                **noise_cite,
            )
        against = f" vs {relative_to} {percent(base_value)}" if base_value is not None else ""
        return _result(
            ctx,
            spec,
            True,
            value,
            mt.describe(),
            f"{metric} on {task} {percent(value)}{against} meets {gate_threshold(spec, None)}{noise}",
            **base_cite,
            **noise_cite,
        )


class LatencyGate:
    kind: ClassVar[str] = "latency"

    def check(self, ctx: GateContext, spec: GateSpec) -> GateResult:
        limit = spec.params["max_p95_s"]
        if ctx.primary is None:
            return _no_record(ctx, spec, limit)
        p95 = ctx.primary.latency_p95_s
        gen = ctx.stage.operating_point.gen_length
        ok = p95 <= limit
        return _result(
            ctx,
            spec,
            ok,
            p95,
            limit,
            f"p95 {milliseconds(p95)} ms at gen_length {gen} {'<=' if ok else '>'} SLA {exact(limit * 1e3)} ms",
        )


class SpeedupGate:
    kind: ClassVar[str] = "speedup"

    def check(self, ctx: GateContext, spec: GateSpec) -> GateResult:
        """Fallback p95 / candidate p95 from a paired, interleaved measurement (evals.paired), judged on its 95%
        interval: pass when it clears `min_speedup`, fail when wholly below, else inconclusive; an unsteady
        host's measurement is inconclusive whatever its ratio."""
        need = spec.params["min_speedup"]
        relative_to = spec.params.get("relative_to", "fallback")
        if ctx.primary is None:
            return _no_record(ctx, spec, need)
        base_evidence, base = ctx.baselines.get(relative_to, (None, None))
        if base is None or base_evidence is None:
            return _inconclusive(
                ctx,
                spec,
                None,
                need,
                f"no validated {relative_to} record to measure a speedup against",
                f"{_measure_at(ctx)} for the {relative_to} model too",
            )
        op, name = ctx.stage.operating_point, ctx.evidence.candidate
        if (base_evidence.candidate, base_evidence.weights_sha256) == (name, ctx.evidence.weights_sha256):
            ok = need <= 1.0  # the baseline itself: its speedup over itself is 1 by definition, not a measurement
            return _result(
                ctx,
                spec,
                ok,
                1.0,
                need,
                f"{name} is the {relative_to} itself: speedup 1x {'>=' if ok else '<'} {exact(need)}x",
                baseline=relative_to,
            )
        paired = ctx.evidence.speed_against(base_evidence, op.task, op.gen_length, ctx.primary.config_hash)
        p95 = paired.ratio("p95") if paired is not None else None
        if paired is None or p95 is None or paired.baseline_config_hash != base.config_hash:
            what = "no paired" if paired is None or p95 is None else "no current paired"
            return _inconclusive(
                ctx,
                spec,
                None,
                need,
                f"{what} speed measurement of {name} (config {ctx.primary.config_hash[:8]}) against {relative_to} "
                f"{base_evidence.candidate} (config {base.config_hash[:8]}) on {op.task!r} at gen_length "
                f"{op.gen_length}",
                f"run `unmask run --model {name} --model {base_evidence.candidate}` (it times both interleaved)",
                baseline=relative_to,
                baseline_record_id=base.record_id,
            )
        cited = {"baseline": relative_to, "baseline_record_id": base.record_id, "baseline_run_id": base.run_id}
        return _judge_speedup(ctx, spec, paired, p95.inverse(), base_evidence.candidate, cited)


def _judge_speedup(
    ctx: GateContext, spec: GateSpec, paired: SpeedComparison, speedup: RatioEstimate, base: str, cited: dict[str, Any]
) -> GateResult:
    """The speedup gate on a paired measurement: unsteady, spanning (with the rounds that would settle it), or
    decided by its whole interval."""
    need, name, relative_to = spec.params["min_speedup"], ctx.evidence.candidate, cited["baseline"]
    cited = cited | {
        "ci95": [round(speedup.low, 4), round(speedup.high, 4)],
        "paired": {"rounds": paired.rounds, "items": paired.items, "spread": paired.spread, "when": paired.when},
        "host": paired.host,
    }
    measured = (
        f"speedup over {relative_to} {significant(speedup.estimate)}x on p95 (95% CI "
        f"{significant(speedup.low)}-{significant(speedup.high)}x, paired: {paired.rounds} rounds x "
        f"{paired.items} items)"
    )
    value = round(speedup.estimate, 4)
    if need <= 0:  # any measured speed clears a bound of 0: nothing for the host's steadiness to decide
        return _result(
            ctx, spec, True, value, need, f"{measured} > 0; min_speedup {exact(need)}x asks no more", **cited
        )
    if not paired.steady:
        return _inconclusive(
            ctx,
            spec,
            value,
            need,
            f"{measured}; the host was unsteady: an item's paired ratio varied {paired.spread:.3g}x across "
            f"rounds (median over items; above {UNSTEADY_SPREAD}x reads as unsteady)",
            f"measure again on a steadier host: `unmask run --model {name} --model {base} --remeasure`",
            **cited,
        )
    verdict = ratio_verdict(speedup, need)
    if verdict == INCONCLUSIVE:
        rounds = rounds_to_settle(speedup, need, paired.rounds)
        more = (
            f"needs {rounds - paired.rounds} more rounds ({rounds} in all) at this ratio: "
            f"`unmask run --model {name} --model {base} --speed-rounds {rounds}`"
            if rounds
            else "the ratio lies on its bound; no number of rounds settles it"
        )
        return _inconclusive(
            ctx,
            spec,
            value,
            need,
            f"{measured}; its interval spans {exact(need)}x",
            more,
            rounds_needed=rounds,
            **cited,
        )
    ok = verdict == PASS
    return _result(ctx, spec, ok, value, need, f"{measured} {'>=' if ok else '<'} {exact(need)}x", **cited)


class MemoryGate:
    kind: ClassVar[str] = "memory"

    def check(self, ctx: GateContext, spec: GateSpec) -> GateResult:
        limit = spec.params["max_peak_mem_mb"]
        if not ctx.records:
            return _no_record(ctx, spec, limit)
        measured = [r for r in ctx.records if r.peak_mem_mb is not None]
        if not measured:
            return _missing_evidence(
                ctx,
                spec,
                limit,
                f"no memory measured for {ctx.evidence.candidate}: an API model's memory is its provider's",
                "judge API entries under a policy without a memory gate",
            )
        worst = max(measured, key=lambda r: r.peak_mem_mb or 0.0)  # never None: measured ones only
        ok = worst.peak_mem_mb <= limit
        return _result(
            ctx,
            spec,
            ok,
            worst.peak_mem_mb,
            limit,
            f"peak memory {significant(worst.peak_mem_mb)} MB ({worst.task}) {'<=' if ok else '>'} budget "
            f"{exact(limit)} MB",
            **{"record_id": worst.record_id, "run_id": worst.run_id, "task": worst.task},
        )


class LicenseGate:
    kind: ClassVar[str] = "license"

    def check(self, ctx: GateContext, spec: GateSpec) -> GateResult:
        allowed = spec.params["allowed_tiers"]
        lic = ctx.evidence.license
        if lic is None:
            return _inconclusive(
                ctx,
                spec,
                None,
                allowed,
                "no license check result",
                "run the license check (unmask run measures it with the sweep)",
            )
        ok = lic.tier in allowed
        why = f"; {'; '.join(lic.reasons)}" if lic.reasons and not ok else ""
        return _result(
            ctx,
            spec,
            ok,
            lic.tier,
            allowed,
            f"license {lic.expression} is tier {lic.tier!r}, {'allowed' if ok else 'not allowed'} at "
            f"{ctx.stage.stage} ({', '.join(allowed)}){why}",
            license=lic.expression,
            findings=list(lic.findings) or None,
        )


class LicenseReviewGate:
    """A license of class `sign-off` (models/licenses.py) waits for a named person's sign-off of the checklist
    item; a `permissive` one passes without. The class comes with the license evidence, never re-derived here."""

    kind: ClassVar[str] = "license_review"

    def check(self, ctx: GateContext, spec: GateSpec) -> GateResult:
        item = spec.params["checklist_item"]
        lic, threshold = ctx.evidence.license, f"sign-off of {item!r} unless permissive"
        if lic is None:
            return _inconclusive(
                ctx, spec, None, threshold, "no license check result", "run the license check (unmask run does)"
            )
        if lic.license_class == "permissive":
            return _result(
                ctx, spec, True, lic.license_class, threshold, f"license {lic.expression} is permissive: no review"
            )
        signoff = ctx.signoffs.get(item)
        if not signoff or not signoff.get("by"):
            return _result(
                ctx,
                spec,
                False,
                lic.license_class,
                threshold,
                f"license {lic.expression} is class {lic.license_class!r}: checklist item {item!r} needs a named "
                "person's sign-off",
                license=lic.expression,
            )
        return _result(
            ctx,
            spec,
            True,
            lic.license_class,
            threshold,
            f"license {lic.expression} reviewed by {signoff['by']} at {signoff.get('at', '?')}: "
            f"{signoff.get('comment', '')}",
            license=lic.expression,
            signoff=dict(signoff),
        )


class ReproducibilityGate:
    kind: ClassVar[str] = "reproducibility"

    def check(self, ctx: GateContext, spec: GateSpec) -> GateResult:
        required = spec.params["require"]
        repro = ctx.evidence.reproducibility
        if repro is None:
            return _inconclusive(
                ctx,
                spec,
                None,
                required,
                "no reproducibility probe result",
                "run the reproducibility probe (unmask run --repro)",
            )
        missing = [c for c in required if not getattr(repro, c)]
        value = {c: bool(getattr(repro, c)) for c in required}
        cite = {"repro_config_hash": repro.config_hash, "output_hashes": list(repro.output_hashes)}
        if missing:
            extra = f" ({'; '.join(repro.differences)})" if repro.differences else ""
            return _result(
                ctx, spec, False, value, required, f"not reproducible: {', '.join(missing)} failed{extra}", **cite
            )
        return _result(ctx, spec, True, value, required, f"reproducible: {', '.join(required)}", **cite)


class DataValidityGate:
    kind: ClassVar[str] = "data_validity"

    def check(self, ctx: GateContext, spec: GateSpec) -> GateResult:
        min_items = spec.params.get("min_items", 1)
        op = ctx.stage.operating_point
        at_op = [r for r in ctx.evidence.records if r.gen_length == op.gen_length and r.task == op.task]
        if not at_op:
            return _inconclusive(
                ctx,
                spec,
                None,
                min_items,
                f"no record on task {op.task!r} at gen_length {op.gen_length}",
                f"{_measure_at(ctx)} on at least {min_items} items",
                items_needed=min_items,
                items_per_task=min_items,
            )
        if ctx.primary is None:
            states = sorted({"unvalidated" if r.valid is None else "invalid" for r in at_op})
            failed = [str(x) for r in at_op for x in (r.validation.get("failed") or [])][:3]
            detail = f": {'; '.join(failed)}" if failed else ""
            return _result(
                ctx,
                spec,
                False,
                False,
                min_items,
                f"records on {op.task!r} are {' or '.join(states)}; gates use validated records only{detail}",
                record_id=at_op[0].record_id,
                run_id=at_op[0].run_id,
            )
        few = min(ctx.records, key=lambda r: r.n_items)
        if few.n_items < min_items:  # too little evidence to judge the model on, not a fault of the model
            need = min_items - few.n_items
            return _inconclusive(
                ctx,
                spec,
                few.n_items,
                min_items,
                f"{few.task} measured on {few.n_items} items, fewer than {min_items}",
                f"needs {need} more items on {few.task} ({min_items} per task)",
                record_id=few.record_id,
                run_id=few.run_id,
                task=few.task,
                items_needed=need,
                items_per_task=min_items,
            )
        return _result(
            ctx,
            spec,
            True,
            few.n_items,
            min_items,
            f"{len(ctx.records)} validated record(s), at least {few.n_items} items each",
        )


class ErrorRateGate:
    kind: ClassVar[str] = "error_rate"

    def check(self, ctx: GateContext, spec: GateSpec) -> GateResult:
        limit = spec.params["max_error_rate"]
        if ctx.evidence.failures:
            return _result(ctx, spec, False, None, limit, "load or decode failed: " + "; ".join(ctx.evidence.failures))
        if not ctx.records:
            return _no_record(ctx, spec, limit)
        worst = max(ctx.records, key=lambda r: r.errors / max(r.n_items, 1))
        rate = worst.errors / max(worst.n_items, 1)
        ok = rate <= limit
        return _result(
            ctx,
            spec,
            ok,
            round(rate, 6),
            limit,
            f"error rate {percent(rate)} ({worst.errors}/{worst.n_items} on {worst.task}) {'<=' if ok else '>'} "
            f"{exact(limit * 100)}%",
            record_id=worst.record_id,
            run_id=worst.run_id,
            task=worst.task,
        )


class ToolingMaturityGate:
    kind: ClassVar[str] = "tooling_maturity"

    def check(self, ctx: GateContext, spec: GateSpec) -> GateResult:
        item = spec.params["checklist_item"]
        signoff = ctx.signoffs.get(item)
        if not signoff or not signoff.get("by"):
            return _result(
                ctx,
                spec,
                False,
                None,
                f"sign-off of {item!r}",
                f"checklist item {item!r} (tooling maturity) has no sign-off",
            )
        return _result(
            ctx,
            spec,
            True,
            signoff.get("by"),
            f"sign-off of {item!r}",
            f"tooling maturity signed off by {signoff['by']} at {signoff.get('at', '?')}: {signoff.get('comment', '')}",
            signoff=dict(signoff),
        )


def _missing_evidence(
    ctx: GateContext, spec: GateSpec, threshold: Any, reason: str, settle: str, command: str | None = None
) -> GateResult:
    """Evidence a gate needs that nobody has measured yet: inconclusive, and `settle` says what to run; the
    `command` that produces it, when one does, is cited as `settle_command` (what `unmask gates` suggests)."""
    return _inconclusive(ctx, spec, None, threshold, reason, settle, settle_command=command)


def serving_at(evidence: CandidateEvidence | None, concurrency: int, paired_run: str = "") -> ServingRecord | None:
    """The latest serving record at `concurrency`; of those from the paired load test `paired_run` if any."""
    found = [r for r in (evidence.serving if evidence else []) if r.concurrency == concurrency]
    paired = [r for r in found if paired_run and r.paired_run == paired_run]
    return max(paired or found, key=lambda r: r.when) if found else None


def _throughput_vs_fallback(
    record: ServingRecord, base: ServingRecord, need: float, value: dict[str, Any], meets: list[str], misses: list[str]
) -> tuple[str, list[float] | None]:
    """Tokens/s of `record` over the fallback's `base` from one paired load test, judged on its interval: a pass
    or a fail joins `meets` or `misses`, `value` gets the ratio. Returns what leaves it unsettled, in words (""
    when settled: unpaired, or an interval spanning `need`), and the interval."""
    ratio = record.tokens_per_s_against(base)
    if ratio is None:  # two load tests one after the other: the ratio is mostly the load between them
        value["throughput_vs_fallback"] = None
        unpaired = "tokens/s vs fallback not measured in pairs (needs one load test of both, at least 2 rounds of "
        return unpaired + f"{record.concurrency} requests each)", None
    value["throughput_vs_fallback"] = round(ratio.estimate, 6)
    interval = [round(ratio.low, 4), round(ratio.high, 4)]
    shown = (
        f"tokens/s vs fallback {significant(ratio.estimate)}x (95% CI {significant(ratio.low)}-"
        f"{significant(ratio.high)}x, paired: {len(record.blocks)} rounds)"
    )
    verdict = ratio_verdict(ratio, need)
    if verdict == INCONCLUSIVE:
        return f"{shown} spans {significant(need)}x", interval
    (meets if verdict == PASS else misses).append(f"{shown} {'>=' if verdict == PASS else '<'} {significant(need)}x")
    return "", interval


class ServingGate:
    kind: ClassVar[str] = "serving"

    def check(self, ctx: GateContext, spec: GateSpec) -> GateResult:
        p = spec.params
        level = p["concurrency"]
        threshold = {"concurrency": level} | {k: p[k] for k in SERVING_LIMITS if k in p}
        record = serving_at(ctx.evidence, level)
        name = ctx.evidence.candidate
        if record is None:
            command = f"unmask loadtest --model {name} --concurrency {level}"
            return _missing_evidence(
                ctx,
                spec,
                threshold,
                f"no serving record yet of {name} at concurrency {level}",
                f"run {command}",
                command,
            )
        value: dict[str, Any] = {}
        misses: list[str] = []
        meets: list[str] = []

        def check(
            key: str, measured: float | None, limit: float, words: str, shown: Callable[[float], str], at_most: bool
        ) -> None:
            value[key] = None if measured is None else round(measured, 6)
            if measured is None:
                misses.append(f"no {words} measured")
                return
            ok = measured <= limit if at_most else measured >= limit
            sign = ("<=" if ok else ">") if at_most else (">=" if ok else "<")
            (meets if ok else misses).append(f"{words} {shown(measured)} {sign} {shown(limit)}")

        if "p95_s_max" in p:
            check("p95_s", record.latency_p95_s, p["p95_s_max"], "p95", lambda v: f"{milliseconds(v)} ms", True)
        if "error_rate_max" in p:
            check("error_rate", record.error_rate, p["error_rate_max"], "error rate", percent, True)
        cite = {"serving_run_id": record.run_id, "serving_version": record.version, "concurrency": level}
        if "throughput_vs_fallback_min" in p:
            base = serving_at(ctx.baselines.get("fallback", (None, None))[0], level, record.paired_run)
            if base is None:
                command = f"unmask loadtest --model fallback --concurrency {level}"
                return _missing_evidence(
                    ctx,
                    spec,
                    threshold,
                    f"no serving record yet of the fallback at concurrency {level}",
                    f"run {command}",
                    command,
                )
            cite |= {"baseline": "fallback", "baseline_serving_run_id": base.run_id}
            unsettled, interval = _throughput_vs_fallback(
                record, base, p["throughput_vs_fallback_min"], value, meets, misses
            )
            cite["throughput_ci95"] = interval
            command = f"unmask loadtest --model {name} --model fallback --concurrency {level}"
            if unsettled and not misses:
                return _inconclusive(
                    ctx,
                    spec,
                    value,
                    threshold,
                    f"at concurrency {level} ({record.requests} requests): " + "; ".join([*meets, unsettled]),
                    f"run {command} (more --requests for more rounds)",
                    settle_command=command,
                    **cite,
                )
        words = "; ".join(misses or meets)
        return _result(
            ctx,
            spec,
            not misses,
            value,
            threshold,
            f"at concurrency {level} ({record.requests} requests): {words}",
            **cite,
        )


class CanaryGate:
    kind: ClassVar[str] = "canary"

    def check(self, ctx: GateContext, spec: GateSpec) -> GateResult:
        """A rollout of this version reached `min_weight` with every analysis on the way passed (none failed)."""
        need = spec.params["min_weight"]
        name, stage = ctx.evidence.candidate, ctx.stage.stage
        command = f"unmask rollout start {name} --route ROUTE --to {stage}"
        settle = f"run {command}"
        rollouts = [r for r in ctx.evidence.canary if r.get("stage", stage) == stage]
        failed = [i for i, r in enumerate(rollouts) if r.get("status") in ("rolled_back", "aborted")]
        rollouts = rollouts[failed[-1] :] if failed else rollouts  # a failed rollout stands until a later one passes
        if not rollouts:
            return _missing_evidence(ctx, spec, need, f"no rollout of {name} yet", settle, command)
        for rollout in rollouts:
            if rollout.get("status") in ("rolled_back", "aborted"):
                continue
            seen = []
            for analysis in rollout.get("analyses", []):
                if analysis.get("verdict") == FAIL:
                    break
                seen.append(analysis)
                if analysis.get("verdict") == PASS and analysis.get("weight", 0) >= need:
                    passed = sum(a.get("verdict") == PASS for a in seen)
                    return _result(
                        ctx,
                        spec,
                        True,
                        analysis["weight"],
                        need,
                        f"rollout {rollout['id']} passed its canary analysis at {analysis['weight']}% "
                        f"(>= {need}%), {passed} analyses passed on the way",
                        rollout=rollout["id"],
                        canary_runs=[a.get("run_id") for a in seen],
                    )
        last = rollouts[-1]
        reached = max((a.get("weight", 0) for a in last.get("analyses", []) if a.get("verdict") == PASS), default=0)
        if last.get("status") in ("rolled_back", "aborted"):
            return _result(
                ctx,
                spec,
                False,
                reached,
                need,
                f"rollout {last['id']} of {name} was {last['status']} (passed up to {reached}%, {need}% needed)",
                rollout=last["id"],
            )
        return _inconclusive(
            ctx,
            spec,
            reached,
            need,
            f"rollout {last['id']} of {name} is {last.get('status')} at {reached}% passed, {need}% needed",
            f"let rollout {last['id']} reach {need}% (unmask rollout status {last['id']})",
            rollout=last["id"],
        )


def _configs(n: int) -> str:
    return f"{n} config" + ("" if n == 1 else "s")


class ParallelismGate:
    kind: ClassVar[str] = "parallelism"

    def check(self, ctx: GateContext, spec: GateSpec) -> GateResult:
        """Parallel speed judged without the machine, on every validated config of the candidate at the stage's task
        (or the gate's) and length: the most parallel tokens per forward at an accuracy floor, or the AUP over that
        curve (evals.parallelism)."""
        p, name = spec.params, ctx.evidence.candidate
        task, n = p.get("task", ctx.stage.operating_point.task), ctx.stage.operating_point.gen_length
        threshold = dict(p["tpf_at_accuracy"]) if "tpf_at_accuracy" in p else {"aup_min": p["aup_min"]}
        rows = [r for r in ctx.evidence.records if r.valid is True and r.task == task and r.gen_length == n]
        if not rows:
            return _inconclusive(
                ctx,
                spec,
                None,
                threshold,
                f"no validated sweep record of {name} on task {task!r} at gen_length {n}",
                f"run unmask run (or unmask eval --sweep FILE) with points of {name} "
                f"on task {task!r} at gen_length {n}",
                task=task,
            )
        measured = [r for r in rows if r.tokens_per_forward]
        if not measured:
            return _missing_evidence(
                ctx,
                spec,
                threshold,
                f"no tokens per forward recorded for {name}: an API model shows no model calls",
                "judge API entries under a policy without a parallelism gate",
            )
        points = [(r.tokens_per_forward, r.accuracy) for r in measured if r.tokens_per_forward]  # each of measured
        curve = [[round(t, 4), round(a, 4), r.record_id] for (t, a), r in zip(points, measured)]
        cite = {"task": task, "gen_length": n, "curve": sorted(curve)}
        if "tpf_at_accuracy" in p:
            need, floor = threshold["min_tpf"], threshold["accuracy_floor"]
            best = tpf_at_accuracy(points, floor)
            if best is None:
                top = max(measured, key=lambda r: r.accuracy)
                return _result(
                    ctx,
                    spec,
                    False,
                    None,
                    threshold,
                    f"no config of {name} on {task} reaches accuracy "
                    f"{percent(floor)} (best {percent(top.accuracy)} at {significant(top.tokens_per_forward)} "
                    f"tokens per forward, {_configs(len(measured))})",
                    **cite,
                )
            chosen = next(r for r in measured if (r.tokens_per_forward, r.accuracy) == best)
            ok = best[0] >= need
            return _result(
                ctx,
                spec,
                ok,
                round(best[0], 4),
                threshold,
                f"{significant(best[0])} tokens per forward at accuracy {percent(best[1])} (floor "
                f"{percent(floor)}) on {task}, {_configs(len(measured))}, {'>=' if ok else '<'} {exact(need)}",
                **cite,
                record_id=chosen.record_id,
                run_id=chosen.run_id,
                config_hash=chosen.config_hash,
            )
        result = aup(points)
        ok = result.aup >= p["aup_min"]
        tpfs = [t for t, _ in result.points]
        return _result(
            ctx,
            spec,
            ok,
            round(result.aup, 2),
            threshold,
            f"AUP {significant(result.aup)} over {len(result.points)} of {len(measured)} configs on {task} "
            f"(tokens per forward {significant(min(tpfs))}-{significant(max(tpfs))}, best accuracy "
            f"{percent(result.y_max)}) {'>=' if ok else '<'} {exact(p['aup_min'])}",
            **cite,
        )


GATE_CHECKS: dict[str, GateCheck] = {
    check.kind: check()
    for check in (
        QualityGate,
        LatencyGate,
        SpeedupGate,
        MemoryGate,
        LicenseGate,
        LicenseReviewGate,
        ReproducibilityGate,
        DataValidityGate,
        ErrorRateGate,
        ToolingMaturityGate,
        ServingGate,
        CanaryGate,
        ParallelismGate,
    )
}
