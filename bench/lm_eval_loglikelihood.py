"""lm-eval's loglikelihood on tiny-llada through `unmask serve` against the same scores in process (issue #51, item 4).

    PYTHONPATH=. .venv/bin/python bench/lm_eval_loglikelihood.py [--items 15] [--rounds 5] [--method left-to-right]

Starts the real server on 127.0.0.1 (the tests' registry, tiny-llada as `production`) and sends, per choice of
`--items` arith multiple-choice items (4 choices each), the request lm-eval's `local-completions` sends for a
loglikelihood: the context and the choice as one text prompt, echo, logprobs 1, max_tokens 1, and sums
token_logprobs[ctxlen:-1] as lm-eval does. In process, `sampler.likelihood.likelihood` scores the same choices
(`--method`: left-to-right, what the served sum equals; elbo, the Monte Carlo bound `likelihood_accuracy` used
before). Each round times both sides once, in alternating order; prints the median seconds of each, the
served / in-process ratio with its 95% bootstrap interval over the rounds, and whether the numbers are equal.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import time
import urllib.request

from evals.intervals import bootstrap_interval
from evals.multiple_choice import choice_items
from sampler.likelihood import likelihood
from tests.support.serving_fixtures import running_server, settings_for, shared_serving_registry


def served_scores(base_url: str, handle, pairs: list[tuple[str, str]]) -> list[float]:
    """lm-eval's loglikelihood requests, one choice at a time (its default batch_size 1)."""
    out = []
    for context, choice in pairs:
        body = {"model": "production", "prompt": context + choice, "temperature": 0, "max_tokens": 1}
        body |= {"logprobs": 1, "seed": 1234, "echo": True}
        request = urllib.request.Request(
            f"{base_url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=600) as r:
            values = json.load(r)["choices"][0]["logprobs"]["token_logprobs"]
        out.append(sum(values[len(handle.encode(context)) : -1]))
    return out


def own_scores(handle, pairs: list[tuple[str, str]], samples: int, method: str) -> list[float]:
    kwargs = {"method": method} if method != "elbo" else {}  # elbo: also what the code before left-to-right reads
    return [
        likelihood(handle, handle.encode(c), handle.encode(x), samples=samples, seed=0, **kwargs).total
        for c, x in pairs
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=15, help="multiple-choice items (4 choices each)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--samples", type=int, default=8, help="Monte Carlo samples (server and in process)")
    parser.add_argument("--method", default="left-to-right", choices=["left-to-right", "elbo"])
    args = parser.parse_args()
    pairs = [(item.context, choice) for item in choice_items(n=args.items) for choice in item.choices]
    settings = dataclasses.replace(
        settings_for(shared_serving_registry().tracking_uri), likelihood_samples=args.samples
    )
    times: dict[str, list[float]] = {"server": [], "in process": []}
    with running_server(settings) as server:
        handle = server.pool.route("production").loaded.handle
        sides = {
            "server": lambda: served_scores(server.base_url, handle, pairs),
            "in process": lambda: own_scores(handle, pairs, args.samples, args.method),
        }
        scores: dict[str, list[float]] = {}
        for r in range(args.rounds):
            for side in list(sides)[:: 1 if r % 2 == 0 else -1]:  # alternate which goes first
                start = time.perf_counter()
                scores[side] = sides[side]()
                times[side].append(time.perf_counter() - start)
            print(f"round {r + 1}: " + ", ".join(f"{s} {times[s][-1]:.2f} s" for s in sides), flush=True)
    ratios = [a / b for a, b in zip(times["server"], times["in process"])]
    point, low, high = bootstrap_interval(ratios, None) or (math.nan, math.nan, math.nan)
    print(f"{len(pairs)} choices, {args.samples} samples, in process: {args.method}")
    for side, seconds in times.items():
        print(f"  {side}: median {statistics.median(seconds):.2f} s")
    print(f"  server / in process: {point:.2f}x (95% interval {low:.2f}x-{high:.2f}x over {args.rounds} rounds)")
    same = all(math.isclose(a, b, abs_tol=1e-6) for a, b in zip(scores["server"], scores["in process"]))
    print(f"  the same numbers: {same}")


if __name__ == "__main__":
    main()
