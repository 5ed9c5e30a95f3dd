"""`arith` and `arith-ko`: one-operation word problems in GSM8K format (worked line, `#### N`).

Difficulty (chosen for the two-core training budget): one operation, addition of two operands in
0-49 or subtraction a - b with 0 <= b <= a <= 99, so every number has one or two digits and no
result is negative. English and Korean share the problem keys, so a held-out problem is unseen
in both languages.

The worked line is column arithmetic, units first, carry or borrow written out:
37 + 45 -> `7+5=12,3+4+1=8` and 82 - 45 -> `12-5=7,8-1-4=3`, then `#### N`. Each step is a
one-digit fact the model can copy operands for, which is what a small model learns in budget.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from evals.tasks.base import TaskItem

NAMES_EN = ("Mia", "Tom", "Ava", "Leo", "Sam", "Zoe", "Max", "Ivy")
OBJECTS_EN = ("apple", "pen", "card", "book", "coin", "egg", "cup", "ball")
TEMPLATES_EN = {
    "+": (
        "{n} has {a} {o}s and buys {b} more. How many now?",
        "A box has {a} {o}s. {n} adds {b}. How many in the box?",
    ),
    "-": (
        "{n} has {a} {o}s and gives away {b}. How many left?",
        "A box has {a} {o}s. {n} takes {b}. How many remain?",
    ),
}
# Names end in a vowel so the particles 는/가 are always right.
NAMES_KO = ("민수", "지아", "서아", "하루", "유나", "도하", "준서", "지우")
OBJECTS_KO = ("사과", "연필", "사탕", "공", "책", "동전", "카드", "달걀")
TEMPLATES_KO = {
    "+": (
        "{n}는 {o} {a}개가 있고 {b}개를 더 샀다. 모두 몇 개?",
        "상자에 {o} {a}개가 있다. {n}가 {b}개를 넣었다. 모두 몇 개?",
    ),
    "-": (
        "{n}는 {o} {a}개가 있고 {b}개를 주었다. 남은 것은 몇 개?",
        "상자에 {o} {a}개가 있다. {n}가 {b}개를 꺼냈다. 남은 것은 몇 개?",
    ),
}
LANGUAGES = {"en": (NAMES_EN, OBJECTS_EN, TEMPLATES_EN), "ko": (NAMES_KO, OBJECTS_KO, TEMPLATES_KO)}


def draw_problem(rng: random.Random) -> tuple[str, int, int]:
    """(operation, a, b) with one- or two-digit operands and a non-negative result below 100."""
    if rng.random() < 0.5:
        return "+", rng.randint(0, 49), rng.randint(0, 49)
    a = rng.randint(0, 99)
    return "-", a, rng.randint(0, a)


def worked_line(op: str, a: int, b: int) -> str:
    """Column arithmetic, units then tens: `7+5=12,3+4+1=8` for 37+45; `12-5=7,8-1-4=3` for 82-45."""
    (ta, ua), (tb, ub) = divmod(a, 10), divmod(b, 10)
    if op == "+":
        units = ua + ub
        return f"{ua}+{ub}={units},{ta}+{tb}+{units // 10}={ta + tb + units // 10}"
    borrow = int(ua < ub)
    return f"{ua + 10 * borrow}-{ub}={ua + 10 * borrow - ub},{ta}-{borrow}-{tb}={ta - borrow - tb}"


@dataclass(frozen=True)
class ArithTask:
    """One-operation word problems in one language."""

    lang: str = "en"
    gen_length: int = 32
    metrics: tuple[str, ...] = ("strict-match", "flexible-extract")

    @property
    def name(self) -> str:
        return "arith" if self.lang == "en" else f"arith-{self.lang}"

    def sample(self, rng: random.Random) -> TaskItem:
        names, objects, templates = LANGUAGES[self.lang]
        op, a, b = draw_problem(rng)
        c = a + b if op == "+" else a - b
        prompt = rng.choice(templates[op]).format(n=rng.choice(names), o=rng.choice(objects), a=a, b=b)
        answer = f"{worked_line(op, a, b)}\n#### {c}"
        return TaskItem(task=self.name, prompt=prompt, answer=answer, target=str(c), key=f"arith:{a}{op}{b}")

    def alphabet(self) -> set[str]:
        names, objects, templates = LANGUAGES[self.lang]
        text = "".join(names) + "".join(objects) + "".join(t for ts in templates.values() for t in ts)
        return (set(text) - set("{}")) | set("0123456789+-=#,\n ")
