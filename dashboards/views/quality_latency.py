"""Quality vs latency: each candidate's records across sampler settings, its Pareto front, the AR
fallback as the reference point, and the operating point the stage gates judge; beside it, throughput vs p95
latency under load from the logged load tests; below, each version's accuracy under parallelism (AUP) on the
task and length shown, with the curve it came from."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from dashboards import source
from dashboards.cells import CHART_PADDING
from dashboards.policy_note import show_policy
from gates.readable import milliseconds, percent, significant
from registry.views import BENCHMARK_COLUMNS, parallelism_curves

reg = source.registry_or_stop()
uri = reg.tracking_uri

st.title("Quality vs latency")
show_policy(uri)  # its operating points are the ones this policy's gates judge
points = source.quality_latency(uri, source.policy_source())
if points.empty:
    st.info("No evaluation records yet. Run `unmask run` to sweep the sampler settings.")
    st.stop()

# x axes: (title, how a value is shown, scale to the unit shown); the fronts come with the points
AXES = {
    "latency_p95_s": ("p95 latency (ms per request, batch 1)", 1e3),
    "latency_p50_s": ("p50 latency (ms per request, batch 1)", 1e3),
    "steps": ("sampling steps (an AR model: one per token)", 1.0),
    "tokens_per_forward": ("tokens per forward (committed positions per model call)", 1.0),
}
WORDS = {
    "latency_p95_s": "p95 latency",
    "latency_p50_s": "p50 latency",
    "steps": "steps",
    "tokens_per_forward": "tokens per forward",
}
left, middle, right = st.columns([1, 1, 2])
task = left.selectbox("Task", sorted(points.task.unique()), key="ql_task")
lengths = sorted(points[points.task == task].gen_length.unique())
gen_length = middle.selectbox("Generation length", lengths, key="ql_gen_length")
axis = right.radio("x axis", list(AXES), horizontal=True, key="ql_x", format_func=WORDS.get)
shown = points[(points.task == task) & (points.gen_length == gen_length)].sort_values(axis)
front_column = "pareto" if axis == "latency_p95_s" else f"pareto_{axis}"
title, unit = AXES[axis]

fallback = shown.role == "fallback"
plotted = pd.DataFrame(
    {
        "series": [
            f"AR fallback ({m} v{v})" if fb else f"{m} v{v}" for m, v, fb in zip(shown.model, shown.version, fallback)
        ],
        "x": shown[axis] * unit,
        "accuracy": shown.accuracy,
        "settings": shown.label,
        "point": [
            "AR fallback" if fb else "validated" if ok is True else "failed validation"
            for fb, ok in zip(fallback, shown.valid)
        ],
        "front": shown[front_column].astype(bool) & ~fallback,
        "operating": shown.operating_for.map(bool) & ~fallback,
        "operating for": shown.operating_for.map(lambda s: ", ".join(s) or "—"),
        "accuracy shown": shown.accuracy.map(percent),
        "p95 (ms)": shown.latency_p95_s.map(milliseconds),
        "p50 (ms)": shown.latency_p50_s.map(milliseconds),
        "steps": shown.steps.map(significant),
        "tokens per forward": shown.tokens_per_forward.map(significant),
        "tokens/s": shown.tokens_per_s.map(significant),
        "config": shown.config_hash.str[:12],
    }
).reset_index(drop=True)

low, high = float(plotted.accuracy.min()), float(plotted.accuracy.max())
pad = max(0.02, 0.1 * (high - low))  # fitted to the data, never the whole 0-1 when every point sits high
y = alt.Y(
    "accuracy:Q",
    title=f"accuracy on {task}",
    axis=alt.Axis(format="%"),
    scale=alt.Scale(domain=[max(0.0, low - pad), min(1.0, high + pad)], nice=False, zero=False),
)
x = alt.X(
    "x:Q", title=title, scale=alt.Scale(zero=False, nice=True), axis=alt.Axis(tickCount=5)
)  # 4-digit ms labels collide at 10
STAR = "M0,-1L0.24,-0.32L0.95,-0.31L0.38,0.12L0.59,0.81L0,0.4L-0.59,0.81L-0.38,0.12L-0.95,-0.31L-0.24,-0.32Z"
tooltip = [
    alt.Tooltip("series:N", title="version"),
    alt.Tooltip("settings:N"),
    alt.Tooltip("accuracy shown:N", title="accuracy"),
    alt.Tooltip("p95 (ms):N"),
    alt.Tooltip("p50 (ms):N"),
    alt.Tooltip("steps:N"),
    alt.Tooltip("tokens per forward:N"),
    alt.Tooltip("tokens/s:N"),
    alt.Tooltip("operating for:N"),
    alt.Tooltip("point:N", title="record"),
    alt.Tooltip("config:N"),
]
base = alt.Chart(plotted).encode(x=x, y=y)
legend = alt.Legend(orient="bottom", columns=1, labelLimit=400)  # two columns spill out of the chart at 800 px
series = list(dict.fromkeys(plotted.series))
PALETTE = ["#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf"]  # candidates; the fallback is orange
colours = alt.Scale(
    domain=series,
    range=[
        (PALETTE[i % len(PALETTE)] if not name.startswith("AR fallback") else "#ff7f0e")
        for i, name in enumerate(series)
    ],
)
records = base.mark_point(filled=True, opacity=0.85).encode(
    color=alt.Color("series:N", title="version", legend=legend, scale=colours),
    shape=alt.Shape(
        "point:N",
        title="record",
        legend=legend,
        scale=alt.Scale(domain=["validated", "failed validation", "AR fallback"], range=["circle", "cross", STAR]),
    ),
    size=alt.condition("datum.point == 'AR fallback'", alt.value(320), alt.value(90)),
    tooltip=tooltip,
)
front = (
    base.transform_filter("datum.front")
    .mark_line(strokeDash=[5, 3])
    .encode(color=alt.Color("series:N", title="version", legend=legend, scale=colours), detail="series:N", order="x:Q")
)
operating = (
    base.transform_filter("datum.operating")
    .mark_point(shape="circle", size=520, filled=False, strokeWidth=3, color="#d62728")
    .encode(tooltip=tooltip)
)
chart = alt.layer(front, records, operating).properties(height=520, padding=CHART_PADDING)
st.altair_chart(chart, width="stretch", key="quality_latency_chart")
st.caption(
    "Dotted line: the Pareto front of each version on this axis (no other setting is both better on it and "
    "more accurate). Red ring: the operating point the stage gates judge. Star: the AR fallback. Crosses: "
    "records that failed validation. Hover a point for its settings and measurements."
)

judged = {point for point in source.operating_points(source.policy_source()).values()}
if not shown.operating_for.map(bool).any():
    where = "; ".join(f"{t} at generation length {n}" for t, n in sorted(judged))
    st.warning(
        f"No operating point here: the stage gates judge {where}, and no validated record of these "
        "settings matches. Pick that task and length, or evaluate at it (`unmask run`)."
    )

st.subheader("Throughput vs p95 under load")
load = source.load_curves(uri)
if load.empty:
    st.info(
        "No load test logged yet. Run `unmask loadtest --concurrency 1,2,4,8,16,32` to serve the registry and "
        "measure throughput and p95 latency at each concurrency."
    )
else:
    under = pd.DataFrame(
        {
            "series": [
                f"AR fallback ({m} v{v})" if role == "fallback" else f"{m} v{v}"
                for m, v, role in zip(load.model, load.version, load.role)
            ],
            "p95 (ms)": load.latency_p95_s * 1e3,
            "tokens/s": load.tokens_per_s,
            "concurrency": load.concurrency,
            "label": load.concurrency.map(lambda c: f"c={c}"),
            "served as": load.served_as,
            "errors": load.error_rate.map(percent),
            "when": load.when,
        }
    )
    load_series = list(dict.fromkeys(under.series))
    load_colours = alt.Scale(
        domain=load_series,
        range=[
            "#ff7f0e" if name.startswith("AR fallback") else PALETTE[i % len(PALETTE)]
            for i, name in enumerate(load_series)
        ],
    )
    load_base = alt.Chart(under).encode(
        x=alt.X("p95 (ms):Q", title="p95 latency (ms per request, under load)", scale=alt.Scale(zero=False)),
        y=alt.Y("tokens/s:Q", title="answer tokens/s (all requests in flight)"),
        color=alt.Color("series:N", title="version", legend=legend, scale=load_colours),
    )
    load_line = load_base.mark_line(point=True).encode(
        order="concurrency:Q",
        tooltip=[
            "series:N",
            "served as:N",
            "concurrency:Q",
            alt.Tooltip("tokens/s:Q", format=".1f"),
            alt.Tooltip("p95 (ms):Q", format=".0f"),
            "errors:N",
            "when:N",
        ],
    )
    load_labels = load_base.mark_text(dx=14, dy=-8, fontSize=11).encode(text="label:N")
    st.altair_chart(
        alt.layer(load_line, load_labels).properties(height=360, padding=CHART_PADDING),
        width="stretch",
        key="load_curve_chart",
    )
    st.caption(
        "Each point: one concurrency of the latest load test (`unmask loadtest`) against each model's current "
        "version, at its served operating point (not the task and length chosen above); a line per version, "
        "the AR fallback in orange. Up and to the left is better."
    )

st.subheader("Benchmark record: each candidate beside the AR fallback")
bench = source.benchmarks(uri)
if bench.empty:
    st.info(
        "No benchmark record yet. Run `unmask bench --model tiny-llada --model tiny-dgemma --concurrency 1,16` to "
        "serve the candidates and the AR fallback here and measure them paired at each concurrency."
    )
else:
    marked = bench.assign(
        series=[f"{m} (AR fallback)" if r == "fallback" else m for m, r in zip(bench.model, bench.role)]
    )
    bench_base = alt.Chart(marked).encode(color=alt.Color("series:N", title="version", legend=legend))
    whiskers_x = bench_base.mark_rule().encode(
        x=alt.X("tokens_low:Q", title="answer tokens/s (95% interval)"), x2="tokens_high:Q", y="accuracy_value:Q"
    )
    whiskers_y = bench_base.mark_rule().encode(
        y=alt.Y("accuracy_low:Q", title="accuracy (95% interval)", axis=alt.Axis(format="%")),
        y2="accuracy_high:Q",
        x="tokens_value:Q",
    )
    dots = bench_base.mark_point(filled=True, size=120).encode(
        x="tokens_value:Q",
        y="accuracy_value:Q",
        shape=alt.Shape("role:N", scale=alt.Scale(domain=["candidate", "fallback"], range=["circle", STAR])),
        tooltip=["series:N", "in flight:Q", "accuracy:N", "tokens/s:N", "tokens/s vs fallback:N", "p99 (ms):N"],
    )
    for level, column in zip(sorted(marked["in flight"].unique()), st.columns(marked["in flight"].nunique())):
        column.altair_chart(
            alt.layer(whiskers_x, whiskers_y, dots)
            .transform_filter(alt.datum["in flight"] == int(level))
            .properties(height=300, title=f"{level} in flight", padding=CHART_PADDING),
            width="stretch",
            key=f"benchmark_chart_{level}",
        )
    st.dataframe(bench[BENCHMARK_COLUMNS], hide_index=True, width="stretch")
    st.caption(
        "One record per host and concurrency: the newest paired load test (`unmask bench --concurrency`) in which "
        "the candidates' and the AR fallback's requests ran interleaved, round by round, on the same prompts. "
        "Accuracy is every request's answer scored against its target (a failed request scores 0), with Wilson "
        "intervals; tokens/s and its ratio to the fallback are bootstrapped over the rounds; latency and TTFT "
        "percentiles over the requests. Tokens per forward: text tokens per model call of the decode."
    )

st.dataframe(
    pd.DataFrame(
        {
            "model": shown.model,
            "version": shown.version,
            "role": shown.role,
            "settings": shown.label,
            "accuracy": shown.accuracy.map(percent),
            "p50 latency (ms)": shown.latency_p50_s.map(milliseconds),
            "p95 latency (ms)": shown.latency_p95_s.map(milliseconds),
            "steps": shown.steps.map(significant),
            "tokens per second": shown.tokens_per_s.map(significant),
            "tokens per forward": shown.tokens_per_forward.map(significant),
            "model calls": shown.nfe.map(significant),
            "peak memory (MB)": shown.peak_mem_mb.map(significant),
            "validated": shown.valid.map(lambda v: "yes" if v is True else "no"),
            "on the front": shown[front_column].map({True: "yes", False: "no"}),
            "operating point for": shown.operating_for.map(lambda s: ", ".join(s) or "—"),
            "config": shown.config_hash,
            "run id": shown.run_id,
        }
    ),
    hide_index=True,
    width="stretch",
)

st.subheader("Accuracy under parallelism (AUP)")
curves = parallelism_curves(shown)
if curves.empty:
    st.info("No validated record with tokens per forward here: AUP needs the sweep's points (`unmask run`).")
else:
    for column, curve in zip(st.columns(len(curves)), curves.itertuples()):
        column.metric(
            f"{curve.model} v{curve.version}" + (" (AR fallback)" if curve.role == "fallback" else ""),
            significant(curve.aup),
            help=f"{sum(c['on_curve'] for c in curve.curve)} of {len(curve.curve)} "
            f"configs on the curve; best accuracy {percent(curve.y_max)}",
        )
    drawn = pd.DataFrame(
        [
            {
                "series": f"{c.model} v{c.version}",
                "tokens per forward": p["tokens_per_forward"],
                "accuracy": p["accuracy"],
                "settings": p["label"],
                "accuracy shown": percent(p["accuracy"]),
                "point": "on the curve" if p["on_curve"] else "off: over 5 points below the first",
            }
            for c in curves.itertuples()
            for p in c.curve
        ]
    )
    curve_base = alt.Chart(drawn).encode(
        x=alt.X(
            "tokens per forward:Q",
            title="tokens per forward (committed positions per model call)",
            scale=alt.Scale(zero=True),
        ),
        y=alt.Y("accuracy:Q", title=f"accuracy on {task}", axis=alt.Axis(format="%"), scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("series:N", title="version", legend=legend),
    )
    line = (
        curve_base.transform_filter("datum.point == 'on the curve'")
        .mark_line(interpolate="linear")
        .encode(order="tokens per forward:Q")
    )
    dots = curve_base.mark_point(filled=True, size=90).encode(
        shape=alt.Shape(
            "point:N",
            title="record",
            legend=legend,
            scale=alt.Scale(domain=["on the curve", "off: over 5 points below the first"], range=["circle", "cross"]),
        ),
        tooltip=["series:N", "settings:N", alt.Tooltip("accuracy shown:N", title="accuracy"), "tokens per forward:Q"],
    )
    st.altair_chart(
        alt.layer(line, dots).properties(height=320, padding=CHART_PADDING), width="stretch", key="aup_chart"
    )
    st.caption(
        "AUP (d3LLM, arXiv:2601.07568): the area under accuracy (in %) against tokens per forward, from 0, "
        "by trapezoids, each accuracy weighted by min(exp(-3 (1 - y / y_max)), 1) against the version's best; "
        "records more than 5 points below the least parallel one are left off. It does not depend on the "
        "machine: vanilla decoding alone at 90% scores 90, the same 90% held to 4 tokens per forward 360. "
        "The `parallelism` gate judges the same curve."
    )
