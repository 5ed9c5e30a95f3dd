"""Permissions enforced by a real `mlflow server --app-name basic-auth` on 127.0.0.1, and the four-eyes rules
with identities the server authenticates.

The admin creates four users through the server's API: vera (viewer, READ on the models), eve (evaluator,
EDIT: she registers the evidence and requests the promotions), grace and linus (approvers, MANAGE).
"""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.support.gate_fixtures import OK, fast_llada, register_pair
from tests.support.governance import team_environment
from tests.support.postgres_fixtures import backend_store
from tests.support.servers import launch_mlflow_server, stop_group

MODELS = ("tiny-llada", "tiny-ar")
USERS = {"vera": "READ", "eve": "EDIT", "grace": "MANAGE", "linus": "MANAGE"}
# every client of a shared server signs with the same key (docs/integrity.md): here, the whole module's
SIGNING_KEY = f"srv:{secrets.token_hex(32)}"
# staging and production count only acts signed by a listed key, authenticated or not: the users' keys and the
# bundled roles listing them (`team_environment`), made once for the module
TEAM: dict[str, str] = {}


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def auth_server(request, tmp_path_factory):
    """The basic-auth server on a SQLite file or on PostgreSQL (store and users both in the cluster)."""
    folder: Path = tmp_path_factory.mktemp("mlflow_auth_server")
    TEAM.update(team_environment(tmp_path_factory.mktemp("team"), [*USERS, "admin"]))
    admin_password = secrets.token_urlsafe(16)
    auth_db = backend_store(request, folder, "basic_auth")
    (folder / "basic_auth.ini").write_text(
        "[mlflow]\ndefault_permission = READ\n"
        f"database_uri = {auth_db}\n"
        f"admin_username = admin\nadmin_password = {admin_password}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
    )
    env = {
        "MLFLOW_AUTH_CONFIG_PATH": str(folder / "basic_auth.ini"),
        "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16),
    }
    url, proc = launch_mlflow_server(
        folder, backend_store(request, folder, "mlflow"), "--app-name", "basic-auth", env=env
    )
    try:
        yield url, admin_password, auth_db
    finally:
        stop_group(proc)


def cheap_password_checks(auth_db: str, passwords: dict[str, str]) -> None:
    """The server checks the password on every request, against a scrypt hash (~60 ms of CPU each on this
    host, thousands of requests in these tests): store the same passwords under a one-round hash instead.
    Authentication is exactly as real, only cheaper to compute."""
    import sqlalchemy
    from werkzeug.security import generate_password_hash

    engine = sqlalchemy.create_engine(auth_db, poolclass=sqlalchemy.pool.NullPool)
    with engine.begin() as db:
        for user, password in passwords.items():
            db.execute(
                sqlalchemy.text("UPDATE users SET password_hash = :h WHERE username = :u"),
                {"h": generate_password_hash(password, method="pbkdf2:sha256:1"), "u": user},
            )
    engine.dispose()


def act_as(monkeypatch, url, user, password=None):
    """Authenticate the MLflow client of this process as `user` (what `unmask` reads, too)."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", user)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password or f"{user}-password-{len(user)}x")
    monkeypatch.setenv("UNMASK_SIGNING_KEY", SIGNING_KEY)
    for key, value in TEAM.items():  # the bundled roles with the users' keys: anyone may; four eyes hold
        monkeypatch.setenv(key, value)


@pytest.fixture(scope="module")
def governed(auth_server):
    """eve's evidence registered, users and their permissions granted by the admin."""
    from mlflow.server import get_app_client

    from registry import Registry
    from registry.connection import AUDIT_EXPERIMENT

    url, admin_password, auth_db = auth_server
    with pytest.MonkeyPatch.context() as mp:
        act_as(mp, url, "admin", admin_password)
        auth = get_app_client("basic-auth", tracking_uri=url)
        for user in USERS:
            auth.create_user(user, f"{user}-password-{len(user)}x")
        cheap_password_checks(auth_db, {"admin": admin_password} | {u: f"{u}-password-{len(u)}x" for u in USERS})
        audit_experiment = Registry(url).experiment_id(AUDIT_EXPERIMENT)
        for user in USERS:  # a registration is an audit entry too: the evaluator writes the trail as well
            auth.grant_user_permission(user, "experiment", audit_experiment, "EDIT" if user != "vera" else "READ")
        act_as(mp, url, "eve")
        reg = Registry(url)
        register_pair(reg, fast_llada())
        act_as(mp, url, "admin", admin_password)
        for user, permission in USERS.items():
            for model in MODELS:
                if user == "eve":  # her models: the server made her MANAGE them on creation; an evaluator EDITs
                    auth.revoke_user_permission(user, "registered_model", model)
                auth.grant_user_permission(user, "registered_model", model, permission)
    return url


def _cli():
    import typer

    from flows.commands import promote as promote_cmd

    app = typer.Typer()
    promote_cmd.register(app)
    return app


