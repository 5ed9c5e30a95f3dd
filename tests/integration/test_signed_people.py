"""Approvals and sign-offs signed by the people who made them (issue 48): where the roles file lists public keys,
an act counts only when a key listed for its signer, valid at its time, signed exactly what the store holds.

The attacks come first, each run against roles that list no keys (where they still succeed, which is why keys
exist) and then against keyed roles (where they are refused in one line and no alias moves). One OS account runs
every test: on the embedded store, with keys, two listed keys are two people, and no stand-in for a second login is
needed.
"""

from __future__ import annotations

import json

import pytest

import registry.read as read
from gates.promotion import Approval
from gates.roles import RolesError, load_roles, parse_roles
from gates.signatures import verifies
from registry import ApprovalRefused, PromotionRefused, approve, promote, sign_off
from registry.identity import os_account
from registry.state import approvals_from_tags, version_state
from registry.store import model_tag, now_iso
from tests.support.gate_fixtures import OK, act_as, fast_llada, fresh_registry, register_pair, sign_all
from tests.support.governance import PEOPLE, keyed_roles, roles_data


@pytest.fixture
def reg(tmp_path):
    return fresh_registry(tmp_path)


def _registered(reg):
    """The tiny pair registered by this OS account, signed with its key where it has one (`keyed_roles`)."""
    register_pair(reg, fast_llada())
    return reg


def _at_staging(reg):
    sign_all(reg, "tiny-llada", "1", "poc", "staging", "production")
    promote("tiny-llada", "poc", approver="bob", comment=OK, registry=reg)
    approve(reg, "tiny-llada", "1", "staging", "grace", OK)
    promote("tiny-llada", "staging", registry=reg)


def _forge_approval(reg, stage, by, request, **fields):
    """An approval tag written with the plain MLflow client, as anyone who can write the store can write it."""
    forged = Approval(stage, by, now_iso(), OK, f"forged{by}", request, "laptop", "mlflow-basic-auth", account=by)
    value = forged.to_dict() | fields
    reg.client.set_model_version_tag("tiny-llada", "1", model_tag(f"approvals.{stage}.{forged.id}"), json.dumps(value))


def _open_request(reg, stage):
    from registry.approvals import request_promotion
    from registry.identity import current_actor

    return request_promotion(reg, "tiny-llada", "1", stage, current_actor(reg.tracking_uri))[0].id


def test_four_eyes_on_the_embedded_store_two_listed_keys_are_two_people(reg, tmp_path, monkeypatch):
    keyed_roles(tmp_path, monkeypatch)
    _registered(reg)
    _at_staging(reg)  # grace approved staging from this one OS account: her key, not the account, is the person
    approve(reg, "tiny-llada", "1", "production", "grace", OK)
    approve(reg, "tiny-llada", "1", "production", "linus", OK)
    move = promote("tiny-llada", "production", registry=reg)
    assert move.to_holder == ("tiny-llada", "1")
    used = [a for a in version_state(reg, "tiny-llada", "1").approvals("production") if a.status == "consumed"]
    assert sorted(a.by for a in used) == ["grace", "linus"]
    assert all(a.identity == "ed25519-key" and a.key.startswith("SHA256:") and a.signature for a in used)


