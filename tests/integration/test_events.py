"""Registry events out (issue 53): every audit entry as an event a consumer can act on without a second call, a
real webhook receiver on 127.0.0.1 getting each one in order and exactly once across an outage, HMAC-signed,
and the `unmask events` stream."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from flows.webhooks import (
    WebhookError,
    cursor,
    deliver,
    load_webhooks,
    sign,
    verify_signature,
)
from registry import approve, promote
from registry.events import events_since
from tests.support.flow_fixtures import cli_app
from tests.support.gate_fixtures import OK, built_registry, moved_twice_and_rolled_back
from tests.support.hook_receiver import HookReceiver

SECRET = "s3cret-for-tests"


@pytest.fixture
def receiver():
    r = HookReceiver(SECRET)
    yield r
    r.stop()


@pytest.fixture
def chain(tmp_path, monkeypatch):
    """A registry whose chain holds sign-offs, approvals, two promotions and a rollback; webhooks file here."""
    monkeypatch.setenv("UNMASK_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HOOK_SECRET", SECRET)
    return built_registry(tmp_path, moved_twice_and_rolled_back)


def _hooks_file(tmp_path, monkeypatch, url, **extra):
    path = tmp_path / "webhooks.yaml"
    entry = {"name": "deploy", "url": url, "secret_env": "HOOK_SECRET"} | extra
    path.write_text(json.dumps({"webhooks": [entry]}))
    monkeypatch.setenv("UNMASK_WEBHOOKS", str(path))
    return path


def test_each_audit_entry_is_an_event_a_consumer_acts_on_without_a_second_call(chain):
    events = events_since(chain)
    assert [e.seq for e in events] == sorted(e.seq for e in events) and len({e.id for e in events}) == len(events)
    moves = [e for e in events if e.type == "alias.moved"]
    assert [(m.how, m.to_ref) for m in moves] == [
        ("promotion", "tiny-ar@1"),
        ("promotion", "tiny-llada@1"),
        ("rollback", "tiny-ar@1"),
    ]
    assert all(m.deployable for m in moves) and not any(e.deployable for e in events if e.type != "alias.moved")
    promoted = moves[1]
    assert promoted.verdict == "adopt" and promoted.approvals == ("grace",) and promoted.from_ref == "tiny-ar@1"
    assert promoted.audit["sha256"] == promoted.id and promoted.audit["signature"] and promoted.audit["experiment_id"]
    assert promoted.evidence["run_id"] and promoted.evidence["experiment_id"]  # the evidence, without another call
    assert chain.client.get_run(promoted.evidence["run_id"]).info.experiment_id == promoted.evidence["experiment_id"]
    assert {"signoff.recorded", "approval.recorded"} <= {e.type for e in events}
    assert "approval.consumed" not in {e.type for e in events}  # a move's entry holds what it consumed: its event
    registered = [e for e in events if e.type == "evidence.registered"]
    assert [(e.model, e.version, e.stage) for e in registered] == [
        ("tiny-ar", "1", "fallback"),
        ("tiny-llada", "1", "candidate"),
    ]
    assert registered[1].evidence["run_id"] and registered[1].seq < moves[0].seq and not registered[1].deployable
    changed = [e for e in events if e.type == "decision.changed" and e.model == "tiny-llada" and e.stage == "poc"]
    assert changed and changed[-1].verdict == "adopt" and changed[-1].seq < promoted.seq, changed  # judged, then moved
    assert all("->" in e.comment for e in changed) and not any(e.deployable for e in changed)
    assert events_since(chain, promoted.seq)[0].seq == promoted.seq + 1


def test_a_receiver_gets_every_event_in_order_exactly_once_across_an_outage(chain, receiver, tmp_path, monkeypatch):
    _hooks_file(tmp_path, monkeypatch, receiver.url)
    [hook] = load_webhooks()
    [first] = deliver(chain, sleep=lambda s: None)
    assert first.delivered == len(events_since(chain)) and not first.failed
    assert cursor(hook) == receiver.got[-1]["seq"]
    # the receiver goes down; the registry moves on
    receiver.down = True
    approve(chain, "tiny-llada", "1", "poc", "grace", OK)
    promote("tiny-llada", "poc", approver="grace", comment=OK, registry=chain)
    [during] = deliver(chain, attempts=3, sleep=lambda s: None)
    assert during.delivered == 0 and "HTTP 503 after 3 attempt(s)" in during.failed and receiver.refused == 3
    assert cursor(hook) == receiver.got[-1]["seq"]  # nothing taken, nothing skipped
    # back up: the rest, once, in order
    receiver.down = False
    [after] = deliver(chain, sleep=lambda s: None)
    assert after.delivered >= 2 and not after.failed
    every = events_since(chain)
    assert [e["id"] for e in receiver.got] == [e.id for e in every]  # each once, in chain order
    newest_move = [e for e in receiver.got if e["type"] == "alias.moved"][-1]
    assert newest_move["to"] == "tiny-llada@1" and newest_move["deployable"] is True
    assert deliver(chain, sleep=lambda s: None)[0].delivered == 0  # nothing left to send
    log = [json.loads(line) for line in (tmp_path / "home" / "events" / "deliveries.jsonl").read_text().splitlines()]
    assert [entry["outcome"] for entry in log].count("HTTP 503") == 3
    assert sum(entry["outcome"] == "HTTP 204" for entry in log) == len(every)


def test_a_webhook_takes_only_its_types_and_its_cursor_moves_past_the_rest(chain, receiver, tmp_path, monkeypatch):
    _hooks_file(tmp_path, monkeypatch, receiver.url, types=["alias.moved"])
    [done] = deliver(chain, sleep=lambda s: None)
    assert [e["type"] for e in receiver.got] == ["alias.moved"] * 3 and done.skipped == len(events_since(chain)) - 3


def test_the_signature_covers_the_body_and_its_time():
    body = b'{"id": "x"}'
    header = sign(SECRET.encode(), body, at=1_000_000)
    assert verify_signature(SECRET.encode(), header, body, now=1_000_010)
    assert not verify_signature(SECRET.encode(), header, body + b" ", now=1_000_010)  # an edited body
    assert not verify_signature(b"other", header, body, now=1_000_010)  # another secret
    assert not verify_signature(SECRET.encode(), header, body, now=1_000_000 + 3600)  # replayed an hour later
    assert not verify_signature(SECRET.encode(), "sha256=abc", body)


@pytest.mark.parametrize(
    "content, message",
    [
        ("webhooks: [", "not YAML"),
        ("webhooks: {}", "expected a `webhooks:` list"),
        ('webhooks: [{name: "a b", url: "http://x", secret_env: S}]', "name 'a b' must be"),
        ("webhooks: [{name: a, url: ftp://x, secret_env: S}]", "url 'ftp://x' must start with http"),
        ("webhooks: [{name: a, url: http://x}]", "secret_env names the variable"),
        ("webhooks: [{name: a, url: http://x, secret_env: S, types: [alias.gone]}]", "unknown event type"),
    ],
)
def test_a_webhooks_file_that_cannot_be_used_is_named_with_its_entry(tmp_path, content, message):
    path = tmp_path / "webhooks.yaml"
    path.write_text(content)
    with pytest.raises(WebhookError, match=message) as e:
        load_webhooks(path)
    assert str(path) in str(e.value)


def test_a_missing_secret_refuses_to_send_unsigned(chain, receiver, tmp_path, monkeypatch):
    _hooks_file(tmp_path, monkeypatch, receiver.url)
    monkeypatch.delenv("HOOK_SECRET")
    with pytest.raises(WebhookError, match=r"\$HOOK_SECRET is not set"):
        deliver(chain)
    assert receiver.got == []


def test_unmask_events_prints_the_stream_and_a_promotion_delivers_by_itself(chain, receiver, tmp_path, monkeypatch):
    from flows.commands.promote import _notify

    env = {"MLFLOW_TRACKING_URI": chain.tracking_uri}
    lines = CliRunner().invoke(cli_app("events"), ["events", "--format", "json"], env=env).output.splitlines()
    assert [json.loads(line)["id"] for line in lines] == [e.id for e in events_since(chain)]
    text = CliRunner().invoke(cli_app("events"), ["events", "--follow", "--for", "0.2", "--poll", "0.1"], env=env)
    assert text.exit_code == 0 and "alias.moved [deployable]: poc moved to tiny-ar v1 (rollback" in text.output
    bad = CliRunner().invoke(cli_app("events"), ["events", "--format", "xml"], env=env)
    assert bad.exit_code == 2 and "--format 'xml': expected text or json" in bad.output
    _hooks_file(tmp_path, monkeypatch, receiver.url)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", chain.tracking_uri)
    _notify()  # what `unmask promote` and `unmask rollback` do after a move
    assert [e["id"] for e in receiver.got] == [e.id for e in events_since(chain)]
