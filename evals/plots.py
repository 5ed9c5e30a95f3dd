"""Quality-vs-latency plots (one panel per candidate, its Pareto front, the AR fallback as reference), the
bench's accuracy-vs-throughput plot, and the load test's throughput-vs-latency curve."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from evals import step_cache
from evals.records import EvalRecord, ServingRecord

if TYPE_CHECKING:
    from evals.bench import BenchReport, BenchRow  # not at run time: evals.bench imports torch

# Settings worth showing in a point's label, when they differ from the vanilla sampler.
LABEL_KEYS = {
    "steps": "s",
    "block_length": "b",
    "parallel": "",
    "parallel_threshold": "t",
    "parallel_factor": "f",
    "cache": "cache=",
    "speculative_draft": "spec=",
    "early_exit": "",
    "backend": "",
}
VANILLA = {"parallel": "top_k", "cache": "none", "speculative_draft": 0, "early_exit": "none", "backend": "torch"}


def quality_latency_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both lower latency (x) and higher quality (y)."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best = [], float("-inf")
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def point_label(record: EvalRecord) -> str:
    """A short name for a record's decoding settings: `s16 b8 cache=dual`, or `AR greedy`."""
    cfg = record.config or {}
    if record.kind == "autoregressive":
        return "AR greedy" if not cfg.get("temperature") else f"AR T={cfg['temperature']}"
    parts = []
    for key, short in LABEL_KEYS.items():
        if key not in cfg or cfg[key] == VANILLA.get(key, object()):
            continue
        if key in ("parallel_threshold",) and cfg.get("parallel") != "threshold":
            continue
        if key in ("parallel_factor",) and cfg.get("parallel") != "factor":
            continue
        parts.append(f"{short}{cfg[key]}")
    return " ".join(parts)