def test_approval_tags_written_with_the_plain_client_count_for_nothing(reg, tmp_path, monkeypatch):
    # before issue 48's rule, two forged tags naming two authenticated users moved production under roles that list
    # no keys; now staging and production count no unsigned act whatever the roles file says, so they move nothing
    path = tmp_path / "plain.yaml"
    path.write_text(json.dumps(roles_data()))
    monkeypatch.setenv("UNMASK_ROLES", str(path))
    _registered(reg)
    sign_all(reg, "tiny-llada", "1", "poc")
    promote("tiny-llada", "poc", approver="bob", comment=OK, registry=reg)
    request = _open_request(reg, "staging")
    for by in ("grace", "linus"):
        _forge_approval(reg, "staging", by, request)
    with pytest.raises(PromotionRefused) as e:
        promote("tiny-llada", "staging", registry=reg)
    text = "\n".join(e.value.reasons)
    assert f"staging counts only acts signed by a person's key the roles file lists, and {path} lists none" in text
    assert "the approval by grace at" in text and "counts for nothing" in text, text
    assert read.aliases(reg)["staging"] is None

    # with keys listed, the same forgery on a fresh store is refused, each tag named, and nothing moves
    other = fresh_registry(tmp_path / "keyed")
    keyed_roles(tmp_path, monkeypatch)
    _registered(other)
    _at_staging(other)
    request = _open_request(other, "production")
    for by in ("grace", "linus"):
        _forge_approval(other, "production", by, request)
    with pytest.raises(PromotionRefused) as e:
        promote("tiny-llada", "production", registry=other)
    text = "\n".join(e.value.reasons)
    assert "the approval by grace at" in text and "is not signed: only an act signed by a key the roles" in text
    assert "the approval by linus at" in text
    assert read.aliases(other)["production"] is None


def test_a_signed_approval_edited_copied_or_signed_with_anothers_key_counts_for_nothing(reg, tmp_path, monkeypatch):
    signers = keyed_roles(tmp_path, monkeypatch)
    _registered(reg)
    _at_staging(reg)
    grace = approve(reg, "tiny-llada", "1", "production", "grace", OK)
    tag = model_tag(f"approvals.production.{grace.id}")
    edited = grace.to_dict() | {"comment": OK + " (and I also approve the next three versions)"}
    reg.client.set_model_version_tag("tiny-llada", "1", tag, json.dumps(edited))
    # linus's name on an approval grace's key signed
    stolen = Approval(
        "production",
        "linus",
        now_iso(),
        OK,
        "stolen",
        grace.request,
        identity="ed25519-key",
        account="x",
        model="tiny-llada",
        version="1",
        head=grace.head,
    )
    key, signature = signers["grace"].sign(stolen.payload())
    reg.client.set_model_version_tag(
        "tiny-llada",
        "1",
        model_tag("approvals.production.stolen"),
        json.dumps(stolen.to_dict() | {"key": key, "signature": signature}),
    )
    with pytest.raises(PromotionRefused) as e:
        promote("tiny-llada", "production", registry=reg)
    text = "\n".join(e.value.reasons)
    assert f"the approval by grace at {grace.at} does not match its signature by {grace.key}: it was changed" in text
    assert f"is signed with {grace.key}, a key of grace, not one of linus's" in text
    assert read.aliases(reg)["production"] is None
    # a signed approval of version 1 copied onto version 2 (same tag, same signature) is read as version 2's
    copied = approvals_from_tags({tag: json.dumps(grace.to_dict())}, "production", "tiny-llada", "2")[0]
    assert copied.version == "2" and copied.signature == grace.signature
    assert not verifies(signers["grace"].public_line, copied.payload(), copied.signature)
    assert verifies(signers["grace"].public_line, grace.payload(), grace.signature)


def test_a_revoked_key_signs_nothing_that_counts_and_an_unlisted_person_cannot_approve(reg, tmp_path, monkeypatch):
    keyed_roles(tmp_path, monkeypatch, [p for p in PEOPLE if p != "eve"], revoked={"linus": "2020-01-01T00:00:00Z"})
    _registered(reg)
    _at_staging(reg)
    approve(reg, "tiny-llada", "1", "production", "grace", OK)
    with pytest.raises(ApprovalRefused) as e:
        approve(reg, "tiny-llada", "1", "production", "linus", OK)
    assert "with linus's key SHA256:" in str(e.value) and "revoked at 2020-01-01T00:00:00+00:00" in str(e.value)
    refused = read.audit_events(event="approval_refused", registry=reg)
    assert "revoked at 2020-01-01" in refused["comment"].iloc[-1]
    # eve holds the approve role but the roles file lists no key of hers: nothing she does counts
    with pytest.raises(
        ApprovalRefused, match="is not signed: only an act signed by a key the roles file lists for eve"
    ):
        approve(reg, "tiny-llada", "1", "production", "eve", OK)
    with pytest.raises(PromotionRefused, match="production needs 2 approvals from 2 different people"):
        promote("tiny-llada", "production", registry=reg)
    assert read.aliases(reg)["production"] is None


