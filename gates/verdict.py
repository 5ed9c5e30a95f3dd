"""The one verdict type of gates and canary analyses: pass, fail, or inconclusive (too little evidence to judge).

A `str` enum, so `Verdict.PASS == "pass"` and reports, tags and JSON keep the plain words.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum


class Verdict(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"  # not a pass, not a fault of the model: the evidence says what would settle it

    @classmethod
    def combine(cls, verdicts: Iterable[str]) -> Verdict:
        """Fail if any failed (or there is none to combine), else inconclusive if any is, else pass."""
        found = {cls(v) for v in verdicts}
        if cls.FAIL in found or not found:
            return cls.FAIL
        return cls.INCONCLUSIVE if cls.INCONCLUSIVE in found else cls.PASS


PASS, FAIL, INCONCLUSIVE = Verdict.PASS, Verdict.FAIL, Verdict.INCONCLUSIVE
VERDICTS = tuple(Verdict)
