"""The generated task suite: correct answers, reproducible disjoint splits, GSM8K scoring and loading."""

from __future__ import annotations

import json
import random
import re

import pytest

from evals.tasks import (
    TASKS,
    alphabet,
    check_disjoint,
    flexible_extract,
    get_task,
    load_gsm8k,
    make_split,
    score,
    split_of,
    strict_match,
)
from evals.tasks.mixture import (
    DEFAULT_BATCH_SIZES,
    DEFAULT_WEIGHTS,
    SORT_BANDS,
    SORT_CURRICULUM_START,
    SORT_FOCUS_START,
    TrainingMixture,
    build_mixture,
    describe_mixture,
)
from models.tokenizer_build import build_char_tokenizer


@pytest.mark.parametrize("name", list(TASKS))
def test_splits_are_reproducible_and_disjoint(name):
    task = get_task(name)
    test = make_split(task, "test", 150, seed=0)
    assert test == make_split(task, "test", 150, seed=0)
    assert {i.split for i in test} == {"test"} and len({i.key for i in test}) == 150
    validation = make_split(task, "validation", 100, seed=0)
    train = make_split(task, "train", 3000, seed=0, unique=False)
    check_disjoint(train, test)
    check_disjoint(train, validation)
    assert not {i.key for i in test} & {i.key for i in validation}


def test_disjointness_check_catches_a_leak():
    task = get_task("sort")
    test = make_split(task, "test", 5)
    with pytest.raises(ValueError, match="also appears in train"):
        check_disjoint(make_split(task, "train", 5) + test[:1], test)


@pytest.mark.parametrize("name, first", [("default", 0), ("sort-focus", SORT_FOCUS_START)])
def test_training_stream_never_draws_a_heldout_problem(name, first):
    mixture = build_mixture(name, seed=0)
    heldout = {name: make_split(get_task(name), "test", 100) for name in TASKS}
    heldout_prompts = {i.prompt for items in heldout.values() for i in items}
    heldout_sums = {i.key.removeprefix("arith:") for i in heldout["arith"] + heldout["arith-ko"]}
    for step in range(first, first + 60):
        batch = mixture.batch(step)
        assert batch == mixture.batch(step)
        for prompt, answer in batch.pairs:
            assert prompt not in heldout_prompts
            if batch.group.startswith("arith"):
                a, b = re.findall(r"\d+", prompt)
                op = "+" if "+" in answer.split("\n")[0] else "-"
                assert f"{a}{op}{b}" not in heldout_sums
    # English and Korean problems share keys: a held-out sum is unseen in both languages.
    en = make_split(get_task("arith"), "test", 50)
    ko = make_split(get_task("arith-ko"), "train", 2000, unique=False)
    assert not {i.key for i in en} & {i.key for i in ko}


def test_answers_are_right():
    rng = random.Random(1)
    for _ in range(200):
        item = get_task("arith").sample(rng)
        a, op, b = re.fullmatch(r"arith:(\d+)([+-])(\d+)", item.key).groups()
        assert int(item.target) == (int(a) + int(b) if op == "+" else int(a) - int(b)) >= 0
        assert item.answer.endswith(f"\n#### {item.target}")
        # the worked line: units column, then tens column with the carry / borrow; every equation holds
        units, tens = item.answer.split("\n")[0].split(",")
        for equation in (units, tens):
            left, right = equation.split("=")
            terms = [int(t) for t in re.split(r"[+-]", left)]
            signs = [1] + [1 if c == "+" else -1 for c in re.findall(r"[+-]", left)]
            assert sum(s * t for s, t in zip(signs, terms)) == int(right), item.answer
        assert int(units.split("=")[1]) % 10 + 10 * int(tens.split("=")[1]) == int(item.target), item.answer
        assert units.split(op)[1].split("=")[0] == b[-1]  # the units column uses b's last digit
        s = get_task("sort").sample(rng)
        assert s.answer == "".join(sorted(s.prompt.removeprefix("Sort: ")))
        f = get_task("infill").sample(rng)
        terms = f.prompt.removeprefix("Fill: ").replace("?", "{}").format(*f.answer.split()).split()
        steps = {int(b) - int(a) for a, b in zip(terms, terms[1:])}
        assert len(steps) == 1
    ko = get_task("arith-ko").sample(random.Random(3))
    assert any("\uac00" <= ch <= "\ud7a3" for ch in ko.prompt)


def test_sort_answers_reach_long_generations():
    items = make_split(get_task("sort"), "test", 200)
    lengths = [len(i.answer) for i in items]
    assert max(lengths) >= 100 and min(lengths) <= 10
    bands = get_task("sort").bands
    shares = [sum(low <= n <= high for n in lengths) / len(lengths) for low, high, _ in bands]
    assert all(abs(share - expected) < 0.1 for share, (*_, expected) in zip(shares, bands)), shares


def test_every_task_character_is_in_the_tokenizer():
    tokenizer = build_char_tokenizer(alphabet())
    unk = tokenizer.token_to_id("<|unk|>")
    for name in TASKS:
        for item in make_split(get_task(name), "test", 30):
            ids = tokenizer.encode(item.prompt + item.answer, add_special_tokens=False).ids
            assert unk not in ids
            assert tokenizer.decode(ids) == item.prompt + item.answer