def test_a_forged_sign_off_tag_leaves_its_checklist_item_open(reg, tmp_path, monkeypatch):
    keyed_roles(tmp_path, monkeypatch)
    _registered(reg)
    sign_all(reg, "tiny-llada", "1", "poc")
    state = version_state(reg, "tiny-llada", "1")
    item = "fallback-plan"  # a manual item only a sign-off settles (license-review passes on a permissive license)
    assert item in state.signoffs("poc")
    forged = state.signoffs("poc")[item] | {"comment": "rewritten after signing"}
    reg.client.set_model_version_tag("tiny-llada", "1", model_tag(f"signoff.poc.{item}"), json.dumps(forged))
    with pytest.raises(PromotionRefused) as e:
        promote("tiny-llada", "poc", approver="bob", comment=OK, registry=reg)
    text = "\n".join(e.value.reasons)
    assert f"checklist poc/{item}: needs a sign-off" in text
    assert read.aliases(reg)["poc"] is None
    # signing it off again, signed, settles it
    sign_off(reg, "tiny-llada", "1", "poc", item, "ada", f"{item} checked again")
    assert promote("tiny-llada", "poc", approver="bob", comment=OK, registry=reg).to_holder == ("tiny-llada", "1")


def test_evidence_counts_only_as_registered_and_signed_by_a_listed_key(reg, tmp_path, monkeypatch):
    _registered(reg)  # registered before anyone had a key: nothing signed it
    keyed_roles(tmp_path, monkeypatch)
    decision = read.promotion_decision("tiny-llada", "1", "poc", registry=reg)
    assert decision.blocker_labels()[0] == "unverified evidence"
    assert decision.blockers[0].text.startswith(f"the evidence of tiny-llada v1, registered by {os_account()} at ")
    assert "is not signed" in decision.blockers[0].text and decision.steps[0].command == "unmask run --model tiny-llada"
    _registered(reg)  # measured again, by someone whose key the roles file lists: signed, and nothing blocks on it
    assert not any(
        r.kind == "evidence" for r in read.promotion_decision("tiny-llada", "1", "poc", registry=reg).blockers
    )
    # the registration's time moved (to make older approvals count, say) no longer matches its signature
    reg.set_version_tags("tiny-llada", "1", {model_tag("evaluated_at"): "2020-01-01T00:00:00+00:00"})
    moved = read.promotion_decision("tiny-llada", "1", "poc", registry=reg)
    assert "was changed after signing" in moved.blockers[0].text
    with pytest.raises(PromotionRefused, match="was changed after signing"):
        promote("tiny-llada", "poc", approver="bob", comment=OK, registry=reg)


def test_verification_needs_only_the_roles_files_public_keys(reg, tmp_path, monkeypatch):
    """A second OS account (another keys folder, no private key at all) reads the same decision."""
    keyed_roles(tmp_path, monkeypatch)
    _registered(reg)
    _at_staging(reg)
    approve(reg, "tiny-llada", "1", "production", "grace", OK)
    mine = read.promotion_decision("tiny-llada", "1", "production", registry=reg).to_dict()
    empty = tmp_path / "auditor-keys"
    empty.mkdir()
    monkeypatch.setenv("UNMASK_KEYS_HOME", str(empty))
    theirs = read.promotion_decision("tiny-llada", "1", "production", registry=reg).to_dict()
    assert theirs["reasons"] == mine["reasons"] and theirs["approvals"] == mine["approvals"]
    assert theirs["signoffs"] == mine["signoffs"] and all(s["counts"] for s in theirs["signoffs"])
    assert [a["by"] for a in theirs["approvals"]] == ["grace"] and "signed" not in theirs["approvals"][0]["why"]