def test_a_viewer_is_refused_by_the_server_with_one_line_naming_user_and_model(governed, monkeypatch):
    from registry import Registry, stage_holder

    act_as(monkeypatch, governed, "vera")
    result = CliRunner().invoke(
        _cli(), ["promote", "tiny-llada", "--to", "poc", "--approver", "vera", "--comment", OK], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "permission denied: MLflow user 'vera'" in lines[0], result.output
    assert "'tiny-llada'" in lines[0] and "Traceback" not in result.output
    assert stage_holder(Registry(governed), "poc") is None
    with pytest.raises(Exception, match="PERMISSION_DENIED|403"):  # the alias itself, straight through MLflow
        Registry(governed).client.set_registered_model_alias("tiny-llada", "poc", "1")


def test_the_server_identity_acts_and_no_other_name_can_be_claimed(governed, monkeypatch):
    from registry import IdentityMismatch, Registry, approve

    act_as(monkeypatch, governed, "grace")
    with pytest.raises(IdentityMismatch, match="'linus' is not the authenticated MLflow user 'grace'"):
        approve(Registry(governed), "tiny-llada", "1", "poc", "linus", OK)
    refused = CliRunner().invoke(
        _cli(),
        [
            "sign-off",
            "tiny-llada",
            "--stage",
            "poc",
            "--item",
            "fallback-plan",
            "--by",
            "linus",
            "--comment",
            "checked",
        ],
        env={"COLUMNS": "200"},
    )
    assert refused.exit_code == 2 and "--by 'linus' is not you: you are 'grace' (mlflow-basic-auth" in refused.output


def test_the_registrant_cannot_approve_production_and_two_other_approvers_promote(governed, monkeypatch):
    from checklists import load_checklist
    from registry import ApprovalRefused, Registry, approve, sign_off, stage_holder
    from registry.read import audit_events

    act_as(monkeypatch, governed, "eve")
    reg = Registry(governed)
    for stage in ("poc", "staging", "production"):
        for item in load_checklist(stage).manual_items():
            sign_off(reg, "tiny-llada", "1", stage, item, None, f"{item} checked for {stage}")
    run = CliRunner().invoke
    poc = run(_cli(), ["promote", "tiny-llada", "--to", "poc", "--approver", "eve", "--comment", OK])
    assert poc.exit_code == 0 and "requested by eve, approved by eve" in poc.output, poc.output
    for stage, approvers in (("staging", ["grace"]), ("production", ["grace", "linus"])):
        act_as(monkeypatch, governed, "eve")
        asked = run(_cli(), ["promote", "tiny-llada", "--to", stage])
        assert asked.exit_code == 1 and "no approval recorded" in asked.output, asked.output
        with pytest.raises(
            ApprovalRefused,
            match=f"eve registered the evidence of this version and cannot approve its {stage} promotion",
        ):
            approve(Registry(governed), "tiny-llada", "1", stage, None, OK)
        assert stage_holder(reg, stage) is None
        for approver in approvers:
            act_as(monkeypatch, governed, approver)
            assert approve(Registry(governed), "tiny-llada", "1", stage, None, OK).identity == "mlflow-basic-auth"
        act_as(monkeypatch, governed, "eve")
        moved = run(_cli(), ["promote", "tiny-llada", "--to", stage])
        assert moved.exit_code == 0, moved.output
        assert f"requested by eve, approved by {', '.join(approvers)}" in moved.output
    assert stage_holder(reg, "production") == ("tiny-llada", "1")
    move = audit_events(stage="production", event="alias_move", registry=reg).iloc[-1]
    assert sorted(a["by"] for a in move["evidence"]["approvals"]) == ["grace", "linus"]
    assert move["who"] == "eve" and move["evidence"]["actor"]["identity"] == "mlflow-basic-auth"
    refused = audit_events(event="approval_refused", registry=reg)
    assert refused["who"].tolist() == ["eve", "eve"]


def test_a_name_is_an_mlflow_identity_only_when_the_server_authenticated_it(governed, monkeypatch):
    from registry import current_actor
    from registry.identity import MLFLOW_USER, OS_USER, os_account, server_authenticated

    act_as(monkeypatch, governed, "grace")
    assert server_authenticated(governed, "grace", "grace-password-5x")
    assert current_actor(governed).source == MLFLOW_USER
    act_as(monkeypatch, governed, "grace", password="not-her-password")  # the server refuses it: no identity
    assert not server_authenticated(governed, "grace", "not-her-password")
    assert (current_actor(governed).name, current_actor(governed).source) == (os_account(), OS_USER)


@pytest.mark.parametrize(
    "args",
    [
        ["approve", "tiny-llada", "poc", "-c", OK],
        ["gates", "tiny-llada", "--stage", "poc"],
        ["audit", "--verify"],
        ["history"],
        ["promote", "tiny-llada", "--to", "poc"],
    ],
)
def test_a_wrong_password_is_said_as_such_never_as_a_missing_model(governed, monkeypatch, args):
    from tests.support.flow_fixtures import cli_app

    act_as(monkeypatch, governed, "grace", "not-grace-s-password")
    app = cli_app("approve", "gates", "promote", "history")
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert f"the MLflow server at {governed} did not authenticate MLflow user 'grace' (401)" in result.output
    assert "no registered model" not in result.output and "Traceback" not in result.output


def test_a_user_the_server_authenticates_without_their_key_approves_nothing_past_poc(governed, monkeypatch, tmp_path):
    """The writer of a store can run a basic-auth server over it and make any user (issue 48): the server then
    vouches for the name, but staging and production count only acts signed by a key the roles file lists, and the
    writer holds nobody's private key but their own. The approval is refused in one line and nothing moves."""
    from registry import ApprovalRefused, Registry, approve, stage_holder

    act_as(monkeypatch, governed, "linus")  # authenticated by the server: the writer made the user
    monkeypatch.setenv("UNMASK_KEYS_HOME", str(tmp_path / "writer-keys"))  # and holds no key of linus's
    held = stage_holder(Registry(governed), "staging")
    with pytest.raises(ApprovalRefused) as refused:
        approve(Registry(governed), "tiny-llada", "1", "staging", None, OK)
    [reason] = [r for r in refused.value.reasons if "linus" in r]
    assert "is not signed: only an act signed by a key the roles file lists for linus counts" in reason, reason
    assert stage_holder(Registry(governed), "staging") == held
