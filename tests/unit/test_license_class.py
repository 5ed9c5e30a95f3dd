"""License classes (models/licenses.py): the one table, the catalog's errors, and the review the gate reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from checklists import checklist_status, load_checklist
from evals.license import check_license, load_policy
from gates.evaluate import evaluate_gates
from gates.policy import load_policy as load_gate_policy
from models.catalog import CatalogError, load_catalog, parse_entry
from models.licenses import PERMISSIVE, license_class
from tests.support.gate_fixtures import evidence, signoffs


@pytest.mark.parametrize(
    "expression, cls",
    [
        ("MIT", "permissive"),
        ("apache-2.0", "permissive"),
        ("BSD-3-Clause", "permissive"),
        ("MIT OR GPL-3.0-only", "permissive"),  # the user may choose MIT
        ("MIT AND GPL-3.0-only", "sign-off"),  # both apply
        ("Apache-2.0 WITH LLVM-exception", "permissive"),
        ("GPL-3.0-only", "sign-off"),
        ("CC-BY-NC-4.0", "sign-off"),
        ("other", "sign-off"),
        ("LicenseRef-nvidia-open-model", "sign-off"),
    ],
)
def test_license_class_of_an_expression(expression, cls):
    assert license_class(expression) == cls


def raw(**changes: object) -> dict[str, object]:
    return {
        "id": "x",
        "family": "f",
        "kind": "masked-diffusion",
        "role": "candidate",
        "source": "hf://acme/x",
        "revision": "main",
        "license": "MIT",
        "adapter": "llada",
    } | changes


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"license": "Foo-1.0"}, "entry 'x': field 'license' 'Foo-1.0' is not an SPDX license id"),
        ({"license": "MIT AND Nope-2"}, "field 'license' 'MIT AND Nope-2' is not an SPDX license id (unknown: Nope-2)"),
        ({"license": "other", "license_name": "NVIDIA"}, "entry 'x': field 'license_link' is required"),
        ({"license": ["MIT"]}, "entry 'x': field 'license' must be a string"),
        ({"parameters": 10, "active_parameters": 20}, "field 'active_parameters' must be at most 'parameters' (10)"),
        ({"active_parameters": "1B"}, "field 'active_parameters' must be a positive integer or null"),
    ],
)
def test_bad_license_or_counts_name_the_entry_and_field(changes, named):
    with pytest.raises(CatalogError) as e:
        parse_entry(raw(**changes), 0, Path("/c/catalog.yaml"))
    assert named in str(e.value)


def test_the_bundled_catalog_classes_the_new_families():
    catalog = load_catalog()
    nemotron = catalog.get("nemotron-labs-diffusion-8b")
    assert (
        nemotron.license_class == "sign-off" and nemotron.kind == "block-diffusion" and nemotron.adapter == "nemotron"
    )
    mini = catalog.get("llada2.0-mini")
    assert (mini.license_class, mini.parameters, mini.active_parameters) == ("permissive", 16 * 10**9, 14 * 10**8)
    assert catalog.get("llada2.0-flash").active_parameters == 61 * 10**8


def test_the_license_policy_permits_the_class_table_and_the_check_carries_the_class():
    policy = load_policy()
    assert all(policy.tier_of_id(key) == "permitted" for key in PERMISSIVE)
    nvidia = check_license("n", "other", license_name="NVIDIA Nemotron Open Model License")
    assert (nvidia.tier, nvidia.license_class) == ("caution", "sign-off")
    disagreeing = check_license("m", "MIT", card={"license": "apache-2.0"})
    assert disagreeing.license_class == "sign-off"  # a card that disagrees is for a person to read


def test_a_sign_off_license_waits_for_the_license_review_and_a_permissive_one_does_not():
    policy, checklist = load_gate_policy(), load_checklist("poc")
    custom = evidence(tier="caution")  # a LicenseRef-* license: class sign-off

    def review(ev, signed):
        results = {r.gate: r for r in evaluate_gates(ev, policy, "poc", signoffs=signed)}
        status = checklist_status(checklist, results.values(), ev.records, signed)
        item = next(i for i in status.items if i.id == "license-review")
        return results["license_review"], item

    gate, item = review(custom, {})
    assert not gate.passed and "needs a named person's sign-off" in gate.reason
    assert item.id == "license-review" and not item.done
    gate, item = review(custom, signoffs("license-review"))
    assert gate.passed and item.done and "reviewed by ada" in item.reason
    gate, item = review(evidence(), {})  # Apache-2.0
    assert gate.passed and item.done and "permissive" in item.reason