def plot_quality_latency(records: list[EvalRecord], folder: str | Path, latency: str = "latency_p50_s") -> list[Path]:
    """One PNG per task under `folder`; returns the paths. Invalid records are drawn as crosses.

    The same records drawn by the same code and matplotlib give the same picture: it is kept in the step cache
    (evals.step_cache) and copied, not drawn again (matplotlib's import and drawing: 0.2-0.9 s a candidate)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"quality-latency-{task}.png" for task in dict.fromkeys(r.task for r in records)]
    key = step_cache.step_key(
        "quality-latency",
        records=[r.to_dict() for r in records],
        latency=latency,
        matplotlib=metadata.version("matplotlib"),
    )
    if step_cache.copy_kept_files(key, names, folder):
        return [folder / name for name in names]
    paths = _draw_quality_latency(records, folder, latency)
    step_cache.keep_files(key, paths)
    return paths


def _draw_quality_latency(records: list[EvalRecord], folder: Path, latency: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for task in dict.fromkeys(r.task for r in records):
        rows = [r for r in records if r.task == task]
        candidates = list(dict.fromkeys(r.candidate for r in rows if r.role != "fallback")) or list(
            dict.fromkeys(r.candidate for r in rows)
        )
        fallbacks = [r for r in rows if r.role == "fallback"]
        fig, axes = plt.subplots(1, len(candidates), figsize=(7 * len(candidates), 5), squeeze=False)
        for ax, candidate in zip(axes[0], candidates):
            mine = [r for r in rows if r.candidate == candidate]
            xs = [getattr(r, latency) for r in mine]
            ys = [r.accuracy for r in mine]
            for r, x, y in zip(mine, xs, ys):
                ax.scatter(
                    [x],
                    [y],
                    marker="o" if r.valid is not False else "x",
                    color="tab:blue" if r.valid is not False else "tab:red",
                )
                ax.annotate(point_label(r), (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points", rotation=20)
            front = [i for i in quality_latency_front(list(zip(xs, ys))) if mine[i].valid is not False]
            if front:
                ax.step(
                    [xs[i] for i in front],
                    [ys[i] for i in front],
                    where="post",
                    color="tab:blue",
                    alpha=0.6,
                    label="Pareto front",
                )
            for ref in fallbacks:
                if ref.candidate != candidate:
                    ax.scatter(
                        [getattr(ref, latency)],
                        [ref.accuracy],
                        marker="*",
                        s=160,
                        color="tab:orange",
                        label=f"{ref.candidate} (AR fallback)",
                    )
            ax.set_title(f"{candidate} on {task}")
            ax.set_xlabel(f"{latency.replace('_s', '')} (s, batch 1)")
            ax.set_ylabel("accuracy")
            ax.set_ylim(-0.05, 1.05)
            every_x = [x for x in xs if x > 0] + [getattr(f, latency) for f in fallbacks if getattr(f, latency) > 0]
            if every_x and max(every_x) > 10 * min(every_x):
                ax.set_xscale("log")
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, frameon=False)
        fig.tight_layout()
        path = folder / f"quality-latency-{task}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def plot_bench(report: BenchReport, path: str | Path) -> Path:
    """`unmask bench --plot`: accuracy vs text tokens/s, one panel per generation length, one colour per config,
    one marker per batch size, the AR twin as a star; a log x axis where the rates span over 10x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lengths: dict[int, list[BenchRow]] = {}
    for r in report.rows:
        lengths.setdefault(r.gen_length, []).append(r)
    if not lengths:
        raise ValueError("plot_bench: the report has no rows to plot")
    configs = list(dict.fromkeys(r.config for r in report.rows if r.kind != "ar"))
    palette = [plt.get_cmap("tab20")(i) for i in range(20) if i not in (2, 3)]  # no orange: the AR twin's
    colours = {c: palette[i % len(palette)] for i, c in enumerate(configs)}
    batches = list(dict.fromkeys(r.batch for r in report.rows))
    markers = dict(zip(batches, "os^Dvp<>h"))
    fig, axes = plt.subplots(1, len(lengths), figsize=(6.5 * len(lengths), 5.5), squeeze=False)
    for ax, (n, rows) in zip(axes[0], sorted(lengths.items())):
        for r in rows:
            many = len(batches) > 1
            if r.kind == "ar":
                ax.scatter(
                    [r.text_tokens_per_s],
                    [r.accuracy],
                    marker="*",
                    s=260,
                    color="tab:orange",
                    zorder=3,
                    edgecolors="black",
                    linewidths=0.5,
                    label=f"AR twin ({r.config})" + (f", batch {r.batch}" if many else ""),
                )
                if many:
                    ax.annotate(
                        f"b{r.batch}",
                        (r.text_tokens_per_s, r.accuracy),
                        fontsize=7,
                        xytext=(5, -9),
                        textcoords="offset points",
                    )
                continue
            ax.scatter(
                [r.text_tokens_per_s],
                [r.accuracy],
                marker=markers[r.batch],
                s=55,
                color=colours[r.config],
                label=r.config + (f", batch {r.batch}" if many else ""),
                zorder=2,
            )
        rates = [r.text_tokens_per_s for r in rows if r.text_tokens_per_s > 0]
        if rates and max(rates) > 10 * min(rates):
            from matplotlib.ticker import LogLocator, ScalarFormatter

            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(ScalarFormatter())  # 10, 100: plain numbers, labels at 1-2-5 only
            ax.xaxis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))
            ax.xaxis.set_minor_formatter(ScalarFormatter())
        ax.set_title(f"gen length {n}")
        ax.set_xlabel("text tokens/s (tokens before the first EOS, per second)")
        ax.set_ylabel("accuracy (mean over tasks)")
        ax.set_ylim(-0.05, 1.05)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    import textwrap

    fig.suptitle(textwrap.fill(report.title, 110), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_load_curve(records: list[ServingRecord], path: str | Path) -> Path:
    """`unmask loadtest --plot`: tokens/s against p95 latency, one line per served name through its concurrencies
    (each point labelled with it), every model on one chart; cells without both measurements are left off."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = [r for r in records if r.tokens_per_s is not None and r.latency_p95_s is not None]
    if not drawn:
        raise ValueError("plot_load_curve: no record has both tokens/s and a p95 latency to plot")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for name in dict.fromkeys(r.served_as or r.model for r in drawn):
        mine = sorted((r for r in drawn if (r.served_as or r.model) == name), key=lambda r: r.concurrency)
        # every drawn record has both (the filter above)
        xs = [r.latency_p95_s * 1e3 for r in mine if r.latency_p95_s is not None]
        ys = [r.tokens_per_s for r in mine if r.tokens_per_s is not None]
        ax.plot(xs, ys, marker="o", label=f"{name} ({mine[0].model})" if mine[0].model != name else name)
        for r, x, y in zip(mine, xs, ys):
            ax.annotate(f"c={r.concurrency}", (x, y), fontsize=7, xytext=(4, 4), textcoords="offset points")
    ax.set_xlabel("p95 latency (ms per request)")
    ax.set_ylabel("answer tokens/s (all requests in flight)")
    ax.set_title("Throughput vs p95 latency under load")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
