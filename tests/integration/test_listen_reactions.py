"""Events in (issue 53, item 3) in process: MLflow's delivery format checked against MLflow's own sender, the
receiver's journal across a restart, and what a stage alias set inside and outside unmask comes to.
(tests/e2e/test_listen.py drives the same receiver from a real `mlflow server`.)"""

from __future__ import annotations

import json
import threading
import time

import pytest
from mlflow.webhooks.delivery import _generate_hmac_signature

from flows.evaluate import EvaluationOptions
from flows.receiver import Inbox, Reaction, Reactions, Receiver
from registry import RegistryError
from registry.audit import events
from registry.integrity import FINDING
from registry.mlflow_hooks import (
    DELIVERY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    DeliveryRefused,
    RegistryNotice,
    read_notice,
    signature,
    subscribe,
    verify_delivery,
)
from tests.support.gate_fixtures import built_registry, fresh_registry, moved_twice_and_rolled_back

SECRET = b"s3cret"


def delivery(data: dict, event: str = "model_version.created", delivery_id: str = "d-1", at: int | None = None):
    entity, action = event.rsplit(".", 1)
    body = json.dumps({"entity": entity, "action": action, "timestamp": "2026-12-06T00:00:00", "data": data})
    at = int(time.time()) if at is None else at
    headers = {
        DELIVERY_HEADER: delivery_id,
        TIMESTAMP_HEADER: str(at),
        SIGNATURE_HEADER: signature(SECRET, delivery_id, str(at), body.encode()),
    }
    return headers, body.encode()


def test_the_signature_is_the_one_mlflows_own_sender_computes():
    body = '{"entity": "model_version", "action": "created", "data": {"name": "m", "version": "1"}}'
    ours = signature(SECRET, "abc", "1765000000", body.encode())
    assert ours == _generate_hmac_signature(SECRET.decode(), "abc", "1765000000", body)


def test_a_verified_delivery_reads_as_a_typed_notice():
    data = {"name": "dllm", "version": "3", "source": "runs:/r/model", "run_id": "r", "tags": {"a": "b"}}
    notice = verify_delivery(SECRET, *delivery(data))
    assert (notice.event, notice.model, notice.version, notice.source, notice.run_id) == (
        "model_version.created",
        "dllm",
        "3",
        "runs:/r/model",
        "r",
    )
    assert notice.tags == {"a": "b"} and not notice.registered_by_unmask
    assert RegistryNotice.from_dict(json.loads(json.dumps(notice.to_dict()))) == notice
    headers, body = delivery({"name": "dllm", "alias": "production", "version": "3"}, "model_version_alias.created")
    assert verify_delivery(SECRET, {k.lower(): v for k, v in headers.items()}, body).alias == "production"


@pytest.mark.parametrize(
    "change, status, words",
    [
        (lambda h, b: ({**h, SIGNATURE_HEADER: ""}, b), 401, "unsigned"),
        (
            lambda h, b: ({**h, SIGNATURE_HEADER: signature(b"other", "d-1", h[TIMESTAMP_HEADER], b)}, b),
            401,
            "does not",
        ),
        (lambda h, b: (h, b.replace(b'"3"', b'"4"')), 401, "does not sign"),  # the body changed after signing
        (lambda h, b: ({**h, DELIVERY_HEADER: "d-2"}, b), 401, "does not sign"),  # the id is signed too
        (lambda h, b: ({**h, TIMESTAMP_HEADER: "soon"}, b), 400, "Unix seconds"),
        (lambda h, b: ({k: v for k, v in h.items() if k != DELIVERY_HEADER}, b), 400, DELIVERY_HEADER),
    ],
)
def test_a_delivery_not_signed_by_the_secret_is_refused_naming_why(change, status, words):
    headers, body = change(*delivery({"name": "dllm", "version": "3"}))
    with pytest.raises(DeliveryRefused) as refused:
        verify_delivery(SECRET, headers, body)
    assert refused.value.status == status and words in str(refused.value)


def test_a_replayed_delivery_older_than_the_tolerance_is_refused():
    headers, body = delivery({"name": "dllm", "version": "3"}, at=int(time.time()) - 3600)
    with pytest.raises(DeliveryRefused, match="replay"):
        verify_delivery(SECRET, headers, body)
    # the same delivery inside the window (a clock a minute off) is taken
    assert verify_delivery(SECRET, headers, body, now=int(headers[TIMESTAMP_HEADER]) + 60).version == "3"


@pytest.mark.parametrize(
    "body, words",
    [
        (b"\xff\xfe", "not JSON"),
        (b"[1, 2]", "expected an object"),
        (b'{"entity": "model_version", "action": "created", "data": {"name": "m"}}', "data.version"),
        (b'{"entity": "model_version", "action": "created", "data": {"name": "m", "version": 3}}', "data.version"),
        (b'{"entity": 1, "action": "created", "data": {}}', "strings"),
        (
            b'{"entity": "model_version", "action": "created", "data": {"name": "m", "version": "1", "tags": [1]}}',
            "data.tags",
        ),
        (b'{"entity": "model_version_alias", "action": "created", "data": {"name": "m", "version": "1"}}', "alias"),
    ],
)
def test_a_signed_but_malformed_body_is_a_400_naming_the_field(body, words):
    with pytest.raises(DeliveryRefused) as refused:
        read_notice("d", body)
    assert refused.value.status == 400 and words in str(refused.value)


