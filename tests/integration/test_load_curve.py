"""How fast serving can get, and how throughput trades against latency: the batching cap measured on the bundled
tiny models (`evals.batching_cap`), and one real small `unmask loadtest` (its own server over a real MLflow
registry) whose gain-against-cap table, throughput-vs-p95 plot, logged curve and dashboard chart are checked."""

from __future__ import annotations

import json

import pytest

from tests.support.dashboard_pages import app_test
from tests.support.serving_fixtures import serving_registry

pytestmark = pytest.mark.timeout(300)
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def handles():
    import models
    from models.loading import resolve_model_path

    return {name: models.load(str(resolve_model_path(name))) for name in ("tiny-llada", "tiny-ar")}


@pytest.mark.parametrize("name", ["tiny-llada", "tiny-ar"])
def test_the_cap_on_a_bundled_tiny_model_is_timed_on_its_operating_forward(handles, name):
    from evals.batching_cap import measure_cap
    from sampler.config import SamplerConfig
    from tests.support.serving_fixtures import OPERATING, PROMPTS

    handle = handles[name]
    config = SamplerConfig(**OPERATING[name]).with_(**handle.sampler_ids())
    cap = measure_cap(handle, config, [handle.encode(p) for p in PROMPTS], rows=(4,), repeats=3)
    assert set(cap.forward_s) == {1, 4} and all(s > 0 for s in cap.forward_s.values())
    assert cap.forward == ("canvas" if name == "tiny-llada" else "cached step")
    assert cap.cap(1) == 1.0 and cap.cap(4) > 0
    if name == "tiny-llada":  # four canvases are four times the work: far from the bound whatever the host does
        assert cap.cap(4) <= 4


@pytest.mark.parametrize("name", ["tiny-llada", "tiny-ar", "tiny-dgemma"])
def test_the_decode_cap_times_whole_decodes_of_every_kind(handles, name):
    """A batch's whole decode against each of its prompts decoded alone: block diffusion, whose forward cap is
    not measured, has a decode cap too."""
    import models
    from evals.batching_cap import measure_cap, measure_decode_cap
    from models.loading import resolve_model_path
    from sampler.config import SamplerConfig
    from tests.support.serving_fixtures import OPERATING, PROMPTS

    handle = handles.get(name) or models.load(str(resolve_model_path(name)))
    config = SamplerConfig(**OPERATING.get(name, OPERATING["tiny-llada"])).with_(**handle.sampler_ids())
    cap = measure_decode_cap(handle, config, [handle.encode(p) for p in PROMPTS], rows=(4,), repeats=1)
    assert set(cap.forward_s) == {1, 4} and all(s > 0 for s in cap.forward_s.values()) and cap.forward == "decode"
    assert cap.cap(1) == 1.0 and 0 < cap.cap(4) < 16
    if name == "tiny-dgemma":
        with pytest.raises(ValueError, match="block diffusion decodes through its own encoder/decoder calls"):
            measure_cap(handle, config, [handle.encode(p) for p in PROMPTS], rows=(4,), repeats=1)
    with pytest.raises(ValueError, match="measure_decode_cap: no prompts"):
        measure_decode_cap(handle, config, [])


def test_no_prompts_is_refused_by_name(handles):
    from evals.batching_cap import measure_cap
    from sampler.config import SamplerConfig

    with pytest.raises(ValueError, match="measure_cap: no prompts"):
        measure_cap(handles["tiny-ar"], SamplerConfig(), [])


