"""A demo says it is one: under a `demo: true` policy or roles file, or on a registry `unmask run --demo` marked,
every verdict `unmask` prints opens with the DEMO banner (`unmask gates`, `unmask promote`; `unmask run`'s summary
is checked by the walk-through), and a demo file never moves production on a registry not marked as a demo.
Real SQLite MLflow store, the bundled demo files."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import registry.read as read
from gates import load_policy
from gates.roles import load_roles
from registry import PromotionRefused, promote, stage_holder
from registry.demo import demo_marks, is_demo_registry, mark_demo_registry
from tests.support import REPO
from tests.support.flow_fixtures import cli_app
from tests.support.gate_fixtures import OK
from tests.support.governance import governed_registry

GATES = REPO / "gates"


@pytest.fixture
def reg(tmp_path, monkeypatch):
    """The governance registry: evidence, sign-offs, people (tests/support/governance.py)."""
    return governed_registry(tmp_path, monkeypatch)


DEMO_POLICY = GATES / "demo-policy.yaml"
REFUSED = "marked `demo: true` and cannot move production"


def test_a_demo_policy_or_roles_file_cannot_move_production_on_a_registry_not_marked_demo(reg):
    assert not is_demo_registry(reg)
    for policy, roles in ((load_policy(DEMO_POLICY), None), (None, load_roles(GATES / "demo-roles.yaml"))):
        with pytest.raises(PromotionRefused) as refused:
            promote("tiny-llada", "production", comment=OK, policy=policy, roles=roles, registry=reg)
        assert REFUSED in str(refused.value), str(refused.value)
    assert stage_holder(reg, "production") is None
    audited = read.audit_events(event="promotion_refused", registry=reg)
    assert len(audited) == 2 and set(audited["stage"]) == {"production"}, audited.to_dict("records")
    # a demo policy below production is only a demo's verdict: refused for its own reasons, not for being a demo
    with pytest.raises(PromotionRefused) as staging:
        promote("tiny-llada", "staging", comment=OK, policy=load_policy(DEMO_POLICY), registry=reg)
    assert REFUSED not in str(staging.value)


def test_on_a_registry_marked_demo_the_demo_policy_is_judged_like_any_other(reg):
    mark_demo_registry(reg)
    assert is_demo_registry(reg)
    with pytest.raises(PromotionRefused) as refused:  # no approvals yet: that is the reason, not the demo
        promote("tiny-llada", "production", comment=OK, policy=load_policy(DEMO_POLICY), registry=reg)
    assert REFUSED not in str(refused.value) and "approval" in str(refused.value), str(refused.value)


def test_demo_marks_name_each_demo_part_and_nothing_for_the_bundled_files(reg):
    bundled = demo_marks(reg, load_policy(), load_roles(GATES / "roles.yaml"))
    assert bundled == []
    marks = demo_marks(reg, load_policy(DEMO_POLICY), load_roles(GATES / "demo-roles.yaml"))
    assert [m.split(" ")[0] for m in marks] == ["policy", "roles"], marks
    mark_demo_registry(reg)
    assert demo_marks(reg, None, None) == [f"the registry {reg.tracking_uri} is marked as a demo"]


def test_every_cli_verdict_under_a_demo_policy_opens_with_the_banner_and_none_under_the_bundled(reg, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    run = CliRunner().invoke
    app = cli_app("gates", "promote")
    env = {"COLUMNS": "200"}
    for args in (
        ["gates", "tiny-llada", "--stage", "poc"],
        ["gates", "tiny-llada", "--stage", "poc", "--stored"],
        ["promote", "tiny-llada", "--to", "staging", "--comment", OK],
    ):
        demo = run(app, [*args, "--policy", str(DEMO_POLICY)], env=env)
        assert demo.exit_code in (0, 1), demo.output
        assert demo.output.lstrip().startswith("DEMO — not a decision"), demo.output
        assert f"policy {DEMO_POLICY} is marked demo: true" in " ".join(demo.output.split()), demo.output
        bundled = run(app, args, env=env)
        assert bundled.exit_code in (0, 1) and "DEMO" not in bundled.output, bundled.output
    mark_demo_registry(reg)  # the registry alone makes it a demo
    marked = run(app, ["gates", "tiny-llada", "--stage", "poc"], env=env)
    assert marked.output.lstrip().startswith("DEMO — not a decision") and "is marked as a demo" in marked.output
