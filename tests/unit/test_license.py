"""License tiers from evals/license_policy.yaml over SPDX expressions parsed by license-expression."""

from __future__ import annotations

import pytest

from evals.license import LicensePolicyError, check_license, classify, license_for_entry, load_policy

TIERS = [
    # each tier, single licenses
    ("MIT", None, "permitted"),
    ("Apache-2.0", None, "permitted"),
    ("BSD-3-Clause", None, "permitted"),
    ("apache-2.0", None, "permitted"),  # case-insensitive, normalised by license-expression
    ("GPL-3.0-only", None, "caution"),
    ("llama3", None, "caution"),  # a model-card tag, not SPDX: listed in the policy
    ("CC-BY-NC-4.0", None, "restricted"),
    ("CC-BY-NC-SA-4.0", None, "restricted"),
    ("Totally-Made-Up-1.0", None, "unknown"),
    # each expression form
    ("MIT AND Apache-2.0", None, "permitted"),
    ("MIT AND CC-BY-NC-4.0", None, "restricted"),  # AND: every part applies
    ("MIT AND Totally-Made-Up-1.0", None, "unknown"),
    ("MIT OR CC-BY-NC-4.0", None, "permitted"),  # OR: the user may choose
    ("CC-BY-NC-4.0 OR Totally-Made-Up-1.0", None, "unknown"),
    ("GPL-2.0-only WITH Classpath-exception-2.0", None, "permitted"),  # a linking exception relaxes
    ("GPL-2.0-only WITH Autoconf-exception-2.0", None, "caution"),  # an exception the policy does not list
    ("(MIT OR GPL-3.0-only) AND CC-BY-NC-4.0", None, "restricted"),
    ("Apache-2.0 AND (MIT OR CC-BY-NC-4.0)", None, "permitted"),
    # `other` and LicenseRef- need a known name
    ("other", None, "unknown"),
    ("other", "Some Vendor License", "unknown"),
    ("other", "Meta Llama 3 Community License Agreement", "caution"),
    ("other", "Inception Labs non-commercial research license", "restricted"),
    ("LicenseRef-acme-research-only", "ACME research only license", "restricted"),
    # broken expressions are unknown, never a crash
    ("MIT AND", None, "unknown"),
    ("", None, "unknown"),
]


@pytest.mark.parametrize("expression,name,tier", TIERS, ids=[f"{e or 'empty'}|{n or ''}" for e, n, _ in TIERS])
def test_tiers(expression, name, tier):
    verdict = classify(expression, name)
    assert verdict.tier == tier, verdict.reasons
    assert verdict.reasons


def test_card_that_disagrees_with_the_catalog_is_a_finding_and_the_stricter_tier_wins():
    result = check_license("m", "MIT", card={"license": "cc-by-nc-4.0"})
    assert result.tier == "restricted"
    assert result.findings and "disagrees" in result.findings[0] and "cc-by-nc-4.0" in result.findings[0]


def test_card_that_agrees_is_no_finding():
    assert check_license("m", "Apache-2.0", card={"license": "apache-2.0"}).findings == []
    llama = check_license(
        "m",
        "other",
        license_name="Meta Llama 3 Community License Agreement",
        card={"license": "llama3"},
        card_alias="llama3",
    )
    assert llama.findings == [] and llama.tier == "caution"


def test_catalog_entries():
    from models.catalog import load_catalog

    catalog = load_catalog()
    tiers = {e.id: license_for_entry(e).tier for e in catalog}
    assert tiers["tiny-llada"] == "permitted" and tiers["llada-8b-instruct"] == "permitted"
    assert tiers["llama-3-8b-instruct"] == "caution"
    assert tiers["mercury-3b-research"] == "restricted"


def test_policy_file_errors_name_the_key(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text("tiers:\n  permitted: {licenses: MIT}\n")
    with pytest.raises(LicensePolicyError, match="tiers.permitted.licenses"):
        load_policy(path)
    path.write_text("tiers:\n  permitted: {licenses: [MIT]}\n  forbidden: {licenses: [GPL-3.0-only]}\n")
    with pytest.raises(LicensePolicyError, match="tiers.forbidden"):
        load_policy(path)


def test_a_custom_policy_changes_the_verdict(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text(
        "tiers:\n  permitted: {licenses: [MIT, GPL-*]}\n  caution: {}\n  restricted: {licenses: [Apache-2.0]}\n"
    )
    policy = load_policy(path)
    assert classify("GPL-3.0-only", policy=policy).tier == "permitted"
    assert classify("Apache-2.0", policy=policy).tier == "restricted"