def test_the_gain_of_each_loaded_level_is_read_against_the_cap_at_the_rows_it_batches():
    from evals.batching_cap import BatchingCap, cap_rows, gains_against_caps
    from tests.support.gate_fixtures import serving_record

    records = [serving_record(concurrency=c, tokens_per_s=rate) for c, rate in ((1, 100.0), (4, 200.0), (32, 300.0))]
    cap = BatchingCap({1: 0.01, 4: 0.02, 16: 0.04}, "canvas")  # cap 2x at 4 rows, 4x at 16
    decoded = BatchingCap({1: 0.1, 4: 0.25, 16: 0.8}, "decode")  # a whole decode: 1.6x at 4 rows, 2x at 16
    four, many = gains_against_caps(records, {"production": cap}, max_batch=16, decode_caps={"production": decoded})
    assert (four.concurrency, four.gain, four.cap, four.share) == (4, 2.0, 2.0, 1.0)
    assert (many.concurrency, many.gain, many.cap, many.share) == (32, 3.0, 4.0, 0.75)  # 32 in flight: batches of 16
    assert (four.decode_cap, four.decode_share) == (pytest.approx(1.6), pytest.approx(1.25))
    assert (many.decode_cap, many.decode_share) == (pytest.approx(2.0), pytest.approx(1.5))
    assert gains_against_caps(records, {"production": cap}, max_batch=16)[0].decode_share is None
    [remote] = gains_against_caps(records[:2], {}, max_batch=16)
    assert remote.gain == 2.0 and remote.cap is None and remote.share is None
    assert cap_rows([1, 2, 32], max_batch=16) == (1, 2, 16)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """`unmask loadtest` serving a fresh registry itself: production and fallback at 1 and 2 in flight, 4 requests."""
    from typer.testing import CliRunner

    from tests.support.flow_fixtures import cli_app

    root = tmp_path_factory.mktemp("load-curve")
    registry = serving_registry(root / "registry")
    plot = root / "out" / "curve.png"
    result = CliRunner().invoke(
        cli_app("loadtest"),
        [
            "loadtest",
            "--model",
            "production",
            "--model",
            "fallback",
            "--concurrency",
            "1,2",
            "--requests",
            "4",
            "--max-tokens",
            "8",
            "--plot",
            str(plot),
            "--json",
            str(root / "load.json"),
        ],
        env={"MLFLOW_TRACKING_URI": registry.tracking_uri, "UNMASK_HOME": str(root / "home"), "COLUMNS": "220"},
    )
    assert result.exit_code == 0, result.output
    return registry, result.output, plot, json.loads((root / "load.json").read_text())["records"]


def test_the_load_test_prints_each_models_gain_against_its_cap_and_the_curve_points(loaded):
    _, output, _, records = loaded
    assert "batching gain against the cap" in output
    rows = [line for line in output.splitlines() if "at 2 rows" in line]
    assert [row.split("│")[1].strip() for row in rows] == ["production", "fallback"]
    assert all(row.rstrip(" │").endswith("%") for row in rows)
    assert "decode cap" in output and all(row.count("%") == 2 for row in rows)  # both caps measured, both shares
    # the curve's points: one results row per (model, concurrency), with its tokens/s and p95
    assert [(r["served_as"], r["concurrency"]) for r in records] == [
        ("production", 1),
        ("production", 2),
        ("fallback", 1),
        ("fallback", 2),
    ]
    assert all(r["tokens_per_s"] > 0 and r["latency_p95_s"] > 0 for r in records)
    assert "p95 (ms)" in output and "tokens/s" in output


def test_the_throughput_vs_p95_plot_is_a_png_logged_beside_the_records(loaded):
    from registry import Registry
    from registry.connection import EVALUATIONS_EXPERIMENT
    from registry.loadtests import CURVE_ARTIFACT

    registry, output, plot, records = loaded
    assert f"throughput vs p95 plot: {plot}" in output
    assert plot.read_bytes().startswith(PNG)
    reg = Registry(registry.tracking_uri)
    [run] = reg.search_runs(EVALUATIONS_EXPERIMENT, "tags.`unmask.kind` = 'serving-curve'")
    assert run.info.status == "FINISHED"
    assert run.data.tags["unmask.serving_runs"].split(",") == [r["run_id"] for r in records]
    assert reg.load_artifact_bytes(run.info.run_id, CURVE_ARTIFACT) == plot.read_bytes()


def test_the_quality_latency_page_draws_throughput_against_p95_from_the_logged_load_test(loaded, monkeypatch):
    import pandas as pd
    import pyarrow as pa

    registry, _, _, records = loaded
    monkeypatch.setenv("MLFLOW_TRACKING_URI", registry.tracking_uri)
    at = app_test()
    at.run()
    at.switch_page("views/quality_latency.py").run()
    assert not at.exception, at.exception
    assert "Throughput vs p95 under load" in [s.value for s in at.subheader]
    assert not any(i.value.startswith("No load test logged") for i in at.info)
    data = [pa.ipc.open_stream(c.proto.datasets[0].data.data).read_pandas() for c in at.get("vega_lite_chart")]
    [drawn] = [d for d in data if "p95 (ms)" in d.columns and "concurrency" in d.columns]
    want = pd.DataFrame(records)
    assert sorted(drawn.concurrency) == sorted(want.concurrency)
    assert sorted(drawn["tokens/s"]) == pytest.approx(sorted(want.tokens_per_s))
    assert sorted(drawn["p95 (ms)"]) == pytest.approx(sorted(want.latency_p95_s * 1e3))
    versions = registry.versions
    assert set(drawn.series) == {
        f"tiny-llada v{versions['tiny-llada']}",
        f"AR fallback (tiny-ar v{versions['tiny-ar']})",
    }
    assert set(drawn.label) == {"c=1", "c=2"}