def test_the_roles_file_refuses_malformed_keys_naming_the_entry(tmp_path, monkeypatch):
    signers = keyed_roles(tmp_path, monkeypatch, people=["ada", "grace"])
    assert load_roles().signed and {k.fingerprint for k in load_roles().keys["grace"]} == {signers["grace"].fingerprint}
    line = signers["ada"].public_line
    cases = [
        ({"ada": ["ssh-rsa AAAAB3NzaC1yc2E"]}, "keys.ada[0]: expected an OpenSSH Ed25519 public key"),
        ({"ada": ["ssh-ed25519 AAAAnot-base64!"]}, "keys.ada[0]: not a readable ssh-ed25519 key"),
        ({"ada": [line], "grace": [line]}, "keys.grace[0]: key SHA256:"),
        ({"nobody": [line]}, "keys.nobody: 'nobody' is not a known user"),
        ({"ada": [{"key": line, "revoked": "last tuesday"}]}, "keys.ada[0].revoked: expected an ISO time"),
        ({"ada": []}, "keys.ada: expected a non-empty list of public keys"),
        ({"*": [line]}, "keys.*: keys belong to a named person"),
    ]
    for keys, message in cases:
        with pytest.raises(RolesError, match=message.replace("*", r"\*").replace("[", r"\[").replace("]", r"\]")):
            parse_roles(roles_data() | {"keys": keys}, source="roles.yaml")
    assert os_account()  # the OS account is still who runs this; keys decide who signed


def test_people_make_their_keys_with_the_cli_and_their_cli_approvals_count(reg, tmp_path, monkeypatch):
    """Each approver runs `unmask keys init` in their own keys folder; the lines it prints go into the roles file;
    then each one's `unmask approve` is theirs, signed, and production moves on the two."""
    import yaml
    from typer.testing import CliRunner

    from tests.support.flow_fixtures import cli_app

    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    app, homes, lines = cli_app("keys", "approve"), {}, {}
    for person in ("grace", "linus"):
        homes[person] = str(tmp_path / f"{person}-config")
        made = CliRunner().invoke(app, ["keys", "init", "--name", person], env={"UNMASK_KEYS_HOME": homes[person]})
        assert made.exit_code == 0, made.output
        lines[person] = yaml.safe_load(made.output.splitlines()[-1])[person]  # the line it says to paste
    signers = keyed_roles(tmp_path, monkeypatch, people=["ada", "bob"])  # in the test's own keys folder
    _registered(reg)
    data = yaml.safe_load((tmp_path / "roles.yaml").read_text())
    data["keys"] |= lines
    (tmp_path / "roles.yaml").write_text(yaml.safe_dump(data))
    shown = CliRunner().invoke(app, ["keys", "show"], env={"UNMASK_KEYS_HOME": homes["grace"], "COLUMNS": "300"})
    assert shown.exit_code == 0 and "signs as: grace" in shown.output and "listed for grace in" in shown.output
    assert signers["ada"].fingerprint not in shown.output

    sign_all(reg, "tiny-llada", "1", "poc", "staging", "production")
    promote("tiny-llada", "poc", approver="bob", comment=OK, registry=reg)
    for stage, people in (("staging", ["grace"]), ("production", ["grace", "linus"])):
        for person in people:
            done = CliRunner().invoke(
                app, ["approve", "tiny-llada", stage, "--comment", OK], env={"UNMASK_KEYS_HOME": homes[person]}
            )
            assert done.exit_code == 0, done.output
        promote("tiny-llada", stage, registry=reg)
    assert read.aliases(reg)["production"] == {"model": "tiny-llada", "version": "1"}
    # a third run of grace's: her name typed by someone whose keys folder is linus's is refused, and audited
    typed = CliRunner().invoke(
        app,
        ["approve", "tiny-llada", "production", "--by", "grace", "--comment", OK],
        env={"UNMASK_KEYS_HOME": homes["linus"]},
    )
    assert typed.exit_code != 0 and "--by 'grace' is not you: you are 'linus'" in typed.output


