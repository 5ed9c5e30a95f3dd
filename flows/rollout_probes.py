"""The rollout's probes: held-out prompts with known answers sent through the route while a step serves
(evals/canary_probes.py sends and grades them; here only which user keys the sticky split puts on which arm)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from evals.canary_probes import ProbeSender
from flows.rollout_state import RolloutState, evidence
from gates.serving_policy import bucket, pick_arm

MAX_KEY_TRIES = 10_000


def key_on(route: str, split: tuple[tuple[str, int], ...], arm: str, i: int) -> str | None:
    """A user key the route's sticky split (these weights, in this order) sends to `arm`; None when it has no
    weight (the probe then goes to that arm's alias directly)."""
    if not dict(split).get(arm):
        return None
    for j in range(MAX_KEY_TRIES):
        key = f"unmask-probe-{i}-{j}"
        if pick_arm(split, bucket(key, route)) == arm:
            return key
    return None


@contextlib.contextmanager
def probes_for(state: RolloutState) -> Iterator[ProbeSender | None]:
    """Probes into `state`'s route while the block runs, when its policy asks for them and a server is known."""
    probes = (state.policy or {}).get("probes")
    if not probes or not state.server_url:
        yield None
        return
    split = ((state.candidate, state.weight), (state.baseline, 100 - state.weight))  # the overlay's order
    with contextlib.closing(evidence()) as store:  # the servers' evidence store, where the analyses read both
        sender = ProbeSender(
            state.server_url,
            state.route,
            probes["task"],
            (state.candidate, state.baseline),
            probes["per_s"],
            lambda arm, i: key_on(state.route, split, arm, i),
            store,
            probes.get("max_tokens"),
            seed=len(state.analyses),
        )
        with sender:
            yield sender
