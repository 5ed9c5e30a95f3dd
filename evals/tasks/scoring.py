"""Scoring as lm-evaluation-harness does for GSM8K, plus exact match for the other tasks.

`strict-match` takes the number after the first `#### `; `flexible-extract` takes the last number
anywhere in the response. Both sides are normalised by removing `,`, `$` and a trailing `.`.
"""

from __future__ import annotations

import re

STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
INVALID = "[invalid]"


def normalise_number(text: str) -> str:
    """Drop `,` and `$`, then one trailing `.`, then surrounding space."""
    text = text.replace(",", "").replace("$", "").strip()
    return text[:-1] if text.endswith(".") else text


def strict_match(response: str) -> str:
    """The number after the first `#### `, or `[invalid]`."""
    m = STRICT.search(response)
    return normalise_number(m.group(1)) if m else INVALID


def flexible_extract(response: str) -> str:
    """The last number in the response, or `[invalid]`."""
    matches = FLEXIBLE.findall(response)
    if not matches:
        return INVALID
    last = [g for g in matches[-1] if g][0]
    return normalise_number(last)


EXTRACTORS = {"strict-match": strict_match, "flexible-extract": flexible_extract}


def char_accuracy(response: str, target: str) -> float:
    """Share of positions holding the right character, over the longer of the two strings.

    Partial credit for long answers (a sort with one duplicated letter scores near 1, exact match 0),
    so the quality curve still moves where exact match sits near zero.
    """
    response, target = response.strip(), target.strip()
    n = max(len(response), len(target))
    return sum(a == b for a, b in zip(response, target)) / n if n else 1.0


def score(metric: str, response: str, target: str) -> bool | float:
    """Whether `response` is right for `target` under `metric` (a share in [0, 1] for char-accuracy)."""
    if metric == "exact-match":
        return response.strip() == target.strip()
    if metric == "char-accuracy":
        return char_accuracy(response, target)
    if metric not in EXTRACTORS:
        raise ValueError(f"unknown metric {metric!r}; known: exact-match, char-accuracy, {', '.join(EXTRACTORS)}")
    return EXTRACTORS[metric](response) == normalise_number(target)


def mean_score(metric: str, responses: list[str | None], targets: list[str]) -> float:
    """The mean of `score` over the items (booleans count 0/1, shares as they are); a failed item
    (response None) scores 0. Every decode-and-score loop (records, bench, model report) reads this."""
    scores = [score(metric, r, t) if r is not None else 0.0 for r, t in zip(responses, targets)]
    return sum(scores) / len(scores) if scores else 0.0
