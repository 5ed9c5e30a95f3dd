"""What an approver and a promoter wait for through a real `mlflow server --app-name basic-auth` on 127.0.0.1:
`unmask approve` and `unmask promote` to poc, staging and production, each timed as the function call and as the
command a person types (its own process), with the MLflow client calls each made (issue #46 asks for under 3 s).

    PYTHONPATH=. .venv/bin/python bench/promotion_server.py [--rounds 3] [--one-round-hash]

By default the server checks every request's password against its default hash (scrypt), as a real deployment
does: about 0.5 s of server CPU per request on a 2-core host, which then dominates. With --one-round-hash the
same passwords are stored under a one-round PBKDF2 hash (as tests/e2e/test_governance_server.py does), which
leaves what unmask's own calls cost. eve registers the evidence and requests; grace approves poc and staging;
grace and linus approve production.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.promotion_calls import report  # noqa: E402 - counts MlflowClient calls in this process
from tests.support.gate_fixtures import OK, fast_llada, register_pair  # noqa: E402
from tests.support.mlflow_calls import Calls, counting  # noqa: E402
from tests.support.servers import launch_mlflow_server, stop_group  # noqa: E402

USERS = {"eve": "EDIT", "grace": "MANAGE", "linus": "MANAGE"}
MODEL = "tiny-llada"


def password(user: str) -> str:
    return f"{user}-password-{len(user)}x"


def act_as(user: str, url: str, admin_password: str = "") -> None:
    os.environ |= {
        "MLFLOW_TRACKING_URI": url,
        "MLFLOW_TRACKING_USERNAME": user,
        "MLFLOW_TRACKING_PASSWORD": admin_password or password(user),
    }


def served(folder: Path) -> tuple[str, subprocess.Popen, str]:
    admin_password = secrets.token_urlsafe(16)
    (folder / "basic_auth.ini").write_text(
        "[mlflow]\ndefault_permission = READ\n"
        f"database_uri = sqlite:///{folder / 'basic_auth.db'}\n"
        f"admin_username = admin\nadmin_password = {admin_password}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
    )
    env = {"MLFLOW_AUTH_CONFIG_PATH": str(folder / "basic_auth.ini"), "MLFLOW_FLASK_SERVER_SECRET_KEY": "k" * 32}
    url, proc = launch_mlflow_server(folder, f"sqlite:///{folder / 'mlflow.db'}", "--app-name", "basic-auth", env=env)
    return url, proc, admin_password


def governed(url: str, admin_password: str, one_round_hash: bool, auth_db: str) -> None:
    """The users, eve's evidence (tiny-llada and the tiny-ar fallback, every manual item signed off), and each
    user's permissions on the models and on the audit trail."""
    from mlflow.server import get_app_client

    from checklists import load_checklist
    from registry import Registry, sign_off
    from registry.connection import AUDIT_EXPERIMENT

    act_as("admin", url, admin_password)
    auth = get_app_client("basic-auth", tracking_uri=url)
    for user in USERS:
        auth.create_user(user, password(user))
    if one_round_hash:
        from tests.e2e.test_governance_server import cheap_password_checks

        cheap_password_checks(auth_db, {"admin": admin_password} | {u: password(u) for u in USERS})
    audit = Registry(url).experiment_id(AUDIT_EXPERIMENT)
    act_as("eve", url)
    reg = Registry(url)
    register_pair(reg, fast_llada())
    act_as("admin", url, admin_password)
    for user, permission in USERS.items():
        auth.grant_user_permission(user, "experiment", audit, "EDIT")
        for name in ("tiny-llada", "tiny-ar"):
            if user == "eve":  # the server made her MANAGE what she created; an evaluator EDITs
                auth.revoke_user_permission(user, "registered_model", name)
            auth.grant_user_permission(user, "registered_model", name, permission)
    act_as("eve", url)
    for stage in ("poc", "staging", "production"):
        for item in load_checklist(stage).manual_items():
            sign_off(Registry(url), "tiny-llada", "1", stage, item, None, f"{item} checked for {stage}")


def timed(label: str, calls: Calls, act) -> float:
    start = time.perf_counter()
    report(label, calls, act)
    return time.perf_counter() - start


def command(url: str, user: str, *args: str) -> float:
    env = dict(os.environ, MLFLOW_TRACKING_URI=url, MLFLOW_TRACKING_USERNAME=user)
    env["MLFLOW_TRACKING_PASSWORD"] = password(user)
    start = time.perf_counter()
    done = subprocess.run([str(REPO / ".venv/bin/unmask"), *args], env=env, capture_output=True, text=True)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"unmask {' '.join(args)} as {user} exited {done.returncode}:\n{done.stdout}{done.stderr}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="candidates walked poc -> production (default 3)")
    parser.add_argument("--one-round-hash", action="store_true", help="cheap password checks on the server")
    args = parser.parse_args()
    rounds = args.rounds
    from registry import Registry, approve, promote

    os.environ["UNMASK_SIGNING_KEY"] = f"srv:{secrets.token_hex(32)}"  # every client of the server signs with it
    os.environ.pop("UNMASK_ROLES", None)  # the bundled roles
    calls = counting().__enter__()  # for the process's life
    times: dict[str, list[float]] = {}
    for _ in range(rounds):  # a fresh server each round: tiny-llada from poc to production
        folder = Path(tempfile.mkdtemp(prefix="unmask-promotion-server-"))
        os.environ["UNMASK_HOME"] = str(folder / "home")
        url, proc, admin_password = served(folder)
        try:
            governed(url, admin_password, args.one_round_hash, f"sqlite:///{folder / 'basic_auth.db'}")
            for label, user, act in (
                ("approve poc (grace)", "grace", lambda: approve(Registry(), MODEL, "1", "poc", None, OK)),
                ("promote poc (eve)", "eve", lambda: promote(MODEL, "poc")),
                ("approve staging (grace)", "grace", lambda: approve(Registry(), MODEL, "1", "staging", None, OK)),
                ("promote staging (eve)", "eve", lambda: promote(MODEL, "staging")),
            ):
                act_as(user, url)
                times.setdefault(label, []).append(timed(label, calls, act))
            for label, user, argv in (
                ("unmask approve production (grace)", "grace", ["approve", "tiny-llada", "production", "-c", OK]),
                ("unmask approve production (linus)", "linus", ["approve", "tiny-llada", "production", "-c", OK]),
                ("unmask promote production (eve)", "eve", ["promote", "tiny-llada", "--to", "production"]),
            ):
                times.setdefault(label, []).append(command(url, user, *argv))
        finally:
            stop_group(proc)
    print(
        f"\n{rounds} rounds, each on a fresh server (basic-auth, "
        f"{'one-round PBKDF2' if args.one_round_hash else 'scrypt'} passwords), seconds:"
    )
    for label, took in times.items():
        print(f"  {label:<32} median {statistics.median(took):.2f}  ({', '.join(f'{t:.2f}' for t in took)})")


if __name__ == "__main__":
    main()
