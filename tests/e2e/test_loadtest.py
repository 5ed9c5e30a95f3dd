"""`unmask loadtest` against a real uvicorn `unmask serve` on loopback, driven by the real `openai` async client.

The registry is a real MLflow SQLite store holding the bundled tiny models (tests/support/serving_fixtures.py);
records are logged to it through `registry.loadtests` and read back by the `serving` gate.
"""

from __future__ import annotations

import json
import socket

import pytest
import yaml
from fastapi import Request  # module level: FastAPI resolves the (string) annotation of a route from here

from tests.support import REPO
from tests.support.serving_fixtures import running_server, serving_registry, settings_for

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A registry of its own (records get logged into it) and a server over production and fallback."""
    registry = serving_registry(tmp_path_factory.mktemp("loadtest-registry"))
    with running_server(settings_for(registry.tracking_uri)) as running:
        running.registry = registry
        yield running


@pytest.fixture(scope="module")
def load(served):
    from evals.evaluate import load_task
    from evals.loadtest import LoadSpec, run_load

    spec = LoadSpec(
        base_url=served.base_url + "/v1", models=("production", "fallback"), concurrency=(4,), requests=8, max_tokens=16
    )
    events = []
    result = run_load(
        spec,
        [i.prompt for i in load_task("arith", "test", 8).items],
        on_event=lambda kind, info: events.append((kind, info)),
    )
    return result, events


def test_every_model_and_level_is_measured_with_exact_answers_under_concurrency(load):
    result, events = load
    assert [(c.model, c.concurrency) for c in result.cells] == [
        ("production", 1),
        ("production", 4),
        ("fallback", 1),
        ("fallback", 4),
    ]
    for cell in result.cells:
        assert len(cell.answers) == 8 and cell.errors == 0
        assert cell.latency(50) <= cell.latency(95) <= cell.latency(99)
        assert cell.tokens_per_s > 0 and cell.requests_per_s > 0
        assert all(a.tokens is not None and 0 < a.tokens <= 16 for a in cell.answers)
    # the server batches concurrent requests, and its answers do not depend on the batch
    assert result.cell("production", 4).same_answer_share == 1.0
    assert result.cell("fallback", 4).same_answer_share == 1.0
    assert sum(kind == "answer" for kind, _ in events) == 32
    assert [info["concurrency"] for kind, info in events if kind == "cell"] == [1, 1, 4, 4]  # both models per level


def test_both_models_are_loaded_round_by_round_so_their_ratio_is_paired(load):
    from evals.loadtest import serving_records

    result, _ = load
    runs = {cell.paired_run for cell in result.cells}
    assert len(runs) == 1 and "" not in runs  # one paired load test
    for level, rounds in ((1, 4), (4, 2)):  # 8 requests: 4 blocks of 2 solo, 2 blocks of 4 at 4 in flight
        mine, theirs = result.cell("production", level), result.cell("fallback", level)
        assert len(mine.blocks) == len(theirs.blocks) == rounds
        assert sum(b["answered"] for b in mine.blocks) == len(mine.ok) == 8
        assert sum(b["tokens"] for b in mine.blocks) == sum(a.tokens for a in mine.ok)
        assert sum(b["wall_s"] for b in mine.blocks) == pytest.approx(mine.wall_s, rel=1e-4)  # the blocks add up
        assert all(a["first"] != b["first"] for a, b in zip(mine.blocks, theirs.blocks))  # one opens each round
    [mine, theirs] = [r for r in serving_records(result) if r.concurrency == 4]
    ratio = mine.tokens_per_s_against(theirs)
    assert ratio is not None and ratio.low <= ratio.estimate <= ratio.high


def test_a_server_that_refuses_streaming_is_measured_plain_and_says_ttfb_is_latency(load):
    result, _ = load
    served = {cell.mode for cell in result.cells}
    if served == {"plain"}:  # this release of `unmask serve` answers stream=true with a 400
        assert any("refused streaming" in note and "TTFB is the whole latency" in note for note in result.notes)
        for cell in result.cells:
            assert all(a.ttfb_s == a.latency_s for a in cell.answers)
    else:  # a server that streams: the first byte comes before the last
        for cell in result.cells:
            assert all(a.ttfb_s <= a.latency_s for a in cell.answers)


def test_records_name_the_version_that_answered_and_round_trip_through_mlflow(load, served):
    from evals.loadtest import serving_records
    from registry import Registry
    from registry.loadtests import log_serving_record
    from registry.loadtests import serving_records as read_records
    from tests.support.serving_fixtures import digest

    result, _ = load
    records = serving_records(result, {"host": "test"})
    llada = [r for r in records if r.served_as == "production"]
    assert {(r.model, r.version) for r in llada} == {("tiny-llada", served.registry.versions["tiny-llada"])}
    assert all(r.weights_sha256 == digest("tiny-llada") for r in llada)
    registry = Registry(served.registry.tracking_uri)
    for record in records:
        log_serving_record(registry, record)
    back = read_records(registry, "tiny-llada", served.registry.versions["tiny-llada"])
    assert [r.concurrency for r in back] == [1, 4]
    assert back[1].latency_p95_s == llada[1].latency_p95_s and back[1].same_answer_share == 1.0 and back[1].run_id
    # the evidence gates judge carries them
    from registry import load_evidence

    evidence = load_evidence(registry, "tiny-llada", served.registry.versions["tiny-llada"])
    assert [r.concurrency for r in evidence.serving] == [1, 4]


def test_a_record_edited_in_mlflow_is_refused_by_name(load, served, tmp_path):
    from dataclasses import replace

    from evals.loadtest import serving_records
    from registry import EvidenceTampered, Registry
    from registry.loadtests import ARTIFACT, log_serving_record
    from registry.loadtests import serving_records as read_records

    result, _ = load
    registry = Registry(served.registry.tracking_uri)
    record = replace(serving_records(result)[3], concurrency=7)  # fallback, a level of its own
    logged = log_serving_record(registry, record)
    forged = json.loads(json.dumps(logged.to_dict())) | {"error_rate": 0.0, "latency_p95_s": 0.001}
    path = tmp_path / "record.json"
    path.write_text(json.dumps(forged))
    registry.client.log_artifact(logged.run_id, str(path), ARTIFACT.rsplit("/", 1)[0])
    with pytest.raises(EvidenceTampered, match="serving/record.json"):
        read_records(registry, "tiny-ar", served.registry.versions["tiny-ar"])


def test_a_record_naming_weights_the_version_does_not_hold_is_not_logged(load, served):
    from dataclasses import replace

    from evals.loadtest import serving_records
    from registry import Registry
    from registry.connection import RegistryError
    from registry.loadtests import log_serving_record

    result, _ = load
    record = replace(serving_records(result)[0], weights_sha256="f" * 64)
    with pytest.raises(RegistryError, match="not logged"):
        log_serving_record(Registry(served.registry.tracking_uri), record)


def test_a_name_the_server_does_not_serve_is_counted_as_errors_not_raised(served):
    from evals.loadtest import LoadSpec, run_load, serving_records

    result = run_load(
        LoadSpec(base_url=served.base_url + "/v1", models=("staging",), concurrency=(2,), requests=3),
        ["A box has 9 coins. Zoe takes 3. How many remain?"],
    )
    assert [c.error_rate for c in result.cells] == [1.0, 1.0]
    assert (
        "HTTP 404" in result.cells[0].error_messages()[0]
        and "'staging' is not served here" in result.cells[0].error_messages()[0]
    )
    assert any(note.startswith("staging: ") for note in result.notes)  # streaming refused, or the probe failed
    assert [r.version for r in serving_records(result)] == ["", ""]  # nothing answered: no version to log against


def _cli(*args, env=None):
    from typer.testing import CliRunner

    from tests.support.flow_fixtures import cli_app

    return CliRunner().invoke(cli_app("loadtest"), ["loadtest", *args], env=env)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--concurrency", "0"], "--concurrency: 0 is not a positive integer"),
        (["--concurrency", "1,x"], "--concurrency '1,x': expected comma-separated positive integers"),
        (["--requests", "-3"], "--requests: -3 is not a positive integer"),
        (["--duration", "0"], "--duration: 0.0 is not a positive number"),
        (["--endpoint", "embeddings"], "--endpoint: 'embeddings'; expected one of completions, chat"),
        (
            ["--api-key-env", "UNMASK_TEST_NO_SUCH_KEY"],
            "--api-key-env UNMASK_TEST_NO_SUCH_KEY: the environment variable",
        ),
    ],
)
def test_bad_arguments_exit_2_with_one_line(args, message):
    result = _cli("--url", "http://127.0.0.1:9/v1", *args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.output


def test_a_remote_endpoint_is_loaded_but_its_batching_cap_is_said_to_be_unknown(served, tmp_path):
    plot = tmp_path / "curve.png"
    result = _cli(
        "--url",
        served.base_url + "/v1",
        "--model",
        "fallback",
        "--concurrency",
        "1,2",
        "--requests",
        "2",
        "--max-tokens",
        "4",
        "--no-log",
        "--plot",
        str(plot),
        env={"COLUMNS": "220"},
    )
    assert result.exit_code == 0, result.output
    assert "batching cap: unknown (the model behind --url is not in this process" in result.output
    [row] = [line for line in result.output.splitlines() if line.startswith("│ fallback") and "unknown" in line]
    assert row.split("│")[2].strip() == "2"
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_an_unreachable_url_exits_2_naming_it():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = _cli("--url", f"http://127.0.0.1:{port}/v1", "--requests", "2")
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and f"error: http://127.0.0.1:{port}/v1: cannot connect" in lines[0]


def test_the_command_serves_the_registry_itself_logs_records_and_the_serving_gate_reads_them(tmp_path, monkeypatch):
    """Without --url: `unmask serve`'s app on a free port over the registry, a table, JSON, MLflow records."""
    from gates import evaluate_gates, parse_policy
    from registry import Registry, load_evidence

    registry = serving_registry(tmp_path / "registry")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", registry.tracking_uri)
    monkeypatch.setenv("COLUMNS", "220")
    out = tmp_path / "load.json"
    result = _cli(
        "--model",
        "production",
        "--model",
        "fallback",
        "--concurrency",
        "1,4",
        "--requests",
        "8",
        "--max-tokens",
        "8",
        "--json",
        str(out),
    )
    assert result.exit_code == 0, result.output
    assert "tokens/s vs fallback" in result.output and "tiny-llada/" in result.output
    assert "logged 4 serving record(s) to MLflow" in result.output
    written = json.loads(out.read_text())
    assert [(r["served_as"], r["concurrency"]) for r in written["records"]] == [
        ("production", 1),
        ("production", 4),
        ("fallback", 1),
        ("fallback", 4),
    ]
    assert all(r["run_id"] and r["error_rate"] == 0.0 for r in written["records"])

    reg = Registry(registry.tracking_uri)
    llada = load_evidence(reg, "tiny-llada", registry.versions["tiny-llada"])
    ar = load_evidence(reg, "tiny-ar", registry.versions["tiny-ar"])
    stage = yaml.safe_load(open("gates/policy.yaml"))["stages"]["poc"]
    policy = parse_policy(
        {
            "stages": {
                s: stage
                | {
                    "gates": {
                        "serving": {
                            "concurrency": 4,
                            "p95_s_max": 600.0,
                            "error_rate_max": 0.0,
                            "throughput_vs_fallback_min": 0.0,
                        }
                    }
                }
                for s in ("poc", "staging", "production")
            }
        }
    )
    [gate] = evaluate_gates(llada, policy, "staging", {"fallback": ar})
    assert gate.passed, gate.reason
    assert gate.value["error_rate"] == 0.0 and gate.value["throughput_vs_fallback"] > 0
    assert "paired: 2 rounds" in gate.reason and len(gate.evidence["throughput_ci95"]) == 2
    assert gate.evidence["serving_run_id"] == llada.serving[1].run_id


