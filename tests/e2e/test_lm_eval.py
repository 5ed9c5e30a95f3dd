"""lm-evaluation-harness against a real uvicorn server: its `local-completions` model on local task files built
from the bundled arith task, a multiple-choice (loglikelihood) one and a generate_until one. What lm-eval
measures through the server equals unmask's own in-process figures: the likelihood accuracy and every
choice's log-likelihood (`evals.multiple_choice`; for masked diffusion its left-to-right method, which is what
the echoed token values add up to), and each generated answer (the project's own decode)."""

from __future__ import annotations

import dataclasses

import pytest

from evals.multiple_choice import choice_items, likelihood_accuracy, write_lm_eval_tasks
from evals.tasks import get_task, make_split, strict_match
from models.loading import resolve_model_path
from sampler.decode import decode_prompts
from serving.decoding import Limits, choice_of, operating_config, request_config
from tests.support.serving_fixtures import OPERATING, running_server, settings_for, shared_serving_registry

SAMPLES = 3  # Monte Carlo samples per split when tiny-llada scores an echoed prompt (server default here)
ITEMS = 4


def run_lm_eval(server, alias: str, model: str, tasks: list[str], folder):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    args = {
        "base_url": f"{server.base_url}/v1/completions",
        "model": alias,
        "tokenizer": str(resolve_model_path(model)),
        "tokenizer_backend": "huggingface",
        "tokenized_requests": False,
        "num_concurrent": 1,
        "max_retries": 1,
        "max_length": 640,
        "timeout": 120,
    }
    return simple_evaluate(
        model="local-completions",
        model_args=args,
        tasks=tasks,
        task_manager=TaskManager(include_path=str(folder)),
        log_samples=True,
        bootstrap_iters=0,
    )


def test_lm_eval_through_the_server_equals_unmask_in_process(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    items = choice_items(n=ITEMS)
    generations = make_split(get_task("arith"), "test", ITEMS)
    tasks = write_lm_eval_tasks(tmp_path / "tasks", items, generations)
    settings = dataclasses.replace(settings_for(shared_serving_registry().tracking_uri), likelihood_samples=SAMPLES)
    with running_server(settings) as server:
        for alias, model in (("fallback", "tiny-ar"), ("production", "tiny-llada")):
            handle = server.pool.route(alias).loaded.handle
            names = list(tasks) if alias == "production" else ["unmask_arith_mc"]
            out = run_lm_eval(server, alias, model, names, tmp_path / "tasks")

            # loglikelihood multiple choice: the accuracy and each choice's log-likelihood
            # masked diffusion: lm-eval sums echoed token values, the left-to-right order's (docs/serving.md)
            own = likelihood_accuracy(handle, items, samples=SAMPLES, seed=0, method="left-to-right")
            assert out["results"]["unmask_arith_mc"]["acc,none"] == own.accuracy, alias
            docs = sorted(out["samples"]["unmask_arith_mc"], key=lambda d: d["doc_id"])
            assert len(docs) == ITEMS
            for doc, scores in zip(docs, own.scores):
                served = [resp[0][0] for resp in doc["resps"]]
                assert served == pytest.approx(scores, abs=1e-6), alias

            if alias != "production":
                continue
            # generate_until: lm-eval's answers are the project's own decode of the same request
            base, _ = operating_config(handle, OPERATING[model])
            config, keep = request_config(base, handle.kind, 32, 0.0, 1234, {}, Limits(max_tokens=128))
            gen_docs = sorted(out["samples"]["unmask_arith_gen"], key=lambda d: d["doc_id"])
            right = 0
            for doc, item in zip(gen_docs, generations):
                ids = handle.encode(item.prompt)
                generated = decode_prompts(handle, [ids], config).generated[0].tolist()
                text = choice_of(handle, generated, keep, ["\n\n", "<|endoftext|>"])["text"]
                assert doc["resps"][0][0] == text
                right += strict_match(text) == item.target
            assert out["results"]["unmask_arith_gen"]["exact_match,strict-match"] == right / ITEMS