def test_a_decline_counts_only_signed_by_its_decider_and_a_forged_one_blocks_nothing(reg, tmp_path, monkeypatch):
    from registry.approvals import decline

    # without keys listed, a decline tag written with the plain client blocks the version: a forged veto
    path = tmp_path / "plain.yaml"
    path.write_text(json.dumps(roles_data()))
    monkeypatch.setenv("UNMASK_ROLES", str(path))
    _registered(reg)
    forged = {"stage": "poc", "by": "grace", "at": now_iso(), "comment": "forged veto", "host": "laptop"}
    reg.client.set_model_version_tag("tiny-llada", "1", model_tag("decline.poc"), json.dumps(forged))
    assert "declined" in read.promotion_decision("tiny-llada", "1", "poc", registry=reg).blocker_labels()
    # with keys listed the same tag is no decision, and the version moves
    keyed_roles(tmp_path, monkeypatch)
    _registered(reg)  # signed evidence, after the forged decline
    reg.client.set_model_version_tag(
        "tiny-llada", "1", model_tag("decline.poc"), json.dumps(forged | {"at": now_iso()})
    )
    assert "declined" not in read.promotion_decision("tiny-llada", "1", "poc", registry=reg).blocker_labels()
    # a decline signed by a listed approver stands; the same one with its comment edited does not
    declined = decline(reg, "tiny-llada", "1", "poc", "grace", "not on this evidence")
    assert declined.key.startswith("SHA256:") and declined.signature
    assert verifies(load_roles().keys["grace"][0].line, declined.payload(), declined.signature)
    decision = read.promotion_decision("tiny-llada", "1", "poc", registry=reg)
    assert "declined" in decision.blocker_labels()
    assert any("grace declined poc" in b.text and "not on this evidence" in b.text for b in decision.blockers)
    edited = version_state(reg, "tiny-llada", "1").declined("poc").to_dict() | {"comment": "edited"}
    reg.client.set_model_version_tag("tiny-llada", "1", model_tag("decline.poc"), json.dumps(edited))
    assert "declined" not in read.promotion_decision("tiny-llada", "1", "poc", registry=reg).blocker_labels()


def test_a_decline_by_someone_without_a_listed_key_is_refused_in_one_line(reg, tmp_path, monkeypatch):
    from registry.approvals import decline

    keyed_roles(tmp_path, monkeypatch, [p for p in PEOPLE if p != "eve"])
    _registered(reg)
    with pytest.raises(ApprovalRefused) as e:
        decline(reg, "tiny-llada", "1", "poc", "eve", "no")
    assert "is not signed: only an act signed by a key the roles file lists for eve" in str(e.value)
    assert version_state(reg, "tiny-llada", "1").declined("poc") is None


def test_alias_moves_are_signed_by_their_movers_and_history_says_whose(reg, tmp_path, monkeypatch):
    import shutil

    from gates.promotion import move_payload
    from registry import rollback
    from registry.audit import events
    from registry.history import stage_history

    signers = keyed_roles(tmp_path, monkeypatch)
    _registered(reg)
    _at_staging(reg)  # this OS account promotes poc and staging, signing with its key
    rollback("staging", who="olga", comment="canary latency", registry=reg)  # the on-call person, with her key
    roles = load_roles()
    found = stage_history(reg, roles=roles)
    assert [(t.stage, t.how, t.signature) for t in found.tenures] == [
        ("poc", "promotion", f"signed by {os_account()}"),
        ("staging", "promotion", f"signed by {os_account()}"),
        ("staging", "rollback", "signed by olga"),
    ]
    olga_move = [e for e in events(reg, event="alias_move") if e.who == "olga"][0]
    payload = move_payload("staging", olga_move.from_ref, olga_move.to_ref, "olga", olga_move.when, olga_move.comment)
    assert verifies(signers["olga"].public_line, payload, olga_move.evidence["signed"]["signature"])
    # a reconcile is a move like any other: signed by its mover
    elsewhere = "tiny-llada" if olga_move.to_ref != "tiny-llada@1" else "tiny-ar"
    reg.client.set_registered_model_alias(elsewhere, "staging", "1")  # moved outside unmask
    rollback("staging", who="olga", comment="put back", registry=reg, reconcile=True)
    [reconciled] = [t for t in stage_history(reg, stage="staging", roles=roles).tenures if t.how == "reconcile"]
    assert reconciled.signature == "signed by olga" and reconciled.key == signers["olga"].fingerprint
    # an on-call person whose key is gone still rolls back (an emergency waits for no key), unsigned, and says so
    shutil.rmtree(signers["olga"].path.parent)
    rollback("poc", who="olga", comment="no key at hand", registry=reg, to_fallback=True)
    last = stage_history(reg, stage="poc", roles=roles).tenures[-1]
    assert last.moved_by == "olga" and last.key == "" and "is not signed" in last.signature


