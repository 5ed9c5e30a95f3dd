"""The `corrupt_share` drill fault (serving/drill_corrupt.py, gates/serving_arms.py): answers that are fast,
status 200 and never right."""

from __future__ import annotations

import pytest

from gates.serving_arms import ServingPolicyError, parse_arms
from serving.drill_corrupt import MARK, corrupt_answer, garble


@pytest.mark.parametrize("text", ["#### 12", "0", "9 + 9 = 18", "abc", "", "--", "Ünïcode 7"])
def test_a_garbled_answer_is_never_the_answer(text):
    assert garble(text) != text and garble(text).strip() != text.strip()


def test_every_choice_of_a_completion_and_a_chat_answer_is_garbled_and_the_original_kept():
    completion = {"id": "c", "choices": [{"index": 0, "text": "#### 4"}], "unmask": {"arm": "staging"}}
    chat = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "sorted: abc"}}]}
    assert corrupt_answer(completion)["choices"][0]["text"] == "#### 5"
    assert corrupt_answer(completion)["unmask"] == {"arm": "staging"} and completion["choices"][0]["text"] == "#### 4"
    assert corrupt_answer(chat)["choices"][0]["message"] == {"role": "assistant", "content": "fbegrq: nop"}
    assert corrupt_answer({"choices": [{"text": "?"}]})["choices"][0]["text"] == "?" + MARK


def test_the_serving_policy_takes_corrupt_share_as_a_percent_and_names_a_bad_one():
    [spec] = parse_arms({"bad": {"alias": "staging", "faults": {"corrupt_share": 100}}}, "arms").values()
    assert spec.faults.corrupt_share == 100 and spec.faults.abort_share == 0
    with pytest.raises(ServingPolicyError, match=r"arms.bad.faults.corrupt_share: expected an integer percent"):
        parse_arms({"bad": {"alias": "staging", "faults": {"corrupt_share": 101}}}, "arms")
