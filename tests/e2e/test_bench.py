"""`unmask bench` on random-weight checkpoints: rows, JSON contract, AR row, honest skips.

Speed is never asserted; only that every row is measured and reported consistently."""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from evals.bench import BenchSetup, run_bench, variants_named
from evals.paired import round_ratio
from models import load
from tests.support.eval_fixtures import write_random_model

JSON_FIELDS = {
    "config",
    "gen_length",
    "accuracy",
    "nfe",
    "tokens_per_forward",
    "tokens_per_s",
    "speedup_vs_vanilla",
    "peak_mem_mb",
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench_models")
    return write_random_model(root / "rand-llada"), write_random_model(root / "rand-ar", causal=True, seed=1)


SMALL = dict(gen_lengths=(32, 64), block_length=16, prompts=3, reps=3, warmup=0, threads=1)


def test_rows_for_every_variant_and_length_with_vanilla_as_the_baseline(folders):
    loaded, ar = load(folders[0]), load(folders[1])
    variants = variants_named(
        ["vanilla", "dual-cache", "dual+speculative (batch 1)", "speculative (batch 1)", "early-exit", "tiny-ar"]
    )
    ticks: list[str] = []
    report = run_bench(loaded, BenchSetup(**SMALL), variants, ar_loaded=ar, tick=ticks.append)
    assert [(r.config, r.gen_length) for r in report.rows] == [(v.name, n) for n in (32, 64) for v in variants]
    # each round times every row once, in an order drawn per round: no row always goes first
    firsts = [t.split(" ", 2)[2].rsplit(" @ ", 1)[0] for t in ticks if t.startswith("rep ")][:: len(variants)]
    assert len(firsts) == 6 and len(set(firsts)) > 1, firsts
    for n in (32, 64):
        base = next(r for r in report.rows if r.config == "vanilla" and r.gen_length == n)
        for r in (r for r in report.rows if r.gen_length == n and r.config != "vanilla"):
            ratio = round_ratio(base.times_s, r.times_s)  # a reviewer's recomputation from the stored times
            assert len(r.times_s) == 3 and r.speedup_interval == (ratio.low, ratio.high)
            assert r.speedup_vs_vanilla == ratio.estimate and ratio.low <= r.speedup_vs_vanilla <= ratio.high
    for r in report.rows:
        assert JSON_FIELDS <= set(r.to_dict())
        assert 0.0 <= r.accuracy <= 1.0 and set(r.accuracy_by_task) == {"arith", "sort"}
        assert r.tokens_per_s > 0 and r.peak_mem_mb > 0 and r.nfe > 0
    vanilla = [r for r in report.rows if r.config == "vanilla"]
    assert all(r.speedup_vs_vanilla == pytest.approx(1.0) and r.nfe == r.gen_length for r in vanilla)
    spec = [r for r in report.rows if r.config == "speculative (batch 1)"]
    assert all(r.same_text_as_vanilla == 1.0 and r.acceptance_rate is not None for r in spec)  # lossless
    dual_spec = [r for r in report.rows if r.config == "dual+speculative (batch 1)"]
    assert all(r.same_text_as["dual-cache"] == 1.0 for r in dual_spec)
    assert any(
        "dual+speculative (batch 1)" in note and "fewer sequential calls than dual-cache" in note
        for note in report.notes
    )
    exits = [r for r in report.rows if r.config == "early-exit"]
    assert all(r.same_text_as_vanilla == 1.0 for r in exits)
    assert "threads 1" in report.title and "median of 3 reps" in report.title


def test_missing_ar_model_skips_its_row_with_a_note(folders):
    loaded = load(folders[0])
    report = run_bench(loaded, BenchSetup(**(SMALL | {"gen_lengths": (32,)})), variants_named(["vanilla", "tiny-ar"]))
    assert [r.config for r in report.rows] == ["vanilla"]
    assert any("tiny-ar row skipped" in n for n in report.notes)


def test_setup_and_variant_errors_name_the_setting():
    with pytest.raises(ValueError, match="reps must be >= 3"):
        BenchSetup(reps=2).check()
    with pytest.raises(ValueError, match="gen_length 100 must be a multiple of block_length 32"):
        BenchSetup(gen_lengths=(100,)).check()
    with pytest.raises(ValueError, match="unknown bench config 'fastest'"):
        variants_named(["fastest"])


def test_cli_prints_the_table_and_writes_json(folders, tmp_path):
    from flows.cli import _register_all, app

    _register_all()
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "--model",
            str(folders[0]),
            "--ar-model",
            str(folders[1]),
            "--gen-lengths",
            "32",
            "--block-length",
            "16",
            "--prompts",
            "2",
            "--reps",
            "3",
            "--warmup",
            "0",
            "--configs",
            "vanilla,parallel-threshold-0.9,tiny-ar",
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "unmask bench" in result.output and "parallel-threshold-0.9" in result.output
    data = json.loads(out.read_text())
    assert [r["config"] for r in data["rows"]] == ["vanilla", "parallel-threshold-0.9", "tiny-ar"]
    assert all(JSON_FIELDS <= set(r) for r in data["rows"])
    assert data["complete"] is True
    # Not a terminal: one progress line per pass (3 rows x 3 reps), on stderr so the table stays clean.
    progress = [line for line in result.stderr.splitlines() if line.startswith("bench pass ")]
    assert len(progress) == 9 and progress[-1].startswith("bench pass 9/9 ") and "rep 3/3" in progress[-1]
    assert sorted(line.split("] ", 1)[1] for line in progress[-3:]) == [
        f"rep 3/3 {name} @ 32" for name in ("parallel-threshold-0.9", "tiny-ar", "vanilla")
    ]  # the last round times every row once, in its drawn order
    assert "bench pass" not in result.stdout


def test_cli_rejects_a_bad_gen_length_list(folders):
    from flows.cli import _register_all, app

    _register_all()
    result = CliRunner().invoke(
        app, ["bench", "--model", str(folders[0]), "--gen-lengths", "48", "--configs", "vanilla"]
    )
    assert result.exit_code == 2 and "must be a multiple of block_length 32" in result.output


def test_on_row_gets_the_rows_of_a_length_before_the_next_length_starts(folders):
    loaded = load(folders[0])
    events = []
    report = run_bench(
        loaded,
        BenchSetup(**(SMALL | {"gen_lengths": (16, 32)})),
        variants_named(["vanilla", "dual-cache"]),
        tick=lambda label: events.append(("pass", label)),
        on_row=lambda row: events.append(("row", f"{row.config} @ {row.gen_length}")),
    )
    rows = [label for kind, label in events if kind == "row"]
    assert (
        rows
        == [f"{r.config} @ {r.gen_length}" for r in report.rows]
        == ["vanilla @ 16", "dual-cache @ 16", "vanilla @ 32", "dual-cache @ 32"]
    )
    first_32_pass = next(i for i, (kind, label) in enumerate(events) if kind == "pass" and label.endswith("@ 32"))
    assert [label for kind, label in events[:first_32_pass] if kind == "row"] == ["vanilla @ 16", "dual-cache @ 16"]
    assert report.complete and report.to_dict()["complete"] is True


def rows_in(path) -> list:
    """The rows of a bench JSON file, none while it does not exist yet (it is replaced whole, never half-written)."""
    return json.loads(path.read_text())["rows"] if path.exists() else []


def test_stopped_run_keeps_the_rows_of_the_finished_lengths(folders, tmp_path):
    """A real `unmask bench` process, piped, stopped with SIGINT once its first length is in the JSON."""
    out, log = tmp_path / "bench.json", tmp_path / "stderr.log"
    # The second length is long enough (512 steps a pass) that the run is still going when stopped.
    # A job started with `&` by a non-interactive shell (CI, nohup) inherits SIGINT ignored, and Python keeps
    # that; the child takes Ctrl-C back the way a terminal's `unmask bench` has it.
    child = (
        "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); from flows.cli import main; main()"
    )
    command = [
        sys.executable,
        "-c",
        child,
        "bench",
        "--model",
        str(folders[0]),
        "--gen-lengths",
        "16,512",
        "--block-length",
        "16",
        "--prompts",
        "2",
        "--reps",
        "3",
        "--warmup",
        "1",
        "--configs",
        "vanilla,dual-cache",
        "--json",
        str(out),
    ]
    with open(log, "w") as err:
        proc = subprocess.Popen(command, env=dict(os.environ), stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            deadline = time.monotonic() + 300
            while len(rows_in(out)) < 2 and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(rows_in(out)) == 2, (
                f"expected the JSON to hold gen 16's 2 rows while gen 512 runs, it holds "
                f"{len(rows_in(out))} (exit {proc.poll()}): {log.read_text()[-2000:]}"
            )
            proc.send_signal(signal.SIGINT)
            stdout, _ = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    stderr = log.read_text()
    assert proc.returncode == 130, stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["complete"] is False
    assert [(r["config"], r["gen_length"]) for r in data["rows"]] == [("vanilla", 16), ("dual-cache", 16)]
    assert all(JSON_FIELDS <= set(r) for r in data["rows"])
    assert data["rows"][1]["speedup_vs_vanilla"] is not None  # a row is written only once it is final
    assert f'interrupted: 2 of 4 rows finished; {out} holds them ("complete": false)' in stderr
    assert "bench pass 1/16 " in stderr and "warm-up vanilla @ 16" in stderr
    assert "vanilla" in stdout  # the table of the rows finished so far
    assert not out.with_suffix(".json.tmp").exists()


def test_cli_defaults_are_the_bench_setup_defaults_and_valid():
    from flows.commands.bench import bench_command
    from flows.commands.options import threads_rule

    options = {name: p.default.default for name, p in inspect.signature(bench_command).parameters.items()}
    setup = BenchSetup()
    setup.check()
    assert options["gen_lengths"] == ",".join(map(str, setup.gen_lengths))
    for name in ("block_length", "prompts", "reps", "warmup", "seed"):
        assert options[name] == getattr(setup, name), name
    assert options["threads"] is None and threads_rule(None)[0] == setup.threads  # the one thread rule: 1


# --- batch sizes, verdicts, AUP, the plot (issue 22) --------------------------------------------

BATCHED = dict(gen_lengths=(32, 64), block_length=16, prompts=2, reps=3, warmup=0, threads=1, batch_sizes=(1, 2))


@pytest.fixture(scope="module")
def batched_report(folders):
    loaded, ar = load(folders[0]), load(folders[1])
    variants = variants_named(
        ["vanilla", "parallel-threshold-0.9", "dual-cache", "dual+speculative (batch 1)", "tiny-ar"]
    )
    return run_bench(loaded, BenchSetup(**BATCHED), variants, ar_loaded=ar)


def test_each_batch_size_gets_its_rows_with_vanilla_of_that_batch_as_the_baseline(batched_report):
    rows = batched_report.rows
    plain = ["vanilla", "parallel-threshold-0.9", "dual-cache"]
    # the per-prompt speculative row runs once, beside the batch-1 rows; the others at each batch size
    assert [(r.config, r.gen_length, r.batch) for r in rows] == [
        (c, n, b)
        for n in (32, 64)
        for b in (1, 2)
        for c in plain + (["dual+speculative (batch 1)"] if b == 1 else []) + ["tiny-ar"]
    ]
    assert all(r.speedup_vs_vanilla == pytest.approx(1.0) for r in rows if r.config == "vanilla")
    assert all(r.same_text_as["dual-cache"] == 1.0 for r in rows if r.config == "dual+speculative (batch 1)")
    assert all("batch_sizes" in batched_report.to_dict()["setup"] and r.to_dict()["batch"] in (1, 2) for r in rows)


def test_one_verdict_line_per_length_names_the_best_config_its_speedups_ratios_to_the_ar_twin_and_aup(batched_report):
    from evals.parallelism import aup

    assert [v.split(":")[0] for v in batched_report.verdicts] == ["gen 32", "gen 64"]
    for n, line in zip((32, 64), batched_report.verdicts):
        at = {b: {r.config: r for r in batched_report.rows if r.gen_length == n and r.batch == b} for b in (1, 2)}
        vanilla = at[1]["vanilla"]
        within = [
            r
            for name, r in at[1].items()
            if name not in ("vanilla", "tiny-ar") and r.accuracy >= vanilla.accuracy - 0.01
        ]
        best = max(within, key=lambda r: r.speedup_vs_vanilla)
        assert f"best within 1 point of vanilla ({100 * vanilla.accuracy:.1f}%): {best.config} " in line, line
        assert f"{best.speedup_vs_vanilla:.1f}x at batch 1" in line
        ratios = [
            f"{at[b][best.config].text_tokens_per_s / at[b]['tiny-ar'].text_tokens_per_s:.2f}x at batch {b}"
            for b in (1, 2)
            if best.config in at[b]
        ]
        assert "text tokens/s vs AR twin: " + ", ".join(ratios) in line, line
        # AUP over the batch-1 diffusion rows (the batch does not change tokens per forward's meaning)
        diffusion = [r for r in at[1].values() if r.config != "tiny-ar"]
        expected = aup([(r.tokens_per_forward, r.accuracy) for r in diffusion])
        assert batched_report.aup[n].aup == pytest.approx(expected.aup)
        assert f"AUP {expected.aup:.1f} over {len(expected.points)} configs" in line
    saved = batched_report.to_dict()
    assert saved["verdicts"] == batched_report.verdicts and set(saved["aup"]) == {"32", "64"}
    assert saved["aup"]["32"]["labels"][0] == "vanilla" and len(saved["aup"]["32"]["points"]) == 4


def test_a_verdict_says_when_no_config_holds_vanilla_accuracy():
    from evals.bench import BenchRow
    from evals.bench_summary import verdicts

    def row(config, accuracy, speedup, tpf):
        return BenchRow(
            config=config,
            gen_length=256,
            accuracy=accuracy,
            nfe=1,
            tokens_per_forward=tpf,
            tokens_per_s=1,
            speedup_vs_vanilla=speedup,
            peak_mem_mb=1,
            text_tokens_per_s=10 * speedup,
            batch=4,
            kind="ar" if config == "tiny-ar" else "diffusion",
        )

    rows = [
        row("vanilla", 0.875, 1.0, 1.0),
        row("dual+parallel", 0.5, 20.0, 6.0),
        row("dual-cache", 0.86, 8.0, 1.0),
        row("tiny-ar", 0.875, 3.0, 1.0),
    ]
    assert verdicts(rows, tolerance=0.01) == [
        "gen 256: no config within 1 point of vanilla (87.5%); AUP 87.5 over 2 configs (vanilla alone 87.5)"
    ]
    assert verdicts(rows, tolerance=0.02)[0].startswith(
        "gen 256: best within 2 points of vanilla (87.5%): dual-cache (86.0%), 8.0x at batch 4 vs vanilla; "
        "text tokens/s vs AR twin: 2.67x at batch 4"
    )


def test_the_plot_has_one_panel_per_generation_length(batched_report, tmp_path):
    from PIL import Image

    from evals.plots import plot_bench

    path = plot_bench(batched_report, tmp_path / "bench.png")
    width, height = Image.open(path).size
    assert path.stat().st_size > 10_000 and width > 1.6 * height  # two panels side by side


def test_cli_batches_writes_json_after_every_row_prints_verdicts_and_plots(folders, tmp_path):
    """A real `unmask bench` process, piped: each `bench row` line on stderr comes after the JSON holds that row."""
    out, plot = tmp_path / "bench.json", tmp_path / "bench.png"
    command = [
        sys.executable,
        "-c",
        "from flows.cli import main; main()",
        "bench",
        "--model",
        str(folders[0]),
        "--ar-model",
        str(folders[1]),
        "--gen-lengths",
        "16,32",
        "--block-length",
        "16",
        "--prompts",
        "2",
        "--batch",
        "1,2",
        "--reps",
        "3",
        "--warmup",
        "0",
        "--configs",
        "vanilla,dual-cache,tiny-ar",
        "--json",
        str(out),
        "--plot",
        str(plot),
    ]
    proc = subprocess.Popen(command, env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    try:
        for line in proc.stderr:
            if line.startswith("bench row "):
                done, total = map(int, line.split()[2].split("/"))
                data = json.loads(out.read_text())  # whole: it is replaced, never written in place
                # after the last row's line the process may already have written the finished report
                assert len(data["rows"]) >= done and (data["complete"] is False or done == total), line
                seen.append(line.strip())
        stdout = proc.stdout.read()
        assert proc.wait(timeout=120) == 0, stdout
    finally:
        if proc.poll() is None:
            proc.kill()
    assert len(seen) == 12 and seen[0].startswith("bench row 1/12 ") and "vanilla @ 16 batch 1: accuracy " in seen[0]
    assert seen[-1].startswith("bench row 12/12 ") and "tiny-ar @ 32 batch 2" in seen[-1]
    data = json.loads(out.read_text())
    assert data["complete"] is True and len(data["rows"]) == 12 and len(data["verdicts"]) == 2
    verdict_lines = [line for line in stdout.splitlines() if line.startswith("verdict gen ")]
    assert len(verdict_lines) == 2 and all(
        "at batch 1" in v and "at batch 2" in v and "AUP" in v for v in verdict_lines
    )
    assert plot.stat().st_size > 10_000 and f"wrote {plot}" in stdout


@pytest.mark.parametrize(
    "args, named",
    [
        (["--batch", "4", "--prompts", "2"], ["batch 4 is more than the 2 prompts per task", "--prompts 4"]),
        (["--batch", "0"], ["--batch", "'0'"]),
        (["--batch", "1,x"], ["--batch", "1,x"]),
        (["--batch", "2,2"], ["batch sizes repeat: 2,2"]),
        (["--tolerance", "150"], ["tolerance must be between 0 and 100 accuracy points, got 150"]),
        (["--plot", "bench.svg"], ["--plot bench.svg", ".png"]),
    ],
)
def test_bad_bench_options_are_refused_in_one_line(args, named, folders):
    from tests.support.fuzz_fixtures import refused

    refused(["bench", "--model", str(folders[0]), "--configs", "vanilla", *args], *named)


def test_a_row_is_lossless_only_when_no_setting_can_change_the_text():
    from evals.bench import VARIANTS, Variant

    rows = {v.name: v for v in VARIANTS}
    assert rows["vanilla"].lossless and rows["early-exit"].lossless and rows["speculative+exit"].lossless
    assert not rows["dual+parallel+exit+W16"].lossless and not rows["dual-cache"].lossless
    assert not Variant("window", {"future_window": 16}).lossless  # a window changes what a forward sees
    assert not Variant("eot", {"eot_predict": "eos_run"}).lossless
    assert Variant("no window", {"future_window": 0}).lossless
