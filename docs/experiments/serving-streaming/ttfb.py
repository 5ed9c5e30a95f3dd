"""Time to the first streamed text vs the full answer, side by side in one run.

    PYTHONPATH=. .venv/bin/python docs/experiments/serving-streaming/ttfb.py

Starts `unmask serve`'s app on loopback over a scratch registry of the bundled tiny models (the
serving tests' fixture, tests/support/serving_fixtures.py), streams 8 arith answers of up to 64 tokens per
row through the `openai` client, and prints medians of the client's time to the first non-empty
text chunk, the time to the whole answer, their ratio and the number of content chunks. tiny-llada
runs at equal NFE (32 steps) as one block of 64 and as blocks of 8, so only when blocks finish
changes; tiny-ar streams a token at a time.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import openai  # noqa: E402

from tests.support.serving_fixtures import PROMPTS, running_server, settings_for, shared_serving_registry  # noqa: E402

RUNS = [("production", "tiny-llada, 1 block of 64", {"unmask": {"block_length": 64}}),
        ("production", "tiny-llada, blocks of 8", {"unmask": {"block_length": 8}}),
        ("fallback", "tiny-ar", None)]


def main(requests: int = 8) -> None:
    with running_server(settings_for(shared_serving_registry().tracking_uri)) as server:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=60)
        print("| decoding | time to first text (s) | full answer (s) | first / full | content chunks |")
        print("|---|---|---|---|---|")
        for alias, label, extra in RUNS:
            first, full, chunks = [], [], []
            for i in range(requests):
                start, seen, count = time.perf_counter(), None, 0
                for chunk in client.completions.create(model=alias, prompt=PROMPTS[i % len(PROMPTS)], stream=True,
                                                       max_tokens=64, extra_body=extra):
                    if chunk.choices and chunk.choices[0].text:
                        count += 1
                        seen = seen or time.perf_counter() - start
                full.append(time.perf_counter() - start)
                first.append(seen)
                chunks.append(count)
            f, t = statistics.median(first), statistics.median(full)
            print(f"| {label} | {f:.3f} | {t:.3f} | {f / t:.2f} | {statistics.median(chunks):g} |")


if __name__ == "__main__":
    main()