def test_the_quality_latency_page_shows_the_benchmark_record_of_the_load_test(loaded, monkeypatch):
    """The same paired load test, read as the benchmark record: each side at each level with its intervals."""
    from registry import Registry
    from registry.views import benchmark_frame, latest_benchmark_records

    registry, _, _, records = loaded
    monkeypatch.setenv("MLFLOW_TRACKING_URI", registry.tracking_uri)
    expected = benchmark_frame(latest_benchmark_records(Registry(registry.tracking_uri)))
    assert sorted(zip(expected["in flight"], expected.role)) == [
        (1, "candidate"),
        (1, "fallback"),
        (2, "candidate"),
        (2, "fallback"),
    ]
    assert all(r["metric"] == "strict-match" and 0 <= r["accuracy"] <= 1 for r in records)
    at = app_test()
    at.run()
    at.switch_page("views/quality_latency.py").run()
    assert not at.exception, at.exception
    assert "Benchmark record: each candidate beside the AR fallback" in [s.value for s in at.subheader]
    assert not any(i.value.startswith("No benchmark record yet") for i in at.info)
    [table] = [d.value for d in at.dataframe if "tokens/s vs fallback" in d.value.columns]
    assert list(table["tokens/s vs fallback"][table.role == "fallback"]) == ["reference", "reference"]
    assert all("x (" in text for text in table["tokens/s vs fallback"][table.role == "candidate"])
    assert list(table.accuracy) == list(expected.accuracy)


def test_unmask_bench_at_a_concurrency_prints_the_benchmark_record_and_writes_it(tmp_path):
    """`unmask bench --concurrency`: the candidate and the fallback served here, paired, scored, with intervals."""
    from typer.testing import CliRunner

    from evals.intervals import share_interval
    from evals.paired import RatioEstimate, block_ratio
    from tests.support.flow_fixtures import cli_app

    registry = serving_registry(tmp_path / "registry")
    out = tmp_path / "bench.json"
    env = {"MLFLOW_TRACKING_URI": registry.tracking_uri, "UNMASK_HOME": str(tmp_path / "home"), "COLUMNS": "250"}
    args = ["bench", "--model", "production", "--ar-model", "fallback", "--concurrency", "1,2", "--requests", "4"]
    result = CliRunner().invoke(cli_app("bench"), [*args, "--rounds", "2", "--json", str(out)], env=env)
    assert result.exit_code == 0, result.output
    assert "benchmark record:" in result.output and "1 in flight" in result.output and "2 in flight" in result.output
    assert "arith (strict-match), 4 requests per model in 2 interleaved rounds" in result.output
    benchmarks = json.loads(out.read_text())["benchmarks"]
    assert [b["concurrency"] for b in benchmarks] == [1, 2] and len({b["paired_run"] for b in benchmarks}) == 1
    for b in benchmarks:
        candidate, fallback = b["sides"]
        assert (candidate["role"], fallback["role"]) == ("candidate", "fallback")
        assert candidate["record"]["model"] == "tiny-llada" and fallback["record"]["model"] == "tiny-ar"
        for side in (candidate["record"], fallback["record"]):
            scores = [s if s is not None else 0.0 for s in side["per_request"]["score"]]
            assert side["accuracy"] == sum(scores) / len(scores)
            assert side["intervals"]["accuracy"] == RatioEstimate(*share_interval(scores)).to_dict()
            assert set(side["intervals"]) == {
                "latency_p50_s",
                "latency_p99_s",
                "ttfb_p50_s",
                "tokens_per_s",
                "accuracy",
            }
            assert side["tokens_per_forward"] > 0 and side["run_id"]
        ratio = block_ratio(candidate["record"]["blocks"], fallback["record"]["blocks"])
        assert candidate["tokens_per_s_vs_fallback"] == ratio.to_dict()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--ar-model", ""], "--ar-model: the benchmark record sets the candidates beside the AR fallback"),
        (["--model", "fallback", "--ar-model", "fallback"], "--model: name a candidate other than the fallback"),
        (["--rounds", "1"], "--rounds 1: the intervals are read from the rounds; give at least 2"),
        (["--concurrency", "1,16", "--requests", "20"], "--requests 20: at 16 in flight that is one round"),
        (["--concurrency", "0"], "--concurrency: 0 is not a positive integer"),
    ],
)
def test_bench_at_a_concurrency_refuses_what_cannot_give_a_record_in_one_line(args, message):
    from typer.testing import CliRunner

    from tests.support.flow_fixtures import cli_app

    result = CliRunner().invoke(cli_app("bench"), ["bench", "--concurrency", "1,2", *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], result.output