def test_the_gpu_script_runs_its_cpu_smoke_mode_end_to_end(tmp_path):
    """docs/experiments/serving-batching/gpu.py --smoke: build, register, serve, load at 1 and 16 in flight, static,
    continuous and at the span point."""
    import importlib.util

    path = REPO / "docs" / "experiments" / "serving-batching" / "gpu.py"
    spec = importlib.util.spec_from_file_location("gpu_serve", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    summary = module.main(["--smoke", "--requests", "4", "--out", str(tmp_path)])
    assert set(summary["modes"]) == {"static", "continuous", "static, dual cache + span"}
    assert summary["continuous_vs_static_16"] > 0 and summary["span_vs_static_16"] > 0
    for mode in summary["modes"].values():
        assert set(mode["tokens_per_s"]) == {"1", "16"} and all(v > 0 for v in mode["tokens_per_s"].values())
        assert mode["errors"] == {"1": 0.0, "16": 0.0} and mode["same_answer_share_16"] == 1.0
    assert json.loads((tmp_path / "gpu-loadtest.json").read_text())["shape"] == "smoke"


def test_evidence_registered_with_serving_records_keeps_them_with_its_version_and_refuses_other_weights(tmp_path):

    from registry import load_evidence, register_evidence
    from registry.connection import RegistryError
    from tests.support.gate_fixtures import evidence, fresh_registry, serving_record

    reg = fresh_registry(tmp_path)
    version, logged = register_evidence(reg, evidence(serving=[serving_record(concurrency=4), serving_record()]))
    assert [(r.version, r.concurrency) for r in load_evidence(reg, "tiny-llada", version).serving] == [
        (version, 4),
        (version, 16),
    ]
    assert all(r.run_id and r.run_id != "serving-tiny-llada" for r in logged.serving)
    with pytest.raises(RegistryError, match="a serving record measured weights ffffffffffff"):
        register_evidence(reg, evidence("tiny-ar", serving=[serving_record("tiny-ar", weights_sha256="f" * 64)]))
    assert "tiny-ar" not in reg.model_names()  # refused before anything was written


def streaming_engine(include_usage: bool):
    """A small OpenAI-style SSE server (FastAPI on uvicorn): three chunks 50 ms apart, usage on request.

    `unmask serve` does not stream in this release; this stands in for a server that does, so the
    streamed path (TTFB before the last byte, usage from the final chunk) runs against real SSE.
    """
    import asyncio

    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, StreamingResponse

    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "streamer", "object": "model", "created": 0, "owned_by": "test"}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        if "stream_options" in body and not include_usage:
            return JSONResponse(
                {
                    "error": {
                        "message": "stream_options: unknown field",
                        "type": "invalid_request_error",
                        "param": "stream_options",
                        "code": None,
                    }
                },
                status_code=400,
            )
        pieces = ["12", " + ", "30"]

        def chunk(text, usage=None, choices=True):
            data = {
                "id": "c",
                "object": "text_completion",
                "created": 0,
                "model": "streamer",
                "choices": [{"index": 0, "text": text, "finish_reason": None, "logprobs": None}] if choices else [],
            }
            if usage:
                data["usage"] = usage
            return f"data: {json.dumps(data)}\n\n"

        async def events():
            for piece in pieces:
                yield chunk(piece)
                await asyncio.sleep(0.05)
            if body.get("stream_options", {}).get("include_usage"):
                yield chunk("", {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}, choices=False)
            yield "data: [DONE]\n\n"

        if body.get("stream"):
            return StreamingResponse(events(), media_type="text/event-stream")
        return {
            "id": "c",
            "object": "text_completion",
            "created": 0,
            "model": "streamer",
            "choices": [{"index": 0, "text": "".join(pieces), "finish_reason": "stop", "logprobs": None}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
        }

    return app


@pytest.mark.parametrize("include_usage, mode", [(True, "stream+usage"), (False, "stream")])
def test_a_streaming_server_gives_ttfb_before_the_last_byte_and_usage_when_it_sends_it(include_usage, mode):
    import asyncio
    import threading

    import uvicorn

    from evals.loadtest import LoadSpec, run_load
    from tests.support.servers import free_port, wait_healthy

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(streaming_engine(include_usage), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    try:
        wait_healthy(f"http://127.0.0.1:{port}/v1/models", timeout_s=30)
        result = run_load(
            LoadSpec(base_url=f"http://127.0.0.1:{port}/v1", models=("streamer",), concurrency=(2,), requests=2),
            ["one", "two"],
        )
    finally:
        server.should_exit = True
        thread.join(10)
    assert {c.mode for c in result.cells} == {mode} and not result.notes, result.notes
    for cell in result.cells:
        assert cell.errors == 0 and cell.streamed
        # the first piece is read before the server's two pauses end: first byte strictly before the last
        assert all(a.text == "12 + 30" and a.ttfb_s < a.latency_s for a in cell.answers)
        if include_usage:
            assert all(a.tokens == 3 for a in cell.answers) and cell.tokens_per_s > 0
        else:  # no usage in the stream: tokens are unknown, so no tokens/s rather than a guess
            assert all(a.tokens is None for a in cell.answers) and cell.tokens_per_s is None
    assert result.cell("streamer", 2).same_answer_share == 1.0


def _answered(base_url: str) -> float:
    """Requests the server has answered so far (its /metrics)."""
    import httpx

    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("unmask_requests_total"))


def _stopped_once_answering(base_url: str, argv: list[str], received: str) -> tuple[int, str, str]:
    """Start `argv` (a load on the server at `base_url`), send it `received` once the server has answered 3 more
    requests, and wait for it: (exit code, stdout, stderr)."""
    import os
    import signal
    import subprocess
    import time

    before = _answered(base_url)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    load = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while _answered(base_url) < before + 3 and time.monotonic() < deadline and load.poll() is None:
            time.sleep(0.2)
        load.send_signal(getattr(signal, received))
        out, err = load.communicate(timeout=120)
    finally:
        load.kill()
    return load.returncode, out, err


@pytest.mark.parametrize("received", ["SIGTERM", "SIGINT"])
def test_a_load_stopped_by_a_signal_reports_and_writes_what_it_measured(served, tmp_path, received):
    """A load sized for minutes, stopped once answers flow: it sends nothing more, exits 0, and its JSON names the
    signal and holds the answers measured (fewer than asked)."""
    import sys
    import time

    report = tmp_path / "load.json"
    code, out, err = _stopped_once_answering(
        served.base_url,
        [sys.executable, "-c", "from flows.cli import main; main()", "loadtest", "--url", served.base_url + "/v1"]
        + ["--model", "production", "--concurrency", "2", "--requests", "300", "--max-tokens", "4", "--no-log"]
        + ["--no-stream", "--json", str(report)],
        received,
    )
    output = out + err
    assert code == 0, output
    written = json.loads(report.read_text())
    assert written["stopped"] == received and any(received in note for note in written["notes"])
    answered = [r["requests"] for r in written["records"]]
    assert written["records"] and 0 < sum(answered) < 300, answered
    assert f"stopped early by {received}" in output
    settled = _answered(served.base_url)
    time.sleep(1.0)
    assert _answered(served.base_url) == settled  # nothing is sent after it ended


def test_a_signal_to_a_load_measured_from_a_child_process_stops_the_child_and_returns_its_result(served, tmp_path):
    """`run_load_apart` (the client in a process of its own, as without --url): SIGTERM to the parent is passed on,
    the child stops and sends what it measured, and the parent returns it."""
    import sys

    script = tmp_path / "apart.py"
    script.write_text(
        "import json, sys\n"
        "from evals.load_process import run_load_apart\n"
        "from evals.loadtest import LoadSpec\n"
        f"spec = LoadSpec(base_url={served.base_url + '/v1'!r}, models=('production',), concurrency=(1,), "
        "requests=300, max_tokens=4, stream=False)\n"
        "result = run_load_apart(spec, ['1+1=', '2+2='])\n"
        "print(json.dumps({'stopped': result.stopped, 'answers': sum(len(c.answers) for c in result.cells)}))\n"
    )
    code, out, err = _stopped_once_answering(served.base_url, [sys.executable, str(script)], "SIGTERM")
    assert code == 0, err
    told = json.loads(out.strip().splitlines()[-1])
    assert told["stopped"] == "SIGTERM" and 0 < told["answers"] < 300, told