def test_evidence_registered_before_keys_is_vouched_for_by_a_listed_person_and_then_counts(reg, tmp_path, monkeypatch):
    """`unmask migrate` (issue 48 item 3): no unsigned record is a pass, and an explicit, audited act of a named
    person re-signs what they vouch for; the voucher is its registrant for the four-eyes rules."""
    from typer.testing import CliRunner

    from registry import EvidenceTampered, vouch
    from tests.support.flow_fixtures import cli_app
    from tests.support.forgery import forge_records

    _registered(reg)  # before anyone had a key
    keyed_roles(tmp_path, monkeypatch, [p for p in PEOPLE if p != "mallory"])
    blocked = read.promotion_decision("tiny-llada", "1", "staging", registry=reg).blockers[0].text
    assert "is not signed" in blocked and "or vouch for it (unmask migrate tiny-llada --version 1)" in blocked
    with pytest.raises(ApprovalRefused, match="is not signed: only an act signed by a key the roles file lists"):
        vouch(reg, "tiny-llada", "1", "records and card read", "mallory")  # no key of hers is listed
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    act_as("eve")  # an approver
    done = CliRunner().invoke(
        cli_app("migrate"), ["migrate", "tiny-llada", "--comment", "records, card and hashes checked"]
    )
    assert done.exit_code == 0 and "vouched for by eve, signed with SHA256:" in done.output, done.output
    staging = read.promotion_decision("tiny-llada", "1", "staging", registry=reg)
    assert not any(r.kind == "evidence" for r in staging.blockers), staging.blockers
    with pytest.raises(ApprovalRefused, match="eve registered the evidence of this version and cannot approve"):
        approve(reg, "tiny-llada", "1", "staging", "eve", OK)  # who vouched is the registrant now
    again = CliRunner().invoke(cli_app("migrate"), ["migrate", "tiny-llada", "--comment", "once more"])
    assert again.exit_code == 1 and "is signed by eve's listed key already" in again.output, again.output
    events = read.audit_events(model="tiny-llada", registry=reg)
    vouched = events[events.event == "evidence_vouched"].iloc[-1]
    assert vouched.who == "eve" and vouched.evidence["previous_registrant"] == os_account()
    assert events[events.event == "vouch_refused"]["who"].tolist() == ["mallory", "eve"]
    # evidence changed after registration is never vouched for: an integrity finding, nothing re-signed
    forge_records(reg)
    with pytest.raises(EvidenceTampered):
        vouch(reg, "tiny-llada", "1", "looks fine to me", "grace")


