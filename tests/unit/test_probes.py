"""The teacher-forced probes score what a model predicts at the masked position, and nothing else."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from evals.probes import probe_items
from evals.tasks import TASKS, make_split
from models.loading import WEIGHTS_DIR, load

CANVAS = 32


@pytest.fixture(scope="module")
def loaded():
    return load("tiny-llada")


class Scripted(torch.nn.Module):
    """Predicts, at every position, what `rule(row, position)` says (one-hot logits)."""

    def __init__(self, vocab: int, rule):
        super().__init__()
        self.vocab, self.rule, self.anchor = vocab, rule, torch.nn.Parameter(torch.zeros(1))

    def forward(self, ids, attention_mask=None):
        B, T = ids.shape
        out = torch.full((B, T, self.vocab), -10.0)
        for b in range(B):
            for t in range(T):
                out[b, t, self.rule(ids[b].tolist(), t)] = 10.0
        return SimpleNamespace(logits=out)


def test_an_oracle_passes_every_probe_and_a_neighbour_copier_only_where_letters_repeat(loaded):
    items = make_split(TASKS["sort"], "validation", 6)
    items = [i for i in items if len(i.answer) < CANVAS]
    references = {}
    for item in items:
        prompt, answer = loaded.encode(item.prompt), loaded.encode(item.answer)
        references[len(prompt)] = (item, prompt + answer + [loaded.eos_id] * (CANVAS - len(answer)))
    assert len(references) == len(items)  # prompt lengths tell the items apart

    oracle = Scripted(loaded.config.vocab_size, lambda row, t: references[len(row) - CANVAS][1][t])
    result = probe_items(loaded.with_model(oracle), items, CANVAS)
    assert all(result[p]["accuracy"] == 1.0 for p in ("next", "hole", "end"))

    def copier(row, t):
        if t == len(row) - CANVAS:  # the first answer position: never a copy of the prompt
            return loaded.eos_id
        left = row[t - 1]
        return loaded.eos_id if left == loaded.mask_id else left

    result = probe_items(loaded.with_model(Scripted(loaded.config.vocab_size, copier)), items, CANVAS)
    repeats = sum(a == b for i in items for a, b in zip(i.answer[1:], i.answer[:-1]))
    letters = sum(len(i.answer) for i in items)
    assert result["next"] == {"right": repeats, "asked": letters, "accuracy": repeats / letters}
    assert result["hole"]["right"] == repeats and result["end"]["right"] == 0


def test_probes_refuse_a_causal_model_and_an_answer_longer_than_the_canvas(loaded):
    with pytest.raises(ValueError, match="causal model"):
        probe_items(load(str(WEIGHTS_DIR / "tiny-ar")), make_split(TASKS["sort"], "test", 1), CANVAS)
    long_item = next(i for i in make_split(TASKS["sort"], "test", 50) if len(i.answer) >= 8)
    with pytest.raises(ValueError, match="does not fit canvas 8"):
        probe_items(loaded, [long_item], 8)


def test_the_command_probes_a_sort_band_at_a_chosen_canvas(monkeypatch, capsys):
    import json

    from evals import probes

    monkeypatch.setattr(
        "sys.argv", ["probes", str(WEIGHTS_DIR / "tiny-llada"), "--task", "sort-short", "--n", "3", "--canvas", "32"]
    )
    probes.main()
    out = json.loads(capsys.readouterr().out)
    letters = sum(len(i.answer) for i in make_split(probes.SORT_BANDS["sort-short"], "validation", 3))
    assert (
        out["task"] == "sort-short"
        and out["next"]["asked"] == out["hole"]["asked"] == letters
        and out["end"]["asked"] == 3
    )