def test_the_journal_acts_once_per_delivery_and_acts_after_a_restart_on_what_was_not_settled(tmp_path):
    journal = tmp_path / "inbox.jsonl"
    acted: list[str] = []
    release = threading.Event()

    def slow(notice: RegistryNotice) -> Reaction:
        release.wait(10)
        acted.append(notice.delivery)
        return Reaction("checked", "fine")

    first = Receiver(SECRET, Inbox(journal), slow, say=lambda line: None)
    first.start()
    answers = [first.accept(*delivery({"name": "m", "version": str(i)}, delivery_id=f"d-{i}")) for i in (1, 2)]
    assert [status for status, _ in answers] == [202, 202]
    assert first.accept(*delivery({"name": "m", "version": "1"}, delivery_id="d-1"))[0] == 200  # MLflow's retry
    first.stop(timeout_s=0.2)  # stops while d-1 is still being acted on: neither is settled
    with journal.open("a") as f:
        f.write('{"state": "settled", "deliv')  # a line torn by the crash
    restarted = Receiver(SECRET, Inbox(journal), lambda n: Reaction("checked", n.delivery), say=lambda line: None)
    assert {n.delivery for n in restarted.inbox.unsettled()} == {"d-1", "d-2"}
    assert restarted.accept(*delivery({"name": "m", "version": "1"}, delivery_id="d-1"))[0] == 200
    restarted.start()
    restarted.stop(timeout_s=10)
    lines = journal.read_text().splitlines()
    assert lines[2] == '{"state": "settled", "deliv'  # the torn line stays as it was; the next starts on its own
    settled = [e["delivery"] for e in map(json.loads, lines[3:]) if e["state"] == "settled"]
    assert sorted(settled) == ["d-1", "d-2"] and not Inbox(journal).unsettled() and not acted


@pytest.fixture
def reactions(tmp_path):
    reg = built_registry(tmp_path, moved_twice_and_rolled_back)  # poc: tiny-ar v1, after promotions and a rollback
    return Reactions(reg, "unused.yaml", EvaluationOptions(), tmp_path / "downloads")


def alias_notice(model: str, alias: str, version: str = "1") -> RegistryNotice:
    return RegistryNotice("d", "model_version_alias.created", model=model, version=version, alias=alias)


def test_a_stage_alias_unmask_moved_is_checked_and_one_set_outside_opens_one_finding(reactions):
    reg = reactions.registry
    assert reactions(alias_notice("tiny-ar", "poc")).outcome == "checked"  # the rollback put it there
    assert reactions(alias_notice("tiny-llada", "candidate")).outcome == "ignored"  # registration's, not a stage
    reg.client.set_registered_model_alias("tiny-llada", "poc", "1")  # outside unmask: no move in the trail
    found = reactions(alias_notice("tiny-llada", "poc"))
    assert found.outcome == "finding" and "tiny-llada" in found.detail, found
    assert reactions(alias_notice("tiny-llada", "poc")).outcome == "finding"  # MLflow sent it twice
    findings = events(reg, stage="poc", event=FINDING)
    assert len(findings) == 1 and findings[0].who == "mlflow-webhook"


def test_a_version_unmask_registered_or_that_nothing_can_evaluate_starts_no_flow(reactions):
    ours = RegistryNotice("d", "model_version.created", "tiny-llada", "1", tags={"unmask.evidence_run": "abc"})
    assert reactions(ours) == Reaction("ignored", "registered by unmask's evaluation (evidence run abc)")
    stranger = RegistryNotice("d2", "model_version.created", "someone-elses", "1", source="file:///no/such/folder")
    reaction = reactions(stranger)
    assert reaction.outcome == "ignored" and "not in the catalog" in reaction.detail
    assert "could not be fetched" in reaction.detail or "holds no checkpoint" in reaction.detail
    assert reactions(RegistryNotice("d3", "registered_model.created", "x")).outcome == "ignored"


def test_a_local_store_cannot_be_subscribed(tmp_path):
    with pytest.raises(RegistryError, match="sends no webhooks"):
        subscribe(fresh_registry(tmp_path), "http://127.0.0.1:1/mlflow", "s")


def test_listen_without_its_secret_or_subscribing_a_local_store_is_one_line(tmp_path):
    from typer.testing import CliRunner

    from tests.support.flow_fixtures import cli_app

    reg = fresh_registry(tmp_path)
    env = {"MLFLOW_TRACKING_URI": reg.tracking_uri, "UNMASK_HOME": str(tmp_path / "home"), "UNMASK_LISTEN_SECRET": ""}
    unset = CliRunner().invoke(cli_app("listen"), ["listen", "--for", "0"], env=env)
    assert unset.exit_code == 2 and "$UNMASK_LISTEN_SECRET is not set" in unset.output, unset.output
    local = CliRunner().invoke(
        cli_app("listen"),
        ["listen", "--subscribe", "http://127.0.0.1:9/mlflow", "--for", "0"],
        env=env | {"UNMASK_LISTEN_SECRET": "s"},
    )
    assert local.exit_code == 2 and "sends no webhooks" in local.output, local.output