def test_a_rewritten_promotion_request_counts_for_nothing_and_the_next_promote_opens_a_new_one(
    reg, tmp_path, monkeypatch
):
    """A request is signed by its requester (issue 48 item 2): bob rewriting his own request's requester to eve, so
    that he could approve his own promotion, leaves a request that is nobody's."""
    from registry.approvals import open_request

    signers = keyed_roles(tmp_path, monkeypatch)
    _registered(reg)
    sign_all(reg, "tiny-llada", "1", "poc", "staging")
    promote("tiny-llada", "poc", approver="bob", comment=OK, registry=reg)
    with pytest.raises(PromotionRefused, match="no approval recorded for staging"):
        promote("tiny-llada", "staging", registry=reg, actor="bob")
    asked = open_request(reg, "tiny-llada", "1", "staging")
    assert (
        asked.by == "bob"
        and asked.key
        and verifies(signers["bob"].public_line, asked.payload("tiny-llada", "1"), asked.signature)
    )
    tag = model_tag(f"requests.staging.{asked.id}")
    rewritten = json.loads(reg.version_tags("tiny-llada", "1")[tag]) | {"by": "eve"}
    reg.client.set_model_version_tag("tiny-llada", "1", tag, json.dumps(rewritten))
    with pytest.raises(ApprovalRefused, match=f"the request {asked.id} of staging by eve at .* counts for nothing"):
        approve(reg, "tiny-llada", "1", "staging", "bob", OK)
    blocked = read.promotion_decision("tiny-llada", "1", "staging", registry=reg)
    assert "unsigned request" in blocked.blocker_labels(), blocked.blockers
    # the next promotion voids it (audited) and opens a request of its own, signed by who runs it
    with pytest.raises(PromotionRefused, match="no approval recorded for staging"):
        promote("tiny-llada", "staging", registry=reg, actor="bob")
    fresh = open_request(reg, "tiny-llada", "1", "staging")
    assert fresh.id != asked.id and fresh.by == "bob" and fresh.signature
    voided = read.audit_events(event="approval_void", registry=reg)
    assert any(asked.id in str(e) and "counts for nothing" in c for e, c in zip(voided["evidence"], voided["comment"]))
    approve(reg, "tiny-llada", "1", "staging", "grace", OK)
    assert promote("tiny-llada", "staging", registry=reg, actor="bob").to_holder == ("tiny-llada", "1")


def test_a_stored_gate_report_says_whose_key_judged_it_and_an_edited_signature_is_named(reg, tmp_path, monkeypatch):
    """Item 2's "the digest of gate reports and the decision": whoever judges a stage signs the report stored (its
    sha256, in which the gates and the decision are, and the decision's outcome) with their own key."""
    from typer.testing import CliRunner

    from registry.judging import judge
    from tests.support.flow_fixtures import cli_app

    keyed_roles(tmp_path, monkeypatch)
    _registered(reg)
    act_as("ada")
    judge(reg, "tiny-llada", "1", "poc")
    signed = json.loads(reg.version_tags("tiny-llada", "1")[model_tag("gates.poc.signed")])
    assert signed["by"] == "ada" and signed["outcome"] and signed["signature"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    app = cli_app("gates")
    shown = CliRunner().invoke(app, ["gates", "tiny-llada", "--stored", "--stage", "poc"], env={"COLUMNS": "300"})
    assert shown.exit_code == 0 and f"judged by ada, signed with {signed['key']}" in shown.output, shown.output
    # the tag rewritten to name someone else: their key did not sign it
    forged = signed | {"by": "grace"}
    reg.client.set_model_version_tag("tiny-llada", "1", model_tag("gates.poc.signed"), json.dumps(forged))
    named = CliRunner().invoke(app, ["gates", "tiny-llada", "--stored", "--stage", "poc"], env={"COLUMNS": "300"})
    assert "judged by ada" not in named.output and "gate report judged by grace" in named.output, named.output
    # judged again, on a changed checklist, by a process with no key: the earlier signature does not stand beside it
    sign_all(reg, "tiny-llada", "1", "poc")
    act_as(None)
    monkeypatch.setenv("UNMASK_KEYS_HOME", str(tmp_path / "no-keys"))
    judge(reg, "tiny-llada", "1", "poc")
    assert reg.version_tags("tiny-llada", "1")[model_tag("gates.poc.signed")] == ""
    unsigned = CliRunner().invoke(app, ["gates", "tiny-llada", "--stored", "--stage", "poc"], env={"COLUMNS": "300"})
    assert "judged by nobody's key (unsigned)" in unsigned.output, unsigned.output