@pytest.mark.parametrize(
    "response,target,strict,flexible",
    [
        ("3+4=7\n#### 7", "7", True, True),
        ("He pays $1,200.\n#### 1,200.", "1200", True, True),
        ("so the answer is 42.", "42", False, True),
        ("#### 5\nthen 6", "5", True, False),
        ("no number", "3", False, False),
        ("#### -3", "-3", True, True),
    ],
)
def test_gsm8k_scoring_like_the_harness(response, target, strict, flexible):
    assert score("strict-match", response, target) is strict
    assert score("flexible-extract", response, target) is flexible


def test_extractors_normalise():
    assert strict_match("x\n#### 1,234.") == "1234"
    assert flexible_extract("a 12, then 3,400.") == "3400"
    assert strict_match("nothing") == "[invalid]"
    assert score("exact-match", " abc ", "abc")
    assert score("char-accuracy", "abcc", "abcd") == 0.75 and score("char-accuracy", "ab", "abcd") == 0.5
    with pytest.raises(ValueError, match="unknown metric"):
        score("bleu", "a", "a")


def test_gsm8k_loader_reads_real_jsonl(tmp_path):
    path = tmp_path / "gsm8k_test.jsonl"
    rows = [
        {
            "question": "Natalia sold 48 clips in April and half as many in May. How many in all?",
            "answer": "In May she sold 48/2 = <<48/2=24>>24 clips.\nIn all 48+24 = <<48+24=72>>72.\n#### 72",
        },
        {"question": "Weng earns $12 an hour. How much for 50 minutes?", "answer": "12/60*50 = 10\n#### 10"},
        {"question": "Big numbers?", "answer": "#### 1,000"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    items = load_gsm8k(path)
    assert [i.target for i in items] == ["72", "10", "1000"]
    assert items[0].prompt.startswith("Natalia") and items[0].task == "gsm8k"
    assert score("strict-match", items[0].answer, items[0].target)
    assert len(load_gsm8k(path, limit=2)) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(rows[0]) + "\n" + json.dumps({"question": "q"}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: field 'answer'"):
        load_gsm8k(bad)


def test_split_of_is_stable():
    assert split_of("arith:12+7") == split_of("arith:12+7")
    shares = [split_of(f"k{i}") for i in range(4000)]
    assert 0.03 < shares.count("test") / 4000 < 0.07


def test_a_later_phase_changes_the_weights_from_its_first_step_only():
    default = TrainingMixture(TASKS, DEFAULT_WEIGHTS, DEFAULT_BATCH_SIZES, seed=0)
    focus = build_mixture("sort-focus", seed=0)
    assert [focus.batch(s) for s in range(20)] == [default.batch(s) for s in range(20)]
    assert focus.weights_at(SORT_FOCUS_START - 1) == DEFAULT_WEIGHTS
    groups = {focus.batch(s).group for s in range(SORT_FOCUS_START, SORT_FOCUS_START + 200)}
    assert {"sort-short", "sort-mid", "sort-long"} <= groups  # the band buckets are drawn once the phase begins
    described = describe_mixture("sort-focus")  # what the model card says
    assert f"from step {SORT_FOCUS_START}: weights" in described and "2-24 letters on a 32-position canvas" in described
    assert "from step" not in describe_mixture("default")
    with pytest.raises(ValueError, match="unknown training mixture 'nope'"):
        build_mixture("nope")
    with pytest.raises(ValueError, match="'sort-x' needs an entry"):
        TrainingMixture(TASKS, DEFAULT_WEIGHTS, DEFAULT_BATCH_SIZES, phases=((5, {"sort-x": 1.0}),))


def test_the_sort_curriculum_scores_canvas_keeps_arith_and_moves_to_longer_bands():
    curriculum = build_mixture("sort-curriculum", seed=0)
    assert curriculum.weights_at(SORT_CURRICULUM_START - 1) == DEFAULT_WEIGHTS
    phases = [weights for _, weights in curriculum.phases]
    assert curriculum.phases[0][0] == SORT_CURRICULUM_START
    for weights in phases:
        assert sum(weights.values()) == pytest.approx(1.0)
        assert min(weights["arith"], weights["arith-ko"], weights["infill"]) > 0  # nothing learned is dropped
        assert all(SORT_BANDS[n].gen_length == 128 for n in weights if n.startswith("sort-"))
    short = [w["sort-short128"] for w in phases]
    longer = [w["sort-mid128"] + w["sort-long128"] for w in phases]
    assert short == sorted(short, reverse=True) and longer == sorted(longer) and longer[0] < longer[-1]
    drawn = {curriculum.batch(s).group for s in range(SORT_CURRICULUM_START, SORT_CURRICULUM_START + 300)}
    assert {"sort-short128", "sort-mid128", "sort-long128", "arith", "arith-ko"} <= drawn


@pytest.mark.parametrize("band", sorted(SORT_BANDS))
def test_sort_bands_fit_their_canvas_and_keep_the_split(band):
    task = SORT_BANDS[band]
    ((low, high, _),) = task.bands
    rng = random.Random(0)
    for _ in range(200):
        item = task.sample(rng)
        assert low <= len(item.answer) <= high < task.gen_length  # room for at least one EOS
        assert item.key == "sort:" + item.prompt.removeprefix("Sort: ")  # keyed like the full task
    heldout = {i.key for i in make_split(get_task("sort"), "test", 300)}
    train = make_split(task, "train", 300, unique=False)
    assert not heldout & {i.key for i in train}
