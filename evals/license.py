"""License check: parse SPDX expressions with `license-expression`, tier them by evals/license_policy.yaml.

Tiers, loosest first: permitted, caution, restricted; `unknown` (needs a human) sits between caution
and restricted, so `MIT AND <unknown>` is unknown and `MIT OR <unknown>` is permitted.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from evals.records import LicenseResult
from models.catalog import load_catalog
from models.licenses import PERMISSIVE, SIGN_OFF_CLASS, review_class, spdx_licensing
from models.unique_keys import load_yaml

POLICY_PATH = Path(__file__).resolve().parent / "license_policy.yaml"
TIERS = ("permitted", "caution", "restricted")
RANK = {"permitted": 0, "caution": 1, "unknown": 2, "restricted": 3}
OTHER = "other"


class LicensePolicyError(ValueError):
    """A policy file that cannot be used; the message names the file and key."""


@dataclass(frozen=True)
class LicensePolicy:
    licenses: dict[str, tuple[str, ...]]  # tier -> id patterns
    names: dict[str, tuple[str, ...]]  # tier -> phrases for license_name
    relaxing_exceptions: tuple[str, ...] = ()
    source: str = ""

    def tier_of_id(self, key: str) -> str:
        """Tier of one license id (or card tag); the strictest tier whose pattern matches, else unknown."""
        for tier in reversed(TIERS):
            if any(fnmatch.fnmatch(key.lower(), p.lower()) for p in self.licenses[tier]):
                return tier
        return "unknown"

    def tier_of_name(self, name: str | None) -> tuple[str, str | None]:
        """(tier, matched phrase) for a free-text license name; restricted phrases win."""
        if name:
            for tier in reversed(TIERS):
                for phrase in self.names[tier]:
                    if phrase.lower() in name.lower():
                        return tier, phrase
        return "unknown", None


def load_policy(path: str | Path | None = None) -> LicensePolicy:
    path = Path(path or POLICY_PATH)
    return _load_policy(str(path.resolve()))


@lru_cache(maxsize=8)
def _load_policy(path: str) -> LicensePolicy:
    try:
        data = load_yaml(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise LicensePolicyError(f"{path}: cannot read license policy ({e})") from e
    tiers = data.get("tiers") if isinstance(data, dict) else None
    if not isinstance(tiers, dict):
        raise LicensePolicyError(f"{path}: key 'tiers' must map {', '.join(TIERS)} to licenses and names")
    licenses: dict[str, tuple[str, ...]] = {}
    names: dict[str, tuple[str, ...]] = {}
    for tier in TIERS:
        entry = tiers.get(tier) or {}
        if not isinstance(entry, dict):
            raise LicensePolicyError(f"{path}: key 'tiers.{tier}' must be a mapping with 'licenses' and 'names'")
        for key, out in (("licenses", licenses), ("names", names)):
            values = entry.get(key) or []
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                raise LicensePolicyError(f"{path}: key 'tiers.{tier}.{key}' must be a list of strings")
            out[tier] = tuple(values)
    # the permitted tier starts from the license-class table, so a permissive license is never judged stricter
    licenses["permitted"] = (*sorted(PERMISSIVE), *licenses["permitted"])
    unknown = sorted(set(tiers) - set(TIERS))
    if unknown:
        raise LicensePolicyError(f"{path}: key 'tiers.{unknown[0]}' is not a tier; tiers: {', '.join(TIERS)}")
    relax = ((data.get("exceptions") or {}).get("relax")) or []
    return LicensePolicy(licenses, names, tuple(relax), source=path)


@dataclass
class Verdict:
    tier: str
    reasons: list[str] = field(default_factory=list)


def classify_expression(expression: str, policy: LicensePolicy) -> Verdict:
    """Tier of an SPDX expression: AND takes the stricter part, OR the looser, WITH may relax."""
    from license_expression import AND, OR, ExpressionError, LicenseSymbol, LicenseWithExceptionSymbol

    try:
        parsed = spdx_licensing().parse(expression, validate=False)
    except ExpressionError as e:
        return Verdict("unknown", [f"'{expression}' is not a valid SPDX expression ({e})"])
    if parsed is None:
        return Verdict("unknown", ["empty license expression"])
    reasons: list[str] = []

    def walk(node: Any) -> str:
        if isinstance(node, LicenseWithExceptionSymbol):
            base = walk(node.license_symbol)
            exception = node.exception_symbol.key
            if base == "caution" and any(exception.lower() == e.lower() for e in policy.relaxing_exceptions):
                reasons.append(f"{node.license_symbol.key} WITH {exception}: the exception relaxes it to permitted")
                return "permitted"
            return base
        if isinstance(node, LicenseSymbol):
            tier = policy.tier_of_id(node.key)
            reasons.append(f"{node.key}: {tier}" + ("" if tier != "unknown" else " (not in the license policy)"))
            return tier
        parts = [walk(arg) for arg in node.args]
        if isinstance(node, AND):
            return max(parts, key=RANK.__getitem__)
        if isinstance(node, OR):
            return min(parts, key=RANK.__getitem__)
        raise TypeError(f"unexpected node {type(node).__name__} in {expression!r}")  # pragma: no cover

    tier = walk(parsed)
    if isinstance(parsed, AND):
        reasons.append(f"AND: every part applies, so the strictest ({tier})")
    elif isinstance(parsed, OR):
        reasons.append(f"OR: the user may choose, so the loosest ({tier})")
    return Verdict(tier, reasons)


def classify(expression: str, license_name: str | None = None, policy: LicensePolicy | None = None) -> Verdict:
    """Tier of a catalog license: an SPDX expression, or `other`/LicenseRef-* with a name."""
    policy = policy or load_policy()
    expression = (expression or "").strip()
    if not expression:
        return Verdict("unknown", ["no license given"])
    if expression.lower() == OTHER or expression.startswith("LicenseRef-"):
        tier, phrase = policy.tier_of_name(license_name)
        if tier == "unknown":
            what = f"'{license_name}'" if license_name else "no license name"
            return Verdict("unknown", [f"license '{expression}' with {what}: not a known license, needs human review"])
        return Verdict(tier, [f"license '{expression}' named '{license_name}': matches '{phrase}' -> {tier}"])
    return classify_expression(expression, policy)


def same_license(a: str, b: str) -> bool:
    """Whether two license strings name the same thing (SPDX-normalised when both parse)."""
    from license_expression import ExpressionError

    try:
        licensing = spdx_licensing()
        return licensing.parse(a, validate=False) == licensing.parse(b, validate=False) or a.lower() == b.lower()
    except ExpressionError:
        return a.strip().lower() == b.strip().lower()


def check_license(
    candidate: str,
    expression: str,
    *,
    license_name: str | None = None,
    card: dict[str, Any] | None = None,
    card_alias: str | None = None,
    policy: LicensePolicy | None = None,
) -> LicenseResult:
    """The license gate's evidence; a model card `license:` that disagrees with the catalog is a finding.

    card_alias: the card tag the catalog says to expect when it differs from `expression`
    (CatalogEntry.card_license, e.g. `llama3` for `other`).
    """
    policy = policy or load_policy()
    verdict = classify(expression, license_name, policy)
    tier, reasons, findings = verdict.tier, list(verdict.reasons), []
    card_license = (card or {}).get("license")
    if card_license:
        card_license = ", ".join(map(str, card_license)) if isinstance(card_license, list) else str(card_license)
        agreed = same_license(expression, card_license) or bool(card_alias and same_license(card_alias, card_license))
        if not agreed:
            findings.append(f"catalog license '{expression}' disagrees with the model card's license '{card_license}'")
            card_tier = classify(card_license, None, policy).tier
            if RANK[card_tier] > RANK[tier]:
                reasons.append(f"the model card's '{card_license}' is {card_tier}; the stricter tier is kept")
                tier = card_tier
    elif card:
        reasons.append("the model card has no license tag")
    review = review_class(expression) if not findings else SIGN_OFF_CLASS  # a disagreement is for a person to read
    return LicenseResult(candidate, expression, tier, reasons, findings, license_class=review)


def license_for_entry(
    entry: Any, card: dict[str, Any] | None = None, policy: LicensePolicy | None = None
) -> LicenseResult:
    """check_license for a models.catalog.CatalogEntry (and the model card read from its files, if any)."""
    return check_license(
        entry.id,
        entry.license,
        license_name=entry.license_name,
        card=card,
        card_alias=entry.card_license,
        policy=policy,
    )


def license_for_model(
    ref: str, card: dict[str, Any] | None = None, policy: LicensePolicy | None = None
) -> LicenseResult:
    """The catalog entry's license checked against `card`; a model outside the catalog is judged by its card."""
    try:
        catalog = load_catalog()
    except Exception as e:  # a broken catalog is itself worth a finding, not a crash
        catalog, reason = None, f"catalog unreadable: {e}"
    else:
        reason = f"'{ref}' is not in the catalog"
    if catalog is not None and ref in catalog:
        return license_for_entry(catalog.get(ref), card, policy)
    expression = str((card or {}).get("license") or "other")
    result = check_license(Path(ref).name, expression, card=None, policy=policy)
    result.findings.append(f"{reason}; license taken from the model card only")
    return result
