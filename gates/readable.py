"""Numbers and thresholds as a person writes them: 3 significant digits, latency in ms, accuracy in %.

The lowest layer that words a number: gate reasons (gates/evaluate.py) and the CLI's tables both read
it, so a verdict's reason and the table beside it say the same `22.3 ms`.

A tiny model's p95 is measured to a few percent at best, so `0.02230288574997985` s says nothing
that `22.3 ms` does not. Thresholds come from the policy's own settings, not from its Python
repr: `>= 30%`, `permitted or caution`, `>= fallback - 20 pts`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

NONE = "-"


def significant(value: float | int | None, digits: int = 3) -> str:
    """`value` to `digits` significant digits, never in e-notation: 0.02230288 -> '0.0223', 1.0 -> '1.00',
    1234.5 -> '1230'."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return NONE
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    decimals = digits - 1 - magnitude
    if decimals <= 0:
        return str(int(round(value, decimals)))
    return f"{value:.{decimals}f}"  # trailing zeros are digits too: 1.00x is measured, 1x is not


def milliseconds(seconds: float | None) -> str:
    """Seconds as milliseconds, 3 significant digits, no unit (the column header names it)."""
    return NONE if seconds is None else significant(seconds * 1e3)


def percent(share: float | None) -> str:
    """A share of 1 as a percentage: 0.9375 -> '93.8%', 1.0 -> '100%'."""
    return NONE if share is None else significant(share * 100) + "%"


def with_interval(shown: Callable[[float | None], str], figure: Mapping[str, float] | None) -> str:
    """A figure and its 95% interval in one unit, `shown` wording each number: `93.8% (85.0%–97.6%)`, with
    `milliseconds` `312 (290–340)`; NONE when it was not measured."""
    if not figure:
        return NONE
    return f"{shown(figure['estimate'])} ({shown(figure['low'])}–{shown(figure['high'])})"


def exact(value: float | int) -> str:
    """A policy's own number, as written there: 16384 stays 16384, 1e9 is 1000000000 (a threshold is
    not a measurement, so it is not rounded)."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def either(words: Any, joiner: str = "or") -> str:
    """A list in words: ['permitted', 'caution'] -> 'permitted or caution'; names lose their underscores."""
    items = [str(w).replace("_", " ") for w in (words if isinstance(words, (list, tuple)) else [words])]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + f" {joiner} " + items[-1]


def points(change: float) -> str:
    """An absolute change of a share in percentage points: -0.2 -> '- 20 pts'."""
    return f"{'+' if change >= 0 else '-'} {exact(abs(change) * 100)} pts"


def signed_points(change: float | None, unit: str = " pts") -> str:
    """A measured difference of two shares in percentage points, 3 significant digits: 0.0213 -> '+2.13 pts'
    (`unit=""` where a header names it: '+2.13')."""
    if change is None:
        return NONE
    return f"{'+' if change >= 0 else '-'}{significant(abs(change) * 100)}{unit}"


def gate_value(kind: str | None, value: Any) -> str:
    """What a gate measured, in the unit of its kind (`GateSpec.kind`; None: a gate the policy no longer has)."""
    if value is None:
        return "no sign-off" if kind == "tooling_maturity" else NONE
    if kind == "quality":
        return percent(value)
    if kind == "latency":
        return f"{milliseconds(value)} ms"
    if kind == "speedup":
        return f"{significant(value)}x"
    if kind == "memory":
        return f"{significant(value)} MB"
    if kind == "error_rate":
        return percent(value)
    if kind == "data_validity":
        return "not validated" if value is False else f"{value} items"
    if kind == "reproducibility" and isinstance(value, dict):
        held = [name for name, ok in value.items() if ok]
        failed = [name for name, ok in value.items() if not ok]
        return "; ".join(([either(held, "and")] if held else []) + ([f"not {either(failed)}"] if failed else []))
    if kind == "tooling_maturity":
        return f"signed off by {value}"
    if kind == "serving" and isinstance(value, dict):
        shown = {
            "p95_s": lambda v: f"p95 {milliseconds(v)} ms",
            "error_rate": lambda v: f"errors {percent(v)}",
            "throughput_vs_fallback": lambda v: f"{significant(v)}x fallback tokens/s",
        }
        return ", ".join(
            shown[k](v) if v is not None else f"{k.replace('_', ' ')} {NONE}" for k, v in value.items() if k in shown
        )
    return (
        either(value)
        if isinstance(value, (list, tuple))
        else significant(value)
        if isinstance(value, (int, float))
        else str(value)
    )


def gate_threshold(spec: Any, threshold: Any) -> str:
    """What a gate requires, from its policy `GateSpec` (None: show the recorded threshold plainly)."""
    kind = getattr(spec, "kind", None)
    params = getattr(spec, "params", {})
    if kind == "quality" and spec.metric_threshold is not None:
        mt, base = spec.metric_threshold, params.get("relative_to", "baseline")
        at_least, sign = (">=", 1) if mt.greater_is_better else ("<=", -1)  # as MetricThreshold.failures reads them
        parts = []
        if mt.threshold is not None:
            parts.append(f"{at_least} {exact(mt.threshold * 100)}%")
        if mt.min_absolute_change is not None:
            change = sign * mt.min_absolute_change
            parts.append(f"{at_least} {base}" + (f" {points(change)}" if change else ""))
        if mt.min_relative_change is not None:
            parts.append(f"{at_least} {exact(100 * (1 + sign * mt.min_relative_change))}% of {base}")
        return ", ".join(parts) or NONE
    if kind == "latency":
        return f"<= {exact(params['max_p95_s'] * 1e3)} ms"
    if kind == "speedup":
        return f">= {exact(params['min_speedup'])}x"
    if kind == "memory":
        return f"<= {exact(params['max_peak_mem_mb'])} MB"
    if kind == "license":
        return either(params["allowed_tiers"])
    if kind == "reproducibility":
        return either(params["require"], "and")
    if kind == "data_validity":
        return f">= {params.get('min_items', 1)} items"
    if kind == "error_rate":
        return "no errors" if params["max_error_rate"] == 0 else f"<= {exact(params['max_error_rate'] * 100)}%"
    if kind == "tooling_maturity":
        return f"sign-off of {params['checklist_item']}"
    if kind == "license_review":
        return f"permissive, or sign-off of {params['checklist_item']}"
    if kind == "serving":
        parts = [f"p95 <= {exact(params['p95_s_max'] * 1e3)} ms"] if "p95_s_max" in params else []
        if "error_rate_max" in params:
            limit = params["error_rate_max"]
            parts.append("no errors" if limit == 0 else f"errors <= {exact(limit * 100)}%")
        parts += (
            [f">= {exact(params['throughput_vs_fallback_min'])}x fallback tokens/s"]
            if "throughput_vs_fallback_min" in params
            else []
        )
        return f"{params['concurrency']} in flight: " + ", ".join(parts)
    if kind == "parallelism":
        if "tpf_at_accuracy" in params:
            sub = params["tpf_at_accuracy"]
            return f">= {exact(sub['min_tpf'])} tokens per forward at accuracy >= {exact(sub['accuracy_floor'] * 100)}%"
        return f"AUP >= {exact(params['aup_min'])}"
    return gate_value(None, threshold)
