"""Quality vs latency: each candidate's records across sampler settings, its Pareto front, the AR
fallback as the reference point, and the operating point the stage gates judge."""

from __future__ import annotations

import plotly.graph_objects as go
import streamlit as st

from dashboards import source

reg = source.registry_or_stop()
uri = reg.tracking_uri

st.title("Quality vs latency")
points = source.quality_latency(uri, source.policy_source())
if points.empty:
    st.info("No evaluation records yet. Run `unmask run` to sweep the sampler settings.")
    st.stop()

left, middle, right = st.columns(3)
task = left.selectbox("Task", sorted(points.task.unique()), key="ql_task")
lengths = sorted(points[points.task == task].gen_length.unique())
gen_length = middle.selectbox("Generation length", lengths, key="ql_gen_length")
latency = right.radio("Latency", ["latency_p95_s", "latency_p50_s"], horizontal=True, key="ql_latency",
                      format_func=lambda c: c.removeprefix("latency_").removesuffix("_s"))
shown = points[(points.task == task) & (points.gen_length == gen_length)].sort_values(latency)

figure = go.Figure()
palette = ["#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
candidates = [m for m in dict.fromkeys(shown.model) if (shown[shown.model == m].role != "fallback").all()]
for colour, model in zip(palette * 4, candidates):
    mine = shown[shown.model == model]
    figure.add_trace(go.Scatter(
        x=mine[latency], y=mine.accuracy, mode="markers+text", name=f"{model} v{mine.version.iloc[0]}",
        text=mine.label, textposition="top center", marker={"color": colour, "size": 9,
                                                            "symbol": ["circle" if v else "x" for v in mine.valid]},
        customdata=mine[["config_hash", "tokens_per_s", "tokens_per_forward", "nfe"]].values,
        hovertemplate="%{text}<br>latency %{x:.3f} s<br>accuracy %{y:.3f}<br>tokens/s %{customdata[1]:.1f}"
                      "<br>TPF %{customdata[2]:.2f}, NFE %{customdata[3]:.1f}<extra>%{customdata[0]}</extra>"))
    front = mine[mine.pareto].sort_values(latency)
    if len(front):
        figure.add_trace(go.Scatter(x=front[latency], y=front.accuracy, mode="lines", line={"shape": "hv",
                                    "color": colour, "dash": "dot"}, name=f"{model} Pareto front"))
    operating = mine[mine.operating_for.map(bool)]
    if len(operating):
        figure.add_trace(go.Scatter(
            x=operating[latency], y=operating.accuracy, mode="markers", name=f"{model} operating point",
            marker={"size": 20, "color": "rgba(0,0,0,0)", "line": {"color": "#d62728", "width": 3}},
            hovertext=operating.operating_for.map(lambda s: "operating point for " + ", ".join(s)),
            hoverinfo="text"))
fallback = shown[shown.role == "fallback"]
if len(fallback):
    figure.add_trace(go.Scatter(
        x=fallback[latency], y=fallback.accuracy, mode="markers+text", name="AR fallback",
        text=fallback.model, textposition="bottom center",
        marker={"symbol": "star", "size": 18, "color": "#ff7f0e"}))
figure.update_layout(xaxis_title=f"{latency.removesuffix('_s').replace('_', ' ')} (s per request, batch 1)",
                     yaxis_title=f"accuracy on {task}", yaxis_range=[-0.05, 1.05], height=520,
                     legend={"orientation": "h", "y": -0.2})
st.plotly_chart(figure, key="quality_latency_chart")

judged = {point for point in source.operating_points(source.policy_source()).values()}
if not shown.operating_for.map(bool).any():
    where = "; ".join(f"{t} at generation length {n}" for t, n in sorted(judged))
    st.warning(f"No operating point here: the stage gates judge {where}, and no validated record of these "
               "settings matches. Pick that task and length, or evaluate at it (`unmask run`).")

st.caption("Pareto front: no other setting of the same model is both faster and better. Operating point: the "
           "setting the stage gates judge (best quality at the policy's task and generation length, or the "
           "one named by the model card). Crosses: records that failed validation.")
st.dataframe(shown[["model", "version", "role", "label", "accuracy", "latency_p50_s", "latency_p95_s",
                    "tokens_per_s", "tokens_per_forward", "nfe", "peak_mem_mb", "valid", "pareto",
                    "operating_for", "config_hash", "run_id"]],
             hide_index=True, width="stretch")
