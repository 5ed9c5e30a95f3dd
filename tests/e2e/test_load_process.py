"""`evals.load_process`: a load test's client in a child process, against a real uvicorn `unmask serve` on
loopback. It measures what the client in process measures, reports its progress as it goes, and says why
when it cannot run."""

from __future__ import annotations

import sys

import pytest

from tests.support.serving_fixtures import running_server, serving_registry, settings_for

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    registry = serving_registry(tmp_path_factory.mktemp("load-process-registry"))
    with running_server(settings_for(registry.tracking_uri)) as running:
        yield running


@pytest.fixture(scope="module")
def prompts():
    from evals.evaluate import load_task

    return [item.prompt for item in load_task("arith", "test", 6).items]


def test_the_client_apart_measures_what_the_client_in_process_measures(served, prompts):
    from evals.load_process import run_load_apart
    from evals.loadtest import Answer, LoadSpec, run_load

    spec = LoadSpec(
        base_url=served.base_url + "/v1", models=("production", "fallback"), concurrency=(3,), requests=6, max_tokens=12
    )
    events = []
    apart = run_load_apart(spec, prompts, on_event=lambda kind, info: events.append((kind, info)))
    here = run_load(spec, prompts)
    assert apart.spec == spec

    def shape(result):
        return [(c.model, c.concurrency, c.mode) for c in result.cells]

    def said(cell):
        return sorted((x.prompt, x.text, x.tokens) for x in cell.answers)

    assert shape(apart) == shape(here)
    for a, b in zip(apart.cells, here.cells):
        assert a.errors == 0 and a.tokens_per_s > 0
        assert said(a) == said(b)
        assert a.served() == b.served()
    assert apart.cell("production", 3).same_answer_share == 1.0
    answers = [info["answer"] for kind, info in events if kind == "answer"]
    assert len(answers) == 24 and all(isinstance(a, Answer) and a.ok for a in answers)  # as in process: Answer objects
    assert [info["concurrency"] for kind, info in events if kind == "cell"] == [1, 1, 3, 3]


def test_a_result_round_trips_through_plain_json_types(served, prompts):
    import json

    from evals.loadtest import LoadResult, LoadSpec, run_load

    result = run_load(
        LoadSpec(base_url=served.base_url + "/v1", models=("production",), concurrency=(2,), requests=2, max_tokens=8),
        prompts,
    )
    assert LoadResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result


def test_an_unreachable_endpoint_is_the_same_load_test_error_from_the_child():
    from evals.load_process import run_load_apart
    from evals.loadtest import LoadSpec, LoadTestError

    with pytest.raises(LoadTestError, match=r"http://127\.0\.0\.1:9/v1: cannot connect"):
        run_load_apart(LoadSpec(base_url="http://127.0.0.1:9/v1", models=("production",), requests=1), ["x"])


def test_a_child_that_dies_is_an_error_naming_its_exit_status(monkeypatch):
    from evals.load_process import run_load_apart
    from evals.loadtest import LoadSpec

    monkeypatch.setattr(sys, "executable", "/bin/false")  # a child that exits at once, with nothing said
    with pytest.raises(RuntimeError, match="the load test's client process exited with 1 without a result"):
        run_load_apart(LoadSpec(base_url="http://127.0.0.1:9/v1", models=("production",), requests=1), ["x"])
